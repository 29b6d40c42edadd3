//! The status write kubelet sends (`PatchPodStatus`): a two-way strategic
//! merge patch from the API's status to the new one, with the pod UID as a
//! precondition. Lists with a merge key (conditions by `type`, pod and host
//! IPs by `ip`) are patched element-wise so conditions other writers own
//! survive; every other changed field is replaced.

use k8s_openapi::api::core::v1::PodStatus;
use serde_json::{Map, Value, json};

/// Merge keys of `PodStatus` lists (`patchMergeKey` in the API types),
/// by path from the status.
fn merge_key(path: &[&str]) -> Option<&'static str> {
    match path {
        ["conditions"] => Some("type"),
        ["podIPs"] | ["hostIPs"] => Some("ip"),
        ["resourceClaimStatuses"] => Some("name"),
        _ => None,
    }
}

/// The patch taking `old` to `new` for the pod with `uid`, or `None` when
/// nothing changed.
pub fn status_patch(uid: &str, old: &PodStatus, new: &PodStatus) -> Option<Value> {
    let old = serde_json::to_value(old).unwrap_or(Value::Null);
    let new = serde_json::to_value(new).unwrap_or(Value::Null);
    let patch = keelson_common::strategic_patch::two_way(&old, &new, &merge_key);
    if patch.as_object().is_none_or(Map::is_empty) {
        return None;
    }
    Some(json!({"metadata": {"uid": uid}, "status": patch}))
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
        // A condition that loses its reason says so (the merge would keep it).
        let old = status(json!({"conditions": [
            {"type": "Ready", "status": "False", "reason": "ContainersNotReady"}
        ]}));
        let new = status(json!({"conditions": [{"type": "Ready", "status": "True"}]}));
        let p = status_patch("u1", &old, &new).expect("patch");
        assert_eq!(
            p["status"]["conditions"],
            json!([{"type": "Ready", "status": "True", "reason": null}])
        );
        assert_eq!(s["containerStatuses"][0]["ready"], true);
    }
}
