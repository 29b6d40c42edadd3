//! `subPath` mounts done safely, as kubelet does on Linux: the sub path is
//! resolved once, opened component by component with `O_NOFOLLOW` inside
//! the volume (a container cannot swap a directory for a symlink pointing
//! outside), and the opened file descriptor (`/proc/self/fd/N`) is
//! bind-mounted on `<pod>/volume-subpaths/<volume>/<container>/<index>`,
//! which is what the runtime then mounts into the container.
//!
//! A bind mount pins the file it was made from: a configMap key mounted by
//! subPath keeps its content when the configMap changes (the atomic writer
//! publishes a new file beside it), and gets the new content only when the
//! container is recreated, as upstream.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use nix::fcntl::OFlag;
use nix::sys::stat::{Mode, SFlag};

use super::mounter::{Mounter, mount_at};

/// Checks a `subPath` as kubelet's `makeMounts`: relative, without `..`.
pub fn validate_sub_path(sub_path: &str) -> Result<(), String> {
    if sub_path.starts_with('/') {
        return Err(format!(
            "error SubPath `{sub_path}` must not be an absolute path"
        ));
    }
    if Path::new(sub_path)
        .components()
        .any(|c| matches!(c, Component::ParentDir))
    {
        return Err(format!(
            "unable to provision SubPath `{sub_path}`: must not contain '..'"
        ));
    }
    Ok(())
}

/// True when `path` is `base` or below it (lexically).
fn within(path: &Path, base: &Path) -> bool {
    path.starts_with(base)
}

/// Opens `path` (already free of symlinks) below `base`, one component at
/// a time without following symlinks; returns an `O_PATH` descriptor.
pub fn safe_open(path: &Path, base: &Path) -> io::Result<OwnedFd> {
    let rel = path.strip_prefix(base).map_err(|_| {
        io::Error::other(format!(
            "path {} is outside of allowed base {}",
            path.display(),
            base.display()
        ))
    })?;
    let mut parent = nix::fcntl::open(
        base,
        OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| io::Error::other(format!("cannot open directory {}: {e}", base.display())))?;
    let mut current = base.to_path_buf();
    for seg in rel.components() {
        let Component::Normal(seg) = seg else {
            continue;
        };
        current.push(seg);
        let child = nix::fcntl::openat(
            &parent,
            seg,
            OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| io::Error::other(format!("cannot open {}: {e}", current.display())))?;
        let st = nix::sys::stat::fstat(&child).map_err(|e| {
            io::Error::other(format!(
                "error running fstat on {} with {e}",
                current.display()
            ))
        })?;
        if SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT == SFlag::S_IFLNK {
            return Err(io::Error::other(format!(
                "unexpected symlink found {}",
                current.display()
            )));
        }
        parent = child;
    }
    Ok(parent)
}

