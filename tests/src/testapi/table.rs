//! Server-side printing: `Accept: application/json;as=Table;g=meta.k8s.io;v=v1`
//! answers a `meta.k8s.io/v1` Table with the columns kubectl shows for each
//! kind (as upstream's printers define them).

use serde_json::{Value, json};

use super::resources::ResourceInfo;
use super::util;

/// What a Table row embeds (`includeObject`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IncludeObject {
    /// Nothing.
    None,
    /// PartialObjectMetadata (the default).
    Metadata,
    /// The full object.
    Object,
}

impl IncludeObject {
    /// From the query parameter.
    pub fn parse(v: Option<&str>) -> IncludeObject {
        match v {
            Some("None") => IncludeObject::None,
            Some("Object") => IncludeObject::Object,
            _ => IncludeObject::Metadata,
        }
    }
}

/// Upstream's short human duration (`5s`, `3m2s`, `2h5m`, `4d`).
pub fn human_duration(secs: i64) -> String {
    if secs < -1 {
        return "<invalid>".into();
    }
    let s = secs.max(0);
    let m = s / 60;
    let h = s / 3600;
    let d = h / 24;
    if s < 120 {
        format!("{s}s")
    } else if m < 10 {
        if s % 60 == 0 {
            format!("{m}m")
        } else {
            format!("{m}m{}s", s % 60)
        }
    } else if m < 180 {
        format!("{m}m")
    } else if h < 8 {
        if m % 60 == 0 {
            format!("{h}h")
        } else {
            format!("{h}h{}m", m % 60)
        }
    } else if h < 48 {
        format!("{h}h")
    } else if h < 24 * 8 {
        if h % 24 == 0 {
            format!("{d}d")
        } else {
            format!("{d}d{}h", h % 24)
        }
    } else if h < 24 * 365 * 2 {
        format!("{d}d")
    } else if h < 24 * 365 * 8 {
        let y = d / 365;
        if d % 365 == 0 {
            format!("{y}y")
        } else {
            format!("{y}y{}d", d % 365)
        }
    } else {
        format!("{}y", d / 365)
    }
}

fn age(obj: &Value, field: &str) -> String {
    match obj
        .pointer(field)
        .and_then(Value::as_str)
        .and_then(util::parse_rfc3339)
    {
        Some(t) => human_duration(util::unix_now() - t),
        None => "<unknown>".into(),
    }
}

fn s<'a>(obj: &'a Value, p: &str) -> &'a str {
    obj.pointer(p).and_then(Value::as_str).unwrap_or_default()
}

fn col(name: &str, ty: &str, format: &str, priority: i64) -> Value {
    json!({"name": name, "type": ty, "format": format, "description": "", "priority": priority})
}

fn none_if_empty(v: String) -> String {
    if v.is_empty() { "<none>".into() } else { v }
}

fn pod_status(p: &Value) -> String {
    if p.pointer("/metadata/deletionTimestamp")
        .is_some_and(|v| !v.is_null())
    {
        return "Terminating".into();
    }
    let mut reason = s(p, "/status/reason").to_string();
    if reason.is_empty() {
        reason = s(p, "/status/phase").to_string();
    }
    if let Some(cs) = p
        .pointer("/status/containerStatuses")
        .and_then(Value::as_array)
    {
        for c in cs.iter().rev() {
            let w = s(c, "/state/waiting/reason");
            let t = s(c, "/state/terminated/reason");
            if !w.is_empty() {
                reason = w.to_string();
            } else if !t.is_empty() {
                reason = t.to_string();
            }
        }
    }
    reason
}

