//! The narrow interface to the cgroup filesystem that both hierarchies
//! implement, and the resource settings kubelet writes (its `ResourceConfig`).

use std::path::PathBuf;

use super::name::CgroupName;

/// Resource limits of a cgroup. `None` leaves the kernel's value alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ResourceConfig {
    /// CPU shares (v1 `cpu.shares`; v2 `cpu.weight` is derived from it).
    pub cpu_shares: Option<u64>,
    /// CFS quota in microseconds per period; -1 means no limit.
    pub cpu_quota: Option<i64>,
    /// CFS period in microseconds.
    pub cpu_period: Option<u64>,
    /// Memory limit in bytes.
    pub memory: Option<i64>,
    /// Maximum number of tasks; -1 means no limit.
    pub pids_limit: Option<i64>,
}

/// What went wrong touching a cgroup.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    /// A cgroup file or directory could not be read, written or removed.
    #[error("cgroup {path}: {action}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// What was being done.
        action: &'static str,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// The host's cgroup layout could not be understood.
    #[error("cgroup layout: {0}")]
    Layout(String),
    /// systemd refused or failed a request of the systemd driver.
    #[error("cgroup driver systemd: {0}")]
    Systemd(String),
    /// Processes were still in the cgroup after being killed.
    #[error("cgroup {name}: processes still present after kill: {pids:?}")]
    Busy {
        /// The cgroup.
        name: String,
        /// The processes left.
        pids: Vec<i32>,
    },
}

impl CgroupError {
    pub(crate) fn io(
        path: impl Into<PathBuf>,
        action: &'static str,
        source: std::io::Error,
    ) -> Self {
        CgroupError::Io {
            path: path.into(),
            action,
            source,
        }
    }
}

/// A cgroup hierarchy (v1 or v2) keelson manages cgroups in.
pub trait CgroupFs: Send + Sync + std::fmt::Debug {
    /// `"v1"` or `"v2"`.
    fn version(&self) -> &'static str;

    /// The cgroup's path as the driver names it on the host (kubelet's
    /// `CgroupManager.Name`): `/a/b/c` for cgroupfs; the systemd driver
    /// expands slices (`/a.slice/a-b.slice/a-b-c.slice`). The container
    /// runtime gets this as a sandbox's cgroup parent.
    fn literal_name(&self, name: &CgroupName) -> String {
        name.to_cgroupfs()
    }

    /// Creates `name` (and missing ancestors) and applies `resources`.
    /// Creating an existing cgroup only applies the resources.
    fn create(&self, name: &CgroupName, resources: &ResourceConfig) -> Result<(), CgroupError>;

    /// Applies `resources` to an existing cgroup.
    fn update(&self, name: &CgroupName, resources: &ResourceConfig) -> Result<(), CgroupError>;

    /// Whether the cgroup exists (in every controller keelson uses).
    fn exists(&self, name: &CgroupName) -> bool;

    /// The processes in the cgroup and its descendants.
    fn pids(&self, name: &CgroupName) -> Result<Vec<i32>, CgroupError>;

    /// Kills every process in the cgroup and its descendants, then removes
    /// them all, deepest first. A missing cgroup is not an error.
    fn destroy(&self, name: &CgroupName) -> Result<(), CgroupError>;

    /// The names of the direct children of `name`.
    fn children(&self, name: &CgroupName) -> Result<Vec<String>, CgroupError>;

    /// The resources currently set (for tests and the resize path).
    fn read(&self, name: &CgroupName) -> Result<ResourceConfig, CgroupError>;
}

/// Reads the pids listed in a `cgroup.procs` file (missing file: none).
pub(crate) fn read_procs(path: &std::path::Path) -> Result<Vec<i32>, CgroupError> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(text
            .lines()
            .filter_map(|l| l.trim().parse::<i32>().ok())
            .collect()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(CgroupError::io(path, "reading cgroup.procs", e)),
    }
}

/// Writes a control file.
pub(crate) fn write_file(path: &std::path::Path, value: &str) -> Result<(), CgroupError> {
    std::fs::write(path, value).map_err(|e| CgroupError::io(path, "writing", e))
}

/// Reads a control file, trimmed (missing: `None`).
pub(crate) fn read_file(path: &std::path::Path) -> Result<Option<String>, CgroupError> {
    match std::fs::read_to_string(path) {
        Ok(t) => Ok(Some(t.trim().to_string())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(CgroupError::io(path, "reading", e)),
    }
}

/// Every directory below `dir` (itself included), deepest first.
pub(crate) fn dirs_depth_first(dir: &std::path::Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    fn walk(d: &std::path::Path, out: &mut Vec<PathBuf>) {
        if let Ok(entries) = std::fs::read_dir(d) {
            for e in entries.flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    walk(&e.path(), out);
                }
            }
        }
        out.push(d.to_path_buf());
    }
    if dir.is_dir() {
        walk(dir, &mut out);
    }
    out
}

/// Sends SIGKILL to each pid (already-gone processes are fine).
pub(crate) fn kill_all(pids: &[i32]) {
    for &pid in pids {
        if pid > 0 {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

/// Removes a cgroup directory (cgroupfs directories are removed with
/// rmdir; their control files vanish with them). A fake tree made of plain
/// files is removed as a whole.
pub(crate) fn remove_dir(path: &std::path::Path) -> Result<(), CgroupError> {
    match std::fs::remove_dir(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) if e.raw_os_error() == Some(libc::ENOTEMPTY) => {
            // Not a cgroupfs (a fake tree in a test): plain files remain.
            std::fs::remove_dir_all(path).map_err(|e| CgroupError::io(path, "removing", e))
        }
        Err(e) => Err(CgroupError::io(path, "removing", e)),
    }
}
