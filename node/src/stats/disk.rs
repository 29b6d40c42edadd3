//! Disk usage of a directory tree, walked like `du -x` (kubelet's
//! `fs.DiskUsage`): what logs, writable layers and volumes cost the node's
//! filesystems.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// Disk usage of something (a writable layer, logs, a volume).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DiskUsage {
    /// Bytes used.
    pub used_bytes: u64,
    /// Inodes used.
    pub inodes_used: u64,
}

/// Disk usage of a tree, like `du -x`: allocated bytes and inodes, not
/// following symlinks, not crossing into other filesystems, a file with
/// several links counted once (`pkg/volume/util/fs/fs.go` `DiskUsage`).
pub fn du(path: &Path) -> Option<DiskUsage> {
    let root = std::fs::symlink_metadata(path).ok()?;
    let dev = root.dev();
    let mut usage = DiskUsage::default();
    let mut linked = std::collections::HashSet::new();
    let mut stack = vec![path.to_path_buf()];
    while let Some(p) = stack.pop() {
        let Ok(m) = std::fs::symlink_metadata(&p) else {
            continue;
        };
        if m.dev() != dev || (m.nlink() > 1 && !linked.insert(m.ino())) {
            continue;
        }
        usage.used_bytes = usage
            .used_bytes
            .saturating_add(m.blocks().saturating_mul(512));
        usage.inodes_used += 1;
        if m.is_dir()
            && let Ok(rd) = std::fs::read_dir(&p)
        {
            stack.extend(rd.flatten().map(|e| e.path()));
        }
    }
    Some(usage)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn du_counts_blocks_and_inodes() {
        let root = tempfile::tempdir().expect("tmp");
        std::fs::create_dir(root.path().join("d")).expect("mkdir");
        std::fs::write(root.path().join("d/f"), vec![1u8; 64 * 1024]).expect("w");
        let u = du(root.path()).expect("du");
        assert_eq!(u.inodes_used, 3);
        assert!(u.used_bytes >= 64 * 1024, "{u:?}");
        assert_eq!(du(&root.path().join("missing")), None);
        // A second link to the same file costs nothing more.
        std::fs::hard_link(root.path().join("d/f"), root.path().join("link")).expect("ln");
        assert_eq!(du(root.path()).expect("du"), u);
    }
}
