//! What the eBPF system tests need around the socket LB: a cgroup v2 child
//! this test process moves in and out of (sockets created inside it are
//! load-balanced), and a private bpffs for keelson's pins. Both are removed
//! on drop.
//!
//! Moving the process is process-wide: while it sits in a test's cgroup,
//! every socket any thread of the process creates is load-balanced by that
//! test's programs, and every child it starts is born in that cgroup (and
//! keeps the cgroup from being removed). So:
//! - [`TestCgroup::enter`] takes the *process-cgroup turn*, a process-wide
//!   lock held until [`TestCgroup::leave`] (or drop): two tests of one
//!   binary never move the process at the same time. A [`TestCgroup`] that
//!   is only an attach target (never entered) does not take it.
//! - The tests that enter a cgroup live in their own test binary,
//!   `tests/tests/system_process_cgroup/`, beside nothing that starts
//!   long-lived processes or connects to the Service case table's VIPs:
//!   the other tests of the system tier do not take the turn and must not
//!   share a process with them.

use std::path::{Path, PathBuf};
use std::sync::{Condvar, Mutex, PoisonError};
use std::time::Duration;

use keelson_netplane::ebpf::{EbpfConfig, cgroup2_root, ensure_bpffs};

use crate::netns::unique_suffix;

/// Whether some [`TestCgroup`] of this process holds the turn (the process
/// is inside that test's cgroup).
static TURN_TAKEN: Mutex<bool> = Mutex::new(false);
/// Signalled when the turn is given back.
static TURN_FREED: Condvar = Condvar::new();

/// Longest a test waits for another test of its binary to give the turn
/// back (the longest holder, the endpoint churn, takes a few minutes).
const TURN_DEADLINE: Duration = Duration::from_secs(15 * 60);

/// The process-cgroup turn; given back on drop.
#[derive(Debug)]
struct Turn;

impl Turn {
    fn take(cgroup: &Path) -> Turn {
        let taken = TURN_TAKEN.lock().unwrap_or_else(PoisonError::into_inner);
        let (mut taken, waited) = TURN_FREED
            .wait_timeout_while(taken, TURN_DEADLINE, |taken| *taken)
            .unwrap_or_else(PoisonError::into_inner);
        assert!(
            !waited.timed_out() || !*taken,
            "waited {TURN_DEADLINE:?} for another test of this binary to move the process out \
             of its cgroup before entering {}",
            cgroup.display()
        );
        *taken = true;
        Turn
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        *TURN_TAKEN.lock().unwrap_or_else(PoisonError::into_inner) = false;
        TURN_FREED.notify_all();
    }
}

/// A cgroup v2 child the test creates; this process moves in and out of it.
/// Dropping it moves the process back and removes the cgroup.
#[derive(Debug)]
pub struct TestCgroup {
    /// The cgroup's directory.
    pub path: PathBuf,
    home: PathBuf,
    /// Held while the process is inside `path`.
    turn: Mutex<Option<Turn>>,
}

impl TestCgroup {
    /// Creates `<cgroup2 root>/kt-<prefix>-<unique>`.
    pub fn new(prefix: &str) -> TestCgroup {
        let root = cgroup2_root().expect("a cgroup v2 hierarchy");
        let own = std::fs::read_to_string("/proc/self/cgroup").expect("/proc/self/cgroup");
        let rel = own
            .lines()
            .find_map(|l| l.strip_prefix("0::"))
            .expect("this process has a cgroup v2 path");
        let home = root.join(rel.trim_start_matches('/'));
        let path = root.join(format!("kt-{prefix}-{}", unique_suffix()));
        std::fs::create_dir(&path).expect("create test cgroup");
        TestCgroup {
            path,
            home,
            turn: Mutex::new(None),
        }
    }

    fn join(&self, dir: &Path) {
        std::fs::write(dir.join("cgroup.procs"), std::process::id().to_string())
            .unwrap_or_else(|e| panic!("moving this process to {}: {e}", dir.display()));
    }

    /// Sockets created from now on are load-balanced (node or pod origin).
    /// Waits for the process-cgroup turn first (see the module's doc).
    pub fn enter(&self) {
        let mut turn = self.turn.lock().unwrap_or_else(PoisonError::into_inner);
        if turn.is_none() {
            *turn = Some(Turn::take(&self.path));
        }
        self.join(&self.path);
    }

    /// Sockets created from now on are not (outside client). Gives the
    /// process-cgroup turn back; does nothing when this cgroup was not
    /// entered (the process is not inside it, and another test's cgroup
    /// may hold it).
    pub fn leave(&self) {
        let mut turn = self.turn.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(held) = turn.take() {
            self.join(&self.home);
            drop(held);
        }
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        let turn = self
            .turn
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(held) = turn {
            let _ = std::fs::write(
                self.home.join("cgroup.procs"),
                std::process::id().to_string(),
            );
            drop(held);
        }
        // A short-lived child another test started while the process was
        // inside (`ip`, `nft`) may take a moment to leave the cgroup.
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        loop {
            match std::fs::remove_dir(&self.path) {
                Ok(()) => break,
                Err(e)
                    if e.raw_os_error() == Some(libc::EBUSY)
                        && std::time::Instant::now() < deadline =>
                {
                    std::thread::sleep(Duration::from_millis(50));
                }
                Err(e) => {
                    eprintln!("warning: removing {}: {e}", self.path.display());
                    break;
                }
            }
        }
    }
}

/// A bpffs mounted for the test under `/tmp`; pins and mount removed on
/// drop.
#[derive(Debug)]
pub struct TestBpffs {
    /// The socket LB's configuration: `cgroup_path` as given, `bpffs_path`
    /// in the private mount.
    pub config: EbpfConfig,
}

impl TestBpffs {
    /// Mounts a private bpffs; the socket LB attaches to `cgroup`.
    pub fn new(cgroup: &Path) -> TestBpffs {
        let dir = PathBuf::from(format!("/tmp/kt-bpffs-{}", unique_suffix()));
        std::fs::create_dir_all(&dir).expect("bpffs dir");
        let bpffs = TestBpffs {
            config: EbpfConfig {
                cgroup_path: Some(cgroup.to_path_buf()),
                bpffs_path: dir.join("keelson"),
            },
        };
        ensure_bpffs(&dir).expect("mount bpffs");
        bpffs
    }
}

impl Drop for TestBpffs {
    fn drop(&mut self) {
        if let Err(e) = keelson_netplane::ebpf::cleanup(&self.config) {
            eprintln!("warning: eBPF cleanup: {e}");
        }
        if let Some(dir) = self.config.bpffs_path.parent() {
            if let Err(e) = nix::mount::umount2(dir, nix::mount::MntFlags::MNT_DETACH) {
                eprintln!("warning: umount {}: {e}", dir.display());
            }
            let _ = std::fs::remove_dir(dir);
        }
    }
}
