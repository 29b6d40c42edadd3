//! Directories of the upstream tier under a base dir, each owned by the
//! test process that made it (`owner`: pid + start time) and naming its
//! network namespace (`netns`). A directory whose owner is gone is a
//! killed run's: its processes (found by their command lines, which name
//! the directory), namespace, mounts and files are removed by the next
//! [`register`].

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use super::UpstreamError;
use super::daemon::Daemon;
use crate::containerd::{identity_alive, mounts_under, process_identity, processes_mentioning};

/// Creates `<base>/<unique>` owned by this process, after removing the
/// directories of dead owners.
pub fn register(base: &str) -> Result<PathBuf, UpstreamError> {
    std::fs::create_dir_all(base).map_err(UpstreamError::io(format!("creating {base}")))?;
    if let Ok(rd) = std::fs::read_dir(base) {
        for e in rd.flatten() {
            let dir = e.path();
            let owner = std::fs::read_to_string(dir.join("owner")).unwrap_or_default();
            if !identity_alive(owner.trim()) {
                eprintln!("removing stale upstream tier directory {}", dir.display());
                kill_mentioning(&dir);
                remove(&dir);
            }
        }
    }
    let dir = Path::new(base).join(crate::netns::unique_suffix());
    std::fs::create_dir_all(&dir)
        .map_err(UpstreamError::io(format!("creating {}", dir.display())))?;
    let me = process_identity(std::process::id()).ok_or_else(|| UpstreamError::Setup {
        context: "recording the owner".into(),
        message: "cannot read /proc/self/stat".into(),
    })?;
    std::fs::write(dir.join("owner"), me).map_err(UpstreamError::io("writing owner"))?;
    Ok(dir)
}

/// SIGKILLs every process whose command line names `dir`, until none is
/// left (or 10 s passed).
pub fn kill_mentioning(dir: &Path) {
    let needle = dir.to_string_lossy().into_owned();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let pids = processes_mentioning(&needle);
        if pids.is_empty() || Instant::now() >= deadline {
            return;
        }
        for pid in pids {
            if let Ok(raw) = i32::try_from(pid) {
                let _ = kill(Pid::from_raw(raw), Signal::SIGKILL);
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Removes the namespace named in `dir/netns`, every mount under `dir`,
/// and `dir`.
pub fn remove(dir: &Path) {
    if let Ok(ns) = std::fs::read_to_string(dir.join("netns")) {
        let ns = ns.trim();
        if !ns.is_empty() && Path::new("/run/netns").join(ns).exists() {
            let _ = crate::netns::ip(&["netns", "del", ns]);
        }
    }
    for p in mounts_under(dir) {
        let _ = nix::mount::umount2(&p, nix::mount::MntFlags::MNT_DETACH);
    }
    if dir.exists()
        && let Err(e) = std::fs::remove_dir_all(dir)
    {
        eprintln!("warning: removing {}: {e}", dir.display());
    }
}

/// A start in progress: stops what was started and removes the directory
/// unless [`Partial::disarm`] is called.
#[derive(Debug)]
pub struct Partial {
    dir: PathBuf,
    /// Processes started so far (stopped on failure, newest first).
    pub daemons: Vec<Daemon>,
    armed: bool,
}

impl Partial {
    /// Guards `dir`.
    pub fn new(dir: PathBuf) -> Partial {
        Partial {
            dir,
            daemons: Vec::new(),
            armed: true,
        }
    }

    /// The start succeeded: leave everything in place.
    pub fn disarm(&mut self) {
        self.armed = false;
    }
}

impl Drop for Partial {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        while let Some(mut d) = self.daemons.pop() {
            d.stop();
        }
        kill_mentioning(&self.dir);
        remove(&self.dir);
    }
}
