//! Tearing volumes down: after a pod's containers are gone
//! ([`VolumeManager::teardown_pod`]), when the pod is deleted
//! ([`VolumeManager::remove_pod_dir`]), and for pod directories nobody
//! knows any more at start ([`VolumeManager::cleanup_orphans`]). Teardown
//! works from what is on disk and in the mount table, so it also cleans up
//! after a previous keelson process.

use std::collections::HashSet;
use std::io;
use std::path::Path;

use super::emptydir;
use super::metrics::VolumeMetrics;
use super::paths::{self, Layout};
use super::plugins::blocking;
use super::removal::remove_all_one_filesystem;
use super::subpath::clean_sub_paths;
use super::{VolumeError, VolumeManager, lock, mounter::Mounter};

impl VolumeManager {
    /// Unmounts and removes every volume of the pod (subPath binds, tmpfs,
    /// directories) and forgets its tokens. Call once none of the pod's
    /// containers runs any more. Idempotent.
    pub async fn teardown_pod(&self, uid: &str) -> Result<(), VolumeError> {
        paths::component("pod UID", uid).map_err(|e| VolumeError::Teardown(e.to_string()))?;
        let slot = self.existing_slot(uid);
        let mut guard = match &slot {
            Some(s) => Some(s.state.lock().await),
            None => None,
        };
        let layout = self.inner.layout.clone();
        let mounter = self.inner.mounter.clone();
        let metrics = self.inner.metrics.clone();
        let id = uid.to_string();
        let result =
            blocking(move || teardown_dirs(mounter.as_ref(), &layout, &id, &metrics)).await;
        self.inner.tokens.delete_service_account_token(uid);
        if let Some(st) = guard.as_mut() {
            st.mounted.clear();
            st.failures.clear();
            st.warned.clear();
            st.waiting_since = None;
            st.active = false;
        }
        drop(guard);
        if let Some(slot) = slot {
            lock(&slot.totals).clear();
            if !*lock(&slot.registered) {
                lock(&self.inner.pods).remove(uid);
            }
        }
        self.publish_totals();
        match result {
            Ok(()) => {
                tracing::debug!(uid, "pod volumes torn down");
                Ok(())
            }
            Err(e) => {
                tracing::warn!(uid, error = %e, "tearing down pod volumes failed");
                Err(VolumeError::Teardown(e))
            }
        }
    }

    /// The pod is deleted: drops its references, tears its volumes down and
    /// removes `<root>/pods/<uid>` (refusing while anything below it is
    /// still mounted).
    pub async fn remove_pod_dir(&self, uid: &str) -> Result<(), VolumeError> {
        self.unregister_pod(uid);
        self.teardown_pod(uid).await?;
        let dir = self.inner.layout.pod_dir(uid);
        let mounter = self.inner.mounter.clone();
        let result = blocking(move || {
            remove_all_one_filesystem(mounter.as_ref(), &dir)
                .map_err(|e| format!("removing {}: {e}", dir.display()))
        })
        .await;
        lock(&self.inner.pods).remove(uid);
        result.map_err(VolumeError::Teardown)
    }

    /// Tears down and removes the directories of pods not in `active`
    /// (kubelet's orphaned pod cleanup); returns how many were removed.
    /// Every directory is tried; errors are reported together.
    pub async fn cleanup_orphans(&self, active: &HashSet<String>) -> Result<usize, VolumeError> {
        let pods_dir = self.inner.layout.pods_dir();
        let entries = match std::fs::read_dir(&pods_dir) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(0),
            Err(e) => {
                return Err(VolumeError::Teardown(format!(
                    "reading {}: {e}",
                    pods_dir.display()
                )));
            }
        };
        let mut removed = 0;
        let mut errors = Vec::new();
        for entry in entries.flatten() {
            let uid = entry.file_name().to_string_lossy().into_owned();
            if active.contains(&uid) || paths::component("pod UID", &uid).is_err() {
                continue;
            }
            match self.remove_pod_dir(&uid).await {
                Ok(()) => {
                    tracing::info!(uid = %uid, "removed orphaned pod directory");
                    removed += 1;
                }
                Err(e) => {
                    tracing::warn!(uid = %uid, error = %e, "could not remove orphaned pod directory");
                    errors.push(format!("orphaned pod {uid:?} found, but {e}"));
                }
            }
        }
        if errors.is_empty() {
            Ok(removed)
        } else {
            Err(VolumeError::Teardown(errors.join("; ")))
        }
    }
}

fn dir_names(dir: &Path) -> io::Result<Vec<String>> {
    match std::fs::read_dir(dir) {
        Ok(r) => Ok(r
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(e),
    }
}

fn remove_if_empty(dir: &Path) {
    // Not empty or gone: both fine.
    let _ = std::fs::remove_dir(dir);
}

/// Tears down everything under `<pod>/volumes` and `<pod>/volume-subpaths`.
fn teardown_dirs(
    mounter: &dyn Mounter,
    layout: &Layout,
    uid: &str,
    metrics: &VolumeMetrics,
) -> Result<(), String> {
    let mut errors = Vec::new();
    let subpaths = layout.subpaths_dir(uid);
    for volume in dir_names(&subpaths).map_err(|e| e.to_string())? {
        if let Err(e) = clean_sub_paths(mounter, &subpaths, &volume) {
            errors.push(format!("cleaning subPaths of volume {volume:?}: {e}"));
        }
    }
    let volumes = layout.pod_volumes_dir(uid);
    for plugin in dir_names(&volumes).map_err(|e| e.to_string())? {
        let plugin_dir = volumes.join(&plugin);
        for name in dir_names(&plugin_dir).map_err(|e| e.to_string())? {
            let dir = plugin_dir.join(&name);
            let meta = layout.empty_dir_meta(uid, &name);
            let started = std::time::Instant::now();
            let result = emptydir::tear_down(mounter, &dir, &meta);
            metrics.operation(
                &plugin.replace('~', "/"),
                "volume_unmount",
                result.is_ok(),
                started.elapsed(),
            );
            match result {
                Ok(()) => tracing::debug!(volume = %name, plugin = %plugin, "volume torn down"),
                Err(e) => errors.push(format!(
                    "UnmountVolume.TearDown failed for volume {name:?} (plugin {plugin}): {e}"
                )),
            }
        }
        remove_if_empty(&plugin_dir);
    }
    remove_if_empty(&volumes);
    let plugins = layout.pod_dir(uid).join("plugins");
    remove_if_empty(&plugins.join(paths::EMPTY_DIR));
    remove_if_empty(&plugins);
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors.join("; "))
    }
}
