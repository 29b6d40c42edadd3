//! Devices allocated to containers and what the plugins answered for them
//! (`pkg/kubelet/cm/devicemanager/pod_devices.go`): pod UID → container →
//! resource → device IDs (per NUMA node) and the `ContainerAllocateResponse`.

use std::collections::{BTreeMap, BTreeSet};

use keelson_cri::kubelet_api::deviceplugin::ContainerAllocateResponse;
use prost::Message as _;

use super::checkpoint::Entry;

/// `nodeWithoutTopology`: the NUMA key of devices that report none.
pub(crate) const NODE_WITHOUT_TOPOLOGY: i64 = -1;

/// One container's allocation of one resource (`deviceAllocateInfo`).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Allocation {
    /// Device IDs per NUMA node.
    pub(crate) device_ids: BTreeMap<i64, Vec<String>>,
    /// What the plugin's Allocate answered.
    pub(crate) response: ContainerAllocateResponse,
}

impl Allocation {
    /// Every device ID, whatever its NUMA node.
    pub(crate) fn devices(&self) -> BTreeSet<String> {
        self.device_ids.values().flatten().cloned().collect()
    }
}

/// What the runtime gets for a container from its devices
/// (`DeviceRunContainerOptions`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunContainerOptions {
    /// Environment variables, before the container's own.
    pub envs: Vec<(String, String)>,
    /// `(container path, host path, readonly)`.
    pub mounts: Vec<(String, String, bool)>,
    /// `(container path, host path, permissions)`.
    pub devices: Vec<(String, String, String)>,
    /// Annotations on the container.
    pub annotations: Vec<(String, String)>,
    /// Fully qualified CDI device names.
    pub cdi_devices: Vec<String>,
}

/// pod UID → container → resource → allocation.
#[derive(Debug, Default, Clone)]
pub(crate) struct PodDevices {
    devs: BTreeMap<String, BTreeMap<String, BTreeMap<String, Allocation>>>,
}

impl PodDevices {
    /// `hasPod`.
    pub(crate) fn has_pod(&self, uid: &str) -> bool {
        self.devs.contains_key(uid)
    }

    /// `pods`.
    pub(crate) fn pods(&self) -> BTreeSet<String> {
        self.devs.keys().cloned().collect()
    }

    /// `insert`.
    pub(crate) fn insert(&mut self, uid: &str, container: &str, resource: &str, a: Allocation) {
        self.devs
            .entry(uid.to_string())
            .or_default()
            .entry(container.to_string())
            .or_default()
            .insert(resource.to_string(), a);
    }

    /// `delete`.
    pub(crate) fn delete(&mut self, uids: &BTreeSet<String>) {
        self.devs.retain(|uid, _| !uids.contains(uid));
    }

    /// `containerDevices`: the devices of one container and resource.
    pub(crate) fn container_devices(
        &self,
        uid: &str,
        container: &str,
        resource: &str,
    ) -> Option<BTreeSet<String>> {
        self.devs
            .get(uid)?
            .get(container)?
            .get(resource)
            .map(Allocation::devices)
    }

    /// Every allocation of one container, by resource.
    pub(crate) fn container(
        &self,
        uid: &str,
        container: &str,
    ) -> Option<&BTreeMap<String, Allocation>> {
        self.devs.get(uid)?.get(container)
    }

    /// `devices`: resource → every device some container holds. Regular
    /// containers' and init containers' devices are both in use: kubelet
    /// lets regular containers reuse an init container's devices through
    /// `devicesToReuse` at allocation time, not here.
    pub(crate) fn devices(&self) -> BTreeMap<String, BTreeSet<String>> {
        let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for containers in self.devs.values() {
            for resources in containers.values() {
                for (resource, a) in resources {
                    out.entry(resource.clone()).or_default().extend(a.devices());
                }
            }
        }
        out
    }

    /// `toCheckpointData`.
    pub(crate) fn to_checkpoint(&self) -> Vec<Entry> {
        let mut out = Vec::new();
        for (uid, containers) in &self.devs {
            for (name, resources) in containers {
                for (resource, a) in resources {
                    out.push(Entry {
                        pod_uid: uid.clone(),
                        container_name: name.clone(),
                        resource_name: resource.clone(),
                        device_ids: a.device_ids.clone(),
                        alloc_resp: a.response.encode_to_vec(),
                    });
                }
            }
        }
        out
    }

    /// `fromCheckpointData`: entries whose response does not decode are
    /// skipped, as kubelet does.
    pub(crate) fn from_checkpoint(entries: &[Entry]) -> Self {
        let mut out = PodDevices::default();
        for e in entries {
            match ContainerAllocateResponse::decode(e.alloc_resp.as_slice()) {
                Ok(response) => out.insert(
                    &e.pod_uid,
                    &e.container_name,
                    &e.resource_name,
                    Allocation {
                        device_ids: e.device_ids.clone(),
                        response,
                    },
                ),
                Err(err) => tracing::error!(
                    pod_uid = %e.pod_uid, container = %e.container_name, resource = %e.resource_name,
                    error = %err, "can't unmarshal allocResp"
                ),
            }
        }
        out
    }

