//! Pod-level resource arithmetic as upstream's resource helpers do it
//! (`k8s.io/component-helpers/resource`: `PodRequests`, `PodLimits`,
//! `AggregateContainerRequests`): regular containers and sidecars
//! (restartable init containers) add up, a plain init container counts
//! with the sidecars started before it, the pod needs the larger of the
//! two; pod-level `spec.resources` (PodLevelResources, beta and on in
//! v1.36) replace the aggregate for cpu, memory and hugepages; overhead is
//! added to every request and to every non-zero limit.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Pod, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as K8sQuantity;

use keelson_common::quantity::Quantity;

use super::podutil::is_restartable_init;

/// A resource list (`v1.ResourceList`) with parsed quantities.
pub type ResourceList = BTreeMap<String, Quantity>;

/// CPU (millicores) and memory (bytes) of a container or pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Amounts {
    /// Millicores.
    pub cpu_milli: i64,
    /// Bytes.
    pub memory: i64,
}

impl Amounts {
    /// CPU and memory of a resource list.
    pub fn of(list: &ResourceList) -> Amounts {
        Amounts {
            cpu_milli: list
                .get("cpu")
                .map(|q| i64::try_from(q.milli_value()).unwrap_or(i64::MAX))
                .unwrap_or(0),
            memory: list
                .get("memory")
                .map(|q| i64::try_from(q.value()).unwrap_or(i64::MAX))
                .unwrap_or(0),
        }
    }
}

/// Where a container sits in the spec (upstream's `ContainerType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContainerKind {
    /// `spec.containers`.
    Regular,
    /// `spec.initContainers` (sidecars included).
    Init,
}

/// Parses one quantity of a resource list; invalid or missing counts as 0
/// (the API server validated it already).
pub fn quantity_of(list: Option<&BTreeMap<String, K8sQuantity>>, resource: &str) -> Quantity {
    list.and_then(|l| l.get(resource))
        .and_then(|q| Quantity::parse(&q.0).ok())
        .unwrap_or_default()
}

/// Parses a whole API resource list (unparsable entries are skipped).
pub fn parse_list(list: Option<&BTreeMap<String, K8sQuantity>>) -> ResourceList {
    list.into_iter()
        .flatten()
        .filter_map(|(k, v)| Quantity::parse(&v.0).ok().map(|q| (k.clone(), q)))
        .collect()
}

/// `addResourceList`.
pub fn add_into(list: &mut ResourceList, other: &ResourceList) {
    for (k, v) in other {
        let e = list.entry(k.clone()).or_default();
        *e = e.saturating_add(*v);
    }
}

/// `maxResourceList`.
pub fn max_into(list: &mut ResourceList, other: &ResourceList) {
    for (k, v) in other {
        match list.get_mut(k) {
            Some(e) if *e >= *v => {}
            Some(e) => *e = *v,
            None => {
                list.insert(k.clone(), *v);
            }
        }
    }
}

fn requests_of(r: Option<&ResourceRequirements>) -> ResourceList {
    parse_list(r.and_then(|r| r.requests.as_ref()))
}

fn limits_of(r: Option<&ResourceRequirements>) -> ResourceList {
    parse_list(r.and_then(|r| r.limits.as_ref()))
}

/// A container's requests.
pub fn container_requests(c: &Container) -> Amounts {
    Amounts::of(&requests_of(c.resources.as_ref()))
}

/// A container's limits.
pub fn container_limits(c: &Container) -> Amounts {
    Amounts::of(&limits_of(c.resources.as_ref()))
}

/// `IsExtendedResourceName`: a domain-prefixed name outside
/// `kubernetes.io/` and not a quota `requests.*` name.
pub fn is_extended_resource(name: &str) -> bool {
    name.contains('/') && !name.contains("kubernetes.io/") && !name.starts_with("requests.")
}

/// `IsSupportedPodLevelResource`: cpu, memory and hugepages.
pub fn is_pod_level_resource(name: &str) -> bool {
    name == "cpu" || name == "memory" || name.starts_with("hugepages-")
}

