//! In-place resize of running containers (kubelet's
//! `computePodResizeAction`, `doPodResizeAction`,
//! `updatePodContainerResources`, `IsPodResizeInProgress` in
//! `pkg/kubelet/kuberuntime/kuberuntime_manager.go`).
//!
//! The runtime manager records what it *actuated* for each container
//! (resources given at CreateContainer or by the last successful
//! UpdateContainerResources) and for the pod cgroup, checkpointed in
//! `<rootDir>/actuated_pods_state`. A running container whose allocated
//! resources differ from the actuated ones is resized: restarted when its
//! `resizePolicy` says `RestartContainer` for a changed resource, else
//! updated in place — memory first, then CPU, each in kubelet's order
//! (pod cgroup limit up before the containers, down after them; decreases
//! of containers before increases). A memory limit below the current usage
//! is refused before anything changes.

use k8s_openapi::api::core::v1::{Container, Pod, ResourceRequirements};

use crate::pod::podutil;
use crate::pod::resources::parse_list;

/// `MinShares`.
pub const MIN_SHARES: i64 = 2;
/// `MinMilliCPULimit`.
pub const MIN_MILLI_CPU_LIMIT: i64 = 10;

/// kubelet's `resourceRequirements`: the resizable values of a container
/// or pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CpuMemory {
    /// Memory limit, bytes.
    pub memory_limit: i64,
    /// Memory request, bytes.
    pub memory_request: i64,
    /// CPU limit, millicores.
    pub cpu_limit: i64,
    /// CPU request, millicores.
    pub cpu_request: i64,
}

fn of(
    list: Option<
        &std::collections::BTreeMap<
            String,
            k8s_openapi::apimachinery::pkg::api::resource::Quantity,
        >,
    >,
) -> (i64, i64) {
    let l = parse_list(list);
    (
        l.get("cpu")
            .map(|q| i64::try_from(q.milli_value()).unwrap_or(i64::MAX))
            .unwrap_or(0),
        l.get("memory")
            .map(|q| i64::try_from(q.value()).unwrap_or(i64::MAX))
            .unwrap_or(0),
    )
}

/// `GetLimits`: the container's limits, with the pod-level cpu and memory
/// limits standing in for missing ones.
pub fn effective_limits(
    pod_level: Option<&ResourceRequirements>,
    container: Option<&ResourceRequirements>,
) -> std::collections::BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity> {
    let mut limits = container.and_then(|r| r.limits.clone()).unwrap_or_default();
    let Some(pl) = pod_level
        .and_then(|r| r.limits.as_ref())
        .filter(|l| !l.is_empty())
    else {
        return limits;
    };
    let (ccpu, cmem) = of(Some(&limits));
    let (pcpu, pmem) = of(Some(pl));
    if ccpu == 0
        && pcpu != 0
        && let Some(q) = pl.get("cpu")
    {
        limits.insert("cpu".into(), q.clone());
    }
    if cmem == 0
        && pmem != 0
        && let Some(q) = pl.get("memory")
    {
        limits.insert("memory".into(), q.clone());
    }
    limits
}

/// `containerResourcesFromRequirements`.
pub fn container_values(
    pod_level: Option<&ResourceRequirements>,
    container: Option<&ResourceRequirements>,
) -> CpuMemory {
    let limits = effective_limits(pod_level, container);
    let (cpu_limit, memory_limit) = of(Some(&limits));
    let (cpu_request, memory_request) = of(container.and_then(|r| r.requests.as_ref()));
    CpuMemory {
        memory_limit,
        memory_request,
        cpu_limit,
        cpu_request,
    }
}

/// `podResourcesFromRequirements`.
pub fn pod_values(r: Option<&ResourceRequirements>) -> CpuMemory {
    let (cpu_limit, memory_limit) = of(r.and_then(|r| r.limits.as_ref()));
    let (cpu_request, memory_request) = of(r.and_then(|r| r.requests.as_ref()));
    CpuMemory {
        memory_limit,
        memory_request,
        cpu_limit,
        cpu_request,
    }
}

