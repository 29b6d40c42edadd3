//! Per-pod resource records kept across keelson restarts (kubelet's
//! `allocation/state` checkpoints `allocated_pods_state` and
//! `actuated_pods_state` in its root directory): for each pod UID, the
//! resources of each container and the pod-level resources. Written
//! through a temporary file and a rename, so a crash leaves the previous
//! file; an unreadable file is logged and started over (kubelet then
//! falls back to the spec as well).

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard, PoisonError};

use k8s_openapi::api::core::v1::ResourceRequirements;
use serde::{Deserialize, Serialize};

/// One pod's record.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodResources {
    /// Container name → resources.
    #[serde(default)]
    pub containers: BTreeMap<String, ResourceRequirements>,
    /// Pod-level `spec.resources`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<ResourceRequirements>,
}

/// A checkpointed map of pod UID → [`PodResources`].
#[derive(Debug)]
pub struct Checkpoint {
    path: Option<PathBuf>,
    pods: Mutex<BTreeMap<String, PodResources>>,
}

impl Checkpoint {
    /// Loads `path` (missing: empty); `None` keeps it in memory only.
    pub fn open(path: Option<PathBuf>) -> Self {
        let pods = path
            .as_ref()
            .and_then(|p| match std::fs::read(p) {
                Ok(bytes) => match serde_json::from_slice(&bytes) {
                    Ok(m) => Some(m),
                    Err(e) => {
                        tracing::warn!(path = %p.display(), error = %e, "resource checkpoint unreadable; starting from pod specs");
                        None
                    }
                },
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
                Err(e) => {
                    tracing::warn!(path = %p.display(), error = %e, "resource checkpoint unreadable; starting from pod specs");
                    None
                }
            })
            .unwrap_or_default();
        Checkpoint {
            path,
            pods: Mutex::new(pods),
        }
    }

    fn lock(&self) -> MutexGuard<'_, BTreeMap<String, PodResources>> {
        self.pods.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn save(&self, pods: &BTreeMap<String, PodResources>) {
        let Some(path) = &self.path else { return };
        let write = || -> std::io::Result<()> {
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir)?;
            }
            let tmp = path.with_extension("tmp");
            std::fs::write(&tmp, serde_json::to_vec(pods).unwrap_or_default())?;
            std::fs::rename(&tmp, path)
        };
        if let Err(e) = write() {
            tracing::warn!(path = %path.display(), error = %e, "writing the resource checkpoint failed");
        }
    }

    /// One pod's record.
    pub fn get(&self, uid: &str) -> Option<PodResources> {
        self.lock().get(uid).cloned()
    }

    /// Replaces one pod's record.
    pub fn set(&self, uid: &str, r: PodResources) {
        let mut pods = self.lock();
        if pods.get(uid) == Some(&r) {
            return;
        }
        pods.insert(uid.to_string(), r);
        self.save(&pods);
    }

    /// Sets one container's resources.
    pub fn set_container(&self, uid: &str, name: &str, r: ResourceRequirements) {
        let mut pods = self.lock();
        let entry = pods.entry(uid.to_string()).or_default();
        if entry.containers.get(name) == Some(&r) {
            return;
        }
        entry.containers.insert(name.to_string(), r);
        self.save(&pods);
    }

    /// Sets the pod-level resources.
    pub fn set_pod_level(&self, uid: &str, r: Option<ResourceRequirements>) {
        let mut pods = self.lock();
        let entry = pods.entry(uid.to_string()).or_default();
        if entry.pod == r {
            return;
        }
        entry.pod = r;
        self.save(&pods);
    }

    /// Forgets a pod.
    pub fn remove(&self, uid: &str) {
        let mut pods = self.lock();
        if pods.remove(uid).is_some() {
            self.save(&pods);
        }
    }

    /// Forgets every pod not in `keep`.
    pub fn retain(&self, keep: &BTreeSet<String>) {
        let mut pods = self.lock();
        let before = pods.len();
        pods.retain(|uid, _| keep.contains(uid));
        if pods.len() != before {
            self.save(&pods);
        }
    }

    /// The UIDs recorded.
    pub fn uids(&self) -> Vec<String> {
        self.lock().keys().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn survives_a_restart() {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("allocated_pods_state");
        let c = Checkpoint::open(Some(path.clone()));
        let r: ResourceRequirements =
            serde_json::from_value(serde_json::json!({"requests": {"cpu": "1"}})).expect("rr");
        c.set_container("u1", "app", r.clone());
        c.set_container("u2", "app", r.clone());
        c.retain(&BTreeSet::from(["u1".to_string()]));
        let again = Checkpoint::open(Some(path.clone()));
        assert_eq!(again.get("u1").expect("u1").containers["app"], r);
        assert!(again.get("u2").is_none());
        std::fs::write(&path, "garbage").expect("w");
        assert!(Checkpoint::open(Some(path)).uids().is_empty());
    }
}
