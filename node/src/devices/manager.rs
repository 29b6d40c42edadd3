//! The device manager's state and decisions
//! (`pkg/kubelet/cm/devicemanager/manager.go` `ManagerImpl`): devices per
//! resource as the plugins list them, their health, which containers hold
//! which devices, the checkpoint, and the node's capacity/allocatable from
//! them. The gRPC sides are [`super::registration`] (plugins registering)
//! and [`super::connection`] (keelson's client of each plugin).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use k8s_openapi::api::core::v1::{Container, Pod};
use keelson_cri::kubelet_api::deviceplugin::{Device, HEALTHY};

use super::DeviceError;
use super::checkpoint;
use super::endpoint::Endpoint;
use super::pod_devices::{Allocation, NODE_WITHOUT_TOPOLOGY, PodDevices, RunContainerOptions};
use crate::pod::podutil;

/// What the node status gets from the device manager (`GetCapacity`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeviceCapacity {
    /// Resource → healthy + unhealthy devices.
    pub capacity: BTreeMap<String, i64>,
    /// Resource → healthy devices.
    pub allocatable: BTreeMap<String, i64>,
    /// Resources whose plugin is gone for longer than the grace period:
    /// their capacity is set to 0 once.
    pub removed: Vec<String>,
}

#[derive(Debug, Default)]
struct State {
    endpoints: BTreeMap<String, Endpoint>,
    all_devices: BTreeMap<String, BTreeMap<String, Device>>,
    healthy: BTreeMap<String, BTreeSet<String>>,
    unhealthy: BTreeMap<String, BTreeSet<String>>,
    allocated: BTreeMap<String, BTreeSet<String>>,
    pod_devices: PodDevices,
    /// `devicesToReuse`: the pod being admitted and the devices its init
    /// containers hold, which its next containers may take.
    reuse: Option<(String, BTreeMap<String, BTreeSet<String>>)>,
    /// `(pod UID, container)` running when keelson started
    /// (`containerMap` + `containerRunningSet`).
    initially_running: BTreeSet<(String, String)>,
    /// Pods with a container running at start that were not yet seen
    /// active: their devices are kept while pods are admitted again one by
    /// one after a restart (kubelet skips the cleanup until its pod
    /// sources are ready).
    protected: BTreeSet<String>,
    next_generation: u64,
}

/// The device manager (cheap to clone).
#[derive(Clone)]
pub struct DeviceManager {
    inner: Arc<Inner>,
}

struct Inner {
    /// `<root>/device-plugins`.
    dir: PathBuf,
    state: Mutex<State>,
}

impl std::fmt::Debug for DeviceManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceManager")
            .field("dir", &self.inner.dir)
            .finish_non_exhaustive()
    }
}

