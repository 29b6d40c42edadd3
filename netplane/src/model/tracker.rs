//! The change tracker: keeps the proxy's view of Services and EndpointSlices,
//! marks a Service dirty only when an update changes something the proxy
//! uses, and turns the dirty set into a [`ProxyDiff`] against the last
//! committed state. Bursts of updates to one Service coalesce into one entry;
//! nothing is recomputed for Services that did not change.
//!
//! Protocol for a sync loop:
//! 1. [`ChangeTracker::diff`] (cheap, `&self`) computes the diff;
//! 2. the backend programs it;
//! 3. on success, [`ChangeTracker::commit`] records it as the programmed
//!    state. On failure nothing is committed, so the next diff still carries
//!    every change (the backend keeps the previous rules).
//!
//! Updates arriving while the backend works are not lost: each Service has a
//! generation, and commit only clears a dirty mark the diff actually covered.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::SystemTime;

use ipnet::IpNet;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;

use super::diff::{NodePortAddresses, ProxyDiff, ProxySnapshot, ServicePortChange};
use super::endpoint::{
    Names, SliceInfo, endpoints_for_port, last_change_trigger_time, slice_info_with,
};
use super::selection::NodeTopology;
use super::service::{ServicePortInfo, service_ports};
use super::state::ServicePortState;
use super::types::{IpFamily, NamespacedName, ServicePortKey, ServicePortName};

/// A Service's ports of one family, sorted by name (a handful: a Vec costs
/// far less than a tree per Service).
type PortList = Vec<(ServicePortName, Arc<ServicePortInfo>)>;
/// A Service's ports per family.
type FamilyPorts = Vec<(IpFamily, PortList)>;
/// A Service's slices by (family, name).
type SliceList = Vec<((IpFamily, String), Arc<SliceInfo>)>;
/// (namespace, address family, slice name): how a slice is found again.
type SliceId = (Arc<str>, IpFamily, String);

/// Tracks Services, EndpointSlices and node facts; produces diffs.
#[derive(Debug)]
pub struct ChangeTracker {
    families: BTreeSet<IpFamily>,
    node: NodeTopology,
    started: SystemTime,
    services: HashMap<NamespacedName, FamilyPorts>,
    slices: HashMap<NamespacedName, SliceList>,
    slice_owner: HashMap<SliceId, NamespacedName>,
    dirty: HashMap<NamespacedName, u64>,
    generation: u64,
    pending_service_changes: BTreeSet<NamespacedName>,
    pending_endpoint_changes: u64,
    trigger_times: HashMap<NamespacedName, Vec<SystemTime>>,
    node_port_addresses: BTreeMap<IpFamily, NodePortAddresses>,
    service_cidrs: Option<BTreeMap<IpFamily, Vec<IpNet>>>,
    node_ports_generation: u64,
    applied_node_ports_generation: u64,
    applied: BTreeMap<ServicePortKey, Arc<ServicePortState>>,
    applied_keys: HashMap<NamespacedName, Vec<ServicePortKey>>,
    names: Names,
}

impl ChangeTracker {
    /// A tracker for the given families (one for single-stack, both for
    /// dual-stack) on the node described by `node`.
    pub fn new(families: impl IntoIterator<Item = IpFamily>, node: NodeTopology) -> Self {
        let families: BTreeSet<IpFamily> = families.into_iter().collect();
        let node_port_addresses = families
            .iter()
            .map(|f| (*f, NodePortAddresses::AllLocal))
            .collect();
        ChangeTracker {
            families,
            node,
            started: SystemTime::now(),
            services: HashMap::new(),
            slices: HashMap::new(),
            slice_owner: HashMap::new(),
            dirty: HashMap::new(),
            generation: 0,
            pending_service_changes: BTreeSet::new(),
            pending_endpoint_changes: 0,
            trigger_times: HashMap::new(),
            node_port_addresses,
            service_cidrs: None,
            // Generation 1 vs applied 0: the first diff carries the addresses.
            node_ports_generation: 1,
            applied_node_ports_generation: 0,
            applied: BTreeMap::new(),
            applied_keys: HashMap::new(),
            names: Names::default(),
        }
    }

    /// The IP families this tracker models.
    pub fn families(&self) -> &BTreeSet<IpFamily> {
        &self.families
    }

    /// The node facts used for endpoint selection.
    pub fn node(&self) -> &NodeTopology {
        &self.node
    }

    fn mark_dirty(&mut self, svc: &NamespacedName) {
        self.generation += 1;
        self.dirty.insert(svc.clone(), self.generation);
    }

