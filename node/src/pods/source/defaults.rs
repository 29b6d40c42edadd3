//! Defaults for static pods, which never pass through the API server: the
//! API's pod defaults kubelet relies on, and the fields kubelet's file
//! source sets (`applyDefaults`): name suffixed with the node name, default
//! namespace, `spec.nodeName`, the config annotations, a toleration of
//! every NoExecute taint, phase Pending.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Pod, PodSecurityContext, PodStatus, Toleration};

use crate::pod::podutil::{
    CONFIG_HASH_ANNOTATION, CONFIG_SEEN_ANNOTATION, CONFIG_SOURCE_ANNOTATION,
};

/// The API server's `imagePullPolicy` default: `Always` for `:latest` or an
/// untagged image, else `IfNotPresent`.
pub fn default_pull_policy(image: &str) -> &'static str {
    let without_digest = image.split('@').next().unwrap_or(image);
    if image.contains('@') {
        return "IfNotPresent";
    }
    let last = without_digest.rsplit('/').next().unwrap_or(without_digest);
    match last.rsplit_once(':') {
        Some((_, "latest")) | None => "Always",
        Some(_) => "IfNotPresent",
    }
}

fn default_container(c: &mut Container, host_network: bool) {
    if c.image_pull_policy.is_none() {
        c.image_pull_policy =
            Some(default_pull_policy(c.image.as_deref().unwrap_or_default()).into());
    }
    if c.termination_message_path.is_none() {
        c.termination_message_path = Some("/dev/termination-log".into());
    }
    if c.termination_message_policy.is_none() {
        c.termination_message_policy = Some("File".into());
    }
    for p in c.ports.iter_mut().flatten() {
        if p.protocol.is_none() {
            p.protocol = Some("TCP".into());
        }
        if host_network && p.host_port.is_none() {
            p.host_port = Some(p.container_port);
        }
    }
}

/// Applies the API defaults kubelet depends on.
pub fn apply_api_defaults(pod: &mut Pod) {
    let Some(spec) = pod.spec.as_mut() else {
        return;
    };
    spec.restart_policy.get_or_insert_with(|| "Always".into());
    spec.dns_policy.get_or_insert_with(|| "ClusterFirst".into());
    spec.termination_grace_period_seconds.get_or_insert(30);
    spec.scheduler_name
        .get_or_insert_with(|| "default-scheduler".into());
    spec.security_context
        .get_or_insert_with(PodSecurityContext::default);
    spec.enable_service_links.get_or_insert(true);
    let host_network = spec.host_network.unwrap_or(false);
    for c in spec.containers.iter_mut() {
        default_container(c, host_network);
    }
    for c in spec.init_containers.iter_mut().flatten() {
        default_container(c, host_network);
    }
}

/// kubelet's `applyDefaults` for a manifest read from `path`. `uid` is the
/// manifest's stable identity, `seen` the first time keelson saw it.
pub fn apply_static_defaults(pod: &mut Pod, node_name: &str, uid: &str, seen: &str) {
    if pod.metadata.uid.as_deref().is_none_or(str::is_empty) {
        pod.metadata.uid = Some(uid.to_string());
    }
    let base = pod.metadata.name.clone().unwrap_or_default();
    pod.metadata.name = Some(format!("{base}-{}", node_name.to_lowercase()));
    if pod.metadata.namespace.as_deref().is_none_or(str::is_empty) {
        pod.metadata.namespace = Some("default".into());
    }
    let ann = pod.metadata.annotations.get_or_insert_with(BTreeMap::new);
    ann.insert(
        CONFIG_HASH_ANNOTATION.into(),
        pod.metadata.uid.clone().unwrap_or_default(),
    );
    ann.insert(CONFIG_SOURCE_ANNOTATION.into(), "file".into());
    ann.insert(CONFIG_SEEN_ANNOTATION.into(), seen.into());
    apply_api_defaults(pod);
    if let Some(spec) = pod.spec.as_mut() {
        spec.node_name = Some(node_name.to_string());
        let tol = Toleration {
            operator: Some("Exists".into()),
            effect: Some("NoExecute".into()),
            ..Default::default()
        };
        let list = spec.tolerations.get_or_insert_with(Vec::new);
        if !list.contains(&tol) {
            list.push(tol);
        }
    }
    pod.status = Some(PodStatus {
        phase: Some("Pending".into()),
        ..Default::default()
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pull_policy_defaults() {
        assert_eq!(default_pull_policy("busybox"), "Always");
        assert_eq!(default_pull_policy("busybox:latest"), "Always");
        assert_eq!(default_pull_policy("busybox:1.36"), "IfNotPresent");
        assert_eq!(default_pull_policy("localhost:5000/busybox"), "Always");
        assert_eq!(default_pull_policy("b@sha256:00"), "IfNotPresent");
    }

    #[test]
    fn static_defaults() {
        let mut p: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "etcd"},
            "spec": {"hostNetwork": true, "containers": [{"name": "c", "image": "e:1", "ports": [{"containerPort": 2379}]}]}
        }))
        .expect("pod");
        apply_static_defaults(&mut p, "Node-1", "abc", "2024-01-01T00:00:00Z");
        assert_eq!(p.metadata.name.as_deref(), Some("etcd-node-1"));
        assert_eq!(p.metadata.namespace.as_deref(), Some("default"));
        assert_eq!(p.metadata.uid.as_deref(), Some("abc"));
        let ann = p.metadata.annotations.clone().expect("ann");
        assert_eq!(ann[CONFIG_SOURCE_ANNOTATION], "file");
        assert_eq!(ann[CONFIG_HASH_ANNOTATION], "abc");
        let spec = p.spec.expect("spec");
        assert_eq!(spec.node_name.as_deref(), Some("Node-1"));
        assert_eq!(spec.restart_policy.as_deref(), Some("Always"));
        let c = &spec.containers[0];
        assert_eq!(c.image_pull_policy.as_deref(), Some("IfNotPresent"));
        assert_eq!(c.ports.as_ref().expect("ports")[0].host_port, Some(2379));
        assert_eq!(spec.tolerations.expect("tol").len(), 1);
    }
}
