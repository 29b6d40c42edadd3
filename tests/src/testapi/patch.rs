//! PATCH bodies: JSON patch (RFC 6902), JSON merge patch (RFC 7386),
//! strategic merge patch with the merge keys of the served types, and the
//! apply patch (server-side apply, simplified; see tests/README.md).

use serde_json::{Map, Value};

use super::error::ApiError;

/// The patch types served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchType {
    /// `application/json-patch+json`
    Json,
    /// `application/merge-patch+json`
    Merge,
    /// `application/strategic-merge-patch+json`
    Strategic,
    /// `application/apply-patch+yaml`
    Apply,
}

impl PatchType {
    /// From a request Content-Type.
    pub fn from_content_type(ct: &str) -> Option<PatchType> {
        let base = ct.split(';').next().unwrap_or_default().trim();
        match base {
            "application/json-patch+json" => Some(PatchType::Json),
            "application/merge-patch+json" => Some(PatchType::Merge),
            "application/strategic-merge-patch+json" => Some(PatchType::Strategic),
            "application/apply-patch+yaml" => Some(PatchType::Apply),
            _ => None,
        }
    }
}

/// How a list field is merged by a strategic merge patch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ListStrategy {
    /// The patch's list replaces the original (atomic lists, the default).
    Replace,
    /// Elements are maps merged by this key.
    MergeKey(&'static str),
    /// Elements are scalars, the lists are united.
    MergePrimitive,
}

/// Merge strategy of the list at `path` (field names, no indices) in an
/// object of `kind`, after the `patchStrategy`/`patchMergeKey` tags of the
/// upstream Go types.
fn list_strategy(kind: &str, path: &[&str]) -> ListStrategy {
    use ListStrategy::*;
    match path {
        ["metadata", "finalizers"] => return MergePrimitive,
        ["metadata", "ownerReferences"] => return MergeKey("uid"),
        _ => {}
    }
    match (kind, path) {
        (
            "Pod",
            [
                "spec",
                "containers" | "initContainers" | "ephemeralContainers",
            ],
        ) => MergeKey("name"),
        (
            "Pod",
            [
                "spec",
                "containers" | "initContainers" | "ephemeralContainers",
                field,
            ],
        ) => match *field {
            "ports" => MergeKey("containerPort"),
            "env" => MergeKey("name"),
            "volumeMounts" => MergeKey("mountPath"),
            "volumeDevices" => MergeKey("devicePath"),
            _ => Replace,
        },
        ("Pod", ["spec", "volumes"]) => MergeKey("name"),
        (
            "Pod",
            [
                "spec",
                "imagePullSecrets" | "schedulingGates" | "resourceClaims",
            ],
        ) => MergeKey("name"),
        ("Pod", ["spec", "hostAliases"]) => MergeKey("ip"),
        ("Pod", ["spec", "topologySpreadConstraints"]) => MergeKey("topologyKey"),
        ("Pod", ["status", "conditions"]) => MergeKey("type"),
        ("Pod", ["status", "podIPs" | "hostIPs"]) => MergeKey("ip"),
        ("Pod", ["status", "resourceClaimStatuses"]) => MergeKey("name"),
        ("Node", ["spec", "podCIDRs"]) => MergePrimitive,
        ("Node", ["status", "conditions" | "addresses"]) => MergeKey("type"),
        ("Namespace", ["status", "conditions"]) => MergeKey("type"),
        ("Service", ["spec", "ports"]) => MergeKey("port"),
        ("Service", ["status", "conditions"]) => MergeKey("type"),
        _ => Replace,
    }
}

fn bad(msg: impl Into<String>) -> ApiError {
    ApiError::bad_request(msg)
}

/// Applies a patch of `ty` to `original` (an object of `kind`).
pub fn apply(ty: PatchType, kind: &str, original: &Value, body: &[u8]) -> Result<Value, ApiError> {
    match ty {
        PatchType::Json => {
            let p: json_patch::Patch = serde_json::from_slice(body)
                .map_err(|e| bad(format!("the server rejected our request due to an error in our request: invalid JSON patch: {e}")))?;
            let mut doc = original.clone();
            json_patch::patch(&mut doc, &p).map_err(|e| {
                ApiError::invalid(
                    "",
                    kind,
                    "",
                    vec![super::error::Cause {
                        reason: "FieldValueInvalid",
                        message: e.to_string(),
                        field: String::new(),
                    }],
                )
            })?;
            Ok(doc)
        }
        PatchType::Merge => {
            let p: Value = serde_json::from_slice(body)
                .map_err(|e| bad(format!("invalid merge patch: {e}")))?;
            if !p.is_object() {
                return Err(bad("merge patch must be a JSON object"));
            }
            let mut doc = original.clone();
            json_patch::merge(&mut doc, &p);
            Ok(doc)
        }
        PatchType::Strategic => {
            let p: Value = serde_json::from_slice(body)
                .map_err(|e| bad(format!("invalid strategic merge patch: {e}")))?;
            strategic(kind, original, &p)
        }
        PatchType::Apply => {
            let p: Value = serde_yaml::from_slice(body)
                .map_err(|e| bad(format!("error decoding YAML: {e}")))?;
            strategic(kind, original, &p)
        }
    }
}

