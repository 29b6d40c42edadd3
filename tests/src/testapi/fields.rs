//! Selectable field values of stored objects (what `fieldSelector` matches).

use serde_json::Value;

use super::resources::ResourceInfo;

/// Reads a dotted path (`spec.nodeName`) as the string upstream's field
/// set would hold: strings as they are, booleans `true`/`false`, numbers
/// in decimal, missing fields as the empty string.
pub fn dotted(obj: &Value, path: &str) -> String {
    let mut cur = obj;
    for part in path.split('.') {
        match cur.get(part) {
            Some(v) => cur = v,
            None => return String::new(),
        }
    }
    scalar(cur)
}

fn scalar(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        _ => String::new(),
    }
}

/// The value of a field label for an object of the resource `res`
/// (labels are those of the stored representation).
pub fn field_value(res: &ResourceInfo, obj: &Value, label: &str) -> String {
    match (res.storage, label) {
        // The event's `source` field selects on the reporting component.
        ("events", "source") => dotted(obj, "source.component"),
        // An unset `spec.hostNetwork`/`spec.unschedulable` reads "false" upstream.
        ("pods", "spec.hostNetwork") | ("nodes", "spec.unschedulable") => {
            let v = dotted(obj, label);
            if v.is_empty() { "false".into() } else { v }
        }
        _ => dotted(obj, label),
    }
}

/// All selectable field values of an object, computed once when stored.
pub fn extract(res: &ResourceInfo, obj: &Value) -> Vec<(&'static str, String)> {
    res.fields
        .iter()
        .map(|l| (*l, field_value(res, obj, l)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testapi::resources::find;
    use serde_json::json;

    #[test]
    fn pod_fields() {
        let pods = find("", "v1", "pods").expect("pods");
        let pod = json!({"spec": {"nodeName": "n1"}, "status": {"phase": "Running"}});
        let f = extract(pods, &pod);
        assert!(f.contains(&("spec.nodeName", "n1".into())));
        assert!(f.contains(&("spec.hostNetwork", "false".into())));
        assert!(f.contains(&("status.podIP", String::new())));
    }
}
