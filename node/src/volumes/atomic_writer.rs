//! Atomic projection of a set of files into a volume directory, the scheme
//! kubelet's `AtomicWriter` uses (and that applications watch for):
//!
//! ```text
//! <dir>/key            -> ..data/key           (one symlink per top-level name)
//! <dir>/..data         -> ..2026_01_31_12_00_00.123456789
//! <dir>/..2026_01_31_12_00_00.123456789/key    (the real files)
//! ```
//!
//! A new version is written into a fresh timestamped directory, then the
//! `..data` symlink is replaced with one `rename(2)` and the old directory
//! is removed. A reader resolving `<dir>/key` sees either the old or the
//! new file, never half of one; a reader that opens `..data` once sees one
//! complete version of every file. Paths beginning with `..` are reserved.
//! Nothing is written when the content is unchanged.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};

const DATA_DIR: &str = "..data";
const NEW_DATA_DIR: &str = "..data_tmp";
const MAX_FILE_NAME: usize = 255;
const MAX_PATH: usize = 4096;

/// One file to project: content, permission bits, and an optional owner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileProjection {
    /// File content.
    pub data: Vec<u8>,
    /// Permission bits (e.g. `0o644`).
    pub mode: u32,
    /// Owner to set on the file (`chown uid:-1`), when the pod's containers
    /// all run as this user.
    pub fs_user: Option<u32>,
}

/// Relative path → file.
pub type Payload = BTreeMap<String, FileProjection>;

/// Called with the new timestamped directory's name before it is published.
pub type SetPerms<'a> = &'a dyn Fn(&str) -> io::Result<()>;

/// Why a projection failed.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    /// A payload path that may not be written (absolute, `..`, too long).
    #[error("{0}")]
    InvalidPath(String),
    /// A filesystem operation failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done, with the path.
        context: String,
        /// The OS error.
        #[source]
        source: io::Error,
    },
}

fn io_err(context: impl Into<String>) -> impl FnOnce(io::Error) -> WriteError {
    let context = context.into();
    move |source| WriteError::Io { context, source }
}

/// Writes payloads atomically into one target directory. Not safe for
/// concurrent writers on the same directory: the caller serializes.
#[derive(Debug, Clone)]
pub struct AtomicWriter {
    target: PathBuf,
    log_context: String,
}

impl AtomicWriter {
    /// A writer for `target`, which must exist. `log_context` names the
    /// volume in logs (`pod ns/name volume v`).
    pub fn new(
        target: impl Into<PathBuf>,
        log_context: impl Into<String>,
    ) -> io::Result<AtomicWriter> {
        let target = target.into();
        std::fs::metadata(&target)?;
        Ok(AtomicWriter {
            target,
            log_context: log_context.into(),
        })
    }

    /// Projects `payload`: returns `Ok(true)` when a new version was
    /// published, `Ok(false)` when the content was already current.
    /// `set_perms` runs on the new timestamped directory's name after the
    /// files are written and before they are published (fsGroup ownership).
    pub fn write(
        &self,
        payload: &Payload,
        set_perms: Option<SetPerms<'_>>,
    ) -> Result<bool, WriteError> {
        let clean = validate_payload(payload)?;
        let data_dir = self.target.join(DATA_DIR);
        let old_ts = match std::fs::read_link(&data_dir) {
            Ok(p) => Some(p),
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => return Err(io_err(format!("reading link {}", data_dir.display()))(e)),
        };
        let old_ts_path = old_ts.as_ref().map(|p| self.target.join(p));

        let mut to_remove = BTreeSet::new();
        let mut should_write = true;
        if let Some(old) = &old_ts_path {
            to_remove = paths_to_remove(&clean, old)?;
            if !payload_differs(&clean, old)? && to_remove.is_empty() {
                should_write = false;
            }
        }

        if should_write {
            let ts_dir = self.new_timestamp_dir()?;
            let ts_name = file_name(&ts_dir);
            let published = self.fill_and_publish(&clean, &ts_dir, &ts_name, set_perms);
            if let Err(e) = published {
                if let Err(rm) = std::fs::remove_dir_all(&ts_dir) {
                    tracing::warn!(context = %self.log_context, dir = %ts_dir.display(), error = %rm, "could not remove unpublished data directory");
                }
                return Err(e);
            }
            tracing::debug!(context = %self.log_context, dir = %ts_name, "published new volume content");
        }

        self.create_user_visible_files(&clean)?;
        self.remove_user_visible_paths(&to_remove)?;

        if should_write && let Some(old) = old_ts_path {
            std::fs::remove_dir_all(&old)
                .or_else(ignore_not_found)
                .map_err(io_err(format!(
                    "removing old data directory {}",
                    old.display()
                )))?;
        }
        Ok(should_write)
    }