/// Applies a strategic merge patch (a JSON value) to `original`.
pub fn strategic(kind: &str, original: &Value, patch: &Value) -> Result<Value, ApiError> {
    let Value::Object(p) = patch else {
        return Err(bad("strategic merge patch must be a JSON object"));
    };
    let mut doc = original.clone();
    if !doc.is_object() {
        doc = Value::Object(Map::new());
    }
    let mut path = Vec::new();
    if let Value::Object(m) = &mut doc {
        merge_map(kind, m, p, &mut path)?;
    }
    Ok(doc)
}

fn is_directive(k: &str) -> bool {
    k == "$patch"
        || k == "$retainKeys"
        || k.starts_with("$setElementOrder/")
        || k.starts_with("$deleteFromPrimitiveList/")
}

/// The patch value with every directive removed, for inserting as new.
fn strip(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(k, _)| !is_directive(k))
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k.clone(), strip(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(
            a.iter()
                .filter(|e| e.get("$patch").is_none())
                .map(strip)
                .collect(),
        ),
        other => other.clone(),
    }
}

fn merge_map<'a>(
    kind: &str,
    orig: &mut Map<String, Value>,
    patch: &'a Map<String, Value>,
    path: &mut Vec<&'a str>,
) -> Result<(), ApiError> {
    match patch.get("$patch").and_then(Value::as_str) {
        Some("replace") => {
            if let Value::Object(m) = strip(&Value::Object(patch.clone())) {
                *orig = m;
            }
            return Ok(());
        }
        Some("delete") => {
            orig.clear();
            return Ok(());
        }
        Some("merge") | None => {}
        Some(other) => return Err(bad(format!("unknown patch type: {other}"))),
    }
    for (k, v) in patch {
        if let Some(field) = k.strip_prefix("$deleteFromPrimitiveList/") {
            if let (Some(Value::Array(list)), Value::Array(del)) = (orig.get_mut(field), v) {
                list.retain(|e| !del.contains(e));
            }
            continue;
        }
        if is_directive(k) {
            continue;
        }
        match v {
            Value::Null => {
                orig.remove(k);
            }
            Value::Object(pm) => {
                if pm.get("$patch").and_then(Value::as_str) == Some("delete") {
                    orig.remove(k);
                    continue;
                }
                path.push(k);
                match orig.get_mut(k) {
                    Some(Value::Object(om)) => merge_map(kind, om, pm, path)?,
                    _ => {
                        orig.insert(k.clone(), strip(v));
                    }
                }
                path.pop();
            }
            Value::Array(pl) => {
                path.push(k);
                let strategy = list_strategy(kind, path);
                let merged = match strategy {
                    ListStrategy::Replace => strip(v),
                    ListStrategy::MergePrimitive => {
                        let mut out = match orig.get(k) {
                            Some(Value::Array(a)) => a.clone(),
                            _ => Vec::new(),
                        };
                        for e in pl {
                            if !out.contains(e) {
                                out.push(e.clone());
                            }
                        }
                        Value::Array(out)
                    }
                    ListStrategy::MergeKey(key) => {
                        let base = match orig.get(k) {
                            Some(Value::Array(a)) => a.clone(),
                            _ => Vec::new(),
                        };
                        Value::Array(merge_keyed(kind, base, pl, key, path)?)
                    }
                };
                path.pop();
                orig.insert(k.clone(), merged);
            }
            other => {
                orig.insert(k.clone(), other.clone());
            }
        }
    }
    // $setElementOrder/<field>: reorder a merged list as the patch says.
    for (k, v) in patch {
        if let Some(field) = k.strip_prefix("$setElementOrder/")
            && let (Some(Value::Array(list)), Value::Array(order)) = (orig.get_mut(field), v)
        {
            reorder(list, order);
        }
    }
    if let Some(Value::Array(keep)) = patch.get("$retainKeys") {
        let keep: Vec<&str> = keep.iter().filter_map(Value::as_str).collect();
        orig.retain(|k, _| keep.contains(&k.as_str()));
    }
    Ok(())
}

fn reorder(list: &mut Vec<Value>, order: &[Value]) {
    let matches = |e: &Value, o: &Value| match o {
        Value::Object(om) => om.iter().all(|(k, v)| e.get(k) == Some(v)),
        other => e == other,
    };
    let mut ordered = Vec::with_capacity(list.len());
    let mut rest: Vec<Value> = std::mem::take(list);
    for o in order {
        if let Some(i) = rest.iter().position(|e| matches(e, o)) {
            ordered.push(rest.remove(i));
        }
    }
    ordered.extend(rest);
    *list = ordered;
}

