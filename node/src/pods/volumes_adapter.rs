//! The volume manager behind the pod lifecycle's narrow traits
//! ([`PodVolumes`], [`EnvSources`] in `node::pods::deps`), so the pod
//! workers can run with real volumes or with their test doubles.

use std::collections::HashSet;
use std::path::PathBuf;

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::{
    ConfigMapKeySelector, Container, EnvFromSource, Pod, Secret, SecretKeySelector,
};
use keelson_cri::api;

use super::deps::{
    EnvFromVars, EnvSourceError, EnvSources, PodVolumes, PodVolumesError, VolumesNotReady,
};
use crate::volumes::{MountOptions, VolumeError, VolumeManager};

impl PodVolumes for VolumeManager {
    fn register_pod(&self, pod: &Pod) {
        VolumeManager::register_pod(self, pod);
    }

    fn unregister_pod(&self, uid: &str) {
        VolumeManager::unregister_pod(self, uid);
    }

    fn setup_pod<'a>(&'a self, pod: &'a Pod) -> BoxFuture<'a, Result<(), VolumesNotReady>> {
        Box::pin(async move {
            VolumeManager::setup_pod(self, pod)
                .await
                .map_err(|e| VolumesNotReady {
                    message: e.to_string(),
                    retry_in: match e {
                        VolumeError::NotReady { retry_in, .. } => retry_in,
                        _ => None,
                    },
                })
        })
    }

    fn container_mounts<'a>(
        &'a self,
        pod: &'a Pod,
        container: &'a Container,
        env: &'a [(String, String)],
    ) -> BoxFuture<'a, Result<Vec<api::Mount>, PodVolumesError>> {
        Box::pin(async move {
            // containerd 1.6 has no recursive read-only mounts; a runtime
            // that does is asked through VolumeManager::container_mounts.
            let opts = MountOptions {
                env,
                runtime_supports_rro: false,
            };
            VolumeManager::container_mounts(self, pod, container, &opts)
                .await
                .map_err(|e| PodVolumesError::Manager(Box::new(e)))
        })
    }

    fn teardown_pod<'a>(&'a self, uid: &'a str) -> BoxFuture<'a, Result<(), PodVolumesError>> {
        Box::pin(async move {
            VolumeManager::teardown_pod(self, uid)
                .await
                .map_err(|e| PodVolumesError::Manager(Box::new(e)))
        })
    }

    fn remove_pod_dir<'a>(&'a self, uid: &'a str) -> BoxFuture<'a, Result<(), PodVolumesError>> {
        Box::pin(async move {
            VolumeManager::remove_pod_dir(self, uid)
                .await
                .map_err(|e| PodVolumesError::Manager(Box::new(e)))
        })
    }

    fn cleanup_orphans<'a>(
        &'a self,
        active: &'a [String],
    ) -> BoxFuture<'a, Result<usize, PodVolumesError>> {
        Box::pin(async move {
            let active: HashSet<String> = active.iter().cloned().collect();
            VolumeManager::cleanup_orphans(self, &active)
                .await
                .map_err(|e| PodVolumesError::Manager(Box::new(e)))
        })
    }

    fn pod_dir(&self, uid: &str) -> PathBuf {
        VolumeManager::pod_dir(self, uid)
    }
}

impl EnvSources for VolumeManager {
    fn config_map_key<'a>(
        &'a self,
        namespace: &'a str,
        selector: &'a ConfigMapKeySelector,
    ) -> BoxFuture<'a, Result<Option<String>, EnvSourceError>> {
        Box::pin(async move {
            self.env_config_map_key(namespace, selector)
                .await
                .map_err(|e| EnvSourceError::Manager(Box::new(e)))
        })
    }

    fn secret_key<'a>(
        &'a self,
        namespace: &'a str,
        selector: &'a SecretKeySelector,
    ) -> BoxFuture<'a, Result<Option<String>, EnvSourceError>> {
        Box::pin(async move {
            self.env_secret_key(namespace, selector)
                .await
                .map_err(|e| EnvSourceError::Manager(Box::new(e)))
        })
    }

    fn env_from<'a>(
        &'a self,
        namespace: &'a str,
        source: &'a EnvFromSource,
    ) -> BoxFuture<'a, Result<EnvFromVars, EnvSourceError>> {
        Box::pin(async move {
            // Current kubelet passes every key through (no name check since
            // RelaxedEnvironmentVariableValidation), so nothing is skipped.
            let vars = VolumeManager::env_from(self, namespace, source)
                .await
                .map_err(|e| EnvSourceError::Manager(Box::new(e)))?;
            Ok(EnvFromVars {
                vars,
                invalid_keys_message: None,
            })
        })
    }

    fn secret<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<Secret>, EnvSourceError>> {
        Box::pin(async move {
            match VolumeManager::secret(self, namespace, name).await {
                Ok(s) => Ok(Some((*s).clone())),
                Err(e) if e.is_not_found() => Ok(None),
                Err(e) => Err(EnvSourceError::Manager(Box::new(e))),
            }
        })
    }
}
