//! System tests of the nftables data plane: real nf_tables rules programmed
//! over netlink in a "node" namespace, real TCP/UDP traffic from client and
//! pod namespaces (see `keelson_tests::proxy_cases` for the lab).

use std::sync::Arc;
use std::time::Duration;

use keelson_netplane::model::IpFamily;
use keelson_netplane::nftables::{LocalTraffic, NftablesBackend, NftablesConfig};
use keelson_netplane::prometheus::Registry;
use keelson_netplane::proxier::{
    ConntrackCleaner, Proxier, ProxierConfig, ProxyHandle, ProxyHealth, ServiceHealthServer,
};
use keelson_tests::proxy_cases::{
    CLUSTER_CIDR, Lab, NODE_NAME, NsListen, SERVICE_CIDR, cases, route_external_ips, run_case,
};
use keelson_tests::support::require_root;

fn nft_config(shards: u16) -> NftablesConfig {
    let mut c = NftablesConfig::default();
    c.local_traffic.insert(
        IpFamily::V4,
        LocalTraffic::Cidr(CLUSTER_CIDR.parse().unwrap_or_else(|_| unreachable!())),
    );
    c.service_cidrs.insert(
        IpFamily::V4,
        vec![SERVICE_CIDR.parse().unwrap_or_else(|_| unreachable!())],
    );
    c.service_shards = shards;
    c
}

/// A proxier with an nftables backend, conntrack cleaner and health-check
/// server, all living in the lab's node namespace.
fn proxier(lab: &Lab, shards: u16) -> (Proxier, ProxyHandle) {
    let config = nft_config(shards);
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
    let _ = ProxyHealth::new(Duration::from_secs(60), None);
    let proxier = proxier
        .with_conntrack(cleaner)
        .with_health_checks(hc)
        .with_events(Arc::new(keelson_netplane::proxier::LogEvents));
    (proxier, handle)
}

async fn run_table(shards: u16) {
    let lab = Lab::new(4).await.expect("lab");
    route_external_ips(&lab).expect("routes");
    let (mut proxier, handle) = proxier(&lab, shards);
    let mut failures = Vec::new();
    for case in cases() {
        failures.extend(run_case(&lab, &mut proxier, &handle, &case).await);
    }
    assert!(
        failures.is_empty(),
        "failures with {shards} service table(s):\n{}",
        failures.join("\n")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn service_cases_single_table() {
    if !require_root("service_cases_single_table") {
        return;
    }
    run_table(1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn service_cases_sharded_service_tables() {
    if !require_root("service_cases_sharded_service_tables") {
        return;
    }
    run_table(3).await;
}
