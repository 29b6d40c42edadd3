//! The fixed part of keelson's table (kube-proxy's nftables layout): base
//! chains on the netfilter hooks, the dispatch chains and the sets/maps
//! every service port adds elements to.
//!
//! ```text
//! filter-prerouting (prio -110)      ct state new jump firewall-check
//! filter-input (-110)                ct state new jump nodeport-endpoints-check / service-endpoints-check
//! filter-forward (-110)              ct state new jump service-endpoints-check / cluster-ips-check
//! filter-output (-110)               ct state new jump service-endpoints-check / firewall-check
//! filter-output-post-dnat (-90)      ct state new jump cluster-ips-check
//! nat-prerouting / nat-output (-100) jump services
//! nat-postrouting (100)              jump masquerading
//! services                           ip daddr . meta l4proto . th dport vmap @service-ips
//!                                    <node port addresses> meta l4proto . th dport vmap @service-nodeports
//! ```

use std::collections::BTreeSet;
use std::net::IpAddr;

use super::config::NftablesConfig;
use super::expr::{FibOn, Verdict};
use super::objects::{
    BaseHook, ChainDef, Element, HOOK_FORWARD, HOOK_INPUT, HOOK_OUTPUT, HOOK_POSTROUTING,
    HOOK_PREROUTING, SetDef, SetKind,
};
use super::rule::{Rule, RuleBuilder};
use crate::model::{IpFamily, NodePortAddresses};

/// `services`: dispatch of new connections by destination.
pub const SERVICES: &str = "services";
/// `service-ips`: ClusterIP / externalIP / LB IP dispatch map.
pub const SERVICE_IPS: &str = "service-ips";
/// `service-nodeports`: NodePort dispatch map.
pub const SERVICE_NODEPORTS: &str = "service-nodeports";
/// `nodeport-ips`: addresses accepting NodePorts (when not all local ones).
pub const NODEPORT_IPS: &str = "nodeport-ips";
/// `cluster-ips`: active ClusterIPs.
pub const CLUSTER_IPS: &str = "cluster-ips";
/// `cluster-ips-check`: reject/drop traffic to unknown ClusterIP ports/IPs.
pub const CLUSTER_IPS_CHECK: &str = "cluster-ips-check";
/// `service-endpoints-check`.
pub const SERVICE_ENDPOINTS_CHECK: &str = "service-endpoints-check";
/// `nodeport-endpoints-check`.
pub const NODEPORT_ENDPOINTS_CHECK: &str = "nodeport-endpoints-check";
/// `no-endpoint-services`: drop/reject verdicts for IPs without endpoints.
pub const NO_ENDPOINT_SERVICES: &str = "no-endpoint-services";
/// `no-endpoint-nodeports`.
pub const NO_ENDPOINT_NODEPORTS: &str = "no-endpoint-nodeports";
/// `reject-chain`.
pub const REJECT_CHAIN: &str = "reject-chain";
/// `firewall-ips`: LB destinations subject to source ranges.
pub const FIREWALL_IPS: &str = "firewall-ips";
/// `firewall-check`.
pub const FIREWALL_CHECK: &str = "firewall-check";
/// `mark-for-masquerade`.
pub const MARK_MASQ: &str = "mark-for-masquerade";
/// `masquerading`.
pub const MASQUERADING: &str = "masquerading";

/// The fixed objects of one family's table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FixedLayout {
    /// Sets and maps (created before chains).
    pub sets: Vec<SetDef>,
    /// Chains, base chains first.
    pub chains: Vec<ChainDef>,
    /// Elements of `nodeport-ips` (when NodePorts are limited to addresses).
    pub nodeport_ips: Vec<Element>,
}

fn base(chain_type: &'static str, hook: u32, priority: i32) -> Option<BaseHook> {
    Some(BaseHook {
        chain_type,
        hook,
        priority,
    })
}

fn chain(name: &str, base: Option<BaseHook>, comment: Option<&str>, rules: Vec<Rule>) -> ChainDef {
    ChainDef {
        name: name.into(),
        base,
        comment: comment.map(Into::into),
        rules,
    }
}

/// The key bytes of an address element.
pub fn addr_key(ip: &IpAddr) -> Vec<u8> {
    match ip {
        IpAddr::V4(v4) => v4.octets().to_vec(),
        IpAddr::V6(v6) => v6.octets().to_vec(),
    }
}

