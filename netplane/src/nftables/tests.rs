//! Planning tests without a kernel: what a change costs in operations.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Instant;

use super::config::{LocalTraffic, NftablesConfig};
use super::layout::fixed_layout;
use super::objects::{Op, TableId};
use super::table::{FamilyTable, FullSyncInput, KernelElements, KernelTable, KernelValue, Plan};
use crate::fixtures::{EndpointSpec as Ep, ServiceBuilder, SliceBuilder};
use crate::model::{
    ChangeTracker, IpFamily, NodePortAddresses, NodeTopology, Protocol, ServicePortKey,
    ServicePortState,
};

fn config() -> NftablesConfig {
    let mut config = NftablesConfig::default();
    config.local_traffic.insert(
        IpFamily::V4,
        LocalTraffic::Cidr("10.128.0.0/9".parse().unwrap_or_else(|_| unreachable!())),
    );
    config
}

fn table_id() -> TableId {
    TableId {
        family: IpFamily::V4,
        index: 0,
    }
}

fn cluster_ip(i: u32) -> String {
    format!("10.{}.{}.{}", 96 + i / 65_536, (i / 256) % 256, i % 256)
}

fn service(i: u32) -> k8s_openapi::api::core::v1::Service {
    ServiceBuilder::new("ns", &format!("svc-{i}"))
        .cluster_ip(&cluster_ip(i))
        .port("p", Protocol::Tcp, 80)
        .build()
}

/// Service `i`'s slice with endpoints `first..first+count`.
fn slice(i: u32, first: u32, count: u32) -> k8s_openapi::api::discovery::v1::EndpointSlice {
    let name = format!("svc-{i}");
    let mut s =
        SliceBuilder::new("ns", &name, &format!("{name}-x"), "IPv4").port("p", Protocol::Tcp, 8080);
    for e in first..first + count {
        s = s.endpoint(Ep::ready(&format!(
            "10.{}.{}.{}",
            128 + e,
            (i / 256) % 256,
            i % 256
        )));
    }
    s.build()
}

type Changes = Vec<(ServicePortKey, Option<Arc<ServicePortState>>)>;

fn changes(tracker: &ChangeTracker) -> Changes {
    tracker
        .diff()
        .changes
        .iter()
        .map(|c| (c.key.clone(), c.current.clone()))
        .collect()
}

fn plan(table: &FamilyTable, tracker: &ChangeTracker) -> Plan {
    let config = config();
    let fixed = fixed_layout(IpFamily::V4, &config, &NodePortAddresses::AllLocal);
    table
        .plan_incremental(&config, &fixed, changes(tracker))
        .unwrap_or_else(|e| panic!("{e}"))
}

fn apply(table: &mut FamilyTable, tracker: &mut ChangeTracker) -> Vec<Op> {
    let diff = tracker.diff();
    let mut p = plan(table, tracker);
    let ops = std::mem::take(&mut p.ops);
    table.commit(p, Instant::now());
    tracker.commit(&diff);
    ops
}

/// A table holding everything the tracker has, planned against `kernel`.
fn full(tracker: &ChangeTracker, kernel: &KernelTable) -> Plan {
    let config = config();
    let fixed = fixed_layout(IpFamily::V4, &config, &NodePortAddresses::AllLocal);
    let desired = changes(tracker)
        .into_iter()
        .filter_map(|(k, s)| s.map(|s| (k, s)))
        .collect();
    let mut empty = |_: &str, _: Option<&[&[u8]]>| Some(KernelElements::default());
    FamilyTable::new(table_id())
        .plan_full(
            FullSyncInput {
                config: &config,
                table_comment: "t",
                fixed: &fixed,
                kernel,
                reset_base_chains: true,
            },
            desired,
            &mut empty,
        )
        .unwrap_or_else(|e| panic!("{e}"))
}