    /// Records the current version of a Service. Returns whether anything the
    /// proxy uses changed (a sync is needed).
    pub fn update_service(&mut self, svc: &Service) -> bool {
        let name = NamespacedName::new(
            svc.metadata.namespace.clone().unwrap_or_default(),
            svc.metadata.name.clone().unwrap_or_default(),
        );
        let mut by_family: FamilyPorts = Vec::new();
        for family in self.families.clone() {
            match service_ports(svc, family) {
                Ok(ports) if !ports.is_empty() => {
                    by_family.push((family, ports.into_iter().collect()));
                }
                Ok(_) => {}
                Err(reason) => {
                    tracing::trace!(service = %name, ?family, ?reason, "service not proxied in this family");
                }
            }
        }
        let changed = match self.services.get(&name) {
            Some(old) => *old != by_family,
            None => !by_family.is_empty(),
        };
        if by_family.is_empty() {
            self.services.remove(&name);
        } else {
            self.services.insert(name.clone(), by_family);
        }
        if changed {
            self.pending_service_changes.insert(name.clone());
            self.mark_dirty(&name);
        }
        changed
    }

    /// Forgets a deleted Service. Returns whether a sync is needed.
    pub fn delete_service(&mut self, namespace: &str, name: &str) -> bool {
        let name = NamespacedName::new(namespace, name);
        let changed = self.services.remove(&name).is_some();
        if changed {
            self.pending_service_changes.insert(name.clone());
            self.mark_dirty(&name);
        }
        changed
    }

    /// Replaces the whole Service set (after a watch (re)list): upserts every
    /// given Service and deletes the ones not listed. Returns whether a sync
    /// is needed.
    pub fn replace_services<S: std::borrow::Borrow<Service>>(
        &mut self,
        all: impl IntoIterator<Item = S>,
    ) -> bool {
        let mut seen = BTreeSet::new();
        let mut changed = false;
        for svc in all {
            let svc = svc.borrow();
            seen.insert(NamespacedName::new(
                svc.metadata.namespace.clone().unwrap_or_default(),
                svc.metadata.name.clone().unwrap_or_default(),
            ));
            changed |= self.update_service(svc);
        }
        let gone: Vec<NamespacedName> = self
            .services
            .keys()
            .filter(|k| !seen.contains(*k))
            .cloned()
            .collect();
        for name in gone {
            changed |= self.delete_service(&name.namespace, &name.name);
        }
        changed
    }

    /// Records the current version of an EndpointSlice. Returns whether
    /// anything the proxy uses changed.
    pub fn update_endpoint_slice(&mut self, slice: &EndpointSlice) -> bool {
        let info = match slice_info_with(slice, &mut self.names) {
            Ok(info) => info,
            Err(skip) => {
                tracing::debug!(slice = ?slice.metadata.name, reason = %skip, "EndpointSlice not used");
                // A slice that became unusable (e.g. relabelled) is a removal.
                return self.delete_endpoint_slice(slice);
            }
        };
        if !self.families.contains(&info.family) {
            return false;
        }
        let id: SliceId = (
            info.service.namespace.clone(),
            info.family,
            info.name.clone(),
        );
        let key = (info.family, info.name.clone());
        let service = info.service.clone();
        if let Some(owner) = self.slice_owner.get(&id).cloned()
            && owner != service
        {
            // The slice was relabelled to another Service: drop it from the old one.
            self.remove_slice(&id, &owner);
        }
        let entry = self.slices.entry(service.clone()).or_default();
        match entry.iter_mut().find(|(k, _)| *k == key) {
            Some((_, old)) if **old == info => return false,
            Some((_, old)) => *old = Arc::new(info),
            None => {
                entry.push((key, Arc::new(info)));
                entry.shrink_to_fit();
            }
        }
        self.slice_owner.insert(id, service.clone());
        if let Some(t) = last_change_trigger_time(slice).filter(|t| *t > self.started) {
            self.trigger_times
                .entry(service.clone())
                .or_default()
                .push(t);
        }
        self.pending_endpoint_changes += 1;
        self.mark_dirty(&service);
        true
    }

    fn remove_slice(&mut self, id: &SliceId, owner: &NamespacedName) {
        if let Some(slices) = self.slices.get_mut(owner) {
            slices.retain(|(k, _)| !(k.0 == id.1 && k.1 == id.2));
            if slices.is_empty() {
                self.slices.remove(owner);
            }
        }
        self.slice_owner.remove(id);
        // kube-proxy ignores the trigger time of deletions.
        self.trigger_times.remove(owner);
        self.pending_endpoint_changes += 1;
        self.mark_dirty(owner);
    }