/// Which part of the layout a table carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TableRole {
    /// Everything (Services not sharded: one table per family, kube-proxy's layout).
    Combined,
    /// The main table of sharded Services: filter base chains, checks,
    /// `no-endpoint-*`, `cluster-ips`, `firewall-ips`, masquerading.
    Main,
    /// A service table: NAT dispatch (`nat-prerouting`/`nat-output` ->
    /// `services`), `service-ips`, `service-nodeports` and the per-service
    /// chains of the Services hashed to it.
    Services,
}

/// Builds the fixed layout of a table.
pub fn fixed_layout(
    family: IpFamily,
    role: TableRole,
    config: &NftablesConfig,
    node_ports: &NodePortAddresses,
) -> FixedLayout {
    let full = combined_layout(family, config, node_ports);
    let main_sets = [
        CLUSTER_IPS,
        NODEPORT_IPS,
        NO_ENDPOINT_SERVICES,
        NO_ENDPOINT_NODEPORTS,
        FIREWALL_IPS,
    ];
    let service_sets = [NODEPORT_IPS, SERVICE_IPS, SERVICE_NODEPORTS];
    let service_chains = ["nat-prerouting", "nat-output", MARK_MASQ, SERVICES];
    match role {
        TableRole::Combined => full,
        TableRole::Main => FixedLayout {
            sets: full
                .sets
                .into_iter()
                .filter(|s| main_sets.contains(&s.name.as_str()))
                .collect(),
            chains: full
                .chains
                .into_iter()
                .filter(|c| !service_chains.contains(&c.name.as_str()))
                .collect(),
            nodeport_ips: full.nodeport_ips,
        },
        TableRole::Services => FixedLayout {
            sets: full
                .sets
                .into_iter()
                .filter(|s| service_sets.contains(&s.name.as_str()))
                .collect(),
            chains: full
                .chains
                .into_iter()
                .filter(|c| service_chains.contains(&c.name.as_str()))
                .collect(),
            nodeport_ips: full.nodeport_ips,
        },
    }
}

