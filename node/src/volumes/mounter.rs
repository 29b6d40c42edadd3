//! Mounting, behind a narrow trait (youki's habit): tmpfs and hugetlbfs for
//! memory-backed emptyDirs and the volumes wrapped on them, bind mounts for
//! subPaths, unmounting, and reading the mount table. The one implementation
//! calls mount(2)/umount2(2) directly and reads `/proc/self/mountinfo`.

use std::io;
use std::path::{Path, PathBuf};

use nix::mount::{MntFlags, MsFlags};

pub use keelson_common::mountinfo::{MountPoint, parse_mountinfo};

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
    /// Applies per-mount flags to the bind mount at `target` (a remount
    /// with `MS_BIND`: `ro`, `noexec`, ...), as mount(8) does for
    /// `mount -o bind,<options>`; see [`bind_remount_flags`].
    fn remount_bind(&self, target: &Path, options: &[String]) -> io::Result<()>;
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

    fn remount_bind(&self, target: &Path, options: &[String]) -> io::Result<()> {
        let flags = bind_remount_flags(options).map_err(io::Error::other)?;
        nix::mount::mount(
            None::<&str>,
            target,
            None::<&str>,
            MsFlags::MS_BIND | MsFlags::MS_REMOUNT | flags,
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

/// The per-mount flags a bind mount can carry, from mount(8) option names.
/// Filesystem options (`uid=`, `discard`, ...) cannot apply to a bind of a
/// directory and are refused, naming the option.
pub fn bind_remount_flags(options: &[String]) -> Result<MsFlags, String> {
    let mut flags = MsFlags::empty();
    for o in options {
        match o.as_str() {
            "ro" => flags.insert(MsFlags::MS_RDONLY),
            "rw" => flags.remove(MsFlags::MS_RDONLY),
            "nosuid" => flags.insert(MsFlags::MS_NOSUID),
            "suid" => flags.remove(MsFlags::MS_NOSUID),
            "nodev" => flags.insert(MsFlags::MS_NODEV),
            "dev" => flags.remove(MsFlags::MS_NODEV),
            "noexec" => flags.insert(MsFlags::MS_NOEXEC),
            "exec" => flags.remove(MsFlags::MS_NOEXEC),
            "noatime" => flags.insert(MsFlags::MS_NOATIME),
            "nodiratime" => flags.insert(MsFlags::MS_NODIRATIME),
            "relatime" => flags.insert(MsFlags::MS_RELATIME),
            "strictatime" => flags.insert(MsFlags::MS_STRICTATIME),
            "atime" | "defaults" => {}
            other => {
                return Err(format!(
                    "mount option {other:?} cannot be applied to a bind mount (supported: ro, rw, nosuid, suid, nodev, dev, noexec, exec, noatime, atime, nodiratime, relatime, strictatime, defaults)"
                ));
            }
        }
    }
    Ok(flags)
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
    fn bind_options_map_to_flags_and_others_are_refused() {
        let f = bind_remount_flags(&["ro".into(), "noexec".into(), "noatime".into()]).unwrap();
        assert_eq!(
            f,
            MsFlags::MS_RDONLY | MsFlags::MS_NOEXEC | MsFlags::MS_NOATIME
        );
        assert!(bind_remount_flags(&[]).unwrap().is_empty());
        let e = bind_remount_flags(&["uid=1000".into()]).unwrap_err();
        assert!(e.starts_with("mount option \"uid=1000\" cannot"), "{e}");
    }

    #[test]
    fn finds_mounts_at_and_under_a_path() {
        let m = parse_mountinfo(SAMPLE);
        let under = mounts_under(&m, Path::new("/var/lib/keelson/pods/u1"));
        assert_eq!(under.len(), 2);
        assert!(mount_at(&m, Path::new("/proc")).is_some());
        assert!(mount_at(&m, Path::new("/pro")).is_none());
    }
}
