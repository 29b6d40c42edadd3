//! A CSI PersistentVolume's device on the node: staged once per volume
//! per node, published per pod, unstaged when no pod on the node uses it
//! any more — kubelet v1.36's `pkg/volume/csi/csi_attacher.go`
//! (`GetDeviceMountPath`/`makeDeviceMountPath`, `MountDevice` =
//! NodeStageVolume into
//! `<root>/plugins/kubernetes.io/csi/<driver>/<sha256(volumeHandle)>/globalmount`
//! with `vol_data.json` beside it, `UnmountDevice` = NodeUnstageVolume)
//! and the reconciler's order (pkg/kubelet/volumemanager/reconciler:
//! MountDevice before SetUp, UnmountDevice only once no pod has the volume
//! mounted, then the volume is detached as far as the node is concerned).
//!
//! Which pods use a device is read from disk (their `vol_data.json`), so
//! the rule also holds for pods an earlier keelson process set up. One
//! lock per device serializes staging + publishing against the last
//! unpublish + unstaging.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use sha2::{Digest, Sha256};

use super::claims::{BoundVolume, PvSource};
use super::csi::{CSI_DIR, PublishSpec};
use super::csi_attach::{attach_required, unique_volume_name};
use super::csi_data::{
    VolData, is_mount_point, key, load_vol_data, remove_mount_dir, save_vol_data,
};
use super::paths::Layout;
use super::plugins::blocking;
use super::{Mounted, VolumeManager, lock};
use crate::csi::PLUGIN_NAME;
use crate::csi::client::{Access, VolumeRequest, access_mode};

/// `globalMountInGlobalPath`.
const GLOBAL_MOUNT: &str = "globalmount";

/// `makeDeviceMountPath`:
/// `<root>/plugins/kubernetes.io/csi/<driver>/<sha256(handle)>/globalmount`.
pub fn device_mount_path(root: &Path, driver: &str, volume_handle: &str) -> PathBuf {
    let sha = hex::encode(Sha256::digest(volume_handle.as_bytes()));
    root.join("plugins")
        .join(PLUGIN_NAME)
        .join(driver)
        .join(sha)
        .join(GLOBAL_MOUNT)
}

/// Per-device locks and the devices staged by this process.
#[derive(Default)]
pub(super) struct Devices {
    locks: std::sync::Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    staged: std::sync::Mutex<std::collections::HashSet<String>>,
}

impl Devices {
    fn lock_of(&self, unique: &str) -> Arc<tokio::sync::Mutex<()>> {
        lock(&self.locks)
            .entry(unique.to_string())
            .or_default()
            .clone()
    }
}

/// Every persistent CSI volume in a pod directory: its volume directory
/// and its `vol_data.json`.
fn pod_persistent_volumes(layout: &Layout) -> Vec<(PathBuf, VolData)> {
    let mut out = Vec::new();
    for pod in std::fs::read_dir(layout.pods_dir())
        .into_iter()
        .flatten()
        .flatten()
    {
        let uid = pod.file_name().to_string_lossy().into_owned();
        let dir = layout.pod_volumes_dir(&uid).join(CSI_DIR);
        for vol in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            if let Ok(d) = load_vol_data(&vol.path())
                && d.is_persistent()
            {
                out.push((vol.path(), d));
            }
        }
    }
    out
}

/// Whether some pod directory still holds a persistent CSI volume of
/// `driver`/`handle` (its `vol_data.json`).
fn pods_using(layout: &Layout, driver: &str, handle: &str) -> Vec<PathBuf> {
    pod_persistent_volumes(layout)
        .into_iter()
        .filter(|(_, d)| d.driver == driver && d.volume_handle == handle)
        .map(|(path, _)| path)
        .collect()
}

/// The devices staged on disk (their `vol_data.json` beside `globalmount`).
fn staged_on_disk(layout: &Layout) -> Vec<VolData> {
    let plugin_dir = layout.root().join("plugins").join(PLUGIN_NAME);
    let mut out = Vec::new();
    for driver in std::fs::read_dir(&plugin_dir)
        .into_iter()
        .flatten()
        .flatten()
    {
        for dev in std::fs::read_dir(driver.path())
            .into_iter()
            .flatten()
            .flatten()
        {
            if let Ok(d) = load_vol_data(&dev.path()) {
                out.push(d);
            }
        }
    }
    out
}