fn start(tracker: &mut ChangeTracker) -> FamilyTable {
    let diff = tracker.diff();
    let plan = full(tracker, &KernelTable::default());
    let mut table = FamilyTable::new(table_id());
    table.commit(plan, Instant::now());
    tracker.commit(&diff);
    table
}

/// What ops of a plan touch, as `set:<name>` / `chain:<name>` / `rule:<chain>`.
fn touched(ops: &[Op]) -> BTreeSet<String> {
    ops.iter()
        .map(|op| match op {
            Op::AddElements { set, .. } => format!("add-elements:{set}"),
            Op::DelElements { set, .. } => format!("del-elements:{set}"),
            Op::AddChain { name, .. } => format!("add-chain:{name}"),
            Op::FlushChain { name, .. } => format!("flush-chain:{name}"),
            Op::AddRule { chain, .. } => format!("rule:{chain}"),
            other => format!("{other}"),
        })
        .collect()
}

fn object_count(ops: &[Op]) -> usize {
    ops.iter().map(Op::object_count).sum()
}

fn tracker_with(services: u32, endpoints: u32) -> ChangeTracker {
    let mut tracker = ChangeTracker::new([IpFamily::V4], NodeTopology::default());
    for i in 0..services {
        tracker.update_service(&service(i));
        tracker.update_endpoint_slice(&slice(i, 0, endpoints));
    }
    tracker
}

#[test]
fn among_ten_thousand_services_changes_touch_only_their_elements() {
    let mut tracker = tracker_with(10_000, 2);
    let cold = full(&tracker, &KernelTable::default());
    assert!(
        object_count(&cold.ops) > 40_000,
        "the cold plan writes everything"
    );
    assert!(
        !cold
            .ops
            .iter()
            .any(|o| matches!(o, Op::AddChain { name, .. } if name.contains('/'))),
        "no chain of its own for a plain ClusterIP service"
    );
    let mut table = start(&mut tracker);

    // Same count, one endpoint replaced: endpoint elements and the list's
    // digest, nothing else (slots follow the sorted endpoints, so both
    // slots move here).
    tracker.update_endpoint_slice(&slice(77, 1, 2));
    let ops = apply(&mut table, &mut tracker);
    assert_eq!(
        touched(&ops),
        BTreeSet::from([
            "add-elements:service-endpoints".to_string(),
            "del-elements:service-endpoints".to_string(),
            "add-elements:service-endpoints-digest".to_string(),
            "del-elements:service-endpoints-digest".to_string(),
        ]),
        "{ops:?}"
    );
    assert_eq!(object_count(&ops), 6, "both slots and the digest rewritten");

    // A new count: its shared chain is created once.
    tracker.update_endpoint_slice(&slice(1234, 0, 3));
    let ops = apply(&mut table, &mut tracker);
    assert_eq!(
        touched(&ops),
        BTreeSet::from([
            "add-chain:endpoints-3".to_string(),
            "rule:endpoints-3".to_string(),
            "add-elements:service-endpoints".to_string(),
            "add-elements:service-ips".to_string(),
            "del-elements:service-ips".to_string(),
            "add-elements:service-endpoints-digest".to_string(),
            "del-elements:service-endpoints-digest".to_string(),
        ])
    );
    // The next Service going to three endpoints re-points its dispatch
    // element, adds one endpoint element and rewrites its digest.
    tracker.update_endpoint_slice(&slice(4321, 0, 3));
    let ops = apply(&mut table, &mut tracker);
    assert_eq!(
        touched(&ops),
        BTreeSet::from([
            "add-elements:service-endpoints".to_string(),
            "add-elements:service-ips".to_string(),
            "del-elements:service-ips".to_string(),
            "add-elements:service-endpoints-digest".to_string(),
            "del-elements:service-endpoints-digest".to_string(),
        ])
    );
    assert_eq!(object_count(&ops), 5);

    // A new Service: its elements only.
    tracker.update_service(&service(20_000));
    tracker.update_endpoint_slice(&slice(20_000, 0, 2));
    let ops = apply(&mut table, &mut tracker);
    assert_eq!(
        touched(&ops),
        BTreeSet::from([
            "add-elements:cluster-ips".to_string(),
            "add-elements:service-endpoints".to_string(),
            "add-elements:service-ips".to_string(),
            "add-elements:service-endpoints-digest".to_string(),
        ])
    );
    assert_eq!(object_count(&ops), 5);
}

