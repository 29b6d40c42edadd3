//! The status write kubelet sends (`PatchPodStatus`): a two-way strategic
//! merge patch from the API's status to the new one, with the pod UID as a
//! precondition. Lists with a merge key (conditions by `type`, pod and host
//! IPs by `ip`) are patched element-wise so conditions other writers own
//! survive; every other changed field is replaced.

use k8s_openapi::api::core::v1::PodStatus;
use serde_json::{Map, Value, json};

/// Merge keys of `PodStatus` lists (`patchMergeKey` in the API types).
fn merge_key(field: &str) -> Option<&'static str> {
    match field {
        "conditions" => Some("type"),
        "podIPs" | "hostIPs" => Some("ip"),
        "resourceClaimStatuses" => Some("name"),
        _ => None,
    }
}

fn as_map(s: &PodStatus) -> Map<String, Value> {
    match serde_json::to_value(s) {
        Ok(Value::Object(m)) => m,
        _ => Map::new(),
    }
}

/// The patch taking `old` to `new` for the pod with `uid`, or `None` when
/// nothing changed.
pub fn status_patch(uid: &str, old: &PodStatus, new: &PodStatus) -> Option<Value> {
    let old = as_map(old);
    let new = as_map(new);
    let mut patch = Map::new();
    for (k, nv) in &new {
        let ov = old.get(k);
        if ov == Some(nv) {
            continue;
        }
        match (merge_key(k), ov, nv) {
            (Some(key), Some(Value::Array(oa)), Value::Array(na)) => {
                let id = |e: &Value| e.get(key).cloned().unwrap_or(Value::Null);
                let mut changed = Vec::new();
                for e in na {
                    if !oa.contains(e) {
                        changed.push(e.clone());
                    }
                }
                for e in oa {
                    if !na.iter().any(|n| id(n) == id(e)) {
                        changed.push(json!({"$patch": "delete", key: id(e)}));
                    }
                }
                let order: Vec<Value> = na.iter().map(|e| json!({ key: id(e) })).collect();
                let old_order: Vec<Value> = oa.iter().map(|e| json!({ key: id(e) })).collect();
                if !changed.is_empty() || order != old_order {
                    patch.insert(format!("$setElementOrder/{k}"), Value::Array(order));
                }
                if !changed.is_empty() {
                    patch.insert(k.clone(), Value::Array(changed));
                }
            }
            _ => {
                patch.insert(k.clone(), nv.clone());
            }
        }
    }
    for k in old.keys() {
        if !new.contains_key(k) {
            patch.insert(k.clone(), Value::Null);
        }
    }
    if patch.is_empty() {
        return None;
    }
    Some(json!({"metadata": {"uid": uid}, "status": Value::Object(patch)}))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(v: Value) -> PodStatus {
        serde_json::from_value(v).expect("status")
    }

    #[test]
    fn unchanged_is_none() {
        let s = status(json!({"phase": "Running"}));
        assert_eq!(status_patch("u", &s, &s), None);
    }

    #[test]
    fn conditions_merge_by_type_and_scalars_replace() {
        let old = status(json!({
            "phase": "Pending",
            "message": "x",
            "conditions": [
                {"type": "example.com/gate", "status": "True"},
                {"type": "Ready", "status": "False"},
                {"type": "Gone", "status": "True"}
            ],
            "containerStatuses": [{"name": "a", "image": "i", "imageID": "", "ready": false, "restartCount": 0}]
        }));
        let new = status(json!({
            "phase": "Running",
            "conditions": [
                {"type": "example.com/gate", "status": "True"},
                {"type": "Ready", "status": "True"}
            ],
            "containerStatuses": [{"name": "a", "image": "i", "imageID": "", "ready": true, "restartCount": 0}]
        }));
        let p = status_patch("u1", &old, &new).expect("patch");
        assert_eq!(p["metadata"]["uid"], "u1");
        let s = &p["status"];
        assert_eq!(s["phase"], "Running");
        assert_eq!(s["message"], Value::Null);
        assert_eq!(
            s["$setElementOrder/conditions"],
            json!([{"type": "example.com/gate"}, {"type": "Ready"}])
        );
        assert_eq!(
            s["conditions"],
            json!([{"type": "Ready", "status": "True"}, {"$patch": "delete", "type": "Gone"}])
        );
        assert_eq!(s["containerStatuses"][0]["ready"], true);
    }
}