    fn fill_and_publish(
        &self,
        payload: &Payload,
        ts_dir: &Path,
        ts_name: &str,
        set_perms: Option<SetPerms<'_>>,
    ) -> Result<(), WriteError> {
        write_payload(payload, ts_dir)?;
        if let Some(f) = set_perms {
            f(ts_name).map_err(io_err(format!(
                "applying ownership to {}",
                self.target.display()
            )))?;
        }
        let tmp = self.target.join(NEW_DATA_DIR);
        // A crash between symlink and rename leaves this behind.
        std::fs::remove_file(&tmp)
            .or_else(ignore_not_found)
            .map_err(io_err(format!("removing stale {}", tmp.display())))?;
        symlink(ts_name, &tmp).map_err(io_err(format!("creating symlink {}", tmp.display())))?;
        let data = self.target.join(DATA_DIR);
        if let Err(e) = std::fs::rename(&tmp, &data) {
            let _ = std::fs::remove_file(&tmp);
            return Err(io_err(format!(
                "renaming {} to {}",
                tmp.display(),
                data.display()
            ))(e));
        }
        Ok(())
    }

    fn new_timestamp_dir(&self) -> Result<PathBuf, WriteError> {
        let stamp = jiff::Timestamp::now()
            .strftime("..%Y_%m_%d_%H_%M_%S.")
            .to_string();
        for _ in 0..100 {
            let dir = self
                .target
                .join(format!("{stamp}{}", rand::random::<u32>()));
            match std::fs::create_dir(&dir) {
                Ok(()) => {
                    // 0755 lets group and others traverse, whatever the umask.
                    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755))
                        .map_err(io_err(format!("setting mode of {}", dir.display())))?;
                    return Ok(dir);
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(io_err(format!("creating {}", dir.display()))(e)),
            }
        }
        Err(WriteError::Io {
            context: format!("creating a data directory in {}", self.target.display()),
            source: io::Error::from(io::ErrorKind::AlreadyExists),
        })
    }

    fn create_user_visible_files(&self, payload: &Payload) -> Result<(), WriteError> {
        let tops: BTreeSet<&str> = payload.keys().map(|p| top_component(p)).collect();
        for top in tops {
            let visible = self.target.join(top);
            match std::fs::read_link(&visible) {
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    symlink(Path::new(DATA_DIR).join(top), &visible)
                        .map_err(io_err(format!("creating symlink {}", visible.display())))?;
                }
                _ => {}
            }
        }
        Ok(())
    }

    fn remove_user_visible_paths(&self, paths: &BTreeSet<String>) -> Result<(), WriteError> {
        let mut last = Ok(());
        for p in paths.iter().filter(|p| !p.contains('/')) {
            let visible = self.target.join(p);
            if let Err(e) = std::fs::remove_file(&visible).or_else(ignore_not_found) {
                tracing::warn!(context = %self.log_context, path = %visible.display(), error = %e, "could not prune old visible path");
                last = Err(io_err(format!("removing {}", visible.display()))(e));
            }
        }
        last
    }
}

fn ignore_not_found(e: io::Error) -> io::Result<()> {
    if e.kind() == io::ErrorKind::NotFound {
        Ok(())
    } else {
        Err(e)
    }
}

