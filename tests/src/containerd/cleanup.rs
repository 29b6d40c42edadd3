//! Removing every trace of a containerd instance: its processes (containerd,
//! shims, the containers themselves), mounts, cgroups, network namespace,
//! CNI cache entries, shim sockets and directories. Used on drop and, at
//! start, for instances whose owning test process died (a killed run).

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use sha2::{Digest, Sha256};

/// Parent directory of every instance directory.
pub const BASE_DIR: &str = "/var/tmp/keelson-containerd";
/// Prefix of every instance's cgroup parent (`/keelson-test-<suffix>`).
pub const CGROUP_PREFIX: &str = "keelson-test-";
/// Prefix of every instance's CNI network name.
pub const NETWORK_PREFIX: &str = "keelson-test-";
/// containerd 1.6 puts shim sockets here whatever its state dir is.
const SHIM_SOCKET_DIR: &str = "/run/containerd/s";
/// libcni's result cache.
const CNI_RESULTS_DIR: &str = "/var/lib/cni/results";
/// Where cgroup hierarchies are mounted.
const CGROUP_ROOT: &str = "/sys/fs/cgroup";
/// Directories containerd, its shims and libcni create on first use; removed
/// again when empty (on a node with a real runtime they never are).
const SHARED_PARENTS: &[&str] = &[
    SHIM_SOCKET_DIR,
    "/run/containerd",
    CNI_RESULTS_DIR,
    "/var/lib/cni",
];

/// An exclusive lock over the instance directories, held while an
/// instance is being registered (dir + owner file) and while stale ones
/// are removed, so concurrent test processes never take a half-created
/// instance for a stale one.
pub struct BaseLock {
    _lock: nix::fcntl::Flock<fs::File>,
}

impl BaseLock {
    /// Blocks until the lock is ours.
    pub fn acquire() -> std::io::Result<BaseLock> {
        fs::create_dir_all(BASE_DIR)?;
        let file = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(Path::new(BASE_DIR).join(".lock"))?;
        let lock = nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusive)
            .map_err(|(_, errno)| std::io::Error::from(errno))?;
        Ok(BaseLock { _lock: lock })
    }
}

/// The identity of a process that survives pid reuse: pid + start time.
pub fn process_identity(pid: u32) -> Option<String> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may contain spaces) start after ')'.
    let rest = stat.rsplit_once(')')?.1;
    let start_time = rest.split_whitespace().nth(19)?;
    Some(format!("{pid} {start_time}"))
}

/// Whether the process recorded as `identity` still runs.
pub fn identity_alive(identity: &str) -> bool {
    let Some(pid) = identity
        .split_whitespace()
        .next()
        .and_then(|p| p.parse::<u32>().ok())
    else {
        return false;
    };
    process_identity(pid).as_deref() == Some(identity.trim())
}

fn cmdline(pid: u32) -> Option<Vec<String>> {
    let raw = fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    Some(
        raw.split(|b| *b == 0)
            .filter(|s| !s.is_empty())
            .map(|s| String::from_utf8_lossy(s).into_owned())
            .collect(),
    )
}

