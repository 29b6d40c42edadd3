//! cgroup v1: one hierarchy per controller. A cgroup is a directory of the
//! same relative path in every controller's mount; limits go to the
//! controller that owns them (`cpu.*`, `memory.*`, `pids.*`), and a new
//! `cpuset` child inherits its parent's CPUs and memory nodes.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::fs::{
    CgroupError, CgroupFs, ResourceConfig, dirs_depth_first, kill_all, read_file, read_procs,
    remove_dir, write_file,
};
use super::name::CgroupName;

/// The v1 hierarchies.
#[derive(Debug, Clone)]
pub struct V1 {
    /// controller → mount point (several controllers may share one).
    mounts: BTreeMap<String, PathBuf>,
}

impl V1 {
    /// Uses the given controller mounts (see [`super::detect_mode`]); a test
    /// may point them at directories of a fake tree.
    pub fn new(mounts: BTreeMap<String, PathBuf>) -> Self {
        V1 { mounts }
    }

    /// The distinct mount points.
    fn distinct_mounts(&self) -> Vec<&Path> {
        let mut out: Vec<&Path> = Vec::new();
        for p in self.mounts.values() {
            if !out.contains(&p.as_path()) {
                out.push(p.as_path());
            }
        }
        out
    }

    fn dir(&self, controller: &str, name: &CgroupName) -> Option<PathBuf> {
        self.mounts.get(controller).map(|m| m.join(name.relative()))
    }

    fn primary(&self, name: &CgroupName) -> Option<PathBuf> {
        self.dir("memory", name).or_else(|| self.dir("cpu", name))
    }

    fn ensure_cpuset(&self, name: &CgroupName) -> Result<(), CgroupError> {
        let Some(mount) = self.mounts.get("cpuset") else {
            return Ok(());
        };
        for level in name.lineage() {
            let dir = mount.join(level.relative());
            let parent = mount.join(level.parent().relative());
            for file in ["cpuset.cpus", "cpuset.mems"] {
                let current = read_file(&dir.join(file))?.unwrap_or_default();
                if current.is_empty() {
                    let inherited = read_file(&parent.join(file))?.unwrap_or_default();
                    if !inherited.is_empty() {
                        write_file(&dir.join(file), &inherited)?;
                    }
                }
            }
        }
        Ok(())
    }
}

fn mkdir(path: &Path) -> Result<(), CgroupError> {
    std::fs::create_dir_all(path).map_err(|e| CgroupError::io(path, "creating", e))
}

fn is_einval(e: &CgroupError) -> bool {
    matches!(e, CgroupError::Io { source, .. } if source.raw_os_error() == Some(libc::EINVAL))
}