/// The resources actuated so far.
pub trait Actuated: Send + Sync {
    /// Of one container.
    fn container(&self, pod_uid: &str, name: &str) -> Option<ResourceRequirements>;
    /// Of the pod cgroup (pod-level resources).
    fn pod_level(&self, pod_uid: &str) -> Option<ResourceRequirements>;
}

impl Actuated for crate::pods::allocation::checkpoint::Checkpoint {
    fn container(&self, pod_uid: &str, name: &str) -> Option<ResourceRequirements> {
        self.get(pod_uid)
            .and_then(|p| p.containers.get(name).cloned())
    }
    fn pod_level(&self, pod_uid: &str) -> Option<ResourceRequirements> {
        self.get(pod_uid).and_then(|p| p.pod)
    }
}

/// Which resource a container update is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Resource {
    /// Memory.
    Memory,
    /// CPU.
    Cpu,
}

impl Resource {
    fn name(self) -> &'static str {
        match self {
            Resource::Memory => "memory",
            Resource::Cpu => "cpu",
        }
    }
}

/// One running container to update (`containerToUpdateInfo`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerUpdate {
    /// Container name.
    pub name: String,
    /// Runtime container id.
    pub container_id: String,
    /// What it should have.
    pub desired: CpuMemory,
    /// What it has (as actuated).
    pub current: CpuMemory,
}

/// The resize part of a sync's actions.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ResizeActions {
    /// Resizing is possible this sync (kubelet's non-nil `ContainersToUpdate`).
    pub enabled: bool,
    /// Memory updates, decreases first.
    pub memory: Vec<ContainerUpdate>,
    /// CPU updates, decreases first.
    pub cpu: Vec<ContainerUpdate>,
    /// A container restarts for its resize policy (`UpdatePodResources`).
    pub update_pod_resources: bool,
    /// Pod-level resources changed (`UpdatePodLevelResources`).
    pub update_pod_level: bool,
}

impl ResizeActions {
    /// Whether `doPodResizeAction` runs.
    pub fn needed(&self) -> bool {
        self.enabled
            && (!self.memory.is_empty()
                || !self.cpu.is_empty()
                || self.update_pod_resources
                || self.update_pod_level)
    }

    fn mark(&mut self, r: Resource, u: ContainerUpdate, desired: i64, current: i64) {
        let list = match r {
            Resource::Memory => &mut self.memory,
            Resource::Cpu => &mut self.cpu,
        };
        if desired > current {
            list.push(u);
        } else if desired < current {
            list.insert(0, u);
        }
    }
}

/// What `computePodResizeAction` decided for one running container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ContainerResize {
    /// Nothing, or updates recorded: keep the container.
    Keep,
    /// Its resize policy asks for a restart.
    Restart,
}

