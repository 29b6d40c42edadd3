//! A container's environment as kubelet builds it
//! (`makeEnvironmentVariables`): `envFrom` first, then `env` in order (a
//! literal value expanded against what is defined so far and the service
//! variables; `valueFrom` from the downward API, a ConfigMap or a Secret),
//! then the service variables not already defined.

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::api::core::v1::{Container, Pod};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as K8sQuantity;

use crate::downward::{self, DownwardError, PodRuntime};
use crate::pods::deps::{EnvSourceError, EnvSources};
use keelson_common::expansion::expand_known;

/// Inputs of an environment.
pub struct EnvInputs<'a> {
    /// The pod.
    pub pod: &'a Pod,
    /// The container.
    pub container: &'a Container,
    /// The pod's IPs (empty before the sandbox has one).
    pub pod_ips: &'a [String],
    /// The node's IPs.
    pub host_ips: &'a [String],
    /// Service variables for the pod, `None` when Services have not been
    /// listed yet.
    pub service_env: Option<&'a BTreeMap<String, String>>,
    /// ConfigMap/Secret lookups.
    pub sources: &'a dyn EnvSources,
    /// Node allocatable (defaults for `resourceFieldRef`).
    pub allocatable: &'a BTreeMap<String, K8sQuantity>,
}

/// The environment, plus warnings to record as events.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Environment {
    /// `(name, value)` in definition order.
    pub vars: Vec<(String, String)>,
    /// `InvalidEnvironmentVariableNames` event messages.
    pub invalid_key_messages: Vec<String>,
}