impl DeviceManager {
    /// A manager whose sockets and checkpoint live in `dir`
    /// (`<root>/device-plugins`).
    pub fn new(dir: PathBuf) -> Self {
        DeviceManager {
            inner: Arc::new(Inner {
                dir,
                state: Mutex::new(State::default()),
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.inner
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// `<root>/device-plugins`.
    pub(crate) fn dir(&self) -> &Path {
        &self.inner.dir
    }

    fn checkpoint_path(&self) -> PathBuf {
        self.inner.dir.join(checkpoint::FILE_NAME)
    }

    /// `readCheckpoint`: allocations from the last run; every resource
    /// registered then gets a stopped endpoint with no devices, so it stays
    /// on the node (at 0 allocatable) until its plugin is back or the
    /// grace period ends. A checkpoint that cannot be read is logged and
    /// ignored, as kubelet does.
    pub(crate) fn read_checkpoint(&self, initially_running: BTreeSet<(String, String)>) {
        let path = self.checkpoint_path();
        let data = match checkpoint::read(&path) {
            Ok(Some(d)) => d,
            Ok(None) => {
                tracing::info!(path = %path.display(), "no device manager checkpoint");
                Default::default()
            }
            Err(e) => {
                tracing::error!(error = %e, "continue after failing to read checkpoint file; device allocation info may NOT be up-to-date");
                Default::default()
            }
        };
        let mut s = self.lock();
        s.protected = initially_running.iter().map(|(u, _)| u.clone()).collect();
        s.initially_running = initially_running;
        s.pod_devices = PodDevices::from_checkpoint(data.entries.as_deref().unwrap_or_default());
        s.allocated = s.pod_devices.devices();
        let now = Instant::now();
        for resource in data.registered.unwrap_or_default().into_keys() {
            s.healthy.insert(resource.clone(), BTreeSet::new());
            s.unhealthy.insert(resource.clone(), BTreeSet::new());
            s.endpoints.insert(
                resource,
                Endpoint {
                    client: None,
                    options: None,
                    stopped_at: Some(now),
                    generation: 0,
                    stop: None,
                },
            );
        }
    }

    /// `writeCheckpoint`.
    fn write_checkpoint(&self) {
        let data = {
            let s = self.lock();
            checkpoint::Data {
                entries: {
                    let e = s.pod_devices.to_checkpoint();
                    (!e.is_empty()).then_some(e)
                },
                registered: Some(
                    s.healthy
                        .iter()
                        .map(|(k, v)| (k.clone(), v.iter().cloned().collect()))
                        .collect(),
                ),
            }
        };
        if let Err(e) = checkpoint::write(&self.checkpoint_path(), &data) {
            tracing::error!(error = %e, "failed to write checkpoint file");
        }
    }

    /// `PluginConnected`: a new connection for `resource`; returns its
    /// generation.
    pub(crate) fn plugin_connected(&self, resource: &str, endpoint: Endpoint) -> u64 {
        let mut s = self.lock();
        s.next_generation += 1;
        let generation = s.next_generation;
        if let Some(old) = s.endpoints.get(resource).and_then(|e| e.stop.clone()) {
            old.cancel();
        }
        s.endpoints.insert(
            resource.to_string(),
            Endpoint {
                generation,
                ..endpoint
            },
        );
        tracing::info!(resource, "device plugin connected");
        generation
    }

    /// `PluginDisconnected`: every device unhealthy, the grace period
    /// starts. Only the connection `generation` (a newer one stays).
    pub(crate) fn plugin_disconnected(&self, resource: &str, generation: u64) {
        let mut s = self.lock();
        let Some(ep) = s.endpoints.get_mut(resource) else {
            return;
        };
        if ep.generation != generation || ep.stopped_at.is_some() {
            return;
        }
        ep.stopped_at = Some(Instant::now());
        let healthy = s.healthy.insert(resource.to_string(), BTreeSet::new());
        s.unhealthy
            .entry(resource.to_string())
            .or_default()
            .extend(healthy.unwrap_or_default());
        tracing::info!(
            resource,
            "device plugin disconnected; its devices are unhealthy"
        );
    }

    /// `DeRegisterPlugin`: ends the current connection of `resource`
    /// (which then counts as disconnected).
    pub(crate) fn disconnect(&self, resource: &str) {
        if let Some(stop) = self
            .lock()
            .endpoints
            .get(resource)
            .and_then(|e| e.stop.clone())
        {
            stop.cancel();
        }
    }

    /// `genericDeviceUpdateCallback`: a ListAndWatch answer from
    /// connection `generation`.
    pub(crate) fn devices_listed(&self, resource: &str, generation: u64, devices: Vec<Device>) {
        {
            let mut s = self.lock();
            if s.endpoints.get(resource).map(|e| e.generation) != Some(generation) {
                return;
            }
            let mut healthy = BTreeSet::new();
            let mut unhealthy = BTreeSet::new();
            let mut all = BTreeMap::new();
            for d in devices {
                if d.health == HEALTHY {
                    healthy.insert(d.id.clone());
                } else {
                    unhealthy.insert(d.id.clone());
                }
                all.insert(d.id.clone(), d);
            }
            tracing::info!(
                resource,
                total = all.len(),
                healthy = healthy.len(),
                "processed device updates for resource"
            );
            s.healthy.insert(resource.to_string(), healthy);
            s.unhealthy.insert(resource.to_string(), unhealthy);
            s.all_devices.insert(resource.to_string(), all);
        }
        self.write_checkpoint();
    }

    /// `GetCapacity`.
    pub fn capacity(&self) -> DeviceCapacity {
        let now = Instant::now();
        let mut out = DeviceCapacity::default();
        let removed: BTreeSet<String> = {
            let mut s = self.lock();
            let mut removed = BTreeSet::new();
            let gone = |s: &State, r: &str| match s.endpoints.get(r) {
                None => true,
                Some(e) => e.grace_expired(now),
            };
            for (r, devs) in &s.healthy {
                if gone(&s, r.as_str()) {
                    removed.insert(r.clone());
                } else {
                    let n = i64::try_from(devs.len()).unwrap_or(i64::MAX);
                    out.capacity.insert(r.clone(), n);
                    out.allocatable.insert(r.clone(), n);
                }
            }
            for (r, devs) in &s.unhealthy {
                if gone(&s, r.as_str()) {
                    removed.insert(r.clone());
                } else {
                    let n = i64::try_from(devs.len()).unwrap_or(i64::MAX);
                    *out.capacity.entry(r.clone()).or_default() += n;
                }
            }
            for r in &removed {
                s.endpoints.remove(r);
                s.healthy.remove(r);
                s.unhealthy.remove(r);
            }
            removed
        };
        if !removed.is_empty() {
            self.write_checkpoint();
        }
        out.removed = removed.into_iter().collect();
        out
    }

    /// `isDevicePluginResource`.
    fn is_device_plugin_resource(s: &State, resource: &str) -> bool {
        s.healthy.contains_key(resource) || s.allocated.contains_key(resource)
    }

    /// True when some device plugin serves `resource` (or served it to a
    /// container still holding devices).
    pub(crate) fn serves(&self, resource: &str) -> bool {
        Self::is_device_plugin_resource(&self.lock(), resource)
    }

    /// `UpdateAllocatedDevices`: devices of pods no longer active are free.
    pub(crate) fn update_allocated_devices(&self, active: &BTreeSet<String>) {
        let mut s = self.lock();
        s.protected.retain(|uid| !active.contains(uid));
        let gone: BTreeSet<String> = s
            .pod_devices
            .pods()
            .into_iter()
            .filter(|uid| !active.contains(uid) && !s.protected.contains(uid))
            .collect();
        if gone.is_empty() {
            return;
        }
        tracing::debug!(pods = ?gone, "pods to be removed from the device manager");
        s.pod_devices.delete(&gone);
        s.allocated = s.pod_devices.devices();
    }

    /// `Allocate` for one container at admission: init containers' devices
    /// may be reused by the containers after them (restartable init
    /// containers keep theirs). `active`: the UIDs of the pods the node
    /// runs, this one included.
    pub(crate) async fn allocate(
        &self,
        pod: &Pod,
        container: &Container,
        is_init: bool,
        restartable_init: bool,
        active: Option<&BTreeSet<String>>,
    ) -> Result<(), DeviceError> {
        let uid = podutil::uid(pod).to_string();
        let mut reuse = {
            let mut s = self.lock();
            match s.reuse.take() {
                Some((u, r)) if u == uid => r,
                _ => BTreeMap::new(),
            }
        };
        let result = self
            .allocate_container_resources(pod, container, &reuse, active)
            .await;
        if result.is_ok() {
            let s = self.lock();
            for (resource, devs) in s
                .pod_devices
                .container(&uid, &container.name)
                .into_iter()
                .flatten()
            {
                let entry = reuse.entry(resource.clone()).or_default();
                if is_init && !restartable_init {
                    // addContainerAllocatedResources
                    entry.extend(devs.devices());
                } else {
                    // removeContainerAllocatedResources
                    for d in devs.devices() {
                        entry.remove(&d);
                    }
                }
            }
        }
        self.lock().reuse = Some((uid, reuse));
        result
    }

    /// `allocateContainerResources`.
    async fn allocate_container_resources(
        &self,
        pod: &Pod,
        container: &Container,
        reuse: &BTreeMap<String, BTreeSet<String>>,
        active: Option<&BTreeSet<String>>,
    ) -> Result<(), DeviceError> {
        let uid = podutil::uid(pod);
        let mut updated = false;
        let mut checkpoint = false;
        let limits = container
            .resources
            .as_ref()
            .and_then(|r| r.limits.clone())
            .unwrap_or_default();
        for (resource, q) in &limits {
            if !self.serves(resource) {
                continue;
            }
            let needed = keelson_common::quantity::Quantity::parse(&q.0)
                .map(|v| v.value())
                .unwrap_or(0);
            let needed = usize::try_from(needed).unwrap_or(0);
            if !updated {
                if let Some(active) = active {
                    self.update_allocated_devices(active);
                }
                updated = true;
            }
            let empty = BTreeSet::new();
            let Some(devs) = self.devices_to_allocate(
                uid,
                &container.name,
                resource,
                needed,
                reuse.get(resource).unwrap_or(&empty),
            )?
            else {
                continue;
            };
            checkpoint = true;
            let endpoint = self.lock().endpoints.get(resource).cloned();
            let Some(endpoint) = endpoint else {
                let mut s = self.lock();
                s.allocated = s.pod_devices.devices();
                return Err(DeviceError::UnknownPlugin(resource.clone()));
            };
            tracing::debug!(%resource, devices = ?devs, pod = %podutil::key(pod), container = %container.name, "making allocation request for device plugin");
            let resp = match endpoint
                .allocate(resource, devs.iter().cloned().collect())
                .await
            {
                Ok(r) => r,
                Err(e) => {
                    let mut s = self.lock();
                    s.allocated = s.pod_devices.devices();
                    return Err(e);
                }
            };
            let Some(first) = resp.container_responses.into_iter().next() else {
                return Err(DeviceError::NoContainerResponse);
            };
            let mut s = self.lock();
            let mut per_numa: BTreeMap<i64, Vec<String>> = BTreeMap::new();
            for d in &devs {
                let nodes = s
                    .all_devices
                    .get(resource)
                    .and_then(|all| all.get(d))
                    .and_then(|dev| dev.topology.as_ref())
                    .map(|t| t.nodes.iter().map(|n| n.id).collect::<Vec<_>>())
                    .unwrap_or_default();
                if nodes.is_empty() {
                    per_numa
                        .entry(NODE_WITHOUT_TOPOLOGY)
                        .or_default()
                        .push(d.clone());
                }
                for n in nodes {
                    per_numa.entry(n).or_default().push(d.clone());
                }
            }
            s.pod_devices.insert(
                uid,
                &container.name,
                resource,
                Allocation {
                    device_ids: per_numa,
                    response: first,
                },
            );
        }
        if checkpoint {
            self.write_checkpoint();
        }
        Ok(())
    }

    /// `devicesToAllocate`: `Ok(None)` when nothing is to be asked of the
    /// plugin. Devices are taken in ID order (kubelet takes them in Go's
    /// set order; no `GetPreferredAllocation`, no topology).
    fn devices_to_allocate(
        &self,
        uid: &str,
        container: &str,
        resource: &str,
        required: usize,
        reusable: &BTreeSet<String>,
    ) -> Result<Option<BTreeSet<String>>, DeviceError> {
        let mut s = self.lock();
        let mut needed = required;
        let existing = s.pod_devices.container_devices(uid, container, resource);
        if let Some(devs) = &existing {
            if devs.len() != required {
                return Err(DeviceError::RequestChanged {
                    uid: uid.to_string(),
                    container: container.to_string(),
                    resource: resource.to_string(),
                    from: devs.len(),
                    to: required,
                });
            }
            needed = 0;
        }
        if s.initially_running
            .contains(&(uid.to_string(), container.to_string()))
        {
            // kubelet: sources not ready yet and the container already
            // running (a restart): nothing to do.
            return Ok(None);
        }
        let Some(healthy) = s.healthy.get(resource).cloned() else {
            return Err(DeviceError::Unregistered(resource.to_string()));
        };
        if healthy.is_empty() {
            return Err(DeviceError::NoHealthy(resource.to_string()));
        }
        if let Some(devs) = &existing
            && !devs.is_subset(&healthy)
        {
            return Err(DeviceError::NoLongerHealthy(resource.to_string()));
        }
        if needed == 0 {
            return Ok(None);
        }
        let mut allocated = BTreeSet::new();
        let in_use = s.allocated.entry(resource.to_string()).or_default();
        for d in reusable {
            if needed == 0 {
                break;
            }
            in_use.insert(d.clone());
            allocated.insert(d.clone());
            needed -= 1;
        }
        if needed == 0 {
            return Ok(Some(allocated));
        }
        let available: Vec<String> = healthy
            .iter()
            .filter(|d| !in_use.contains(*d))
            .cloned()
            .collect();
        if available.len() < needed {
            return Err(DeviceError::Unavailable {
                resource: resource.to_string(),
                requested: needed,
                available: available.len(),
            });
        }
        for d in available.into_iter().take(needed) {
            in_use.insert(d.clone());
            allocated.insert(d);
        }
        Ok(Some(allocated))
    }

    /// `GetDeviceRunContainerOptions`, at container start: PreStartContainer
    /// for plugins that ask for it, a new allocation when the checkpoint
    /// lost this container's, then what the runtime gets. The re-allocation
    /// leaves other pods' devices alone (kubelet would first free those of
    /// pods no longer active).
    pub(crate) async fn run_container_options(
        &self,
        pod: &Pod,
        container: &Container,
        is_init: bool,
        restartable_init: bool,
    ) -> Result<Option<RunContainerOptions>, DeviceError> {
        let uid = podutil::uid(pod).to_string();
        let limits = container
            .resources
            .as_ref()
            .and_then(|r| r.limits.clone())
            .unwrap_or_default();
        let mut reallocate = false;
        for (resource, q) in &limits {
            let zero = keelson_common::quantity::Quantity::parse(&q.0)
                .map(|v| v.value() == 0)
                .unwrap_or(true);
            if !self.serves(resource) || zero {
                continue;
            }
            self.pre_start_if_needed(&uid, &container.name, resource)
                .await?;
            if self
                .lock()
                .pod_devices
                .container_devices(&uid, &container.name, resource)
                .is_none()
            {
                reallocate = true;
            }
        }
        if reallocate {
            tracing::info!(pod = %podutil::key(pod), container = %container.name, "needs to re-allocate device plugin resources for pod");
            self.allocate(pod, container, is_init, restartable_init, None)
                .await?;
        }
        Ok(self
            .lock()
            .pod_devices
            .run_container_options(&uid, &container.name))
    }

    /// `callPreStartContainerIfNeeded`.
    async fn pre_start_if_needed(
        &self,
        uid: &str,
        container: &str,
        resource: &str,
    ) -> Result<(), DeviceError> {
        let (endpoint, devices) = {
            let s = self.lock();
            let Some(ep) = s.endpoints.get(resource).cloned() else {
                return Err(DeviceError::EndpointNotCached(resource.to_string()));
            };
            if !ep.options.as_ref().is_some_and(|o| o.pre_start_required) {
                return Ok(());
            }
            let Some(devs) = s.pod_devices.container_devices(uid, container, resource) else {
                return Err(DeviceError::NotAllocated {
                    uid: uid.to_string(),
                    container: container.to_string(),
                    resource: resource.to_string(),
                });
            };
            (ep, devs)
        };
        endpoint
            .pre_start(resource, devices.into_iter().collect())
            .await
            .map_err(|e| DeviceError::PreStart(Box::new(e)))
    }

    /// `sanitizeNodeAllocatable` (via `UpdatePluginResources`): for a pod
    /// holding devices, the resources whose allocated devices exceed the
    /// node's allocatable (`have`), with the count to use instead, so the
    /// fit check passes for what is already allocated.
    pub(crate) fn sanitize_allocatable(
        &self,
        uid: &str,
        have: impl Fn(&str) -> Option<i64>,
    ) -> BTreeMap<String, i64> {
        let s = self.lock();
        let mut out = BTreeMap::new();
        if !s.pod_devices.has_pod(uid) {
            return out;
        }
        for (resource, devs) in &s.allocated {
            let needed = i64::try_from(devs.len()).unwrap_or(i64::MAX);
            if have(resource.as_str()).is_none_or(|q| q < needed) {
                out.insert(resource.clone(), needed);
            }
        }
        out
    }

    /// `GetAllocatableDevices`: resource → healthy device → its NUMA nodes.
    pub(crate) fn allocatable_devices(&self) -> BTreeMap<String, BTreeMap<String, Vec<i64>>> {
        let s = self.lock();
        let mut out = BTreeMap::new();
        for (resource, healthy) in &s.healthy {
            let Some(all) = s.all_devices.get(resource) else {
                continue;
            };
            let devs: BTreeMap<String, Vec<i64>> = all
                .iter()
                .filter(|(id, _)| healthy.contains(*id))
                .map(|(id, d)| {
                    let nodes = d
                        .topology
                        .as_ref()
                        .map(|t| t.nodes.iter().map(|n| n.id).collect())
                        .unwrap_or_default();
                    (id.clone(), nodes)
                })
                .collect();
            out.insert(resource.clone(), devs);
        }
        out
    }

    /// `GetDevices`: one container's devices by resource, with NUMA nodes.
    pub(crate) fn container_devices(
        &self,
        uid: &str,
        container: &str,
    ) -> BTreeMap<String, BTreeMap<String, Vec<i64>>> {
        self.lock().pod_devices.container_device_ids(uid, container)
    }

    /// The registered resource names (for tests and diagnostics).
    pub fn resources(&self) -> Vec<String> {
        self.lock().healthy.keys().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn device(id: &str, healthy: bool) -> Device {
        Device {
            id: id.into(),
            health: if healthy { "Healthy" } else { "Unhealthy" }.into(),
            topology: None,
        }
    }

    fn manager() -> (tempfile::TempDir, DeviceManager) {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let m = DeviceManager::new(dir.path().to_path_buf());
        (dir, m)
    }

    fn endpoint() -> Endpoint {
        Endpoint {
            client: None,
            options: None,
            stopped_at: None,
            generation: 0,
            stop: None,
        }
    }

    #[test]
    fn unhealthy_devices_count_in_capacity_not_allocatable() {
        let (_d, m) = manager();
        let g = m.plugin_connected("example.com/r", endpoint());
        m.devices_listed(
            "example.com/r",
            g,
            vec![device("a", true), device("b", false)],
        );
        let c = m.capacity();
        assert_eq!(c.capacity.get("example.com/r"), Some(&2));
        assert_eq!(c.allocatable.get("example.com/r"), Some(&1));
        // Disconnected: all unhealthy, still in capacity during the grace.
        m.plugin_disconnected("example.com/r", g);
        let c = m.capacity();
        assert_eq!(c.capacity.get("example.com/r"), Some(&2));
        assert_eq!(c.allocatable.get("example.com/r"), Some(&0));
        assert!(c.removed.is_empty());
        // A stale connection's end does not touch a newer one.
        let g2 = m.plugin_connected("example.com/r", endpoint());
        m.plugin_disconnected("example.com/r", g);
        m.devices_listed("example.com/r", g2, vec![device("a", true)]);
        assert_eq!(m.capacity().allocatable.get("example.com/r"), Some(&1));
    }

    #[test]
    fn the_checkpoint_keeps_registered_resources_and_allocations() {
        let (_d, m) = manager();
        let g = m.plugin_connected("example.com/r", endpoint());
        m.devices_listed("example.com/r", g, vec![device("a", true)]);
        {
            let mut s = m.lock();
            s.pod_devices.insert(
                "uid",
                "c",
                "example.com/r",
                Allocation {
                    device_ids: BTreeMap::from([(-1, vec!["a".to_string()])]),
                    response: Default::default(),
                },
            );
        }
        m.write_checkpoint();
        let again = DeviceManager::new(m.dir().to_path_buf());
        again.read_checkpoint(BTreeSet::new());
        let c = again.capacity();
        assert_eq!(c.capacity.get("example.com/r"), Some(&0));
        assert_eq!(c.allocatable.get("example.com/r"), Some(&0));
        assert_eq!(
            again
                .container_devices("uid", "c")
                .get("example.com/r")
                .map(|d| d.len()),
            Some(1)
        );
        // No healthy device: a new container is refused as kubelet does.
        let err = again
            .devices_to_allocate("uid2", "c", "example.com/r", 1, &BTreeSet::new())
            .err()
            .map(|e| e.to_string());
        assert_eq!(
            err.as_deref(),
            Some("no healthy devices present; cannot allocate unhealthy devices example.com/r")
        );
    }

    #[test]
    fn pods_running_at_start_keep_devices_until_admitted_again() {
        let (_d, m) = manager();
        {
            let mut s = m.lock();
            for uid in ["a", "b"] {
                s.pod_devices.insert(
                    uid,
                    "c",
                    "example.com/r",
                    Allocation {
                        device_ids: BTreeMap::from([(-1, vec![format!("dev-{uid}")])]),
                        response: Default::default(),
                    },
                );
            }
        }
        m.write_checkpoint();
        let again = DeviceManager::new(m.dir().to_path_buf());
        again.read_checkpoint(BTreeSet::from([
            ("a".to_string(), "c".to_string()),
            ("b".to_string(), "c".to_string()),
        ]));
        // "a" is admitted first: "b" (not yet admitted) keeps its device.
        again.update_allocated_devices(&BTreeSet::from(["a".to_string()]));
        assert_eq!(again.container_devices("b", "c").len(), 1);
        // Once seen active, a pod that goes away frees its devices.
        again.update_allocated_devices(&BTreeSet::from(["a".to_string(), "b".to_string()]));
        again.update_allocated_devices(&BTreeSet::from(["a".to_string()]));
        assert!(again.container_devices("b", "c").is_empty());
    }

    #[test]
    fn allocation_takes_free_healthy_devices() {
        let (_d, m) = manager();
        let g = m.plugin_connected("example.com/r", endpoint());
        m.devices_listed(
            "example.com/r",
            g,
            vec![device("a", true), device("b", true), device("c", false)],
        );
        let got = m
            .devices_to_allocate("u", "c", "example.com/r", 2, &BTreeSet::new())
            .ok()
            .flatten();
        assert_eq!(got.map(|s| s.len()), Some(2));
        let err = m
            .devices_to_allocate("u2", "c", "example.com/r", 1, &BTreeSet::new())
            .err()
            .map(|e| e.to_string());
        assert_eq!(
            err.as_deref(),
            Some(
                "requested number of devices unavailable for example.com/r. Requested: 1, Available: 0"
            )
        );
        assert_eq!(
            m.devices_to_allocate("u", "c", "other.com/r", 1, &BTreeSet::new())
                .err()
                .map(|e| e.to_string())
                .as_deref(),
            Some("cannot allocate unregistered device other.com/r")
        );
    }
}