/// `computePodResizeAction` for a running container.
pub fn compute_container_resize(
    pod: &Pod,
    c: &Container,
    container_id: &str,
    actuated: &dyn Actuated,
    out: &mut ResizeActions,
) -> ContainerResize {
    if !out.enabled {
        return ContainerResize::Keep;
    }
    let uid = podutil::uid(pod);
    let pod_level = podutil::spec(pod).resources.as_ref();
    let actuated_c = actuated.container(uid, &c.name);
    if actuated_c.is_none() {
        tracing::warn!(pod = %podutil::key(pod), container = %c.name, "missing actuated resource record");
    }
    let actuated_pod = actuated.pod_level(uid);
    let desired = container_values(pod_level, c.resources.as_ref());
    let current = container_values(actuated_pod.as_ref(), actuated_c.as_ref());
    if desired == current {
        return ContainerResize::Keep;
    }
    let policy_restarts = |r: Resource| {
        c.resize_policy
            .iter()
            .flatten()
            .find(|p| p.resource_name == r.name())
            .is_some_and(|p| p.restart_policy == "RestartContainer")
    };
    let resize = |r: Resource, d: i64, cur: i64| -> (bool, bool) {
        if d == cur {
            (false, false)
        } else {
            (true, policy_restarts(r))
        }
    };
    let (mem_lim, restart_mem_lim) =
        resize(Resource::Memory, desired.memory_limit, current.memory_limit);
    let (mem_req, restart_mem_req) = resize(
        Resource::Memory,
        desired.memory_request,
        current.memory_request,
    );
    let (cpu_lim, restart_cpu_lim) = resize(Resource::Cpu, desired.cpu_limit, current.cpu_limit);
    let (cpu_req, restart_cpu_req) =
        resize(Resource::Cpu, desired.cpu_request, current.cpu_request);
    if restart_cpu_lim || restart_cpu_req || restart_mem_lim || restart_mem_req {
        out.update_pod_resources = true;
        return ContainerResize::Restart;
    }
    let update = ContainerUpdate {
        name: c.name.clone(),
        container_id: container_id.to_string(),
        desired,
        current,
    };
    if mem_lim {
        out.mark(
            Resource::Memory,
            update.clone(),
            desired.memory_limit,
            current.memory_limit,
        );
    } else if mem_req {
        out.mark(
            Resource::Memory,
            update.clone(),
            desired.memory_request,
            current.memory_request,
        );
    }
    if cpu_lim {
        out.mark(Resource::Cpu, update, desired.cpu_limit, current.cpu_limit);
    } else if cpu_req {
        out.mark(
            Resource::Cpu,
            update,
            desired.cpu_request,
            current.cpu_request,
        );
    }
    ContainerResize::Keep
}

/// `computePodLevelResourcesResizeAction`.
pub fn compute_pod_level_resize(pod: &Pod, actuated: &dyn Actuated) -> bool {
    let spec_level = podutil::spec(pod).resources.as_ref();
    let desired = pod_values(spec_level);
    let current = pod_values(actuated.pod_level(podutil::uid(pod)).as_ref());
    desired != current
}

/// The container with the resources `updatePodContainerResources` sends
/// for one resource: the desired values of that resource, the current
/// ones of the other.
pub fn container_for_update(c: &Container, u: &ContainerUpdate, r: Resource) -> Container {
    let (mem, cpu) = match r {
        Resource::Memory => (
            (u.desired.memory_limit, u.desired.memory_request),
            (u.current.cpu_limit, u.current.cpu_request),
        ),
        Resource::Cpu => (
            (u.current.memory_limit, u.current.memory_request),
            (u.desired.cpu_limit, u.desired.cpu_request),
        ),
    };
    let q = |s: String| k8s_openapi::apimachinery::pkg::api::resource::Quantity(s);
    let cpu_q = |m: i64| q(keelson_common::quantity::Quantity::from_milli(m).to_cpu_string());
    let mem_q = |b: i64| q(keelson_common::quantity::Quantity::from_units(b).to_bytes_string());
    let mut out = c.clone();
    out.resources = Some(ResourceRequirements {
        limits: Some(
            [
                ("cpu".to_string(), cpu_q(cpu.0)),
                ("memory".to_string(), mem_q(mem.0)),
            ]
            .into(),
        ),
        requests: Some(
            [
                ("cpu".to_string(), cpu_q(cpu.1)),
                ("memory".to_string(), mem_q(mem.1)),
            ]
            .into(),
        ),
        claims: None,
    });
    out
}

