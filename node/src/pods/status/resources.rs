//! The resource fields of a pod's status (kubelet v1.36,
//! `pkg/kubelet/kubelet_pods.go`): each container's `resources` (what it
//! runs with: the runtime's figures over the allocated ones) and
//! `allocatedResources` (`convertContainerStatusResources`), and the pod's
//! own `resources` and `allocatedResources`
//! (`convertToAPIPodLevelResourcesStatus`, InPlacePodLevelResourcesVerticalScaling
//! being on in v1.36). A running container's `resources` is what tells an
//! API server that this node supports in-place resize.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Container, ContainerStatus as ApiContainerStatus, Pod, PodStatus, ResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as ApiQuantity;

use crate::cgroups::ResourceConfig;
use crate::pod::resources::{ResourceList, parse_list, pod_limits_list, pod_requests_list};
use crate::pods::runtime::resize::{MIN_MILLI_CPU_LIMIT, MIN_SHARES};
use crate::pods::runtime::status::{
    ContainerResources, ContainerState, ContainerStatus, quota_to_milli_cpu, shares_to_milli_cpu,
};
use keelson_common::quantity::Quantity;

/// `resource.NewMilliQuantity(m, DecimalSI)` as the API prints it.
pub fn cpu_quantity(milli: i64) -> ApiQuantity {
    ApiQuantity(Quantity::from_milli(milli).to_cpu_string())
}

/// `resource.NewQuantity(b, BinarySI)` as the API prints it.
pub fn memory_quantity(bytes: i64) -> ApiQuantity {
    ApiQuantity(Quantity::from_units(bytes).to_bytes_string())
}

