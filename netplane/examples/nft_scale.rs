//! Programs N Services × M endpoints into the nftables backend of the
//! current network namespace and prints what the kernel charges for each
//! kind of transaction at that table size: the cold sync, one new Service,
//! one endpoint added (the endpoint count changes), one endpoint replaced
//! (same count), a restart adopting the table, and the periodic verified
//! full sync. Run it in a namespace of its own, e.g.
//! `unshare -n cargo run --release -p keelson-netplane --example nft_scale -- 10000 10`
//! (`--list` prints
//! `nft list table ip keelson` afterwards, for small N). Each change is
//! repeated `REPEAT` times (default 5); the median is printed.

use std::process::Command;
use std::time::{Duration, Instant};

use keelson_netplane::Backend;
use keelson_netplane::fixtures::{EndpointSpec, ServiceBuilder, SliceBuilder};
use keelson_netplane::model::{ChangeTracker, IpFamily, NodeTopology, Protocol};
use keelson_netplane::nftables::{LocalTraffic, NftablesBackend, NftablesConfig};

fn cluster_ip(i: u32) -> String {
    format!("10.{}.{}.{}", 96 + i / 65_536, (i / 256) % 256, i % 256)
}

fn endpoint_ip(n: u32) -> String {
    format!("10.{}.{}.{}", 128 + n / 65_536, (n / 256) % 256, n % 256)
}

fn service(i: u32) -> k8s_openapi::api::core::v1::Service {
    let mut svc = ServiceBuilder::new("bench", &format!("svc-{i}"))
        .cluster_ip(&cluster_ip(i))
        .port("http", Protocol::Tcp, 80);
    if i.is_multiple_of(10) {
        svc = svc
            .type_("NodePort")
            .node_port("", Protocol::Udp, 53, (30000 + i % 2000) as u16);
    }
    svc.build()
}

/// Service `i`'s slice with endpoints `first..first+count` of its block.
fn slice(i: u32, first: u32, count: u32) -> k8s_openapi::api::discovery::v1::EndpointSlice {
    let name = format!("svc-{i}");
    let mut s = SliceBuilder::new("bench", &name, &format!("{name}-abc"), "IPv4").port(
        "http",
        Protocol::Tcp,
        8080,
    );
    for e in first..first + count {
        s = s.endpoint(EndpointSpec::ready(&endpoint_ip(i * 64 + e)));
    }
    s.build()
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v.get(v.len() / 2).copied().unwrap_or_default()
}

