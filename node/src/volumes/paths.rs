//! Where a pod's volumes live on disk, with kubelet's layout so that tools
//! and habits carry over:
//!
//! ```text
//! <root>/pods/<uid>/volumes/kubernetes.io~<plugin>/<volume>    the volume
//! <root>/pods/<uid>/plugins/kubernetes.io~empty-dir/<volume>/ready
//! <root>/pods/<uid>/volume-subpaths/<volume>/<container>/<index>
//! ```

use std::path::{Path, PathBuf};

/// Directory name of the emptyDir plugin (also the wrapper of the
/// configMap, secret, downwardAPI and projected plugins' ready markers).
pub const EMPTY_DIR: &str = "kubernetes.io~empty-dir";
/// Directory name of the configMap plugin.
pub const CONFIG_MAP: &str = "kubernetes.io~configmap";
/// Directory name of the secret plugin.
pub const SECRET: &str = "kubernetes.io~secret";
/// Directory name of the downwardAPI plugin.
pub const DOWNWARD_API: &str = "kubernetes.io~downward-api";
/// Directory name of the projected plugin.
pub const PROJECTED: &str = "kubernetes.io~projected";
/// Directory name of the local PersistentVolume plugin; its volumes are
/// named after the PV (`…/kubernetes.io~local-volume/<pv name>`).
pub const LOCAL_VOLUME: &str = "kubernetes.io~local-volume";

/// The on-disk layout under the node's root directory.
#[derive(Debug, Clone)]
pub struct Layout {
    root: PathBuf,
}

/// A name that cannot be used as one path component.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what} {value:?} cannot be used as a directory name")]
pub struct BadComponent {
    /// What the value is (`pod UID`, `volume name`).
    pub what: &'static str,
    /// The value.
    pub value: String,
}

/// Checks that `value` is one safe path component.
pub fn component<'a>(what: &'static str, value: &'a str) -> Result<&'a str, BadComponent> {
    if value.is_empty()
        || value == "."
        || value == ".."
        || value.contains('/')
        || value.contains('\0')
    {
        return Err(BadComponent {
            what,
            value: value.to_string(),
        });
    }
    Ok(value)
}

impl Layout {
    /// A layout rooted at `root` (the node's `rootDir`).
    pub fn new(root: impl Into<PathBuf>) -> Layout {
        Layout { root: root.into() }
    }

    /// `<root>/pods`.
    pub fn pods_dir(&self) -> PathBuf {
        self.root.join("pods")
    }

    /// `<root>/pods/<uid>`.
    pub fn pod_dir(&self, uid: &str) -> PathBuf {
        self.pods_dir().join(uid)
    }

    /// `<root>/pods/<uid>/volumes`.
    pub fn pod_volumes_dir(&self, uid: &str) -> PathBuf {
        self.pod_dir(uid).join("volumes")
    }

    /// `<root>/pods/<uid>/volumes/<plugin>/<name>`.
    pub fn volume_dir(&self, uid: &str, plugin: &str, name: &str) -> PathBuf {
        self.pod_volumes_dir(uid).join(plugin).join(name)
    }

    /// `<root>/pods/<uid>/plugins/kubernetes.io~empty-dir/<name>`: holds the
    /// `ready` marker of an emptyDir (or of a volume wrapped on one).
    pub fn empty_dir_meta(&self, uid: &str, name: &str) -> PathBuf {
        self.pod_dir(uid).join("plugins").join(EMPTY_DIR).join(name)
    }

    /// `<root>/pods/<uid>/volume-subpaths`.
    pub fn subpaths_dir(&self, uid: &str) -> PathBuf {
        self.pod_dir(uid).join("volume-subpaths")
    }

    /// `<root>/pods/<uid>/volume-subpaths/<volume>/<container>/<index>`.
    pub fn subpath_target(
        &self,
        uid: &str,
        volume: &str,
        container: &str,
        index: usize,
    ) -> PathBuf {
        self.subpaths_dir(uid)
            .join(volume)
            .join(container)
            .join(index.to_string())
    }

    /// The root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn kubelet_layout() {
        let l = Layout::new("/var/lib/keelson");
        assert_eq!(
            l.volume_dir("u1", SECRET, "tok"),
            PathBuf::from("/var/lib/keelson/pods/u1/volumes/kubernetes.io~secret/tok")
        );
        assert_eq!(
            l.subpath_target("u1", "cfg", "app", 2),
            PathBuf::from("/var/lib/keelson/pods/u1/volume-subpaths/cfg/app/2")
        );
        assert_eq!(
            l.empty_dir_meta("u1", "cache"),
            PathBuf::from("/var/lib/keelson/pods/u1/plugins/kubernetes.io~empty-dir/cache")
        );
    }

    #[test]
    fn components() {
        assert!(component("pod UID", "abc-123").is_ok());
        for bad in ["", ".", "..", "a/b", "a\0"] {
            assert!(component("pod UID", bad).is_err(), "{bad:?}");
        }
    }
}