impl CgroupFs for V1 {
    fn version(&self) -> &'static str {
        "v1"
    }

    fn create(&self, name: &CgroupName, resources: &ResourceConfig) -> Result<(), CgroupError> {
        for mount in self.distinct_mounts() {
            mkdir(&mount.join(name.relative()))?;
        }
        self.ensure_cpuset(name)?;
        self.update(name, resources)
    }

    fn update(&self, name: &CgroupName, r: &ResourceConfig) -> Result<(), CgroupError> {
        if let Some(cpu) = self.dir("cpu", name) {
            if let Some(shares) = r.cpu_shares {
                write_file(&cpu.join("cpu.shares"), &shares.to_string())?;
            }
            // The kernel refuses a period that makes the current quota
            // invalid; then the quota goes first.
            let period = r.cpu_period.map(|p| p.to_string());
            let quota = r.cpu_quota.map(|q| q.to_string());
            let first = period
                .as_ref()
                .map(|p| write_file(&cpu.join("cpu.cfs_period_us"), p));
            match first {
                Some(Err(e)) if is_einval(&e) => {
                    if let Some(q) = &quota {
                        write_file(&cpu.join("cpu.cfs_quota_us"), q)?;
                    }
                    if let Some(p) = &period {
                        write_file(&cpu.join("cpu.cfs_period_us"), p)?;
                    }
                }
                Some(Err(e)) => return Err(e),
                _ => {
                    if let Some(q) = &quota {
                        write_file(&cpu.join("cpu.cfs_quota_us"), q)?;
                    }
                }
            }
        }
        if let (Some(mem), Some(limit)) = (self.dir("memory", name), r.memory) {
            write_file(&mem.join("memory.limit_in_bytes"), &limit.to_string())?;
        }
        if let (Some(pids), Some(limit)) = (self.dir("pids", name), r.pids_limit) {
            let v = if limit < 0 {
                "max".to_string()
            } else {
                limit.to_string()
            };
            write_file(&pids.join("pids.max"), &v)?;
        }
        Ok(())
    }

    fn exists(&self, name: &CgroupName) -> bool {
        ["cpu", "memory", "pids"]
            .iter()
            .filter_map(|c| self.dir(c, name))
            .all(|d| d.is_dir())
    }

    fn pids(&self, name: &CgroupName) -> Result<Vec<i32>, CgroupError> {
        let Some(dir) = self.primary(name) else {
            return Ok(Vec::new());
        };
        let mut out = Vec::new();
        for d in dirs_depth_first(&dir) {
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
        // Kill until empty (a fork in flight may add one more).
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
        for mount in self.distinct_mounts() {
            for d in dirs_depth_first(&mount.join(name.relative())) {
                remove_dir(&d)?;
            }
        }
        Ok(())
    }

    fn children(&self, name: &CgroupName) -> Result<Vec<String>, CgroupError> {
        let Some(dir) = self.primary(name) else {
            return Ok(Vec::new());
        };
        list_child_dirs(&dir)
    }

    fn read(&self, name: &CgroupName) -> Result<ResourceConfig, CgroupError> {
        let mut r = ResourceConfig::default();
        if let Some(cpu) = self.dir("cpu", name) {
            r.cpu_shares = read_file(&cpu.join("cpu.shares"))?.and_then(|v| v.parse().ok());
            r.cpu_quota = read_file(&cpu.join("cpu.cfs_quota_us"))?.and_then(|v| v.parse().ok());
            r.cpu_period = read_file(&cpu.join("cpu.cfs_period_us"))?.and_then(|v| v.parse().ok());
        }
        if let Some(mem) = self.dir("memory", name) {
            r.memory = read_file(&mem.join("memory.limit_in_bytes"))?.and_then(|v| v.parse().ok());
        }
        if let Some(pids) = self.dir("pids", name) {
            r.pids_limit = read_file(&pids.join("pids.max"))?.map(|v| {
                if v == "max" {
                    -1
                } else {
                    v.parse().unwrap_or(-1)
                }
            });
        }
        Ok(r)
    }
}

/// The names of the subdirectories of `dir` (missing dir: none).
pub(crate) fn list_child_dirs(dir: &Path) -> Result<Vec<String>, CgroupError> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(CgroupError::io(dir, "listing", e)),
    };
    let mut out = Vec::new();
    for e in entries.flatten() {
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            out.push(e.file_name().to_string_lossy().into_owned());
        }
    }
    out.sort();
    Ok(out)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A fake v1 layout: cpu, memory, pids and cpuset hierarchies in a temp
    /// dir (cpuset with CPUs and memory nodes to inherit).
    pub(crate) fn fake() -> (tempfile::TempDir, V1) {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut mounts = BTreeMap::new();
        for c in ["cpu", "memory", "pids", "cpuset"] {
            let m = dir.path().join(c);
            std::fs::create_dir_all(&m).expect("mkdir");
            mounts.insert(c.to_string(), m);
        }
        std::fs::write(dir.path().join("cpuset/cpuset.cpus"), "0-1\n").expect("w");
        std::fs::write(dir.path().join("cpuset/cpuset.mems"), "0\n").expect("w");
        (dir, V1::new(mounts))
    }

    #[test]
    fn create_writes_each_controller_and_inherits_cpuset() {
        let (dir, v1) = fake();
        let name = CgroupName::from_cgroupfs("/t/kubepods/burstable/pod1");
        let r = ResourceConfig {
            cpu_shares: Some(512),
            cpu_quota: Some(50_000),
            cpu_period: Some(100_000),
            memory: Some(64 << 20),
            pids_limit: Some(-1),
        };
        v1.create(&name, &r).expect("create");
        assert!(v1.exists(&name));
        assert_eq!(v1.read(&name).expect("read"), r);
        let cpus = std::fs::read_to_string(
            dir.path()
                .join("cpuset/t/kubepods/burstable/pod1/cpuset.cpus"),
        )
        .expect("cpus");
        assert_eq!(cpus, "0-1");
        assert_eq!(
            v1.children(&name.parent()).expect("children"),
            vec!["pod1".to_string()]
        );
        v1.destroy(&CgroupName::from_cgroupfs("/t"))
            .expect("destroy");
        assert!(!dir.path().join("memory/t").exists());
        assert!(!v1.exists(&name));
    }
}
