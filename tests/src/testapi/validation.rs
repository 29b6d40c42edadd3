//! Validation of the fields this server relies on: object names, required
//! pod/service/endpointslice fields, immutable pod spec. Not the whole of
//! upstream's validation (see tests/README.md).

use std::collections::HashSet;

use serde_json::Value;

use super::error::{Cause, invalid_value, required};

const DNS1123_SUBDOMAIN_MSG: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";
const DNS1123_LABEL_MSG: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')";
const DNS1035_LABEL_MSG: &str = "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')";

/// RFC 1123 label (max 63).
pub fn is_dns1123_label(s: &str) -> bool {
    s.len() <= 63 && is_label_shaped(s)
}

/// The shape of a label, of any length.
fn is_label_shaped(s: &str) -> bool {
    let b = s.as_bytes();
    !s.is_empty()
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && s.bytes()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')
}

/// RFC 1123 subdomain (max 253).
pub fn is_dns1123_subdomain(s: &str) -> bool {
    // `IsDNS1123Subdomain` checks the length of the whole name and the
    // regex, not the length of each part: `<126 a>.<126 b>` is a valid
    // pod name (the real API server takes it).
    !s.is_empty() && s.len() <= 253 && s.split('.').all(is_label_shaped)
}

/// RFC 1035 label (service names).
pub fn is_dns1035_label(s: &str) -> bool {
    is_dns1123_label(s) && s.as_bytes()[0].is_ascii_lowercase()
}

/// Checks `metadata.name` for an object of `kind`.
pub fn name(kind: &str, name: &str) -> Vec<Cause> {
    if name.is_empty() {
        return vec![Cause {
            reason: "FieldValueRequired",
            message: "Required value: name or generateName is required".into(),
            field: "metadata.name".into(),
        }];
    }
    let (ok, msg) = match kind {
        "Namespace" => (is_dns1123_label(name), DNS1123_LABEL_MSG),
        "Service" => (is_dns1035_label(name), DNS1035_LABEL_MSG),
        // Events, leases and certificate signing requests (kubelet's are
        // named in base64url) accept any path segment name upstream.
        "Event" | "Lease" | "CertificateSigningRequest" => (
            !name.contains('/') && name != "." && name != "..",
            "may not contain '/'",
        ),
        _ => (is_dns1123_subdomain(name), DNS1123_SUBDOMAIN_MSG),
    };
    if ok {
        Vec::new()
    } else {
        vec![invalid_value("metadata.name", name, msg)]
    }
}

/// Kind-specific validation of a whole object.
pub fn object(kind: &str, obj: &Value) -> Vec<Cause> {
    match kind {
        "Pod" => pod(obj),
        "Service" => service(obj),
        "EndpointSlice" => endpoint_slice(obj),
        "CertificateSigningRequest" => super::csr::validate(obj),
        "Node" => node(obj),
        _ => Vec::new(),
    }
}

/// kube-apiserver's `validateNodeSwapStatus` and
/// `validateNodeDeclaredFeatures` (pkg/apis/core/validation): a reported
/// swap capacity must be positive (a node without swap leaves
/// `nodeInfo.swap` out); `status.declaredFeatures` is sorted and without
/// duplicates. Checked on create and on every update (status too).
fn node(obj: &Value) -> Vec<Cause> {
    let mut out = Vec::new();
    if let Some(c) = obj
        .pointer("/status/nodeInfo/swap/capacity")
        .and_then(Value::as_i64)
        && c <= 0
    {
        out.push(Cause {
            reason: "FieldValueInvalid",
            message: format!("Invalid value: {c}: must be greater than zero"),
            field: "metadata.nodeSwapStatus.capacity".into(),
        });
    }
    let declared: Vec<&str> = obj
        .pointer("/status/declaredFeatures")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    for (i, pair) in declared.windows(2).enumerate() {
        let field = format!("status.declaredFeatures[{}]", i + 1);
        if pair[0] == pair[1] {
            out.push(Cause {
                reason: "FieldValueDuplicate",
                message: format!("Duplicate value: {:?}", pair[1]),
                field,
            });
        } else if pair[0] > pair[1] {
            out.push(Cause {
                reason: "FieldValueInvalid",
                message: format!(
                    "Invalid value: {:?}: list must be sorted alphabetically",
                    pair[1]
                ),
                field,
            });
        }
    }
    out
}

