//! What the pod lifecycle needs from the rest of the node role, as narrow
//! traits: volumes (mounts per container, setup/teardown per pod) and the
//! ConfigMap/Secret lookups behind environment variables and image pull
//! secrets. The volume manager implements both (see `volumes_adapter`);
//! [`ApiEnvSources`] reads objects straight from the API and [`NoVolumes`]
//! runs pods that declare no volumes, for tests of the lifecycle alone.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::{
    ConfigMap, ConfigMapKeySelector, Container, EnvFromSource, Pod, Secret, SecretKeySelector,
};
use keelson_cri::api;
use kube::Api;

/// Variables an `envFrom` source yields.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EnvFromVars {
    /// `(name, value)`, prefix applied, in key order.
    pub vars: Vec<(String, String)>,
    /// The `InvalidEnvironmentVariableNames` event message when keys were skipped.
    pub invalid_keys_message: Option<String>,
}

/// Why a pod's volumes are not ready, and when to look again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumesNotReady {
    /// kubelet's error text.
    pub message: String,
    /// When a failed volume's retry backoff ends: kubelet's
    /// WaitForAttachAndMount polls every 300 ms while its reconciler
    /// retries a failed mount after 500 ms, 1 s, 2 s, ... (pkg/kubelet/
    /// volumemanager/volume_manager.go, podAttachAndMountRetryInterval),
    /// so a volume that becomes mountable is used at its next retry, not
    /// after the pod worker's 10 s error backoff. `None`: that backoff.
    pub retry_in: Option<Duration>,
}

impl VolumesNotReady {
    /// An error with no earlier retry than the pod worker's backoff.
    pub fn msg(message: impl Into<String>) -> Self {
        VolumesNotReady {
            message: message.into(),
            retry_in: None,
        }
    }
}

impl std::fmt::Display for VolumesNotReady {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// An error of the volume manager behind these traits, passed on as it is
/// (its text is kubelet's).
pub type ManagerError = Box<dyn std::error::Error + Send + Sync>;

/// Why a volume operation of a pod failed.
#[derive(Debug, thiserror::Error)]
pub enum PodVolumesError {
    /// A pod directory could not be removed.
    #[error("removing {}: {error}", dir.display())]
    RemoveDir {
        /// The directory.
        dir: PathBuf,
        /// Why.
        error: std::io::Error,
    },
    /// The volume manager failed.
    #[error(transparent)]
    Manager(ManagerError),
}

/// Why a ConfigMap or Secret lookup failed (the text of
/// `CreateContainerConfigError`, kubelet's `makeEnvironmentVariables`).
#[derive(Debug, thiserror::Error)]
pub enum EnvSourceError {
    /// The API read failed.
    #[error("couldn't get {kind} {namespace}/{name}: {error}")]
    Get {
        /// `configMap` or `secret`.
        kind: &'static str,
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// Why.
        error: kube::Error,
    },
    /// A required object does not exist.
    #[error("{kind} {name:?} not found")]
    NotFound {
        /// `configmap` or `secret`.
        kind: &'static str,
        /// Name.
        name: String,
    },
    /// A required key is not in the object.
    #[error("couldn't find key {key} in {kind} {namespace}/{name}")]
    MissingKey {
        /// `ConfigMap` or `Secret`.
        kind: &'static str,
        /// The key.
        key: String,
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
    },
    /// The volume manager's lookup failed.
    #[error(transparent)]
    Manager(ManagerError),
}

/// Pod volumes.
pub trait PodVolumes: Send + Sync {
    /// A pod was added or updated (start watching what it references).
    fn register_pod(&self, pod: &Pod);
    /// A pod is gone from the pod manager.
    fn unregister_pod(&self, uid: &str);
    /// Mounts what is missing, refreshes content (kubelet's
    /// WaitForAttachAndMount). The error text is kubelet's.
    fn setup_pod<'a>(&'a self, pod: &'a Pod) -> BoxFuture<'a, Result<(), VolumesNotReady>>;
    /// The CRI mounts of one container, given its resolved environment
    /// (for `subPathExpr`). Not included: /etc/hosts, termination log.
    fn container_mounts<'a>(
        &'a self,
        pod: &'a Pod,
        container: &'a Container,
        env: &'a [(String, String)],
    ) -> BoxFuture<'a, Result<Vec<api::Mount>, PodVolumesError>>;
    /// Unmounts a pod's volumes once its containers are gone.
    fn teardown_pod<'a>(&'a self, uid: &'a str) -> BoxFuture<'a, Result<(), PodVolumesError>>;
    /// Removes a deleted pod's directory.
    fn remove_pod_dir<'a>(&'a self, uid: &'a str) -> BoxFuture<'a, Result<(), PodVolumesError>>;
    /// Removes directories of pods not in `active` (every housekeeping round).
    fn cleanup_orphans<'a>(
        &'a self,
        active: &'a [String],
    ) -> BoxFuture<'a, Result<usize, PodVolumesError>>;
    /// `<root>/pods/<uid>`.
    fn pod_dir(&self, uid: &str) -> PathBuf;
}