    /// Forgets a deleted EndpointSlice. Returns whether a sync is needed.
    pub fn delete_endpoint_slice(&mut self, slice: &EndpointSlice) -> bool {
        let Some(family) = IpFamily::from_k8s(&slice.address_type) else {
            return false;
        };
        let (Some(namespace), Some(name)) = (&slice.metadata.namespace, &slice.metadata.name)
        else {
            return false;
        };
        let id: SliceId = (namespace.as_str().into(), family, name.clone());
        let Some(owner) = self.slice_owner.get(&id).cloned() else {
            return false;
        };
        self.remove_slice(&id, &owner);
        true
    }

    /// Replaces the whole EndpointSlice set (after a watch (re)list).
    pub fn replace_endpoint_slices<S: std::borrow::Borrow<EndpointSlice>>(
        &mut self,
        all: impl IntoIterator<Item = S>,
    ) -> bool {
        let mut seen: BTreeSet<SliceId> = BTreeSet::new();
        let mut changed = false;
        for slice in all {
            let slice = slice.borrow();
            if let (Some(ns), Some(name), Some(family)) = (
                &slice.metadata.namespace,
                &slice.metadata.name,
                IpFamily::from_k8s(&slice.address_type),
            ) {
                seen.insert((ns.as_str().into(), family, name.clone()));
            }
            changed |= self.update_endpoint_slice(slice);
        }
        let gone: Vec<(SliceId, NamespacedName)> = self
            .slice_owner
            .iter()
            .filter(|(id, _)| !seen.contains(*id))
            .map(|(id, owner)| (id.clone(), owner.clone()))
            .collect();
        for (id, owner) in gone {
            self.remove_slice(&id, &owner);
            changed = true;
        }
        changed
    }

    /// Updates the node's zone (topology changes re-evaluate every Service,
    /// as kube-proxy does on a topology label change). Returns whether a sync
    /// is needed.
    pub fn set_node_zone(&mut self, zone: Option<String>) -> bool {
        if self.node.zone == zone {
            return false;
        }
        self.node.zone = zone;
        let all: Vec<NamespacedName> = self
            .services
            .keys()
            .chain(self.applied_keys.keys())
            .cloned()
            .collect();
        for svc in all {
            self.mark_dirty(&svc);
        }
        true
    }

    /// Sets which addresses accept NodePort traffic. Returns whether a sync
    /// is needed.
    pub fn set_node_port_addresses(&mut self, family: IpFamily, addrs: NodePortAddresses) -> bool {
        if !self.families.contains(&family) || self.node_port_addresses.get(&family) == Some(&addrs)
        {
            return false;
        }
        self.node_port_addresses.insert(family, addrs);
        self.node_ports_generation += 1;
        true
    }

    /// Sets the Service CIDRs of a family (traffic to unallocated
    /// ClusterIPs in them is dropped). Returns whether a sync is needed.
    pub fn set_service_cidrs(&mut self, family: IpFamily, cidrs: Vec<IpNet>) -> bool {
        if !self.families.contains(&family) {
            return false;
        }
        let map = self.service_cidrs.get_or_insert_with(BTreeMap::new);
        if map.get(&family) == Some(&cidrs) {
            return false;
        }
        map.insert(family, cidrs);
        self.node_ports_generation += 1;
        true
    }

    /// Whether a diff would carry anything.
    pub fn has_pending(&self) -> bool {
        !self.dirty.is_empty() || self.node_ports_generation != self.applied_node_ports_generation
    }

    /// Services with uncommitted changes (kube-proxy's
    /// `sync_proxy_rules_service_changes_pending`).
    pub fn pending_service_changes(&self) -> usize {
        self.pending_service_changes.len()
    }

    /// EndpointSlice updates not yet committed
    /// (`sync_proxy_rules_endpoint_changes_pending`).
    pub fn pending_endpoint_changes(&self) -> u64 {
        self.pending_endpoint_changes
    }

    /// The committed (programmed) state.
    pub fn applied(&self) -> &BTreeMap<ServicePortKey, Arc<ServicePortState>> {
        &self.applied
    }

    /// The committed states of one Service's ports (both families).
    pub fn applied_service(&self, svc: &NamespacedName) -> Vec<&Arc<ServicePortState>> {
        self.applied_keys
            .get(svc)
            .into_iter()
            .flatten()
            .filter_map(|k| self.applied.get(k))
            .collect()
    }

    /// Whether changes of `svc` wait for a sync.
    pub fn is_pending(&self, svc: &NamespacedName) -> bool {
        self.dirty.contains_key(svc)
    }

    /// The NodePort addresses to program (committed or pending): the value a
    /// full resync must program.
    pub fn node_port_addresses(&self) -> &BTreeMap<IpFamily, NodePortAddresses> {
        &self.node_port_addresses
    }

