//! The fixed part of keelson's table: kube-proxy v1.36's nftables layout
//! (`pkg/proxy/nftables/proxier.go`: `nftablesBaseChains`,
//! `nftablesJumpChains`, `setupNFTables`) plus the two maps of keelson's
//! compact endpoint choice.
//!
//! ```text
//! filter-prerouting-pre-dnat (prio -110)  ct state new jump firewall-check
//! filter-output-pre-dnat (-110)           ct state new jump firewall-check
//! filter-input (0)                        ct state new jump nodeport-endpoints-check / service-endpoints-check
//! filter-forward (0)                      ct state new jump service-endpoints-check / cluster-ips-check
//! filter-output (0)                       ct state new jump service-endpoints-check / cluster-ips-check
//! nat-prerouting / nat-output (-100)      jump services
//! nat-postrouting (100)                   jump masquerading
//! services                                [ip daddr @cluster-ips <not a pod> mark set mark or 0x4000]
//!                                         ip daddr . meta l4proto . th dport vmap @service-ips
//!                                         <node port addresses> meta l4proto . th dport vmap @service-nodeports
//! masquerading                            mark and 0x4000 != 0 mark set mark xor 0x4000 masquerade fully-random
//!                                         ct status dnat ip saddr . ip daddr . meta l4proto . th dport @hairpin-connections masquerade fully-random
//! ```
//!
//! The endpoint checks run at filter priority, after DNAT (kube-proxy moved
//! them there in v1.34, kubernetes#132456): traffic the node itself sends to
//! an `externalTrafficPolicy: Local` address is DNATed by the short-circuit
//! rules before the check, so it is no longer dropped on a node without a
//! local endpoint (kubernetes#131765).
//!
//! keelson's additions (see [`super::render`]): the endpoints of addresses
//! and NodePorts served by an endpoint list (`service-endpoints`,
//! `nodeport-endpoints`, and the shared `endpoints-N` chains their
//! dispatch elements jump to), and the endpoint slots of the service chains
//! that remain (`endpoint-slots`, `endpoint-chains`).

use std::collections::BTreeSet;
use std::net::IpAddr;

use super::config::{LocalTraffic, NftablesConfig};
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
/// `masquerading`.
pub const MASQUERADING: &str = "masquerading";
/// `hairpin-connections`: local endpoints reaching themselves through a
/// Service are masqueraded.
pub const HAIRPIN_CONNECTIONS: &str = "hairpin-connections";
/// `endpoint-slots`: `slot : endpoint address . port`.
pub const ENDPOINT_SLOTS: &str = "endpoint-slots";
/// `endpoint-chains`: `slot : goto endpoint chain` (ClientIP affinity).
pub const ENDPOINT_CHAINS: &str = "endpoint-chains";
/// `service-endpoints`: `ip . proto . port . slot : endpoint`.
pub const SERVICE_ENDPOINTS: &str = "service-endpoints";
/// `nodeport-endpoints`: `proto . port . slot : endpoint`.
pub const NODEPORT_ENDPOINTS: &str = "nodeport-endpoints";
/// `service-endpoints-digest`: `ip . proto . port : digest` of each
/// address's endpoint list (no rule reads it: a restarted keelson compares
/// it instead of reading the list's elements back).
pub const SERVICE_ENDPOINTS_DIGEST: &str = "service-endpoints-digest";
/// `nodeport-endpoints-digest`: `proto . port : digest` of each NodePort's
/// endpoint list.
pub const NODEPORT_ENDPOINTS_DIGEST: &str = "nodeport-endpoints-digest";

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

/// Builds the fixed layout of a family's table.
pub fn fixed_layout(
    family: IpFamily,
    config: &NftablesConfig,
    node_ports: &NodePortAddresses,
) -> FixedLayout {
    combined_layout(family, config, node_ports)
}

