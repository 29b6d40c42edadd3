//! System tests of the nftables data plane: real nf_tables rules programmed
//! over netlink in a "node" namespace, real TCP/UDP traffic from client and
//! pod namespaces (see `keelson_tests::proxy_cases` for the lab).

use std::sync::Arc;
use std::time::Duration;

use keelson_netplane::model::IpFamily;
use keelson_netplane::nftables::{LocalTraffic, NftablesBackend};
use keelson_netplane::prometheus::Registry;
use keelson_netplane::proxier::{
    ConntrackCleaner, Proxier, ProxierConfig, ProxyHandle, ServiceHealthServer,
};
use keelson_tests::proxy_cases::{
    Lab, NODE_NAME, NsListen, cases, lab_nftables_config, route_external_ips, run_case,
};
use keelson_tests::support::require_root;

/// A proxier with an nftables backend, conntrack cleaner and health-check
/// server, all living in the lab's node namespace.
fn proxier(lab: &Lab) -> (Proxier, ProxyHandle) {
    let config = lab_nftables_config();
    let backend = lab
        .node
        .run(move || NftablesBackend::new(config))
        .expect("thread in node netns")
        .expect("nftables backend");
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
        .with_events(Arc::new(keelson_netplane::proxier::LogEvents));
    (proxier, handle)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn service_cases() {
    if !require_root("service_cases") {
        return;
    }
    let lab = Lab::new(4).await.expect("lab");
    route_external_ips(&lab).expect("routes");
    let (mut proxier, handle) = proxier(&lab);
    let mut failures = Vec::new();
    for case in cases() {
        failures.extend(run_case(&lab, &mut proxier, &handle, &case).await);
    }
    assert!(failures.is_empty(), "failures:\n{}", failures.join("\n"));
}

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use keelson_netplane::BackendError;
use keelson_netplane::fixtures::{EndpointSpec, ServiceBuilder, SliceBuilder};
use keelson_netplane::model::Protocol;
use keelson_netplane::nftables::listing::list_table;
use keelson_netplane::proxier::{ListenFailure, ProxyEvents};
use keelson_tests::proxy_cases::{
    NoReply, OTHER_NODE, Origin, TCP_PORT, UDP_PORT, pod_ip, pod_name,
};

fn web(name: &str, vip: &str) -> Service {
    ServiceBuilder::new("default", name)
        .cluster_ip(vip)
        .port("http", Protocol::Tcp, 80)
        .port("dns", Protocol::Udp, 53)
        .build()
}

fn slices(name: &str, pods: &[usize]) -> Vec<EndpointSlice> {
    let mk = |port: &str, proto: Protocol, target: u16, suffix: &str| {
        let mut s = SliceBuilder::new("default", name, &format!("{name}-{suffix}"), "IPv4")
            .port(port, proto, target);
        for p in pods {
            s = s.endpoint(EndpointSpec::ready(&pod_ip(*p).to_string()).node(OTHER_NODE));
        }
        s.build()
    };
    vec![
        mk("http", Protocol::Tcp, TCP_PORT, "tcp"),
        mk("dns", Protocol::Udp, UDP_PORT, "udp"),
    ]
}

fn sa(s: &str) -> std::net::SocketAddr {
    s.parse().unwrap_or_else(|_| unreachable!())
}

async fn pods_seen(
    lab: &Lab,
    origin: Origin,
    addr: &str,
    n: usize,
) -> std::collections::BTreeSet<String> {
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..n {
        match lab.tcp(origin, sa(addr), Duration::from_secs(3)).await {
            Ok(r) => {
                seen.insert(r.pod);
            }
            Err(e) => {
                seen.insert(format!("error {e:?}"));
            }
        }
    }
    seen
}

fn set(names: &[usize]) -> std::collections::BTreeSet<String> {
    names.iter().map(|i| pod_name(*i)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoint_removal_stops_new_connections_and_flushes_udp_flows() {
    if !require_root("endpoint_removal_stops_new_connections_and_flushes_udp_flows") {
        return;
    }
    let lab = Lab::new(4).await.expect("lab");
    let (mut proxier, handle) = proxier(&lab);
    handle.replace_services(&[web("web", "10.96.0.30")]);
    handle.replace_endpoint_slices(slices("web", &[0, 1]));
    tokio::task::block_in_place(|| proxier.sync_now(false)).expect("sync");
    assert_eq!(
        pods_seen(&lab, Origin::Pod(3), "10.96.0.30:80", 20).await,
        set(&[0, 1])
    );

    // A UDP flow from a fixed source port lands on one endpoint...
    let first = lab
        .udp(
            Origin::Pod(3),
            sa("10.96.0.30:53"),
            40053,
            Duration::from_secs(3),
        )
        .await
        .expect("udp reply");
    let again = lab
        .udp(
            Origin::Pod(3),
            sa("10.96.0.30:53"),
            40053,
            Duration::from_secs(3),
        )
        .await
        .expect("udp reply");
    assert_eq!(first.pod, again.pod, "same flow, same endpoint");
    let (gone, stays) = if first.pod == pod_name(0) {
        (0, 1)
    } else {
        (1, 0)
    };

    // ...which is then removed: new TCP connections avoid it, and the UDP
    // flow (still alive in conntrack) is flushed so it moves too, although
    // the removed pod still answers.
    handle.replace_endpoint_slices(slices("web", &[stays]));
    let report = tokio::task::block_in_place(|| proxier.sync_now(false)).expect("sync");
    assert!(
        report.conntrack_deleted >= 1,
        "the stale UDP entry was deleted: {report:?}"
    );
    assert_eq!(
        pods_seen(&lab, Origin::Pod(3), "10.96.0.30:80", 20).await,
        set(&[stays])
    );
    let after = lab
        .udp(
            Origin::Pod(3),
            sa("10.96.0.30:53"),
            40053,
            Duration::from_secs(3),
        )
        .await
        .expect("udp reply");
    assert_eq!(after.pod, pod_name(stays), "flow moved off pod-{gone}");
    let deleted = handle
        .metrics()
        .conntrack_deleted
        .with_label_values(&["IPv4"])
        .get();
    assert!(
        deleted >= 1.0,
        "kubeproxy_conntrack_reconciler_deleted_entries_total = {deleted}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_adopts_the_table_without_dropping_traffic() {
    if !require_root("restart_adopts_the_table_without_dropping_traffic") {
        return;
    }
    let lab = Arc::new(Lab::new(3).await.expect("lab"));
    route_external_ips(&lab).expect("routes");
    let (mut first, handle) = proxier(&lab);
    handle.replace_services(&[web("web", "10.96.0.31"), web("old", "10.96.0.32")]);
    handle.replace_endpoint_slices([slices("web", &[0, 1]), slices("old", &[2])].concat());
    tokio::task::block_in_place(|| first.sync_now(false)).expect("first instance syncs");
    assert_eq!(
        pods_seen(&lab, Origin::Client, "10.96.0.32:80", 3).await,
        set(&[2])
    );

    // Traffic to the unchanged Service runs all along.
    let stop = Arc::new(AtomicBool::new(false));
    let ok = Arc::new(AtomicUsize::new(0));
    let failures = Arc::new(Mutex::new(Vec::new()));
    let prober = {
        let (lab, stop, ok, failures) = (lab.clone(), stop.clone(), ok.clone(), failures.clone());
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                match lab
                    .tcp(Origin::Client, sa("10.96.0.31:80"), Duration::from_secs(2))
                    .await
                {
                    Ok(_) => {
                        ok.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => failures
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push(format!("{e:?}")),
                }
            }
        })
    };
    keelson_tests::support::wait_for(
        "prober running",
        Duration::from_secs(10),
        Duration::from_millis(20),
        || {
            let n = ok.load(Ordering::Relaxed);
            async move {
                if n >= 5 {
                    Ok(())
                } else {
                    Err(format!("{n} ok"))
                }
            }
        },
    )
    .await
    .expect("prober");

    // keelson stops; "old" is deleted while it is down; a new instance
    // starts, lists, and adopts the table in one transaction.
    drop(first);
    let (mut second, handle) = proxier(&lab);
    handle.replace_services(&[web("web", "10.96.0.31")]);
    handle.replace_endpoint_slices(slices("web", &[0, 1]));
    let report =
        tokio::task::block_in_place(|| second.sync_now(false)).expect("second instance adopts");
    assert!(report.full && report.outcome.repaired, "{report:?}");
    let before = ok.load(Ordering::Relaxed);
    keelson_tests::support::wait_for(
        "traffic after the restart",
        Duration::from_secs(10),
        Duration::from_millis(20),
        || {
            let n = ok.load(Ordering::Relaxed);
            async move {
                if n >= before + 10 {
                    Ok(())
                } else {
                    Err(format!("{n} ok"))
                }
            }
        },
    )
    .await
    .expect("traffic continues");
    stop.store(true, Ordering::Relaxed);
    prober.await.expect("prober");
    let failures = failures.lock().unwrap_or_else(|p| p.into_inner()).clone();
    assert!(failures.is_empty(), "dropped during restart: {failures:?}");

    // The Service deleted while keelson was down is gone: its ClusterIP is
    // now an unallocated address of the Service CIDR (dropped), its chains
    // are emptied.
    let r = lab
        .tcp(
            Origin::Client,
            sa("10.96.0.32:80"),
            Duration::from_millis(700),
        )
        .await;
    assert_eq!(r, Err(NoReply::Timeout));
    let text = lab
        .node
        .exec("nft", &["list", "table", "ip", "keelson"])
        .expect("nft list");
    assert!(
        !text.contains("10.96.0.32"),
        "the deleted Service's elements are gone:\n{text}"
    );
    assert!(
        text.contains("10.96.0.31 . tcp . 80 : goto endpoints-2"),
        "{text}"
    );
}

#[derive(Default)]
struct Recorded(Mutex<Vec<String>>);

impl ProxyEvents for Recorded {
    fn sync_failed(&self, backend: &str, error: &BackendError) {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(format!("{backend}: {error}"));
    }
    fn healthcheck_failed(&self, failure: &ListenFailure) {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(failure.to_string());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kernel_refusal_keeps_the_previous_rules() {
    if !require_root("kernel_refusal_keeps_the_previous_rules") {
        return;
    }
    let lab = Lab::new(2).await.expect("lab");
    let (proxier, handle) = proxier(&lab);
    let events = Arc::new(Recorded::default());
    let mut proxier = proxier.with_events(events.clone());
    handle.replace_services(&[web("web", "10.96.0.33")]);
    handle.replace_endpoint_slices(slices("web", &[0]));
    tokio::task::block_in_place(|| proxier.sync_now(false)).expect("sync");
    assert_eq!(
        pods_seen(&lab, Origin::Pod(1), "10.96.0.33:80", 5).await,
        set(&[0])
    );

    // Someone else writes a conflicting element into keelson's dispatch map.
    lab.node
        .exec(
            "nft",
            &["add element ip keelson service-ips { 10.96.0.34 . tcp . 80 : drop }"],
        )
        .expect("operator's element");
    // The next sync (a new Service using that address, and a changed
    // endpoint of the old one) is refused as a whole.
    handle.replace_services(&[web("web", "10.96.0.33"), web("new", "10.96.0.34")]);
    handle.replace_endpoint_slices([slices("web", &[1]), slices("new", &[1])].concat());
    let err = tokio::task::block_in_place(|| proxier.sync_now(false)).expect_err("refused");
    match &err {
        BackendError::Refused { what, errno, .. } => {
            assert!(what.contains("service-ips"), "{what}");
            assert!(errno.is_some(), "{err}");
        }
        other => panic!("want a kernel refusal, got {other}"),
    }
    let recorded = events.0.lock().unwrap_or_else(|p| p.into_inner()).clone();
    assert_eq!(recorded.len(), 1, "{recorded:?}");
    assert!(
        recorded[0].starts_with("nftables: kernel refused"),
        "{recorded:?}"
    );
    let failures = handle
        .metrics()
        .nftables_sync_failures
        .with_label_values(&["IPv4"])
        .get();
    assert_eq!(failures, 1.0);
    // The previous rules are intact: the old Service still goes to pod-0.
    assert_eq!(
        pods_seen(&lab, Origin::Pod(1), "10.96.0.33:80", 5).await,
        set(&[0])
    );
    assert!(
        handle.has_pending(),
        "the refused changes are still pending"
    );

    // Once the conflict is gone, the same changes apply.
    lab.node
        .exec(
            "nft",
            &["delete element ip keelson service-ips { 10.96.0.34 . tcp . 80 }"],
        )
        .expect("operator removes the element");
    tokio::task::block_in_place(|| proxier.sync_now(false)).expect("sync after the conflict");
    assert_eq!(
        pods_seen(&lab, Origin::Pod(0), "10.96.0.33:80", 5).await,
        set(&[1])
    );
    assert_eq!(
        pods_seen(&lab, Origin::Pod(0), "10.96.0.34:80", 5).await,
        set(&[1])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_table_reads_like_kube_proxys() {
    if !require_root("the_table_reads_like_kube_proxys") {
        return;
    }
    let lab = Lab::new(1).await.expect("lab");
    let (mut proxier, handle) = proxier(&lab);
    handle.replace_services(&[web("web", "10.96.0.35")]);
    handle.replace_endpoint_slices(slices("web", &[0]));
    tokio::task::block_in_place(|| proxier.sync_now(false)).expect("sync");
    let text = lab
        .node
        .exec("nft", &["list", "table", "ip", "keelson"])
        .expect("nft list");
    for want in [
        "map service-ips {",
        "type ipv4_addr . inet_proto . inet_service : verdict",
        "comment \"ClusterIP, ExternalIP and LoadBalancer IP traffic\"",
        "10.96.0.35 . tcp . 80 : goto endpoints-1",
        "map service-endpoints {",
        "type ipv4_addr . inet_proto . inet_service . mark : ipv4_addr . inet_service",
        "10.96.0.35 . tcp . 80 . 0x00000000 : 10.244.1.2 . 8080",
        "chain services {",
        "ip daddr . meta l4proto . th dport vmap @service-ips",
        "chain endpoints-1 {",
        "dnat ip to ip daddr . meta l4proto . th dport . numgen random mod 1 map @service-endpoints",
        "ip daddr @cluster-ips reject comment \"Reject traffic to invalid ports of ClusterIPs\"",
        "meta mark & 0x00004000 != 0x00000000 meta mark set meta mark ^ 0x00004000 masquerade fully-random",
        "ct status dnat ip saddr . ip daddr . meta l4proto . th dport @hairpin-connections masquerade fully-random",
        "type filter hook output priority filter; policy accept;",
    ] {
        assert!(text.contains(want), "missing {want:?} in:\n{text}");
    }
    // Read back as JSON too: the shared chain holds the one pick.
    let listing = lab
        .node
        .run(|| list_table(IpFamily::V4, "keelson"))
        .expect("thread")
        .expect("json");
    assert_eq!(
        listing.chains.get("endpoints-1").map(|c| c.1),
        Some(1),
        "{:?}",
        listing.chains
    );
    assert!(
        !listing.chains.keys().any(|n| n.contains("default/web")),
        "a plain ClusterIP Service has no chain of its own: {:?}",
        listing.chains
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dual_stack_service_is_programmed_in_ip_and_ip6_tables() {
    use tokio::io::AsyncWriteExt;
    if !require_root("dual_stack_service_is_programmed_in_ip_and_ip6_tables") {
        return;
    }
    let lab = Lab::new(2).await.expect("lab");
    // IPv6 on the node links (no DAD: addresses usable at once) and an
    // IPv6 server in each pod on port 8081.
    lab.node
        .exec("sysctl", &["-qw", "net.ipv6.conf.all.forwarding=1"])
        .expect("v6 forwarding");
    let mut servers = Vec::new();
    for (i, pod) in lab.pods.iter().enumerate() {
        let n = i + 1;
        lab.node
            .ip(&[
                "addr",
                "add",
                &format!("fd00:244:{n}::1/64"),
                "dev",
                &format!("n-p{i}"),
                "nodad",
            ])
            .expect("node v6");
        pod.ns
            .ip(&[
                "addr",
                "add",
                &format!("fd00:244:{n}::2/64"),
                "dev",
                "eth0",
                "nodad",
            ])
            .expect("pod v6");
        pod.ns
            .ip(&[
                "-6",
                "route",
                "add",
                "default",
                "via",
                &format!("fd00:244:{n}::1"),
            ])
            .expect("pod v6 route");
        let l = pod.ns.tcp_listener(sa("[::]:8081")).expect("v6 listener");
        let name = format!("pod-{i}-v6");
        servers.push(tokio::spawn(async move {
            loop {
                let Ok((mut s, peer)) = l.accept().await else {
                    continue;
                };
                let _ = s.write_all(format!("{name} {peer}\n").as_bytes()).await;
                let _ = s.shutdown().await;
            }
        }));
    }
    let mut config = lab_nftables_config();
    config.families = vec![IpFamily::V4, IpFamily::V6];
    config.local_traffic.insert(
        IpFamily::V6,
        LocalTraffic::Cidr("fd00:244::/32".parse().unwrap_or_else(|_| unreachable!())),
    );
    let backend = lab
        .node
        .run(move || NftablesBackend::new(config))
        .expect("netns thread")
        .expect("backend");
    let (mut proxier, handle) = Proxier::new(
        ProxierConfig {
            node_name: NODE_NAME.into(),
            families: vec![IpFamily::V4, IpFamily::V6],
            min_sync_period: Duration::ZERO,
            sync_period: Duration::from_secs(30),
        },
        Box::new(backend),
        &Registry::new(),
    )
    .expect("proxier");
    handle.replace_services(&[ServiceBuilder::new("default", "ds")
        .cluster_ips(&["10.96.0.50", "fd00:96::50"])
        .port("http", Protocol::Tcp, 80)
        .build()]);
    let v4 = SliceBuilder::new("default", "ds", "ds-v4", "IPv4")
        .port("http", Protocol::Tcp, TCP_PORT)
        .endpoint(EndpointSpec::ready(&pod_ip(0).to_string()))
        .build();
    let v6 = SliceBuilder::new("default", "ds", "ds-v6", "IPv6")
        .port("http", Protocol::Tcp, 8081)
        .endpoint(EndpointSpec::ready("fd00:244:1::2"))
        .build();
    handle.replace_endpoint_slices(&[v4, v6]);
    tokio::task::block_in_place(|| proxier.sync_now(false)).expect("sync both families");

    let r4 = lab
        .tcp(Origin::Pod(1), sa("10.96.0.50:80"), Duration::from_secs(3))
        .await
        .expect("v4");
    assert_eq!(r4.pod, "pod-0");
    let r6 = lab
        .tcp(
            Origin::Pod(1),
            sa("[fd00:96::50]:80"),
            Duration::from_secs(3),
        )
        .await
        .expect("v6");
    assert_eq!(r6.pod, "pod-0-v6");
    assert_eq!(
        r6.peer.ip().to_string(),
        "fd00:244:2::2",
        "pod traffic keeps its source"
    );
    let text = lab
        .node
        .exec("nft", &["list", "table", "ip6", "keelson"])
        .expect("ip6 table");
    assert!(
        text.contains("type ipv6_addr . inet_proto . inet_service : verdict"),
        "{text}"
    );
    assert!(
        text.contains("fd00:96::50 . tcp . 80 : goto endpoints-1"),
        "{text}"
    );
    for s in servers {
        s.abort();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn service_tables_of_an_earlier_version_are_removed() {
    if !require_root("service_tables_of_an_earlier_version_are_removed") {
        return;
    }
    let lab = Lab::new(2).await.expect("lab");
    // What an earlier keelson with sharded service tables left: a table
    // that would keep translating the Service.
    lab.node
        .exec(
            "nft",
            &["add table ip keelson-services-03; add chain ip keelson-services-03 nat-output { type nat hook output priority -100; }"],
        )
        .expect("leftover table");
    let (mut proxier, handle) = proxier(&lab);
    let tables = lab.node.exec("nft", &["list", "tables"]).expect("nft");
    assert!(!tables.contains("keelson-services"), "{tables}");
    handle.replace_services(&[web("web", "10.96.0.60")]);
    handle.replace_endpoint_slices(slices("web", &[1]));
    tokio::task::block_in_place(|| proxier.sync_now(false)).expect("sync");
    assert_eq!(
        pods_seen(&lab, Origin::Pod(0), "10.96.0.60:80", 10).await,
        set(&[1])
    );
}
