//! Renders one service port's desired state into the chains, affinity sets
//! and map elements kube-proxy's nftables mode would write for it:
//!
//! - `service-HASH-ns/name/proto/port`: Cluster-policy endpoint choice,
//!   `local-...`: Local-policy endpoint choice. Each picks an endpoint with
//!   plain rules `numgen random mod (N-i) == 0 goto endpoint-i` (no inline
//!   anonymous map per service: those make the kernel's cost grow
//!   quadratically with the number of services), after ClientIP-affinity
//!   lookups.
//! - `endpoint-...__ip/port`: hairpin masquerade, affinity update, DNAT.
//! - `external-...`: masquerade (eTP=Cluster) or the short-circuit of pod
//!   and host traffic (eTP=Local), then the external policy chain.
//! - `firewall-...`: loadBalancerSourceRanges.
//! - elements of `service-ips`, `service-nodeports`, `no-endpoint-*`,
//!   `firewall-ips`, `cluster-ips`.

use std::net::IpAddr;

use super::config::{LocalTraffic, NftablesConfig};
use super::expr::{FibOn, Verdict};
use super::layout::{self, addr_key};
use super::names::{PortChains, endpoint_names};
use super::objects::{ChainDef, Element, SetDef, SetKind};
use super::rule::{Rule, RuleBuilder};
use crate::model::{Endpoint, NoEndpointVerdict, Protocol, ServicePortState};

/// The fixed set or map an element belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ElementSet {
    /// `cluster-ips`
    ClusterIps,
    /// `service-ips`
    ServiceIps,
    /// `service-nodeports`
    ServiceNodePorts,
    /// `no-endpoint-services`
    NoEndpointServices,
    /// `no-endpoint-nodeports`
    NoEndpointNodePorts,
    /// `firewall-ips`
    FirewallIps,
}

impl ElementSet {
    /// The set's name.
    pub fn name(self) -> &'static str {
        match self {
            ElementSet::ClusterIps => layout::CLUSTER_IPS,
            ElementSet::ServiceIps => layout::SERVICE_IPS,
            ElementSet::ServiceNodePorts => layout::SERVICE_NODEPORTS,
            ElementSet::NoEndpointServices => layout::NO_ENDPOINT_SERVICES,
            ElementSet::NoEndpointNodePorts => layout::NO_ENDPOINT_NODEPORTS,
            ElementSet::FirewallIps => layout::FIREWALL_IPS,
        }
    }

    /// All of them.
    pub const ALL: [ElementSet; 6] = [
        ElementSet::ClusterIps,
        ElementSet::ServiceIps,
        ElementSet::ServiceNodePorts,
        ElementSet::NoEndpointServices,
        ElementSet::NoEndpointNodePorts,
        ElementSet::FirewallIps,
    ];
}

/// Everything one service port contributes to its family's table.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RenderedPort {
    /// Its chains (endpoint chains first, so targets exist before jumps).
    pub chains: Vec<ChainDef>,
    /// Its ClientIP affinity sets.
    pub affinity_sets: Vec<SetDef>,
    /// Its elements in the shared sets and maps.
    pub elements: Vec<(ElementSet, Element)>,
}

impl ElementSet {
    /// Whether the set lives in a service table (when Services are sharded)
    /// rather than in the main table.
    pub fn in_service_table(self) -> bool {
        matches!(self, ElementSet::ServiceIps | ElementSet::ServiceNodePorts)
    }
}

impl RenderedPort {
    /// Splits into the part for the main table (firewall chain, elements of
    /// `cluster-ips`, `no-endpoint-*`, `firewall-ips`) and the part for the
    /// port's service table (everything else).
    pub fn split(self) -> (RenderedPort, RenderedPort) {
        let mut main = RenderedPort::default();
        let mut svc = RenderedPort::default();
        for c in self.chains {
            if c.name.starts_with(super::names::FIREWALL_PREFIX) {
                main.chains.push(c);
            } else {
                svc.chains.push(c);
            }
        }
        svc.affinity_sets = self.affinity_sets;
        for (set, el) in self.elements {
            if set.in_service_table() {
                svc.elements.push((set, el));
            } else {
                main.elements.push((set, el));
            }
        }
        (main, svc)
    }
}

/// `addr . proto . port` key bytes.
pub fn addr_proto_port_key(ip: &IpAddr, proto: Protocol, port: u16) -> Vec<u8> {
    let mut key = addr_key(ip);
    key.extend_from_slice(&[proto.number(), 0, 0, 0]);
    key.extend_from_slice(&port.to_be_bytes());
    key.extend_from_slice(&[0, 0]);
    key
}