/// Every persistent CSI volume on disk: those of pods and staged devices
/// (reconstruction after a restart).
fn persistent_on_disk(layout: &Layout) -> Vec<VolData> {
    let mut out: Vec<VolData> = pod_persistent_volumes(layout)
        .into_iter()
        .map(|(_, d)| d)
        .collect();
    out.extend(staged_on_disk(layout));
    out
}

impl VolumeManager {
    /// Sets up a PersistentVolume-backed CSI volume for `pod`, its
    /// attachment verified (`publish_context`): NodeStageVolume once per
    /// device when the driver stages, then NodePublishVolume into the
    /// pod's `kubernetes.io~csi/<pv name>/mount`.
    pub(super) async fn setup_pv_csi(
        &self,
        pod: &k8s_openapi::api::core::v1::Pod,
        bound: &BoundVolume,
        publish_context: HashMap<String, String>,
    ) -> Result<Mounted, String> {
        let PvSource::Csi(src) = &bound.source else {
            return Err(format!(
                "{PLUGIN_NAME}: volume is not a CSI PersistentVolume"
            ));
        };
        let Some(csi) = self.inner.csi.clone() else {
            return Err(format!("{PLUGIN_NAME}: CSI is not enabled on this node"));
        };
        let client = csi.client(&src.driver).map_err(|e| {
            format!("{PLUGIN_NAME}: attacher.MountDevice failed to create newCsiDriverClient: {e}")
        })?;
        let access_modes = bound
            .pv
            .spec
            .as_ref()
            .and_then(|s| s.access_modes.clone())
            .unwrap_or_default();
        let first_mode = access_modes
            .first()
            .cloned()
            .unwrap_or_else(|| "ReadWriteOnce".to_string());
        let unique = unique_volume_name(&src.driver, &src.volume_handle);
        let device_lock = self.inner.devices.lock_of(&unique);
        let _held = device_lock.lock().await;

        let caps = client
            .node_get_capabilities()
            .await
            .map_err(|e| e.to_string())?;
        let device_path =
            device_mount_path(self.inner.layout.root(), &src.driver, &src.volume_handle);
        let staging = caps.stage_unstage.then(|| device_path.clone());
        // MountDevice: the device directory always, its data and
        // NodeStageVolume when the driver stages.
        if !lock(&self.inner.devices.staged).contains(&unique) {
            let dp = device_path.clone();
            blocking(move || {
                std::fs::create_dir_all(&dp).map_err(|e| {
                    format!(
                        "{PLUGIN_NAME}: attacher.MountDevice failed to create dir {:?}:  {e}",
                        dp.display().to_string()
                    )
                })
            })
            .await?;
            if caps.stage_unstage {
                let mut secrets = HashMap::new();
                if let Some(r) = &src.node_stage_secret_ref {
                    secrets = self
                        .csi_secret(
                            r.namespace.as_deref().unwrap_or_default(),
                            r.name.as_deref().unwrap_or_default(),
                            "NodeStageSecretRef",
                        )
                        .await?;
                }
                let data: BTreeMap<&str, String> = [
                    (key::VOLUME_HANDLE, src.volume_handle.clone()),
                    (key::DRIVER_NAME, src.driver.clone()),
                ]
                .into();
                if let Some(dir) = device_path.parent().map(Path::to_path_buf) {
                    blocking(move || save_vol_data(&dir, &data)).await?;
                }
                let request = VolumeRequest {
                    volume_id: src.volume_handle.clone(),
                    publish_context: publish_context.clone(),
                    volume_context: src
                        .volume_attributes
                        .clone()
                        .unwrap_or_default()
                        .into_iter()
                        .collect(),
                    secrets,
                    access_mode: access_mode(&first_mode, caps.single_node_multi_writer),
                    access: Access::Mount {
                        fs_type: src.fs_type.clone().unwrap_or_default(),
                        flags: bound.mount_options.clone(),
                        mount_group: if caps.volume_mount_group {
                            super::ownership::fs_group_from(pod).map(i64::from)
                        } else {
                            None
                        },
                    },
                };
                if let Err(e) = client.node_stage_volume(&request, &device_path).await {
                    if e.is_final() {
                        let mounter = self.inner.mounter.clone();
                        let dp = device_path.clone();
                        if let Err(r) =
                            blocking(move || remove_mount_dir(mounter.as_ref(), &dp)).await
                        {
                            tracing::error!(dir = %device_path.display(), error = %r, "removing the device mount dir after a NodeStage error");
                        }
                    }
                    return Err(format!(
                        "MountVolume.MountDevice failed for volume {:?} : {e}",
                        bound.pv_name
                    ));
                }
                tracing::info!(volume = %bound.pv_name, path = %device_path.display(), "NodeStageVolume succeeded");
            }
            lock(&self.inner.devices.staged).insert(unique.clone());
        }
        let spec = PublishSpec {
            driver: src.driver.clone(),
            lifecycle: "Persistent",
            spec_name: bound.pv_name.clone(),
            handle: src.volume_handle.clone(),
            read_only: bound.read_only,
            fs_type: src.fs_type.clone().unwrap_or_default(),
            attributes: src
                .volume_attributes
                .clone()
                .unwrap_or_default()
                .into_iter()
                .collect(),
            secret_ref: src.node_publish_secret_ref.as_ref().map(|r| {
                (
                    r.namespace.clone().unwrap_or_default(),
                    r.name.clone().unwrap_or_default(),
                )
            }),
            access_mode: first_mode,
            read_write_once: access_modes.iter().any(|m| m == "ReadWriteOnce"),
            mount_options: bound.mount_options.clone(),
            staging,
            publish_context,
        };
        self.publish_csi(pod, spec).await
    }

