//! kubelet's allocation manager (`pkg/kubelet/allocation`): the resources
//! each admitted pod was given, which can differ from its spec while an
//! in-place resize waits; the queue of pending resizes and their outcome
//! (`PodResizePending` with `Deferred`/`Infeasible`, `PodResizeInProgress`,
//! `ResizeStarted`/`ResizeDeferred`/`ResizeInfeasible` events).
//!
//! Every part of the pod lifecycle works on the *allocated* pod (the spec
//! with the allocated resources, `UpdatePodFromAllocation`); admission
//! decides when a resize may be allocated, as it decides whether a pod may
//! run (`canAdmitPod` with the resize operation). The allocations are
//! checkpointed (`<rootDir>/allocated_pods_state`) so a restarted keelson
//! keeps them.

pub mod checkpoint;
pub mod conditions;

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard, PoisonError};

use k8s_openapi::api::core::v1::{Pod, ResourceRequirements};

use crate::pod::podutil;
use crate::pod::resources::parse_list;
use checkpoint::{Checkpoint, PodResources};
use conditions::ResizeConditions;

/// `allocationFromPod`: every container's resources (regular, sidecar and
/// — InPlacePodVerticalScalingInitContainers, beta and on — plain init
/// containers) and the pod-level resources.
pub fn allocation_from_pod(pod: &Pod) -> PodResources {
    let spec = podutil::spec(pod);
    PodResources {
        containers: spec
            .containers
            .iter()
            .chain(spec.init_containers.iter().flatten())
            .map(|c| (c.name.clone(), c.resources.clone().unwrap_or_default()))
            .collect(),
        pod: spec.resources.clone(),
    }
}

/// `apiequality.Semantic.DeepEqual` of two resource requirements:
/// quantities by value, absent and empty the same.
pub fn resources_equal(a: Option<&ResourceRequirements>, b: Option<&ResourceRequirements>) -> bool {
    let norm = |r: Option<&ResourceRequirements>| {
        (
            parse_list(r.and_then(|r| r.limits.as_ref())),
            parse_list(r.and_then(|r| r.requests.as_ref())),
            r.and_then(|r| r.claims.clone()).unwrap_or_default(),
        )
    };
    norm(a) == norm(b)
}

/// `updatePodFromAllocation`: the pod with its allocated resources, and
/// whether anything differed from the spec.
pub fn apply_allocation(pod: &Pod, alloc: &PodResources) -> (Pod, bool) {
    let mut out = pod.clone();
    let mut updated = false;
    let Some(spec) = out.spec.as_mut() else {
        return (out, false);
    };
    if !resources_equal(spec.resources.as_ref(), alloc.pod.as_ref()) {
        spec.resources = alloc.pod.clone();
        updated = true;
    }
    for c in spec
        .containers
        .iter_mut()
        .chain(spec.init_containers.iter_mut().flatten())
    {
        if let Some(a) = alloc.containers.get(&c.name)
            && !resources_equal(c.resources.as_ref(), Some(a))
        {
            c.resources = Some(a.clone());
            updated = true;
        }
    }
    (out, updated)
}

/// kubelet's `podResizeMessage`: `<prefix>: {"initContainers":[...],
/// "containers":[{"name":...,"resources":{...}}],"generation":N,"error":...}`.
pub fn resize_message(prefix: &str, pod: &Pod, generation: i64, error: &str) -> String {
    // Field order as Go's encoding/json writes the struct.
    let list = |cs: &[k8s_openapi::api::core::v1::Container]| -> Option<String> {
        let items: Vec<String> = cs
            .iter()
            .map(|c| {
                format!(
                    "{{\"name\":{},\"resources\":{}}}",
                    serde_json::to_string(&c.name).unwrap_or_default(),
                    serde_json::to_string(&c.resources.clone().unwrap_or_default())
                        .unwrap_or_default()
                )
            })
            .collect();
        (!items.is_empty()).then(|| format!("[{}]", items.join(",")))
    };
    let mut fields = Vec::new();
    if let Some(l) = list(podutil::init_containers(pod)) {
        fields.push(format!("\"initContainers\":{l}"));
    }
    if let Some(l) = list(podutil::containers(pod)) {
        fields.push(format!("\"containers\":{l}"));
    }
    fields.push(format!("\"generation\":{generation}"));
    if !error.is_empty() {
        fields.push(format!(
            "\"error\":{}",
            serde_json::to_string(error).unwrap_or_default()
        ));
    }
    format!("{prefix}: {{{}}}", fields.join(","))
}

