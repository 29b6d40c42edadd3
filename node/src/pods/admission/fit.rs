//! Resource fit at admission (`noderesources.Fits` → `fitsRequest`, with
//! the node's allocatable from its status and the requests of the pods
//! already admitted, as kubelet's `NodeInfo`): pods count first, then cpu,
//! memory, ephemeral storage and scalar resources (hugepages, extended
//! resources). Requests are `PodRequests`: overhead and pod-level
//! resources included. Extended resources the node does not advertise are
//! ignored (`removeMissingExtendedResources`).

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, Pod};

use crate::pod::resources::{ResourceList, parse_list, pod_requests_list};

/// One resource the pod does not fit on (`InsufficientResource`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Insufficient {
    /// `cpu`, `memory`, `pods`, ...
    pub resource: String,
    /// What the pod asks (millicores for cpu).
    pub requested: i64,
    /// What admitted pods already use.
    pub used: i64,
    /// Allocatable.
    pub capacity: i64,
}

impl Insufficient {
    /// kubelet's reason: `OutOfcpu`, `OutOfmemory`, `OutOfpods`, ...
    pub fn reason(&self) -> String {
        format!("OutOf{}", self.resource)
    }

    /// `InsufficientResourceError.Error()`.
    pub fn message(&self) -> String {
        format!(
            "Node didn't have enough resource: {}, requested: {}, used: {}, capacity: {}",
            self.resource, self.requested, self.used, self.capacity
        )
    }
}

use crate::pod::resources::is_extended_resource as is_extended;

/// `IsScalarResourceName`: extended, hugepages, prefixed native and
/// attachable-volume resources.
fn is_scalar(name: &str) -> bool {
    is_extended(name)
        || name.starts_with("hugepages-")
        || name.contains("kubernetes.io/")
        || name.starts_with("attachable-volumes-")
}

/// A resource list in the scheduler's units: millicores for cpu, whole
/// units for the rest; `pods` and unknown native names are dropped.
fn scheduler_units(list: &ResourceList) -> BTreeMap<String, i64> {
    let mut out = BTreeMap::new();
    for (name, q) in list {
        let v = match name.as_str() {
            "cpu" => q.milli_value(),
            "memory" | "ephemeral-storage" => q.value(),
            n if is_scalar(n) => q.value(),
            _ => continue,
        };
        out.insert(name.clone(), i64::try_from(v).unwrap_or(i64::MAX));
    }
    out
}

/// What the pods on the node use and what the node offers (kubelet's
/// `NodeInfo` built from the admitted pods).
#[derive(Debug, Clone, Default)]
pub struct NodeResources {
    allocatable: BTreeMap<String, i64>,
    allowed_pods: i64,
    requested: BTreeMap<String, i64>,
    pod_count: i64,
}

impl NodeResources {
    /// From the node's status and the pods already admitted.
    pub fn new(node: &Node, others: &[Arc<Pod>]) -> Self {
        let alloc = parse_list(node.status.as_ref().and_then(|s| s.allocatable.as_ref()));
        let allowed_pods = alloc
            .get("pods")
            .map(|q| i64::try_from(q.value()).unwrap_or(i64::MAX))
            .unwrap_or(0);
        let mut requested: BTreeMap<String, i64> = BTreeMap::new();
        for p in others {
            for (k, v) in scheduler_units(&pod_requests_list(p)) {
                let e = requested.entry(k).or_default();
                *e = e.saturating_add(v);
            }
        }
        NodeResources {
            allocatable: scheduler_units(&alloc),
            allowed_pods,
            requested,
            pod_count: i64::try_from(others.len()).unwrap_or(i64::MAX),
        }
    }

    fn alloc(&self, name: &str) -> i64 {
        self.allocatable.get(name).copied().unwrap_or(0)
    }

    fn used(&self, name: &str) -> i64 {
        self.requested.get(name).copied().unwrap_or(0)
    }

