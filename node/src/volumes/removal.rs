//! Removing volume and pod directories without ever reaching through a
//! mount: kubelet's `RemoveAllOneFilesystem`, made stricter by checking the
//! mount table too (a bind mount of the same filesystem has the same device
//! number, so the device check alone would not see it).

use std::collections::HashSet;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::mounter::Mounter;

/// Removes `path` and everything below it, refusing (with an error naming
/// the path) to remove or descend into a mount point or another filesystem.
pub fn remove_all_one_filesystem(mounter: &dyn Mounter, path: &Path) -> io::Result<()> {
    let mounts: HashSet<PathBuf> = mounter
        .mount_points()?
        .into_iter()
        .map(|m| m.path)
        .filter(|p| p.starts_with(path))
        .collect();
    let root = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    remove(path, root.dev(), &mounts)
}

fn remove(path: &Path, dev: u64, mounts: &HashSet<PathBuf>) -> io::Result<()> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    if !meta.is_dir() {
        return std::fs::remove_file(path).or_else(not_found_ok);
    }
    if mounts.contains(path) || meta.dev() != dev {
        return Err(io::Error::other(format!(
            "cannot delete directory {}: it is a mount point",
            path.display()
        )));
    }
    // Another remover (a pod's own cleanup racing housekeeping) may get
    // there first: whatever is gone already is fine.
    let entries = match std::fs::read_dir(path) {
        Ok(e) => e,
        Err(e) => return not_found_ok(e),
    };
    for entry in entries {
        match entry {
            Ok(entry) => remove(&entry.path(), dev, mounts)?,
            Err(e) => not_found_ok(e)?,
        }
    }
    std::fs::remove_dir(path).or_else(not_found_ok)
}

fn not_found_ok(e: io::Error) -> io::Result<()> {
    if e.kind() == io::ErrorKind::NotFound {
        Ok(())
    } else {
        Err(e)
    }
}
