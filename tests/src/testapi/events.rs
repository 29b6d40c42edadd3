//! core/v1 Events and events.k8s.io/v1 Events are one stored set upstream,
//! shown in two shapes. Stored here in the core shape; these functions
//! convert, field by field, between the two.

use serde_json::{Map, Value};

/// (events.k8s.io/v1 field, core/v1 field) pairs that are renamed.
const RENAMES: &[(&str, &str)] = &[
    ("regarding", "involvedObject"),
    ("note", "message"),
    ("reportingController", "reportingComponent"),
    ("deprecatedSource", "source"),
    ("deprecatedFirstTimestamp", "firstTimestamp"),
    ("deprecatedLastTimestamp", "lastTimestamp"),
    ("deprecatedCount", "count"),
];

const SHARED: &[&str] = &[
    "metadata",
    "eventTime",
    "series",
    "related",
    "action",
    "reason",
    "type",
    "reportingInstance",
];

fn convert(obj: &Value, api_version: &str, to_core: bool) -> Value {
    let Some(src) = obj.as_object() else {
        return obj.clone();
    };
    let mut out = Map::new();
    out.insert("kind".into(), Value::String("Event".into()));
    out.insert("apiVersion".into(), Value::String(api_version.into()));
    for k in SHARED {
        if let Some(v) = src.get(*k) {
            out.insert((*k).into(), v.clone());
        }
    }
    for (v1, core) in RENAMES {
        let (from, to) = if to_core { (v1, core) } else { (core, v1) };
        if let Some(v) = src.get(*from)
            && !v.is_null()
        {
            out.insert((*to).into(), v.clone());
        }
    }
    if !to_core {
        // core's `count` 0 / empty source are omitted in the v1 shape.
        if out.get("deprecatedCount").and_then(Value::as_i64) == Some(0) {
            out.remove("deprecatedCount");
        }
        if out
            .get("deprecatedSource")
            .and_then(Value::as_object)
            .is_some_and(Map::is_empty)
        {
            out.remove("deprecatedSource");
        }
    }
    Value::Object(out)
}

/// events.k8s.io/v1 shape → stored core/v1 shape.
pub fn to_core(v1: &Value) -> Value {
    convert(v1, "v1", true)
}

/// Stored core/v1 shape → events.k8s.io/v1 shape.
pub fn from_core(core: &Value) -> Value {
    convert(core, "events.k8s.io/v1", false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn round_trip() {
        let v1 = json!({"apiVersion": "events.k8s.io/v1", "kind": "Event",
            "metadata": {"name": "e", "namespace": "default"},
            "regarding": {"kind": "Pod", "name": "p"}, "note": "hello", "reason": "Started",
            "type": "Normal", "action": "Start", "reportingController": "keelson", "reportingInstance": "n1",
            "eventTime": "2024-01-01T00:00:00.000000Z"});
        let core = to_core(&v1);
        assert_eq!(core["involvedObject"]["name"], "p");
        assert_eq!(core["message"], "hello");
        assert_eq!(core["reportingComponent"], "keelson");
        assert_eq!(core["apiVersion"], "v1");
        assert_eq!(from_core(&core), v1);
    }
}