/// Creates the directory `base/sub_dir` (and missing parents) without
/// leaving `base`, each new directory with mode `perm`.
pub fn safe_make_dir(sub_dir: &str, base: &Path, perm: u32) -> io::Result<()> {
    let real_base = std::fs::canonicalize(base).map_err(|e| {
        io::Error::other(format!(
            "error resolving symlinks in {}: {e}",
            base.display()
        ))
    })?;
    let full = real_base.join(sub_dir);
    if let Ok(m) = std::fs::metadata(&full) {
        if m.is_dir() {
            return Ok(());
        }
        return Err(io::Error::other(format!(
            "mkdir {}: not a directory",
            full.display()
        )));
    }
    // Longest existing prefix, then create the rest one by one.
    let rel: Vec<_> = Path::new(sub_dir)
        .components()
        .filter_map(|c| match c {
            Component::Normal(s) => Some(s.to_os_string()),
            _ => None,
        })
        .collect();
    let mut existing = real_base.clone();
    let mut idx = 0;
    while idx < rel.len() && std::fs::symlink_metadata(existing.join(&rel[idx])).is_ok() {
        existing.push(&rel[idx]);
        idx += 1;
    }
    let existing = std::fs::canonicalize(&existing)?;
    if !within(&existing, &real_base) {
        return Err(io::Error::other(format!(
            "path {} is outside of allowed base {}",
            existing.display(),
            real_base.display()
        )));
    }
    let opened = safe_open(&existing, &real_base)?;
    // Re-open as a real directory descriptor (O_PATH cannot fchmod).
    let mut parent = nix::fcntl::openat(
        &opened,
        ".",
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?;
    let mut current = existing;
    for seg in &rel[idx..] {
        current.push(seg);
        nix::sys::stat::mkdirat(&parent, seg.as_os_str(), Mode::from_bits_truncate(perm)).map_err(
            |e| {
                io::Error::other(format!(
                    "cannot create directory {}: {e}",
                    current.display()
                ))
            },
        )?;
        let child = nix::fcntl::openat(
            &parent,
            seg.as_os_str(),
            OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| io::Error::other(format!("cannot open {}: {e}", current.display())))?;
        // mkdirat went through the umask.
        nix::sys::stat::fchmod(&child, Mode::from_bits_truncate(perm & 0o7777))
            .map_err(|e| io::Error::other(format!("chmod {:?} failed: {e}", current.display())))?;
        parent = child;
    }
    Ok(())
}

/// What to bind for one volumeMount with a subPath.
#[derive(Debug, Clone)]
pub struct SubpathRequest<'a> {
    /// The volume on the host.
    pub volume_path: &'a Path,
    /// `volume_path` joined with the subPath.
    pub path: &'a Path,
    /// Bind target (`<pod>/volume-subpaths/<volume>/<container>/<index>`).
    pub target: &'a Path,
}

/// Binds the sub path on its target (kubelet's `doBindSubPath`) and
/// returns the target. An existing bind of the same file is kept; a bind
/// of another file (the volume's content was replaced) is redone.
pub fn bind_sub_path(mounter: &dyn Mounter, req: &SubpathRequest<'_>) -> io::Result<PathBuf> {
    let volume_path = std::fs::canonicalize(req.volume_path).map_err(|e| {
        io::Error::other(format!(
            "error resolving symlinks in {:?}: {e}",
            req.volume_path
        ))
    })?;
    let path = std::fs::canonicalize(req.path).map_err(|e| {
        io::Error::other(format!("error resolving symlinks in {:?}: {e}", req.path))
    })?;
    if !within(&path, &volume_path) {
        return Err(io::Error::other(format!(
            "subpath {:?} not within volume path {:?}",
            path, volume_path
        )));
    }
    let fd = safe_open(&path, &volume_path)
        .map_err(|e| io::Error::other(format!("error opening subpath {}: {e}", path.display())))?;

    let target = req.target;
    let mounts = mounter.mount_points()?;
    if mount_at(&mounts, target).is_some() {
        let source = std::fs::symlink_metadata(&path)?;
        let bound = std::fs::symlink_metadata(target)?;
        if source.dev() == bound.dev() && source.ino() == bound.ino() {
            return Ok(target.to_path_buf());
        }
        mounter
            .unmount(target)
            .map_err(|e| io::Error::other(format!("error unmounting {}: {e}", target.display())))?;
    }
    if let Some(parent) = target.parent() {
        std::fs::create_dir_all(parent)?;
        let _ = std::fs::set_permissions(parent, std::fs::Permissions::from_mode(0o750));
    }
    let is_dir = std::fs::symlink_metadata(&path)?.is_dir();
    if is_dir {
        match std::fs::create_dir(target) {
            Ok(()) => std::fs::set_permissions(target, std::fs::Permissions::from_mode(0o750))?,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => {
                return Err(io::Error::other(format!(
                    "error creating directory {}: {e}",
                    target.display()
                )));
            }
        }
    } else {
        // A file target works for every non-directory source.
        std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(target)
            .map_err(|e| {
                io::Error::other(format!("error creating file {}: {e}", target.display()))
            })?;
    }
    let source = PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()));
    if let Err(e) = mounter.bind(&source, target) {
        let _ = clean_one(mounter, target);
        return Err(io::Error::other(format!(
            "error mounting {}: {e}",
            path.display()
        )));
    }
    tracing::debug!(subpath = %path.display(), target = %target.display(), "bound subPath");
    Ok(target.to_path_buf())
}

