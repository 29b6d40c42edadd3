//! Endpoint churn while connecting, in both data planes: the real proxier
//! loop (events in, syncs when it decides) under a stream of Service and
//! EndpointSlice changes, with connections running all along. After each
//! change, new connections must reach exactly the new endpoints: every one
//! of them (none lost) and no other (none stale), within a deadline.
//!
//! The changes vary what reached the eBPF mode's map syncer in different
//! orders: endpoints replaced in place, added and removed, split over two
//! slices, the Service deleted and re-created with its slices arriving
//! first, the Service updated while its slices change. 120 rounds catch a
//! loss that happens once in a few dozen changes.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use keelson_netplane::Backend;
use keelson_netplane::ebpf::EbpfBackend;
use keelson_netplane::fixtures::{EndpointSpec, ServiceBuilder, SliceBuilder};
use keelson_netplane::model::{IpFamily, Protocol};
use keelson_netplane::nftables::NftablesBackend;
use keelson_netplane::prometheus::Registry;
use keelson_netplane::proxier::{LogEvents, Proxier, ProxierConfig, ProxyHandle};
use keelson_tests::ebpf_env::{TestBpffs, TestCgroup};
use keelson_tests::proxy_cases::{
    Lab, NODE_NAME, OTHER_NODE, Origin, TCP_PORT, lab_nftables_config, pod_ip, pod_name,
};
use keelson_tests::support::{require_root, wait_for};
use tokio_util::sync::CancellationToken;

const ROUNDS: usize = 120;
const PODS: usize = 4;
/// The Service's ClusterIP in each mode: the two tests run in one process,
/// and the eBPF one moves the whole process into its socket LB's cgroup,
/// so the nftables test's connections must not name a VIP of its maps.
const VIP_NFTABLES: &str = "10.96.0.77";
const VIP_EBPF: &str = "10.96.0.78";
/// Connections of one check: with four endpoints, a batch misses one of
/// them with probability ~4 * (3/4)^24; the check is retried until its
/// deadline, so only a lasting loss fails.
const BATCH: usize = 24;
const DEADLINE: Duration = Duration::from_secs(10);

fn service(vip: &str, second_port: bool) -> Service {
    let mut b = ServiceBuilder::new("default", "churn")
        .cluster_ip(vip)
        .port("http", Protocol::Tcp, 80);
    if second_port {
        b = b.port("alt", Protocol::Tcp, 81);
    }
    b.build()
}

/// The Service's slices for the pods `pods`, in one slice or split in two.
fn slices(pods: &BTreeSet<usize>, split: bool) -> Vec<EndpointSlice> {
    let pods: Vec<usize> = pods.iter().copied().collect();
    let halves: Vec<&[usize]> = if split && pods.len() > 1 {
        let (a, b) = pods.split_at(pods.len() / 2);
        vec![a, b]
    } else {
        vec![&pods[..]]
    };
    halves
        .into_iter()
        .enumerate()
        .map(|(i, part)| {
            let mut s = SliceBuilder::new("default", "churn", &format!("churn-{i}"), "IPv4")
                .port("http", Protocol::Tcp, TCP_PORT)
                .port("alt", Protocol::Tcp, TCP_PORT);
            for p in part {
                let node = if *p == 0 { NODE_NAME } else { OTHER_NODE };
                s = s.endpoint(EndpointSpec::ready(&pod_ip(*p).to_string()).node(node));
            }
            s.build()
        })
        .collect()
}

