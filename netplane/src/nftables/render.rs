//! Renders one service port's desired state into the elements, chains and
//! affinity sets of keelson's table. Behaviour is kube-proxy v1.36's
//! (`pkg/proxy/nftables/proxier.go`, `syncProxyRules`); the objects are
//! fewer.
//!
//! **Endpoint lists instead of chains.** Most traffic needs nothing per
//! Service but "pick one of these N endpoints": a ClusterIP port without
//! ClientIP affinity, and the externalIPs, load-balancer IPs and NodePort
//! of a port with `externalTrafficPolicy: Cluster` (plus masquerading).
//! For those keelson writes no chain and no rule. The address key
//! (`ip . proto . port`, or `proto . nodePort`) gets its `service-ips` /
//! `service-nodeports` element, `goto` a chain shared by every key with N
//! endpoints, and N elements of `service-endpoints` / `nodeport-endpoints`
//! (`key . slot : endpoint address . port`). `endpoints-N` does
//! `dnat ip addr . port to ip daddr . meta l4proto . th dport . numgen random mod N map @service-endpoints`
//! (`external-endpoints-N` and `nodeport-endpoints-N` also set the
//! masquerade mark). An endpoint change is data elements only; a change of
//! the count re-points the dispatch element; a new Service adds its
//! elements. (A count no other key has yet adds its shared chain.) No map
//! is bound by more than a few rules, which matters: the kernel checks
//! every element added to a data map against every rule bound to it, and
//! walks every element when a rule binds it.
//!
//! **Per-Service chains, as upstream, where behaviour needs them**:
//! ClientIP affinity (`service-HASH-ns/name/proto/port` with
//! `ip saddr @affinity-X goto endpoint-X` per endpoint and a random pick
//! `numgen random mod N offset B vmap @endpoint-chains`; the endpoint chains
//! update the affinity set and DNAT), and the external addresses of a port
//! with `externalTrafficPolicy: Local` (`external-...`: short-circuit of
//! pod and host traffic to the Cluster-policy chain, else the Local-policy
//! chain; those chains pick with
//! `meta l4proto tcp dnat ip addr . port to numgen random mod N offset B map @endpoint-slots`,
//! B being the port's block of slots, see [`super::slots`]).
//! kube-proxy writes the same pick with an anonymous map per service port;
//! the kernel names anonymous sets and finds named ones by walking the
//! table's set list, which makes thousands of them cost the square.
//! `firewall-...` (loadBalancerSourceRanges) stays per Service too.
//!
//! Other elements: `cluster-ips`, `service-ips` / `service-nodeports`
//! (dispatch to per-Service chains), `no-endpoint-*`, `firewall-ips`,
//! `hairpin-connections` (local endpoints, masqueraded when they reach
//! themselves through the Service).

use std::net::IpAddr;

use super::config::NftablesConfig;
use super::expr::{FibOn, Verdict};
use super::layout::{self, addr_key, if_pod};
use super::names::{PortChains, endpoint_names};
use super::objects::{ChainDef, Element, SetDef, SetKind};
use super::rule::{Rule, RuleBuilder};
use super::slots::SlotBlock;
use crate::model::{Endpoint, IpFamily, NoEndpointVerdict, Protocol, ServicePortState};

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
    /// `hairpin-connections`
    HairpinConnections,
    /// `endpoint-slots`
    EndpointSlots,
    /// `endpoint-chains`
    EndpointChains,
    /// `service-endpoints`
    ServiceEndpoints,
    /// `nodeport-endpoints`
    NodePortEndpoints,
    /// `service-endpoints-digest`
    ServiceEndpointsDigest,
    /// `nodeport-endpoints-digest`
    NodePortEndpointsDigest,
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
            ElementSet::HairpinConnections => layout::HAIRPIN_CONNECTIONS,
            ElementSet::EndpointSlots => layout::ENDPOINT_SLOTS,
            ElementSet::EndpointChains => layout::ENDPOINT_CHAINS,
            ElementSet::ServiceEndpoints => layout::SERVICE_ENDPOINTS,
            ElementSet::NodePortEndpoints => layout::NODEPORT_ENDPOINTS,
            ElementSet::ServiceEndpointsDigest => layout::SERVICE_ENDPOINTS_DIGEST,
            ElementSet::NodePortEndpointsDigest => layout::NODEPORT_ENDPOINTS_DIGEST,
        }
    }

    /// All of them.
    pub const ALL: [ElementSet; 13] = [
        ElementSet::ClusterIps,
        ElementSet::ServiceIps,
        ElementSet::ServiceNodePorts,
        ElementSet::NoEndpointServices,
        ElementSet::NoEndpointNodePorts,
        ElementSet::FirewallIps,
        ElementSet::HairpinConnections,
        ElementSet::EndpointSlots,
        ElementSet::EndpointChains,
        ElementSet::ServiceEndpoints,
        ElementSet::NodePortEndpoints,
        ElementSet::ServiceEndpointsDigest,
        ElementSet::NodePortEndpointsDigest,
    ];

    /// Whether several service ports may claim the same key (a ClusterIP
    /// with several ports, an endpoint of several Services, two Services
    /// given the same external address). Slot keys are a port's own.
    pub fn is_shared(self) -> bool {
        !matches!(self, ElementSet::EndpointSlots | ElementSet::EndpointChains)
    }
}

