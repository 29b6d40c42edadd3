//! Which ConfigMaps and Secrets a pod references (kubelet's
//! `VisitPodConfigmapNames` / `VisitPodSecretNames` for the sources keelson
//! supports): what the node may read for it, and what gets a watch.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::{EnvFromSource, EnvVar, Pod};

/// Names of the ConfigMaps the pod references: env `configMapKeyRef`,
/// `envFrom.configMapRef` (every container kind), configMap volumes and
/// projected configMap sources.
pub fn config_maps(pod: &Pod) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let Some(spec) = pod.spec.as_ref() else {
        return out;
    };
    visit_env(pod, |env, env_from| {
        for e in env {
            if let Some(r) = e
                .value_from
                .as_ref()
                .and_then(|v| v.config_map_key_ref.as_ref())
            {
                out.insert(r.name.clone());
            }
        }
        for f in env_from {
            if let Some(r) = &f.config_map_ref {
                out.insert(r.name.clone());
            }
        }
    });
    for v in spec.volumes.iter().flatten() {
        if let Some(c) = &v.config_map {
            out.insert(c.name.clone());
        }
        for s in v.projected.iter().flat_map(|p| p.sources.iter().flatten()) {
            if let Some(c) = &s.config_map {
                out.insert(c.name.clone());
            }
        }
    }
    out.retain(|n| !n.is_empty());
    out
}

/// Names of the Secrets the pod references: `imagePullSecrets`, env
/// `secretKeyRef`, `envFrom.secretRef`, secret volumes and projected secret
/// sources.
pub fn secrets(pod: &Pod) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let Some(spec) = pod.spec.as_ref() else {
        return out;
    };
    for s in spec.image_pull_secrets.iter().flatten() {
        out.insert(s.name.clone());
    }
    visit_env(pod, |env, env_from| {
        for e in env {
            if let Some(r) = e
                .value_from
                .as_ref()
                .and_then(|v| v.secret_key_ref.as_ref())
            {
                out.insert(r.name.clone());
            }
        }
        for f in env_from {
            if let Some(r) = &f.secret_ref {
                out.insert(r.name.clone());
            }
        }
    });
    for v in spec.volumes.iter().flatten() {
        if let Some(name) = v.secret.as_ref().and_then(|s| s.secret_name.clone()) {
            out.insert(name);
        }
        for s in v.projected.iter().flat_map(|p| p.sources.iter().flatten()) {
            if let Some(c) = &s.secret {
                out.insert(c.name.clone());
            }
        }
    }
    out.retain(|n| !n.is_empty());
    out
}

/// Calls `f` with the env and envFrom of every init, regular and ephemeral
/// container.
fn visit_env(pod: &Pod, mut f: impl FnMut(&[EnvVar], &[EnvFromSource])) {
    let Some(spec) = pod.spec.as_ref() else {
        return;
    };
    for c in spec
        .init_containers
        .iter()
        .flatten()
        .chain(spec.containers.iter())
    {
        f(
            c.env.as_deref().unwrap_or_default(),
            c.env_from.as_deref().unwrap_or_default(),
        );
    }
    for c in spec.ephemeral_containers.iter().flatten() {
        f(
            c.env.as_deref().unwrap_or_default(),
            c.env_from.as_deref().unwrap_or_default(),
        );
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn collects_every_reference() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns"},
            "spec": {
                "imagePullSecrets": [{"name": "pull"}],
                "initContainers": [{"name": "i", "envFrom": [{"configMapRef": {"name": "cm-init"}}]}],
                "containers": [{"name": "c", "env": [
                    {"name": "A", "valueFrom": {"configMapKeyRef": {"name": "cm-env", "key": "k"}}},
                    {"name": "B", "valueFrom": {"secretKeyRef": {"name": "s-env", "key": "k"}}}
                ], "envFrom": [{"secretRef": {"name": "s-from"}}]}],
                "ephemeralContainers": [{"name": "e", "envFrom": [{"configMapRef": {"name": "cm-eph"}}]}],
                "volumes": [
                    {"name": "v1", "configMap": {"name": "cm-vol"}},
                    {"name": "v2", "secret": {"secretName": "s-vol"}},
                    {"name": "v3", "projected": {"sources": [
                        {"configMap": {"name": "cm-proj"}}, {"secret": {"name": "s-proj"}},
                        {"serviceAccountToken": {"path": "token"}}
                    ]}}
                ]
            }
        }))
        .unwrap();
        assert_eq!(
            config_maps(&pod).into_iter().collect::<Vec<_>>(),
            ["cm-env", "cm-eph", "cm-init", "cm-proj", "cm-vol"]
        );
        assert_eq!(
            secrets(&pod).into_iter().collect::<Vec<_>>(),
            ["pull", "s-env", "s-from", "s-proj", "s-vol"]
        );
    }
}
