//! kubelet's node status setters, in kubelet's order, applied to a Node
//! from what was observed this round. Pure: every input is in
//! [`Observed`], so the whole status computation is tested with tables.

use k8s_openapi::api::core::v1::{
    DaemonEndpoint, Node, NodeDaemonEndpoints, NodeFeatures, NodeRuntimeHandler,
    NodeRuntimeHandlerFeatures, NodeStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::addresses::{AddressInputs, set_node_addresses};
use super::capacity::{CapacityInputs, Reserved, set_capacity};
use super::conditions::{NodeEvent, Pressure, set_pressure, set_ready};
use super::host::{MachineInfo, VersionInfo};
use super::images::node_images;
use super::node_info::{NodeInfoInputs, set_node_info};
use super::runtime::RuntimeHandler;
use crate::config::eviction::Threshold;

/// The port reported in `daemonEndpoints.kubeletEndpoint` (kubelet's default `port`).
pub const KUBELET_PORT: i32 = 10250;

/// Pressure flags from the eviction manager.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PressureFlags {
    /// Under memory pressure.
    pub memory: bool,
    /// Under disk pressure.
    pub disk: bool,
    /// Under PID pressure.
    pub pid: bool,
}

/// Settings of the setters that do not change while running.
#[derive(Debug, Clone)]
pub struct SetterConfig {
    /// Node (and host) name.
    pub node_name: String,
    /// `nodeIP`.
    pub node_ip: Option<std::net::IpAddr>,
    /// `maxPods`.
    pub max_pods: i32,
    /// `nodeStatusMaxImages`.
    pub max_images: i32,
    /// Parsed `systemReserved`.
    pub system_reserved: Reserved,
    /// Parsed `kubeReserved`.
    pub kube_reserved: Reserved,
    /// Eviction thresholds.
    pub thresholds: Vec<Threshold>,
    /// Reported `kubeletVersion`.
    pub kubelet_version: String,
    /// Reported kubelet port.
    pub kubelet_port: i32,
    /// `cloudProvider: external`: the addresses are the cloud controller
    /// manager's.
    pub external_cloud_provider: bool,
}

/// Everything observed for one status computation.
#[derive(Debug, Clone)]
pub struct Observed {
    /// The time stamped on conditions (whole seconds, as the API keeps them).
    pub now: Time,
    /// Machine facts, when readable.
    pub machine: Option<MachineInfo>,
    /// Kernel/OS facts, when readable.
    pub version: Option<VersionInfo>,
    /// Size of the root dir's filesystem, when readable.
    pub ephemeral_storage: Option<u64>,
    /// Runtime name from the last successful Version call.
    pub runtime_name: Option<String>,
    /// Runtime version from this round's Version call.
    pub runtime_version: Option<String>,
    /// Images, sorted largest first; `Err` when listing failed.
    pub images: Result<Vec<keelson_cri::api::Image>, super::call::CallError>,
    /// Host interface addresses, when listable.
    pub interface_addresses: Option<Vec<std::net::IpAddr>>,
    /// Default-route source address.
    pub default_route_ip: Option<std::net::IpAddr>,
    /// Runtime errors (runtime down, not ready, failing health checks).
    pub runtime_errors: Vec<String>,
    /// Network errors.
    pub network_errors: Vec<String>,
    /// Storage errors.
    pub storage_errors: Vec<String>,
    /// The graceful node shutdown manager's error (`node is shutting down`).
    pub shutdown_error: Option<String>,
    /// Runtime handlers.
    pub runtime_handlers: Vec<RuntimeHandler>,
    /// Runtime support of `supplementalGroupsPolicy`, if reported.
    pub supplemental_groups_policy: Option<bool>,
    /// Pressure from the eviction manager.
    pub pressure: PressureFlags,
    /// The device plugins' resources.
    pub devices: Option<crate::devices::DeviceCapacity>,
    /// `volumesInUse` from the volume manager; `None` until it synced
    /// (the Node's list stays as it is).
    pub volumes_in_use: Option<Vec<String>>,
}

/// What applying the setters produced besides the changed Node.
#[derive(Debug, Default)]
pub struct SetterOutcome {
    /// Events to record about the node.
    pub events: Vec<NodeEvent>,
    /// Setter errors (logged; they do not stop the others).
    pub errors: Vec<String>,
}