    /// After a persistent volume was unpublished from a pod: when no pod
    /// directory holds it any more, `UnmountDevice` (NodeUnstageVolume
    /// when the driver stages, then the device directory goes) and the
    /// volume leaves `volumesInUse` (as detached by this node).
    pub(super) async fn unmount_device_if_unused(&self, data: &VolData) -> Result<(), String> {
        let unique = unique_volume_name(&data.driver, &data.volume_handle);
        let device_lock = self.inner.devices.lock_of(&unique);
        let _held = device_lock.lock().await;
        let layout = self.inner.layout.clone();
        let (driver, handle) = (data.driver.clone(), data.volume_handle.clone());
        let users = blocking(move || Ok(pods_using(&layout, &driver, &handle))).await?;
        if !users.is_empty() {
            tracing::debug!(volume = %unique, users = users.len(), "device still in use");
            return Ok(());
        }
        let device_path =
            device_mount_path(self.inner.layout.root(), &data.driver, &data.volume_handle);
        let data_dir = device_path
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_default();
        let staged_data = match load_vol_data(&data_dir) {
            Ok(d) => Some(d),
            Err(_) if !data_dir.join(super::csi_data::VOL_DATA_FILE).exists() => None,
            Err(e) => return Err(format!("{PLUGIN_NAME}: attacher.UnmountDevice failed: {e}")),
        };
        if let Some(d) = staged_data {
            let Some(csi) = self.inner.csi.clone() else {
                return Err(format!("{PLUGIN_NAME}: CSI is not enabled on this node"));
            };
            let client = csi.client(&d.driver).map_err(|e| {
                format!(
                    "{PLUGIN_NAME}: attacher.UnmountDevice failed to create newCsiDriverClient: {e}"
                )
            })?;
            let caps = client.node_get_capabilities().await.map_err(|e| {
                format!("{PLUGIN_NAME}: attacher.UnmountDevice failed to check whether STAGE_UNSTAGE_VOLUME set: {e}")
            })?;
            if caps.stage_unstage {
                client
                    .node_unstage_volume(&d.volume_handle, &device_path)
                    .await
                    .map_err(|e| format!("{PLUGIN_NAME}: attacher.UnmountDevice failed: {e}"))?;
                tracing::info!(volume = %unique, path = %device_path.display(), "NodeUnstageVolume succeeded");
            }
        }
        let mounter = self.inner.mounter.clone();
        let dp = device_path.clone();
        blocking(move || {
            if is_mount_point(mounter.as_ref(), &dp)? {
                return Err(format!("{} is still mounted", dp.display()));
            }
            remove_mount_dir(mounter.as_ref(), &dp)
        })
        .await
        .map_err(|e| {
            format!(
                "{PLUGIN_NAME}: failed to clean up global mount {}: {e}",
                data_dir.display()
            )
        })?;
        lock(&self.inner.devices.staged).remove(&unique);
        self.inner.in_use.remove_attached(&unique);
        Ok(())
    }