#[test]
fn removing_the_last_service_of_a_count_retires_its_chain() {
    let mut tracker = tracker_with(3, 1);
    tracker.update_endpoint_slice(&slice(2, 0, 4));
    let mut table = start(&mut tracker);
    let shared: BTreeSet<(u32, u32)> = table.shared_chains().collect();
    assert_eq!(shared, BTreeSet::from([(1, 2), (4, 1)]), "value -> keys");

    tracker.delete_service("ns", "svc-2");
    let ops = apply(&mut table, &mut tracker);
    let deleted: BTreeSet<String> = ops
        .iter()
        .filter_map(|o| match o {
            Op::DelElements { set, keys, .. } => Some(format!("{set}:{}", keys.len())),
            _ => None,
        })
        .collect();
    assert_eq!(
        deleted,
        BTreeSet::from([
            "cluster-ips:1".to_string(),
            "service-ips:1".to_string(),
            "service-endpoints:4".to_string(),
            "service-endpoints-digest:1".to_string(),
        ])
    );
    assert!(
        ops.iter()
            .any(|o| matches!(o, Op::FlushChain { name, .. } if name == "endpoints-4")),
        "{ops:?}"
    );
    assert!(
        !ops.iter().any(|o| matches!(o, Op::DelChain { .. })),
        "chains are deleted later"
    );
    assert_eq!(table.stale_chain_count(), 1);
    assert!(
        table.plan_stale_deletion(Instant::now()).is_none(),
        "not before a second"
    );
    let later = Instant::now() + super::table::STALE_CHAIN_DELAY;
    let del = table.plan_stale_deletion(later).map(|p| p.ops.len());
    assert_eq!(del, Some(1));

    // Back to four endpoints before it was deleted: the chain is reused.
    tracker.update_service(&service(2));
    let ops = apply(&mut table, &mut tracker);
    assert!(
        !ops.iter().any(|o| matches!(o, Op::AddChain { .. })),
        "the flushed chain is still there: {ops:?}"
    );
    assert!(
        ops.iter()
            .any(|o| matches!(o, Op::AddRule { chain, .. } if chain == "endpoints-4"))
    );
    assert_eq!(table.stale_chain_count(), 0);
}

#[test]
fn affinity_and_local_external_traffic_keep_chains_of_their_own() {
    let mut tracker = ChangeTracker::new(
        [IpFamily::V4],
        NodeTopology {
            name: "me".into(),
            zone: None,
        },
    );
    tracker.update_service(
        &ServiceBuilder::new("ns", "sticky")
            .cluster_ip("10.96.0.1")
            .port("p", Protocol::Tcp, 80)
            .client_ip_affinity(60)
            .build(),
    );
    tracker.update_endpoint_slice(&slice(1, 0, 2).tap_name("sticky"));
    tracker.update_service(
        &ServiceBuilder::new("ns", "lb")
            .cluster_ip("10.96.0.2")
            .type_("LoadBalancer")
            .node_port("p", Protocol::Tcp, 80, 30080)
            .lb_ingress("192.0.2.1")
            .external_traffic_local(Some(31000))
            .build(),
    );
    let mut s = SliceBuilder::new("ns", "lb", "lb-x", "IPv4").port("p", Protocol::Tcp, 8080);
    s = s.endpoint(Ep::ready("10.128.0.5").node("me"));
    s = s.endpoint(Ep::ready("10.129.0.5").node("other"));
    tracker.update_endpoint_slice(&s.build());
    let plan = full(&tracker, &KernelTable::default());
    let chains: BTreeSet<String> = plan
        .ops
        .iter()
        .filter_map(|o| match o {
            Op::AddChain {
                name, base: None, ..
            } if name.contains('/') => {
                let kind = name.split('-').next().unwrap_or_default();
                let service = if name.contains("ns/sticky/") {
                    "sticky"
                } else {
                    "lb"
                };
                Some(format!("{kind}/{service}"))
            }
            _ => None,
        })
        .collect();
    assert_eq!(
        chains,
        BTreeSet::from([
            // ClientIP affinity: upstream's service and endpoint chains.
            "service/sticky".to_string(),
            "endpoint/sticky".to_string(),
            // eTP=Local: the external chain, the Cluster chain for the
            // short-circuit and the Local chain.
            "external/lb".to_string(),
            "service/lb".to_string(),
            "local/lb".to_string(),
        ])
    );
    // The ClusterIP of the eTP=Local Service is served by an endpoint list.
    let text = format!("{:?}", plan.ops);
    assert!(text.contains("endpoints-2"), "{text}");
    // The hairpin set has the local endpoint only.
    let hairpin: usize = plan
        .ops
        .iter()
        .filter_map(|o| match o {
            Op::AddElements { set, elements, .. } if set == "hairpin-connections" => {
                Some(elements.len())
            }
            _ => None,
        })
        .sum();
    assert_eq!(hairpin, 1);
}

