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