/// Which address keys an endpoint list serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ListKind {
    /// `ip . proto . port` keys (ClusterIP, externalIPs, LB IPs).
    Address,
    /// `proto . nodePort` keys.
    NodePort,
}

impl ListKind {
    /// The dispatch map and the endpoints map of the kind.
    pub fn sets(self) -> (ElementSet, ElementSet) {
        match self {
            ListKind::Address => (ElementSet::ServiceIps, ElementSet::ServiceEndpoints),
            ListKind::NodePort => (ElementSet::ServiceNodePorts, ElementSet::NodePortEndpoints),
        }
    }

    /// The map of the kind's list digests.
    pub fn digests(self) -> ElementSet {
        match self {
            ListKind::Address => ElementSet::ServiceEndpointsDigest,
            ListKind::NodePort => ElementSet::NodePortEndpointsDigest,
        }
    }

    /// Both kinds.
    pub const ALL: [ListKind; 2] = [ListKind::Address, ListKind::NodePort];
}

/// A key's "count value" says which shared chain serves it: N, with flags.
/// Flag: traffic to the key is masqueraded (external addresses with
/// `externalTrafficPolicy: Cluster`).
pub const COUNT_MASQUERADE: u32 = 1 << 31;
/// Count value flag: a NodePort key.
pub const COUNT_NODEPORT: u32 = 1 << 30;
/// The count part of a count value.
pub const COUNT_MASK: u32 = COUNT_NODEPORT - 1;

/// An address or NodePort key served by an endpoint list (no chain of its
/// own): its count value and its endpoints in slot order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyedList {
    /// Address or NodePort.
    pub kind: ListKind,
    /// The key (`ip . proto . port` or `proto . port` bytes).
    pub key: Vec<u8>,
    /// N, with [`COUNT_MASQUERADE`] / [`COUNT_NODEPORT`].
    pub value: u32,
    /// `address . port` data of each endpoint, in slot order.
    pub endpoints: Vec<Vec<u8>>,
}

impl KeyedList {
    /// The dispatch element: goto the shared chain of its count value.
    pub fn dispatch_element(&self) -> Element {
        Element::verdict(
            self.key.clone(),
            Verdict::Goto(shared_chain_name(self.value)),
            None,
        )
    }

    /// The endpoint element of slot `i`.
    pub fn endpoint_element(&self, i: usize) -> Option<Element> {
        let data = self.endpoints.get(i)?;
        Some(Element::data(self.slot_key(i), data.clone()))
    }

    /// The key of slot `i` in the endpoints map.
    pub fn slot_key(&self, i: usize) -> Vec<u8> {
        list_slot_key(&self.key, i as u32)
    }

    /// A digest of what the list puts in the kernel besides its key: the
    /// count value and each slot's endpoint (FNV-1a, stable across
    /// processes and versions that keep this function).
    pub fn digest(&self) -> [u8; 8] {
        use std::hash::Hasher;
        let mut h = super::rule::Fnv64::default();
        h.write(&self.value.to_ne_bytes());
        for ep in &self.endpoints {
            h.write(&[ep.len() as u8]);
            h.write(ep);
        }
        h.finish().to_ne_bytes()
    }

    /// The digest element (`service-endpoints-digest` /
    /// `nodeport-endpoints-digest`): written with the list, compared by a
    /// restarted keelson instead of reading the slots back.
    pub fn digest_element(&self) -> Element {
        Element::data(self.key.clone(), self.digest().to_vec())
    }
}

