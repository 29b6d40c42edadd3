//! How a Node status change goes to the API server, as kubelet's
//! `PatchNodeStatus` sends it: a two-way strategic merge patch between the
//! Node as read and the Node as computed, on the `status` subresource, so
//! only what changed is sent and fields other writers own are never
//! overwritten (their conditions, their extended resources, their labels).
//! Addresses are replaced as a whole (`$patch: replace`), as kubelet does to
//! work around the list's merge key.
//!
//! Also kubelet's `nodeStatusHasChanged`: conditions compared without their
//! heartbeat times, quantities compared by value.

use k8s_openapi::api::core::v1::{Node, NodeCondition, NodeStatus};
use serde_json::{Map, Value};

/// Merge key of a list at `path` in a Node, or `None` for atomic lists
/// (after the `patchMergeKey` tags of the Go types).
fn merge_key(path: &[&str]) -> Option<&'static str> {
    match path {
        ["status", "conditions"] | ["status", "addresses"] => Some("type"),
        ["metadata", "ownerReferences"] => Some("uid"),
        _ => None,
    }
}

/// Two-way strategic merge patch from `original` to `modified` for a Node.
pub fn two_way_patch(original: &Value, modified: &Value) -> Value {
    keelson_common::strategic_patch::two_way(original, modified, &merge_key)
}

/// kubelet's `preparePatchBytesforNodeStatus`: the patch for the status
/// subresource from `original` to `modified` (spec changes are never sent).
pub fn node_status_patch(original: &Node, modified: &Node) -> Result<Value, serde_json::Error> {
    let mut diff_node = modified.clone();
    diff_node.spec = original.spec.clone();
    let orig_addresses = original
        .status
        .as_ref()
        .and_then(|s| s.addresses.clone())
        .unwrap_or_default();
    let new_addresses = modified
        .status
        .as_ref()
        .and_then(|s| s.addresses.clone())
        .unwrap_or_default();
    let replace_addresses = !orig_addresses.is_empty() && orig_addresses != new_addresses;
    if replace_addresses && let Some(s) = diff_node.status.as_mut() {
        s.addresses = Some(orig_addresses);
    }
    let old = serde_json::to_value(original)?;
    let new = serde_json::to_value(&diff_node)?;
    let mut patch = two_way_patch(&old, &new);
    if replace_addresses {
        let mut list: Vec<Value> = new_addresses
            .iter()
            .map(serde_json::to_value)
            .collect::<Result<_, _>>()?;
        let mut replace = Map::new();
        replace.insert("$patch".to_string(), Value::String("replace".to_string()));
        list.push(Value::Object(replace));
        if let Value::Object(p) = &mut patch {
            let status = p
                .entry("status".to_string())
                .or_insert_with(|| Value::Object(Map::new()));
            if let Value::Object(s) = status {
                s.insert("addresses".to_string(), Value::Array(list));
            }
        }
    }
    Ok(patch)
}

fn conditions_without_heartbeat(c: &[NodeCondition]) -> Vec<NodeCondition> {
    let mut v: Vec<NodeCondition> = c
        .iter()
        .map(|c| NodeCondition {
            last_heartbeat_time: None,
            ..c.clone()
        })
        .collect();
    v.sort_by(|a, b| a.type_.cmp(&b.type_));
    v
}

fn normalized(status: &NodeStatus) -> Value {
    let mut s = status.clone();
    s.conditions = None;
    let mut v = serde_json::to_value(&s).unwrap_or(Value::Null);
    for field in ["capacity", "allocatable"] {
        if let Some(Value::Object(m)) = v.get_mut(field) {
            for q in m.values_mut() {
                if let Some(text) = q.as_str()
                    && let Ok(parsed) = keelson_common::quantity::Quantity::parse(text)
                {
                    *q = Value::String(format!("{}m", parsed.milli_value()));
                }
            }
        }
    }
    v
}