    /// `fitsRequest`: every resource the pod does not fit on, in
    /// kubelet's order (the first one becomes the rejection).
    pub fn fits(&self, pod: &Pod) -> Vec<Insufficient> {
        let mut out = Vec::new();
        if self.pod_count + 1 > self.allowed_pods {
            out.push(Insufficient {
                resource: "pods".into(),
                requested: 1,
                used: self.pod_count,
                capacity: self.allowed_pods,
            });
        }
        let mut req = scheduler_units(&pod_requests_list(pod));
        // removeMissingExtendedResources.
        req.retain(|name, _| !is_extended(name) || self.allocatable.contains_key(name));
        let check = |name: &str, out: &mut Vec<Insufficient>| {
            let want = req.get(name).copied().unwrap_or(0);
            if want > 0 && want > self.alloc(name).saturating_sub(self.used(name)) {
                out.push(Insufficient {
                    resource: name.to_string(),
                    requested: want,
                    used: self.used(name),
                    capacity: self.alloc(name),
                });
            }
        };
        check("cpu", &mut out);
        check("memory", &mut out);
        check("ephemeral-storage", &mut out);
        for name in req.keys().filter(|n| is_scalar(n)) {
            check(name, &mut out);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(alloc: serde_json::Value) -> Node {
        serde_json::from_value(
            serde_json::json!({"metadata": {"name": "n"}, "status": {"allocatable": alloc}}),
        )
        .expect("node")
    }

    fn pod(requests: serde_json::Value, overhead: Option<serde_json::Value>) -> Arc<Pod> {
        let mut spec =
            serde_json::json!({"containers": [{"name": "c", "resources": {"requests": requests}}]});
        if let Some(o) = overhead {
            spec["overhead"] = o;
        }
        Arc::new(serde_json::from_value(serde_json::json!({"spec": spec})).expect("pod"))
    }

    #[test]
    fn cpu_memory_and_overhead() {
        let n = node(serde_json::json!({"cpu": "2", "memory": "1Gi", "pods": "10"}));
        let others = vec![pod(
            serde_json::json!({"cpu": "1500m", "memory": "512Mi"}),
            None,
        )];
        let r = NodeResources::new(&n, &others);
        assert!(
            r.fits(&pod(serde_json::json!({"cpu": "500m"}), None))
                .is_empty()
        );
        let out = r.fits(&pod(
            serde_json::json!({"cpu": "400m"}),
            Some(serde_json::json!({"cpu": "200m"})),
        ));
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].reason(), "OutOfcpu");
        assert_eq!(
            out[0].message(),
            "Node didn't have enough resource: cpu, requested: 600, used: 1500, capacity: 2000"
        );
        let out = r.fits(&pod(serde_json::json!({"memory": "600Mi"}), None));
        assert_eq!(out[0].reason(), "OutOfmemory");
        assert_eq!(out[0].requested, 600 << 20);
    }

    #[test]
    fn pods_count_comes_first() {
        let n = node(serde_json::json!({"cpu": "1", "pods": "1"}));
        let r = NodeResources::new(&n, &[pod(serde_json::json!({}), None)]);
        let out = r.fits(&pod(serde_json::json!({"cpu": "2"}), None));
        assert_eq!(
            out.iter().map(Insufficient::reason).collect::<Vec<_>>(),
            vec!["OutOfpods", "OutOfcpu"]
        );
        assert_eq!(
            out[0].message(),
            "Node didn't have enough resource: pods, requested: 1, used: 1, capacity: 1"
        );
    }

    #[test]
    fn extended_resources_the_node_lacks_are_ignored_but_hugepages_are_not() {
        let n = node(serde_json::json!({"cpu": "1", "pods": "5", "example.com/foo": "1"}));
        let r = NodeResources::new(&n, &[]);
        assert!(
            r.fits(&pod(serde_json::json!({"example.com/bar": "3"}), None))
                .is_empty()
        );
        assert_eq!(
            r.fits(&pod(serde_json::json!({"example.com/foo": "2"}), None))[0].reason(),
            "OutOfexample.com/foo"
        );
        assert_eq!(
            r.fits(&pod(serde_json::json!({"hugepages-2Mi": "2Mi"}), None))[0].reason(),
            "OutOfhugepages-2Mi"
        );
    }
}