/// Renames a fixture slice's Service.
trait TapName {
    fn tap_name(self, service: &str) -> Self;
}

impl TapName for k8s_openapi::api::discovery::v1::EndpointSlice {
    fn tap_name(mut self, service: &str) -> Self {
        if let Some(l) = self.metadata.labels.as_mut() {
            l.insert("kubernetes.io/service-name".into(), service.into());
        }
        self.metadata.name = Some(format!("{service}-x"));
        self
    }
}

#[test]
fn two_services_claiming_one_external_ip_hand_it_over() {
    let mut tracker = ChangeTracker::new([IpFamily::V4], NodeTopology::default());
    for (i, name) in ["a", "b"].into_iter().enumerate() {
        tracker.update_service(
            &ServiceBuilder::new("ns", name)
                .cluster_ip(&cluster_ip(i as u32 + 1))
                .port("p", Protocol::Tcp, 80)
                .external_ips(&["192.0.2.9"])
                .build(),
        );
        tracker.update_endpoint_slice(&slice(i as u32, 0, i as u32 + 1).tap_name(name));
    }
    let mut table = start(&mut tracker);
    // b's external IP needs two endpoints: taking over re-points the
    // dispatch element to external-endpoints-2 and writes slot 1.
    tracker.delete_service("ns", "a");
    let ops = apply(&mut table, &mut tracker);
    let text = format!("{ops:?}");
    assert!(text.contains("external-endpoints-2"), "{text}");
    let added: usize = ops
        .iter()
        .filter_map(|o| match o {
            Op::AddElements { set, elements, .. } if set == "service-endpoints" => {
                Some(elements.len())
            }
            _ => None,
        })
        .sum();
    assert_eq!(added, 2, "slot 0 changes, slot 1 is new: {text}");
}

/// What the kernel holds after `ops` were applied to an empty table.
fn kernel_after(ops: &[Op]) -> (KernelTable, HashMap<String, KernelElements>) {
    let mut kernel = KernelTable::default();
    let mut elements: HashMap<String, KernelElements> = HashMap::new();
    for op in ops {
        match op {
            Op::AddChain { name, .. } => {
                kernel.chains.entry(name.clone()).or_default();
            }
            Op::AddRule { chain, rule, .. } => {
                kernel
                    .chains
                    .entry(chain.clone())
                    .or_default()
                    .push(Some(rule.fingerprint()));
                if let Some(b) = rule.slots {
                    kernel.chain_slots.insert(chain.clone(), b);
                }
            }
            Op::AddSet { set, .. } => {
                kernel.sets.insert(set.name.clone());
            }
            Op::AddElements {
                set, elements: els, ..
            } => {
                let m = elements.entry(set.clone()).or_default();
                for e in els {
                    let v = match (&e.verdict, &e.data) {
                        (Some(v), _) => KernelValue::Verdict(v.code(), v.chain().map(String::from)),
                        (None, Some(d)) => KernelValue::Data(d.clone()),
                        _ => KernelValue::None,
                    };
                    m.insert(e.key.clone(), v);
                }
            }
            _ => {}
        }
    }
    (kernel, elements)
}