fn columns_and_cells(kind: &str, o: &Value) -> (Vec<Value>, Vec<Value>) {
    let name = json!(s(o, "/metadata/name"));
    let created = age(o, "/metadata/creationTimestamp");
    match kind {
        "Pod" => {
            let cs = o
                .pointer("/status/containerStatuses")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            let total = o
                .pointer("/spec/containers")
                .and_then(Value::as_array)
                .map(Vec::len)
                .unwrap_or(0);
            let ready = cs
                .iter()
                .filter(|c| c.get("ready").and_then(Value::as_bool) == Some(true))
                .count();
            let restarts: i64 = cs
                .iter()
                .filter_map(|c| c.get("restartCount").and_then(Value::as_i64))
                .sum();
            (
                vec![
                    col("Name", "string", "name", 0),
                    col("Ready", "string", "", 0),
                    col("Status", "string", "", 0),
                    col("Restarts", "string", "", 0),
                    col("Age", "string", "", 0),
                    col("IP", "string", "", 1),
                    col("Node", "string", "", 1),
                    col("Nominated Node", "string", "", 1),
                    col("Readiness Gates", "string", "", 1),
                ],
                vec![
                    name,
                    json!(format!("{ready}/{total}")),
                    json!(pod_status(o)),
                    json!(restarts.to_string()),
                    json!(created),
                    json!(none_if_empty(s(o, "/status/podIP").into())),
                    json!(none_if_empty(s(o, "/spec/nodeName").into())),
                    json!(none_if_empty(s(o, "/status/nominatedNodeName").into())),
                    json!("<none>"),
                ],
            )
        }
        "Service" => {
            let ty = s(o, "/spec/type");
            let mut ext: Vec<String> = o
                .pointer("/status/loadBalancer/ingress")
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .map(|i| {
                            let ip = s(i, "/ip");
                            if ip.is_empty() {
                                s(i, "/hostname").to_string()
                            } else {
                                ip.to_string()
                            }
                        })
                        .collect()
                })
                .unwrap_or_default();
            if let Some(e) = o.pointer("/spec/externalIPs").and_then(Value::as_array) {
                ext.extend(e.iter().filter_map(|v| v.as_str().map(String::from)));
            }
            let ext = match ty {
                "ExternalName" => s(o, "/spec/externalName").to_string(),
                "LoadBalancer" if ext.is_empty() => "<pending>".into(),
                _ => none_if_empty(ext.join(",")),
            };
            let ports: Vec<String> = o
                .pointer("/spec/ports")
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .map(|p| {
                            let port = p.get("port").and_then(Value::as_i64).unwrap_or(0);
                            let proto = p.get("protocol").and_then(Value::as_str).unwrap_or("TCP");
                            match p.get("nodePort").and_then(Value::as_i64) {
                                Some(np) => format!("{port}:{np}/{proto}"),
                                None => format!("{port}/{proto}"),
                            }
                        })
                        .collect()
                })
                .unwrap_or_default();
            let selector: Vec<String> = o
                .pointer("/spec/selector")
                .and_then(Value::as_object)
                .map(|m| {
                    m.iter()
                        .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
                        .collect()
                })
                .unwrap_or_default();
            (
                vec![
                    col("Name", "string", "name", 0),
                    col("Type", "string", "", 0),
                    col("Cluster-IP", "string", "", 0),
                    col("External-IP", "string", "", 0),
                    col("Port(s)", "string", "", 0),
                    col("Age", "string", "", 0),
                    col("Selector", "string", "", 1),
                ],
                vec![
                    name,
                    json!(ty),
                    json!(none_if_empty(s(o, "/spec/clusterIP").into())),
                    json!(ext),
                    json!(none_if_empty(ports.join(","))),
                    json!(created),
                    json!(none_if_empty(selector.join(","))),
                ],
            )
        }
        "Node" => {
            let ready = o
                .pointer("/status/conditions")
                .and_then(Value::as_array)
                .and_then(|c| c.iter().find(|c| s(c, "/type") == "Ready"))
                .map(|c| match s(c, "/status") {
                    "True" => "Ready",
                    "False" => "NotReady",
                    _ => "Unknown",
                })
                .unwrap_or("Unknown");
            let mut status = ready.to_string();
            if o.pointer("/spec/unschedulable").and_then(Value::as_bool) == Some(true) {
                status.push_str(",SchedulingDisabled");
            }
            let roles: Vec<String> = o
                .pointer("/metadata/labels")
                .and_then(Value::as_object)
                .map(|m| {
                    m.keys()
                        .filter_map(|k| {
                            k.strip_prefix("node-role.kubernetes.io/").map(String::from)
                        })
                        .collect()
                })
                .unwrap_or_default();
            (
                vec![
                    col("Name", "string", "name", 0),
                    col("Status", "string", "", 0),
                    col("Roles", "string", "", 0),
                    col("Age", "string", "", 0),
                    col("Version", "string", "", 0),
                ],
                vec![
                    name,
                    json!(status),
                    json!(none_if_empty(roles.join(","))),
                    json!(created),
                    json!(s(o, "/status/nodeInfo/kubeletVersion")),
                ],
            )
        }
        "Namespace" => (
            vec![
                col("Name", "string", "name", 0),
                col("Status", "string", "", 0),
                col("Age", "string", "", 0),
            ],
            vec![name, json!(s(o, "/status/phase")), json!(created)],
        ),
        "ConfigMap" | "Secret" => {
            let n = o
                .get("data")
                .and_then(Value::as_object)
                .map(|m| m.len())
                .unwrap_or(0)
                + o.get("binaryData")
                    .and_then(Value::as_object)
                    .map(|m| m.len())
                    .unwrap_or(0);
            if kind == "Secret" {
                (
                    vec![
                        col("Name", "string", "name", 0),
                        col("Type", "string", "", 0),
                        col("Data", "integer", "", 0),
                        col("Age", "string", "", 0),
                    ],
                    vec![name, json!(s(o, "/type")), json!(n), json!(created)],
                )
            } else {
                (
                    vec![
                        col("Name", "string", "name", 0),
                        col("Data", "integer", "", 0),
                        col("Age", "string", "", 0),
                    ],
                    vec![name, json!(n), json!(created)],
                )
            }
        }
        "ServiceAccount" => (
            vec![
                col("Name", "string", "name", 0),
                col("Secrets", "string", "", 0),
                col("Age", "string", "", 0),
            ],
            vec![
                name,
                json!(
                    o.get("secrets")
                        .and_then(Value::as_array)
                        .map(Vec::len)
                        .unwrap_or(0)
                ),
                json!(created),
            ],
        ),
        "Endpoints" => {
            let mut eps = Vec::new();
            for sub in o
                .get("subsets")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default()
            {
                let ports: Vec<i64> = sub
                    .get("ports")
                    .and_then(Value::as_array)
                    .map(|a| {
                        a.iter()
                            .filter_map(|p| p.get("port").and_then(Value::as_i64))
                            .collect()
                    })
                    .unwrap_or_default();
                for a in sub
                    .get("addresses")
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default()
                {
                    let ip = s(&a, "/ip");
                    if ports.is_empty() {
                        eps.push(ip.to_string());
                    }
                    for p in &ports {
                        eps.push(format!("{ip}:{p}"));
                    }
                }
            }
            (
                vec![
                    col("Name", "string", "name", 0),
                    col("Endpoints", "string", "", 0),
                    col("Age", "string", "", 0),
                ],
                vec![name, json!(none_if_empty(eps.join(","))), json!(created)],
            )
        }
        "EndpointSlice" => {
            let ports: Vec<String> = o
                .get("ports")
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .filter_map(|p| p.get("port").and_then(Value::as_i64))
                        .map(|p| p.to_string())
                        .collect()
                })
                .unwrap_or_default();
            let addrs: Vec<String> = o
                .get("endpoints")
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .flat_map(|e| {
                            e.get("addresses")
                                .and_then(Value::as_array)
                                .cloned()
                                .unwrap_or_default()
                        })
                        .filter_map(|v| v.as_str().map(String::from))
                        .collect()
                })
                .unwrap_or_default();
            (
                vec![
                    col("Name", "string", "name", 0),
                    col("AddressType", "string", "", 0),
                    col("Ports", "string", "", 0),
                    col("Endpoints", "string", "", 0),
                    col("Age", "string", "", 0),
                ],
                vec![
                    name,
                    json!(s(o, "/addressType")),
                    json!(none_if_empty(ports.join(","))),
                    json!(none_if_empty(addrs.join(","))),
                    json!(created),
                ],
            )
        }
        "Event" => {
            let last = [
                "/series/lastObservedTime",
                "/lastTimestamp",
                "/eventTime",
                "/metadata/creationTimestamp",
            ]
            .iter()
            .find(|p| !s(o, p).is_empty())
            .map(|p| age(o, p))
            .unwrap_or_else(|| "<unknown>".into());
            let object = format!(
                "{}/{}",
                s(o, "/involvedObject/kind").to_lowercase(),
                s(o, "/involvedObject/name")
            );
            (
                vec![
                    col("Last Seen", "string", "", 0),
                    col("Type", "string", "", 0),
                    col("Reason", "string", "", 0),
                    col("Object", "string", "", 0),
                    col("Message", "string", "", 0),
                ],
                vec![
                    json!(last),
                    json!(s(o, "/type")),
                    json!(s(o, "/reason")),
                    json!(object),
                    json!(s(o, "/message")),
                ],
            )
        }
        "Lease" => (
            vec![
                col("Name", "string", "name", 0),
                col("Holder", "string", "", 0),
                col("Age", "string", "", 0),
            ],
            vec![name, json!(s(o, "/spec/holderIdentity")), json!(created)],
        ),
        _ => (
            vec![
                col("Name", "string", "name", 0),
                col("Age", "string", "", 0),
            ],
            vec![name, json!(created)],
        ),
    }
}