fn combined_layout(
    family: IpFamily,
    config: &NftablesConfig,
    node_ports: &NodePortAddresses,
) -> FixedLayout {
    let r = || RuleBuilder::new(family);
    let jump_new = |target: &str| r().ct_state_new().verdict(Verdict::Jump(target.into()));
    let mark = config.masquerade_mark();
    let set = |name: &str, kind: SetKind, comment: Option<&str>| SetDef {
        name: name.into(),
        kind,
        comment: comment.map(Into::into),
    };

    // The maps of keelson's endpoint lists come first: the kernel finds a
    // set by walking the table's set list, and these are named by most
    // messages of a sync.
    let mut sets = vec![
        set(
            SERVICE_ENDPOINTS,
            SetKind::AddrProtoPortMarkToEndpoint,
            Some("endpoints of addresses served by an endpoint list, by slot"),
        ),
        set(
            NODEPORT_ENDPOINTS,
            SetKind::ProtoPortMarkToEndpoint,
            Some("endpoints of NodePorts served by an endpoint list, by slot"),
        ),
        set(
            SERVICE_ENDPOINTS_DIGEST,
            SetKind::AddrProtoPortDigest,
            Some("digest of each address's endpoint list (read at restart, by no rule)"),
        ),
        set(
            NODEPORT_ENDPOINTS_DIGEST,
            SetKind::ProtoPortDigest,
            Some("digest of each NodePort's endpoint list (read at restart, by no rule)"),
        ),
        set(
            ENDPOINT_SLOTS,
            SetKind::MarkToEndpoint,
            Some("endpoints of service chains, by slot"),
        ),
        set(
            ENDPOINT_CHAINS,
            SetKind::MarkVmap,
            Some("endpoint chains of ClientIP-affinity service chains, by slot"),
        ),
        set(CLUSTER_IPS, SetKind::Addr, Some("Active ClusterIPs")),
    ];
    let mut nodeport_ips = Vec::new();
    let limited = match node_ports {
        NodePortAddresses::AllLocal => false,
        NodePortAddresses::Ips(ips) => {
            sets.push(set(
                NODEPORT_IPS,
                SetKind::Addr,
                Some("IPs that accept NodePort traffic"),
            ));
            let ips: BTreeSet<&IpAddr> =
                ips.iter().filter(|ip| IpFamily::of(ip) == family).collect();
            for ip in ips {
                if ip.is_loopback() {
                    tracing::error!(address = %ip, "nodePortAddresses includes localhost but localhost NodePorts are not supported");
                    continue;
                }
                nodeport_ips.push(Element::key(addr_key(ip)));
            }
            true
        }
    };
    sets.extend([
        set(
            NO_ENDPOINT_SERVICES,
            SetKind::AddrProtoPortVmap,
            Some("vmap to drop or reject packets to services with no endpoints"),
        ),
        set(
            NO_ENDPOINT_NODEPORTS,
            SetKind::ProtoPortVmap,
            Some("vmap to drop or reject packets to service nodeports with no endpoints"),
        ),
        set(
            FIREWALL_IPS,
            SetKind::AddrProtoPortVmap,
            Some("destinations that are subject to LoadBalancerSourceRanges"),
        ),
        set(
            SERVICE_IPS,
            SetKind::AddrProtoPortVmap,
            Some("ClusterIP, ExternalIP and LoadBalancer IP traffic"),
        ),
        set(
            SERVICE_NODEPORTS,
            SetKind::ProtoPortVmap,
            Some("NodePort traffic"),
        ),
        set(
            HAIRPIN_CONNECTIONS,
            SetKind::AddrAddrProtoPort,
            Some("service hairpin connections"),
        ),
    ]);

    let nodeport_addresses = || {
        if limited {
            r().daddr_in_set(NODEPORT_IPS)
        } else {
            r().fib_type_local(FibOn::Daddr).daddr_not_loopback()
        }
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
    // ClusterIP traffic from outside the cluster is masqueraded (it may
    // leave the node again); all of it with masqueradeAll.
    let mut services = Vec::new();
    if config.masquerade_all {
        services.push(
            r().daddr_in_set(CLUSTER_IPS)
                .mark_or(mark)
                .comment("masquerade all clusterIP traffic")
                .build(),
        );
    } else if let Some(b) = if_not_pod(r().daddr_in_set(CLUSTER_IPS), config.local(family)) {
        services.push(
            b.mark_or(mark)
                .comment("masquerade clusterIP traffic from outside cluster")
                .build(),
        );
    }
    services.push(r().vmap_daddr_proto_port(SERVICE_IPS).build());

    services.push(
        nodeport_addresses()
            .vmap_proto_port(SERVICE_NODEPORTS)
            .build(),
    );

    let chains = vec![
        chain(
            "filter-prerouting-pre-dnat",
            base("filter", HOOK_PREROUTING, -110),
            None,
            vec![jump_new(FIREWALL_CHECK)],
        ),
        chain(
            "filter-output-pre-dnat",
            base("filter", HOOK_OUTPUT, -110),
            None,
            vec![jump_new(FIREWALL_CHECK)],
        ),
        chain(
            "filter-input",
            base("filter", HOOK_INPUT, 0),
            None,
            vec![
                jump_new(NODEPORT_ENDPOINTS_CHECK),
                jump_new(SERVICE_ENDPOINTS_CHECK),
            ],
        ),
        chain(
            "filter-forward",
            base("filter", HOOK_FORWARD, 0),
            None,
            vec![
                jump_new(SERVICE_ENDPOINTS_CHECK),
                jump_new(CLUSTER_IPS_CHECK),
            ],
        ),
        chain(
            "filter-output",
            base("filter", HOOK_OUTPUT, 0),
            None,
            vec![
                jump_new(SERVICE_ENDPOINTS_CHECK),
                jump_new(CLUSTER_IPS_CHECK),
            ],
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
        chain(
            MASQUERADING,
            None,
            None,
            vec![
                r().mark_bits_set(mark).mark_xor(mark).masquerade(),
                r().ct_status_dnat()
                    .saddr_daddr_proto_port_in_set(HAIRPIN_CONNECTIONS)
                    .masquerade(),
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
        chain(SERVICES, None, None, services),
    ];
    FixedLayout {
        sets,
        chains,
        nodeport_ips,
    }
}

/// `<rule> <source is not a pod>` as `detectLocalMode` says; `None` when
/// pods cannot be told apart (kube-proxy then writes no such rule).
pub fn if_not_pod(r: RuleBuilder, local: &LocalTraffic) -> Option<RuleBuilder> {
    if_pod(r, local, true)
}

/// `<rule> <source is a pod>` (`negate`: is not); `None` without detection.
pub fn if_pod(r: RuleBuilder, local: &LocalTraffic, negate: bool) -> Option<RuleBuilder> {
    match local {
        LocalTraffic::Unknown => None,
        LocalTraffic::Cidr(net) => Some(r.saddr_in(*net, negate)),
        LocalTraffic::Interface(name) => Some(r.iifname_eq(name, negate)),
        LocalTraffic::InterfacePrefix(prefix) => Some(r.iifname_prefix(prefix, negate)),
    }
}

/// Regular chains jumped to from base chains must exist before the base
/// chains' rules are added; this orders chains so targets come first.
pub fn creation_order(chains: &[ChainDef]) -> Vec<&ChainDef> {
    let mut regular: Vec<&ChainDef> = chains.iter().filter(|c| c.base.is_none()).collect();
    regular.extend(chains.iter().filter(|c| c.base.is_some()));
    regular
}
