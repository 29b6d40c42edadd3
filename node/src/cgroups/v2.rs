//! cgroup v2: one unified hierarchy. Controllers are enabled for children
//! through each ancestor's `cgroup.subtree_control`; CPU shares become
//! `cpu.weight`, quota and period one `cpu.max` line, the memory limit
//! `memory.max`, the pid limit `pids.max`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::fs::{
    CgroupError, CgroupFs, ResourceConfig, dirs_depth_first, kill_all, read_file, read_procs,
    remove_dir, write_file,
};
use super::name::CgroupName;
use super::shares::shares_to_weight;
use super::v1::list_child_dirs;

/// Controllers enabled down the tree (those the host offers).
const CONTROLLERS: &[&str] = &["cpuset", "cpu", "io", "memory", "hugetlb", "pids"];

/// The unified hierarchy mounted at a root directory.
#[derive(Debug, Clone)]
pub struct V2 {
    mount: PathBuf,
}

impl V2 {
    /// Uses the hierarchy mounted at `mount` (a test passes a fake tree).
    pub fn new(mount: impl Into<PathBuf>) -> Self {
        V2 {
            mount: mount.into(),
        }
    }

    fn dir(&self, name: &CgroupName) -> PathBuf {
        self.mount.join(name.relative())
    }

    /// Enables in `dir/cgroup.subtree_control` every controller listed in
    /// `dir/cgroup.controllers` that keelson uses and is not enabled yet.
    fn enable_controllers(&self, dir: &Path) -> Result<(), CgroupError> {
        let available = read_file(&dir.join("cgroup.controllers"))?.unwrap_or_default();
        let enabled = read_file(&dir.join("cgroup.subtree_control"))?.unwrap_or_default();
        let available: Vec<&str> = available.split_whitespace().collect();
        let enabled: Vec<&str> = enabled.split_whitespace().collect();
        let missing: Vec<String> = CONTROLLERS
            .iter()
            .filter(|c| available.contains(c) && !enabled.contains(c))
            .map(|c| format!("+{c}"))
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        if is_real_cgroupfs(dir) {
            write_file(&dir.join("cgroup.subtree_control"), &missing.join(" "))
        } else {
            // A fake tree keeps the file as the kernel would show it.
            let mut all: Vec<String> = enabled.iter().map(|s| s.to_string()).collect();
            all.extend(
                missing
                    .iter()
                    .map(|m| m.trim_start_matches('+').to_string()),
            );
            write_file(&dir.join("cgroup.subtree_control"), &all.join(" "))
        }
    }
}

/// True when `dir` is on a cgroup2 filesystem (statfs magic).
fn is_real_cgroupfs(dir: &Path) -> bool {
    nix::sys::statfs::statfs(dir)
        .map(|s| s.filesystem_type() == nix::sys::statfs::CGROUP2_SUPER_MAGIC)
        .unwrap_or(false)
}