/// Applies every setter to `node`.
pub fn apply(node: &mut Node, cfg: &SetterConfig, obs: &Observed) -> SetterOutcome {
    let mut out = SetterOutcome::default();

    // NodeAddress
    if let Err(e) = set_node_addresses(
        node,
        &AddressInputs {
            hostname: &cfg.node_name,
            configured_ip: cfg.node_ip,
            interface_addresses: obs.interface_addresses.as_deref(),
            default_route_ip: obs.default_route_ip,
        },
        cfg.external_cloud_provider,
    ) {
        out.errors.push(e.to_string());
    }
    let status = node.status.get_or_insert_with(NodeStatus::default);

    // MachineInfo
    let capacity = status.capacity.get_or_insert_with(Default::default);
    let allocatable = status.allocatable.get_or_insert_with(Default::default);
    set_capacity(
        capacity,
        allocatable,
        &CapacityInputs {
            machine: obs.machine.as_ref(),
            ephemeral_storage: obs.ephemeral_storage,
            max_pods: cfg.max_pods,
            system_reserved: &cfg.system_reserved,
            kube_reserved: &cfg.kube_reserved,
            thresholds: &cfg.thresholds,
            devices: obs.devices.as_ref(),
        },
    );
    if obs.machine.is_none() {
        out.errors.push("error getting machine info".to_string());
    }

    // MachineInfo (identity), VersionInfo, GoRuntime
    let info = status.node_info.get_or_insert_with(Default::default);
    if let Some(ev) = set_node_info(
        info,
        &NodeInfoInputs {
            node_name: &cfg.node_name,
            machine: obs.machine.as_ref(),
            version: obs.version.as_ref(),
            runtime_name: obs.runtime_name.as_deref(),
            runtime_version: obs.runtime_version.as_deref(),
            kubelet_version: &cfg.kubelet_version,
        },
    ) {
        out.events.push(ev);
    }
    if obs.version.is_none() {
        out.errors.push("error getting version info".to_string());
    }

    // DaemonEndpoints
    status.daemon_endpoints = Some(NodeDaemonEndpoints {
        kubelet_endpoint: Some(DaemonEndpoint {
            port: cfg.kubelet_port,
        }),
    });

    // Images
    match &obs.images {
        Ok(images) => status.images = Some(node_images(images, cfg.max_images)),
        Err(e) => {
            status.images = None;
            out.errors.push(format!("error getting image list: {e}"));
        }
    }

    // RuntimeHandlers
    status.runtime_handlers = if obs.runtime_handlers.is_empty() {
        None
    } else {
        Some(
            obs.runtime_handlers
                .iter()
                .map(|h| NodeRuntimeHandler {
                    name: Some(h.name.clone()),
                    features: Some(NodeRuntimeHandlerFeatures {
                        recursive_read_only_mounts: Some(h.recursive_read_only_mounts),
                        user_namespaces: Some(h.user_namespaces),
                    }),
                })
                .collect(),
        )
    };

    // DeclaredFeatures (NodeDeclaredFeatures, on in v1.36): what keelson
    // implements of upstream's registry, so that the scheduler places
    // pods needing them here (`setNodeStatus`); sorted, as the API server
    // requires.
    let mut declared: Vec<String> = super::features::DECLARED
        .iter()
        .map(|f| f.to_string())
        .collect();
    declared.sort();
    status.declared_features = Some(declared);

    // NodeFeatures
    if let Some(sgp) = obs.supplemental_groups_policy {
        status.features = Some(NodeFeatures {
            supplemental_groups_policy: Some(sgp),
        });
    }

    // VolumesInUse (setters.go `VolumesInUse`: only once the volume
    // manager's reconciler synced; an empty list is no list).
    if let Some(v) = &obs.volumes_in_use {
        status.volumes_in_use = if v.is_empty() { None } else { Some(v.clone()) };
    }

    // Conditions: MemoryPressure, DiskPressure, PIDPressure, Ready.
    let capacity_now = status.capacity.clone().unwrap_or_default();
    let conditions = status.conditions.get_or_insert_with(Vec::new);
    for (which, flag) in [
        (Pressure::Memory, obs.pressure.memory),
        (Pressure::Disk, obs.pressure.disk),
        (Pressure::Pid, obs.pressure.pid),
    ] {
        out.events
            .extend(set_pressure(conditions, which, flag, &obs.now));
    }
    let mut errors = obs.runtime_errors.clone();
    errors.extend(obs.network_errors.iter().cloned());
    errors.extend(obs.storage_errors.iter().cloned());
    errors.extend(obs.shutdown_error.iter().cloned());
    out.events
        .extend(set_ready(conditions, errors, &capacity_now, &obs.now));
    out
}