fn file_name(p: &Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

fn top_component(p: &str) -> &str {
    p.split('/').next().unwrap_or(p)
}

/// Checks every path and returns the payload keyed by cleaned paths.
fn validate_payload(payload: &Payload) -> Result<Payload, WriteError> {
    let mut clean = Payload::new();
    for (path, file) in payload {
        validate_path(path).map_err(WriteError::InvalidPath)?;
        clean.insert(clean_path(path), file.clone());
    }
    Ok(clean)
}

/// kubelet's rules: not empty, relative, no `..` element, no leading `..`
/// name, names ≤ 255 bytes, path ≤ 4096 bytes.
pub fn validate_path(path: &str) -> Result<(), String> {
    if path.is_empty() {
        return Err(format!("invalid path: must not be empty: {path:?}"));
    }
    if path.starts_with('/') {
        return Err(format!("invalid path: must be relative path: {path}"));
    }
    if path.len() > MAX_PATH {
        return Err(format!(
            "invalid path: must be less than or equal to {MAX_PATH} characters"
        ));
    }
    let items: Vec<&str> = path.split('/').collect();
    for item in &items {
        if *item == ".." {
            return Err(format!("invalid path: must not contain '..': {path}"));
        }
        if item.len() > MAX_FILE_NAME {
            return Err(format!(
                "invalid path: filenames must be less than or equal to {MAX_FILE_NAME} characters"
            ));
        }
    }
    if items[0].starts_with("..") && items[0].len() > 2 {
        return Err(format!("invalid path: must not start with '..': {path}"));
    }
    Ok(())
}

/// Go's `filepath.Clean` for the relative, `..`-free paths that pass
/// [`validate_path`].
fn clean_path(path: &str) -> String {
    let parts: Vec<&str> = path
        .split('/')
        .filter(|p| !p.is_empty() && *p != ".")
        .collect();
    if parts.is_empty() {
        ".".to_string()
    } else {
        parts.join("/")
    }
}

/// True when any file of the payload is missing or differs in `old_dir`.
fn payload_differs(payload: &Payload, old_dir: &Path) -> Result<bool, WriteError> {
    for (path, file) in payload {
        let p = old_dir.join(path);
        match std::fs::symlink_metadata(&p) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(true),
            Err(e) => return Err(io_err(format!("checking {}", p.display()))(e)),
            Ok(_) => {}
        }
        let on_disk = std::fs::read(&p).map_err(io_err(format!("reading {}", p.display())))?;
        if on_disk != file.data {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Paths present in the old version and absent (with their parents) from
/// the new payload.
fn paths_to_remove(payload: &Payload, old_dir: &Path) -> Result<BTreeSet<String>, WriteError> {
    let mut current = BTreeSet::new();
    match walk(old_dir, "", &mut current) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(BTreeSet::new()),
        Err(e) => return Err(io_err(format!("walking {}", old_dir.display()))(e)),
    }
    let mut wanted = BTreeSet::new();
    for path in payload.keys() {
        let mut p = path.as_str();
        loop {
            wanted.insert(p.to_string());
            match p.rfind('/') {
                Some(i) => p = &p[..i],
                None => break,
            }
        }
    }
    Ok(current.difference(&wanted).cloned().collect())
}

fn walk(dir: &Path, prefix: &str, out: &mut BTreeSet<String>) -> io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let rel = if prefix.is_empty() {
            name
        } else {
            format!("{prefix}/{name}")
        };
        let is_dir = entry.file_type()?.is_dir();
        out.insert(rel.clone());
        if is_dir {
            walk(&entry.path(), &rel, out)?;
        }
    }
    Ok(())
}

