//! Two-way strategic merge patches, as apimachinery's
//! `strategicpatch.CreateTwoWayMergePatch` computes them: only what
//! changed; a removed field becomes `null`; lists with a merge key
//! (`patchMergeKey` of the Go types) are patched element by element, each
//! changed element carrying its key and only its own changed fields (so a
//! field that went away, such as a condition's `reason`, is `null` rather
//! than left behind by the merge), removed elements as `$patch: delete`,
//! and the new order in `$setElementOrder/<list>`; every other list is
//! replaced whole.

use serde_json::{Map, Value};

/// The merge key of the list at a path (field names from the patched
/// object's root), or `None` for a list replaced whole.
pub type MergeKeys<'a> = dyn Fn(&[&str]) -> Option<&'static str> + 'a;

/// The patch taking `original` to `modified`.
pub fn two_way(original: &Value, modified: &Value, merge_key: &MergeKeys<'_>) -> Value {
    let mut path = Vec::new();
    match (original, modified) {
        (Value::Object(o), Value::Object(m)) => {
            Value::Object(diff_object(&mut path, o, m, merge_key))
        }
        _ => modified.clone(),
    }
}

fn diff_object<'a>(
    path: &mut Vec<&'a str>,
    orig: &Map<String, Value>,
    new: &'a Map<String, Value>,
    merge_key: &MergeKeys<'_>,
) -> Map<String, Value> {
    let mut out = Map::new();
    for (k, nv) in new {
        match orig.get(k) {
            None => {
                if !nv.is_null() {
                    out.insert(k.clone(), nv.clone());
                }
            }
            Some(ov) if ov == nv => {}
            Some(ov) => {
                path.push(k.as_str());
                match (ov, nv) {
                    (Value::Object(o), Value::Object(n)) => {
                        let d = diff_object(path, o, n, merge_key);
                        if !d.is_empty() {
                            out.insert(k.clone(), Value::Object(d));
                        }
                    }
                    (Value::Array(o), Value::Array(n)) => match merge_key(path) {
                        Some(key) => {
                            let (list, order) = diff_keyed(o, n, key, merge_key);
                            if !list.is_empty() {
                                out.insert(k.clone(), Value::Array(list));
                            }
                            out.insert(format!("$setElementOrder/{k}"), Value::Array(order));
                        }
                        None => {
                            out.insert(k.clone(), nv.clone());
                        }
                    },
                    _ => {
                        out.insert(k.clone(), nv.clone());
                    }
                }
                path.pop();
            }
        }
    }
    for (k, ov) in orig {
        if !new.contains_key(k) && !ov.is_null() {
            out.insert(k.clone(), Value::Null);
        }
    }
    out
}

fn diff_keyed(
    orig: &[Value],
    new: &[Value],
    key: &str,
    merge_key: &MergeKeys<'_>,
) -> (Vec<Value>, Vec<Value>) {
    let key_of = |v: &Value| v.get(key).cloned();
    let mut list = Vec::new();
    let mut order = Vec::new();
    for n in new {
        let Some(kv) = key_of(n) else {
            list.push(n.clone());
            continue;
        };
        let mut entry = Map::new();
        entry.insert(key.to_string(), kv.clone());
        order.push(Value::Object(entry));
        match orig.iter().find(|o| key_of(o).as_ref() == Some(&kv)) {
            Some(o) if o == n => {}
            Some(Value::Object(o)) => {
                if let Value::Object(nm) = n {
                    let mut d = diff_object(&mut Vec::new(), o, nm, merge_key);
                    d.insert(key.to_string(), kv);
                    list.push(Value::Object(d));
                }
            }
            _ => list.push(n.clone()),
        }
    }
    for o in orig {
        if let Some(kv) = key_of(o)
            && !new.iter().any(|n| key_of(n).as_ref() == Some(&kv))
        {
            let mut d = Map::new();
            d.insert(key.to_string(), kv);
            d.insert("$patch".to_string(), Value::String("delete".to_string()));
            list.push(Value::Object(d));
        }
    }
    (list, order)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn keys(path: &[&str]) -> Option<&'static str> {
        (path == ["conditions"]).then_some("type")
    }

    #[test]
    fn a_field_gone_from_a_keyed_element_is_nulled() {
        let old = json!({"conditions": [
            {"type": "Ready", "status": "False", "reason": "ContainersNotReady", "message": "m"},
            {"type": "Other", "status": "True"}
        ]});
        let new = json!({"conditions": [
            {"type": "Ready", "status": "True"},
            {"type": "Other", "status": "True"}
        ]});
        let p = two_way(&old, &new, &keys);
        assert_eq!(
            p,
            json!({
                "$setElementOrder/conditions": [{"type": "Ready"}, {"type": "Other"}],
                "conditions": [{"type": "Ready", "status": "True", "reason": null, "message": null}]
            })
        );
    }

    #[test]
    fn unkeyed_lists_are_replaced_and_removed_fields_nulled() {
        let old = json!({"phase": "Pending", "message": "x", "list": [1, 2]});
        let new = json!({"phase": "Running", "list": [2]});
        assert_eq!(
            two_way(&old, &new, &keys),
            json!({"phase": "Running", "message": null, "list": [2]})
        );
        assert_eq!(two_way(&old, &old, &keys), json!({}));
    }
}