    /// `deviceRunContainerOptions`: the responses of every resource merged,
    /// the first value of an env, device, mount or annotation winning.
    pub(crate) fn run_container_options(
        &self,
        uid: &str,
        container: &str,
    ) -> Option<RunContainerOptions> {
        let resources = self.container(uid, container)?;
        let mut opts = RunContainerOptions::default();
        let mut envs = BTreeMap::new();
        let mut devs = BTreeMap::new();
        let mut mounts = BTreeMap::new();
        let mut annotations = BTreeMap::new();
        let mut cdi = BTreeSet::new();
        for (resource, a) in resources {
            let r = &a.response;
            // Go ranges over maps in random order; keelson in key order.
            let sorted: BTreeMap<_, _> = r.envs.iter().collect();
            for (k, v) in sorted {
                if let Some(e) = envs.get(k) {
                    if e != v {
                        tracing::error!(%resource, key = %k, "environment variable has conflicting setting");
                    }
                    continue;
                }
                envs.insert(k.clone(), v.clone());
                opts.envs.push((k.clone(), v.clone()));
            }
            for d in &r.devices {
                if let Some(h) = devs.get(&d.container_path) {
                    if *h != d.host_path {
                        tracing::error!(%resource, path = %d.container_path, "container device has conflicting mapping host devices");
                    }
                    continue;
                }
                devs.insert(d.container_path.clone(), d.host_path.clone());
                opts.devices.push((
                    d.container_path.clone(),
                    d.host_path.clone(),
                    d.permissions.clone(),
                ));
            }
            for m in &r.mounts {
                if let Some(h) = mounts.get(&m.container_path) {
                    if *h != m.host_path {
                        tracing::error!(%resource, path = %m.container_path, "container mount has conflicting mapping host mounts");
                    }
                    continue;
                }
                mounts.insert(m.container_path.clone(), m.host_path.clone());
                opts.mounts
                    .push((m.container_path.clone(), m.host_path.clone(), m.read_only));
            }
            let sorted: BTreeMap<_, _> = r.annotations.iter().collect();
            for (k, v) in sorted {
                if let Some(e) = annotations.get(k) {
                    if e != v {
                        tracing::error!(%resource, key = %k, "annotation has conflicting setting");
                    }
                    continue;
                }
                annotations.insert(k.clone(), v.clone());
                opts.annotations.push((k.clone(), v.clone()));
            }
            for c in &r.cdi_devices {
                if cdi.insert(c.name.clone()) {
                    opts.cdi_devices.push(c.name.clone());
                }
            }
        }
        Some(opts)
    }

    /// `getContainerDevices`: resource → device IDs with their NUMA nodes
    /// (for the pod-resources API).
    pub(crate) fn container_device_ids(
        &self,
        uid: &str,
        container: &str,
    ) -> BTreeMap<String, BTreeMap<String, Vec<i64>>> {
        let mut out = BTreeMap::new();
        let Some(resources) = self.container(uid, container) else {
            return out;
        };
        for (resource, a) in resources {
            if a.device_ids.is_empty() {
                continue;
            }
            let mut ids: BTreeMap<String, Vec<i64>> = BTreeMap::new();
            for (numa, list) in &a.device_ids {
                for id in list {
                    let nodes = ids.entry(id.clone()).or_default();
                    if *numa != NODE_WITHOUT_TOPOLOGY {
                        nodes.push(*numa);
                    }
                }
            }
            out.insert(resource.clone(), ids);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use keelson_cri::kubelet_api::deviceplugin::{CdiDevice, DeviceSpec, Mount};

    fn alloc(ids: &[&str], response: ContainerAllocateResponse) -> Allocation {
        Allocation {
            device_ids: BTreeMap::from([(
                NODE_WITHOUT_TOPOLOGY,
                ids.iter().map(|s| s.to_string()).collect(),
            )]),
            response,
        }
    }

    #[test]
    fn merges_responses_first_value_wins() {
        let mut p = PodDevices::default();
        let a = ContainerAllocateResponse {
            envs: [("A".to_string(), "1".to_string())].into(),
            mounts: vec![Mount {
                container_path: "/tmp/Dev-1".into(),
                host_path: "/tmp/Dev-1".into(),
                read_only: false,
            }],
            devices: vec![DeviceSpec {
                container_path: "/dev/x".into(),
                host_path: "/dev/x0".into(),
                permissions: "rw".into(),
            }],
            annotations: [("k".to_string(), "v".to_string())].into(),
            cdi_devices: vec![CdiDevice {
                name: "example.com/resource=a".into(),
            }],
        };
        let mut b = a.clone();
        b.envs.insert("A".into(), "2".into());
        b.envs.insert("B".into(), "3".into());
        p.insert("u", "c", "a.com/r", alloc(&["1"], a));
        p.insert("u", "c", "b.com/r", alloc(&["2"], b));
        let o = p.run_container_options("u", "c").unwrap_or_default();
        assert_eq!(
            o.envs,
            vec![("A".into(), "1".into()), ("B".into(), "3".into())]
        );
        assert_eq!(o.mounts.len(), 1);
        assert_eq!(o.devices.len(), 1);
        assert_eq!(o.annotations.len(), 1);
        assert_eq!(o.cdi_devices, vec!["example.com/resource=a".to_string()]);
        assert!(p.run_container_options("u", "other").is_none());
    }

    #[test]
    fn checkpoint_entries_round_trip() {
        let mut p = PodDevices::default();
        p.insert(
            "u",
            "c",
            "example.com/resource",
            alloc(&["Dev-1"], ContainerAllocateResponse::default()),
        );
        let entries = p.to_checkpoint();
        let back = PodDevices::from_checkpoint(&entries);
        assert_eq!(
            back.container_devices("u", "c", "example.com/resource"),
            Some(BTreeSet::from(["Dev-1".to_string()]))
        );
        assert_eq!(
            back.devices().get("example.com/resource").map(|s| s.len()),
            Some(1)
        );
    }
}
