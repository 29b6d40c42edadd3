//! The `pods/ephemeralcontainers` subresource as kube-apiserver v1.36
//! serves it (`pkg/registry/core/pod/strategy.go`
//! `ephemeralContainersStrategy` and `dropNonEphemeralContainerUpdates`;
//! `pkg/apis/core/validation/validation.go`
//! `ValidatePodEphemeralContainersUpdate` and `validateEphemeralContainers`):
//! only `spec.ephemeralContainers` is taken from the request; existing ones
//! may be neither removed nor changed, a new one needs a name unique among
//! all the pod's containers, a `targetContainerName` naming a regular or
//! init container, and none of the fields an ephemeral container may not
//! have (ports, probes, lifecycle, resources, ...). `kubectl debug` and the
//! e2e suite's `AddEphemeralContainerSync` PATCH it; `UpdateEphemeralContainers`
//! PUTs it.

use std::collections::HashSet;

use serde_json::{Value, json};

use super::error::Cause;

fn forbidden(field: &str, detail: &str) -> Cause {
    Cause {
        reason: "FieldValueForbidden",
        message: format!("Forbidden: {detail}"),
        field: field.into(),
    }
}

fn list<'a>(pod: &'a Value, name: &str) -> Vec<&'a Value> {
    pod.pointer(&format!("/spec/{name}"))
        .and_then(Value::as_array)
        .map(|a| a.iter().collect())
        .unwrap_or_default()
}

fn name_of(c: &Value) -> &str {
    c.get("name").and_then(Value::as_str).unwrap_or_default()
}

/// `dropNonEphemeralContainerUpdates`: the old pod with the new
/// `spec.ephemeralContainers` (the caller carries the metadata over).
pub fn drop_non_ephemeral_updates(old: &Value, new: &Value) -> Value {
    let mut out = old.clone();
    let eph = new
        .pointer("/spec/ephemeralContainers")
        .cloned()
        .filter(|v| !v.is_null());
    if let Some(spec) = out
        .as_object_mut()
        .map(|o| o.entry("spec").or_insert_with(|| json!({})))
        .and_then(Value::as_object_mut)
    {
        match eph {
            Some(v) => spec.insert("ephemeralContainers".into(), v),
            None => spec.remove("ephemeralContainers"),
        };
    }
    out
}

/// Fields of `EphemeralContainerCommon` outside upstream's
/// `allowedEphemeralContainerFields`.
const DISALLOWED: &[&str] = &[
    "ports",
    "resources",
    "resizePolicy",
    "restartPolicy",
    "restartPolicyRules",
    "lifecycle",
    "livenessProbe",
    "readinessProbe",
    "startupProbe",
];

/// Whether a field differs from its Go zero value (`validateFieldAllowList`
/// compares with `reflect.Zero`: an empty `resources` is not set).
fn is_set(v: &Value) -> bool {
    match v {
        Value::Null => false,
        Value::Object(m) => m.values().any(is_set),
        Value::Array(a) => !a.is_empty(),
        Value::String(s) => !s.is_empty(),
        Value::Bool(b) => *b,
        Value::Number(_) => true,
    }
}