fn merge_keyed<'a>(
    kind: &str,
    mut base: Vec<Value>,
    patch: &'a [Value],
    key: &str,
    path: &mut Vec<&'a str>,
) -> Result<Vec<Value>, ApiError> {
    if patch
        .iter()
        .any(|e| e.get("$patch").and_then(Value::as_str) == Some("replace"))
    {
        return Ok(patch
            .iter()
            .filter(|e| e.get("$patch").is_none())
            .map(strip)
            .collect());
    }
    for pe in patch {
        let Value::Object(pm) = pe else {
            // A scalar in a keyed list: keep it if new.
            if !base.contains(pe) {
                base.push(pe.clone());
            }
            continue;
        };
        let Some(kv) = pm.get(key) else {
            return Err(bad(format!(
                "map: {pe} does not contain declared merge key: {key}"
            )));
        };
        let pos = base.iter().position(|e| e.get(key) == Some(kv));
        if pm.get("$patch").and_then(Value::as_str) == Some("delete") {
            base.retain(|e| e.get(key) != Some(kv));
            continue;
        }
        match pos {
            Some(i) => {
                if let Value::Object(om) = &mut base[i] {
                    merge_map(kind, om, pm, path)?;
                }
            }
            None => base.push(strip(pe)),
        }
    }
    Ok(base)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn strategic_merges_containers_by_name_and_conditions_by_type() {
        let pod = json!({
            "spec": {"containers": [{"name": "a", "image": "x:1", "ports": [{"containerPort": 80}]}, {"name": "b", "image": "y"}]},
            "status": {"conditions": [{"type": "Ready", "status": "False"}, {"type": "PodScheduled", "status": "True"}],
                        "containerStatuses": [{"name": "a"}, {"name": "b"}]}
        });
        let patch = json!({
            "spec": {"containers": [{"name": "a", "image": "x:2", "ports": [{"containerPort": 81}]}]},
            "status": {"conditions": [{"type": "Ready", "status": "True"}], "containerStatuses": [{"name": "b", "ready": true}]}
        });
        let out = strategic("Pod", &pod, &patch).expect("patch");
        assert_eq!(out["spec"]["containers"].as_array().map(Vec::len), Some(2));
        assert_eq!(out["spec"]["containers"][0]["image"], "x:2");
        assert_eq!(
            out["spec"]["containers"][0]["ports"]
                .as_array()
                .map(Vec::len),
            Some(2)
        );
        assert_eq!(out["status"]["conditions"][0]["status"], "True");
        assert_eq!(out["status"]["conditions"][1]["type"], "PodScheduled");
        // containerStatuses is atomic upstream: replaced.
        assert_eq!(
            out["status"]["containerStatuses"],
            json!([{"name": "b", "ready": true}])
        );
    }

    #[test]
    fn directives() {
        let svc = json!({"metadata": {"finalizers": ["a"], "labels": {"x": "1", "y": "2"}},
                         "spec": {"ports": [{"port": 80, "name": "http"}, {"port": 443, "name": "https"}]}});
        let patch = json!({
            "metadata": {"finalizers": ["b"], "labels": {"x": null}, "$deleteFromPrimitiveList/finalizers": ["a"]},
            "spec": {"$setElementOrder/ports": [{"port": 443}, {"port": 80}], "ports": [{"port": 80, "$patch": "delete"}]}
        });
        let out = strategic("Service", &svc, &patch).expect("patch");
        assert_eq!(out["metadata"]["finalizers"], json!(["b"]));
        assert_eq!(out["metadata"]["labels"], json!({"y": "2"}));
        assert_eq!(
            out["spec"]["ports"],
            json!([{"port": 443, "name": "https"}])
        );
        let replace = json!({"spec": {"ports": [{"$patch": "replace"}, {"port": 1}]}});
        let out = strategic("Service", &svc, &replace).expect("patch");
        assert_eq!(out["spec"]["ports"], json!([{"port": 1}]));
        let retain = json!({"spec": {"volumes": [{"name": "v", "$retainKeys": ["name", "emptyDir"], "emptyDir": {}}]}});
        let pod = json!({"spec": {"volumes": [{"name": "v", "hostPath": {"path": "/x"}}]}});
        let out = strategic("Pod", &pod, &retain).expect("patch");
        assert_eq!(
            out["spec"]["volumes"],
            json!([{"name": "v", "emptyDir": {}}])
        );
    }

    #[test]
    fn json_and_merge_patch() {
        let o = json!({"a": {"b": 1, "c": 2}});
        let j = apply(
            PatchType::Json,
            "X",
            &o,
            br#"[{"op":"replace","path":"/a/b","value":5}]"#,
        )
        .expect("json");
        assert_eq!(j["a"]["b"], 5);
        let m = apply(PatchType::Merge, "X", &o, br#"{"a":{"c":null}}"#).expect("merge");
        assert_eq!(m, json!({"a": {"b": 1}}));
        assert!(
            apply(
                PatchType::Json,
                "X",
                &o,
                br#"[{"op":"test","path":"/a/b","value":9}]"#
            )
            .is_err()
        );
    }
}
