//! The files kubelet's CSI volume plugin keeps beside its mounts
//! (pkg/volume/csi/csi_util.go `saveVolumeData`, `loadVolumeData`,
//! `removeMountDir`): `vol_data.json` beside a pod's `mount` directory and
//! beside a volume's `globalmount`, in kubelet's keys, so that teardown
//! works from what is on disk — also for volumes an earlier keelson (or
//! kubelet) process set up.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use super::mounter::Mounter;
use crate::csi::PLUGIN_NAME;

/// The file beside the mount directory with what teardown needs.
pub const VOL_DATA_FILE: &str = "vol_data.json";

/// `vol_data.json`'s keys (`volDataKey`).
pub(super) mod key {
    pub(crate) const SPEC_VOL_ID: &str = "specVolID";
    pub(crate) const VOLUME_HANDLE: &str = "volumeHandle";
    pub(crate) const DRIVER_NAME: &str = "driverName";
    pub(crate) const NODE_NAME: &str = "nodeName";
    pub(crate) const LIFECYCLE_MODE: &str = "volumeLifecycleMode";
    pub(crate) const ATTACHMENT_ID: &str = "attachmentID";
}

/// What teardown reads back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct VolData {
    pub(super) volume_handle: String,
    pub(super) driver: String,
    /// `Persistent`, `Ephemeral`, or empty (a globalmount's file).
    pub(super) lifecycle: String,
}

impl VolData {
    /// A PersistentVolume's (not an inline volume's) data.
    pub(super) fn is_persistent(&self) -> bool {
        self.lifecycle == "Persistent"
    }
}

/// (driver, volume handle) of the CSI volume published at `mount_dir`,
/// from the `vol_data.json` beside it: what `NodeGetVolumeStats` needs.
pub(super) fn stats_identity(mount_dir: &Path) -> Option<(String, String)> {
    let d = load_vol_data(mount_dir.parent()?).ok()?;
    Some((d.driver, d.volume_handle))
}

/// Reads `<dir>/vol_data.json`.
pub(super) fn load_vol_data(dir: &Path) -> Result<VolData, String> {
    let path = dir.join(VOL_DATA_FILE);
    let text = std::fs::read_to_string(&path).map_err(|e| {
        format!(
            "{PLUGIN_NAME}: failed to open volume data file [{}]: {e}",
            path.display()
        )
    })?;
    let map: BTreeMap<String, String> = serde_json::from_str(&text).map_err(|e| {
        format!(
            "{PLUGIN_NAME}: failed to parse volume data file [{}]: {e}",
            path.display()
        )
    })?;
    let get = |k: &str| map.get(k).cloned().unwrap_or_default();
    Ok(VolData {
        volume_handle: get(key::VOLUME_HANDLE),
        driver: get(key::DRIVER_NAME),
        lifecycle: get(key::LIFECYCLE_MODE),
    })
}

/// Creates `dir` (0750) and writes `data` as `<dir>/vol_data.json`
/// (`saveVolumeData`).
pub(super) fn save_vol_data(dir: &Path, data: &BTreeMap<&str, String>) -> Result<(), String> {
    let json = serde_json::to_string(data).map_err(|e| e.to_string())?;
    std::fs::create_dir_all(dir).map_err(|e| {
        format!(
            "{PLUGIN_NAME}: mounter.SetUpAt failed to create dir {:?}:  {e}",
            dir.display().to_string()
        )
    })?;
    let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o750));
    std::fs::write(dir.join(VOL_DATA_FILE), json + "\n").map_err(|e| {
        format!(
            "{PLUGIN_NAME}: mounter.SetUpAt failed to save volume info data: {PLUGIN_NAME}: failed to save volume data file {}: {e}",
            dir.join(VOL_DATA_FILE).display()
        )
    })
}

/// Whether `path` is a mount point.
pub(super) fn is_mount_point(mounter: &dyn Mounter, path: &Path) -> Result<bool, String> {
    Ok(mounter
        .mount_points()
        .map_err(|e| e.to_string())?
        .iter()
        .any(|m| m.path == path))
}

/// `removeMountDir`: when `mount_dir` is no mount point, it, the
/// `vol_data.json` beside it and their directory go.
pub(super) fn remove_mount_dir(mounter: &dyn Mounter, mount_dir: &Path) -> Result<(), String> {
    if is_mount_point(mounter, mount_dir)? {
        return Ok(());
    }
    let rm = |p: &Path, dir: bool| {
        let r = if dir {
            std::fs::remove_dir(p)
        } else {
            std::fs::remove_file(p)
        };
        match r {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(format!(
                "{PLUGIN_NAME}: failed to remove [{}]: {e}",
                p.display()
            )),
            _ => Ok(()),
        }
    };
    rm(mount_dir, true)?;
    if let Some(vol_dir) = mount_dir.parent() {
        rm(&vol_dir.join(VOL_DATA_FILE), false)?;
        rm(vol_dir, true)?;
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn vol_data_round_trip_and_removal() {
        let tmp = tempfile::tempdir().unwrap();
        let vol = tmp.path().join("v");
        std::fs::create_dir_all(vol.join("mount")).unwrap();
        save_vol_data(
            &vol,
            &[
                (key::DRIVER_NAME, "d".to_string()),
                (key::SPEC_VOL_ID, "v".to_string()),
                (key::VOLUME_HANDLE, "h".to_string()),
                (key::LIFECYCLE_MODE, "Persistent".to_string()),
            ]
            .into(),
        )
        .unwrap();
        let d = load_vol_data(&vol).unwrap();
        assert_eq!(
            d,
            VolData {
                volume_handle: "h".into(),
                driver: "d".into(),
                lifecycle: "Persistent".into(),
            }
        );
        assert!(d.is_persistent());
        remove_mount_dir(&super::super::mounter::LinuxMounter, &vol.join("mount")).unwrap();
        assert!(!vol.exists());
    }
}