/// The endpoint set of round `r`: never empty, different from the last.
fn subset(r: usize, previous: &BTreeSet<usize>) -> BTreeSet<usize> {
    let mut x = (r as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    loop {
        x ^= x >> 29;
        x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
        let bits = (x % 15 + 1) as usize; // 1..=15: a non-empty subset of 4
        let s: BTreeSet<usize> = (0..PODS).filter(|i| bits & (1 << i) != 0).collect();
        if &s != previous {
            return s;
        }
    }
}

/// Applies round `r`'s change through the handle, as the watchers would.
fn change(handle: &ProxyHandle, vip: &str, r: usize, pods: &BTreeSet<usize>) {
    match r % 7 {
        // The Service goes, then comes back with its slices first.
        3 => {
            handle.delete_service("default", "churn");
            handle.replace_endpoint_slices(slices(pods, false));
            handle.update_service(&service(vip, false));
        }
        // The Service changes while its slices do, one slice at a time.
        5 => {
            handle.update_service(&service(vip, r.is_multiple_of(2)));
            let new = slices(pods, r.is_multiple_of(3));
            for s in &new {
                handle.update_endpoint_slice(s);
            }
            if new.len() == 1 {
                // The controller deletes the slice it no longer needs.
                let gone = slices(&[0, 1].into(), true).remove(1);
                handle.delete_endpoint_slice(&gone);
            }
        }
        // Endpoints replaced in place, one slice or two.
        _ => handle.replace_endpoint_slices(slices(pods, r % 2 == 1)),
    }
}

fn names(pods: &BTreeSet<usize>) -> BTreeSet<String> {
    pods.iter().map(|i| pod_name(*i)).collect()
}

async fn batch(lab: &Lab, vip: SocketAddr) -> Result<BTreeSet<String>, String> {
    let mut seen = BTreeSet::new();
    for _ in 0..BATCH {
        match lab.tcp(Origin::Node, vip, Duration::from_secs(2)).await {
            Ok(r) => {
                seen.insert(r.pod);
            }
            Err(e) => return Err(format!("{e:?} (after {seen:?})")),
        }
    }
    Ok(seen)
}

/// Runs the rounds against a proxier running its own loop; returns the
/// slowest convergence.
async fn churn(lab: Arc<Lab>, proxier: Proxier, handle: ProxyHandle, vip_ip: &str) -> Duration {
    let stop = CancellationToken::new();
    let loop_task = tokio::spawn(proxier.run(stop.clone()));
    let vip: SocketAddr = format!("{vip_ip}:80")
        .parse()
        .unwrap_or_else(|_| unreachable!());
    let mut pods: BTreeSet<usize> = [0, 1].into();
    handle.replace_services(&[service(vip_ip, false)]);
    handle.replace_endpoint_slices(slices(&pods, false));
    handle.services_synced();
    handle.endpoint_slices_synced();

    // Connections all along, from another task of this process.
    let running = Running(Arc::new(AtomicBool::new(true)));
    let background = Arc::new(AtomicUsize::new(0));
    let load = {
        let (lab, running, background) = (lab.clone(), running.0.clone(), background.clone());
        tokio::spawn(async move {
            while running.load(Ordering::Relaxed) {
                if lab
                    .tcp(Origin::Node, vip, Duration::from_millis(500))
                    .await
                    .is_ok()
                {
                    background.fetch_add(1, Ordering::Relaxed);
                }
                // The probe blocks its thread: let the runtime breathe.
                tokio::task::yield_now().await;
            }
        })
    };

    let mut slowest = Duration::ZERO;
    for r in 0..ROUNDS {
        if r > 0 {
            pods = subset(r, &pods);
            change(&handle, vip_ip, r, &pods);
        }
        let want = names(&pods);
        let t = Instant::now();
        let lab2 = lab.clone();
        wait_for(
            &format!("round {r}: new connections reach exactly {want:?}"),
            DEADLINE,
            Duration::ZERO,
            || {
                let (lab, want) = (lab2.clone(), want.clone());
                async move {
                    let seen = batch(&lab, vip).await?;
                    if seen == want {
                        Ok(())
                    } else {
                        Err(format!("answered by {seen:?}"))
                    }
                }
            },
        )
        .await
        .unwrap_or_else(|e| panic!("{e}"));
        slowest = slowest.max(t.elapsed());
        // Once converged it stays converged: no stale endpoint comes back.
        let seen = batch(&lab, vip)
            .await
            .unwrap_or_else(|e| panic!("round {r}: {e}"));
        assert!(
            seen.is_subset(&want),
            "round {r}: after converging, answered by {seen:?}, want {want:?}\n{}",
            diagnose(&lab, vip_ip)
        );
    }
    drop(running);
    load.await.expect("load task");
    assert!(
        background.load(Ordering::Relaxed) > ROUNDS,
        "the background connections ran"
    );
    stop.cancel();
    loop_task.await.expect("proxier loop");
    slowest
}

/// What the node's kernel holds, for a failure message.
fn diagnose(lab: &Lab, vip: &str) -> String {
    let nft = lab
        .node
        .exec("nft", &["list", "table", "ip", "keelson"])
        .unwrap_or_else(|e| e.to_string());
    let ct = lab
        .node
        .exec("conntrack", &["-L", "-d", vip])
        .unwrap_or_else(|e| e.to_string());
    format!("--- nft ---\n{nft}\n--- conntrack to the VIP ---\n{ct}")
}

/// Stops the background connections when dropped (also on a panic).
struct Running(Arc<AtomicBool>);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Relaxed);
    }
}

fn proxier(backend: Box<dyn Backend>) -> (Proxier, ProxyHandle) {
    let (proxier, handle) = Proxier::new(
        ProxierConfig {
            node_name: NODE_NAME.into(),
            families: vec![IpFamily::V4],
            min_sync_period: Duration::ZERO,
            sync_period: Duration::from_secs(30),
        },
        backend,
        &Registry::new(),
    )
    .expect("proxier");
    (proxier.with_events(Arc::new(LogEvents)), handle)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoint_churn_while_connecting_nftables() {
    if !require_root("endpoint_churn_while_connecting_nftables") {
        return;
    }
    let lab = Arc::new(Lab::new(PODS).await.expect("lab"));
    let nft = lab
        .node
        .run(|| NftablesBackend::new(lab_nftables_config()))
        .expect("thread in node netns")
        .expect("nftables backend");
    let (proxier, handle) = proxier(Box::new(nft));
    let slowest = churn(lab, proxier, handle, VIP_NFTABLES).await;
    eprintln!("nftables: {ROUNDS} rounds, slowest convergence {slowest:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoint_churn_while_connecting_ebpf() {
    if !require_root("endpoint_churn_while_connecting_ebpf") {
        return;
    }
    let cgroup = TestCgroup::new("ebpf-churn");
    let bpffs = TestBpffs::new(&cgroup.path);
    let lab = Arc::new(Lab::new(PODS).await.expect("lab"));
    let nft = lab
        .node
        .run(|| NftablesBackend::new(lab_nftables_config()))
        .expect("thread in node netns")
        .expect("nftables backend");
    let backend = EbpfBackend::new(&bpffs.config, Box::new(nft)).expect("ebpf backend");
    let (proxier, handle) = proxier(Box::new(backend));
    // Every connection of this test is made inside the attached cgroup:
    // socket LB serves them all.
    cgroup.enter();
    let slowest = churn(lab, proxier, handle, VIP_EBPF).await;
    cgroup.leave();
    eprintln!("ebpf: {ROUNDS} rounds, slowest convergence {slowest:?}");
}
