//! Programs N Services × M endpoints into the nftables backend of the
//! current network namespace and prints how long the cold sync and a
//! one-service change take. Run it in a namespace of its own, e.g.
//! `unshare -n cargo run --release -p keelson-netplane --example nft_scale -- 10000 3`
//! (add `--list` to print `nft list table ip keelson` afterwards, for small N).

use std::process::Command;
use std::time::Instant;

use keelson_netplane::Backend;
use keelson_netplane::fixtures::{EndpointSpec, ServiceBuilder, SliceBuilder};
use keelson_netplane::model::{ChangeTracker, IpFamily, NodeTopology, Protocol};
use keelson_netplane::nftables::{LocalTraffic, NftablesBackend, NftablesConfig};

fn cluster_ip(i: u32) -> String {
    format!("10.{}.{}.{}", 96 + i / 65_536, (i / 256) % 256, i % 256)
}

fn slice(i: u32, endpoints: u32) -> k8s_openapi::api::discovery::v1::EndpointSlice {
    let name = format!("svc-{i}");
    let mut s = SliceBuilder::new("bench", &name, &format!("{name}-abc"), "IPv4").port(
        "http",
        Protocol::Tcp,
        8080,
    );
    for e in 0..endpoints {
        let n = i * endpoints + e;
        s = s.endpoint(EndpointSpec::ready(&format!(
            "10.{}.{}.{}",
            128 + n / 65_536,
            (n / 256) % 256,
            n % 256
        )));
    }
    s.build()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let services: u32 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(1000);
    let endpoints: u32 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(3);
    let list = args.iter().any(|a| a == "--list");

    let mut tracker = ChangeTracker::new(
        [IpFamily::V4],
        NodeTopology {
            name: "node-a".into(),
            zone: None,
        },
    );
    for i in 0..services {
        let mut svc = ServiceBuilder::new("bench", &format!("svc-{i}"))
            .cluster_ip(&cluster_ip(i))
            .port("http", Protocol::Tcp, 80);
        if i % 10 == 0 {
            svc = svc
                .type_("NodePort")
                .node_port("", Protocol::Udp, 53, (30000 + i % 2000) as u16);
        }
        tracker.update_service(&svc.build());
        tracker.update_endpoint_slice(&slice(i, endpoints));
    }
    let mut config = NftablesConfig::default();
    config
        .local_traffic
        .insert(IpFamily::V4, LocalTraffic::Cidr("10.128.0.0/9".parse()?));
    config
        .service_cidrs
        .insert(IpFamily::V4, vec!["10.96.0.0/12".parse()?]);
    config.service_shards = std::env::var("SHARDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    let mut backend = NftablesBackend::new(config)?;

    let t = Instant::now();
    let diff = tracker.diff();
    let snapshot = tracker.snapshot(&diff);
    let model_time = t.elapsed();
    let t = Instant::now();
    let outcome = backend.full_sync(&snapshot)?;
    let cold = t.elapsed();
    tracker.commit(&diff);
    println!(
        "cold sync: {services} services x {endpoints} endpoints: {:.3} s ({} objects, {} messages; model {:.3} s)",
        cold.as_secs_f64(),
        outcome.objects_changed,
        outcome.messages,
        model_time.as_secs_f64()
    );

    // One endpoint added to one service among N.
    tracker.update_endpoint_slice(&slice(services / 2, endpoints + 1));
    let t = Instant::now();
    let diff = tracker.diff();
    let outcome = backend.sync(&diff)?;
    let one = t.elapsed();
    tracker.commit(&diff);
    println!(
        "one service changed among {services}: {:.2} ms ({} objects, {} messages)",
        one.as_secs_f64() * 1000.0,
        outcome.objects_changed,
        outcome.messages
    );

    let t = Instant::now();
    let outcome = backend.full_sync(&tracker.snapshot(&tracker.diff()))?;
    println!(
        "periodic verified full sync: {:.2} ms (repaired: {})",
        t.elapsed().as_secs_f64() * 1000.0,
        outcome.repaired
    );
    if list {
        let out = Command::new("nft")
            .args(["list", "table", "ip", "keelson"])
            .output()?;
        print!("{}", String::from_utf8_lossy(&out.stdout));
        eprint!("{}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(())
}