/// Unmounts and removes every subPath bind of one volume of a pod
/// (`<pod>/volume-subpaths/<volume>`), then the empty directories.
pub fn clean_sub_paths(mounter: &dyn Mounter, subpaths_dir: &Path, volume: &str) -> io::Result<()> {
    let dir = subpaths_dir.join(volume);
    let containers = match std::fs::read_dir(&dir) {
        Ok(r) => r,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => {
            return Err(io::Error::other(format!(
                "error reading {}: {e}",
                dir.display()
            )));
        }
    };
    for c in containers {
        let c = c?;
        if !c.file_type()?.is_dir() {
            continue;
        }
        for idx in std::fs::read_dir(c.path())? {
            clean_one(mounter, &idx?.path())?;
        }
        std::fs::remove_dir(c.path())
            .map_err(|e| io::Error::other(format!("error deleting {}: {e}", c.path().display())))?;
    }
    std::fs::remove_dir(&dir)
        .map_err(|e| io::Error::other(format!("error deleting {}: {e}", dir.display())))?;
    // The pod's subpath directory goes with its last volume.
    match std::fs::remove_dir(subpaths_dir) {
        Ok(()) => Ok(()),
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(libc::ENOTEMPTY) | Some(libc::EEXIST) | Some(libc::ENOENT)
            ) =>
        {
            Ok(())
        }
        Err(e) => Err(io::Error::other(format!(
            "error deleting {}: {e}",
            subpaths_dir.display()
        ))),
    }
}

/// Unmounts `target` if it is a mount point, then removes it.
fn clean_one(mounter: &dyn Mounter, target: &Path) -> io::Result<()> {
    let mounts = mounter.mount_points()?;
    if mount_at(&mounts, target).is_some() {
        mounter.unmount(target).map_err(|e| {
            io::Error::other(format!(
                "error cleaning subpath mount {}: {e}",
                target.display()
            ))
        })?;
    }
    match std::fs::symlink_metadata(target) {
        Ok(m) if m.is_dir() => std::fs::remove_dir(target),
        Ok(_) => std::fs::remove_file(target),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn sub_path_validation() {
        assert!(validate_sub_path("a/b").is_ok());
        assert_eq!(
            validate_sub_path("/etc").unwrap_err(),
            "error SubPath `/etc` must not be an absolute path"
        );
        assert!(validate_sub_path("a/../../x").is_err());
    }

    #[test]
    fn safe_open_refuses_symlinks_and_escapes() {
        let tmp = tempfile::tempdir().unwrap();
        let base = tmp.path().join("vol");
        std::fs::create_dir_all(base.join("d")).unwrap();
        std::fs::write(base.join("d/f"), "x").unwrap();
        std::os::unix::fs::symlink("/etc", base.join("link")).unwrap();
        assert!(safe_open(&base.join("d/f"), &base).is_ok());
        let e = safe_open(&base.join("link"), &base).unwrap_err();
        assert!(e.to_string().contains("unexpected symlink"), "{e}");
        assert!(safe_open(Path::new("/etc"), &base).is_err());
    }

    #[test]
    fn safe_make_dir_creates_with_mode() {
        let tmp = tempfile::tempdir().unwrap();
        let base = tmp.path().join("vol");
        std::fs::create_dir(&base).unwrap();
        safe_make_dir("a/b/c", &base, 0o777).unwrap();
        let m = std::fs::metadata(base.join("a/b/c")).unwrap();
        assert!(m.is_dir());
        assert_eq!(m.mode() & 0o7777, 0o777);
        safe_make_dir("a/b/c", &base, 0o777).unwrap();
        std::os::unix::fs::symlink("/tmp", base.join("esc")).unwrap();
        assert!(safe_make_dir("esc/x", &base, 0o777).is_err());
    }
}