fn write_payload(payload: &Payload, dir: &Path) -> Result<(), WriteError> {
    for (path, file) in payload {
        let full = dir.join(path);
        if let Some(parent) = full.parent() {
            std::fs::create_dir_all(parent)
                .map_err(io_err(format!("creating directory {}", parent.display())))?;
        }
        std::fs::write(&full, &file.data).map_err(io_err(format!(
            "writing file {} with mode {:04o}",
            full.display(),
            file.mode
        )))?;
        // The umask applied at creation; set the exact mode.
        std::fs::set_permissions(&full, std::fs::Permissions::from_mode(file.mode)).map_err(
            io_err(format!(
                "setting mode {:04o} on {}",
                file.mode,
                full.display()
            )),
        )?;
        if let Some(uid) = file.fs_user {
            std::os::unix::fs::chown(&full, Some(uid), None).map_err(io_err(format!(
                "changing owner of {} to {uid}",
                full.display()
            )))?;
        }
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    fn file(data: &str, mode: u32) -> FileProjection {
        FileProjection {
            data: data.as_bytes().to_vec(),
            mode,
            fs_user: None,
        }
    }

    fn ts_dirs(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("..") && n != DATA_DIR)
            .collect();
        v.sort();
        v
    }

    #[test]
    fn layout_modes_and_update() {
        let tmp = tempfile::tempdir().unwrap();
        let w = AtomicWriter::new(tmp.path(), "test").unwrap();
        let mut p = Payload::new();
        p.insert("a".into(), file("one", 0o644));
        p.insert("sub/dir/b".into(), file("two", 0o400));
        assert!(w.write(&p, None).unwrap());

        let data = std::fs::read_link(tmp.path().join("..data")).unwrap();
        let name = data.to_string_lossy().into_owned();
        assert!(name.starts_with("..") && name.len() > 22, "{name}");
        assert_eq!(
            std::fs::read_link(tmp.path().join("a")).unwrap(),
            PathBuf::from("..data/a")
        );
        assert_eq!(
            std::fs::read_link(tmp.path().join("sub")).unwrap(),
            PathBuf::from("..data/sub")
        );
        assert_eq!(
            std::fs::read_to_string(tmp.path().join("sub/dir/b")).unwrap(),
            "two"
        );
        let meta = |p: &str| std::fs::metadata(tmp.path().join(p)).unwrap().mode() & 0o7777;
        assert_eq!(meta("a"), 0o644);
        assert_eq!(meta("sub/dir/b"), 0o400);
        assert_eq!(meta("..data"), 0o755);

        // Unchanged: nothing written.
        assert!(!w.write(&p, None).unwrap());
        assert_eq!(ts_dirs(tmp.path()), vec![name.clone()]);

        // Remove `sub`, change `a`, add `c`.
        let mut q = Payload::new();
        q.insert("a".into(), file("uno", 0o644));
        q.insert("c".into(), file("three", 0o644));
        assert!(w.write(&q, None).unwrap());
        assert_eq!(
            std::fs::read_to_string(tmp.path().join("a")).unwrap(),
            "uno"
        );
        assert!(std::fs::symlink_metadata(tmp.path().join("sub")).is_err());
        assert_eq!(
            std::fs::read_to_string(tmp.path().join("c")).unwrap(),
            "three"
        );
        let dirs = ts_dirs(tmp.path());
        assert_eq!(dirs.len(), 1);
        assert_ne!(dirs[0], name, "old data directory removed");
    }

    #[test]
    fn set_perms_runs_before_publish() {
        let tmp = tempfile::tempdir().unwrap();
        let w = AtomicWriter::new(tmp.path(), "test").unwrap();
        let mut p = Payload::new();
        p.insert("a".into(), file("x", 0o644));
        let target = tmp.path().to_path_buf();
        let seen = std::sync::Mutex::new(None);
        let f = |ts: &str| {
            // Not yet published.
            assert!(std::fs::read_link(target.join("..data")).is_err());
            *seen.lock().unwrap() = Some(ts.to_string());
            Ok(())
        };
        w.write(&p, Some(&f)).unwrap();
        let published = std::fs::read_link(tmp.path().join("..data")).unwrap();
        assert_eq!(
            seen.lock().unwrap().clone(),
            Some(published.to_string_lossy().into_owned())
        );
    }

    #[test]
    fn failed_set_perms_publishes_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        let w = AtomicWriter::new(tmp.path(), "test").unwrap();
        let mut p = Payload::new();
        p.insert("a".into(), file("x", 0o644));
        let f = |_: &str| Err(io::Error::other("boom"));
        let err = w.write(&p, Some(&f)).unwrap_err();
        assert!(err.to_string().contains("boom"), "{err}");
        assert!(std::fs::read_dir(tmp.path()).unwrap().next().is_none());
    }

    #[test]
    fn invalid_paths() {
        for (p, want) in [
            ("", "invalid path: must not be empty: \"\""),
            ("/abs", "invalid path: must be relative path: /abs"),
            ("a/../b", "invalid path: must not contain '..': a/../b"),
            ("..data", "invalid path: must not start with '..': ..data"),
        ] {
            assert_eq!(validate_path(p).unwrap_err(), want);
        }
        assert!(validate_path(&"x".repeat(256)).is_err());
        assert!(validate_path("..").is_err());
        assert!(validate_path("a/..b").is_ok());
        assert_eq!(clean_path("a//./b/"), "a/b");
    }

    #[test]
    fn empty_payload_clears_visible_files() {
        let tmp = tempfile::tempdir().unwrap();
        let w = AtomicWriter::new(tmp.path(), "test").unwrap();
        let mut p = Payload::new();
        p.insert("a".into(), file("x", 0o644));
        w.write(&p, None).unwrap();
        assert!(w.write(&Payload::new(), None).unwrap());
        let names: Vec<String> = std::fs::read_dir(tmp.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| !n.starts_with(".."))
            .collect();
        assert!(names.is_empty(), "{names:?}");
    }
}