    /// The desired state of one Service's ports, computed now.
    fn desired_for(&self, svc: &NamespacedName) -> BTreeMap<ServicePortKey, ServicePortState> {
        let mut out = BTreeMap::new();
        let Some(by_family) = self.services.get(svc) else {
            return out;
        };
        let slices = self.slices.get(svc);
        for (family, ports) in by_family {
            for (name, info) in ports {
                let family_slices = slices
                    .into_iter()
                    .flat_map(|s| s.iter())
                    .filter(|((f, _), _)| f == family)
                    .map(|(_, s)| s);
                let endpoints =
                    endpoints_for_port(family_slices, &name.port, name.protocol, &self.node.name);
                let key = ServicePortKey {
                    family: *family,
                    name: name.clone(),
                };
                let state = ServicePortState::new(key.clone(), info.clone(), endpoints, &self.node);
                out.insert(key, state);
            }
        }
        out
    }

    /// Computes the changes since the last commit. Pure: calling it twice
    /// without a commit gives the same changes (plus newer updates).
    pub fn diff(&self) -> ProxyDiff {
        let mut changes = Vec::new();
        let mut covered = BTreeMap::new();
        let mut trigger_times = Vec::new();
        for (svc, generation) in &self.dirty {
            covered.insert(svc.clone(), *generation);
            let desired = self.desired_for(svc);
            let old_keys = self.applied_keys.get(svc);
            for key in old_keys.into_iter().flatten() {
                if !desired.contains_key(key) {
                    changes.push(ServicePortChange {
                        key: key.clone(),
                        previous: self.applied.get(key).cloned(),
                        current: None,
                    });
                }
            }
            for (key, state) in desired {
                let previous = self.applied.get(&key).cloned();
                if previous.as_deref() == Some(&state) {
                    continue;
                }
                changes.push(ServicePortChange {
                    key,
                    previous,
                    current: Some(Arc::new(state)),
                });
            }
            if let Some(times) = self.trigger_times.get(svc) {
                trigger_times.extend(times.iter().map(|t| (svc.clone(), *t)));
            }
        }
        changes.sort_by(|a, b| a.key.cmp(&b.key));
        let global_changed = self.node_ports_generation != self.applied_node_ports_generation;
        let node_port_addresses = global_changed.then(|| self.node_port_addresses.clone());
        let service_cidrs = if global_changed {
            self.service_cidrs.clone()
        } else {
            None
        };
        ProxyDiff {
            changes,
            node_port_addresses,
            service_cidrs,
            covered,
            trigger_times,
            node_generation: self.node_ports_generation,
        }
    }

    /// The full desired state: the committed state with `diff` applied.
    pub fn snapshot(&self, diff: &ProxyDiff) -> ProxySnapshot {
        let mut services = self.applied.clone();
        for change in &diff.changes {
            match &change.current {
                Some(state) => {
                    services.insert(change.key.clone(), state.clone());
                }
                None => {
                    services.remove(&change.key);
                }
            }
        }
        ProxySnapshot {
            services,
            node_port_addresses: diff
                .node_port_addresses
                .clone()
                .unwrap_or_else(|| self.node_port_addresses.clone()),
            service_cidrs: self.service_cidrs.clone(),
        }
    }

    /// Records a programmed diff as the committed state.
    pub fn commit(&mut self, diff: &ProxyDiff) {
        for change in &diff.changes {
            let svc = &change.key.name.service;
            match &change.current {
                Some(state) => {
                    self.applied.insert(change.key.clone(), state.clone());
                    let keys = self.applied_keys.entry(svc.clone()).or_default();
                    if !keys.contains(&change.key) {
                        keys.push(change.key.clone());
                        keys.sort();
                        keys.shrink_to_fit();
                    }
                }
                None => {
                    self.applied.remove(&change.key);
                    if let Some(keys) = self.applied_keys.get_mut(svc) {
                        keys.retain(|k| k != &change.key);
                        if keys.is_empty() {
                            self.applied_keys.remove(svc);
                        }
                    }
                }
            }
        }
        for (svc, generation) in &diff.covered {
            if self.dirty.get(svc) == Some(generation) {
                self.dirty.remove(svc);
                self.pending_service_changes.remove(svc);
            }
        }
        let mut observed: HashMap<&NamespacedName, usize> = HashMap::new();
        for (svc, _) in &diff.trigger_times {
            *observed.entry(svc).or_default() += 1;
        }
        for (svc, n) in observed {
            if let Some(times) = self.trigger_times.get_mut(svc) {
                times.drain(..n.min(times.len()));
                if times.is_empty() {
                    self.trigger_times.remove(svc);
                }
            }
        }
        if self.dirty.is_empty() {
            self.pending_endpoint_changes = 0;
        }
        if diff.node_port_addresses.is_some() {
            self.applied_node_ports_generation = diff.node_generation;
        }
    }
}
