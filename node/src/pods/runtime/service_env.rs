//! Service environment variables (`FOO_SERVICE_HOST`, `FOO_PORT_80_TCP`,
//! ...) as kubelet injects them: the `kubernetes` Service of the `default`
//! namespace always, the Services of the pod's namespace when
//! `enableServiceLinks` is true.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Service;

/// Services whose variables every pod gets (kubelet's `masterServices`).
const MASTER_SERVICES: &[&str] = &["kubernetes"];

fn var_name(s: &str) -> String {
    s.replace('-', "_").to_uppercase()
}

fn join_host_port(host: &str, port: i32) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// The variables of one Service (empty when it has no cluster IP).
pub fn service_vars(svc: &Service) -> Vec<(String, String)> {
    let Some(spec) = svc.spec.as_ref() else {
        return Vec::new();
    };
    let ip = spec.cluster_ip.as_deref().unwrap_or_default();
    if ip.is_empty() || ip == "None" {
        return Vec::new();
    }
    let ports = spec.ports.as_deref().unwrap_or_default();
    let Some(first) = ports.first() else {
        return Vec::new();
    };
    let prefix = var_name(svc.metadata.name.as_deref().unwrap_or_default());
    let mut out = vec![
        (format!("{prefix}_SERVICE_HOST"), ip.to_string()),
        (format!("{prefix}_SERVICE_PORT"), first.port.to_string()),
    ];
    for p in ports {
        if let Some(n) = p.name.as_deref().filter(|n| !n.is_empty()) {
            out.push((
                format!("{prefix}_SERVICE_PORT_{}", var_name(n)),
                p.port.to_string(),
            ));
        }
    }
    for (i, p) in ports.iter().enumerate() {
        let proto = p
            .protocol
            .as_deref()
            .filter(|p| !p.is_empty())
            .unwrap_or("TCP");
        let lower = proto.to_lowercase();
        let url = format!("{lower}://{}", join_host_port(ip, p.port));
        if i == 0 {
            out.push((format!("{prefix}_PORT"), url.clone()));
        }
        let pp = format!("{prefix}_PORT_{}_{}", p.port, proto.to_uppercase());
        out.push((pp.clone(), url));
        out.push((format!("{pp}_PROTO"), lower));
        out.push((format!("{pp}_PORT"), p.port.to_string()));
        out.push((format!("{pp}_ADDR"), ip.to_string()));
    }
    out
}

/// kubelet's `getServiceEnvVarMap` over all known Services.
pub fn service_env_map<'a>(
    services: impl IntoIterator<Item = &'a Service>,
    namespace: &str,
    enable_service_links: bool,
) -> BTreeMap<String, String> {
    let mut chosen: BTreeMap<String, &Service> = BTreeMap::new();
    for svc in services {
        let name = svc.metadata.name.as_deref().unwrap_or_default();
        let ns = svc.metadata.namespace.as_deref().unwrap_or_default();
        let ip = svc
            .spec
            .as_ref()
            .and_then(|s| s.cluster_ip.as_deref())
            .unwrap_or_default();
        if ip.is_empty() || ip == "None" {
            continue;
        }
        if ns == "default" && MASTER_SERVICES.contains(&name) {
            chosen.entry(name.to_string()).or_insert(svc);
        } else if ns == namespace && enable_service_links {
            chosen.insert(name.to_string(), svc);
        }
    }
    let mut out = BTreeMap::new();
    for svc in chosen.values() {
        for (k, v) in service_vars(svc) {
            out.insert(k, v);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn svc(ns: &str, name: &str, ip: &str, ports: serde_json::Value) -> Service {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": ns},
            "spec": {"clusterIP": ip, "ports": ports}
        }))
        .expect("svc")
    }

    #[test]
    fn docker_link_variables() {
        let s = svc(
            "ns",
            "my-db",
            "10.0.0.5",
            serde_json::json!([
                {"port": 5432}, {"name": "metrics", "port": 9100, "protocol": "UDP"}
            ]),
        );
        let vars: BTreeMap<_, _> = service_vars(&s).into_iter().collect();
        assert_eq!(vars["MY_DB_SERVICE_HOST"], "10.0.0.5");
        assert_eq!(vars["MY_DB_SERVICE_PORT"], "5432");
        assert_eq!(vars["MY_DB_SERVICE_PORT_METRICS"], "9100");
        assert_eq!(vars["MY_DB_PORT"], "tcp://10.0.0.5:5432");
        assert_eq!(vars["MY_DB_PORT_5432_TCP"], "tcp://10.0.0.5:5432");
        assert_eq!(vars["MY_DB_PORT_9100_UDP_PROTO"], "udp");
        assert_eq!(vars["MY_DB_PORT_9100_UDP_ADDR"], "10.0.0.5");
    }

    #[test]
    fn links_follow_namespace_and_flag() {
        let all = vec![
            svc(
                "default",
                "kubernetes",
                "10.96.0.1",
                serde_json::json!([{"name": "https", "port": 443}]),
            ),
            svc("ns", "web", "10.96.0.9", serde_json::json!([{"port": 80}])),
            svc(
                "other",
                "web2",
                "10.96.0.8",
                serde_json::json!([{"port": 80}]),
            ),
            svc("ns", "headless", "None", serde_json::json!([{"port": 80}])),
        ];
        let on = service_env_map(&all, "ns", true);
        assert_eq!(on["KUBERNETES_SERVICE_HOST"], "10.96.0.1");
        assert_eq!(on["WEB_SERVICE_HOST"], "10.96.0.9");
        assert!(!on.contains_key("WEB2_SERVICE_HOST"));
        assert!(!on.contains_key("HEADLESS_SERVICE_HOST"));
        let off = service_env_map(&all, "ns", false);
        assert!(off.contains_key("KUBERNETES_SERVICE_PORT_HTTPS"));
        assert!(!off.contains_key("WEB_SERVICE_HOST"));
    }
}
