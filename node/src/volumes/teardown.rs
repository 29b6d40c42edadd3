//! Tearing volumes down: after a pod's containers are gone
//! ([`VolumeManager::teardown_pod`]), when the pod is deleted
//! ([`VolumeManager::remove_pod_dir`]), and for pod directories nobody
//! knows any more ([`VolumeManager::cleanup_orphans`], every housekeeping
//! round). Teardown
//! works from what is on disk and in the mount table, so it also cleans up
//! after a previous keelson process.

use std::collections::HashSet;
use std::io;
use std::path::Path;

use super::metrics::VolumeMetrics;
use super::paths::{self, Layout};
use super::plugins::blocking;
use super::removal::remove_all_one_filesystem;
use super::subpath::clean_sub_paths;
use super::{VolumeError, VolumeManager, lock, mounter::Mounter};
use super::{emptydir, local};

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
        // CSI volumes first: the driver unmounts them (NodeUnpublishVolume).
        let csi = self.teardown_csi(uid).await;
        let layout = self.inner.layout.clone();
        let mounter = self.inner.mounter.clone();
        let metrics = self.inner.metrics.clone();
        let id = uid.to_string();
        let dirs = blocking(move || teardown_dirs(mounter.as_ref(), &layout, &id, &metrics)).await;
        let result = match (csi, dirs) {
            (Ok(()), r) => r,
            (Err(e), Ok(())) => Err(e),
            (Err(a), Err(b)) => Err(format!("{a}; {b}")),
        };
        self.inner.tokens.delete_service_account_token(uid);
        // The pod wants no volume any more; attached ones stay in use
        // until their device is unmounted.
        self.inner.in_use.remove_pod(uid);
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
    /// A pod registered with this manager is never touched, even when the
    /// caller's `active` was taken before the pod arrived. Every directory
    /// is tried; errors are reported together.
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
            if active.contains(&uid)
                || paths::component("pod UID", &uid).is_err()
                || self.is_registered(&uid)
            {
                continue;
            }
            match self.remove_orphan_dir(&uid).await {
                Ok(true) => {
                    tracing::info!(uid = %uid, "removed orphaned pod directory");
                    removed += 1;
                }
                Ok(false) => {
                    tracing::debug!(uid = %uid, "pod registered during orphan cleanup; directory kept");
                }
                Err(e) => {
                    tracing::warn!(uid = %uid, error = %e, "could not remove orphaned pod directory");
                    errors.push(format!("orphaned pod {uid:?} found, but {e}"));
                }
            }
        }
        // CSI devices no pod uses any more (an unstage that failed in a
        // pod's teardown is retried here).
        if let Err(e) = self.unmount_unused_devices().await {
            tracing::warn!(error = %e, "unmounting unused CSI devices failed");
        }
        if errors.is_empty() {
            Ok(removed)
        } else {
            Err(VolumeError::Teardown(errors.join("; ")))
        }
    }

    /// True while a pod of this UID is registered (added and not yet removed).
    fn is_registered(&self, uid: &str) -> bool {
        self.existing_slot(uid)
            .is_some_and(|slot| *lock(&slot.registered))
    }

    /// Tears an orphan's volumes down and removes its directory, unless the
    /// pod got registered meanwhile (then `Ok(false)`: its next setup mounts
    /// again what the teardown removed).
    async fn remove_orphan_dir(&self, uid: &str) -> Result<bool, VolumeError> {
        self.teardown_pod(uid).await?;
        if self.is_registered(uid) {
            return Ok(false);
        }
        let dir = self.inner.layout.pod_dir(uid);
        let mounter = self.inner.mounter.clone();
        blocking(move || {
            remove_all_one_filesystem(mounter.as_ref(), &dir)
                .map_err(|e| format!("removing {}: {e}", dir.display()))
        })
        .await
        .map_err(VolumeError::Teardown)?;
        Ok(true)
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
        // CSI volumes are the driver's to unmount (`teardown_csi`).
        if plugin == super::csi::CSI_DIR {
            continue;
        }
        let plugin_dir = volumes.join(&plugin);
        for name in dir_names(&plugin_dir).map_err(|e| e.to_string())? {
            let dir = plugin_dir.join(&name);
            let meta = layout.empty_dir_meta(uid, &name);
            let started = std::time::Instant::now();
            let result = if plugin == paths::LOCAL_VOLUME {
                local::tear_down(mounter, &dir)
            } else {
                emptydir::tear_down(mounter, &dir, &meta)
            };
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

#[cfg(test)]
mod tests {
    use std::path::PathBuf;
    use std::sync::Arc;
    use std::time::Duration;

    use k8s_openapi::api::core::v1::Pod;
    use tokio_util::sync::CancellationToken;

    use super::super::fakes::FakeMounter;
    use super::super::{VolumeManagerConfig, lock};
    use super::*;

    fn manager(root: &Path, mounter: Arc<FakeMounter>) -> (VolumeManager, CancellationToken) {
        // Never contacted: no registered pod references an object.
        let client = kube::Client::try_from(kube::Config::new(
            "http://127.0.0.1:9".parse().expect("url"),
        ))
        .expect("client");
        let stop = CancellationToken::new();
        let vm = VolumeManager::builder(
            VolumeManagerConfig {
                root_dir: root.to_path_buf(),
                sync_frequency: Duration::from_secs(60),
            },
            client,
        )
        .mounter(mounter)
        .start(stop.clone());
        (vm, stop)
    }

    fn pod(uid: &str) -> Pod {
        let mut p = Pod::default();
        p.metadata.name = Some(format!("pod-{uid}"));
        p.metadata.namespace = Some("default".to_string());
        p.metadata.uid = Some(uid.to_string());
        p
    }

    /// A pod directory with a memory-backed emptyDir "mounted" in it.
    fn pod_dir_with_tmpfs(vm: &VolumeManager, mounter: &FakeMounter, uid: &str) -> PathBuf {
        let vol = vm
            .pod_dir(uid)
            .join("volumes")
            .join(paths::EMPTY_DIR)
            .join("cache");
        std::fs::create_dir_all(&vol).expect("volume dir");
        std::fs::write(vol.join("data"), "x").expect("volume file");
        mounter
            .mount_fs("tmpfs", &vol, "tmpfs", &[])
            .expect("fake mount");
        vol
    }

    #[tokio::test]
    async fn orphans_are_torn_down_and_removed_known_and_registered_pods_kept() {
        let root = tempfile::tempdir().expect("tempdir");
        let mounter = Arc::new(FakeMounter::default());
        let (vm, stop) = manager(root.path(), mounter.clone());
        for uid in ["orphan", "active", "registered"] {
            pod_dir_with_tmpfs(&vm, &mounter, uid);
        }
        // Added after the caller took its list of known pods.
        vm.register_pod(&pod("registered"));

        let active: HashSet<String> = ["active".to_string()].into();
        assert_eq!(vm.cleanup_orphans(&active).await.expect("cleanup"), 1);
        assert!(!vm.pod_dir("orphan").exists());
        assert!(vm.pod_dir("active").exists());
        assert!(vm.pod_dir("registered").exists());
        let left: Vec<PathBuf> = lock(&mounter.table)
            .iter()
            .map(|m| m.path.clone())
            .collect();
        assert_eq!(
            left.len(),
            2,
            "only the orphan's tmpfs is unmounted: {left:?}"
        );
        assert!(left.iter().all(|p| !p.starts_with(vm.pod_dir("orphan"))));

        // Once unregistered (the pod left the node), it is an orphan too.
        vm.unregister_pod("registered");
        assert_eq!(vm.cleanup_orphans(&active).await.expect("cleanup"), 1);
        assert!(!vm.pod_dir("registered").exists());
        assert!(vm.pod_dir("active").exists());
        stop.cancel();
    }

    #[tokio::test]
    async fn a_busy_orphan_is_kept_and_removed_by_a_later_round() {
        let root = tempfile::tempdir().expect("tempdir");
        let mounter = Arc::new(FakeMounter::default());
        let (vm, stop) = manager(root.path(), mounter.clone());
        let vol = pod_dir_with_tmpfs(&vm, &mounter, "busy");
        lock(&mounter.busy).push(vol.clone());

        let none = HashSet::new();
        let err = vm.cleanup_orphans(&none).await.expect_err("busy mount");
        assert!(
            err.to_string().contains("orphaned pod \"busy\" found"),
            "{err}"
        );
        assert!(vol.join("data").exists(), "nothing removed through a mount");

        lock(&mounter.busy).clear();
        assert_eq!(vm.cleanup_orphans(&none).await.expect("retry"), 1);
        assert!(!vm.pod_dir("busy").exists());
        assert!(lock(&mounter.table).is_empty());
        stop.cancel();
    }
}