impl Environment {
    /// The value of a variable.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.vars
            .iter()
            .rev()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

struct Ordered {
    vars: Vec<(String, String)>,
    index: HashMap<String, usize>,
}

impl Ordered {
    fn set(&mut self, k: String, v: String) {
        match self.index.get(&k) {
            Some(&i) => self.vars[i].1 = v,
            None => {
                self.index.insert(k.clone(), self.vars.len());
                self.vars.push((k, v));
            }
        }
    }
    fn get(&self, k: &str) -> Option<&String> {
        self.index.get(k).map(|&i| &self.vars[i].1)
    }
}

/// Why a container's environment could not be built; the text becomes a
/// `CreateContainerConfigError` message (kubelet's words).
#[derive(Debug, thiserror::Error)]
pub enum EnvironmentError {
    /// The Services for the service variables were never listed.
    #[error("services have not yet been read at least once, cannot construct envvars")]
    ServicesNotRead,
    /// A ConfigMap or Secret lookup failed.
    #[error(transparent)]
    Source(#[from] EnvSourceError),
    /// A downward API value could not be computed.
    #[error(transparent)]
    Downward(#[from] DownwardError),
    /// `valueFrom.fileKeyRef`, which keelson does not read.
    #[error("keelson does not support fileKeyRef environment variables (EnvFiles): {0}")]
    FileKeyRef(String),
}

/// Builds the environment.
pub async fn make_environment(inp: &EnvInputs<'_>) -> Result<Environment, EnvironmentError> {
    let is_static = crate::pod::podutil::is_static(inp.pod);
    let empty = BTreeMap::new();
    let service_env = match inp.service_env {
        Some(s) => s,
        None if is_static => &empty,
        None => {
            return Err(EnvironmentError::ServicesNotRead);
        }
    };
    let ns = crate::pod::podutil::namespace(inp.pod);
    let mut tmp = Ordered {
        vars: Vec::new(),
        index: HashMap::new(),
    };
    let mut out = Environment::default();
    for src in inp.container.env_from.iter().flatten() {
        let got = inp.sources.env_from(ns, src).await?;
        if let Some(m) = got.invalid_keys_message {
            out.invalid_key_messages.push(m);
        }
        for (k, v) in got.vars {
            tmp.set(k, v);
        }
    }
    for var in inp.container.env.iter().flatten() {
        let literal = var.value.as_deref().unwrap_or_default();
        let value = if !literal.is_empty() {
            expand_known(literal, |name: &str| {
                tmp.get(name)
                    .cloned()
                    .or_else(|| service_env.get(name).cloned())
            })
        } else if let Some(from) = &var.value_from {
            if let Some(f) = &from.field_ref {
                downward::pod_field(
                    inp.pod,
                    f,
                    &PodRuntime {
                        pod_ips: inp.pod_ips,
                        host_ips: inp.host_ips,
                    },
                )?
            } else if let Some(r) = &from.resource_field_ref {
                downward::container_resource(inp.pod, Some(inp.container), r, inp.allocatable)?
            } else if let Some(c) = &from.config_map_key_ref {
                match inp.sources.config_map_key(ns, c).await? {
                    Some(v) => v,
                    None => continue,
                }
            } else if let Some(s) = &from.secret_key_ref {
                match inp.sources.secret_key(ns, s).await? {
                    Some(v) => v,
                    None => continue,
                }
            } else if from.file_key_ref.is_some() {
                // EnvFiles (beta, on in v1.36): kubelet reads the value from
                // a file an init container wrote into an emptyDir.
                return Err(EnvironmentError::FileKeyRef(var.name.clone()));
            } else {
                String::new()
            }
        } else {
            String::new()
        };
        tmp.set(var.name.clone(), value);
    }
    let defined: std::collections::HashSet<String> = tmp.index.keys().cloned().collect();
    out.vars = tmp.vars;
    for (k, v) in service_env {
        if !defined.contains(k) {
            out.vars.push((k.clone(), v.clone()));
        }
    }
    Ok(out)
}

/// kubelet's `ExpandContainerCommandAndArgs`: `$(VAR)` in command and args
/// against the final environment.
pub fn expand_command_and_args(c: &Container, env: &Environment) -> (Vec<String>, Vec<String>) {
    let map: HashMap<&str, &str> = env
        .vars
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let lookup = |n: &str| map.get(n).map(|v| v.to_string());
    let command = c
        .command
        .iter()
        .flatten()
        .map(|s| expand_known(s, lookup))
        .collect();
    let args = c
        .args
        .iter()
        .flatten()
        .map(|s| expand_known(s, lookup))
        .collect();
    (command, args)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pods::deps::{EnvFromVars, EnvSourceError, EnvSources};
    use futures::future::BoxFuture;
    use k8s_openapi::api::core::v1::{
        ConfigMapKeySelector, EnvFromSource, Secret, SecretKeySelector,
    };

    struct Fixed;
    impl EnvSources for Fixed {
        fn config_map_key<'a>(
            &'a self,
            _: &'a str,
            sel: &'a ConfigMapKeySelector,
        ) -> BoxFuture<'a, Result<Option<String>, EnvSourceError>> {
            Box::pin(async move {
                match sel.key.as_str() {
                    "k" => Ok(Some("from-cm".into())),
                    _ if sel.optional == Some(true) => Ok(None),
                    _ => Err(EnvSourceError::MissingKey {
                        kind: "ConfigMap",
                        key: sel.key.clone(),
                        namespace: "ns".into(),
                        name: sel.name.clone(),
                    }),
                }
            })
        }
        fn secret_key<'a>(
            &'a self,
            _: &'a str,
            _: &'a SecretKeySelector,
        ) -> BoxFuture<'a, Result<Option<String>, EnvSourceError>> {
            Box::pin(async { Ok(Some("s3cr3t".into())) })
        }
        fn env_from<'a>(
            &'a self,
            _: &'a str,
            _: &'a EnvFromSource,
        ) -> BoxFuture<'a, Result<EnvFromVars, EnvSourceError>> {
            Box::pin(async {
                Ok(EnvFromVars {
                    vars: vec![
                        ("A".into(), "from-envfrom".into()),
                        ("B".into(), "b".into()),
                    ],
                    invalid_keys_message: None,
                })
            })
        }
        fn secret<'a>(
            &'a self,
            _: &'a str,
            _: &'a str,
        ) -> BoxFuture<'a, Result<Option<Secret>, EnvSourceError>> {
            Box::pin(async { Ok(None) })
        }
    }

    #[tokio::test]
    async fn order_overrides_expansion_and_sources() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u"},
            "spec": {"nodeName": "n1", "containers": [{
                "name": "c",
                "command": ["echo", "$(A)", "$(MISSING)"],
                "args": ["$(POD_IP)"],
                "envFrom": [{"configMapRef": {"name": "x"}}],
                "env": [
                    {"name": "A", "value": "override"},
                    {"name": "REF", "value": "$(A)-$(B)-$(KUBERNETES_SERVICE_HOST)"},
                    {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                    {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                    {"name": "CM", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "k"}}},
                    {"name": "OPT", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "nope", "optional": true}}},
                    {"name": "SEC", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}
                ]
            }]}
        }))
        .expect("pod");
        let services = BTreeMap::from([(
            "KUBERNETES_SERVICE_HOST".to_string(),
            "10.96.0.1".to_string(),
        )]);
        let alloc = BTreeMap::new();
        let env = make_environment(&EnvInputs {
            pod: &pod,
            container: &pod.spec.as_ref().expect("spec").containers[0],
            pod_ips: &["10.88.0.5".to_string()],
            host_ips: &["192.168.1.2".to_string()],
            service_env: Some(&services),
            sources: &Fixed,
            allocatable: &alloc,
        })
        .await
        .expect("env");
        assert_eq!(env.get("A"), Some("override"));
        assert_eq!(env.get("REF"), Some("override-b-10.96.0.1"));
        assert_eq!(env.get("POD_IP"), Some("10.88.0.5"));
        assert_eq!(env.get("NODE"), Some("n1"));
        assert_eq!(env.get("CM"), Some("from-cm"));
        assert_eq!(env.get("OPT"), None);
        assert_eq!(env.get("SEC"), Some("s3cr3t"));
        assert_eq!(env.get("KUBERNETES_SERVICE_HOST"), Some("10.96.0.1"));
        let (cmd, args) =
            expand_command_and_args(&pod.spec.as_ref().expect("spec").containers[0], &env);
        assert_eq!(cmd, vec!["echo", "override", "$(MISSING)"]);
        assert_eq!(args, vec!["10.88.0.5"]);
    }

    #[tokio::test]
    async fn services_not_synced_is_an_error_except_for_static_pods() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns"},
            "spec": {"containers": [{"name": "c"}]}
        }))
        .expect("pod");
        let alloc = BTreeMap::new();
        let inputs = EnvInputs {
            pod: &pod,
            container: &pod.spec.as_ref().expect("spec").containers[0],
            pod_ips: &[],
            host_ips: &[],
            service_env: None,
            sources: &Fixed,
            allocatable: &alloc,
        };
        let err = make_environment(&inputs)
            .await
            .expect_err("not synced")
            .to_string();
        assert!(err.contains("services have not yet been read"), "{err}");
    }

    #[tokio::test]
    async fn file_key_ref_is_refused_not_left_empty() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns"},
            "spec": {"containers": [{"name": "c", "env": [{"name": "TOKEN", "valueFrom": {
                "fileKeyRef": {"volumeName": "cfg", "path": "env", "key": "TOKEN"}}}]}]}
        }))
        .expect("pod");
        let alloc = BTreeMap::new();
        let services = BTreeMap::new();
        let inputs = EnvInputs {
            pod: &pod,
            container: &pod.spec.as_ref().expect("spec").containers[0],
            pod_ips: &[],
            host_ips: &[],
            service_env: Some(&services),
            sources: &Fixed,
            allocatable: &alloc,
        };
        let err = make_environment(&inputs).await.expect_err("refused");
        assert_eq!(
            err.to_string(),
            "keelson does not support fileKeyRef environment variables (EnvFiles): TOKEN"
        );
    }
}
