//! The scheduler predicates kubelet re-runs at admission, besides resource
//! fit (`pkg/scheduler/eventhandlers.go` `AdmissionCheck` and
//! `pkg/kubelet/lifecycle/predicate.go` `generalFilter`): required node
//! affinity and node selector (`component-helpers/scheduling/corev1/nodeaffinity`),
//! node name, host ports (`nodeports`, `HostPortInfo.CheckConflict`) and the
//! node's `NoExecute` taints (`FindMatchingUntoleratedTaint`; kubelet looks
//! at no other effect), plus the OS label/field checks.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{
    ContainerPort, Node, NodeSelectorRequirement, NodeSelectorTerm, Pod,
};

use crate::pod::podutil;

/// `nodeaffinity.Name`.
pub const NODE_AFFINITY: &str = "NodeAffinity";
/// `nodeaffinity.ErrReasonPod`.
pub const NODE_AFFINITY_REASON: &str = "node(s) didn't match Pod's node affinity/selector";
/// `nodename.Name`.
pub const NODE_NAME: &str = "NodeName";
/// `nodename.ErrReason`.
pub const NODE_NAME_REASON: &str = "node(s) didn't match the requested node name";
/// `nodeports.Name`.
pub const NODE_PORTS: &str = "NodePorts";
/// `nodeports.ErrReason`.
pub const NODE_PORTS_REASON: &str = "node(s) didn't have free ports for the requested pod ports";
/// `tainttoleration.Name`.
pub const TAINT_TOLERATION: &str = "TaintToleration";
/// `tainttoleration.ErrReasonNotMatch`.
pub const TAINT_TOLERATION_REASON: &str = "node(s) had taints that the pod didn't tolerate";

/// `v1.LabelOSStable`.
pub const LABEL_OS: &str = "kubernetes.io/os";

fn label_requirement_matches(
    r: &NodeSelectorRequirement,
    labels: &BTreeMap<String, String>,
) -> Result<bool, ()> {
    let values = r.values.as_deref().unwrap_or_default();
    let value = labels.get(&r.key);
    match r.operator.as_str() {
        "In" | "NotIn" if values.is_empty() => Err(()),
        "In" => Ok(value.is_some_and(|v| values.contains(v))),
        "NotIn" => Ok(value.is_none_or(|v| !values.contains(v))),
        "Exists" | "DoesNotExist" if !values.is_empty() => Err(()),
        "Exists" => Ok(value.is_some()),
        "DoesNotExist" => Ok(value.is_none()),
        "Gt" | "Lt" => {
            let [v] = values else { return Err(()) };
            let want: i64 = v.parse().map_err(|_| ())?;
            let Some(have) = value.and_then(|v| v.parse::<i64>().ok()) else {
                return Ok(false);
            };
            Ok(if r.operator == "Gt" {
                have > want
            } else {
                have < want
            })
        }
        _ => Err(()),
    }
}

fn field_requirement_matches(r: &NodeSelectorRequirement, node_name: &str) -> Result<bool, ()> {
    let values = r.values.as_deref().unwrap_or_default();
    let [want] = values else { return Err(()) };
    let have = if r.key == "metadata.name" {
        node_name
    } else {
        ""
    };
    match r.operator.as_str() {
        "In" => Ok(have == want),
        "NotIn" => Ok(have != want),
        _ => Err(()),
    }
}

/// One term: every expression and every field requirement must match; a
/// term that cannot be parsed matches nothing.
fn term_matches(t: &NodeSelectorTerm, node: &Node) -> bool {
    let labels = node.metadata.labels.clone().unwrap_or_default();
    let name = node.metadata.name.as_deref().unwrap_or_default();
    let exprs = t.match_expressions.as_deref().unwrap_or_default();
    let fields = t.match_fields.as_deref().unwrap_or_default();
    let all = |reqs: &[NodeSelectorRequirement],
               f: &dyn Fn(&NodeSelectorRequirement) -> Result<bool, ()>| {
        let mut ok = true;
        for r in reqs {
            match f(r) {
                Ok(true) => {}
                Ok(false) => ok = false,
                Err(()) => return Err(()),
            }
        }
        Ok(ok)
    };
    let labels_ok = all(exprs, &|r| label_requirement_matches(r, &labels));
    let fields_ok = all(fields, &|r| field_requirement_matches(r, name));
    matches!((labels_ok, fields_ok), (Ok(true), Ok(true)))
}