fn all_pids() -> Vec<u32> {
    fs::read_dir("/proc")
        .map(|rd| {
            rd.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Processes whose command line names the directory `dir` (an instance
/// path) or a path below it: that instance's containerd (`--config
/// <dir>/config.toml`) and its shims (`-address <dir>/containerd.sock`).
pub fn processes_mentioning(dir: &str) -> Vec<u32> {
    let me = std::process::id();
    all_pids()
        .into_iter()
        .filter(|pid| *pid != me)
        .filter(|pid| cmdline(*pid).is_some_and(|args| args.iter().any(|a| names_path(a, dir))))
        .collect()
}

/// Whether `arg` contains the path `dir` as a whole: `dir` itself or
/// `dir/...`, never a sibling that merely starts with the same text
/// (instance `<pid>-1` must not claim the processes of `<pid>-10`, which
/// the same test process may be running at the same time).
fn names_path(arg: &str, dir: &str) -> bool {
    let dir = dir.trim_end_matches('/');
    !dir.is_empty()
        && arg
            .match_indices(dir)
            .any(|(at, _)| matches!(arg[at + dir.len()..].chars().next(), None | Some('/')))
}

fn sigkill(pid: u32) {
    if let Ok(raw) = i32::try_from(pid) {
        let _ = kill(Pid::from_raw(raw), Signal::SIGKILL);
    }
}

/// Every cgroup directory of `/<name>` in every hierarchy (v1 controllers
/// and the unified one), deepest first.
pub fn cgroup_dirs(name: &str) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    let Ok(hierarchies) = fs::read_dir(CGROUP_ROOT) else {
        return dirs;
    };
    for h in hierarchies.flatten() {
        let top = h.path().join(name);
        if top.is_dir() {
            collect_dirs(&top, &mut dirs);
        }
    }
    dirs.sort_by_key(|d| std::cmp::Reverse(d.components().count()));
    dirs
}

fn collect_dirs(dir: &Path, out: &mut Vec<PathBuf>) {
    out.push(dir.to_path_buf());
    if let Ok(rd) = fs::read_dir(dir) {
        for e in rd.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                collect_dirs(&e.path(), out);
            }
        }
    }
}

/// Pids in the cgroup subtree `/<name>` of any hierarchy.
pub fn cgroup_pids(name: &str) -> BTreeSet<u32> {
    cgroup_dirs(name)
        .iter()
        .filter_map(|d| fs::read_to_string(d.join("cgroup.procs")).ok())
        .flat_map(|s| {
            s.lines()
                .filter_map(|l| l.trim().parse::<u32>().ok())
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Mount points at or under `dir`, deepest first.
pub fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    let Ok(info) = fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    let mut points: Vec<PathBuf> = info
        .lines()
        .filter_map(|l| l.split_whitespace().nth(4))
        .map(unescape_mount_path)
        .map(PathBuf::from)
        .filter(|p| p.starts_with(dir))
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    points.dedup();
    points
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape_mount_path(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && i + 3 < bytes.len()
            && let Some(v) = std::str::from_utf8(&bytes[i + 1..i + 4])
                .ok()
                .and_then(|o| u8::from_str_radix(o, 8).ok())
        {
            out.push(v);
            i += 4;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Names of the tasks (sandbox and container ids) containerd has state for.
pub fn task_ids(dir: &Path) -> Vec<String> {
    let tasks = dir.join("state/io.containerd.runtime.v2.task/k8s.io");
    fs::read_dir(tasks)
        .map(|rd| {
            rd.filter_map(|e| e.ok()?.file_name().to_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// The socket path containerd 1.6 derives for a shim: sha256 of
/// `<containerd address>/<namespace>/<id>` under /run/containerd/s.
pub fn shim_socket(containerd_socket: &Path, id: &str) -> PathBuf {
    let key = containerd_socket.join("k8s.io").join(id);
    let digest = hex::encode(Sha256::digest(key.to_string_lossy().as_bytes()));
    Path::new(SHIM_SOCKET_DIR).join(digest)
}

/// What is recorded about an instance, read back from its directory.
#[derive(Debug, Clone)]
pub struct Instance {
    /// Instance directory.
    pub dir: PathBuf,
    /// Suffix (the directory name).
    pub suffix: String,
}

impl Instance {
    /// The instance with this suffix.
    pub fn new(suffix: &str) -> Instance {
        Instance {
            dir: Path::new(BASE_DIR).join(suffix),
            suffix: suffix.to_string(),
        }
    }

    /// The cgroup parent pods of this instance go under (leading slash).
    pub fn cgroup_parent(&self) -> String {
        format!("/{CGROUP_PREFIX}{}", self.suffix)
    }

    /// The CNI network name.
    pub fn network(&self) -> String {
        format!("{NETWORK_PREFIX}{}", self.suffix)
    }

    /// containerd's socket.
    pub fn socket(&self) -> PathBuf {
        self.dir.join("containerd.sock")
    }

    fn read(&self, file: &str) -> Option<String> {
        fs::read_to_string(self.dir.join(file))
            .ok()
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
    }

    /// Whether the test process that created the instance still runs.
    pub fn owner_alive(&self) -> bool {
        self.read("owner").is_some_and(|o| identity_alive(&o))
    }

    /// Name of its network namespace, if recorded.
    pub fn netns(&self) -> Option<String> {
        self.read("netns")
    }

    /// Kills every process of the instance: containerd, its shims and the
    /// containers (by their cgroups), waiting up to `wait` for them to go.
    pub fn kill_processes(&self, wait: Duration) {
        let needle = self.dir.to_string_lossy().into_owned();
        let cgroup = self.cgroup_parent();
        let cgroup = cgroup.trim_start_matches('/');
        let deadline = Instant::now() + wait;
        loop {
            let mut pids: BTreeSet<u32> = processes_mentioning(&needle).into_iter().collect();
            pids.extend(cgroup_pids(cgroup));
            pids.remove(&std::process::id());
            if pids.is_empty() || Instant::now() >= deadline {
                return;
            }
            for pid in pids {
                sigkill(pid);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Unmounts everything under the instance directory (overlay rootfs,
    /// shm, netns bind mounts), deepest first, lazily.
    pub fn unmount_all(&self) {
        for _ in 0..5 {
            let points = mounts_under(&self.dir);
            if points.is_empty() {
                return;
            }
            for p in points {
                if let Err(e) = nix::mount::umount2(&p, nix::mount::MntFlags::MNT_DETACH) {
                    eprintln!("warning: unmounting {}: {e}", p.display());
                }
            }
        }
    }

    /// Removes the instance's cgroups (empty after the kill), deepest first.
    pub fn remove_cgroups(&self) {
        let name = self.cgroup_parent();
        for dir in cgroup_dirs(name.trim_start_matches('/')) {
            if let Err(e) = fs::remove_dir(&dir) {
                eprintln!("warning: removing cgroup {}: {e}", dir.display());
            }
        }
    }

    /// Removes what containerd, the shims and CNI left outside the
    /// instance directory: shim sockets and CNI result cache entries.
    pub fn remove_outside_files(&self) {
        let socket = self.socket();
        for id in task_ids(&self.dir) {
            let _ = fs::remove_file(shim_socket(&socket, &id));
            // go-cni's loopback network has a fixed name; its cache entry
            // is keyed by the sandbox id.
            let _ =
                fs::remove_file(Path::new(CNI_RESULTS_DIR).join(format!("cni-loopback-{id}-lo")));
        }
        let prefix = format!("{}-", self.network());
        if let Ok(rd) = fs::read_dir(CNI_RESULTS_DIR) {
            for e in rd.flatten() {
                if e.file_name().to_string_lossy().starts_with(&prefix) {
                    let _ = fs::remove_file(e.path());
                }
            }
        }
        for dir in SHARED_PARENTS {
            // Fails (and so keeps the dir) unless it is empty.
            let _ = fs::remove_dir(dir);
        }
    }

    /// Everything after the processes are gone: mounts, cgroups, outside
    /// files, and last the directory itself.
    pub fn remove_everything_else(&self) {
        self.unmount_all();
        self.remove_cgroups();
        self.remove_outside_files();
        if self.dir.exists()
            && let Err(e) = fs::remove_dir_all(&self.dir)
        {
            eprintln!("warning: removing {}: {e}", self.dir.display());
        }
    }

    /// Full cleanup of an instance whose owner died: processes, netns,
    /// mounts, cgroups, files.
    pub fn remove_stale(&self) {
        self.kill_processes(Duration::from_secs(10));
        if let Some(ns) = self.netns() {
            let _ = crate::netns::ip(&["netns", "del", &ns]);
        }
        self.remove_everything_else();
    }

    /// The ids of the sandboxes and containers containerd has task state
    /// for (read them before a cleanup to check [`cni_cache_leftovers`]).
    pub fn task_ids(&self) -> Vec<String> {
        task_ids(&self.dir)
    }

    /// What is left of this instance on the machine (empty = nothing).
    pub fn leftovers(&self) -> Vec<String> {
        let mut left = cni_cache_leftovers(&self.task_ids());
        if self.dir.exists() {
            left.push(format!("directory {}", self.dir.display()));
        }
        for m in mounts_under(&self.dir) {
            left.push(format!("mount {}", m.display()));
        }
        let needle = self.dir.to_string_lossy().into_owned();
        for pid in processes_mentioning(&needle) {
            left.push(format!(
                "process {pid} {:?}",
                cmdline(pid).unwrap_or_default()
            ));
        }
        let cg = self.cgroup_parent();
        let cg = cg.trim_start_matches('/');
        for pid in cgroup_pids(cg) {
            left.push(format!("process {pid} in cgroup {cg}"));
        }
        for d in cgroup_dirs(cg) {
            left.push(format!("cgroup {}", d.display()));
        }
        if let Some(ns) = self.netns()
            && Path::new("/run/netns").join(&ns).exists()
        {
            left.push(format!("netns {ns}"));
        }
        let prefix = format!("{}-", self.network());
        if let Ok(rd) = fs::read_dir(CNI_RESULTS_DIR) {
            for e in rd.flatten() {
                if e.file_name().to_string_lossy().starts_with(&prefix) {
                    left.push(format!("CNI cache {}", e.path().display()));
                }
            }
        }
        left
    }
}

/// CNI result cache entries that name one of `ids`.
pub fn cni_cache_leftovers(ids: &[String]) -> Vec<String> {
    let Ok(rd) = fs::read_dir(CNI_RESULTS_DIR) else {
        return Vec::new();
    };
    rd.flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|name| ids.iter().any(|id| name.contains(id.as_str())))
        .map(|name| format!("CNI cache {CNI_RESULTS_DIR}/{name}"))
        .collect()
}

/// Cleans up every instance whose owning test process is gone (a killed
/// run). Instances of live processes (parallel tests) are left alone.
/// Call with the [`BaseLock`] held.
pub fn remove_stale_instances() {
    let Ok(rd) = fs::read_dir(BASE_DIR) else {
        return;
    };
    for e in rd.flatten() {
        if !e.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        let suffix = e.file_name().to_string_lossy().into_owned();
        let inst = Instance::new(&suffix);
        if !inst.owner_alive() {
            eprintln!(
                "removing stale containerd test instance {}",
                inst.dir.display()
            );
            inst.remove_stale();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_instance_path_names_itself_and_what_is_below_it_not_its_siblings() {
        let dir = "/var/tmp/keelson-containerd/1234-1";
        assert!(names_path(
            "/var/tmp/keelson-containerd/1234-1/config.toml",
            dir
        ));
        assert!(names_path(
            "-address=/var/tmp/keelson-containerd/1234-1/containerd.sock",
            dir
        ));
        assert!(names_path(dir, dir));
        assert!(names_path(dir, "/var/tmp/keelson-containerd/1234-1/"));
        assert!(!names_path(
            "/var/tmp/keelson-containerd/1234-10/config.toml",
            dir
        ));
        assert!(!names_path("/var/tmp/keelson-containerd/1234-10", dir));
        assert!(names_path(
            "/var/tmp/keelson-containerd/1234-10:/var/tmp/keelson-containerd/1234-1/x",
            dir
        ));
        assert!(!names_path("anything", ""));
    }

    #[test]
    fn own_identity_is_alive_and_a_made_up_one_is_not() {
        let me = process_identity(std::process::id()).expect("identity");
        assert!(identity_alive(&me));
        let pid = std::process::id();
        assert!(!identity_alive(&format!("{pid} 1")));
        assert!(!identity_alive("garbage"));
    }

    #[test]
    fn mount_paths_are_unescaped() {
        assert_eq!(unescape_mount_path("/a\\040b"), "/a b");
        assert_eq!(unescape_mount_path("/plain"), "/plain");
    }

    #[test]
    fn shim_socket_is_derived_from_address_namespace_and_id() {
        let p = shim_socket(Path::new("/x/containerd.sock"), "abc");
        let want = hex::encode(Sha256::digest(b"/x/containerd.sock/k8s.io/abc"));
        assert_eq!(p, Path::new("/run/containerd/s").join(want));
    }
}
