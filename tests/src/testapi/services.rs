//! Service-specific behaviour: status on create, ClusterIP / NodePort /
//! healthCheckNodePort allocation and their immutability on update.

use std::net::IpAddr;

use serde_json::{Value, json};

use super::allocator::NODE_PORT_RANGE;
use super::error::{ApiError, Cause, invalid_value};
use super::store::{Txn, key_of};

/// On create the status is reset (an empty load balancer status).
pub fn prepare_create(obj: &mut Value) {
    if let Some(o) = obj.as_object_mut() {
        o.insert("status".into(), json!({"loadBalancer": {}}));
    }
}

fn family(ip: IpAddr) -> &'static str {
    if ip.is_ipv4() { "IPv4" } else { "IPv6" }
}

fn fail(name: &str, causes: Vec<Cause>) -> ApiError {
    ApiError::invalid("", "Service", name, causes)
}

/// Allocates (or keeps) the cluster IP, node ports and health check node
/// port of `new`, which replaces `old` (None on create).
pub fn allocate(txn: &mut Txn<'_>, old: Option<&Value>, new: &mut Value) -> Result<(), ApiError> {
    let key = key_of(new);
    let name = key.1.clone();
    let ty = new
        .pointer("/spec/type")
        .and_then(Value::as_str)
        .unwrap_or("ClusterIP")
        .to_string();
    let Some(spec) = new.get_mut("spec").and_then(Value::as_object_mut) else {
        return Ok(());
    };
    let old_ip = old
        .and_then(|o| o.pointer("/spec/clusterIP"))
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    if ty == "ExternalName" {
        for k in [
            "clusterIP",
            "clusterIPs",
            "ipFamilies",
            "ipFamilyPolicy",
            "internalTrafficPolicy",
        ] {
            spec.remove(k);
        }
    } else {
        let mut requested = spec
            .get("clusterIP")
            .and_then(Value::as_str)
            .or_else(|| {
                spec.get("clusterIPs")
                    .and_then(|a| a.get(0))
                    .and_then(Value::as_str)
            })
            .unwrap_or_default()
            .to_string();
        if requested.is_empty() && !old_ip.is_empty() {
            requested = old_ip.clone();
        }
        if !old_ip.is_empty() && requested != old_ip {
            return Err(fail(
                &name,
                vec![invalid_value(
                    "spec.clusterIPs[0]",
                    &requested,
                    "may not change once set",
                )],
            ));
        }
        let alloc = txn.alloc();
        let cidr = alloc.cidr();
        let ip_str = if requested == "None" {
            "None".to_string()
        } else if requested.is_empty() {
            alloc.pick_ip(&[]).map(|ip| ip.to_string()).ok_or_else(|| {
                ApiError::internal("failed to allocate a serviceIP: range is full")
            })?
        } else {
            let ip: IpAddr = requested.parse().map_err(|_| {
                fail(
                    &name,
                    vec![invalid_value(
                        "spec.clusterIPs[0]",
                        &requested,
                        "must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)",
                    )],
                )
            })?;
            if !alloc.in_range(ip) {
                return Err(fail(
                    &name,
                    vec![invalid_value(
                        "spec.clusterIPs",
                        &requested,
                        &format!(
                            "failed to allocate IP {requested}: provided IP is not in the valid range. The range of valid IPs is {cidr}"
                        ),
                    )],
                ));
            }
            if !alloc.ip_free(&key, ip) {
                return Err(fail(
                    &name,
                    vec![invalid_value(
                        "spec.clusterIPs",
                        &requested,
                        &format!(
                            "failed to allocate IP {requested}: provided IP is already allocated"
                        ),
                    )],
                ));
            }
            ip.to_string()
        };
        let fam = match ip_str.parse::<IpAddr>() {
            Ok(ip) => family(ip),
            Err(_) => family(cidr.addr()),
        };
        spec.insert("clusterIP".into(), json!(ip_str));
        spec.insert("clusterIPs".into(), json!([ip_str]));
        if spec
            .get("ipFamilies")
            .is_none_or(|v| v.as_array().is_none_or(|a| a.is_empty()))
        {
            spec.insert("ipFamilies".into(), json!([fam]));
        }
        if spec.get("ipFamilyPolicy").is_none_or(Value::is_null) {
            spec.insert("ipFamilyPolicy".into(), json!("SingleStack"));
        }
    }
    // Node ports.
    let wants_node_ports = ty == "NodePort"
        || (ty == "LoadBalancer"
            && spec
                .get("allocateLoadBalancerNodePorts")
                .and_then(Value::as_bool)
                != Some(false));
    let old_ports: Vec<Value> = old
        .and_then(|o| o.pointer("/spec/ports"))
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let mut taken: Vec<u16> = Vec::new();
    if let Some(ports) = spec.get_mut("ports").and_then(Value::as_array_mut) {
        for (i, p) in ports.iter_mut().enumerate() {
            let Some(pm) = p.as_object_mut() else {
                continue;
            };
            let proto = pm
                .get("protocol")
                .and_then(Value::as_str)
                .unwrap_or("TCP")
                .to_string();
            let given = pm.get("nodePort").and_then(Value::as_u64).unwrap_or(0) as u16;
            if ty == "ClusterIP" || ty == "ExternalName" {
                // Retyping away from NodePort drops the allocated ports (as
                // upstream's strategy does); asking for one is an error.
                let old_type = old
                    .and_then(|o| o.pointer("/spec/type"))
                    .and_then(Value::as_str)
                    .unwrap_or("ClusterIP");
                let retyped = old_type == "NodePort" || old_type == "LoadBalancer";
                if given != 0 && ty == "ClusterIP" && !retyped {
                    return Err(fail(
                        &name,
                        vec![Cause {
                            reason: "FieldValueForbidden",
                            message: "Forbidden: may not be used when `type` is 'ClusterIP'".into(),
                            field: format!("spec.ports[{i}].nodePort"),
                        }],
                    ));
                }
                pm.remove("nodePort");
                continue;
            }
            if !wants_node_ports && given == 0 {
                continue;
            }
            let port_no = pm.get("port").cloned();
            let reuse = old_ports
                .iter()
                .find(|op| {
                    op.get("port") == port_no.as_ref()
                        && op.get("protocol").and_then(Value::as_str).unwrap_or("TCP") == proto
                })
                .and_then(|op| op.get("nodePort").and_then(Value::as_u64))
                .unwrap_or(0) as u16;
            let alloc = txn.alloc();
            let np = if given != 0 {
                if !NODE_PORT_RANGE.contains(&given) {
                    return Err(fail(
                        &name,
                        vec![invalid_value(
                            &format!("spec.ports[{i}].nodePort"),
                            &given.to_string(),
                            &format!(
                                "provided port is not in the valid range. The range of valid ports is {}-{}",
                                NODE_PORT_RANGE.start(),
                                NODE_PORT_RANGE.end()
                            ),
                        )],
                    ));
                }
                if !alloc.port_free(&key, given, &proto) || taken.contains(&given) {
                    return Err(fail(
                        &name,
                        vec![invalid_value(
                            &format!("spec.ports[{i}].nodePort"),
                            &given.to_string(),
                            "provided port is already allocated",
                        )],
                    ));
                }
                given
            } else if reuse != 0 && !taken.contains(&reuse) {
                reuse
            } else {
                alloc.pick_port(&[proto.as_str()], &taken).ok_or_else(|| {
                    ApiError::internal("failed to allocate a nodePort: range is full")
                })?
            };
            taken.push(np);
            pm.insert("nodePort".into(), json!(np));
        }
    }
    // Health check node port for LoadBalancer + Local.
    let local = spec.get("externalTrafficPolicy").and_then(Value::as_str) == Some("Local");
    if ty == "LoadBalancer" && local {
        let given = spec
            .get("healthCheckNodePort")
            .and_then(Value::as_u64)
            .unwrap_or(0) as u16;
        let old_hc = old
            .and_then(|o| o.pointer("/spec/healthCheckNodePort"))
            .and_then(Value::as_u64)
            .unwrap_or(0) as u16;
        let alloc = txn.alloc();
        let hc = if given != 0 {
            if !alloc.port_free(&key, given, "TCP") || taken.contains(&given) {
                return Err(fail(
                    &name,
                    vec![invalid_value(
                        "spec.healthCheckNodePort",
                        &given.to_string(),
                        "provided port is already allocated",
                    )],
                ));
            }
            given
        } else if old_hc != 0 {
            old_hc
        } else {
            alloc
                .pick_port(&["TCP"], &taken)
                .ok_or_else(|| ApiError::internal("failed to allocate a nodePort: range is full"))?
        };
        spec.insert("healthCheckNodePort".into(), json!(hc));
    } else {
        spec.remove("healthCheckNodePort");
    }
    Ok(())
}