impl CgroupFs for V2 {
    fn version(&self) -> &'static str {
        "v2"
    }

    fn create(&self, name: &CgroupName, resources: &ResourceConfig) -> Result<(), CgroupError> {
        let mut parent = self.mount.clone();
        for level in name.lineage() {
            self.enable_controllers(&parent)?;
            let dir = self.dir(&level);
            if !dir.is_dir() {
                std::fs::create_dir(&dir).map_err(|e| CgroupError::io(&dir, "creating", e))?;
                if !is_real_cgroupfs(&dir) {
                    // Fake tree: a child offers what its parent enabled.
                    let enabled =
                        read_file(&parent.join("cgroup.subtree_control"))?.unwrap_or_default();
                    write_file(&dir.join("cgroup.controllers"), &enabled)?;
                }
            }
            parent = dir;
        }
        self.update(name, resources)
    }

    fn update(&self, name: &CgroupName, r: &ResourceConfig) -> Result<(), CgroupError> {
        let dir = self.dir(name);
        if let Some(shares) = r.cpu_shares {
            write_file(
                &dir.join("cpu.weight"),
                &shares_to_weight(shares).to_string(),
            )?;
        }
        if r.cpu_quota.is_some() || r.cpu_period.is_some() {
            let quota = match r.cpu_quota {
                Some(q) if q > 0 => q.to_string(),
                _ => "max".to_string(),
            };
            let line = match r.cpu_period {
                Some(p) => format!("{quota} {p}"),
                None => quota,
            };
            write_file(&dir.join("cpu.max"), &line)?;
        }
        if let Some(limit) = r.memory {
            let v = if limit < 0 {
                "max".to_string()
            } else {
                limit.to_string()
            };
            write_file(&dir.join("memory.max"), &v)?;
        }
        if let Some(limit) = r.pids_limit {
            let v = if limit < 0 {
                "max".to_string()
            } else {
                limit.to_string()
            };
            write_file(&dir.join("pids.max"), &v)?;
        }
        Ok(())
    }

    fn exists(&self, name: &CgroupName) -> bool {
        self.dir(name).is_dir()
    }

    fn pids(&self, name: &CgroupName) -> Result<Vec<i32>, CgroupError> {
        let mut out = Vec::new();
        for d in dirs_depth_first(&self.dir(name)) {
            out.extend(read_procs(&d.join("cgroup.procs"))?);
        }
        out.sort_unstable();
        out.dedup();
        Ok(out)
    }

    fn destroy(&self, name: &CgroupName) -> Result<(), CgroupError> {
        if name.is_root() {
            return Err(CgroupError::Layout(
                "refusing to destroy the root cgroup".into(),
            ));
        }
        let dir = self.dir(name);
        // cgroup.kill (kernel ≥ 5.14) kills the whole subtree at once.
        if is_real_cgroupfs(&dir) && dir.join("cgroup.kill").exists() {
            let _ = write_file(&dir.join("cgroup.kill"), "1");
        }
        for _ in 0..50 {
            let pids = self.pids(name)?;
            if pids.is_empty() {
                break;
            }
            kill_all(&pids);
            std::thread::sleep(Duration::from_millis(20));
        }
        let left = self.pids(name)?;
        if !left.is_empty() {
            return Err(CgroupError::Busy {
                name: name.to_cgroupfs(),
                pids: left,
            });
        }
        for d in dirs_depth_first(&dir) {
            remove_dir(&d)?;
        }
        Ok(())
    }

    fn children(&self, name: &CgroupName) -> Result<Vec<String>, CgroupError> {
        list_child_dirs(&self.dir(name))
    }

    fn read(&self, name: &CgroupName) -> Result<ResourceConfig, CgroupError> {
        let dir = self.dir(name);
        let mut r = ResourceConfig::default();
        if let Some(w) = read_file(&dir.join("cpu.weight"))?.and_then(|v| v.parse::<u64>().ok()) {
            // kubelet's `cpuWeightToCPUShares`
            // (`pkg/kubelet/cm/cgroup_v2_manager_linux.go`), rounding down:
            // what the pod's `status.resources` shows and a resize compares.
            r.cpu_shares = Some(2 + (w.saturating_sub(1) * 262_142) / 9999);
        }
        if let Some(line) = read_file(&dir.join("cpu.max"))? {
            let mut parts = line.split_whitespace();
            r.cpu_quota = parts.next().map(|q| q.parse().unwrap_or(-1));
            r.cpu_period = parts.next().and_then(|p| p.parse().ok());
        }
        r.memory = read_file(&dir.join("memory.max"))?.map(|v| v.parse().unwrap_or(-1));
        r.pids_limit = read_file(&dir.join("pids.max"))?.map(|v| v.parse().unwrap_or(-1));
        Ok(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake unified tree: a root offering the usual controllers.
    fn fake() -> (tempfile::TempDir, V2) {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(
            dir.path().join("cgroup.controllers"),
            "cpuset cpu io memory hugetlb pids rdma misc\n",
        )
        .expect("w");
        std::fs::write(dir.path().join("cgroup.subtree_control"), "").expect("w");
        let v2 = V2::new(dir.path());
        (dir, v2)
    }

    #[test]
    fn create_enables_controllers_down_the_tree_and_writes_limits() {
        let (dir, v2) = fake();
        let name = CgroupName::from_cgroupfs("/kubepods/burstable/pod-a");
        v2.create(
            &name,
            &ResourceConfig {
                cpu_shares: Some(1024),
                cpu_quota: Some(50_000),
                cpu_period: Some(100_000),
                memory: Some(128 << 20),
                pids_limit: Some(1024),
            },
        )
        .expect("create");
        let root_ctl =
            std::fs::read_to_string(dir.path().join("cgroup.subtree_control")).expect("r");
        assert_eq!(root_ctl, "cpuset cpu io memory hugetlb pids");
        let burstable_ctl =
            std::fs::read_to_string(dir.path().join("kubepods/burstable/cgroup.subtree_control"))
                .expect("r");
        assert!(burstable_ctl.contains("memory") && burstable_ctl.contains("pids"));
        let pod = dir.path().join("kubepods/burstable/pod-a");
        assert_eq!(
            std::fs::read_to_string(pod.join("cpu.weight")).expect("r"),
            "39"
        );
        assert_eq!(
            std::fs::read_to_string(pod.join("cpu.max")).expect("r"),
            "50000 100000"
        );
        assert_eq!(
            std::fs::read_to_string(pod.join("memory.max")).expect("r"),
            "134217728"
        );
        assert_eq!(
            std::fs::read_to_string(pod.join("pids.max")).expect("r"),
            "1024"
        );
        let back = v2.read(&name).expect("read");
        assert_eq!(back.cpu_quota, Some(50_000));
        assert_eq!(back.memory, Some(128 << 20));
        // Weight 39 reads back as kubelet reads it: 2 + 38 * 262142 / 9999.
        assert_eq!(back.cpu_shares, Some(998));
    }

    #[test]
    fn no_cpu_limit_is_max_and_destroy_removes_the_subtree() {
        let (dir, v2) = fake();
        let name = CgroupName::from_cgroupfs("/kubepods/besteffort/pod-b");
        v2.create(
            &name,
            &ResourceConfig {
                cpu_shares: Some(2),
                cpu_quota: Some(-1),
                cpu_period: Some(100_000),
                ..Default::default()
            },
        )
        .expect("create");
        let pod = dir.path().join("kubepods/besteffort/pod-b");
        assert_eq!(
            std::fs::read_to_string(pod.join("cpu.max")).expect("r"),
            "max 100000"
        );
        assert_eq!(
            std::fs::read_to_string(pod.join("cpu.weight")).expect("r"),
            "1"
        );
        assert_eq!(
            v2.children(&CgroupName::from_cgroupfs("/kubepods/besteffort"))
                .expect("children"),
            vec!["pod-b".to_string()]
        );
        v2.destroy(&name).expect("destroy");
        assert!(!pod.exists());
        assert!(dir.path().join("kubepods/besteffort").exists());
    }
}