    /// Devices staged on disk that no pod uses nor wants any more are
    /// unmounted (kubelet's reconciler retries `UnmountDevice` until it
    /// succeeds; here every housekeeping round finds them on disk).
    pub(super) async fn unmount_unused_devices(&self) -> Result<(), String> {
        let layout = self.inner.layout.clone();
        let devices = blocking(move || Ok(staged_on_disk(&layout))).await?;
        let mut errors = Vec::new();
        for d in devices {
            let unique = unique_volume_name(&d.driver, &d.volume_handle);
            if self.inner.in_use.is_desired(&unique) {
                continue;
            }
            if let Err(e) = self.unmount_device_if_unused(&d).await {
                errors.push(format!("UnmountDevice failed for volume {unique:?}: {e}"));
            }
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(errors.join("; "))
        }
    }

    /// Reconstruction after a restart: every persistent CSI volume still
    /// on disk (a pod's or a staged device) is attached as far as this node
    /// knows, so it stays in `volumesInUse` until its device is unmounted;
    /// then the list may be reported. Running pods are not touched.
    pub(super) async fn reconstruct_csi(&self) {
        let layout = self.inner.layout.clone();
        let found = blocking(move || Ok(persistent_on_disk(&layout)))
            .await
            .unwrap_or_default();
        let mut seen = std::collections::BTreeSet::new();
        for d in found {
            if !seen.insert((d.driver.clone(), d.volume_handle.clone())) {
                continue;
            }
            let attachable = match &self.inner.csi {
                Some(csi) => match csi.lister().get(&d.driver).await {
                    Ok(driver) => attach_required(driver.as_deref()),
                    // Unknown: keep it in use (the safe side).
                    Err(_) => true,
                },
                None => true,
            };
            if attachable {
                let unique = unique_volume_name(&d.driver, &d.volume_handle);
                tracing::info!(volume = %unique, "reconstructed a CSI volume in use");
                self.inner.in_use.add_attached(&unique);
            }
        }
        self.inner.in_use.set_synced();
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn device_path_as_kubelet() {
        let p = device_mount_path(Path::new("/var/lib/kubelet"), "d.example.com", "h");
        assert_eq!(
            p,
            Path::new("/var/lib/kubelet/plugins/kubernetes.io/csi/d.example.com")
                .join(hex::encode(Sha256::digest(b"h")))
                .join("globalmount")
        );
    }

    #[test]
    fn users_and_reconstruction_from_disk() {
        let tmp = tempfile::tempdir().unwrap();
        let layout = Layout::new(tmp.path());
        let pv = |uid: &str, name: &str, handle: &str, mode: &str| {
            let dir = layout.pod_volumes_dir(uid).join(CSI_DIR).join(name);
            save_vol_data(
                &dir,
                &[
                    (key::DRIVER_NAME, "d".to_string()),
                    (key::VOLUME_HANDLE, handle.to_string()),
                    (key::LIFECYCLE_MODE, mode.to_string()),
                ]
                .into(),
            )
            .unwrap();
        };
        pv("p1", "pv-1", "h1", "Persistent");
        pv("p2", "pv-1", "h1", "Persistent");
        pv("p2", "inline", "h1", "Ephemeral");
        pv("p3", "pv-2", "h2", "Persistent");
        assert_eq!(pods_using(&layout, "d", "h1").len(), 2);
        assert_eq!(pods_using(&layout, "d", "h2").len(), 1);
        assert!(pods_using(&layout, "other", "h1").is_empty());
        let dev = device_mount_path(tmp.path(), "d", "h9");
        save_vol_data(
            dev.parent().unwrap(),
            &[
                (key::DRIVER_NAME, "d".to_string()),
                (key::VOLUME_HANDLE, "h9".to_string()),
            ]
            .into(),
        )
        .unwrap();
        let mut handles: Vec<String> = persistent_on_disk(&layout)
            .into_iter()
            .map(|d| d.volume_handle)
            .collect();
        handles.sort();
        assert_eq!(handles, ["h1", "h1", "h2", "h9"]);
    }
}