/// `GetRequiredNodeAffinity(pod).Match(node)`: the node selector's labels
/// all present, and one non-empty required affinity term matching.
pub fn matches_node_affinity(pod: &Pod, node: &Node) -> bool {
    let spec = podutil::spec(pod);
    let labels = node.metadata.labels.clone().unwrap_or_default();
    if let Some(sel) = spec.node_selector.as_ref()
        && !sel.iter().all(|(k, v)| labels.get(k) == Some(v))
    {
        return false;
    }
    let Some(required) = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|n| {
            n.required_during_scheduling_ignored_during_execution
                .as_ref()
        })
    else {
        return true;
    };
    required
        .node_selector_terms
        .iter()
        .filter(|t| {
            !(t.match_expressions
                .as_deref()
                .unwrap_or_default()
                .is_empty()
                && t.match_fields.as_deref().unwrap_or_default().is_empty())
        })
        .any(|t| term_matches(t, node))
}

/// `nodename.Fits`.
pub fn matches_node_name(pod: &Pod, node: &Node) -> bool {
    let want = podutil::spec(pod).node_name.as_deref().unwrap_or_default();
    want.is_empty() || Some(want) == node.metadata.name.as_deref()
}

/// `GetHostPorts`: host ports of sidecars and regular containers.
pub fn host_ports(pod: &Pod) -> Vec<ContainerPort> {
    let spec = podutil::spec(pod);
    spec.init_containers
        .iter()
        .flatten()
        .filter(|c| podutil::is_restartable_init(c))
        .chain(spec.containers.iter())
        .flat_map(|c| c.ports.iter().flatten())
        .filter(|p| p.host_port.unwrap_or(0) > 0)
        .cloned()
        .collect()
}

const BIND_ALL: &str = "0.0.0.0";

/// Host ports in use: IP → (protocol, port) (`HostPortInfo`).
#[derive(Debug, Clone, Default)]
pub struct UsedPorts(BTreeMap<String, BTreeSet<(String, i32)>>);

fn sanitize(p: &ContainerPort) -> (String, String, i32) {
    let ip = p
        .host_ip
        .clone()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| BIND_ALL.into());
    let proto = p
        .protocol
        .clone()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "TCP".into());
    (ip, proto, p.host_port.unwrap_or(0))
}

impl UsedPorts {
    /// Adds every host port of a pod.
    pub fn add_pod(&mut self, pod: &Pod) {
        for p in host_ports(pod) {
            let (ip, proto, port) = sanitize(&p);
            self.0.entry(ip).or_default().insert((proto, port));
        }
    }

    /// `CheckConflict`: `0.0.0.0` conflicts with every IP, any IP with
    /// itself and `0.0.0.0`.
    fn conflicts(&self, p: &ContainerPort) -> bool {
        let (ip, proto, port) = sanitize(p);
        if port <= 0 {
            return false;
        }
        let key = (proto, port);
        if ip == BIND_ALL {
            return self.0.values().any(|s| s.contains(&key));
        }
        [BIND_ALL, ip.as_str()]
            .iter()
            .any(|i| self.0.get(*i).is_some_and(|s| s.contains(&key)))
    }

    /// `nodeports.Fits`.
    pub fn fits(&self, pod: &Pod) -> bool {
        host_ports(pod).iter().all(|p| !self.conflicts(p))
    }
}

/// Whether a `NoExecute` taint of the node is not tolerated (static pods
/// are not checked).
pub fn untolerated_no_execute(pod: &Pod, node: &Node) -> bool {
    if podutil::is_static(pod) {
        return false;
    }
    let tolerations = podutil::spec(pod).tolerations.clone().unwrap_or_default();
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .into_iter()
        .flatten()
        .filter(|t| t.effect == "NoExecute")
        .any(|taint| !tolerations.iter().any(|t| podutil::tolerates(t, taint)))
}

/// `rejectPodAdmissionBasedOnOSSelector`: the pod's `kubernetes.io/os`
/// label must match the node's (taken as `linux` when missing or wrong).
pub fn os_label_mismatch(pod: &Pod) -> bool {
    pod.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(LABEL_OS))
        .is_some_and(|os| os != "linux")
}

/// `rejectPodAdmissionBasedOnOSField`.
pub fn os_field_mismatch(pod: &Pod) -> bool {
    podutil::spec(pod)
        .os
        .as_ref()
        .is_some_and(|os| os.name != "linux")
}

