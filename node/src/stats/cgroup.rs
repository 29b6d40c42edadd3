//! CPU and memory of a cgroup, read from its files as cAdvisor reads them
//! (v1: `cpuacct.usage`, `memory.usage_in_bytes`, `memory.stat` with
//! `total_*`; v2: `cpu.stat` `usage_usec`, `memory.current`,
//! `memory.stat`). Working set = usage − inactive file pages.

use std::path::{Path, PathBuf};

use crate::cgroups::CgroupMode;

/// Where the controllers are mounted.
#[derive(Debug, Clone)]
pub enum Layout {
    /// v1 mounts.
    V1 {
        /// `cpu` (shares, CFS; often shared with `cpuacct`).
        cpu: Option<PathBuf>,
        /// `cpuacct` (often shared with `cpu`).
        cpuacct: Option<PathBuf>,
        /// `memory`.
        memory: Option<PathBuf>,
        /// `pids`.
        pids: Option<PathBuf>,
    },
    /// The unified mount.
    V2 {
        /// Mount point.
        mount: PathBuf,
    },
}

/// CPU and memory of one cgroup.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CgroupUsage {
    /// Cumulative CPU time, ns.
    pub cpu_ns: Option<u64>,
    /// Memory usage.
    pub memory_usage: Option<u64>,
    /// Working set.
    pub working_set: Option<u64>,
    /// RSS.
    pub rss: Option<u64>,
    /// Page faults.
    pub page_faults: Option<u64>,
    /// Major page faults.
    pub major_page_faults: Option<u64>,
    /// Memory limit (`None`: unlimited).
    pub memory_limit: Option<u64>,
}

/// Values at or above this are "no limit" in cgroup v1.
const V1_UNLIMITED: u64 = 1 << 62;

