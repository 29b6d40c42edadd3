//! `local` PersistentVolumes, as kubelet's pkg/volume/local/local.go
//! mounts a directory-backed one: the PV's path must exist and be a
//! directory (`NewMounter`, `getGlobalLocalPath`); setup bind-mounts it on
//! `<pod>/volumes/kubernetes.io~local-volume/<pv name>` (mode 0750 for the
//! mount point), read-only when the pod's claim is, with the PV's
//! `mountOptions` applied to the bind; the pod's `fsGroup` is applied
//! (honouring `fsGroupChangePolicy`) only by the first pod to mount the
//! volume on this node and only read-write, and a later pod asking for
//! another group gets kubelet's `AlreadyMountedVolume` warning. Teardown
//! unmounts and removes the (then empty) mount point, never the content.
//!
//! A local PV backed by a block device (kubelet formats and mounts it once
//! per node) is refused, naming the device.

use std::io;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt};
use std::path::{Component, Path, PathBuf};

use k8s_openapi::api::core::v1::Pod;
use keelson_common::events::EventType;

use super::claims::{BoundVolume, PvSource};
use super::mounter::{Mounter, mount_at};
use super::ownership::{
    fs_group_change_policy_from, fs_group_from, set_volume_ownership, skip_permission_change,
};
use super::plugins::{Plugin, blocking};
use super::{Mounted, VolumeManager, paths, uid_of};

/// kubelet's `WarnAlreadyMountedVolume` event reason.
const ALREADY_MOUNTED: &str = "AlreadyMountedVolume";

/// The PV's path, checked as kubelet's `NewMounter` does before any setup
/// (`MountVolume.NewMounter initialization failed` when it is not usable).
pub(super) fn check_path(bound: &BoundVolume) -> Result<PathBuf, String> {
    let PvSource::Local(src) = &bound.source else {
        return Err("local volume source is nil or local path is not set".to_string());
    };
    if src.path.is_empty() {
        return Err("local volume source is nil or local path is not set".to_string());
    }
    let path = PathBuf::from(&src.path);
    let meta = match std::fs::metadata(&path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(format!("path {:?} does not exist", src.path));
        }
        Err(e) => return Err(e.to_string()),
    };
    let kind = meta.file_type();
    if kind.is_dir() {
        Ok(path)
    } else if kind.is_block_device() {
        Err(format!(
            "keelson cannot mount local volumes backed by a block device ({} of PV {}); use a directory",
            src.path, bound.pv_name
        ))
    } else {
        Err("only directory and block device are supported".to_string())
    }
}

/// Mount points of the same PV in other pods' directories (kubelet's
/// `GetMountRefs` filtered to the pods directory).
fn other_pod_refs(
    mounter: &dyn Mounter,
    pods_dir: &Path,
    pv: &str,
    own: &Path,
) -> io::Result<usize> {
    Ok(mounter
        .mount_points()?
        .iter()
        .filter(|m| {
            m.path.starts_with(pods_dir)
                && !m.path.starts_with(own)
                && m.path.file_name().is_some_and(|n| n == pv)
                && m.path
                    .parent()
                    .and_then(Path::file_name)
                    .is_some_and(|n| n == paths::LOCAL_VOLUME)
        })
        .count())
}

/// What the blocking part of a local setup reports back.
struct LocalSetup {
    /// `(requested, found)` when another pod mounted the volume first with
    /// another group.
    group_mismatch: Option<(u32, u32)>,
}