/// `now` truncated to whole seconds, as the API stores `Time`.
pub fn now_seconds() -> Time {
    let now = jiff::Timestamp::now();
    Time(jiff::Timestamp::from_second(now.as_second()).unwrap_or(now))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::eviction::{default_eviction_hard, parse_thresholds};
    use crate::status::host::HugePages;
    use std::collections::BTreeMap;

    pub(crate) fn setter_config() -> SetterConfig {
        SetterConfig {
            node_name: "n1".into(),
            node_ip: Some("10.0.0.5".parse().expect("ip")),
            max_pods: 110,
            max_images: 50,
            system_reserved: Reserved::new(),
            kube_reserved: Reserved::new(),
            thresholds: parse_thresholds(
                &default_eviction_hard(),
                &BTreeMap::new(),
                &BTreeMap::new(),
                &BTreeMap::new(),
            )
            .expect("defaults"),
            kubelet_version: "v1.36.0".into(),
            kubelet_port: KUBELET_PORT,
            external_cloud_provider: false,
        }
    }

    pub(crate) fn observed(secs: i64) -> Observed {
        Observed {
            now: Time(jiff::Timestamp::from_second(secs).expect("ts")),
            machine: Some(MachineInfo {
                num_cores: 2,
                memory_capacity: 4 * 1024 * 1024 * 1024,
                hugepages: vec![HugePages {
                    page_size_kib: 2048,
                    num_pages: 0,
                }],
                machine_id: "mid".into(),
                system_uuid: "uuid".into(),
                boot_id: "boot".into(),
                swap_capacity: 0,
            }),
            version: Some(VersionInfo {
                kernel_version: "6.1.0".into(),
                os_image: "Debian GNU/Linux 12 (bookworm)".into(),
            }),
            ephemeral_storage: Some(100 * 1024 * 1024 * 1024),
            runtime_name: Some("containerd".into()),
            runtime_version: Some("1.6.20~ds1".into()),
            images: Ok(vec![keelson_cri::api::Image {
                id: "sha256:1".into(),
                repo_tags: vec!["keelson.local/busybox:1".into()],
                size: 1000,
                ..Default::default()
            }]),
            interface_addresses: Some(vec!["10.0.0.5".parse().expect("ip")]),
            default_route_ip: None,
            runtime_errors: vec![],
            network_errors: vec![],
            storage_errors: vec![],
            shutdown_error: None,
            runtime_handlers: vec![],
            supplemental_groups_policy: None,
            pressure: PressureFlags::default(),
            devices: None,
            volumes_in_use: None,
        }
    }

    #[test]
    fn a_full_status() {
        let mut node = Node::default();
        let out = apply(&mut node, &setter_config(), &observed(100));
        assert!(out.errors.is_empty(), "{:?}", out.errors);
        // First computation: pressure conditions appear (events), Ready appears (no event).
        let reasons: Vec<&str> = out.events.iter().map(|e| e.reason).collect();
        assert_eq!(
            reasons,
            [
                "NodeHasSufficientMemory",
                "NodeHasNoDiskPressure",
                "NodeHasSufficientPID"
            ]
        );
        let s = node.status.expect("status");
        let types: Vec<String> = s
            .conditions
            .clone()
            .unwrap_or_default()
            .into_iter()
            .map(|c| format!("{}={}", c.type_, c.status))
            .collect();
        assert_eq!(
            types,
            [
                "MemoryPressure=False",
                "DiskPressure=False",
                "PIDPressure=False",
                "Ready=True"
            ]
        );
        let cap = s.capacity.unwrap_or_default();
        assert_eq!(cap["cpu"].0, "2");
        assert_eq!(cap["memory"].0, "4Gi");
        assert_eq!(cap["pods"].0, "110");
        assert_eq!(cap["ephemeral-storage"].0, "100Gi");
        let alloc = s.allocatable.unwrap_or_default();
        assert_eq!(alloc["memory"].0, "3996Mi");
        let info = s.node_info.unwrap_or_default();
        assert_eq!(info.container_runtime_version, "containerd://1.6.20");
        assert_eq!(info.kubelet_version, "v1.36.0");
        assert_eq!(info.os_image, "Debian GNU/Linux 12 (bookworm)");
        let addrs = s.addresses.unwrap_or_default();
        assert_eq!(addrs[0].address, "10.0.0.5");
        assert_eq!(
            s.daemon_endpoints
                .and_then(|d| d.kubelet_endpoint)
                .map(|e| e.port),
            Some(10250)
        );
        assert_eq!(s.images.map(|i| i.len()), Some(1));
        // Sorted, as the API server requires.
        assert_eq!(
            s.declared_features.unwrap_or_default(),
            [
                "ExtendWebSocketsToKubelet",
                "InPlacePodLevelResourcesVerticalScaling",
                "RestartAllContainersOnContainerExits"
            ]
        );
    }

    #[test]
    fn runtime_and_network_errors_make_the_node_not_ready() {
        let mut node = Node::default();
        apply(&mut node, &setter_config(), &observed(100));
        let mut obs = observed(110);
        obs.runtime_errors = vec!["container runtime is down".into()];
        obs.network_errors = vec!["container runtime network not ready: <nil>".into()];
        obs.images = Err(super::super::call::CallError::Failed(
            "CRI ListImages: runtime unavailable".into(),
        ));
        let out = apply(&mut node, &setter_config(), &obs);
        assert!(out.events.iter().any(|e| e.reason == "NodeNotReady"));
        let s = node.status.expect("status");
        let ready = s
            .conditions
            .unwrap_or_default()
            .into_iter()
            .find(|c| c.type_ == "Ready")
            .expect("ready");
        assert_eq!(ready.status, "False");
        assert_eq!(
            ready.message.as_deref(),
            Some("[container runtime is down, container runtime network not ready: <nil>]")
        );
        assert_eq!(ready.last_transition_time, obs.now.clone().into());
        assert_eq!(s.images, None);
        assert_eq!(
            out.errors,
            ["error getting image list: CRI ListImages: runtime unavailable"]
        );
    }
}