/// `IsPodLevelRequestsSet`.
pub fn pod_level_requests_set(pod: &Pod) -> bool {
    pod_level(pod)
        .and_then(|r| r.requests.as_ref())
        .is_some_and(|l| l.keys().any(|k| is_pod_level_resource(k)))
}

/// `IsPodLevelLimitsSet`.
pub fn pod_level_limits_set(pod: &Pod) -> bool {
    pod_level(pod)
        .and_then(|r| r.limits.as_ref())
        .is_some_and(|l| l.keys().any(|k| is_pod_level_resource(k)))
}

/// `IsPodLevelResourcesSet`.
pub fn pod_level_resources_set(pod: &Pod) -> bool {
    pod_level_requests_set(pod) || pod_level_limits_set(pod)
}

/// The pod's `spec.resources`.
pub fn pod_level(pod: &Pod) -> Option<&ResourceRequirements> {
    pod.spec.as_ref().and_then(|s| s.resources.as_ref())
}

fn overhead(pod: &Pod) -> ResourceList {
    parse_list(pod.spec.as_ref().and_then(|s| s.overhead.as_ref()))
}

/// `AggregateContainerRequests` / `AggregateContainerLimits` over one
/// per-container list; `each` sees the effective list of every container
/// (an init container's includes the sidecars started before it).
fn aggregate(
    pod: &Pod,
    of: fn(Option<&ResourceRequirements>) -> ResourceList,
    each: &mut dyn FnMut(&ResourceList, ContainerKind),
) -> ResourceList {
    let Some(spec) = pod.spec.as_ref() else {
        return ResourceList::new();
    };
    let mut total = ResourceList::new();
    for c in &spec.containers {
        let own = of(c.resources.as_ref());
        each(&own, ContainerKind::Regular);
        add_into(&mut total, &own);
    }
    let mut sidecars = ResourceList::new();
    let mut init_peak = ResourceList::new();
    for c in spec.init_containers.iter().flatten() {
        let own = of(c.resources.as_ref());
        let need = if is_restartable_init(c) {
            add_into(&mut total, &own);
            add_into(&mut sidecars, &own);
            sidecars.clone()
        } else {
            let mut tmp = own;
            add_into(&mut tmp, &sidecars);
            tmp
        };
        each(&need, ContainerKind::Init);
        max_into(&mut init_peak, &need);
    }
    max_into(&mut total, &init_peak);
    total
}

/// `PodRequests` with overhead: pod-level requests replace the aggregate
/// for the resources they name.
pub fn pod_requests_list(pod: &Pod) -> ResourceList {
    let mut reqs = aggregate(pod, requests_of, &mut |_, _| {});
    if pod_level_requests_set(pod) {
        for (k, v) in requests_of(pod_level(pod)) {
            if is_pod_level_resource(&k) {
                reqs.insert(k, v);
            }
        }
    }
    add_into(&mut reqs, &overhead(pod));
    reqs
}

/// `PodLimits` with overhead on the non-zero limits; `each` sees every
/// container's effective limits (for "limits declared" checks).
pub fn pod_limits_list_with(
    pod: &Pod,
    each: &mut dyn FnMut(&ResourceList, ContainerKind),
) -> ResourceList {
    let mut limits = aggregate(pod, limits_of, each);
    if pod_level_resources_set(pod) {
        for (k, v) in limits_of(pod_level(pod)) {
            if is_pod_level_resource(&k) {
                limits.insert(k, v);
            }
        }
    }
    for (k, v) in overhead(pod) {
        if let Some(l) = limits.get_mut(&k)
            && *l != Quantity::ZERO
        {
            *l = l.saturating_add(v);
        }
    }
    limits
}

/// `PodLimits` with overhead.
pub fn pod_limits_list(pod: &Pod) -> ResourceList {
    pod_limits_list_with(pod, &mut |_, _| {})
}

