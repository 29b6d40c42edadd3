//! The difference between what the data plane has (the last committed
//! model) and what it should have: the unit every backend consumes.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::SystemTime;

use ipnet::IpNet;

use super::state::ServicePortState;
use super::types::{IpFamily, NamespacedName, ServicePortKey};

/// Which local addresses accept NodePort traffic, per family
/// (KubeProxyConfiguration `nodePortAddresses`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum NodePortAddresses {
    /// Every local address except loopback (`0.0.0.0/0` / `::/0`).
    #[default]
    AllLocal,
    /// Exactly these addresses (`primary`: the node's IPs, or the local
    /// addresses inside the configured CIDRs). Empty: no NodePorts.
    Ips(BTreeSet<IpAddr>),
}

/// One service port whose desired state differs from the committed one.
#[derive(Debug, Clone)]
pub struct ServicePortChange {
    /// The service port.
    pub key: ServicePortKey,
    /// What is committed (programmed) now; `None` when the port is new.
    pub previous: Option<Arc<ServicePortState>>,
    /// What should be programmed; `None` when the port is gone.
    pub current: Option<Arc<ServicePortState>>,
}

impl ServicePortChange {
    /// The port is new.
    pub fn is_added(&self) -> bool {
        self.previous.is_none() && self.current.is_some()
    }
    /// The port is gone.
    pub fn is_removed(&self) -> bool {
        self.current.is_none()
    }
}

/// Everything that changed since the last committed sync.
#[derive(Debug, Clone, Default)]
pub struct ProxyDiff {
    /// Changed service ports, sorted by key.
    pub changes: Vec<ServicePortChange>,
    /// The new NodePort addresses, when they changed (full value per family).
    pub node_port_addresses: Option<BTreeMap<IpFamily, NodePortAddresses>>,
    /// The new Service CIDRs (from ServiceCIDR objects), when they changed.
    pub service_cidrs: Option<BTreeMap<IpFamily, Vec<IpNet>>>,
    /// Services covered by this diff, with the generation seen (for commit).
    pub(crate) covered: BTreeMap<NamespacedName, u64>,
    /// EndpointSlice trigger times of the covered services (for the
    /// network-programming latency, observed once the diff is programmed).
    pub trigger_times: Vec<(NamespacedName, SystemTime)>,
    /// Service updates counted into this diff (pending gauge).
    pub(crate) node_generation: u64,
}

impl ProxyDiff {
    /// Nothing to program.
    pub fn is_empty(&self) -> bool {
        self.changes.is_empty()
            && self.node_port_addresses.is_none()
            && self.service_cidrs.is_none()
    }

    /// Changes of one family.
    pub fn for_family(&self, family: IpFamily) -> impl Iterator<Item = &ServicePortChange> {
        self.changes.iter().filter(move |c| c.key.family == family)
    }
}

/// The whole desired state (committed model with a diff applied): what a
/// full resync programs.
#[derive(Debug, Clone, Default)]
pub struct ProxySnapshot {
    /// Every service port, by key.
    pub services: BTreeMap<ServicePortKey, Arc<ServicePortState>>,
    /// NodePort addresses per family.
    pub node_port_addresses: BTreeMap<IpFamily, NodePortAddresses>,
    /// Service CIDRs per family, when known from the API (else the
    /// backend's configured ones apply).
    pub service_cidrs: Option<BTreeMap<IpFamily, Vec<IpNet>>>,
}
