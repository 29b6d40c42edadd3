//! Defaulting, as upstream's `pkg/apis/core/v1/defaults.go` (and the
//! discovery group's) fills in fields a client left unset. Written from the
//! documented upstream behaviour; only what the served types need.

use serde_json::{Map, Value, json};

fn obj_mut<'a>(v: &'a mut Value, key: &str) -> Option<&'a mut Map<String, Value>> {
    v.get_mut(key).and_then(Value::as_object_mut)
}

fn set_default(m: &mut Map<String, Value>, key: &str, val: Value) {
    if m.get(key).is_none_or(Value::is_null) {
        m.insert(key.to_string(), val);
    }
}

fn set_default_str(m: &mut Map<String, Value>, key: &str, val: &str) {
    if m.get(key)
        .is_none_or(|v| v.is_null() || v.as_str() == Some(""))
    {
        m.insert(key.to_string(), Value::String(val.to_string()));
    }
}

/// Applies defaults for an object of `kind` (the stored representation).
pub fn apply(kind: &str, obj: &mut Value) {
    match kind {
        "Pod" => pod(obj),
        "Service" => service(obj),
        "Namespace" => namespace(obj),
        "Secret" => secret(obj),
        "Node" => node(obj),
        "Endpoints" => endpoints(obj),
        "EndpointSlice" => endpoint_slice(obj),
        _ => {}
    }
}

/// `imagePullPolicy` default: Always for `:latest` or no tag, else
/// IfNotPresent (an image by digest is IfNotPresent).
pub fn image_pull_policy(image: &str) -> &'static str {
    if image.contains('@') {
        return "IfNotPresent";
    }
    let last = image.rsplit('/').next().unwrap_or(image);
    match last.rsplit_once(':') {
        Some((_, "latest")) | None => "Always",
        Some(_) => "IfNotPresent",
    }
}

fn probe(p: &mut Value) {
    let Some(m) = p.as_object_mut() else { return };
    set_default(m, "timeoutSeconds", json!(1));
    set_default(m, "periodSeconds", json!(10));
    set_default(m, "successThreshold", json!(1));
    set_default(m, "failureThreshold", json!(3));
    handler(m);
}

fn handler(m: &mut Map<String, Value>) {
    if let Some(h) = m.get_mut("httpGet").and_then(Value::as_object_mut) {
        set_default_str(h, "path", "/");
        set_default_str(h, "scheme", "HTTP");
    }
}

fn field_ref_api_version(v: &mut Value) {
    if let Some(f) = v.get_mut("fieldRef").and_then(Value::as_object_mut) {
        set_default_str(f, "apiVersion", "v1");
    }
}

fn container(c: &mut Value, host_network: bool) {
    let Some(m) = c.as_object_mut() else { return };
    let image = m
        .get("image")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    set_default_str(m, "imagePullPolicy", image_pull_policy(&image));
    set_default_str(m, "terminationMessagePath", "/dev/termination-log");
    set_default_str(m, "terminationMessagePolicy", "File");
    set_default(m, "resources", json!({}));
    if let Some(ports) = m.get_mut("ports").and_then(Value::as_array_mut) {
        for p in ports {
            if let Some(pm) = p.as_object_mut() {
                set_default_str(pm, "protocol", "TCP");
                if host_network && let Some(cp) = pm.get("containerPort").cloned() {
                    set_default(pm, "hostPort", cp);
                }
            }
        }
    }
    for pr in ["livenessProbe", "readinessProbe", "startupProbe"] {
        if let Some(p) = m.get_mut(pr) {
            probe(p);
        }
    }
    if let Some(lc) = m.get_mut("lifecycle").and_then(Value::as_object_mut) {
        for h in ["postStart", "preStop"] {
            if let Some(hm) = lc.get_mut(h).and_then(Value::as_object_mut) {
                handler(hm);
            }
        }
    }
    if let Some(env) = m.get_mut("env").and_then(Value::as_array_mut) {
        for e in env {
            if let Some(vf) = e.get_mut("valueFrom") {
                field_ref_api_version(vf);
            }
        }
    }
    // Requests default to limits for each resource with a limit only.
    if let Some(res) = m.get_mut("resources").and_then(Value::as_object_mut)
        && let Some(limits) = res.get("limits").and_then(Value::as_object).cloned()
    {
        let req = res
            .entry("requests")
            .or_insert_with(|| Value::Object(Map::new()));
        if let Some(rm) = req.as_object_mut() {
            for (k, v) in limits {
                rm.entry(k).or_insert(v);
            }
        }
    }
}

