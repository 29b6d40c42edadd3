//! Typed decoding of incoming objects with the upstream Go types' shapes
//! (k8s-openapi): wrong types are a 400 as upstream's decoder answers,
//! and unknown fields are found by comparing the input with its typed
//! round trip, for `fieldValidation` (Strict: 400, Warn: a Warning header).

use k8s_openapi::api::{
    apps, coordination, core, discovery, events as events_v1, networking, node as node_api, rbac,
};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::error::ApiError;

fn round_trip<T: DeserializeOwned + Serialize>(obj: &Value) -> Result<Value, String> {
    let typed: T = serde_json::from_value(obj.clone()).map_err(|e| e.to_string())?;
    serde_json::to_value(typed).map_err(|e| e.to_string())
}

/// The typed round trip of an object of (group, kind), if the kind is known.
fn typed(group: &str, kind: &str, obj: &Value) -> Option<Result<Value, String>> {
    Some(match (group, kind) {
        ("", "Pod") => round_trip::<core::v1::Pod>(obj),
        ("", "Service") => round_trip::<core::v1::Service>(obj),
        ("", "Node") => round_trip::<core::v1::Node>(obj),
        ("", "Namespace") => round_trip::<core::v1::Namespace>(obj),
        ("", "ConfigMap") => round_trip::<core::v1::ConfigMap>(obj),
        ("", "Secret") => round_trip::<core::v1::Secret>(obj),
        ("", "ServiceAccount") => round_trip::<core::v1::ServiceAccount>(obj),
        ("", "Endpoints") => round_trip::<core::v1::Endpoints>(obj),
        ("", "Event") => round_trip::<core::v1::Event>(obj),
        ("discovery.k8s.io", "EndpointSlice") => round_trip::<discovery::v1::EndpointSlice>(obj),
        ("events.k8s.io", "Event") => round_trip::<events_v1::v1::Event>(obj),
        ("coordination.k8s.io", "Lease") => round_trip::<coordination::v1::Lease>(obj),
        ("apps", "DaemonSet") => round_trip::<apps::v1::DaemonSet>(obj),
        ("networking.k8s.io", "ServiceCIDR") => round_trip::<networking::v1::ServiceCIDR>(obj),
        ("node.k8s.io", "RuntimeClass") => round_trip::<node_api::v1::RuntimeClass>(obj),
        ("rbac.authorization.k8s.io", "ClusterRole") => round_trip::<rbac::v1::ClusterRole>(obj),
        ("rbac.authorization.k8s.io", "ClusterRoleBinding") => {
            round_trip::<rbac::v1::ClusterRoleBinding>(obj)
        }
        _ => return None,
    })
}

fn diff(input: &Value, output: &Value, path: &str, out: &mut Vec<String>) {
    match (input, output) {
        (Value::Object(i), Value::Object(o)) => {
            for (k, v) in i {
                if v.is_null() {
                    continue;
                }
                let p = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                match o.get(k) {
                    Some(ov) => diff(v, ov, &p, out),
                    None => out.push(p),
                }
            }
        }
        (Value::Array(i), Value::Array(o)) => {
            for (n, (iv, ov)) in i.iter().zip(o.iter()).enumerate() {
                diff(iv, ov, &format!("{path}[{n}]"), out);
            }
        }
        _ => {}
    }
}

/// Decodes `obj` as (group, version, kind); returns the unknown field
/// paths, or a 400 when a field has the wrong type.
pub fn check(group: &str, version: &str, kind: &str, obj: &Value) -> Result<Vec<String>, ApiError> {
    let Some(rt) = typed(group, kind, obj) else {
        return Ok(Vec::new());
    };
    let gv = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    let typed = rt.map_err(|e| {
        ApiError::bad_request(format!(
            "{kind} in version \"{gv}\" cannot be handled as a {kind}: {e}"
        ))
    })?;
    let mut unknown = Vec::new();
    diff(obj, &typed, "", &mut unknown);
    // Type meta are not fields of the Go structs' JSON but are accepted.
    unknown.retain(|f| f != "kind" && f != "apiVersion");
    Ok(unknown)
}

/// Applies the `fieldValidation` directive; returns warnings to send.
pub fn validate_fields(
    group: &str,
    version: &str,
    kind: &str,
    obj: &Value,
    directive: Option<&str>,
) -> Result<Vec<String>, ApiError> {
    let unknown = check(group, version, kind, obj)?;
    let gv = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    let msgs: Vec<String> = unknown
        .iter()
        .map(|f| format!("unknown field \"{f}\""))
        .collect();
    match directive.unwrap_or("Warn") {
        "Ignore" => Ok(Vec::new()),
        "Strict" if !msgs.is_empty() => Err(ApiError::bad_request(format!(
            "{kind} in version \"{gv}\" cannot be handled as a {kind}: strict decoding error: {}",
            msgs.join(", ")
        ))),
        "Strict" | "Warn" => Ok(msgs),
        other => Err(ApiError::bad_request(format!(
            "fieldValidation: Unsupported value: \"{other}\": supported values: \"Ignore\", \"Strict\", \"Warn\""
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn unknown_and_mistyped_fields() {
        let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "labels": {}},
            "spec": {"containers": [{"name": "c", "image": "i", "bogus": 1}], "nodeName": null}});
        assert_eq!(
            check("", "v1", "Pod", &pod).expect("decodes"),
            vec!["spec.containers[0].bogus".to_string()]
        );
        assert!(validate_fields("", "v1", "Pod", &pod, Some("Strict")).is_err());
        assert_eq!(
            validate_fields("", "v1", "Pod", &pod, None)
                .expect("warn")
                .len(),
            1
        );
        let bad = json!({"spec": {"containers": "nope"}});
        assert_eq!(check("", "v1", "Pod", &bad).map_err(|e| e.code), Err(400));
        let ok = json!({"metadata": {"name": "s"}, "spec": {"ports": [{"port": 80, "targetPort": "http"}]}});
        assert!(check("", "v1", "Service", &ok).expect("decodes").is_empty());
    }
}
