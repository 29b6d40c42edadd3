//! The `pods/resize` subresource as kube-apiserver v1.36 serves it
//! (`pkg/registry/core/pod/strategy.go` `podResizeStrategy`,
//! `pkg/apis/core/validation` `ValidatePodResize`): only containers' and
//! init containers' `resources` and `resizePolicy`, and the pod-level
//! `resources` (InPlacePodLevelResourcesVerticalScaling, beta and on),
//! are taken from the request; the rest of the spec, the status and the
//! system metadata stay. The resize is refused for static pods, for a QoS
//! class change, for a removed request or limit, for anything but cpu and
//! memory, and — the version-skew rule — for a pod whose running
//! containers' statuses carry no `resources` (a node without resize
//! support).

use serde_json::{Map, Value, json};

use super::defaults;
use super::error::{Cause, invalid_value};

fn forbidden(field: &str, detail: &str) -> Cause {
    Cause {
        reason: "FieldValueForbidden",
        message: format!("Forbidden: {detail}"),
        field: field.into(),
    }
}

fn containers<'a>(pod: &'a Value, list: &str) -> Vec<&'a Value> {
    pod.pointer(&format!("/spec/{list}"))
        .and_then(Value::as_array)
        .map(|a| a.iter().collect())
        .unwrap_or_default()
}

fn name_of(c: &Value) -> &str {
    c.get("name").and_then(Value::as_str).unwrap_or_default()
}

/// `dropNonResizeUpdates`: the old pod with the new containers' resources
/// and resize policies and the new pod-level resources. Added, removed or
/// renamed containers leave the new spec as sent, for validation to refuse.
pub fn drop_non_resize_updates(old: &Value, new: &Value) -> Value {
    let mut out = old.clone();
    let mut spec = old.get("spec").cloned().unwrap_or_else(|| json!({}));
    for list in ["containers", "initContainers"] {
        let (o, n) = (containers(old, list), containers(new, list));
        if o.len() != n.len() || o.iter().zip(&n).any(|(a, b)| name_of(a) != name_of(b)) {
            return new.clone();
        }
        let merged: Vec<Value> = o
            .iter()
            .zip(&n)
            .map(|(a, b)| {
                let mut c = (*a).clone();
                if let Some(m) = c.as_object_mut() {
                    for key in ["resources", "resizePolicy"] {
                        match b.get(key) {
                            Some(v) => m.insert(key.into(), v.clone()),
                            None => m.remove(key),
                        };
                    }
                }
                c
            })
            .collect();
        if let Some(m) = spec.as_object_mut()
            && !merged.is_empty()
        {
            m.insert(list.into(), Value::Array(merged));
        }
    }
    if let Some(m) = spec.as_object_mut() {
        match new.pointer("/spec/resources") {
            Some(r) => m.insert("resources".into(), r.clone()),
            None => m.remove("resources"),
        };
    }
    if let Some(o) = out.as_object_mut() {
        o.insert("spec".into(), spec);
    }
    out
}

/// A resource list's names and canonical values (`1` == `1000m`).
fn quantities(list: Option<&Value>) -> Map<String, Value> {
    list.and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .map(|(k, v)| {
                    let text = v.as_str().unwrap_or_default();
                    let canon = keelson::quantity::Quantity::parse(text)
                        .map(|q| json!(q.milli_value().to_string()))
                        .unwrap_or_else(|_| v.clone());
                    (k.clone(), canon)
                })
                .collect()
        })
        .unwrap_or_default()
}

fn removed(new: Option<&Value>, old: Option<&Value>) -> bool {
    let (n, o) = (quantities(new), quantities(old));
    o.keys().any(|k| !n.contains_key(k))
}

/// A container with its cpu and memory taken from the old one
/// (`dropCPUMemoryResourcesFromContainer`), for the "nothing else changed"
/// comparison.
fn without_cpu_memory_changes(new: &Value, old: &Value) -> Value {
    let mut c = new.clone();
    let raw = |v: Option<&Value>| v.and_then(Value::as_object).cloned().unwrap_or_default();
    let munge = |n: Option<&Value>, o: Option<&Value>| -> Option<Value> {
        let mut m = raw(n);
        if n.is_none() && o.is_none() {
            return None;
        }
        m.remove("cpu");
        m.remove("memory");
        let om = raw(o);
        for k in ["cpu", "memory"] {
            if let Some(v) = om.get(k) {
                m.insert(k.into(), v.clone());
            }
        }
        Some(Value::Object(m))
    };
    let lim = munge(
        new.pointer("/resources/limits"),
        old.pointer("/resources/limits"),
    );
    let req = munge(
        new.pointer("/resources/requests"),
        old.pointer("/resources/requests"),
    );
    if let Some(m) = c.as_object_mut() {
        let mut r = Map::new();
        if let Some(l) = lim {
            r.insert("limits".into(), l);
        }
        if let Some(q) = req {
            r.insert("requests".into(), q);
        }
        m.insert("resources".into(), Value::Object(r));
    }
    c
}