fn combined_layout(
    family: IpFamily,
    config: &NftablesConfig,
    node_ports: &NodePortAddresses,
) -> FixedLayout {
    let r = || RuleBuilder::new(family);
    let jump_new = |target: &str| r().ct_state_new().verdict(Verdict::Jump(target.into()));
    let mark = config.masquerade_mark();

    let mut sets = vec![SetDef {
        name: CLUSTER_IPS.into(),
        kind: SetKind::Addr,
        comment: Some("Active ClusterIPs".into()),
    }];
    let mut nodeport_ips = Vec::new();
    let limited = match node_ports {
        NodePortAddresses::AllLocal => false,
        NodePortAddresses::Ips(ips) => {
            sets.push(SetDef {
                name: NODEPORT_IPS.into(),
                kind: SetKind::Addr,
                comment: Some("IPs that accept NodePort traffic".into()),
            });
            let ips: BTreeSet<&IpAddr> =
                ips.iter().filter(|ip| IpFamily::of(ip) == family).collect();
            for ip in ips {
                if ip.is_loopback() {
                    tracing::error!(address = %ip, "nodePortAddresses includes localhost but localhost NodePorts are not supported");
                    continue;
                }
                nodeport_ips.push(Element {
                    key: addr_key(ip),
                    verdict: None,
                    comment: None,
                });
            }
            true
        }
    };
    sets.extend([
        SetDef {
            name: NO_ENDPOINT_SERVICES.into(),
            kind: SetKind::AddrProtoPortVmap,
            comment: Some("vmap to drop or reject packets to services with no endpoints".into()),
        },
        SetDef {
            name: NO_ENDPOINT_NODEPORTS.into(),
            kind: SetKind::ProtoPortVmap,
            comment: Some(
                "vmap to drop or reject packets to service nodeports with no endpoints".into(),
            ),
        },
        SetDef {
            name: FIREWALL_IPS.into(),
            kind: SetKind::AddrProtoPortVmap,
            comment: Some("destinations that are subject to LoadBalancerSourceRanges".into()),
        },
        SetDef {
            name: SERVICE_IPS.into(),
            kind: SetKind::AddrProtoPortVmap,
            comment: Some("ClusterIP, ExternalIP and LoadBalancer IP traffic".into()),
        },
        SetDef {
            name: SERVICE_NODEPORTS.into(),
            kind: SetKind::ProtoPortVmap,
            comment: Some("NodePort traffic".into()),
        },
    ]);

    let nodeport_dispatch = if limited {
        r().daddr_in_set(NODEPORT_IPS)
            .vmap_proto_port(SERVICE_NODEPORTS)
            .build()
    } else {
        r().fib_type_local(FibOn::Daddr)
            .daddr_not_loopback()
            .vmap_proto_port(SERVICE_NODEPORTS)
            .build()
    };
    let nodeport_check = if limited {
        r().daddr_in_set(NODEPORT_IPS)
            .vmap_proto_port(NO_ENDPOINT_NODEPORTS)
            .build()
    } else {
        r().daddr_not_loopback()
            .vmap_proto_port(NO_ENDPOINT_NODEPORTS)
            .build()
    };
    let mut cluster_ips_check = vec![
        r().daddr_in_set(CLUSTER_IPS)
            .comment("Reject traffic to invalid ports of ClusterIPs")
            .reject(),
    ];
    for cidr in config.service_cidrs.get(&family).into_iter().flatten() {
        cluster_ips_check.push(
            r().daddr_in(*cidr, false)
                .comment("Drop traffic to unallocated ClusterIPs")
                .verdict(Verdict::Drop),
        );
    }

    let chains = vec![
        chain(
            "filter-prerouting",
            base("filter", HOOK_PREROUTING, -110),
            None,
            vec![jump_new(FIREWALL_CHECK)],
        ),
        chain(
            "filter-input",
            base("filter", HOOK_INPUT, -110),
            None,
            vec![
                jump_new(NODEPORT_ENDPOINTS_CHECK),
                jump_new(SERVICE_ENDPOINTS_CHECK),
            ],
        ),
        chain(
            "filter-forward",
            base("filter", HOOK_FORWARD, -110),
            None,
            vec![
                jump_new(SERVICE_ENDPOINTS_CHECK),
                jump_new(CLUSTER_IPS_CHECK),
            ],
        ),
        chain(
            "filter-output",
            base("filter", HOOK_OUTPUT, -110),
            None,
            vec![jump_new(SERVICE_ENDPOINTS_CHECK), jump_new(FIREWALL_CHECK)],
        ),
        chain(
            "filter-output-post-dnat",
            base("filter", HOOK_OUTPUT, -90),
            None,
            vec![jump_new(CLUSTER_IPS_CHECK)],
        ),
        chain(
            "nat-prerouting",
            base("nat", HOOK_PREROUTING, -100),
            None,
            vec![r().verdict(Verdict::Jump(SERVICES.into()))],
        ),
        chain(
            "nat-output",
            base("nat", HOOK_OUTPUT, -100),
            None,
            vec![r().verdict(Verdict::Jump(SERVICES.into()))],
        ),
        chain(
            "nat-postrouting",
            base("nat", HOOK_POSTROUTING, 100),
            None,
            vec![r().verdict(Verdict::Jump(MASQUERADING.into()))],
        ),
        chain(
            REJECT_CHAIN,
            None,
            Some("helper for @no-endpoint-services / @no-endpoint-nodeports"),
            vec![r().reject()],
        ),
        chain(MARK_MASQ, None, None, vec![r().mark_or(mark).build()]),
        chain(
            MASQUERADING,
            None,
            None,
            vec![
                r().mark_bits_clear(mark).verdict(Verdict::Return),
                r().mark_xor(mark).build(),
                r().masquerade(),
            ],
        ),
        chain(
            SERVICE_ENDPOINTS_CHECK,
            None,
            None,
            vec![r().vmap_daddr_proto_port(NO_ENDPOINT_SERVICES).build()],
        ),
        chain(NODEPORT_ENDPOINTS_CHECK, None, None, vec![nodeport_check]),
        chain(
            FIREWALL_CHECK,
            None,
            None,
            vec![r().vmap_daddr_proto_port(FIREWALL_IPS).build()],
        ),
        chain(CLUSTER_IPS_CHECK, None, None, cluster_ips_check),
        chain(
            SERVICES,
            None,
            None,
            vec![
                r().vmap_daddr_proto_port(SERVICE_IPS).build(),
                nodeport_dispatch,
            ],
        ),
    ];
    FixedLayout {
        sets,
        chains,
        nodeport_ips,
    }
}

/// Regular chains jumped to from base chains must exist before the base
/// chains' rules are added; this orders chains so targets come first.
pub fn creation_order(chains: &[ChainDef]) -> Vec<&ChainDef> {
    let mut regular: Vec<&ChainDef> = chains.iter().filter(|c| c.base.is_none()).collect();
    regular.extend(chains.iter().filter(|c| c.base.is_some()));
    regular
}