fn containers(
    list: Option<&Value>,
    field: &str,
    need_one: bool,
    out: &mut Vec<Cause>,
    names: &mut HashSet<String>,
) {
    let items = list.and_then(Value::as_array).cloned().unwrap_or_default();
    if need_one && items.is_empty() {
        out.push(required(field));
    }
    for (i, c) in items.iter().enumerate() {
        let n = c.get("name").and_then(Value::as_str).unwrap_or_default();
        if n.is_empty() {
            out.push(required(&format!("{field}[{i}].name")));
        } else if !is_dns1123_label(n) {
            out.push(invalid_value(
                &format!("{field}[{i}].name"),
                n,
                DNS1123_LABEL_MSG,
            ));
        } else if !names.insert(n.to_string()) {
            out.push(Cause {
                reason: "FieldValueDuplicate",
                message: format!("Duplicate value: \"{n}\""),
                field: format!("{field}[{i}].name"),
            });
        }
        if c.get("image")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .is_empty()
        {
            out.push(required(&format!("{field}[{i}].image")));
        }
    }
}

fn pod(obj: &Value) -> Vec<Cause> {
    let mut out = Vec::new();
    let spec = obj.get("spec");
    let mut names = HashSet::new();
    containers(
        spec.and_then(|s| s.get("containers")),
        "spec.containers",
        true,
        &mut out,
        &mut names,
    );
    containers(
        spec.and_then(|s| s.get("initContainers")),
        "spec.initContainers",
        false,
        &mut out,
        &mut names,
    );
    if let Some(rp) = spec
        .and_then(|s| s.get("restartPolicy"))
        .and_then(Value::as_str)
        && !["Always", "OnFailure", "Never"].contains(&rp)
    {
        out.push(Cause {
            reason: "FieldValueNotSupported",
            message: format!("Unsupported value: \"{rp}\": supported values: \"Always\", \"OnFailure\", \"Never\""),
            field: "spec.restartPolicy".into(),
        });
    }
    out
}

fn service(obj: &Value) -> Vec<Cause> {
    let mut out = Vec::new();
    let spec = obj.get("spec");
    let ty = spec
        .and_then(|s| s.get("type"))
        .and_then(Value::as_str)
        .unwrap_or("ClusterIP");
    if !["ClusterIP", "NodePort", "LoadBalancer", "ExternalName"].contains(&ty) {
        out.push(Cause {
            reason: "FieldValueNotSupported",
            message: format!("Unsupported value: \"{ty}\": supported values: \"ClusterIP\", \"ExternalName\", \"LoadBalancer\", \"NodePort\""),
            field: "spec.type".into(),
        });
    }
    let headless = spec
        .and_then(|s| s.get("clusterIP"))
        .and_then(Value::as_str)
        == Some("None");
    let ports = spec
        .and_then(|s| s.get("ports"))
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if ports.is_empty() && ty != "ExternalName" && !headless {
        out.push(required("spec.ports"));
    }
    if ty == "ExternalName"
        && spec
            .and_then(|s| s.get("externalName"))
            .and_then(Value::as_str)
            .unwrap_or_default()
            .is_empty()
    {
        out.push(required("spec.externalName"));
    }
    let mut names = HashSet::new();
    let mut pairs = HashSet::new();
    for (i, p) in ports.iter().enumerate() {
        let port = p.get("port").and_then(Value::as_i64).unwrap_or(0);
        if !(1..=65535).contains(&port) {
            out.push(invalid_value(
                &format!("spec.ports[{i}].port"),
                &port.to_string(),
                "must be between 1 and 65535, inclusive",
            ));
        }
        let n = p.get("name").and_then(Value::as_str).unwrap_or_default();
        if ports.len() > 1 && n.is_empty() {
            out.push(required(&format!("spec.ports[{i}].name")));
        }
        if !n.is_empty() && !names.insert(n.to_string()) {
            out.push(Cause {
                reason: "FieldValueDuplicate",
                message: format!("Duplicate value: \"{n}\""),
                field: format!("spec.ports[{i}].name"),
            });
        }
        let proto = p
            .get("protocol")
            .and_then(Value::as_str)
            .unwrap_or("TCP")
            .to_string();
        if !pairs.insert((port, proto.clone())) {
            out.push(Cause {
                reason: "FieldValueDuplicate",
                message: format!("Duplicate value: {{\"port\":{port},\"protocol\":\"{proto}\"}}"),
                field: format!("spec.ports[{i}]"),
            });
        }
    }
    out
}

