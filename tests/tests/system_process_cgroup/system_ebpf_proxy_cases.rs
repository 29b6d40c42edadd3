//! The shared Service-case table (`keelson_tests::proxy_cases`) in
//! `proxy.mode: ebpf`: the socket LB (attached to a cgroup the test creates)
//! plus the nftables backend in the lab's node namespace, both driven by the
//! real proxier from the same model.
//!
//! The lab's probes are sockets of this test process, made from threads that
//! enter the origin's namespace. Socket LB acts on sockets created by
//! processes of the attached cgroup, and on a real node that is every process
//! of the node (the root cgroup): pods and the node itself, never an outside
//! client. So for each probe this process joins the test cgroup when the
//! probe starts on the node or in a pod, and goes back to its own cgroup when
//! it starts at the outside client.
//!
//! One expectation differs from the nftables mode, on purpose: a pod reaching
//! itself through its Service ("hairpin") is masqueraded by kube-proxy
//! because DNAT to itself would break the reply path; with socket LB the pod
//! simply connects to its own address, no NAT is involved, and it sees its
//! own address as the peer (as with Cilium's socket LB).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use keelson_netplane::ebpf::{EbpfBackend, EbpfConfig, pinned_revnat_entries};
use keelson_netplane::model::IpFamily;
use keelson_netplane::nftables::NftablesBackend;
use keelson_netplane::prometheus::Registry;
use keelson_netplane::proxier::{
    ConntrackCleaner, LogEvents, Proxier, ProxierConfig, ProxyHandle, ServiceHealthServer,
};
use keelson_tests::ebpf_env::{TestBpffs, TestCgroup};
use keelson_tests::proxy_cases::{
    Case, Expect, Lab, NODE_NAME, NsListen, Origin, Probe, SERVICE_CIDR, Target, cases,
    lab_nftables_config, load_case, route_external_ips, run_probe,
};
use keelson_tests::support::require_root;

/// The ebpf-mode proxier: socket LB on `cgroup` + nftables in the node netns.
fn proxier(lab: &Lab, ebpf: &EbpfConfig) -> (Proxier, ProxyHandle) {
    let nft = lab
        .node
        .run(|| NftablesBackend::new(lab_nftables_config()))
        .expect("thread in node netns")
        .expect("nftables backend");
    let backend = EbpfBackend::new(ebpf, Box::new(nft)).expect("ebpf backend");
    let cleaner = lab
        .node
        .run(ConntrackCleaner::open)
        .expect("thread in node netns")
        .expect("conntrack socket");
    let registry = Registry::new();
    let (proxier, handle) = Proxier::new(
        ProxierConfig {
            node_name: NODE_NAME.into(),
            families: vec![IpFamily::V4],
            min_sync_period: Duration::ZERO,
            sync_period: Duration::from_secs(30),
        },
        Box::new(backend),
        &registry,
    )
    .expect("proxier");
    let hc = ServiceHealthServer::new(
        Box::new(NsListen::new(lab.node_path())),
        vec![],
        handle.health(),
    );
    let proxier = proxier
        .with_conntrack(cleaner)
        .with_health_checks(hc)
        .with_events(Arc::new(LogEvents));
    (proxier, handle)
}

/// The case as socket LB must behave (see the module docs for the one
/// deliberate difference).
fn for_socket_lb(mut case: Case) -> Case {
    if case.name == "hairpin-is-masqueraded" {
        for p in &mut case.probes {
            if matches!(p.expect, Expect::Masqueraded) && matches!(p.from, Origin::Pod(_)) {
                p.expect = Expect::SourcePreserved;
            }
        }
    }
    case
}

/// The Service address a probe must have been translated by socket LB for:
/// a ClusterIP (in the Service CIDR) reached from the node or a pod, with an
/// answer expected.
fn translated_by_socket_lb(p: &Probe) -> Option<SocketAddr> {
    let service_cidr: ipnet::IpNet = SERVICE_CIDR.parse().ok()?;
    match (&p.target, &p.expect) {
        (_, Expect::Rejected | Expect::Dropped | Expect::Health(..)) => None,
        (Target::Addr(a), _) if p.from != Origin::Client && service_cidr.contains(&a.ip()) => {
            Some(*a)
        }
        _ => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn service_cases_in_ebpf_mode() {
    if !require_root("service_cases_in_ebpf_mode") {
        return;
    }
    let cgroup = TestCgroup::new("ebpf-cases");
    let bpffs = TestBpffs::new(&cgroup.path);

    let lab = Lab::new(4).await.expect("lab");
    route_external_ips(&lab).expect("routes");
    let (mut proxier, handle) = proxier(&lab, &bpffs.config);

    let mut failures = Vec::new();
    let mut served = 0usize;
    for case in cases().into_iter().map(for_socket_lb) {
        load_case(&handle, &case);
        if let Err(e) = tokio::task::block_in_place(|| proxier.sync_now(false)) {
            failures.push(format!("{}: sync failed: {e}", case.name));
            continue;
        }
        for p in &case.probes {
            if p.from == Origin::Client {
                cgroup.leave();
            } else {
                cgroup.enter();
                served += 1;
            }
            let r = run_probe(&lab, p).await;
            cgroup.leave();
            if let Err(e) = r {
                failures.push(format!("{}: {e}", case.name));
            } else if let Some(vip) = translated_by_socket_lb(p) {
                // Answered through a ClusterIP from inside: the programs did
                // it (nftables would have answered too, had they not).
                let entries = pinned_revnat_entries(&bpffs.config).expect("kl_revnat");
                if !entries.iter().any(|e| e.service == vip) {
                    failures.push(format!(
                        "{}: {vip} from {:?} not translated by socket LB",
                        case.name, p.from
                    ));
                }
            }
        }
    }
    assert!(served > 10, "probes from the node and pods ran: {served}");
    assert!(
        failures.is_empty(),
        "failures in ebpf mode:\n{}",
        failures.join("\n")
    );
    drop(proxier);
    drop(lab);
}
