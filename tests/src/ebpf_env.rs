//! What the eBPF system tests need around the socket LB: a cgroup v2 child
//! this test process moves in and out of (sockets created inside it are
//! load-balanced), and a private bpffs for keelson's pins. Both are removed
//! on drop.

use std::path::{Path, PathBuf};

use keelson_netplane::ebpf::{EbpfConfig, cgroup2_root, ensure_bpffs};

use crate::netns::unique_suffix;

/// A cgroup v2 child the test creates; this process moves in and out of it.
/// Dropping it moves the process back and removes the cgroup.
#[derive(Debug)]
pub struct TestCgroup {
    /// The cgroup's directory.
    pub path: PathBuf,
    home: PathBuf,
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
        TestCgroup { path, home }
    }

    fn join(&self, dir: &Path) {
        std::fs::write(dir.join("cgroup.procs"), std::process::id().to_string())
            .unwrap_or_else(|e| panic!("moving this process to {}: {e}", dir.display()));
    }

    /// Sockets created from now on are load-balanced (node or pod origin).
    pub fn enter(&self) {
        self.join(&self.path);
    }

    /// Sockets created from now on are not (outside client).
    pub fn leave(&self) {
        self.join(&self.home);
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        let _ = std::fs::write(
            self.home.join("cgroup.procs"),
            std::process::id().to_string(),
        );
        if let Err(e) = std::fs::remove_dir(&self.path) {
            eprintln!("warning: removing {}: {e}", self.path.display());
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