fn volume(v: &mut Value) {
    let Some(m) = v.as_object_mut() else { return };
    let has_source = m.keys().any(|k| k != "name");
    if !has_source {
        m.insert("emptyDir".into(), json!({}));
    }
    for src in ["secret", "configMap", "downwardAPI", "projected"] {
        if let Some(s) = m.get_mut(src).and_then(Value::as_object_mut) {
            set_default(s, "defaultMode", json!(420));
        }
    }
    if let Some(h) = m.get_mut("hostPath").and_then(Value::as_object_mut) {
        set_default(h, "type", json!(""));
    }
    if let Some(items) = m
        .get_mut("downwardAPI")
        .and_then(|d| d.get_mut("items"))
        .and_then(Value::as_array_mut)
    {
        items.iter_mut().for_each(field_ref_api_version);
    }
    if let Some(sources) = m
        .get_mut("projected")
        .and_then(|p| p.get_mut("sources"))
        .and_then(Value::as_array_mut)
    {
        for s in sources {
            if let Some(t) = s
                .get_mut("serviceAccountToken")
                .and_then(Value::as_object_mut)
            {
                set_default(t, "expirationSeconds", json!(3600));
            }
            if let Some(items) = s
                .get_mut("downwardAPI")
                .and_then(|d| d.get_mut("items"))
                .and_then(Value::as_array_mut)
            {
                items.iter_mut().for_each(field_ref_api_version);
            }
        }
    }
}

fn pod(obj: &mut Value) {
    let Some(spec) = obj_mut(obj, "spec") else {
        return;
    };
    set_default_str(spec, "dnsPolicy", "ClusterFirst");
    set_default_str(spec, "restartPolicy", "Always");
    set_default(spec, "terminationGracePeriodSeconds", json!(30));
    set_default_str(spec, "schedulerName", "default-scheduler");
    set_default(spec, "securityContext", json!({}));
    set_default(spec, "enableServiceLinks", json!(true));
    let host_network = spec.get("hostNetwork").and_then(Value::as_bool) == Some(true);
    for list in ["containers", "initContainers", "ephemeralContainers"] {
        if let Some(cs) = spec.get_mut(list).and_then(Value::as_array_mut) {
            for c in cs {
                container(c, host_network);
            }
        }
    }
    if let Some(vs) = spec.get_mut("volumes").and_then(Value::as_array_mut) {
        vs.iter_mut().for_each(volume);
    }
}

fn service(obj: &mut Value) {
    let Some(spec) = obj_mut(obj, "spec") else {
        return;
    };
    set_default_str(spec, "type", "ClusterIP");
    set_default_str(spec, "sessionAffinity", "None");
    if spec.get("sessionAffinity").and_then(Value::as_str) == Some("ClientIP") {
        set_default(
            spec,
            "sessionAffinityConfig",
            json!({"clientIP": {"timeoutSeconds": 10800}}),
        );
    }
    let ty = spec
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or("ClusterIP")
        .to_string();
    if let Some(ports) = spec.get_mut("ports").and_then(Value::as_array_mut) {
        for p in ports {
            if let Some(pm) = p.as_object_mut() {
                set_default_str(pm, "protocol", "TCP");
                let unset = pm
                    .get("targetPort")
                    .is_none_or(|t| t.is_null() || t.as_i64() == Some(0) || t.as_str() == Some(""));
                if unset && let Some(port) = pm.get("port").cloned() {
                    pm.insert("targetPort".into(), port);
                }
            }
        }
    }
    if ty != "ExternalName" {
        set_default_str(spec, "internalTrafficPolicy", "Cluster");
    }
    if ty == "NodePort" || ty == "LoadBalancer" {
        set_default_str(spec, "externalTrafficPolicy", "Cluster");
    }
    if ty == "LoadBalancer" {
        set_default(spec, "allocateLoadBalancerNodePorts", json!(true));
    }
}

fn namespace(obj: &mut Value) {
    let name = obj
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    if let Some(meta) = obj_mut(obj, "metadata") {
        let labels = meta.entry("labels").or_insert_with(|| json!({}));
        if let Some(l) = labels.as_object_mut() {
            l.insert("kubernetes.io/metadata.name".into(), json!(name));
        }
    }
}

fn secret(obj: &mut Value) {
    let Some(m) = obj.as_object_mut() else { return };
    set_default_str(m, "type", "Opaque");
}

fn node(obj: &mut Value) {
    let Some(status) = obj_mut(obj, "status") else {
        return;
    };
    if status.get("allocatable").is_none_or(Value::is_null)
        && let Some(cap) = status.get("capacity").cloned()
    {
        status.insert("allocatable".into(), cap);
    }
}

fn endpoints(obj: &mut Value) {
    if let Some(subsets) = obj.get_mut("subsets").and_then(Value::as_array_mut) {
        for s in subsets {
            if let Some(ports) = s.get_mut("ports").and_then(Value::as_array_mut) {
                for p in ports {
                    if let Some(pm) = p.as_object_mut() {
                        set_default_str(pm, "protocol", "TCP");
                    }
                }
            }
        }
    }
}

fn endpoint_slice(obj: &mut Value) {
    if let Some(ports) = obj.get_mut("ports").and_then(Value::as_array_mut) {
        for p in ports {
            if let Some(pm) = p.as_object_mut() {
                set_default(pm, "name", json!(""));
                set_default_str(pm, "protocol", "TCP");
            }
        }
    }
}