/// The pod's effective CPU and memory requests, overhead included.
pub fn pod_requests(pod: &Pod) -> Amounts {
    Amounts::of(&pod_requests_list(pod))
}

/// The pod's effective CPU and memory limits, overhead on limited ones.
pub fn pod_limits(pod: &Pod) -> Amounts {
    Amounts::of(&pod_limits_list(pod))
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn pod_json(v: serde_json::Value) -> Pod {
        serde_json::from_value(v).expect("pod")
    }

    #[test]
    fn sidecars_add_up_and_init_containers_peak() {
        let pod = pod_json(serde_json::json!({
            "spec": {
                "initContainers": [
                    {"name": "side", "restartPolicy": "Always",
                     "resources": {"requests": {"cpu": "100m", "memory": "10Mi"}}},
                    {"name": "init", "resources": {"requests": {"cpu": "2", "memory": "1Mi"}}}
                ],
                "containers": [
                    {"name": "a", "resources": {"requests": {"cpu": "500m", "memory": "100Mi"}}},
                    {"name": "b", "resources": {"requests": {"cpu": "250m"}}}
                ],
                "overhead": {"cpu": "10m"}
            }
        }));
        let r = pod_requests(&pod);
        // init (2000m) + sidecar (100m) beats app 750m + sidecar 100m.
        assert_eq!(r.cpu_milli, 2100 + 10);
        assert_eq!(r.memory, (110 << 20));
    }

    #[test]
    fn overhead_only_on_limited_resources() {
        let pod = pod_json(serde_json::json!({
            "spec": {
                "containers": [{"name": "a", "resources": {"limits": {"memory": "64Mi"}}}],
                "overhead": {"cpu": "10m", "memory": "1Mi"}
            }
        }));
        let l = pod_limits(&pod);
        assert_eq!(l.cpu_milli, 0);
        assert_eq!(l.memory, 65 << 20);
    }

    #[test]
    fn pod_level_resources_replace_the_aggregate() {
        let pod = pod_json(serde_json::json!({
            "spec": {
                "resources": {"requests": {"cpu": "1", "memory": "256Mi"},
                              "limits": {"memory": "512Mi"}},
                "containers": [
                    {"name": "a", "resources": {"requests": {"cpu": "100m", "ephemeral-storage": "1Gi"}}},
                    {"name": "b"}
                ],
                "overhead": {"memory": "1Mi"}
            }
        }));
        let r = pod_requests_list(&pod);
        assert_eq!(r["cpu"], Quantity::from_units(1));
        assert_eq!(r["memory"], Quantity::from_units((257i64) << 20));
        // Not a pod-level resource: the containers' sum stays.
        assert_eq!(r["ephemeral-storage"], Quantity::from_units(1 << 30));
        let l = pod_limits(&pod);
        assert_eq!(l.memory, 513 << 20);
        assert!(pod_level_resources_set(&pod));
        assert!(!pod_level_resources_set(&pod_json(serde_json::json!({
            "spec": {"resources": {"requests": {"ephemeral-storage": "1Gi"}}, "containers": []}
        }))));
    }

    #[test]
    fn init_container_limits_include_earlier_sidecars() {
        let pod = pod_json(serde_json::json!({
            "spec": {
                "initContainers": [
                    {"name": "side", "restartPolicy": "Always", "resources": {"limits": {"cpu": "1"}}},
                    {"name": "init"}
                ],
                "containers": [{"name": "a", "resources": {"limits": {"cpu": "1"}}}]
            }
        }));
        let mut seen = Vec::new();
        let l = pod_limits_list_with(&pod, &mut |res, kind| {
            seen.push((kind, Amounts::of(res).cpu_milli));
        });
        assert_eq!(Amounts::of(&l).cpu_milli, 2000);
        assert_eq!(
            seen,
            vec![
                (ContainerKind::Regular, 1000),
                (ContainerKind::Init, 1000),
                (ContainerKind::Init, 1000)
            ]
        );
    }
}