fn row(res: &ResourceInfo, obj: &Value, include: IncludeObject) -> (Vec<Value>, Value) {
    // Events print from the core shape whichever group was asked.
    let core_shape = if res.group == "events.k8s.io" {
        super::events::to_core(obj)
    } else {
        obj.clone()
    };
    let (cols, cells) = columns_and_cells(res.kind, &core_shape);
    let mut r = json!({"cells": cells});
    match include {
        IncludeObject::None => {}
        IncludeObject::Object => r["object"] = obj.clone(),
        IncludeObject::Metadata => {
            r["object"] = json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": obj.get("metadata").cloned().unwrap_or(json!({}))});
        }
    }
    (cols, r)
}

/// A Table for a list of objects (already in the representation of `res`).
pub fn table(
    res: &ResourceInfo,
    objs: &[Value],
    list_meta: Value,
    include: IncludeObject,
) -> Value {
    let mut cols = columns_and_cells(res.kind, &json!({})).0;
    let mut rows = Vec::with_capacity(objs.len());
    for o in objs {
        let (c, r) = row(res, o, include);
        cols = c;
        rows.push(r);
    }
    json!({"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": list_meta, "columnDefinitions": cols, "rows": rows})
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testapi::resources::find;

    #[test]
    fn durations_like_upstream() {
        assert_eq!(human_duration(5), "5s");
        assert_eq!(human_duration(185), "3m5s");
        assert_eq!(human_duration(600), "10m");
        assert_eq!(human_duration(3 * 3600 + 60), "3h1m");
        assert_eq!(human_duration(30 * 3600), "30h");
        assert_eq!(human_duration(3 * 86400 + 3600), "3d1h");
    }

    #[test]
    fn service_row() {
        let svc = json!({"metadata": {"name": "s", "creationTimestamp": util::now_rfc3339()},
            "spec": {"type": "NodePort", "clusterIP": "10.96.0.10", "ports": [{"port": 80, "nodePort": 30080, "protocol": "TCP"}]}});
        let t = table(
            find("", "v1", "services").expect("svc"),
            &[svc],
            json!({}),
            IncludeObject::Metadata,
        );
        assert_eq!(t["rows"][0]["cells"][4], "80:30080/TCP");
        assert_eq!(t["rows"][0]["cells"][3], "<none>");
        assert_eq!(t["rows"][0]["object"]["kind"], "PartialObjectMetadata");
    }
}