/// The allocations, the pending resizes and their conditions.
#[derive(Debug)]
pub struct AllocationManager {
    allocated: Checkpoint,
    conditions: ResizeConditions,
    pending: Mutex<Vec<String>>,
}

impl AllocationManager {
    /// Allocations checkpointed in `path` (`None`: memory only).
    pub fn new(path: Option<std::path::PathBuf>, conditions: ResizeConditions) -> Self {
        AllocationManager {
            allocated: Checkpoint::open(path),
            conditions,
            pending: Mutex::default(),
        }
    }

    fn pending(&self) -> MutexGuard<'_, Vec<String>> {
        self.pending.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The resize conditions.
    pub fn conditions(&self) -> &ResizeConditions {
        &self.conditions
    }

    /// `UpdatePodFromAllocation`.
    pub fn update_pod_from_allocation(&self, pod: &Pod) -> (Pod, bool) {
        match self.allocated.get(podutil::uid(pod)) {
            Some(a) => apply_allocation(pod, &a),
            None => (pod.clone(), false),
        }
    }

    /// The allocated resources of one container, if recorded.
    pub fn container_allocation(&self, uid: &str, container: &str) -> Option<ResourceRequirements> {
        self.allocated
            .get(uid)
            .and_then(|a| a.containers.get(container).cloned())
    }

    /// `SetAllocatedResources`: the pod's spec resources become its
    /// allocation.
    pub fn set_allocated(&self, pod: &Pod) {
        self.allocated
            .set(podutil::uid(pod), allocation_from_pod(pod));
    }

    /// `PushPendingResize`.
    pub fn push_pending(&self, uid: &str) {
        let mut p = self.pending();
        if !p.iter().any(|u| u == uid) {
            p.push(uid.to_string());
        }
    }

    /// `HasPendingResizes`.
    pub fn has_pending(&self) -> bool {
        !self.pending().is_empty()
    }

    /// Takes the pending queue (the caller puts back what stays pending).
    pub fn take_pending(&self) -> Vec<String> {
        std::mem::take(&mut *self.pending())
    }

    /// Forgets a pod (`RemovePod`).
    pub fn remove(&self, uid: &str) {
        self.allocated.remove(uid);
        self.conditions.remove(uid);
        self.pending().retain(|u| u != uid);
    }

    /// `RemoveOrphanedPods`.
    pub fn retain(&self, keep: &std::collections::BTreeSet<String>) {
        self.allocated.retain(keep);
    }
}

/// CPU and memory of a requests list, for sorting and comparisons.
pub fn cpu_memory(
    list: Option<&BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>>,
) -> (i128, i128) {
    let l = parse_list(list);
    (
        l.get("cpu").map(|q| q.milli_value()).unwrap_or(0),
        l.get("memory").map(|q| q.milli_value()).unwrap_or(0),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(cpu: &str) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "uid": "u"},
            "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}, {"name": "d"}]}
        }))
        .expect("pod")
    }

    #[test]
    fn allocation_overrides_the_spec() {
        let m = AllocationManager::new(
            None,
            ResizeConditions::new(std::sync::Arc::new(crate::pods::clock::WallClock)),
        );
        let admitted = pod("500m");
        m.set_allocated(&admitted);
        let (same, updated) = m.update_pod_from_allocation(&pod("0.5"));
        assert!(!updated, "equal by value");
        assert_eq!(same, pod("0.5"));
        let (allocated, updated) = m.update_pod_from_allocation(&pod("1"));
        assert!(updated);
        assert_eq!(allocated, admitted);
        assert!(resources_equal(
            None,
            Some(&ResourceRequirements::default())
        ));
    }

    #[test]
    fn messages() {
        let p = pod("100m");
        assert_eq!(
            resize_message("Pod resize started", &p, 2, ""),
            r#"Pod resize started: {"containers":[{"name":"c","resources":{"requests":{"cpu":"100m"}}},{"name":"d","resources":{}}],"generation":2}"#
        );
    }
}
