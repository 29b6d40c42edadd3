//! ConfigMap and Secret lookups for container environment variables, with
//! kubelet's `makeEnvironmentVariables` semantics: a missing object or key
//! is an error (the container is not created: `CreateContainerConfigError`)
//! unless the reference is `optional`; `envFrom` takes every key, prefixed.
//! The pod workers order the variables and expand `$(VAR)` references.

use k8s_openapi::api::core::v1::{ConfigMapKeySelector, EnvFromSource, SecretKeySelector};

use super::VolumeManager;
use super::objects::ObjectError;

/// Why an environment lookup failed. Display texts are kubelet's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnvError {
    /// The object could not be read (not found, not synced, not registered).
    #[error(transparent)]
    Object(#[from] ObjectError),
    /// `configMapKeyRef.key` is not in the ConfigMap.
    #[error("couldn't find key {key} in ConfigMap {namespace}/{name}")]
    ConfigMapKey {
        /// Key.
        key: String,
        /// Namespace.
        namespace: String,
        /// ConfigMap name.
        name: String,
    },
    /// `secretKeyRef.key` is not in the Secret.
    #[error("couldn't find key {key} in Secret {namespace}/{name}")]
    SecretKey {
        /// Key.
        key: String,
        /// Namespace.
        namespace: String,
        /// Secret name.
        name: String,
    },
}

impl VolumeManager {
    /// The value of a `configMapKeyRef`; `Ok(None)` when the ConfigMap or
    /// key is missing and the reference is optional (the variable is then
    /// left out).
    pub async fn env_config_map_key(
        &self,
        namespace: &str,
        sel: &ConfigMapKeySelector,
    ) -> Result<Option<String>, EnvError> {
        let optional = sel.optional == Some(true);
        let cm = match self.config_map(namespace, &sel.name).await {
            Ok(cm) => cm,
            Err(e) if e.is_not_found() && optional => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        match cm.data.as_ref().and_then(|d| d.get(&sel.key)) {
            Some(v) => Ok(Some(v.clone())),
            None if optional => Ok(None),
            None => Err(EnvError::ConfigMapKey {
                key: sel.key.clone(),
                namespace: namespace.to_string(),
                name: sel.name.clone(),
            }),
        }
    }

    /// The value of a `secretKeyRef` (bytes read as UTF-8, invalid
    /// sequences replaced); `Ok(None)` when optional and missing.
    pub async fn env_secret_key(
        &self,
        namespace: &str,
        sel: &SecretKeySelector,
    ) -> Result<Option<String>, EnvError> {
        let optional = sel.optional == Some(true);
        let s = match self.secret(namespace, &sel.name).await {
            Ok(s) => s,
            Err(e) if e.is_not_found() && optional => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        match s.data.as_ref().and_then(|d| d.get(&sel.key)) {
            Some(v) => Ok(Some(String::from_utf8_lossy(&v.0).into_owned())),
            None if optional => Ok(None),
            None => Err(EnvError::SecretKey {
                key: sel.key.clone(),
                namespace: namespace.to_string(),
                name: sel.name.clone(),
            }),
        }
    }

    /// The variables an `envFrom` source brings, `prefix` + key, in key
    /// order; empty when the object is missing and optional.
    pub async fn env_from(
        &self,
        namespace: &str,
        src: &EnvFromSource,
    ) -> Result<Vec<(String, String)>, EnvError> {
        let prefix = src.prefix.as_deref().unwrap_or("");
        if let Some(r) = &src.config_map_ref {
            let cm = match self.config_map(namespace, &r.name).await {
                Ok(cm) => cm,
                Err(e) if e.is_not_found() && r.optional == Some(true) => return Ok(Vec::new()),
                Err(e) => return Err(e.into()),
            };
            return Ok(cm
                .data
                .iter()
                .flatten()
                .map(|(k, v)| (format!("{prefix}{k}"), v.clone()))
                .collect());
        }
        if let Some(r) = &src.secret_ref {
            let s = match self.secret(namespace, &r.name).await {
                Ok(s) => s,
                Err(e) if e.is_not_found() && r.optional == Some(true) => return Ok(Vec::new()),
                Err(e) => return Err(e.into()),
            };
            return Ok(s
                .data
                .iter()
                .flatten()
                .map(|(k, v)| {
                    (
                        format!("{prefix}{k}"),
                        String::from_utf8_lossy(&v.0).into_owned(),
                    )
                })
                .collect());
        }
        Ok(Vec::new())
    }
}