/// `proto . port` key bytes.
pub fn proto_port_key(proto: Protocol, port: u16) -> Vec<u8> {
    let mut key = vec![proto.number(), 0, 0, 0];
    key.extend_from_slice(&port.to_be_bytes());
    key.extend_from_slice(&[0, 0]);
    key
}

fn no_endpoint_verdict(v: NoEndpointVerdict) -> Verdict {
    match v {
        NoEndpointVerdict::Reject => Verdict::Goto(layout::REJECT_CHAIN.into()),
        NoEndpointVerdict::Drop => Verdict::Drop,
    }
}

fn if_local(r: RuleBuilder, local: &LocalTraffic, negate: bool) -> Option<RuleBuilder> {
    match local {
        LocalTraffic::Unknown => None,
        LocalTraffic::Cidr(net) => Some(r.saddr_in(*net, negate)),
        LocalTraffic::Interface(name) => Some(r.iifname_eq(name, negate)),
        LocalTraffic::InterfacePrefix(prefix) => Some(r.iifname_prefix(prefix, negate)),
    }
}

/// Renders a service port.
pub fn render_port(state: &ServicePortState, config: &NftablesConfig) -> RenderedPort {
    let family = state.key.family;
    let info = &state.info;
    let name = &state.key.name;
    let comment = name.to_string();
    let proto = info.protocol;
    let chains = PortChains::new(name);
    let r = || RuleBuilder::new(family);
    let local = config.local(family);
    let mut out = RenderedPort::default();

    let uses_cluster = state.uses_cluster_policy();
    let uses_local = state.uses_local_policy();
    let internal_chain = if info.internal_policy_local {
        &chains.local
    } else {
        &chains.service
    };
    let external_policy_chain = if info.external_policy_local {
        &chains.local
    } else {
        &chains.service
    };
    let has_internal = state.has_internal_endpoints();
    let has_external = state.has_external_endpoints();
    let uses_external_chain = state.uses_external_stage();
    let affinity = info.affinity_timeout();

    // Endpoint chains (and affinity sets) for every reachable endpoint.
    for ep in state.reachable_endpoints() {
        let (chain, set) = endpoint_names(name, ep.addr());
        let mut rules = vec![
            r().saddr_eq(ep.ip, false)
                .verdict(Verdict::Jump(layout::MARK_MASQ.into())),
        ];
        if let Some(timeout_seconds) = affinity {
            rules.push(r().update_saddr(&set).build());
            out.affinity_sets.push(SetDef {
                name: set,
                kind: SetKind::Affinity { timeout_seconds },
                comment: None,
            });
        }
        rules.push(r().dnat(proto, ep.ip, ep.port));
        out.chains.push(ChainDef {
            name: chain,
            base: None,
            comment: None,
            rules,
        });
    }

    // Policy chains.
    let masq_rule = |chain: &String| -> Option<Rule> {
        if !has_internal || chain != internal_chain {
            return None;
        }
        let base = r().daddr_eq(info.cluster_ip).dport_eq(proto, info.port);
        if config.masquerade_all {
            Some(base.verdict(Verdict::Jump(layout::MARK_MASQ.into())))
        } else {
            if_local(base, local, true).map(|b| b.verdict(Verdict::Jump(layout::MARK_MASQ.into())))
        }
    };
    let policy_chain = |chain: &String, endpoints: &[Endpoint]| -> ChainDef {
        let mut rules = Vec::new();
        if let Some(rule) = masq_rule(chain) {
            rules.push(rule);
        }
        if affinity.is_some() {
            for ep in endpoints {
                let (ep_chain, set) = endpoint_names(name, ep.addr());
                rules.push(
                    r().saddr_in_set(&set, false)
                        .verdict(Verdict::Goto(ep_chain)),
                );
            }
        }
        let n = endpoints.len();
        for (i, ep) in endpoints.iter().enumerate() {
            let (ep_chain, _) = endpoint_names(name, ep.addr());
            if i + 1 == n {
                rules.push(r().verdict(Verdict::Goto(ep_chain)));
            } else {
                rules.push(
                    r().numgen_zero((n - i) as u32)
                        .verdict(Verdict::Goto(ep_chain)),
                );
            }
        }
        ChainDef {
            name: chain.clone(),
            base: None,
            comment: Some(comment.clone()),
            rules,
        }
    };
    if uses_cluster {
        out.chains
            .push(policy_chain(&chains.service, &state.cluster_endpoints));
    }
    if uses_local {
        out.chains
            .push(policy_chain(&chains.local, &state.local_endpoints));
    }

    // External chain.
    if uses_external_chain {
        let mut rules = Vec::new();
        if !info.external_policy_local {
            rules.push(r().verdict(Verdict::Jump(layout::MARK_MASQ.into())));
        } else {
            if let Some(b) = if_local(r(), local, false) {
                rules.push(
                    b.comment("short-circuit pod traffic")
                        .verdict(Verdict::Goto(chains.service.clone())),
                );
            }
            rules.push(
                r().fib_type_local(FibOn::Saddr)
                    .comment("masquerade local traffic")
                    .verdict(Verdict::Jump(layout::MARK_MASQ.into())),
            );
            rules.push(
                r().fib_type_local(FibOn::Saddr)
                    .comment("short-circuit local traffic")
                    .verdict(Verdict::Goto(chains.service.clone())),
            );
        }
        if has_external {
            rules.push(r().verdict(Verdict::Goto(external_policy_chain.clone())));
        }
        out.chains.push(ChainDef {
            name: chains.external.clone(),
            base: None,
            comment: Some(comment.clone()),
            rules,
        });
    }

    // Firewall chain (loadBalancerSourceRanges).
    let uses_firewall =
        !info.load_balancer_ips.is_empty() && !info.load_balancer_source_ranges.is_empty();
    if uses_firewall {
        let node_ip = config.node_ips.get(&family);
        let allow_from_node = node_ip.is_some_and(|ip| {
            info.load_balancer_source_ranges
                .iter()
                .any(|n| n.contains(ip))
        });
        let mut rules: Vec<Rule> = info
            .load_balancer_source_ranges
            .iter()
            .map(|net| r().saddr_in(*net, false).verdict(Verdict::Return))
            .collect();
        if allow_from_node {
            // A VIP-style LB IP is often local: the node's own requests to it
            // come from the VIP itself.
            for lb in &info.load_balancer_ips {
                rules.push(r().saddr_eq(*lb, false).verdict(Verdict::Return));
            }
        }
        rules.push(r().verdict(Verdict::Drop));
        out.chains.push(ChainDef {
            name: chains.firewall.clone(),
            base: None,
            comment: Some(comment.clone()),
            rules,
        });
    }

    // Elements.
    let el = |key: Vec<u8>, verdict: Option<Verdict>, with_comment: bool| Element {
        key,
        verdict,
        comment: with_comment.then(|| comment.clone()),
    };
    out.elements.push((
        ElementSet::ClusterIps,
        el(addr_key(&info.cluster_ip), None, false),
    ));
    let cip_key = addr_proto_port_key(&info.cluster_ip, proto, info.port);
    match state.internal_no_endpoint_verdict() {
        None => out.elements.push((
            ElementSet::ServiceIps,
            el(cip_key, Some(Verdict::Goto(internal_chain.clone())), false),
        )),
        Some(v) => out.elements.push((
            ElementSet::NoEndpointServices,
            el(cip_key, Some(no_endpoint_verdict(v)), true),
        )),
    }
    let external_verdict = state.external_no_endpoint_verdict();
    let external_ips = info.external_ips.iter().map(|ip| (ip, false));
    let lb_ips = info.load_balancer_ips.iter().map(|ip| (ip, true));
    for (ip, is_lb) in external_ips.chain(lb_ips) {
        let key = addr_proto_port_key(ip, proto, info.port);
        if state.has_any_endpoints {
            out.elements.push((
                ElementSet::ServiceIps,
                el(
                    key.clone(),
                    Some(Verdict::Goto(chains.external.clone())),
                    false,
                ),
            ));
        }
        if is_lb && uses_firewall {
            out.elements.push((
                ElementSet::FirewallIps,
                el(
                    key.clone(),
                    Some(Verdict::Goto(chains.firewall.clone())),
                    true,
                ),
            ));
        }
        if let Some(v) = external_verdict {
            out.elements.push((
                ElementSet::NoEndpointServices,
                el(key, Some(no_endpoint_verdict(v)), true),
            ));
        }
    }
    if let Some(node_port) = info.node_port {
        let key = proto_port_key(proto, node_port);
        if state.has_any_endpoints {
            out.elements.push((
                ElementSet::ServiceNodePorts,
                el(
                    key.clone(),
                    Some(Verdict::Goto(chains.external.clone())),
                    false,
                ),
            ));
        }
        if let Some(v) = external_verdict {
            out.elements.push((
                ElementSet::NoEndpointNodePorts,
                el(key, Some(no_endpoint_verdict(v)), true),
            ));
        }
    }
    out
}