fn canonical_container(c: &Value) -> Value {
    let mut c = c.clone();
    if let Some(m) = c.as_object_mut() {
        let r = m.get("resources").cloned().unwrap_or_else(|| json!({}));
        let mut canon = Map::new();
        for k in ["limits", "requests"] {
            let q = quantities(r.get(k));
            if !q.is_empty() {
                canon.insert(k.into(), Value::Object(q));
            }
        }
        m.insert("resources".into(), Value::Object(canon));
    }
    c
}

/// `isPodResizeRequestSupported`: the first running container's status
/// must carry `resources`; with none running, assume support.
fn node_supports_resize(old: &Value) -> bool {
    for cs in old
        .pointer("/status/containerStatuses")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        if cs.pointer("/state/running").is_some_and(|r| !r.is_null()) {
            return cs.get("resources").is_some_and(|r| !r.is_null());
        }
    }
    true
}

/// `ValidatePodResize` (the parts that are not general pod validation).
pub fn validate(old: &Value, new: &Value) -> Vec<Cause> {
    if old
        .pointer("/metadata/annotations/kubernetes.io~1config.mirror")
        .is_some()
    {
        return vec![forbidden("", "static pods cannot be resized")];
    }
    if old.pointer("/spec/os/name").and_then(Value::as_str) == Some("windows") {
        return vec![forbidden("", "windows pods cannot be resized")];
    }
    let mut errs = Vec::new();
    let old_qos = old
        .pointer("/status/qosClass")
        .and_then(Value::as_str)
        .map(str::to_string)
        .unwrap_or_else(|| defaults::qos_class(old).to_string());
    if old_qos != defaults::qos_class(new) {
        errs.push(invalid_value(
            "spec",
            &old_qos,
            "Pod QOS Class may not change as a result of resizing",
        ));
    }
    if !node_supports_resize(old) {
        errs.push(forbidden(
            "spec",
            "Pod running on node without support for resize",
        ));
    }
    // Pod-level resources.
    let (opr, npr) = (
        old.pointer("/spec/resources"),
        new.pointer("/spec/resources"),
    );
    let set = |r: Option<&Value>| {
        r.is_some_and(|r| {
            !quantities(r.get("requests")).is_empty() || !quantities(r.get("limits")).is_empty()
        })
    };
    if set(opr) || set(npr) {
        if opr.is_some() && npr.is_none() {
            errs.push(forbidden(
                "spec.resources",
                "pod-level resources cannot be removed",
            ));
            return errs;
        }
        if removed(
            npr.and_then(|r| r.get("requests")),
            opr.and_then(|r| r.get("requests")),
        ) {
            errs.push(forbidden(
                "spec.resources.requests",
                "pod-level resource requests cannot be removed",
            ));
        }
        if removed(
            npr.and_then(|r| r.get("limits")),
            opr.and_then(|r| r.get("limits")),
        ) {
            errs.push(forbidden(
                "spec.resources.limits",
                "pod-level resource limits cannot be removed",
            ));
        }
        let masked = without_cpu_memory_changes(
            &json!({"resources": npr.cloned().unwrap_or_default()}),
            &json!({"resources": opr.cloned().unwrap_or_default()}),
        );
        let old_canon =
            canonical_container(&json!({"resources": opr.cloned().unwrap_or_default()}));
        if canonical_container(&masked) != old_canon {
            errs.push(forbidden(
                "spec",
                "only cpu and memory resources are mutable at pod-level",
            ));
        }
    }
    // Container ordering.
    let mut order = Vec::new();
    for (list, label) in [
        ("containers", "containers"),
        ("initContainers", "initContainers"),
    ] {
        let (o, n) = (containers(old, list), containers(new, list));
        if o.len() != n.len() {
            order.push(forbidden(
                &format!("spec.{label}"),
                &format!("{label} may not be added or removed on resize"),
            ));
        } else {
            for (i, (a, b)) in o.iter().zip(&n).enumerate() {
                if name_of(a) != name_of(b) {
                    order.push(forbidden(
                        &format!("spec.{label}[{i}].name"),
                        &format!("{label} may not be renamed or reordered on resize"),
                    ));
                }
            }
        }
    }
    if !order.is_empty() {
        errs.extend(order);
        return errs;
    }
    for (list, label) in [
        ("initContainers", "initContainers"),
        ("containers", "containers"),
    ] {
        for (i, (o, n)) in containers(old, list)
            .iter()
            .zip(containers(new, list))
            .enumerate()
        {
            let path = format!("spec.{label}[{i}].resources");
            if removed(
                n.pointer("/resources/requests"),
                o.pointer("/resources/requests"),
            ) {
                errs.push(forbidden(
                    &format!("{path}.requests"),
                    "resource requests cannot be removed",
                ));
            }
            if removed(
                n.pointer("/resources/limits"),
                o.pointer("/resources/limits"),
            ) {
                errs.push(forbidden(
                    &format!("{path}.limits"),
                    "resource limits cannot be removed",
                ));
            }
        }
    }
    // Only cpu and memory may change.
    let mut other_changes = false;
    for (o, n) in containers(old, "containers")
        .iter()
        .zip(containers(new, "containers"))
    {
        let masked = without_cpu_memory_changes(n, o);
        if canonical_container(&masked) != canonical_container(o) {
            errs.push(forbidden(
                "spec",
                "only cpu and memory resources are mutable",
            ));
            other_changes = true;
        }
    }
    for (i, (o, n)) in containers(old, "initContainers")
        .iter()
        .zip(containers(new, "initContainers"))
        .enumerate()
    {
        let sidecar = n.get("restartPolicy").and_then(Value::as_str) == Some("Always");
        let modified = canonical_container(o) != canonical_container(n);
        let masked = without_cpu_memory_changes(n, o);
        if canonical_container(&masked) != canonical_container(o) {
            errs.push(forbidden(
                &format!("spec.initContainers[{i}]"),
                "only cpu and memory resources for init or sidecar containers are mutable",
            ));
            other_changes = true;
        }
        if modified && !sidecar {
            let restart = n
                .get("resizePolicy")
                .and_then(Value::as_array)
                .is_some_and(|ps| {
                    ps.iter().any(|p| {
                        p.get("restartPolicy").and_then(Value::as_str) == Some("RestartContainer")
                    })
                });
            if restart {
                errs.push(forbidden(
                    &format!("spec.initContainers[{i}]"),
                    "non-sidecar init containers with a resize policy of RestartContainer cannot be resized",
                ));
            }
        }
    }
    if !errs.is_empty() || other_changes {
        return errs;
    }
    // Anything else in the spec changed.
    let strip = |pod: &Value| {
        let mut s = pod.get("spec").cloned().unwrap_or_default();
        if let Some(m) = s.as_object_mut() {
            m.remove("resources");
            for list in ["containers", "initContainers"] {
                if let Some(cs) = m.get_mut(list).and_then(Value::as_array_mut) {
                    for c in cs {
                        if let Some(cm) = c.as_object_mut() {
                            cm.remove("resources");
                            cm.remove("resizePolicy");
                        }
                    }
                }
            }
        }
        s
    };
    if strip(old) != strip(new) {
        errs.push(forbidden(
            "spec",
            "only cpu and memory resources are mutable",
        ));
    }
    errs
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(cpu: &str, running_resources: bool) -> Value {
        let mut cs = json!({"name": "c", "state": {"running": {}}});
        if running_resources {
            cs["resources"] = json!({"requests": {"cpu": cpu}});
        }
        json!({
            "metadata": {"name": "p"},
            "spec": {"containers": [{"name": "c", "image": "i",
                "resources": {"requests": {"cpu": cpu, "memory": "64Mi"}}}]},
            "status": {"qosClass": "Burstable", "containerStatuses": [cs]}
        })
    }

    #[test]
    fn only_resources_are_taken_and_checked() {
        let old = pod("100m", true);
        let mut new = pod("200m", true);
        new["spec"]["containers"][0]["image"] = json!("other");
        new["spec"]["nodeName"] = json!("elsewhere");
        let merged = drop_non_resize_updates(&old, &new);
        assert_eq!(merged["spec"]["containers"][0]["image"], "i");
        assert_eq!(
            merged["spec"]["containers"][0]["resources"]["requests"]["cpu"],
            "200m"
        );
        assert!(merged["spec"].get("nodeName").is_none());
        assert!(validate(&old, &merged).is_empty());
    }

    #[test]
    fn refusals() {
        let old = pod("100m", false);
        let errs = validate(&old, &pod("200m", false));
        assert_eq!(errs.len(), 1);
        assert_eq!(
            errs[0].message,
            "Forbidden: Pod running on node without support for resize"
        );
        let old = pod("100m", true);
        let mut new = pod("100m", true);
        new["spec"]["containers"][0]["resources"] = json!({"requests": {"cpu": "100m"}});
        assert_eq!(
            validate(&old, &new)[0].message,
            "Forbidden: resource requests cannot be removed"
        );
        let mut new = pod("100m", true);
        new["spec"]["containers"][0]["resources"]["requests"]["ephemeral-storage"] = json!("1Gi");
        assert_eq!(
            validate(&old, &new)[0].message,
            "Forbidden: only cpu and memory resources are mutable"
        );
        let mut new = pod("100m", true);
        new["spec"]["containers"][0]["resources"] = json!({"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"cpu": "100m", "memory": "64Mi"}});
        assert_eq!(
            validate(&old, &new)[0].message,
            "Invalid value: \"Burstable\": Pod QOS Class may not change as a result of resizing"
        );
    }
}
