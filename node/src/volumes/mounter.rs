//! Mounting, behind a narrow trait (youki's habit): tmpfs and hugetlbfs for
//! memory-backed emptyDirs and the volumes wrapped on them, bind mounts for
//! subPaths, unmounting, and reading the mount table. The one implementation
//! calls mount(2)/umount2(2) directly and reads `/proc/self/mountinfo`.

use std::io;
use std::path::{Path, PathBuf};

use nix::mount::{MntFlags, MsFlags};

/// One entry of the mount table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountPoint {
    /// Where it is mounted.
    pub path: PathBuf,
    /// Filesystem type (`tmpfs`, `hugetlbfs`, `ext4`…).
    pub fstype: String,
    /// Mount source.
    pub source: String,
    /// Superblock options (`rw,size=65536k`).
    pub options: String,
}

/// The mount operations volumes need.
pub trait Mounter: Send + Sync + std::fmt::Debug {
    /// Mounts a filesystem of `fstype` (tmpfs, hugetlbfs) from `source` on
    /// `target` with comma-joined `options`.
    fn mount_fs(
        &self,
        source: &str,
        target: &Path,
        fstype: &str,
        options: &[String],
    ) -> io::Result<()>;
    /// Bind-mounts `source` (a path, possibly `/proc/self/fd/N`) on `target`.
    fn bind(&self, source: &Path, target: &Path) -> io::Result<()>;
    /// Unmounts `target` (not lazily: a busy mount is an error).
    fn unmount(&self, target: &Path) -> io::Result<()>;
    /// The current mount table.
    fn mount_points(&self) -> io::Result<Vec<MountPoint>>;
}

/// mount(2) on this host.
#[derive(Debug, Default, Clone, Copy)]
pub struct LinuxMounter;

impl Mounter for LinuxMounter {
    fn mount_fs(
        &self,
        source: &str,
        target: &Path,
        fstype: &str,
        options: &[String],
    ) -> io::Result<()> {
        let data = options.join(",");
        let data = if data.is_empty() {
            None
        } else {
            Some(data.as_str())
        };
        nix::mount::mount(Some(source), target, Some(fstype), MsFlags::empty(), data)
            .map_err(io::Error::from)
    }

    fn bind(&self, source: &Path, target: &Path) -> io::Result<()> {
        nix::mount::mount(
            Some(source),
            target,
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )
        .map_err(io::Error::from)
    }

    fn unmount(&self, target: &Path) -> io::Result<()> {
        nix::mount::umount2(target, MntFlags::empty()).map_err(io::Error::from)
    }

    fn mount_points(&self) -> io::Result<Vec<MountPoint>> {
        let text = std::fs::read_to_string("/proc/self/mountinfo")?;
        Ok(parse_mountinfo(&text))
    }
}

/// Parses `/proc/<pid>/mountinfo`. Lines that do not parse are skipped.
pub fn parse_mountinfo(text: &str) -> Vec<MountPoint> {
    text.lines().filter_map(parse_line).collect()
}

fn parse_line(line: &str) -> Option<MountPoint> {
    // id parent major:minor root mountpoint options [optional...] - fstype source superoptions
    let (left, right) = line.split_once(" - ")?;
    let mut l = left.split(' ');
    let mountpoint = l.nth(4)?;
    let mut r = right.split(' ');
    let fstype = r.next()?;
    let source = r.next().unwrap_or("");
    let options = r.next().unwrap_or("");
    Some(MountPoint {
        path: PathBuf::from(unescape(mountpoint)),
        fstype: unescape(fstype),
        source: unescape(source),
        options: unescape(options),
    })
}

/// Undoes the kernel's octal escapes (`\040` for space, `\011`, `\012`, `\134`).
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = (b[i + 1] - b'0') as u32 * 64
                + (b[i + 2] - b'0') as u32 * 8
                + (b[i + 3] - b'0') as u32;
            out.push(v as u8);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The mount point exactly at `path`, if any (the last one wins, as the
/// kernel shows stacked mounts in order).
pub fn mount_at<'a>(mounts: &'a [MountPoint], path: &Path) -> Option<&'a MountPoint> {
    mounts.iter().rev().find(|m| m.path == path)
}

/// Every mount point at or below `dir`, deepest first (the order to
/// unmount them in).
pub fn mounts_under(mounts: &[MountPoint], dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = mounts
        .iter()
        .filter(|m| m.path.starts_with(dir))
        .map(|m| m.path.clone())
        .collect();
    v.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    v.dedup();
    v
}

/// Detaches (lazily, `MNT_DETACH`, deepest first) every mount at or below
/// `dir`; returns how many. For test harnesses and uninstallers cleaning
/// up after a node agent that was stopped while pods had volumes.
pub fn detach_all_below(dir: &Path) -> io::Result<usize> {
    let mounts = LinuxMounter.mount_points()?;
    let mut n = 0;
    for p in mounts_under(&mounts, dir) {
        match nix::mount::umount2(&p, MntFlags::MNT_DETACH) {
            Ok(()) => n += 1,
            Err(e) => tracing::warn!(path = %p.display(), error = %e, "could not detach mount"),
        }
    }
    Ok(n)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const SAMPLE: &str = "\
22 1 0:21 / /proc rw,nosuid shared:12 - proc proc rw
90 30 0:50 / /var/lib/keelson/pods/u1/volumes/kubernetes.io~secret/a\\040b rw,relatime - tmpfs tmpfs rw,size=1024k
91 30 8:1 /data/x /var/lib/keelson/pods/u1/volume-subpaths/cfg/app/0 rw - ext4 /dev/sda1 rw
garbage line
";

    #[test]
    fn parses_and_unescapes() {
        let m = parse_mountinfo(SAMPLE);
        assert_eq!(m.len(), 3);
        assert_eq!(
            m[1].path,
            PathBuf::from("/var/lib/keelson/pods/u1/volumes/kubernetes.io~secret/a b")
        );
        assert_eq!(m[1].fstype, "tmpfs");
        assert_eq!(m[1].options, "rw,size=1024k");
        assert_eq!(m[2].source, "/dev/sda1");
        let under = mounts_under(&m, Path::new("/var/lib/keelson/pods/u1"));
        assert_eq!(under.len(), 2);
        assert!(mount_at(&m, Path::new("/proc")).is_some());
        assert!(mount_at(&m, Path::new("/pro")).is_none());
    }
}
