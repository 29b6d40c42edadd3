//! Test doubles of the volume manager's parts: an in-memory mount table
//! and claims/volumes served from maps.

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};

use super::claims::{ClaimReader, FetchError};
use super::lock;
use super::mounter::{MountPoint, Mounter};

/// A mount table in memory: `mount_fs` adds, `unmount` removes (or
/// fails with EBUSY while the path is in `busy`).
#[derive(Debug, Default)]
pub(super) struct FakeMounter {
    pub(super) table: Mutex<Vec<MountPoint>>,
    pub(super) busy: Mutex<Vec<PathBuf>>,
}

impl Mounter for FakeMounter {
    fn mount_fs(&self, source: &str, target: &Path, fstype: &str, _: &[String]) -> io::Result<()> {
        lock(&self.table).push(MountPoint {
            path: target.to_path_buf(),
            fstype: fstype.to_string(),
            source: source.to_string(),
            options: "rw".to_string(),
        });
        Ok(())
    }
    fn bind(&self, source: &Path, target: &Path) -> io::Result<()> {
        self.mount_fs(&source.display().to_string(), target, "none", &[])
    }
    fn remount_bind(&self, _: &Path, _: &[String]) -> io::Result<()> {
        Ok(())
    }
    fn unmount(&self, target: &Path) -> io::Result<()> {
        if lock(&self.busy).iter().any(|b| b == target) {
            return Err(io::Error::from_raw_os_error(nix::libc::EBUSY));
        }
        let mut table = lock(&self.table);
        let before = table.len();
        table.retain(|m| m.path != target);
        if table.len() == before {
            return Err(io::Error::from_raw_os_error(nix::libc::EINVAL));
        }
        Ok(())
    }
    fn mount_points(&self) -> io::Result<Vec<MountPoint>> {
        Ok(lock(&self.table).clone())
    }
}

/// Claims (keyed `namespace/name`) and volumes in maps; a missing one is
/// the API server's not-found text.
#[derive(Default)]
pub(super) struct FakeClaims {
    pub(super) claims: Mutex<HashMap<String, PersistentVolumeClaim>>,
    pub(super) volumes: Mutex<HashMap<String, PersistentVolume>>,
}

impl FakeClaims {
    /// Adds or replaces a claim.
    pub(super) fn put_claim(&self, c: PersistentVolumeClaim) {
        let key = format!(
            "{}/{}",
            c.metadata.namespace.clone().unwrap_or_default(),
            c.metadata.name.clone().unwrap_or_default()
        );
        lock(&self.claims).insert(key, c);
    }

    /// Adds or replaces a volume.
    pub(super) fn put_volume(&self, v: PersistentVolume) {
        lock(&self.volumes).insert(v.metadata.name.clone().unwrap_or_default(), v);
    }
}

impl ClaimReader for FakeClaims {
    fn claim<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<PersistentVolumeClaim, FetchError>> {
        let found = lock(&self.claims)
            .get(&format!("{namespace}/{name}"))
            .cloned();
        Box::pin(async move {
            found.ok_or_else(|| FetchError {
                message: format!("persistentvolumeclaims \"{name}\" not found"),
            })
        })
    }

    fn volume<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<PersistentVolume, FetchError>> {
        let found = lock(&self.volumes).get(name).cloned();
        Box::pin(async move {
            found.ok_or_else(|| FetchError {
                message: format!("persistentvolumes \"{name}\" not found"),
            })
        })
    }
}