/// The key of slot `i` of the endpoint list of dispatch key `key`.
pub fn list_slot_key(key: &[u8], i: u32) -> Vec<u8> {
    let mut k = Vec::with_capacity(key.len() + 4);
    k.extend_from_slice(key);
    k.extend_from_slice(&i.to_ne_bytes());
    k
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
    /// Its keys served by endpoint lists.
    pub lists: Vec<KeyedList>,
}

/// The slot blocks of a port's two endpoint lists (Cluster and Local
/// policy) used by its own chains, when rendered.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PortSlots {
    /// Cluster-policy endpoints.
    pub cluster: Option<SlotBlock>,
    /// Local-policy endpoints.
    pub local: Option<SlotBlock>,
}

impl PortSlots {
    /// The blocks, Cluster first.
    pub fn blocks(self) -> [Option<SlotBlock>; 2] {
        [self.cluster, self.local]
    }
}

/// Which routing a port gets (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Shape {
    /// ClusterIP through its own chains (ClientIP affinity).
    internal_chains: bool,
    /// External addresses and NodePort through `external-...` (affinity or
    /// eTP=Local).
    external_chains: bool,
}

fn shape(state: &ServicePortState) -> Shape {
    let affinity = state.info.affinity_timeout().is_some();
    Shape {
        internal_chains: affinity,
        external_chains: state.uses_external_stage()
            && (affinity || state.info.external_policy_local),
    }
}

/// Which of a port's policy chains are rendered: (Cluster, Local).
fn policy_chains(state: &ServicePortState) -> (bool, bool) {
    let s = shape(state);
    let info = &state.info;
    let cluster = state.uses_cluster_policy()
        && ((s.internal_chains && !info.internal_policy_local) || s.external_chains);
    let local = state.uses_local_policy()
        && ((s.internal_chains && info.internal_policy_local)
            || (s.external_chains && info.external_policy_local));
    (cluster, local)
}