/// `ValidatePodEphemeralContainersUpdate` plus `validateEphemeralContainers`
/// for what the test server checks.
pub fn validate(old: &Value, new: &Value) -> Vec<Cause> {
    if old
        .pointer("/metadata/annotations/kubernetes.io~1config.mirror")
        .is_some()
    {
        return vec![forbidden(
            "",
            "static pods do not support ephemeral containers",
        )];
    }
    let mut errs = Vec::new();
    let old_eph = list(old, "ephemeralContainers");
    let new_eph = list(new, "ephemeralContainers");
    for o in &old_eph {
        match new_eph.iter().find(|n| name_of(n) == name_of(o)) {
            None => errs.push(forbidden(
                "spec.ephemeralContainers",
                &format!(
                    "existing ephemeral containers {:?} may not be removed\n",
                    name_of(o)
                ),
            )),
            Some(n) if n != o => errs.push(forbidden(
                "spec.ephemeralContainers",
                &format!(
                    "existing ephemeral containers {:?} may not be changed\n",
                    name_of(o)
                ),
            )),
            Some(_) => {}
        }
    }
    let others: HashSet<&str> = list(new, "containers")
        .into_iter()
        .chain(list(new, "initContainers"))
        .map(name_of)
        .collect();
    let mut all = others.clone();
    for (i, e) in new_eph.iter().enumerate() {
        let path = format!("spec.ephemeralContainers[{i}]");
        let name = name_of(e);
        if !all.insert(name) {
            errs.push(Cause {
                reason: "FieldValueDuplicate",
                message: format!("Duplicate value: {name:?}"),
                field: format!("{path}.name"),
            });
        }
        if let Some(t) = e.get("targetContainerName").and_then(Value::as_str)
            && !t.is_empty()
            && !others.contains(t)
        {
            errs.push(Cause {
                reason: "FieldValueNotFound",
                message: format!("Not found: {t:?}"),
                field: format!("{path}.targetContainerName"),
            });
        }
        for f in DISALLOWED {
            if e.get(*f).is_some_and(is_set) {
                errs.push(forbidden(
                    &format!("{path}.{f}"),
                    "cannot be set for an Ephemeral Container",
                ));
            }
        }
        for (j, m) in e
            .get("volumeMounts")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .enumerate()
        {
            for f in ["subPath", "subPathExpr"] {
                if m.get(f)
                    .and_then(Value::as_str)
                    .is_some_and(|s| !s.is_empty())
                {
                    errs.push(forbidden(
                        &format!("{path}.volumeMounts[{j}].{f}"),
                        "cannot be set for an Ephemeral Container",
                    ));
                }
            }
        }
    }
    errs
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(eph: Value) -> Value {
        json!({"metadata": {"name": "p"}, "spec": {
            "containers": [{"name": "app", "image": "i"}],
            "ephemeralContainers": eph}})
    }

    #[test]
    fn only_ephemeral_containers_change_and_existing_ones_stay() {
        let old = pod(json!([{"name": "dbg", "image": "b"}]));
        let mut new = pod(
            json!([{"name": "dbg", "image": "b"}, {"name": "dbg2", "image": "b",
                                  "targetContainerName": "app"}]),
        );
        new["spec"]["containers"][0]["image"] = json!("other");
        let merged = drop_non_ephemeral_updates(&old, &new);
        assert_eq!(merged["spec"]["containers"][0]["image"], "i");
        assert_eq!(merged["spec"]["ephemeralContainers"][1]["name"], "dbg2");
        assert!(validate(&old, &merged).is_empty());

        let removed = drop_non_ephemeral_updates(&old, &pod(json!([])));
        assert!(
            validate(&old, &removed)[0]
                .message
                .contains("may not be removed")
        );
        let changed = pod(json!([{"name": "dbg", "image": "c"}]));
        assert!(
            validate(&old, &changed)[0]
                .message
                .contains("may not be changed")
        );
    }

    #[test]
    fn new_ephemeral_containers_are_checked() {
        let old = pod(json!([]));
        let bad = pod(json!([
            {"name": "app", "image": "b"},
            {"name": "x", "image": "b", "targetContainerName": "nope",
             "ports": [{"containerPort": 80}], "resources": {},
             "volumeMounts": [{"name": "v", "mountPath": "/v", "subPath": "s"}]}
        ]));
        let fields: Vec<String> = validate(&old, &bad).into_iter().map(|c| c.field).collect();
        assert_eq!(
            fields,
            [
                "spec.ephemeralContainers[0].name",
                "spec.ephemeralContainers[1].targetContainerName",
                "spec.ephemeralContainers[1].ports",
                "spec.ephemeralContainers[1].volumeMounts[0].subPath",
            ]
        );
    }
}