/// Plans the adoption of `kernel` + `elements` for what `tracker` holds;
/// also returns how many keys were read by key from each set.
fn adopt(
    tracker: &ChangeTracker,
    kernel: &KernelTable,
    elements: &HashMap<String, KernelElements>,
) -> (Plan, HashMap<String, usize>) {
    let config = config();
    let fixed = fixed_layout(IpFamily::V4, &config, &NodePortAddresses::AllLocal);
    let desired = changes(tracker)
        .into_iter()
        .filter_map(|(k, s)| s.map(|s| (k, s)))
        .collect();
    let mut asked: HashMap<String, usize> = HashMap::new();
    let mut reader = |set: &str, keys: Option<&[&[u8]]>| {
        let all = elements.get(set).cloned().unwrap_or_default();
        Some(match keys {
            None => all,
            Some(keys) => {
                *asked.entry(set.to_string()).or_default() += keys.len();
                all.into_iter()
                    .filter(|(k, _)| keys.contains(&k.as_slice()))
                    .collect()
            }
        })
    };
    let plan = FamilyTable::new(table_id())
        .plan_full(
            FullSyncInput {
                config: &config,
                table_comment: "t",
                fixed: &fixed,
                kernel,
                reset_base_chains: false,
            },
            desired,
            &mut reader,
        )
        .unwrap_or_else(|e| panic!("{e}"));
    (plan, asked)
}

fn writes(plan: &Plan) -> Vec<&Op> {
    plan.ops
        .iter()
        .filter(|o| !matches!(o, Op::AddTable { .. } | Op::AddSet { .. }))
        .collect()
}

#[test]
fn adopting_an_identical_table_writes_nothing_but_the_base_chains() {
    let tracker = tracker_with(50, 3);
    let cold = full(&tracker, &KernelTable::default());
    let (kernel, elements) = kernel_after(&cold.ops);
    let (plan, _) = adopt(&tracker, &kernel, &elements);
    let writes = writes(&plan);
    assert!(writes.is_empty(), "{writes:?}");
}

/// At restart the endpoint lists whose dispatch element and digest match
/// are not read back (but for a sample): at 2,000 Services × 10 that is
/// at most `DIGEST_SAMPLE` × 10 slots instead of 20,000.
#[test]
fn adopting_reads_only_a_sample_of_the_endpoint_lists() {
    use super::table::DIGEST_SAMPLE;
    let tracker = tracker_with(2_000, 10);
    let cold = full(&tracker, &KernelTable::default());
    let (kernel, elements) = kernel_after(&cold.ops);
    assert_eq!(
        elements.get("service-endpoints-digest").map(HashMap::len),
        Some(2_000)
    );
    let (plan, asked) = adopt(&tracker, &kernel, &elements);
    let writes = writes(&plan);
    assert!(writes.is_empty(), "{writes:?}");
    let read = asked.get("service-endpoints").copied().unwrap_or(0);
    assert_eq!(read, DIGEST_SAMPLE * 10, "{asked:?}");
}

