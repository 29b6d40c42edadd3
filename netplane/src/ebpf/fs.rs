//! Filesystem facts the socket LB depends on: bpffs for the pins and a
//! cgroup v2 directory to attach to.

use std::path::{Path, PathBuf};

use nix::sys::statfs::{BPF_FS_MAGIC, CGROUP2_SUPER_MAGIC, statfs};

use super::error::EbpfError;

/// Is `path` the root of a mounted bpffs (or a directory inside one)?
pub fn is_bpffs(path: &Path) -> bool {
    statfs(path).is_ok_and(|s| s.filesystem_type() == BPF_FS_MAGIC)
}

/// Is `path` a directory of a cgroup v2 hierarchy?
pub fn is_cgroup2(path: &Path) -> bool {
    statfs(path).is_ok_and(|s| s.filesystem_type() == CGROUP2_SUPER_MAGIC)
}

/// Makes sure `path` is a bpffs, mounting one there when it is not (as
/// Cilium and systemd do at `/sys/fs/bpf`). Returns whether it mounted.
pub fn ensure_bpffs(path: &Path) -> Result<bool, EbpfError> {
    if is_bpffs(path) {
        return Ok(false);
    }
    std::fs::create_dir_all(path)
        .map_err(|e| EbpfError::io("creating the bpffs mount point", path, e))?;
    nix::mount::mount(
        Some("bpf"),
        path,
        Some("bpf"),
        nix::mount::MsFlags::MS_NOSUID
            | nix::mount::MsFlags::MS_NODEV
            | nix::mount::MsFlags::MS_NOEXEC,
        None::<&str>,
    )
    .map_err(|e| EbpfError::io("mounting bpffs", path, std::io::Error::from(e)))?;
    tracing::info!(path = %path.display(), "mounted bpffs");
    Ok(true)
}

/// The node's cgroup v2 root: where `cgroup2` is mounted (`/sys/fs/cgroup`
/// on a unified host, `/sys/fs/cgroup/unified` on a hybrid one).
pub fn cgroup2_root() -> Result<PathBuf, EbpfError> {
    let mounts = std::fs::read_to_string("/proc/self/mounts")
        .map_err(|e| EbpfError::io("reading mounts", "/proc/self/mounts", e))?;
    cgroup2_root_in(&mounts).ok_or_else(|| EbpfError::Unsupported {
        reason: "no cgroup v2 hierarchy is mounted (the socket LB attaches to cgroup v2; \
                 mount cgroup2 or use proxy.mode nftables)"
            .into(),
    })
}

/// The first `cgroup2` mount point in a `/proc/mounts` text.
pub fn cgroup2_root_in(mounts: &str) -> Option<PathBuf> {
    mounts.lines().find_map(|line| {
        let mut f = line.split_whitespace();
        let (_src, target, fstype) = (f.next()?, f.next()?, f.next()?);
        (fstype == "cgroup2").then(|| PathBuf::from(unescape_mount_path(target)))
    })
}

/// `/proc/mounts` escapes space, tab, newline and backslash as octal.
fn unescape_mount_path(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\\' {
            let digits: String = chars.clone().take(3).collect();
            if digits.len() == 3
                && let Ok(v) = u8::from_str_radix(&digits, 8)
            {
                out.push(char::from(v));
                for _ in 0..3 {
                    chars.next();
                }
                continue;
            }
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_hybrid_cgroup2_mount() {
        let mounts = "sysfs /sys sysfs rw 0 0\n\
                      tmpfs /sys/fs/cgroup tmpfs ro 0 0\n\
                      cgroup2 /sys/fs/cgroup/unified cgroup2 rw,nsdelegate 0 0\n\
                      cgroup /sys/fs/cgroup/memory cgroup rw,memory 0 0\n";
        assert_eq!(
            cgroup2_root_in(mounts),
            Some(PathBuf::from("/sys/fs/cgroup/unified"))
        );
    }

    #[test]
    fn finds_the_unified_mount_and_unescapes() {
        assert_eq!(
            cgroup2_root_in("cgroup2 /sys/fs/cgroup cgroup2 rw 0 0\n"),
            Some(PathBuf::from("/sys/fs/cgroup"))
        );
        assert_eq!(
            cgroup2_root_in("none /mnt/my\\040cg cgroup2 rw 0 0\n"),
            Some(PathBuf::from("/mnt/my cg"))
        );
        assert_eq!(cgroup2_root_in("proc /proc proc rw 0 0\n"), None);
    }
}