fn endpoint_slice(obj: &Value) -> Vec<Cause> {
    let mut out = Vec::new();
    match obj.get("addressType").and_then(Value::as_str) {
        None | Some("") => out.push(required("addressType")),
        Some("IPv4" | "IPv6" | "FQDN") => {}
        Some(other) => out.push(Cause {
            reason: "FieldValueNotSupported",
            message: format!(
                "Unsupported value: \"{other}\": supported values: \"FQDN\", \"IPv4\", \"IPv6\""
            ),
            field: "addressType".into(),
        }),
    }
    if let Some(eps) = obj.get("endpoints").and_then(Value::as_array) {
        for (i, e) in eps.iter().enumerate() {
            if e.get("addresses")
                .and_then(Value::as_array)
                .is_none_or(|a| a.is_empty())
            {
                out.push(required(&format!("endpoints[{i}].addresses")));
            }
        }
    }
    out
}

/// A pod's spec may change only in container images, activeDeadlineSeconds,
/// added tolerations and terminationGracePeriodSeconds; checks that.
pub fn pod_spec_update(old: &Value, new: &Value) -> Vec<Cause> {
    let strip = |spec: &Value| {
        let mut s = spec.clone();
        if let Some(m) = s.as_object_mut() {
            m.remove("activeDeadlineSeconds");
            m.remove("tolerations");
            m.remove("terminationGracePeriodSeconds");
            for l in ["containers", "initContainers"] {
                if let Some(cs) = m.get_mut(l).and_then(Value::as_array_mut) {
                    for c in cs {
                        if let Some(cm) = c.as_object_mut() {
                            cm.remove("image");
                        }
                    }
                }
            }
        }
        s
    };
    let (o, n) = (
        old.get("spec").cloned().unwrap_or_default(),
        new.get("spec").cloned().unwrap_or_default(),
    );
    if strip(&o) == strip(&n) {
        return Vec::new();
    }
    vec![Cause {
        reason: "FieldValueForbidden",
        message: "Forbidden: pod updates may not change fields other than `spec.containers[*].image`,`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions to existing tolerations),`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)".into(),
        field: "spec".into(),
    }]
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn names() {
        assert!(name("Pod", "web-1.a").is_empty());
        assert!(!name("Pod", "Web").is_empty());
        assert!(!name("Service", "1abc").is_empty());
        assert!(!name("Namespace", "a.b").is_empty());
        assert_eq!(name("ConfigMap", "")[0].field, "metadata.name");
        // Parts of a subdomain may be longer than a label; the whole is at
        // most 253 (as the real API server checks pod names).
        let long = format!("{}.{}", "a".repeat(126), "b".repeat(126));
        assert!(name("Pod", &long).is_empty());
        assert!(!name("Pod", &format!("{long}x")).is_empty());
    }

    #[test]
    fn node_swap_capacity_must_be_positive() {
        let with = |c: i64| json!({"status": {"nodeInfo": {"swap": {"capacity": c}}}});
        let causes = object("Node", &with(0));
        assert_eq!(causes.len(), 1);
        assert_eq!(causes[0].field, "metadata.nodeSwapStatus.capacity");
        assert!(object("Node", &with(1 << 30)).is_empty());
        assert!(object("Node", &json!({"status": {"nodeInfo": {}}})).is_empty());
        let declared = |f: serde_json::Value| json!({"status": {"declaredFeatures": f}});
        assert!(object("Node", &declared(json!(["A", "B"]))).is_empty());
        let causes = object("Node", &declared(json!(["B", "A"])));
        assert_eq!(causes[0].field, "status.declaredFeatures[1]");
        assert_eq!(
            causes[0].message,
            "Invalid value: \"A\": list must be sorted alphabetically"
        );
        assert_eq!(
            object("Node", &declared(json!(["A", "A"])))[0].reason,
            "FieldValueDuplicate"
        );
    }

    #[test]
    fn pod_and_service_rules() {
        assert_eq!(
            object("Pod", &json!({"spec": {}}))[0].field,
            "spec.containers"
        );
        let dup = json!({"spec": {"containers": [{"name": "a", "image": "x"}, {"name": "a", "image": "y"}]}});
        assert_eq!(object("Pod", &dup)[0].reason, "FieldValueDuplicate");
        let svc = json!({"spec": {"ports": [{"port": 80}, {"port": 81}]}});
        assert_eq!(object("Service", &svc).len(), 2);
        let old = json!({"spec": {"containers": [{"name": "a", "image": "x"}], "nodeName": ""}});
        let img = json!({"spec": {"containers": [{"name": "a", "image": "y"}], "nodeName": ""}});
        let node = json!({"spec": {"containers": [{"name": "a", "image": "x"}], "nodeName": "n"}});
        assert!(pod_spec_update(&old, &img).is_empty());
        assert!(!pod_spec_update(&old, &node).is_empty());
    }
}