impl VolumeManager {
    /// Sets up a `local` PV for `pod` (see the module comment).
    pub(super) async fn setup_local(
        &self,
        pod: &Pod,
        bound: &BoundVolume,
    ) -> Result<Mounted, String> {
        let uid = uid_of(pod);
        let pv = paths::component("PersistentVolume name", &bound.pv_name)
            .map_err(|e| e.to_string())?
            .to_string();
        let source = check_path(bound)?;
        if source
            .components()
            .any(|c| matches!(c, Component::ParentDir))
        {
            return Err(format!(
                "invalid path: {} must not contain '..'",
                source.display()
            ));
        }
        let dir = self.inner.layout.volume_dir(uid, paths::LOCAL_VOLUME, &pv);
        let own = self.inner.layout.pod_dir(uid);
        let pods_dir = self.inner.layout.pods_dir();
        let mounter = self.inner.mounter.clone();
        let read_only = bound.read_only;
        let mut options = Vec::new();
        if read_only {
            options.push("ro".to_string());
        }
        options.extend(bound.mount_options.iter().cloned());
        let fs_group = fs_group_from(pod);
        let policy = fs_group_change_policy_from(pod);
        let target = dir.clone();
        let report = blocking(move || {
            if mount_at(&mounter.mount_points().map_err(|e| e.to_string())?, &target).is_some() {
                return Ok(LocalSetup {
                    group_mismatch: None,
                });
            }
            let refs = other_pod_refs(mounter.as_ref(), &pods_dir, &pv, &own)
                .map_err(|e| format!("cannot collect mounting information: {e}"))?;
            let mut group_mismatch = None;
            if let Some(gid) = fs_group
                && refs > 0
            {
                let found = std::fs::metadata(&source)
                    .map_err(|e| format!("failed to check fsGroup for {} ({e})", source.display()))?
                    .gid();
                if found != gid {
                    group_mismatch = Some((gid, found));
                }
            }
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o750)
                .create(&target)
                .map_err(|e| format!("mkdir failed on disk {} ({e})", target.display()))?;
            let mounted = mounter.bind(&source, &target).and_then(|()| {
                if options.is_empty() {
                    Ok(())
                } else {
                    mounter.remount_bind(&target, &options)
                }
            });
            if let Err(e) = mounted {
                undo(mounter.as_ref(), &target);
                return Err(format!(
                    "mount of {} on {} (options {}) failed: {e}",
                    source.display(),
                    target.display(),
                    ["bind".to_string()]
                        .iter()
                        .chain(options.iter())
                        .cloned()
                        .collect::<Vec<_>>()
                        .join(",")
                ));
            }
            if !read_only
                && refs == 0
                && let Some(gid) = fs_group
                && !skip_permission_change(&target, gid, read_only, policy.as_deref())
            {
                set_volume_ownership(&target, Some(gid), read_only).map_err(|e| e.to_string())?;
            }
            Ok(LocalSetup { group_mismatch })
        })
        .await?;
        if let Some((requested, found)) = report.group_mismatch {
            self.event(
                pod,
                EventType::Warning,
                ALREADY_MOUNTED,
                format!(
                    "The requested fsGroup is {requested}, but the volume {} has GID {found}. The volume may not be shareable.",
                    bound.pv_name
                ),
            );
        }
        Ok(Mounted {
            plugin: Plugin::LocalVolume,
            path: dir,
            read_only,
            selinux_labeled: false,
        })
    }
}

/// Undoes a failed bind: unmounts what got mounted, removes the mount point.
fn undo(mounter: &dyn Mounter, target: &Path) {
    let mounted = mounter
        .mount_points()
        .map(|m| mount_at(&m, target).is_some())
        .unwrap_or(false);
    if mounted && let Err(e) = mounter.unmount(target) {
        tracing::error!(dir = %target.display(), error = %e, "unmounting a failed local volume setup");
        return;
    }
    if let Err(e) = std::fs::remove_dir(target) {
        tracing::warn!(dir = %target.display(), error = %e, "removing a failed local volume's mount point");
    }
}