/// `isContainerResourceResizeInProgress` / `isPodLevelResourcesResizeInProgress`:
/// a running resizable container (or the pod cgroup) whose allocated cpu
/// and memory differ from what was actuated.
pub fn resize_in_progress(
    pod: &Pod,
    running: &dyn Fn(&str) -> bool,
    actuated: &dyn Actuated,
) -> bool {
    let uid = podutil::uid(pod);
    let pod_level = podutil::spec(pod).resources.as_ref();
    let spec = podutil::spec(pod);
    let containers = spec
        .init_containers
        .iter()
        .flatten()
        .chain(spec.containers.iter());
    for c in containers {
        if !running(&c.name) {
            continue;
        }
        let a = actuated.container(uid, &c.name).unwrap_or_default();
        let alloc_limits = effective_limits(pod_level, c.resources.as_ref());
        let (ar, al) = (
            of(c.resources.as_ref().and_then(|r| r.requests.as_ref())),
            of(Some(&alloc_limits)),
        );
        let (xr, xl) = (of(a.requests.as_ref()), of(a.limits.as_ref()));
        if ar != xr || al != xl {
            return true;
        }
    }
    if let Some(alloc) = pod_level
        && let Some(act) = actuated.pod_level(uid)
    {
        return pod_values(Some(alloc)) != pod_values(Some(&act));
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pods::allocation::checkpoint::{Checkpoint, PodResources};

    fn pod(v: serde_json::Value) -> Pod {
        serde_json::from_value(v).expect("pod")
    }

    fn rr(v: serde_json::Value) -> ResourceRequirements {
        serde_json::from_value(v).expect("rr")
    }

    #[test]
    fn updates_are_ordered_and_policies_restart() {
        let p = pod(serde_json::json!({
            "metadata": {"uid": "u"},
            "spec": {"containers": [
                {"name": "a", "resources": {"requests": {"cpu": "200m", "memory": "64Mi"}, "limits": {"memory": "128Mi"}}},
                {"name": "b", "resources": {"requests": {"cpu": "100m"}}},
                {"name": "c", "resources": {"requests": {"memory": "32Mi"}},
                 "resizePolicy": [{"resourceName": "memory", "restartPolicy": "RestartContainer"}]}
            ]}
        }));
        let act = Checkpoint::open(None);
        act.set(
            "u",
            PodResources {
                containers: [
                    ("a".into(), rr(serde_json::json!({"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}}))),
                    ("b".into(), rr(serde_json::json!({"requests": {"cpu": "300m"}}))),
                    ("c".into(), rr(serde_json::json!({"requests": {"memory": "16Mi"}}))),
                ]
                .into(),
                pod: None,
            },
        );
        let mut out = ResizeActions {
            enabled: true,
            ..Default::default()
        };
        let cs = podutil::containers(&p);
        assert_eq!(
            compute_container_resize(&p, &cs[0], "ida", &act, &mut out),
            ContainerResize::Keep
        );
        assert_eq!(
            compute_container_resize(&p, &cs[1], "idb", &act, &mut out),
            ContainerResize::Keep
        );
        assert_eq!(
            compute_container_resize(&p, &cs[2], "idc", &act, &mut out),
            ContainerResize::Restart
        );
        assert!(out.update_pod_resources);
        // a: memory limit 256Mi → 128Mi (decrease); cpu 100m → 200m (increase).
        assert_eq!(
            out.memory
                .iter()
                .map(|u| u.name.as_str())
                .collect::<Vec<_>>(),
            ["a"]
        );
        // b decreases: first.
        assert_eq!(
            out.cpu.iter().map(|u| u.name.as_str()).collect::<Vec<_>>(),
            ["b", "a"]
        );
        let upd = container_for_update(&cs[0], &out.memory[0], Resource::Memory);
        let r = upd.resources.expect("r");
        assert_eq!(r.limits.as_ref().expect("l")["memory"].0, "128Mi");
        assert_eq!(
            r.requests.as_ref().expect("r")["cpu"].0,
            "100m",
            "cpu stays as actuated"
        );
        assert!(resize_in_progress(&p, &|_| true, &act));
        assert!(!resize_in_progress(&p, &|_| false, &act));
    }

    #[test]
    fn pod_level_limits_stand_in() {
        let pl = rr(serde_json::json!({"limits": {"cpu": "2", "memory": "1Gi"}}));
        let c = rr(serde_json::json!({"requests": {"cpu": "1"}, "limits": {"memory": "512Mi"}}));
        let v = container_values(Some(&pl), Some(&c));
        assert_eq!(
            (v.cpu_limit, v.memory_limit, v.cpu_request),
            (2000, 512 << 20, 1000)
        );
    }
}