fn statuses<'a>(pod: &'a Value, list: &str) -> Vec<&'a Value> {
    pod.pointer(&format!("/status/{list}"))
        .and_then(Value::as_array)
        .map(|a| a.iter().collect())
        .unwrap_or_default()
}

/// kubelet's `FindMatchingContainerRestartRule`: the action of the first
/// of the container's `restartPolicyRules` whose exit codes match.
fn matching_restart_rule(c: &Value, exit: i64) -> Option<&str> {
    c.get("restartPolicyRules")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .find_map(|rule| {
            let codes = rule.get("exitCodes")?;
            let listed = codes
                .get("values")
                .and_then(Value::as_array)
                .is_some_and(|v| v.iter().any(|x| x.as_i64() == Some(exit)));
            let hit = match codes.get("operator").and_then(Value::as_str) {
                Some("In") => listed,
                Some("NotIn") => !listed,
                _ => false,
            };
            if hit {
                rule.get("action").and_then(Value::as_str)
            } else {
                None
            }
        })
}

/// `ContainerShouldRestart` (ContainerRestartRules and
/// RestartAllContainersOnContainerExits, on in v1.36): the container's
/// rules, then its own `restartPolicy`, then the pod's.
fn container_should_restart(c: &Value, pod_policy: &str, exit: i64) -> bool {
    if let Some(policy) = c.get("restartPolicy").and_then(Value::as_str) {
        if matches!(
            matching_restart_rule(c, exit),
            Some("Restart" | "RestartAllContainers")
        ) {
            return true;
        }
        match policy {
            "Always" => return true,
            "OnFailure" => return exit != 0,
            "Never" => return false,
            _ => {}
        }
    }
    match pod_policy {
        "OnFailure" => exit != 0,
        "Never" => false,
        _ => true,
    }
}

/// `AllContainersCouldRestart`: a container has a `RestartAllContainers`
/// rule, so any container may leave the terminated state.
fn all_containers_could_restart(pod: &Value) -> bool {
    ["/spec/initContainers", "/spec/containers"]
        .iter()
        .filter_map(|p| pod.pointer(p).and_then(Value::as_array))
        .flatten()
        .filter_map(|c| c.get("restartPolicyRules").and_then(Value::as_array))
        .flatten()
        .any(|r| r.get("action").and_then(Value::as_str) == Some("RestartAllContainers"))
}

/// Terminated containers that may not run again must stay terminated
/// (`ValidateContainerStateTransition` and its init and ephemeral
/// forms, with ContainerRestartRules on): `may_restart(name, exit code)`
/// says whether that container may run again.
fn state_transitions(
    old: &Value,
    new: &Value,
    list: &str,
    may_restart: &dyn Fn(&str, i64) -> bool,
) -> Vec<Cause> {
    let mut out = Vec::new();
    let new_list = statuses(new, list);
    for (i, o) in statuses(old, list).iter().enumerate() {
        let Some(term) = o.pointer("/state/terminated").filter(|t| t.is_object()) else {
            continue;
        };
        let exit = term.get("exitCode").and_then(Value::as_i64).unwrap_or(0);
        let name = o.get("name").and_then(Value::as_str).unwrap_or_default();
        let back = new_list.iter().any(|n| {
            n.get("name").and_then(Value::as_str) == Some(name)
                && n.pointer("/state/terminated")
                    .is_none_or(|t| !t.is_object())
        });
        if back && !may_restart(name, exit) {
            out.push(Cause {
                reason: "FieldValueForbidden",
                message: "Forbidden: may not be transitioned to non-terminated state".into(),
                field: format!("status.{list}[{i}].state"),
            });
        }
    }
    out
}