/// A value of a `memory.stat`-style file (`key value` lines).
pub fn stat_value(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

/// A cgroup memory limit: `None` for no limit (`max`, or v1's huge value).
pub fn parse_limit(text: &str) -> Option<u64> {
    let t = text.trim();
    if t == "max" {
        return None;
    }
    t.parse::<u64>().ok().filter(|v| *v < V1_UNLIMITED)
}

fn read(p: &Path) -> Option<String> {
    std::fs::read_to_string(p).ok()
}

fn read_u64(p: &Path) -> Option<u64> {
    read(p)?.trim().parse().ok()
}

impl Layout {
    /// From the detected mode.
    pub fn from_mode(mode: &CgroupMode) -> Layout {
        match mode {
            CgroupMode::V2 { mount } => Layout::V2 {
                mount: mount.clone(),
            },
            CgroupMode::V1 { mounts } => Layout::V1 {
                cpu: mounts.get("cpu").or_else(|| mounts.get("cpuacct")).cloned(),
                cpuacct: mounts.get("cpuacct").or_else(|| mounts.get("cpu")).cloned(),
                memory: mounts.get("memory").cloned(),
                pids: mounts.get("pids").cloned(),
            },
        }
    }

    /// The directory of `rel` (a cgroupfs path relative to the root) for
    /// the memory controller (v2: the only one).
    pub fn memory_dir(&self, rel: &str) -> Option<PathBuf> {
        match self {
            Layout::V1 { memory, .. } => memory.as_ref().map(|m| m.join(rel)),
            Layout::V2 { mount } => Some(mount.join(rel)),
        }
    }

    /// The directory of `rel` for CPU accounting.
    pub fn cpu_dir(&self, rel: &str) -> Option<PathBuf> {
        match self {
            Layout::V1 { cpuacct, .. } => cpuacct.as_ref().map(|m| m.join(rel)),
            Layout::V2 { mount } => Some(mount.join(rel)),
        }
    }

    /// Tasks of `rel` (`pids.current`).
    pub fn pids(&self, rel: &str) -> Option<u64> {
        let dir = match self {
            Layout::V1 { pids, .. } => pids.as_ref()?.join(rel),
            Layout::V2 { mount } => mount.join(rel),
        };
        read_u64(&dir.join("pids.current"))
    }

    /// The first process of `rel` (to find its network namespace).
    pub fn first_pid(&self, rel: &str) -> Option<u32> {
        let dir = self.memory_dir(rel)?;
        read(&dir.join("cgroup.procs"))?
            .lines()
            .find_map(|l| l.trim().parse().ok())
    }

    /// Usage of the cgroup at `rel`.
    pub fn usage_rel(&self, rel: &str) -> Option<CgroupUsage> {
        let mem = self.memory_dir(rel)?;
        if !mem.is_dir() {
            return None;
        }
        let mut u = CgroupUsage::default();
        match self {
            Layout::V1 { .. } => {
                u.cpu_ns = self
                    .cpu_dir(rel)
                    .and_then(|d| read_u64(&d.join("cpuacct.usage")));
                u.memory_usage = read_u64(&mem.join("memory.usage_in_bytes"));
                u.memory_limit =
                    read(&mem.join("memory.limit_in_bytes")).and_then(|t| parse_limit(&t));
                if let Some(stat) = read(&mem.join("memory.stat")) {
                    let inactive = stat_value(&stat, "total_inactive_file").unwrap_or(0);
                    u.working_set = u.memory_usage.map(|m| m.saturating_sub(inactive));
                    u.rss = stat_value(&stat, "total_rss");
                    u.page_faults = stat_value(&stat, "total_pgfault");
                    u.major_page_faults = stat_value(&stat, "total_pgmajfault");
                }
            }
            Layout::V2 { .. } => {
                u.cpu_ns = read(&mem.join("cpu.stat"))
                    .and_then(|s| stat_value(&s, "usage_usec"))
                    .map(|us| us.saturating_mul(1000));
                u.memory_usage = read_u64(&mem.join("memory.current"));
                u.memory_limit = read(&mem.join("memory.max")).and_then(|t| parse_limit(&t));
                if let Some(stat) = read(&mem.join("memory.stat")) {
                    let inactive = stat_value(&stat, "inactive_file").unwrap_or(0);
                    u.working_set = u.memory_usage.map(|m| m.saturating_sub(inactive));
                    u.rss = stat_value(&stat, "anon");
                    u.page_faults = stat_value(&stat, "pgfault");
                    u.major_page_faults = stat_value(&stat, "pgmajfault");
                }
            }
        }
        Some(u)
    }
}

/// Interface counters of a network namespace (`/proc/<pid>/net/dev`
/// text): (name, rx bytes, rx errors, tx bytes, tx errors), loopback left
/// out as cAdvisor does.
pub fn net_dev(text: &str) -> Vec<(String, u64, u64, u64, u64)> {
    text.lines()
        .skip(2)
        .filter_map(|l| {
            let (name, rest) = l.split_once(':')?;
            let name = name.trim();
            if name == "lo" {
                return None;
            }
            let f: Vec<u64> = rest
                .split_whitespace()
                .map(|v| v.parse().unwrap_or(0))
                .collect();
            Some((
                name.to_string(),
                *f.first()?,
                *f.get(2)?,
                *f.get(8)?,
                *f.get(10)?,
            ))
        })
        .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn stat_files_and_limits() {
        let stat = "cache 10\ntotal_inactive_file 4096\ninactive_file 1\n";
        assert_eq!(stat_value(stat, "total_inactive_file"), Some(4096));
        assert_eq!(stat_value(stat, "inactive_file"), Some(1));
        assert_eq!(stat_value(stat, "nope"), None);
        assert_eq!(parse_limit("max\n"), None);
        assert_eq!(parse_limit("9223372036854771712\n"), None);
        assert_eq!(parse_limit("419430400\n"), Some(419_430_400));
    }

    #[test]
    fn reads_a_v2_cgroup() {
        let d = tempfile::tempdir().unwrap();
        let cg = d.path().join("kubepods/podx");
        std::fs::create_dir_all(&cg).unwrap();
        std::fs::write(cg.join("cpu.stat"), "usage_usec 1500\nuser_usec 1000\n").unwrap();
        std::fs::write(cg.join("memory.current"), "1000000\n").unwrap();
        std::fs::write(cg.join("memory.max"), "max\n").unwrap();
        std::fs::write(
            cg.join("memory.stat"),
            "anon 500000\ninactive_file 200000\npgfault 7\npgmajfault 1\n",
        )
        .unwrap();
        let l = Layout::V2 {
            mount: d.path().to_path_buf(),
        };
        let u = l.usage_rel("kubepods/podx").unwrap();
        assert_eq!(u.cpu_ns, Some(1_500_000));
        assert_eq!(u.working_set, Some(800_000));
        assert_eq!(u.rss, Some(500_000));
        assert_eq!(u.memory_limit, None);
        assert_eq!((u.page_faults, u.major_page_faults), (Some(7), Some(1)));
        assert!(l.usage_rel("kubepods/nope").is_none());
    }

    #[test]
    fn net_dev_skips_loopback() {
        let text = "Inter-|   Receive                                                |  Transmit\n face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed\n    lo:     100       1    0    0    0     0          0         0      100       1    0    0    0     0       0          0\n  eth0:    2000      20    3    0    0     0          0         0     4000      40    5    0    0     0       0          0\n";
        assert_eq!(net_dev(text), vec![("eth0".to_string(), 2000, 3, 4000, 5)]);
    }
}