/// ConfigMap and Secret lookups for environment variables and pull secrets.
pub trait EnvSources: Send + Sync {
    /// `configMapKeyRef`; `Ok(None)` = optional and missing.
    fn config_map_key<'a>(
        &'a self,
        namespace: &'a str,
        selector: &'a ConfigMapKeySelector,
    ) -> BoxFuture<'a, Result<Option<String>, EnvSourceError>>;
    /// `secretKeyRef`; `Ok(None)` = optional and missing.
    fn secret_key<'a>(
        &'a self,
        namespace: &'a str,
        selector: &'a SecretKeySelector,
    ) -> BoxFuture<'a, Result<Option<String>, EnvSourceError>>;
    /// One `envFrom` entry.
    fn env_from<'a>(
        &'a self,
        namespace: &'a str,
        source: &'a EnvFromSource,
    ) -> BoxFuture<'a, Result<EnvFromVars, EnvSourceError>>;
    /// A Secret (image pull secrets); `Ok(None)` when it does not exist.
    fn secret<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<Secret>, EnvSourceError>>;
}

/// Volumes for pods that declare none: setup succeeds only when the pod has
/// no volumes; pod directories live under `root/pods/<uid>`.
#[derive(Debug, Clone)]
pub struct NoVolumes {
    root: PathBuf,
}

impl NoVolumes {
    /// Pod directories under `root_dir/pods`.
    pub fn new(root_dir: impl Into<PathBuf>) -> Self {
        NoVolumes {
            root: root_dir.into(),
        }
    }
}

impl PodVolumes for NoVolumes {
    fn register_pod(&self, _: &Pod) {}
    fn unregister_pod(&self, _: &str) {}
    fn setup_pod<'a>(&'a self, pod: &'a Pod) -> BoxFuture<'a, Result<(), VolumesNotReady>> {
        Box::pin(async move {
            let volumes: Vec<String> = pod
                .spec
                .as_ref()
                .and_then(|s| s.volumes.as_ref())
                .map(|v| v.iter().map(|v| v.name.clone()).collect())
                .unwrap_or_default();
            if volumes.is_empty() {
                Ok(())
            } else {
                Err(VolumesNotReady::msg(format!(
                    "unmounted volumes=[{}], unattached volumes=[], failed to process volumes=[]: volumes are not supported by this node",
                    volumes.join(" ")
                )))
            }
        })
    }
    fn container_mounts<'a>(
        &'a self,
        _: &'a Pod,
        _: &'a Container,
        _: &'a [(String, String)],
    ) -> BoxFuture<'a, Result<Vec<api::Mount>, PodVolumesError>> {
        Box::pin(async { Ok(Vec::new()) })
    }
    fn teardown_pod<'a>(&'a self, _: &'a str) -> BoxFuture<'a, Result<(), PodVolumesError>> {
        Box::pin(async { Ok(()) })
    }
    fn remove_pod_dir<'a>(&'a self, uid: &'a str) -> BoxFuture<'a, Result<(), PodVolumesError>> {
        Box::pin(async move {
            let dir = self.pod_dir(uid);
            match tokio::fs::remove_dir_all(&dir).await {
                Ok(()) => Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                Err(error) => Err(PodVolumesError::RemoveDir { dir, error }),
            }
        })
    }
    fn cleanup_orphans<'a>(
        &'a self,
        _: &'a [String],
    ) -> BoxFuture<'a, Result<usize, PodVolumesError>> {
        Box::pin(async { Ok(0) })
    }
    fn pod_dir(&self, uid: &str) -> PathBuf {
        self.root.join("pods").join(uid)
    }
}

/// ConfigMaps and Secrets read from the API on every lookup (kubelet's
/// `Get` change-detection strategy).
#[derive(Clone)]
pub struct ApiEnvSources {
    client: kube::Client,
}

impl std::fmt::Debug for ApiEnvSources {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ApiEnvSources")
    }
}

impl ApiEnvSources {
    /// Lookups through `client`.
    pub fn new(client: kube::Client) -> Self {
        ApiEnvSources { client }
    }

    async fn config_map(&self, ns: &str, name: &str) -> Result<Option<ConfigMap>, EnvSourceError> {
        let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), ns);
        api.get_opt(name)
            .await
            .map_err(|error| EnvSourceError::Get {
                kind: "configMap",
                namespace: ns.to_string(),
                name: name.to_string(),
                error,
            })
    }

    async fn secret_obj(&self, ns: &str, name: &str) -> Result<Option<Secret>, EnvSourceError> {
        let api: Api<Secret> = Api::namespaced(self.client.clone(), ns);
        api.get_opt(name)
            .await
            .map_err(|error| EnvSourceError::Get {
                kind: "secret",
                namespace: ns.to_string(),
                name: name.to_string(),
                error,
            })
    }
}

