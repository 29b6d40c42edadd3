//! Planning tests without a kernel: what a change costs in operations.

use std::collections::BTreeSet;
use std::time::Instant;

use super::config::{LocalTraffic, NftablesConfig};
use super::layout::{TableRole, fixed_layout};
use super::objects::{Op, TableId};
use super::render::render_port;
use super::table::FamilyTable;
use crate::fixtures::{EndpointSpec as Ep, ServiceBuilder, SliceBuilder};
use crate::model::{ChangeTracker, IpFamily, NodePortAddresses, NodeTopology, Protocol};

fn slice(i: u32, endpoints: u32) -> k8s_openapi::api::discovery::v1::EndpointSlice {
    let name = format!("svc-{i}");
    let mut s =
        SliceBuilder::new("ns", &name, &format!("{name}-x"), "IPv4").port("p", Protocol::Tcp, 8080);
    for e in 0..endpoints {
        s = s.endpoint(Ep::ready(&format!(
            "10.{}.{}.{}",
            128 + e,
            (i / 256) % 256,
            i % 256
        )));
    }
    s.build()
}

#[test]
fn adding_one_endpoint_among_ten_thousand_services_touches_one_service() {
    let mut config = NftablesConfig::default();
    config.local_traffic.insert(
        IpFamily::V4,
        LocalTraffic::Cidr("10.128.0.0/9".parse().unwrap_or_else(|_| unreachable!())),
    );
    let id = TableId {
        family: IpFamily::V4,
        index: 0,
    };
    let fixed = fixed_layout(
        IpFamily::V4,
        TableRole::Combined,
        &config,
        &NodePortAddresses::AllLocal,
    );
    let mut tracker = ChangeTracker::new([IpFamily::V4], NodeTopology::default());
    for i in 0..10_000u32 {
        tracker.update_service(
            &ServiceBuilder::new("ns", &format!("svc-{i}"))
                .cluster_ip(&format!(
                    "10.{}.{}.{}",
                    96 + i / 65_536,
                    (i / 256) % 256,
                    i % 256
                ))
                .port("p", Protocol::Tcp, 80)
                .build(),
        );
        tracker.update_endpoint_slice(&slice(i, 2));
    }
    let diff = tracker.diff();
    let desired = diff
        .changes
        .iter()
        .filter_map(|c| {
            c.current
                .as_ref()
                .map(|s| (c.key.clone(), render_port(s, &config)))
        })
        .collect();
    let mut table = FamilyTable::new(id);
    let plan = table.plan_full(
        "t",
        &fixed,
        desired,
        &BTreeSet::new(),
        &BTreeSet::new(),
        true,
    );
    assert!(plan.ops.len() > 60_000, "the cold plan writes everything");
    table.commit(plan, Instant::now());
    tracker.commit(&diff);

    tracker.update_endpoint_slice(&slice(1234, 3));
    let diff = tracker.diff();
    assert_eq!(diff.changes.len(), 1);
    let changes = diff
        .changes
        .iter()
        .map(|c| {
            (
                c.key.clone(),
                c.current.as_ref().map(|s| render_port(s, &config)),
            )
        })
        .collect();
    let plan = table.plan_incremental(&fixed, changes);
    // One new endpoint chain (created and filled), the service chain
    // rewritten; no element of any map changes.
    let mut added_chains = Vec::new();
    let mut flushed = Vec::new();
    let mut rule_chains = BTreeSet::new();
    for op in &plan.ops {
        match op {
            Op::AddChain { name, .. } => added_chains.push(name.clone()),
            Op::FlushChain { name, .. } => flushed.push(name.clone()),
            Op::AddRule { chain, .. } => {
                rule_chains.insert(chain.clone());
            }
            other => panic!("unexpected op {other}"),
        }
    }
    assert_eq!(added_chains.len(), 1, "{added_chains:?}");
    assert!(
        added_chains[0].starts_with("endpoint-")
            && added_chains[0].contains("ns/svc-1234/tcp/p__10.130.")
    );
    assert_eq!(flushed.len(), 1, "{flushed:?}");
    assert!(flushed[0].starts_with("service-") && flushed[0].ends_with("ns/svc-1234/tcp/p"));
    assert_eq!(rule_chains.len(), 2, "{rule_chains:?}");
    assert!(rule_chains.iter().all(|c| c.contains("ns/svc-1234/")));
    // 1 masquerade + 3 endpoint picks in the service chain, 2 rules in the new endpoint chain.
    assert_eq!(plan.ops.len(), 1 + 1 + 4 + 2);
}

#[test]
fn removing_a_service_removes_its_elements_and_retires_its_chains() {
    let config = NftablesConfig::default();
    let id = TableId {
        family: IpFamily::V4,
        index: 0,
    };
    let fixed = fixed_layout(
        IpFamily::V4,
        TableRole::Combined,
        &config,
        &NodePortAddresses::AllLocal,
    );
    let mut tracker = ChangeTracker::new([IpFamily::V4], NodeTopology::default());
    tracker.update_service(
        &ServiceBuilder::new("ns", "svc-1")
            .cluster_ip("10.96.0.1")
            .port("p", Protocol::Tcp, 80)
            .build(),
    );
    tracker.update_endpoint_slice(&slice(1, 1));
    let diff = tracker.diff();
    let mut table = FamilyTable::new(id);
    let desired = diff
        .changes
        .iter()
        .filter_map(|c| {
            c.current
                .as_ref()
                .map(|s| (c.key.clone(), render_port(s, &config)))
        })
        .collect();
    let plan = table.plan_full(
        "t",
        &fixed,
        desired,
        &BTreeSet::new(),
        &BTreeSet::new(),
        true,
    );
    table.commit(plan, Instant::now());
    tracker.commit(&diff);

    tracker.delete_service("ns", "svc-1");
    let diff = tracker.diff();
    let changes = diff.changes.iter().map(|c| (c.key.clone(), None)).collect();
    let plan = table.plan_incremental(&fixed, changes);
    let deleted_from: BTreeSet<String> = plan
        .ops
        .iter()
        .filter_map(|o| match o {
            Op::DelElements { set, .. } => Some(set.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(
        deleted_from,
        BTreeSet::from(["cluster-ips".to_string(), "service-ips".to_string()])
    );
    assert_eq!(
        plan.ops
            .iter()
            .filter(|o| matches!(o, Op::FlushChain { .. }))
            .count(),
        2
    );
    assert!(
        !plan.ops.iter().any(|o| matches!(o, Op::DelChain { .. })),
        "chains are deleted later"
    );
    table.commit(plan, Instant::now());
    assert_eq!(table.stale_chain_count(), 2);
    assert!(
        table.plan_stale_deletion(Instant::now()).is_none(),
        "not before a second"
    );
    let later = Instant::now() + super::table::STALE_CHAIN_DELAY;
    let del = table.plan_stale_deletion(later).map(|p| p.ops.len());
    assert_eq!(del, Some(2));
}