/// kubelet's `nodeStatusHasChanged`.
pub fn status_changed(original: Option<&NodeStatus>, new: Option<&NodeStatus>) -> bool {
    match (original, new) {
        (None, None) => false,
        (None, _) | (_, None) => true,
        (Some(o), Some(n)) => {
            let oc = o.conditions.as_deref().unwrap_or_default();
            let nc = n.conditions.as_deref().unwrap_or_default();
            if oc.len() != nc.len()
                || conditions_without_heartbeat(oc) != conditions_without_heartbeat(nc)
            {
                return true;
            }
            normalized(o) != normalized(n)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn keyed_lists_send_only_changes() {
        let orig = json!({"status": {
            "conditions": [
                {"type": "NetworkUnavailable", "status": "False", "reason": "RouteCreated"},
                {"type": "Ready", "status": "True", "reason": "KubeletReady", "lastHeartbeatTime": "t1"}
            ],
            "capacity": {"cpu": "2", "example.com/dongle": "4"},
            "images": [{"names": ["a"], "sizeBytes": 1}]
        }});
        let new = json!({"status": {
            "conditions": [
                {"type": "NetworkUnavailable", "status": "False", "reason": "RouteCreated"},
                {"type": "Ready", "status": "True", "reason": "KubeletReady", "lastHeartbeatTime": "t2"}
            ],
            "capacity": {"cpu": "2", "example.com/dongle": "4"},
            "images": [{"names": ["b"], "sizeBytes": 2}]
        }});
        let p = two_way_patch(&orig, &new);
        assert_eq!(
            p,
            json!({"status": {
                "$setElementOrder/conditions": [{"type": "NetworkUnavailable"}, {"type": "Ready"}],
                "conditions": [{"type": "Ready", "lastHeartbeatTime": "t2"}],
                "images": [{"names": ["b"], "sizeBytes": 2}]
            }})
        );
    }

    #[test]
    fn removed_fields_become_null_and_new_elements_are_whole() {
        let orig = json!({"metadata": {"labels": {"a": "1", "b": "2"}}, "status": {"conditions": [{"type": "Ready", "message": "m"}]}});
        let new = json!({"metadata": {"labels": {"a": "1", "c": "3"}}, "status": {"conditions": [{"type": "Ready"}, {"type": "MemoryPressure", "status": "False"}]}});
        let p = two_way_patch(&orig, &new);
        assert_eq!(
            p,
            json!({
                "metadata": {"labels": {"b": null, "c": "3"}},
                "status": {
                    "$setElementOrder/conditions": [{"type": "Ready"}, {"type": "MemoryPressure"}],
                    "conditions": [{"type": "Ready", "message": null}, {"type": "MemoryPressure", "status": "False"}]
                }
            })
        );
    }

    #[test]
    fn changed_addresses_are_replaced_and_spec_never_sent() {
        use k8s_openapi::api::core::v1::{NodeAddress, NodeSpec};
        let addr = |t: &str, a: &str| NodeAddress {
            type_: t.into(),
            address: a.into(),
        };
        let orig = Node {
            spec: Some(NodeSpec {
                unschedulable: Some(true),
                ..Default::default()
            }),
            status: Some(NodeStatus {
                addresses: Some(vec![addr("InternalIP", "10.0.0.1"), addr("Hostname", "n")]),
                ..Default::default()
            }),
            ..Default::default()
        };
        let mut new = orig.clone();
        new.spec = None;
        if let Some(s) = new.status.as_mut() {
            s.addresses = Some(vec![addr("InternalIP", "10.0.0.2"), addr("Hostname", "n")]);
        }
        let p = node_status_patch(&orig, &new).expect("patch");
        assert_eq!(
            p,
            json!({"status": {"addresses": [
                {"type": "InternalIP", "address": "10.0.0.2"},
                {"type": "Hostname", "address": "n"},
                {"$patch": "replace"}
            ]}})
        );
        // Nothing changed: empty patch.
        assert_eq!(node_status_patch(&orig, &orig).expect("patch"), json!({}));
    }

    #[test]
    fn status_change_ignores_heartbeats_and_quantity_spelling() {
        use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
        let t = |s| Some(Time(jiff::Timestamp::from_second(s).expect("ts")));
        let status = |hb, mem: &str| NodeStatus {
            conditions: Some(vec![NodeCondition {
                type_: "Ready".into(),
                status: "True".into(),
                last_heartbeat_time: hb,
                ..Default::default()
            }]),
            capacity: Some([("memory".to_string(), Quantity(mem.to_string()))].into()),
            ..Default::default()
        };
        let a = status(t(1), "1Ki");
        assert!(!status_changed(Some(&a), Some(&status(t(2), "1024"))));
        assert!(status_changed(Some(&a), Some(&status(t(1), "2Ki"))));
        let mut b = status(t(1), "1Ki");
        if let Some(c) = b.conditions.as_mut() {
            c[0].status = "False".into();
        }
        assert!(status_changed(Some(&a), Some(&b)));
        assert!(status_changed(None, Some(&a)));
    }
}