/// kubelet's check for environment variable names (C identifier rules
/// relaxed as `IsEnvVarName`: printable ASCII except '=', not starting
/// with a digit... in practice `[-._a-zA-Z][-._a-zA-Z0-9]*`).
pub fn is_env_var_name(name: &str) -> bool {
    let mut chars = name.chars();
    match chars.next() {
        Some(c) if c.is_ascii_alphabetic() || c == '_' || c == '-' || c == '.' => {}
        _ => return false,
    }
    chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.')
}

fn secret_data(s: &Secret) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for (k, v) in s.data.iter().flatten() {
        out.insert(k.clone(), String::from_utf8_lossy(&v.0).into_owned());
    }
    for (k, v) in s.string_data.iter().flatten() {
        out.insert(k.clone(), v.clone());
    }
    out
}

fn config_map_data(c: &ConfigMap) -> BTreeMap<String, String> {
    c.data.clone().unwrap_or_default()
}

impl EnvSources for ApiEnvSources {
    fn config_map_key<'a>(
        &'a self,
        namespace: &'a str,
        sel: &'a ConfigMapKeySelector,
    ) -> BoxFuture<'a, Result<Option<String>, EnvSourceError>> {
        Box::pin(async move {
            let optional = sel.optional.unwrap_or(false);
            match self.config_map(namespace, &sel.name).await? {
                None if optional => Ok(None),
                None => Err(EnvSourceError::NotFound {
                    kind: "configmap",
                    name: sel.name.clone(),
                }),
                Some(cm) => match config_map_data(&cm).get(&sel.key) {
                    Some(v) => Ok(Some(v.clone())),
                    None if optional => Ok(None),
                    None => Err(EnvSourceError::MissingKey {
                        kind: "ConfigMap",
                        key: sel.key.clone(),
                        namespace: namespace.to_string(),
                        name: sel.name.clone(),
                    }),
                },
            }
        })
    }

    fn secret_key<'a>(
        &'a self,
        namespace: &'a str,
        sel: &'a SecretKeySelector,
    ) -> BoxFuture<'a, Result<Option<String>, EnvSourceError>> {
        Box::pin(async move {
            let optional = sel.optional.unwrap_or(false);
            match self.secret_obj(namespace, &sel.name).await? {
                None if optional => Ok(None),
                None => Err(EnvSourceError::NotFound {
                    kind: "secret",
                    name: sel.name.clone(),
                }),
                Some(s) => match secret_data(&s).get(&sel.key) {
                    Some(v) => Ok(Some(v.clone())),
                    None if optional => Ok(None),
                    None => Err(EnvSourceError::MissingKey {
                        kind: "Secret",
                        key: sel.key.clone(),
                        namespace: namespace.to_string(),
                        name: sel.name.clone(),
                    }),
                },
            }
        })
    }

    fn env_from<'a>(
        &'a self,
        namespace: &'a str,
        src: &'a EnvFromSource,
    ) -> BoxFuture<'a, Result<EnvFromVars, EnvSourceError>> {
        Box::pin(async move {
            let prefix = src.prefix.clone().unwrap_or_default();
            let (data, kind, name) = if let Some(cm) = &src.config_map_ref {
                let optional = cm.optional.unwrap_or(false);
                match self.config_map(namespace, &cm.name).await? {
                    Some(obj) => (config_map_data(&obj), "configMap", cm.name.clone()),
                    None if optional => return Ok(EnvFromVars::default()),
                    None => {
                        return Err(EnvSourceError::NotFound {
                            kind: "configmap",
                            name: cm.name.clone(),
                        });
                    }
                }
            } else if let Some(s) = &src.secret_ref {
                let optional = s.optional.unwrap_or(false);
                match self.secret_obj(namespace, &s.name).await? {
                    Some(obj) => (secret_data(&obj), "secret", s.name.clone()),
                    None if optional => return Ok(EnvFromVars::default()),
                    None => {
                        return Err(EnvSourceError::NotFound {
                            kind: "secret",
                            name: s.name.clone(),
                        });
                    }
                }
            } else {
                return Ok(EnvFromVars::default());
            };
            let mut out = EnvFromVars::default();
            let mut invalid = Vec::new();
            for (k, v) in data {
                let key = format!("{prefix}{k}");
                if is_env_var_name(&key) {
                    out.vars.push((key, v));
                } else {
                    invalid.push(key);
                }
            }
            if !invalid.is_empty() {
                invalid.sort();
                out.invalid_keys_message = Some(format!(
                    "Keys [{}] from the EnvFrom {kind} {namespace}/{name} were skipped since they are considered invalid environment variable names.",
                    invalid.join(", ")
                ));
            }
            Ok(out)
        })
    }

    fn secret<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<Secret>, EnvSourceError>> {
        Box::pin(self.secret_obj(namespace, name))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_var_names() {
        for ok in ["A", "a_b", "_x", "my.var", "x-1"] {
            assert!(is_env_var_name(ok), "{ok}");
        }
        for bad in ["", "1a", "a b", "a=b"] {
            assert!(!is_env_var_name(bad), "{bad}");
        }
    }
}