/// How many endpoints each of a port's own chains picks from, for the
/// policy chains it renders (Cluster first; `None`: not rendered).
pub fn slot_needs(state: &ServicePortState) -> [Option<usize>; 2] {
    let (cluster, local) = policy_chains(state);
    [
        cluster.then_some(state.cluster_endpoints.len()),
        local.then_some(state.local_endpoints.len()),
    ]
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

/// Slot key bytes (`mark`-typed, host byte order, as `numgen` leaves the
/// number in the register).
pub fn slot_key(slot: u32) -> Vec<u8> {
    slot.to_ne_bytes().to_vec()
}

/// `address . port` data bytes of an endpoint.
pub fn endpoint_data(ep: &Endpoint) -> Vec<u8> {
    let mut data = addr_key(&ep.ip);
    data.extend_from_slice(&ep.port.to_be_bytes());
    data.extend_from_slice(&[0, 0]);
    data
}

/// `ip . ip . proto . port` key of a `hairpin-connections` element.
fn hairpin_key(ep: &Endpoint, proto: Protocol) -> Vec<u8> {
    let mut key = addr_key(&ep.ip);
    key.extend(addr_key(&ep.ip));
    key.extend_from_slice(&[proto.number(), 0, 0, 0]);
    key.extend_from_slice(&ep.port.to_be_bytes());
    key.extend_from_slice(&[0, 0]);
    key
}

fn no_endpoint_verdict(v: NoEndpointVerdict) -> Verdict {
    match v {
        NoEndpointVerdict::Reject => Verdict::Goto(layout::REJECT_CHAIN.into()),
        NoEndpointVerdict::Drop => Verdict::Drop,
    }
}

fn chain(name: &str, rules: Vec<Rule>) -> ChainDef {
    ChainDef {
        name: name.to_string(),
        base: None,
        comment: None,
        rules,
    }
}

/// The chain shared by every key whose count value is `value`.
pub fn shared_chain_name(value: u32) -> String {
    let n = value & COUNT_MASK;
    if value & COUNT_NODEPORT != 0 {
        format!("nodeport-endpoints-{n}")
    } else if value & COUNT_MASQUERADE != 0 {
        format!("external-endpoints-{n}")
    } else {
        format!("endpoints-{n}")
    }
}

/// The kind and endpoint count of a shared chain's name.
pub fn parse_shared_chain_name(name: &str) -> Option<(ListKind, u32)> {
    let (kind, n) = if let Some(n) = name.strip_prefix("nodeport-endpoints-") {
        (ListKind::NodePort, n)
    } else if let Some(n) = name.strip_prefix("external-endpoints-") {
        (ListKind::Address, n)
    } else {
        (ListKind::Address, name.strip_prefix("endpoints-")?)
    };
    n.parse().ok().map(|n| (kind, n))
}

/// The shared chain for count value `value` in `family`.
pub fn shared_chain(value: u32, family: IpFamily, config: &NftablesConfig) -> ChainDef {
    let n = value & COUNT_MASK;
    let mut r = RuleBuilder::new(family);
    if value & (COUNT_MASQUERADE | COUNT_NODEPORT) != 0 {
        r = r.mark_or(config.masquerade_mark());
    }
    let rule = if value & COUNT_NODEPORT != 0 {
        r.dnat_nodeport_list(layout::NODEPORT_ENDPOINTS, n)
    } else {
        r.dnat_address_list(layout::SERVICE_ENDPOINTS, n)
    };
    chain(&shared_chain_name(value), vec![rule])
}

/// Renders a service port; its own policy chains use the blocks `slots`
/// (one for each list [`slot_needs`] names).
pub fn render_port(
    state: &ServicePortState,
    config: &NftablesConfig,
    slots: &PortSlots,
) -> RenderedPort {
    let family = state.key.family;
    let info = &state.info;
    let name = &state.key.name;
    let comment = name.to_string();
    let proto = info.protocol;
    let chains = PortChains::new(name);
    let r = || RuleBuilder::new(family);
    let mark = config.masquerade_mark();
    let shape = shape(state);
    let affinity = info.affinity_timeout();
    let (cluster_chain, local_chain) = policy_chains(state);
    let mut out = RenderedPort::default();

    // Hairpin elements for every reachable local endpoint; endpoint chains
    // and affinity sets (ClientIP affinity only).
    for ep in state.reachable_endpoints() {
        if ep.is_local {
            out.elements.push((
                ElementSet::HairpinConnections,
                Element::key(hairpin_key(&ep, proto)),
            ));
        }
        let Some(timeout_seconds) = affinity else {
            continue;
        };
        let (chain_name, set) = endpoint_names(name, ep.addr());
        out.affinity_sets.push(SetDef {
            name: set.clone(),
            kind: SetKind::Affinity { timeout_seconds },
            comment: None,
        });
        out.chains.push(chain(
            &chain_name,
            vec![
                r().update_saddr(&set).build(),
                r().dnat(proto, ep.ip, ep.port),
            ],
        ));
    }

    // The port's own policy chains: one pick among its endpoint slots.
    let mut policy_chain =
        |chain_name: &String, endpoints: &[Endpoint], block: Option<SlotBlock>| {
            let block = block.unwrap_or(SlotBlock { base: 0, order: 0 });
            let n = endpoints.len() as u32;
            let mut rules = Vec::new();
            if affinity.is_some() {
                for (slot, ep) in endpoints.iter().enumerate() {
                    let (ep_chain, set) = endpoint_names(name, ep.addr());
                    rules.push(
                        r().saddr_in_set(&set, false)
                            .verdict(Verdict::Goto(ep_chain.clone())),
                    );
                    out.elements.push((
                        ElementSet::EndpointChains,
                        Element::verdict(
                            slot_key(block.slot(slot as u32)),
                            Verdict::Goto(ep_chain),
                            None,
                        ),
                    ));
                }
                rules.push(r().vmap_slots(layout::ENDPOINT_CHAINS, block, n));
            } else {
                for (slot, ep) in endpoints.iter().enumerate() {
                    out.elements.push((
                        ElementSet::EndpointSlots,
                        Element::data(slot_key(block.slot(slot as u32)), endpoint_data(ep)),
                    ));
                }
                rules.push(r().dnat_slots(proto, layout::ENDPOINT_SLOTS, block, n));
            }
            out.chains.push(chain(chain_name, rules));
        };
    if cluster_chain {
        policy_chain(&chains.service, &state.cluster_endpoints, slots.cluster);
    }
    if local_chain {
        policy_chain(&chains.local, &state.local_endpoints, slots.local);
    }

    // The external chain (affinity or eTP=Local).
    if shape.external_chains {
        let mut rules = Vec::new();
        if !info.external_policy_local {
            rules.push(r().mark_or(mark).comment("masquerade").build());
        } else {
            if let Some(b) = if_pod(r(), config.local(family), false) {
                rules.push(
                    b.comment("short-circuit pod traffic")
                        .verdict(Verdict::Goto(chains.service.clone())),
                );
            }
            rules.push(
                r().fib_type_local(FibOn::Saddr)
                    .mark_or(mark)
                    .comment("masquerade local traffic")
                    .build(),
            );
            rules.push(
                r().fib_type_local(FibOn::Saddr)
                    .comment("short-circuit local traffic")
                    .verdict(Verdict::Goto(chains.service.clone())),
            );
        }
        if state.has_external_endpoints() {
            let policy = if info.external_policy_local {
                &chains.local
            } else {
                &chains.service
            };
            rules.push(r().verdict(Verdict::Goto(policy.clone())));
        }
        out.chains.push(chain(&chains.external, rules));
    }

    // Firewall chain (loadBalancerSourceRanges): one `return` per allowed
    // range (no anonymous set per Service), then drop.
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
        out.chains.push(chain(&chains.firewall, rules));
    }

    // Dispatch.
    let commented =
        |key: Vec<u8>, verdict: Verdict| Element::verdict(key, verdict, Some(comment.clone()));
    let list = |kind, key: Vec<u8>, value: u32, endpoints: &[Endpoint]| KeyedList {
        kind,
        key,
        value: value | (endpoints.len() as u32).min(COUNT_MASK),
        endpoints: endpoints.iter().map(endpoint_data).collect(),
    };
    out.elements.push((
        ElementSet::ClusterIps,
        Element::key(addr_key(&info.cluster_ip)),
    ));
    let cip_key = addr_proto_port_key(&info.cluster_ip, proto, info.port);
    match state.internal_no_endpoint_verdict() {
        None if shape.internal_chains => {
            let internal = if info.internal_policy_local {
                &chains.local
            } else {
                &chains.service
            };
            out.elements.push((
                ElementSet::ServiceIps,
                Element::verdict(cip_key, Verdict::Goto(internal.clone()), None),
            ));
        }
        None => out.lists.push(list(
            ListKind::Address,
            cip_key,
            0,
            state.internal_endpoints(),
        )),
        Some(v) => out.elements.push((
            ElementSet::NoEndpointServices,
            commented(cip_key, no_endpoint_verdict(v)),
        )),
    }
    let external_verdict = state.external_no_endpoint_verdict();
    let external_ips = info.external_ips.iter().map(|ip| (ip, false));
    let lb_ips = info.load_balancer_ips.iter().map(|ip| (ip, true));
    for (ip, is_lb) in external_ips.chain(lb_ips) {
        let key = addr_proto_port_key(ip, proto, info.port);
        if state.has_any_endpoints {
            if shape.external_chains {
                out.elements.push((
                    ElementSet::ServiceIps,
                    Element::verdict(key.clone(), Verdict::Goto(chains.external.clone()), None),
                ));
            } else {
                out.lists.push(list(
                    ListKind::Address,
                    key.clone(),
                    COUNT_MASQUERADE,
                    state.external_endpoints(),
                ));
            }
        }
        if is_lb && uses_firewall {
            out.elements.push((
                ElementSet::FirewallIps,
                commented(key.clone(), Verdict::Goto(chains.firewall.clone())),
            ));
        }
        if let Some(v) = external_verdict {
            out.elements.push((
                ElementSet::NoEndpointServices,
                commented(key, no_endpoint_verdict(v)),
            ));
        }
    }
    if let Some(node_port) = info.node_port {
        let key = proto_port_key(proto, node_port);
        if state.has_any_endpoints {
            if shape.external_chains {
                out.elements.push((
                    ElementSet::ServiceNodePorts,
                    Element::verdict(key.clone(), Verdict::Goto(chains.external.clone()), None),
                ));
            } else {
                out.lists.push(list(
                    ListKind::NodePort,
                    key.clone(),
                    COUNT_NODEPORT,
                    state.external_endpoints(),
                ));
            }
        }
        if let Some(v) = external_verdict {
            out.elements.push((
                ElementSet::NoEndpointNodePorts,
                commented(key, no_endpoint_verdict(v)),
            ));
        }
    }
    out
}