/// This process's resident memory (`VmRSS`, bytes).
fn heap_in_use() -> usize {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<usize>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

fn config() -> Result<NftablesConfig, Box<dyn std::error::Error>> {
    let mut config = NftablesConfig::default();
    config
        .local_traffic
        .insert(IpFamily::V4, LocalTraffic::Cidr("10.128.0.0/9".parse()?));
    config
        .service_cidrs
        .insert(IpFamily::V4, vec!["10.96.0.0/12".parse()?]);
    Ok(config)
}

/// Applies one tracker change through the backend and returns its time.
fn timed_sync(
    tracker: &mut ChangeTracker,
    backend: &mut NftablesBackend,
) -> Result<(Duration, usize), Box<dyn std::error::Error>> {
    let t = Instant::now();
    let diff = tracker.diff();
    let outcome = backend.sync(&diff)?;
    let took = t.elapsed();
    tracker.commit(&diff);
    Ok((took, outcome.objects_changed))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let services: u32 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(1000);
    let endpoints: u32 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(3);
    let list = args.iter().any(|a| a == "--list");
    let repeat: u32 = std::env::var("REPEAT")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5);

    let heap_start = heap_in_use();
    let mut tracker = ChangeTracker::new(
        [IpFamily::V4],
        NodeTopology {
            name: "node-a".into(),
            zone: None,
        },
    );
    for i in 0..services {
        tracker.update_service(&service(i));
        tracker.update_endpoint_slice(&slice(i, 0, endpoints));
    }
    let mut backend = NftablesBackend::new(config()?)?;

    let t = Instant::now();
    let diff = tracker.diff();
    let snapshot = tracker.snapshot(&diff);
    let model_time = t.elapsed();
    let t = Instant::now();
    let outcome = backend.full_sync(&snapshot)?;
    let cold = t.elapsed();
    tracker.commit(&diff);
    drop(snapshot);
    drop(diff);
    println!("{services} services x {endpoints} endpoints");
    println!(
        "cold sync: {:.1} ms ({} objects, {} messages; model {:.1} ms)",
        ms(cold),
        outcome.objects_changed,
        outcome.messages,
        ms(model_time)
    );

    // One new Service (and its slice) among N, each a new one.
    let mut adds = Vec::new();
    let mut add_objects = 0;
    for k in 0..repeat {
        let i = services + k;
        tracker.update_service(&service(i));
        tracker.update_endpoint_slice(&slice(i, 0, endpoints));
        let (d, n) = timed_sync(&mut tracker, &mut backend)?;
        adds.push(d);
        add_objects = n;
    }
    println!(
        "one new Service: {:.2} ms ({add_objects} objects)",
        ms(median(adds))
    );

    // One endpoint added to one Service (its endpoint count changes).
    let mut grows = Vec::new();
    let mut grow_objects = 0;
    for k in 0..repeat {
        let i = (services / 2 + k) % services;
        tracker.update_endpoint_slice(&slice(i, 0, endpoints + 1));
        let (d, n) = timed_sync(&mut tracker, &mut backend)?;
        grows.push(d);
        grow_objects = n;
    }
    println!(
        "one endpoint added: {:.2} ms ({grow_objects} objects)",
        ms(median(grows))
    );

    // One endpoint replaced by another (same count).
    let mut swaps = Vec::new();
    let mut swap_objects = 0;
    for k in 0..repeat {
        let i = (services / 3 + k) % services;
        tracker.update_endpoint_slice(&slice(i, 1, endpoints));
        let (d, n) = timed_sync(&mut tracker, &mut backend)?;
        swaps.push(d);
        swap_objects = n;
    }
    println!(
        "one endpoint replaced: {:.2} ms ({swap_objects} objects)",
        ms(median(swaps))
    );

    let mut v = Vec::new();
    for _ in 0..repeat {
        v.push(validation_only(services, endpoints)?);
    }
    println!(
        "validation only (one verdict element re-pointed): {:.2} ms",
        ms(median(v))
    );

    let t = Instant::now();
    let outcome = backend.full_sync(&tracker.snapshot(&tracker.diff()))?;
    println!(
        "periodic verified full sync: {:.1} ms (repaired: {}, {} objects)",
        ms(t.elapsed()),
        outcome.repaired,
        outcome.objects_changed
    );
    let heap = heap_in_use().saturating_sub(heap_start);

    // A restart: a new backend adopts the table the first one left.
    drop(backend);
    let mut restarted = NftablesBackend::new(config()?)?;
    let t = Instant::now();
    let outcome = restarted.full_sync(&tracker.snapshot(&tracker.diff()))?;
    println!(
        "restart (adopt the table): {:.1} ms ({} objects, {} messages)",
        ms(t.elapsed()),
        outcome.objects_changed,
        outcome.messages
    );
    println!(
        "RSS growth over the run (model + backend record): {:.1} MiB",
        heap as f64 / 1048576.0
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

/// Re-points the `service-ips` element of one ClusterIP at the chain it
/// already names: a transaction that only makes the kernel validate the
/// table (what adding a verdict element or a rule with a verdict costs).
fn validation_only(services: u32, endpoints: u32) -> Result<Duration, Box<dyn std::error::Error>> {
    use keelson_netplane::nftables::expr::Verdict;
    use keelson_netplane::nftables::netlink::NfSocket;
    use keelson_netplane::nftables::objects::{Element, Op, TableId};
    use keelson_netplane::nftables::render::{addr_proto_port_key, shared_chain_name};
    let key = addr_proto_port_key(&cluster_ip(services / 4).parse()?, Protocol::Tcp, 80);
    let table = TableId {
        family: IpFamily::V4,
        index: 0,
    };
    let ops = vec![
        Op::DelElements {
            table,
            set: "service-ips".into(),
            keys: vec![key.clone()],
        },
        Op::AddElements {
            table,
            set: "service-ips".into(),
            elements: vec![Element::verdict(
                key,
                Verdict::Goto(shared_chain_name(endpoints)),
                None,
            )],
        },
    ];
    let mut socket = NfSocket::open()?;
    let t = Instant::now();
    socket.run_batch("keelson", &ops)?;
    Ok(t.elapsed())
}