/// Checks a pod status update as upstream does for what a node agent
/// writes: qosClass is immutable, terminated containers that will not be
/// restarted stay terminated, pod and host IPs are IP addresses.
pub fn pod_status_update(old: &Value, new: &Value) -> Vec<Cause> {
    let mut out = Vec::new();
    let old_qos = old
        .pointer("/status/qosClass")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let new_qos = new
        .pointer("/status/qosClass")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if old_qos != new_qos {
        out.push(invalid_value(
            "status.qosClass",
            new_qos,
            "field is immutable",
        ));
    }
    let policy = old
        .pointer("/spec/restartPolicy")
        .and_then(Value::as_str)
        .unwrap_or("Always");
    if !all_containers_could_restart(old) {
        for (list, spec) in [
            ("containerStatuses", "/spec/containers"),
            ("initContainerStatuses", "/spec/initContainers"),
        ] {
            let specs = old.pointer(spec).and_then(Value::as_array);
            let may_restart = |name: &str, exit: i64| {
                specs
                    .into_iter()
                    .flatten()
                    .find(|c| c.get("name").and_then(Value::as_str) == Some(name))
                    .is_some_and(|c| container_should_restart(c, policy, exit))
            };
            out.extend(state_transitions(old, new, list, &may_restart));
        }
    }
    out.extend(state_transitions(
        old,
        new,
        "ephemeralContainerStatuses",
        &|_, _| false,
    ));
    if let Some(ip) = new.pointer("/status/podIP").and_then(Value::as_str)
        && !ip.is_empty()
        && ip.parse::<std::net::IpAddr>().is_err()
    {
        out.push(invalid_value(
            "status.podIP",
            ip,
            "must be a valid IP address",
        ));
    }
    for list in ["podIPs", "hostIPs"] {
        for (i, e) in statuses(new, list).iter().enumerate() {
            let ip = e.get("ip").and_then(Value::as_str).unwrap_or_default();
            if ip.parse::<std::net::IpAddr>().is_err() {
                out.push(invalid_value(
                    &format!("status.{list}[{i}].ip"),
                    ip,
                    "must be a valid IP address",
                ));
            }
        }
    }
    out
}

#[cfg(test)]
mod status_tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn terminated_containers_stay_terminated_unless_restarted_by_policy() {
        let old = |policy: &str, exit: i64| {
            json!({"spec": {"restartPolicy": policy, "containers": [{"name": "c"}]},
                "status": {"qosClass": "BestEffort",
                "containerStatuses": [{"name": "c", "state": {"terminated": {"exitCode": exit}}}]}})
        };
        let running = json!({"status": {"qosClass": "BestEffort", "containerStatuses": [{"name": "c", "state": {"running": {}}}]}});
        assert_eq!(
            pod_status_update(&old("Never", 1), &running)[0].field,
            "status.containerStatuses[0].state"
        );
        assert!(!pod_status_update(&old("OnFailure", 0), &running).is_empty());
        assert!(pod_status_update(&old("OnFailure", 1), &running).is_empty());
        assert!(pod_status_update(&old("Always", 0), &running).is_empty());
        let qos = json!({"status": {"qosClass": "Guaranteed"}});
        assert_eq!(
            pod_status_update(&old("Always", 0), &qos)[0].field,
            "status.qosClass"
        );
        // A container's rules and policy decide before the pod's; a
        // RestartAllContainers rule lets every container run again.
        let with = |c: serde_json::Value, exit: i64| {
            json!({"spec": {"restartPolicy": "Never", "containers": [c, {"name": "other"}]},
                "status": {"qosClass": "BestEffort", "containerStatuses": [
                    {"name": "c", "state": {"terminated": {"exitCode": exit}}},
                    {"name": "other", "state": {"terminated": {"exitCode": 0}}}]}})
        };
        let both_running = json!({"status": {"qosClass": "BestEffort", "containerStatuses": [
            {"name": "c", "state": {"running": {}}}, {"name": "other", "state": {"running": {}}}]}});
        let rule = |action: &str| {
            json!({"name": "c", "restartPolicy": "Never", "restartPolicyRules": [
                {"action": action, "exitCodes": {"operator": "In", "values": [42]}}]})
        };
        let causes = pod_status_update(&with(rule("Restart"), 42), &both_running);
        assert_eq!(causes.len(), 1);
        assert_eq!(causes[0].field, "status.containerStatuses[1].state");
        assert_eq!(
            pod_status_update(&with(rule("Restart"), 1), &both_running).len(),
            2
        );
        assert!(
            pod_status_update(&with(rule("RestartAllContainers"), 1), &both_running).is_empty()
        );
        let bad_ip = json!({"status": {"qosClass": "BestEffort", "podIP": "nope"}});
        assert_eq!(
            pod_status_update(&old("Always", 0), &bad_ip)[0].field,
            "status.podIP"
        );
    }
}
