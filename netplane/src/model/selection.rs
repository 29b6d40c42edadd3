//! Which endpoints a service port uses on this node: kube-proxy's
//! `CategorizeEndpoints`, computed once here so every data plane renders the
//! same choice.
//!
//! - **Cluster policy**: ready endpoints, narrowed by topology hints when
//!   every ready endpoint carries a hint and at least one is for this node
//!   (`PreferSameNode`, from `hints.forNodes`) or this zone (`PreferSameZone`
//!   / `PreferClose` / topology-aware hints, from `hints.forZones`); if no
//!   ready endpoint exists anywhere, the serving+terminating ones (KEP-1669).
//! - **Local policy** (iTP=Local, or eTP=Local on an externally reachable
//!   port): the ready endpoints on this node, else its serving+terminating
//!   ones.
//! - `has_any_endpoints`: whether any usable endpoint exists anywhere (tells
//!   "reject" from "drop" when the policy's own set is empty).

use std::collections::BTreeSet;

use super::endpoint::Endpoint;
use super::service::ServicePortInfo;

/// What the proxy knows about its own node for endpoint selection.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeTopology {
    /// The node's name (endpoints with this `nodeName` are local; node hints
    /// are matched against it).
    pub name: String,
    /// The node's `topology.kubernetes.io/zone` label, if any.
    pub zone: Option<String>,
}

/// The topology mode chosen from the hints of the ready endpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TopologyMode {
    /// No narrowing: every ready endpoint.
    All,
    /// Only endpoints hinted for this node.
    PreferSameNode,
    /// Only endpoints hinted for this node's zone.
    PreferSameZone,
}

/// The endpoints one service port uses on this node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Categorized {
    /// Endpoints for Cluster traffic policy (empty if the port never uses it).
    pub cluster: Vec<Endpoint>,
    /// Endpoints for Local traffic policy (empty if the port never uses it).
    pub local: Vec<Endpoint>,
    /// Whether the service has a usable endpoint anywhere in the cluster.
    pub has_any_endpoints: bool,
}

impl Categorized {
    /// The union of `cluster` and `local` (every endpoint this node may send
    /// traffic to), sorted by address.
    pub fn all_reachable(&self) -> Vec<Endpoint> {
        let mut seen = BTreeSet::new();
        let mut out: Vec<Endpoint> = self
            .cluster
            .iter()
            .chain(self.local.iter())
            .filter(|e| seen.insert(e.addr()))
            .cloned()
            .collect();
        out.sort_by_key(|e| e.addr());
        out
    }
}

/// Chooses the topology mode from the hints of the ready endpoints.
pub fn topology_mode(endpoints: &[Endpoint], node: &NodeTopology) -> TopologyMode {
    let zone = node.zone.as_deref().unwrap_or("");
    let mut has_ready = false;
    let mut all_node_hints = true;
    let mut for_node = false;
    let mut all_zone_hints = true;
    let mut for_zone = false;
    for ep in endpoints.iter().filter(|e| e.ready) {
        has_ready = true;
        if ep.node_hints().is_empty() {
            all_node_hints = false;
        } else if has(ep.node_hints(), &node.name) {
            for_node = true;
        }
        if ep.zone_hints().is_empty() {
            all_zone_hints = false;
        } else if has(ep.zone_hints(), zone) {
            for_zone = true;
        }
    }
    if !has_ready {
        return TopologyMode::All;
    }
    if all_node_hints && for_node {
        return TopologyMode::PreferSameNode;
    }
    if all_zone_hints && for_zone {
        return TopologyMode::PreferSameZone;
    }
    TopologyMode::All
}

fn has(names: &[std::sync::Arc<str>], name: &str) -> bool {
    names.iter().any(|n| &**n == name)
}

fn available_for_topology(ep: &Endpoint, mode: TopologyMode, node: &NodeTopology) -> bool {
    match mode {
        TopologyMode::All => true,
        TopologyMode::PreferSameNode => has(ep.node_hints(), &node.name),
        TopologyMode::PreferSameZone => has(ep.zone_hints(), node.zone.as_deref().unwrap_or("")),
    }
}

/// Splits a service port's endpoints into the Cluster and Local sets.
pub fn categorize(
    endpoints: &[Endpoint],
    svc: &ServicePortInfo,
    node: &NodeTopology,
) -> Categorized {
    let mut out = Categorized::default();
    if endpoints.is_empty() {
        return out;
    }
    if svc.uses_cluster_endpoints() {
        let mode = topology_mode(endpoints, node);
        out.cluster = endpoints
            .iter()
            .filter(|e| e.ready && available_for_topology(e, mode, node))
            .cloned()
            .collect();
        if out.cluster.is_empty() {
            out.cluster = endpoints
                .iter()
                .filter(|e| e.serving && e.terminating)
                .cloned()
                .collect();
        }
        out.has_any_endpoints = !out.cluster.is_empty();
    }
    if !svc.uses_local_endpoints() {
        return out;
    }
    let mut local_ready = false;
    let mut local_terminating = false;
    for ep in endpoints {
        if ep.ready {
            out.has_any_endpoints = true;
            local_ready |= ep.is_local;
        } else if ep.serving && ep.terminating {
            out.has_any_endpoints = true;
            local_terminating |= ep.is_local;
        }
    }
    if local_ready {
        out.local = endpoints
            .iter()
            .filter(|e| e.is_local && e.ready)
            .cloned()
            .collect();
    } else if local_terminating {
        out.local = endpoints
            .iter()
            .filter(|e| e.is_local && e.serving && e.terminating)
            .cloned()
            .collect();
    }
    out
}
