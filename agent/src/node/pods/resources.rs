//! Pod-level resource arithmetic as upstream's resource helpers do it
//! (`PodRequests`/`PodLimits`): regular containers and sidecars (restartable
//! init containers) add up, a plain init container counts with the sidecars
//! started before it, the pod needs the larger of the two, plus overhead.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Pod};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as K8sQuantity;

use crate::quantity::Quantity;

use super::podutil::is_restartable_init;

/// CPU (millicores) and memory (bytes) of a container or pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Amounts {
    /// Millicores.
    pub cpu_milli: i64,
    /// Bytes.
    pub memory: i64,
}

impl Amounts {
    fn add(self, o: Amounts) -> Amounts {
        Amounts {
            cpu_milli: self.cpu_milli.saturating_add(o.cpu_milli),
            memory: self.memory.saturating_add(o.memory),
        }
    }

    fn max(self, o: Amounts) -> Amounts {
        Amounts {
            cpu_milli: self.cpu_milli.max(o.cpu_milli),
            memory: self.memory.max(o.memory),
        }
    }
}

/// Parses one quantity of a resource list; invalid or missing counts as 0
/// (the API server validated it already).
pub fn quantity_of(list: Option<&BTreeMap<String, K8sQuantity>>, resource: &str) -> Quantity {
    list.and_then(|l| l.get(resource))
        .and_then(|q| Quantity::parse(&q.0).ok())
        .unwrap_or_default()
}

fn amounts(list: Option<&BTreeMap<String, K8sQuantity>>) -> Amounts {
    Amounts {
        cpu_milli: i64::try_from(quantity_of(list, "cpu").milli_value()).unwrap_or(i64::MAX),
        memory: i64::try_from(quantity_of(list, "memory").value()).unwrap_or(i64::MAX),
    }
}

/// A container's requests.
pub fn container_requests(c: &Container) -> Amounts {
    amounts(c.resources.as_ref().and_then(|r| r.requests.as_ref()))
}

/// A container's limits.
pub fn container_limits(c: &Container) -> Amounts {
    amounts(c.resources.as_ref().and_then(|r| r.limits.as_ref()))
}

fn aggregate(pod: &Pod, of: fn(&Container) -> Amounts) -> Amounts {
    let Some(spec) = pod.spec.as_ref() else {
        return Amounts::default();
    };
    let mut total = spec
        .containers
        .iter()
        .map(of)
        .fold(Amounts::default(), Amounts::add);
    let mut sidecars = Amounts::default();
    let mut init_peak = Amounts::default();
    for c in spec.init_containers.iter().flatten() {
        let own = of(c);
        let need = if is_restartable_init(c) {
            total = total.add(own);
            sidecars = sidecars.add(own);
            sidecars
        } else {
            own.add(sidecars)
        };
        init_peak = init_peak.max(need);
    }
    total.max(init_peak)
}

/// The pod's effective requests, overhead included (`PodRequests`).
pub fn pod_requests(pod: &Pod) -> Amounts {
    let overhead = amounts(pod.spec.as_ref().and_then(|s| s.overhead.as_ref()));
    aggregate(pod, container_requests).add(overhead)
}

/// The pod's effective limits; overhead is added only to a resource that
/// has a limit (`PodLimits`).
pub fn pod_limits(pod: &Pod) -> Amounts {
    let overhead = amounts(pod.spec.as_ref().and_then(|s| s.overhead.as_ref()));
    let mut l = aggregate(pod, container_limits);
    if l.cpu_milli > 0 {
        l.cpu_milli = l.cpu_milli.saturating_add(overhead.cpu_milli);
    }
    if l.memory > 0 {
        l.memory = l.memory.saturating_add(overhead.memory);
    }
    l
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
}