/// QoS class of a pod (`ComputePodQOS`): from the pod-level resources
/// when set (PodLevelResources), else from every container's positive cpu
/// and memory requests and limits, compared by value.
pub fn qos_class(pod: &Value) -> &'static str {
    let value = |v: &Value| {
        v.as_str()
            .and_then(|s| keelson::quantity::Quantity::parse(s).ok())
            .map(|q| q.milli_value())
            .unwrap_or(0)
    };
    let mut requests: Map<String, Value> = Map::new();
    let mut limits: Map<String, Value> = Map::new();
    let mut guaranteed = true;
    let add = |into: &mut Map<String, Value>, list: Option<&Value>| -> Vec<String> {
        let mut found = Vec::new();
        for (k, v) in list.and_then(Value::as_object).into_iter().flatten() {
            if (k == "cpu" || k == "memory") && value(v) > 0 {
                let sum = into.get(k).map(value).unwrap_or(0) + value(v);
                into.insert(k.clone(), json!(format!("{sum}m")));
                found.push(k.clone());
            }
        }
        found
    };
    match pod.pointer("/spec/resources").filter(|r| !r.is_null()) {
        Some(r) => {
            add(&mut requests, r.get("requests"));
            let has_limits = r
                .get("limits")
                .and_then(Value::as_object)
                .is_some_and(|m| !m.is_empty());
            let found = add(&mut limits, r.get("limits"));
            if has_limits && found.len() != 2 {
                guaranteed = false;
            }
        }
        None => {
            for l in ["containers", "initContainers"] {
                for c in pod
                    .pointer(&format!("/spec/{l}"))
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    add(&mut requests, c.pointer("/resources/requests"));
                    if add(&mut limits, c.pointer("/resources/limits")).len() != 2 {
                        guaranteed = false;
                    }
                }
            }
        }
    }
    if requests.is_empty() && limits.is_empty() {
        return "BestEffort";
    }
    if guaranteed && requests.iter().any(|(k, v)| limits.get(k) != Some(v)) {
        guaranteed = false;
    }
    if guaranteed && requests.len() == limits.len() {
        "Guaranteed"
    } else {
        "Burstable"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_defaults_follow_upstream() {
        let mut p = json!({"spec": {"containers": [
            {"name": "a", "image": "busybox", "ports": [{"containerPort": 80}],
             "readinessProbe": {"httpGet": {"port": 80}},
             "resources": {"limits": {"cpu": "1"}}},
            {"name": "b", "image": "reg:5000/x/y:1.2"}
        ], "volumes": [{"name": "v"}, {"name": "s", "secret": {"secretName": "x"}}]}});
        apply("Pod", &mut p);
        let s = &p["spec"];
        assert_eq!(s["restartPolicy"], "Always");
        assert_eq!(s["dnsPolicy"], "ClusterFirst");
        assert_eq!(s["terminationGracePeriodSeconds"], 30);
        assert_eq!(s["schedulerName"], "default-scheduler");
        assert_eq!(s["containers"][0]["imagePullPolicy"], "Always");
        assert_eq!(s["containers"][1]["imagePullPolicy"], "IfNotPresent");
        assert_eq!(
            s["containers"][0]["terminationMessagePath"],
            "/dev/termination-log"
        );
        assert_eq!(s["containers"][0]["ports"][0]["protocol"], "TCP");
        let rp = &s["containers"][0]["readinessProbe"];
        assert_eq!(
            (rp["periodSeconds"].as_i64(), rp["timeoutSeconds"].as_i64()),
            (Some(10), Some(1))
        );
        assert_eq!(
            (
                rp["successThreshold"].as_i64(),
                rp["failureThreshold"].as_i64()
            ),
            (Some(1), Some(3))
        );
        assert_eq!(rp["httpGet"]["path"], "/");
        assert_eq!(rp["httpGet"]["scheme"], "HTTP");
        assert_eq!(s["containers"][0]["resources"]["requests"]["cpu"], "1");
        assert_eq!(s["volumes"][0]["emptyDir"], json!({}));
        assert_eq!(s["volumes"][1]["secret"]["defaultMode"], 420);
        assert_eq!(qos_class(&p), "Burstable");
    }

    #[test]
    fn image_pull_policy_cases() {
        assert_eq!(image_pull_policy("busybox:latest"), "Always");
        assert_eq!(image_pull_policy("localhost:5000/busybox"), "Always");
        assert_eq!(image_pull_policy("busybox:1"), "IfNotPresent");
        assert_eq!(image_pull_policy("busybox@sha256:abc"), "IfNotPresent");
    }

    #[test]
    fn service_defaults() {
        let mut s = json!({"spec": {"type": "LoadBalancer", "ports": [{"port": 80}]}});
        apply("Service", &mut s);
        assert_eq!(s["spec"]["sessionAffinity"], "None");
        assert_eq!(s["spec"]["ports"][0]["targetPort"], 80);
        assert_eq!(s["spec"]["ports"][0]["protocol"], "TCP");
        assert_eq!(s["spec"]["externalTrafficPolicy"], "Cluster");
        assert_eq!(s["spec"]["internalTrafficPolicy"], "Cluster");
        assert_eq!(s["spec"]["allocateLoadBalancerNodePorts"], true);
    }
}