fn milli(list: Option<&BTreeMap<String, ApiQuantity>>, k: &str) -> i64 {
    parse_list(list)
        .get(k)
        .map(|q| i64::try_from(q.milli_value()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

fn to_api(list: &ResourceList) -> BTreeMap<String, ApiQuantity> {
    list.iter()
        .map(|(k, q)| {
            let v = match k.as_str() {
                "cpu" => q.to_cpu_string(),
                "memory" | "ephemeral-storage" => q.to_bytes_string(),
                n if n.starts_with("hugepages-") => q.to_bytes_string(),
                _ => q.to_string(),
            };
            (k.clone(), ApiQuantity(v))
        })
        .collect()
}

/// `convertContainerStatusResources`: a non-running container shows its
/// allocated resources; a running one the runtime's figures where it
/// reports them, the previous status's where it does not.
pub fn container_status_resources(
    allocated: &Container,
    cs: &ContainerStatus,
    container_id: &str,
    old: Option<&ApiContainerStatus>,
) -> ResourceRequirements {
    let mut resources = allocated.resources.clone().unwrap_or_default();
    if cs.state != ContainerState::Running {
        return resources;
    }
    let old_running_same = old.is_some_and(|o| {
        o.state.as_ref().is_some_and(|s| s.running.is_some())
            && o.container_id.as_deref() == Some(container_id)
    });
    let old_res = old.and_then(|o| o.resources.clone()).unwrap_or_default();
    let preserve = |name: &str,
                    old_list: Option<&BTreeMap<String, ApiQuantity>>,
                    list: &mut BTreeMap<String, ApiQuantity>| {
        if old_running_same && let Some(q) = old_list.and_then(|l| l.get(name)) {
            list.insert(name.to_string(), q.clone());
        }
    };
    let r: ContainerResources = cs.resources.unwrap_or_default();
    let has = cs.resources.is_some();
    let alloc_limit_cpu = milli(resources.limits.as_ref(), "cpu");
    let alloc_req_cpu = milli(resources.requests.as_ref(), "cpu");
    if let Some(limits) = resources.limits.as_mut() {
        match r.cpu_limit.filter(|_| has) {
            Some(c) => {
                if c > MIN_MILLI_CPU_LIMIT || alloc_limit_cpu > MIN_MILLI_CPU_LIMIT {
                    limits.insert("cpu".into(), cpu_quantity(c));
                }
            }
            None => preserve("cpu", old_res.limits.as_ref(), limits),
        }
        match r.memory_limit.filter(|_| has) {
            Some(m) => {
                limits.insert("memory".into(), memory_quantity(m));
            }
            None => preserve("memory", old_res.limits.as_ref(), limits),
        }
    }
    if let Some(requests) = resources.requests.as_mut() {
        match r.cpu_request.filter(|_| has) {
            Some(c) => {
                if c > MIN_SHARES || alloc_req_cpu > MIN_SHARES {
                    requests.insert("cpu".into(), cpu_quantity(c));
                }
            }
            None => preserve("cpu", old_res.requests.as_ref(), requests),
        }
        match r.memory_request.filter(|_| has) {
            Some(m) => {
                requests.insert("memory".into(), memory_quantity(m));
            }
            None => preserve("memory", old_res.requests.as_ref(), requests),
        }
    }
    resources
}

/// The pod's `status.allocatedResources`: `PodRequests` (overhead
/// included); `None` when empty.
pub fn pod_allocated_resources(pod: &Pod) -> Option<BTreeMap<String, ApiQuantity>> {
    let r = to_api(&pod_requests_list(pod));
    (!r.is_empty()).then_some(r)
}

/// `getEffectiveAllocatedResources`.
fn effective_allocated(pod: &Pod) -> ResourceRequirements {
    let mut r = pod
        .spec
        .as_ref()
        .and_then(|s| s.resources.clone())
        .unwrap_or_default();
    let req = to_api(&pod_requests_list(pod));
    let lim = to_api(&pod_limits_list(pod));
    r.requests = (!req.is_empty()).then_some(req);
    r.limits = (!lim.is_empty()).then_some(lim);
    r
}

/// `convertToAPIPodLevelResourcesStatus`: before the API shows the pod
/// Running, its allocated totals; then the pod cgroup's figures (shares,
/// quota, memory limit; `cgroup` is `None` when it cannot be read), the
/// previous status filling what cannot be read.
pub fn pod_status_resources(
    pod: &Pod,
    old: &PodStatus,
    cgroup: Option<&ResourceConfig>,
) -> ResourceRequirements {
    let api_phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    if api_phase != Some("Running") {
        return effective_allocated(pod);
    }
    let old_running = old.phase.as_deref() == Some("Running");
    let old_res = old.resources.clone().unwrap_or_default();
    let preserve = |name: &str,
                    old_list: Option<&BTreeMap<String, ApiQuantity>>,
                    list: &mut BTreeMap<String, ApiQuantity>| {
        if old_running
            && old.resources.is_some()
            && let Some(q) = old_list.and_then(|l| l.get(name))
        {
            list.insert(name.to_string(), q.clone());
        }
    };
    let mut resources = pod
        .spec
        .as_ref()
        .and_then(|s| s.resources.clone())
        .unwrap_or_default();
    let mut requests = resources.requests.take().unwrap_or_default();
    let mut limits = resources.limits.take().unwrap_or_default();
    let cpu_request = cgroup
        .and_then(|c| c.cpu_shares)
        .map(|s| shares_to_milli_cpu(i64::try_from(s).unwrap_or(i64::MAX)))
        .filter(|m| *m > 0);
    let cpu_limit = cgroup
        .and_then(|c| Some((c.cpu_quota?, c.cpu_period?)))
        .filter(|(_, p)| *p > 0)
        .map(|(q, p)| quota_to_milli_cpu(q, i64::try_from(p).unwrap_or(i64::MAX)))
        .filter(|m| *m > 0);
    let memory_limit = cgroup.and_then(|c| c.memory).filter(|m| *m > 0);
    match cpu_request {
        Some(c) => {
            if c > MIN_SHARES || milli(Some(&requests), "cpu") > MIN_SHARES {
                requests.insert("cpu".into(), cpu_quantity(c));
            }
        }
        None => preserve("cpu", old_res.requests.as_ref(), &mut requests),
    }
    if !requests.contains_key("memory")
        && let Some(m) = pod_requests_list(pod).get("memory")
    {
        requests.insert("memory".into(), ApiQuantity(m.to_bytes_string()));
    }
    preserve("memory", old_res.requests.as_ref(), &mut requests);
    match cpu_limit {
        Some(c) => {
            if c > MIN_MILLI_CPU_LIMIT || milli(Some(&limits), "cpu") > MIN_MILLI_CPU_LIMIT {
                limits.insert("cpu".into(), cpu_quantity(c));
            }
        }
        None => preserve("cpu", old_res.limits.as_ref(), &mut limits),
    }
    match memory_limit {
        Some(m) => {
            limits.insert("memory".into(), memory_quantity(m));
        }
        None => preserve("memory", old_res.limits.as_ref(), &mut limits),
    }
    resources.requests = (!requests.is_empty()).then_some(requests);
    resources.limits = (!limits.is_empty()).then_some(limits);
    resources
}

#[cfg(test)]
mod tests {
    use super::*;

    fn container(v: serde_json::Value) -> Container {
        serde_json::from_value(v).expect("container")
    }

    fn running(res: Option<ContainerResources>) -> ContainerStatus {
        ContainerStatus {
            id: "c1".into(),
            name: "app".into(),
            sandbox_id: "sb".into(),
            state: ContainerState::Running,
            created_at: 1,
            started_at: 1,
            finished_at: 0,
            exit_code: 0,
            reason: String::new(),
            message: String::new(),
            image: String::new(),
            image_ref: String::new(),
            hash: 0,
            restart_count: 0,
            container_type: String::new(),
            log_path: String::new(),
            resources: res,
            user: None,
        }
    }

    #[test]
    fn running_containers_show_the_runtimes_figures() {
        let c = container(serde_json::json!({"name": "app", "resources": {
            "requests": {"cpu": "250m", "memory": "64Mi"}, "limits": {"cpu": "500m", "memory": "128Mi"}}}));
        let r = container_status_resources(
            &c,
            &running(Some(ContainerResources {
                cpu_request: Some(shares_to_milli_cpu(512)),
                cpu_limit: Some(quota_to_milli_cpu(75_000, 100_000)),
                memory_request: Some(64 << 20),
                memory_limit: Some(256 << 20),
            })),
            "containerd://c1",
            None,
        );
        let l = r.limits.expect("limits");
        assert_eq!(
            (l["cpu"].0.as_str(), l["memory"].0.as_str()),
            ("750m", "256Mi")
        );
        assert_eq!(r.requests.expect("requests")["cpu"].0, "500m");
        // Not running: the allocated resources.
        let mut exited = running(None);
        exited.state = ContainerState::Exited;
        assert_eq!(
            container_status_resources(&c, &exited, "x", None),
            c.resources.clone().expect("r")
        );
        // Best effort: nothing to show but `{}`.
        let be = container(serde_json::json!({"name": "app"}));
        assert_eq!(
            container_status_resources(&be, &running(None), "x", None),
            ResourceRequirements::default()
        );
    }

    #[test]
    fn pod_level_before_and_after_running() {
        let mut pod: Pod = serde_json::from_value(serde_json::json!({
            "spec": {"containers": [{"name": "a", "resources": {"requests": {"cpu": "100m", "memory": "32Mi"}}}],
                     "overhead": {"cpu": "10m"}},
            "status": {"phase": "Pending"}
        }))
        .expect("pod");
        let r = pod_status_resources(&pod, &PodStatus::default(), None);
        assert_eq!(r.requests.as_ref().expect("req")["cpu"].0, "110m");
        assert!(r.limits.is_none());
        assert_eq!(
            pod_allocated_resources(&pod).expect("alloc")["memory"].0,
            "32Mi"
        );
        if let Some(s) = pod.status.as_mut() {
            s.phase = Some("Running".into());
        }
        let cg = ResourceConfig {
            cpu_shares: Some(112),
            memory: Some(9_223_372_036_854_771_712),
            ..Default::default()
        };
        let r = pod_status_resources(&pod, &PodStatus::default(), Some(&cg));
        let req = r.requests.expect("req");
        assert_eq!(
            (req["cpu"].0.as_str(), req["memory"].0.as_str()),
            ("110m", "32Mi")
        );
        assert_eq!(r.limits.expect("lim")["memory"].0, "9007199254740988Ki");
    }
}