/// A list changed in the kernel behind keelson's back is repaired at
/// restart: when its dispatch element or digest was changed with it (read
/// because they differ), and when only a slot was (found by the sample:
/// every list of a small table is sampled).
#[test]
fn a_list_changed_behind_keelsons_back_is_repaired_at_restart() {
    use super::render::{addr_proto_port_key, list_slot_key};
    let key = |i: u32| {
        addr_proto_port_key(
            &cluster_ip(i).parse().unwrap_or_else(|_| unreachable!()),
            Protocol::Tcp,
            80,
        )
    };
    let data = |elements: &HashMap<String, KernelElements>, set: &str, k: &[u8]| {
        elements.get(set).and_then(|m| m.get(k)).cloned()
    };
    let added = |plan: &Plan, set: &str, k: &[u8]| {
        plan.ops.iter().any(|o| match o {
            Op::AddElements {
                set: s, elements, ..
            } => s == set && elements.iter().any(|e| e.key == k),
            _ => false,
        })
    };

    // Among 2,000 Services, one list's count and digest were changed (say
    // by `nft`): only that list is read besides the sample, and repaired.
    let tracker = tracker_with(2_000, 10);
    let cold = full(&tracker, &KernelTable::default());
    let (kernel, mut elements) = kernel_after(&cold.ops);
    let k = key(1_234);
    let right = data(&elements, "service-ips", &k);
    if let Some(m) = elements.get_mut("service-ips") {
        m.insert(
            k.clone(),
            KernelValue::Verdict(-3, Some("endpoints-2".into())),
        );
    }
    if let Some(m) = elements.get_mut("service-endpoints-digest") {
        m.remove(&k);
    }
    if let Some(m) = elements.get_mut("service-endpoints") {
        m.remove(&list_slot_key(&k, 5));
    }
    let (plan, asked) = adopt(&tracker, &kernel, &elements);
    assert!(right.is_some());
    assert!(added(&plan, "service-ips", &k), "{:?}", writes(&plan));
    assert!(added(&plan, "service-endpoints-digest", &k));
    assert!(added(&plan, "service-endpoints", &list_slot_key(&k, 5)));
    assert_eq!(
        asked.get("service-endpoints").copied(),
        Some((super::table::DIGEST_SAMPLE + 1) * 10),
        "the changed list is read besides the sample"
    );
    assert!(
        writes(&plan).iter().all(|o| match o {
            Op::AddElements { elements, .. } => elements.iter().all(|e| e.key.starts_with(&k)),
            Op::DelElements { keys, .. } => keys.iter().all(|e| e.starts_with(&k)),
            _ => false,
        }),
        "only that list is rewritten: {:?}",
        writes(&plan)
    );

    // In a small table, a slot replaced behind keelson's back with the
    // digest left as it was: the sample finds it, every list is read.
    let tracker = tracker_with(20, 3);
    let cold = full(&tracker, &KernelTable::default());
    let (kernel, mut elements) = kernel_after(&cold.ops);
    let k = key(7);
    let slot = list_slot_key(&k, 1);
    if let Some(m) = elements.get_mut("service-endpoints") {
        m.insert(
            slot.clone(),
            KernelValue::Data(vec![10, 9, 9, 9, 0x1f, 0x90, 0, 0]),
        );
    }
    let (plan, _) = adopt(&tracker, &kernel, &elements);
    assert!(
        added(&plan, "service-endpoints", &slot),
        "{:?}",
        writes(&plan)
    );
    assert!(
        plan.ops.iter().any(|o| matches!(o, Op::DelElements { set, keys, .. } if set == "service-endpoints" && keys == &vec![slot.clone()])),
        "{:?}",
        writes(&plan)
    );
}

#[test]
fn shared_chain_names_round_trip() {
    use super::render::{
        COUNT_MASQUERADE, COUNT_NODEPORT, ListKind, parse_shared_chain_name, shared_chain_name,
    };
    for (value, kind, n) in [
        (3, ListKind::Address, 3),
        (COUNT_MASQUERADE | 12, ListKind::Address, 12),
        (COUNT_NODEPORT | 1, ListKind::NodePort, 1),
    ] {
        assert_eq!(
            parse_shared_chain_name(&shared_chain_name(value)),
            Some((kind, n))
        );
    }
    assert_eq!(parse_shared_chain_name("services"), None);
    assert_eq!(parse_shared_chain_name("endpoints-x"), None);
}