/// `rejectPodAdmissionBasedOnSupplementalGroupsPolicy`: `Strict` needs a
/// node whose status says it supports it.
pub fn supplemental_groups_unsupported(pod: &Pod, node: &Node) -> bool {
    let Some(policy) = podutil::spec(pod)
        .security_context
        .as_ref()
        .and_then(|s| s.supplemental_groups_policy.as_deref())
    else {
        return false;
    };
    let supported = node
        .status
        .as_ref()
        .and_then(|s| s.features.as_ref())
        .and_then(|f| f.supplemental_groups_policy)
        .unwrap_or(false);
    policy == "Strict" && !supported
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(labels: serde_json::Value, taints: serde_json::Value) -> Node {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "n1", "labels": labels},
            "spec": {"taints": taints}
        }))
        .expect("node")
    }

    fn pod(spec: serde_json::Value) -> Pod {
        let mut spec = spec;
        spec["containers"] = serde_json::json!([]);
        serde_json::from_value(serde_json::json!({"metadata": {"name": "p"}, "spec": spec}))
            .expect("pod")
    }

    #[test]
    fn node_affinity_and_selector() {
        let n = node(
            serde_json::json!({"zone": "a", "gen": "5"}),
            serde_json::json!([]),
        );
        assert!(matches_node_affinity(&pod(serde_json::json!({})), &n));
        assert!(matches_node_affinity(
            &pod(serde_json::json!({"nodeSelector": {"zone": "a"}})),
            &n
        ));
        assert!(!matches_node_affinity(
            &pod(serde_json::json!({"nodeSelector": {"zone": "b"}})),
            &n
        ));
        let affinity = |terms: serde_json::Value| {
            pod(serde_json::json!({"affinity": {"nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}}}))
        };
        assert!(matches_node_affinity(
            &affinity(serde_json::json!([
                {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]},
                {"matchExpressions": [{"key": "gen", "operator": "Gt", "values": ["4"]},
                                      {"key": "gpu", "operator": "DoesNotExist"}]}
            ])),
            &n
        ));
        assert!(!matches_node_affinity(
            &affinity(
                serde_json::json!([{"matchExpressions": [{"key": "gen", "operator": "Lt", "values": ["4"]}]}])
            ),
            &n
        ));
        assert!(matches_node_affinity(
            &affinity(
                serde_json::json!([{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}])
            ),
            &n
        ));
        assert!(!matches_node_affinity(
            &affinity(
                serde_json::json!([{"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["n1"]}]}])
            ),
            &n
        ));
        // Empty terms match nothing.
        assert!(!matches_node_affinity(
            &affinity(serde_json::json!([{}])),
            &n
        ));
    }

    #[test]
    fn host_port_conflicts() {
        let with_port = |ip: &str, port: i32, proto: &str| {
            pod(serde_json::json!({})).clone_with(ip, port, proto)
        };
        let mut used = UsedPorts::default();
        used.add_pod(&with_port("", 8080, "TCP"));
        used.add_pod(&with_port("10.0.0.1", 9090, "UDP"));
        assert!(
            !used.fits(&with_port("127.0.0.1", 8080, "TCP")),
            "0.0.0.0 taken"
        );
        assert!(used.fits(&with_port("", 8080, "UDP")));
        assert!(
            !used.fits(&with_port("", 9090, "UDP")),
            "bind-all conflicts with any IP"
        );
        assert!(used.fits(&with_port("10.0.0.2", 9090, "UDP")));
    }

    trait WithPort {
        fn clone_with(&self, ip: &str, port: i32, proto: &str) -> Pod;
    }
    impl WithPort for Pod {
        fn clone_with(&self, ip: &str, port: i32, proto: &str) -> Pod {
            let mut p = self.clone();
            if let Some(s) = p.spec.as_mut() {
                s.containers = vec![serde_json::from_value(serde_json::json!({
                    "name": "c", "ports": [{"containerPort": 80, "hostPort": port, "hostIP": ip, "protocol": proto}]
                }))
                .expect("container")];
            }
            p
        }
    }

    #[test]
    fn only_no_execute_taints_count() {
        let n = node(
            serde_json::json!({}),
            serde_json::json!([{"key": "a", "effect": "NoSchedule"}, {"key": "b", "value": "x", "effect": "NoExecute"}]),
        );
        assert!(untolerated_no_execute(&pod(serde_json::json!({})), &n));
        assert!(!untolerated_no_execute(
            &pod(serde_json::json!({"tolerations": [{"key": "b", "value": "x"}]})),
            &n
        ));
        assert!(!untolerated_no_execute(
            &pod(serde_json::json!({"tolerations": [{"operator": "Exists"}]})),
            &n
        ));
        assert!(untolerated_no_execute(
            &pod(
                serde_json::json!({"tolerations": [{"key": "b", "value": "y", "effect": "NoExecute"}]})
            ),
            &n
        ));
    }
}