/// Tears a local volume of a pod down: unmounts `dir` when it is a mount
/// point, then removes the empty directory (kubelet's
/// `CleanupMountPoint`). A directory that still has content after the
/// unmount is left and reported: it is never emptied.
pub(super) fn tear_down(mounter: &dyn Mounter, dir: &Path) -> io::Result<()> {
    if std::fs::symlink_metadata(dir).is_err() {
        return Ok(());
    }
    if mount_at(&mounter.mount_points()?, dir).is_some() {
        mounter.unmount(dir)?;
    }
    match std::fs::remove_dir(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io::Error::other(format!(
            "cannot remove {} after unmounting it: {e}",
            dir.display()
        ))),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
    use serde_json::json;
    use tokio_util::sync::CancellationToken;

    use super::super::fakes::{FakeClaims, FakeMounter};
    use super::super::{VolumeManagerConfig, lock};
    use super::*;

    fn manager(
        root: &Path,
        m: Arc<FakeMounter>,
        c: Arc<FakeClaims>,
    ) -> (VolumeManager, CancellationToken) {
        // Never contacted: claims come from `c`.
        let client =
            kube::Client::try_from(kube::Config::new("http://127.0.0.1:9".parse().unwrap()))
                .unwrap();
        let stop = CancellationToken::new();
        let vm = VolumeManager::builder(
            VolumeManagerConfig {
                root_dir: root.to_path_buf(),
                sync_frequency: Duration::from_secs(60),
            },
            client,
        )
        .mounter(m)
        .claim_reader(c)
        .start(stop.clone());
        (vm, stop)
    }

    fn pod() -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "ns", "uid": "u1"},
            "spec": {
                "containers": [{"name": "c", "volumeMounts": [{"name": "data", "mountPath": "/d"}]}],
                "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "c"}}]
            }
        }))
        .unwrap()
    }

    fn claim(phase: &str) -> PersistentVolumeClaim {
        serde_json::from_value(json!({
            "metadata": {"name": "c", "namespace": "ns", "uid": "cu"},
            "spec": {"volumeName": "pv1"},
            "status": {"phase": phase}
        }))
        .unwrap()
    }

    fn pv(source: serde_json::Value) -> PersistentVolume {
        let mut spec = json!({"claimRef": {"namespace": "ns", "name": "c", "uid": "cu"}});
        for (k, v) in source.as_object().unwrap() {
            spec[k] = v.clone();
        }
        serde_json::from_value(json!({"metadata": {"name": "pv1"}, "spec": spec})).unwrap()
    }

    #[tokio::test]
    async fn a_claim_waits_for_binding_then_its_local_pv_is_bound_and_torn_down() {
        let root = tempfile::tempdir().unwrap();
        let disk = tempfile::tempdir().unwrap();
        std::fs::write(disk.path().join("keep"), "data").unwrap();
        let m = Arc::new(FakeMounter::default());
        let c = Arc::new(FakeClaims::default());
        let (vm, stop) = manager(root.path(), m.clone(), c.clone());

        c.put_claim(claim("Pending"));
        let err = vm.setup_pod(&pod()).await.unwrap_err();
        assert_eq!(
            err.to_string(),
            "unmounted volumes=[data], unattached volumes=[], failed to process volumes=[data]: error processing PVC ns/c: PVC is not bound"
        );
        assert!(lock(&m.table).is_empty());

        c.put_claim(claim("Bound"));
        c.put_volume(pv(json!({"local": {"path": disk.path()}})));
        vm.setup_pod(&pod()).await.unwrap();
        let dir = root
            .path()
            .join("pods/u1/volumes/kubernetes.io~local-volume/pv1");
        {
            let table = lock(&m.table);
            assert_eq!(table.len(), 1, "{table:?}");
            assert_eq!(table[0].path, dir);
            assert_eq!(table[0].source, disk.path().display().to_string());
        }
        // Mounted: set up once, not read again.
        lock(&c.claims).clear();
        vm.setup_pod(&pod()).await.unwrap();
        assert_eq!(lock(&m.table).len(), 1);

        vm.teardown_pod("u1").await.unwrap();
        assert!(lock(&m.table).is_empty());
        assert!(!dir.exists());
        assert_eq!(
            std::fs::read_to_string(disk.path().join("keep")).unwrap(),
            "data"
        );
        stop.cancel();
    }

    #[tokio::test]
    async fn sources_are_checked_with_kubelets_prefixes_naming_the_pv() {
        let root = tempfile::tempdir().unwrap();
        let host = tempfile::tempdir().unwrap();
        let m = Arc::new(FakeMounter::default());
        let c = Arc::new(FakeClaims::default());
        let (vm, stop) = manager(root.path(), m.clone(), c.clone());
        c.put_claim(claim("Bound"));

        let missing = host.path().join("missing");
        c.put_volume(pv(json!({"local": {"path": missing}})));
        let err = vm.setup_pod(&pod()).await.unwrap_err().to_string();
        assert!(
            err.ends_with(&format!(
                "MountVolume.NewMounter initialization failed for volume \"pv1\" : path {:?} does not exist",
                missing.display().to_string()
            )),
            "{err}"
        );

        c.put_volume(pv(json!({"nfs": {"server": "s", "path": "/e"}})));
        let err = vm.setup_pod(&pod()).await.unwrap_err().to_string();
        assert!(
            err.ends_with("MountVolume.SetUp failed for volume \"pv1\" : keelson cannot set up nfs persistent volumes (supported: hostPath, local, csi)"),
            "{err}"
        );

        // hostPath: the type check, no mount.
        c.put_volume(pv(
            json!({"hostPath": {"path": host.path().join("made"), "type": "DirectoryOrCreate"}}),
        ));
        let uid = pod().metadata.uid.clone().unwrap();
        vm.teardown_pod(&uid).await.unwrap();
        vm.setup_pod(&pod()).await.unwrap();
        assert!(host.path().join("made").is_dir());
        assert!(lock(&m.table).is_empty());
        stop.cancel();
    }
}
