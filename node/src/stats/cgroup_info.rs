//! One cgroup as cAdvisor describes it to kubelet's `/metrics/cadvisor`
//! (`info.ContainerInfo`: its reference, spec and latest stats,
//! `vendor/github.com/google/cadvisor/info/v1/container.go`), read from
//! the cgroup's files the way cAdvisor's libcontainer handler reads them
//! (`vendor/github.com/google/cadvisor/container/libcontainer/handler.go`
//! `setCPUStats`, `setMemoryStats`, `processStatsFromProcs`,
//! `setThreadsStats`; the spec from `container/common/helpers.go`
//! `getSpecInternal`), v1 and v2.
//!
//! Only the figures kubelet's cAdvisor collects are read: `CpuUsageMetrics`
//! without per-CPU usage, `MemoryUsageMetrics`, `NetworkUsageMetrics`,
//! `ProcessMetrics` (`pkg/kubelet/cadvisor/cadvisor_linux.go`).

use std::path::Path;

use super::cgroup::{CgroupUsage, Layout, stat_value};

/// Which workload a cgroup belongs to: the base labels kubelet gives every
/// series (`pkg/kubelet/server/server.go` `containerPrometheusLabelsFunc`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CgroupRef {
    /// The cgroup's name, `/` for the root (`id`).
    pub id: String,
    /// The runtime's container ID, for containers (`name`: cAdvisor's
    /// first alias).
    pub name: String,
    /// The container's image (`image`).
    pub image: String,
    /// Pod name, for pod and container cgroups.
    pub pod: String,
    /// Pod namespace.
    pub namespace: String,
    /// Container name (empty for the sandbox and pod cgroups).
    pub container: String,
}

/// `ContainerSpec`: limits read from the cgroup.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CgroupSpec {
    /// Unix seconds: the lowest modification time of the cgroup's
    /// directories and their `cgroup.clone_children` (v2:
    /// `cgroup.events`), never before boot.
    pub creation_time: Option<i64>,
    /// `cpu.shares` (v2: `cpu.weight` converted), `cfs_period_us`,
    /// `cfs_quota_us` (0 without a quota); `None` without a CPU controller.
    pub cpu: Option<CpuSpec>,
    /// Memory limit, swap limit, reservation (`u64::MAX` for `max`).
    pub memory: Option<MemorySpec>,
}

/// CPU limits.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CpuSpec {
    /// Shares.
    pub shares: u64,
    /// CFS period, µs.
    pub period: u64,
    /// CFS quota, µs; 0 for none.
    pub quota: u64,
}

/// Memory limits.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemorySpec {
    /// Limit.
    pub limit: u64,
    /// Swap limit (v1: memory+swap).
    pub swap_limit: u64,
    /// Reservation (v1 soft limit, v2 `memory.min`).
    pub reservation: u64,
}

/// `ContainerStats`: the figures of one sample.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CgroupStats {
    /// When they were read, ms since the epoch.
    pub timestamp_ms: i64,
    /// CPU time, ns.
    pub cpu: CpuUsage,
    /// Memory.
    pub memory: MemoryUsage,
    /// Interfaces of the cgroup's network namespace (the root and pod
    /// sandboxes only).
    pub network: Vec<InterfaceUsage>,
    /// Processes.
    pub processes: ProcessUsage,
    /// OOM kills in the cgroup (`oom_kill` of v1 `memory.oom_control`,
    /// v2 `memory.events.local`); `None` where the kernel does not count
    /// them.
    pub oom_events: Option<u64>,
}

/// CPU figures.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CpuUsage {
    /// Total, ns.
    pub total: u64,
    /// User mode, ns.
    pub user: u64,
    /// Kernel mode, ns.
    pub system: u64,
    /// CFS periods elapsed.
    pub periods: u64,
    /// Periods throttled.
    pub throttled_periods: u64,
    /// Time throttled, ns.
    pub throttled_time: u64,
    /// Periods in which the group used its burst.
    pub burst_periods: u64,
    /// Time bursted, ns.
    pub burst_time: u64,
}

/// Memory figures, as `setMemoryStats` fills them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemoryUsage {
    /// Usage.
    pub usage: u64,
    /// Peak usage (v1 `max_usage_in_bytes`, v2 `memory.peak`).
    pub max_usage: u64,
    /// Limit hits (v1 only).
    pub failcnt: u64,
    /// Kernel memory (v1 `kmem.usage_in_bytes`).
    pub kernel: u64,
    /// Page cache.
    pub cache: u64,
    /// Anonymous memory.
    pub rss: u64,
    /// Swap.
    pub swap: u64,
    /// Mapped files.
    pub mapped_file: u64,
    /// Active file pages.
    pub active_file: u64,
    /// Inactive file pages.
    pub inactive_file: u64,
    /// Usage less inactive file pages.
    pub working_set: u64,
    /// Page faults.
    pub pgfault: u64,
    /// Major page faults.
    pub pgmajfault: u64,
}

/// One interface's counters (`/proc/<pid>/net/dev`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InterfaceUsage {
    /// Name.
    pub name: String,
    /// Received bytes.
    pub rx_bytes: u64,
    /// Received packets.
    pub rx_packets: u64,
    /// Receive errors.
    pub rx_errors: u64,
    /// Received packets dropped.
    pub rx_dropped: u64,
    /// Sent bytes.
    pub tx_bytes: u64,
    /// Sent packets.
    pub tx_packets: u64,
    /// Send errors.
    pub tx_errors: u64,
    /// Sent packets dropped.
    pub tx_dropped: u64,
}

/// Process figures.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProcessUsage {
    /// Processes in the cgroup itself (`cgroup.procs`).
    pub processes: u64,
    /// Open file descriptors of those processes.
    pub fds: u64,
    /// Of which sockets.
    pub sockets: u64,
    /// `pids.current`.
    pub threads: u64,
    /// `pids.max` (0: no limit).
    pub threads_max: u64,
    /// The root process's soft `Max open files` (-1: unlimited); only for
    /// runtime containers.
    pub max_open_files: Option<i64>,
}

/// One cgroup's reference, spec and latest stats.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CgroupInfo {
    /// Labels.
    pub reference: CgroupRef,
    /// Limits.
    pub spec: CgroupSpec,
    /// Figures.
    pub stats: CgroupStats,
}

impl CgroupInfo {
    /// The summary's CPU and memory figures of this cgroup (kubelet
    /// builds them from the same cAdvisor stats).
    pub fn usage(&self) -> CgroupUsage {
        let m = &self.stats.memory;
        CgroupUsage {
            cpu_ns: Some(self.stats.cpu.total),
            memory_usage: Some(m.usage),
            working_set: Some(m.working_set),
            rss: Some(m.rss),
            page_faults: Some(m.pgfault),
            major_page_faults: Some(m.pgmajfault),
            memory_limit: self.spec.memory.map(|s| s.limit).filter(|l| *l < (1 << 62)),
        }
    }
}

fn read(p: &Path) -> Option<String> {
    std::fs::read_to_string(p).ok()
}

/// cAdvisor's `readUInt64`: `max` is `u64::MAX`, absent or unreadable 0.
fn read_u64(dir: &Path, file: &str) -> u64 {
    match read(&dir.join(file)).as_deref().map(str::trim) {
        Some("max") => u64::MAX,
        Some(v) => v.parse().unwrap_or(0),
        None => 0,
    }
}

/// `convertCPUWeightToCPULimit`: cgroup v2's weight as v1 shares.
pub fn weight_to_shares(weight: u64) -> Option<u64> {
    (1..=10_000)
        .contains(&weight)
        .then(|| 2 + ((weight - 1) * 262_142) / 9_999)
}

/// Clock ticks per second of `cpuacct.stat` (`USER_HZ`).
fn clock_ticks() -> u64 {
    nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .and_then(|t| u64::try_from(t).ok())
        .filter(|t| *t > 0)
        .unwrap_or(100)
}

/// The lowest modification time of `dirs` and of their
/// `cgroup.clone_children` (v2: `cgroup.events`), not before `boot`
/// (cAdvisor's creation time of a cgroup).
fn creation_time(dirs: &[&Path], v2: bool, boot: i64) -> Option<i64> {
    let mtime = |p: &Path| -> Option<i64> {
        let m = std::fs::metadata(p).ok()?.modified().ok()?;
        Some(m.duration_since(std::time::UNIX_EPOCH).ok()?.as_secs() as i64)
    };
    let marker = if v2 {
        "cgroup.events"
    } else {
        "cgroup.clone_children"
    };
    dirs.iter()
        .flat_map(|d| [mtime(d), mtime(&d.join(marker))])
        .flatten()
        .min()
        .map(|t| t.max(boot))
}

impl Layout {
    fn dir_of(&self, controller: &str, rel: &str) -> Option<std::path::PathBuf> {
        match self {
            Layout::V2 { mount } => Some(mount.join(rel)),
            Layout::V1 {
                cpu,
                cpuacct,
                memory,
                pids,
            } => match controller {
                "cpu" => cpu.as_ref(),
                "cpuacct" => cpuacct.as_ref(),
                "memory" => memory.as_ref(),
                _ => pids.as_ref(),
            }
            .map(|m| m.join(rel)),
        }
    }

    /// The spec and figures of the cgroup at `rel` ("" for the root);
    /// `None` when it does not exist. `boot` is the boot time (unix s).
    pub fn cgroup_info(&self, rel: &str, boot: i64) -> Option<(CgroupSpec, CgroupStats)> {
        let mem = self.dir_of("memory", rel)?;
        if !mem.is_dir() {
            return None;
        }
        let v2 = matches!(self, Layout::V2 { .. });
        let cpu_dir = self.dir_of("cpu", rel).filter(|d| d.is_dir());
        let acct_dir = self.dir_of("cpuacct", rel).filter(|d| d.is_dir());
        let pids_dir = self.dir_of("pids", rel).filter(|d| d.is_dir());
        let mut dirs: Vec<&Path> = vec![mem.as_path()];
        dirs.extend(cpu_dir.as_deref());
        dirs.extend(acct_dir.as_deref());
        dirs.extend(pids_dir.as_deref());
        let mut spec = CgroupSpec {
            creation_time: creation_time(&dirs, v2, boot),
            ..Default::default()
        };
        let mut stats = CgroupStats {
            timestamp_ms: jiff::Timestamp::now().as_millisecond(),
            ..Default::default()
        };
        let stat = read(&mem.join("memory.stat")).unwrap_or_default();
        let sv = |k: &str| stat_value(&stat, k).unwrap_or(0);
        let m = &mut stats.memory;
        if v2 {
            if let Some(d) = &cpu_dir {
                let weight = read_u64(d, "cpu.weight");
                let mut c = CpuSpec {
                    shares: weight_to_shares(weight).unwrap_or(0),
                    ..Default::default()
                };
                if let Some(max) = read(&d.join("cpu.max")) {
                    let mut f = max.split_whitespace();
                    if let (Some(q), Some(p)) = (f.next(), f.next()) {
                        c.quota = if q == "max" {
                            0
                        } else {
                            q.parse().unwrap_or(0)
                        };
                        c.period = p.parse().unwrap_or(0);
                    }
                }
                spec.cpu = Some(c);
                let s = read(&d.join("cpu.stat")).unwrap_or_default();
                let us = |k: &str| stat_value(&s, k).unwrap_or(0);
                stats.cpu = CpuUsage {
                    total: us("usage_usec").saturating_mul(1000),
                    user: us("user_usec").saturating_mul(1000),
                    system: us("system_usec").saturating_mul(1000),
                    periods: us("nr_periods"),
                    throttled_periods: us("nr_throttled"),
                    throttled_time: us("throttled_usec").saturating_mul(1000),
                    burst_periods: us("nr_bursts"),
                    burst_time: us("burst_usec").saturating_mul(1000),
                };
            }
            if mem.join("memory.max").exists() {
                spec.memory = Some(MemorySpec {
                    limit: read_u64(&mem, "memory.max"),
                    swap_limit: read_u64(&mem, "memory.swap.max"),
                    reservation: read_u64(&mem, "memory.min"),
                });
            }
            m.usage = read_u64(&mem, "memory.current");
            m.max_usage = read_u64(&mem, "memory.peak");
            m.cache = sv("file");
            m.rss = sv("anon");
            m.swap = read_u64(&mem, "memory.swap.current");
            m.mapped_file = sv("file_mapped");
            m.active_file = sv("active_file");
            m.inactive_file = sv("inactive_file");
        } else {
            if let Some(d) = &cpu_dir {
                let quota = read(&d.join("cpu.cfs_quota_us"))
                    .and_then(|q| q.trim().parse::<u64>().ok())
                    .unwrap_or(0);
                spec.cpu = Some(CpuSpec {
                    shares: read_u64(d, "cpu.shares"),
                    period: read_u64(d, "cpu.cfs_period_us"),
                    quota,
                });
                let s = read(&d.join("cpu.stat")).unwrap_or_default();
                stats.cpu.periods = stat_value(&s, "nr_periods").unwrap_or(0);
                stats.cpu.throttled_periods = stat_value(&s, "nr_throttled").unwrap_or(0);
                stats.cpu.throttled_time = stat_value(&s, "throttled_time").unwrap_or(0);
                stats.cpu.burst_periods = stat_value(&s, "nr_bursts").unwrap_or(0);
                stats.cpu.burst_time = stat_value(&s, "burst_time").unwrap_or(0);
            }
            if let Some(d) = &acct_dir {
                stats.cpu.total = read_u64(d, "cpuacct.usage");
                let s = read(&d.join("cpuacct.stat")).unwrap_or_default();
                let ns = |k: &str| {
                    stat_value(&s, k).unwrap_or(0).saturating_mul(1_000_000_000) / clock_ticks()
                };
                stats.cpu.user = ns("user");
                stats.cpu.system = ns("system");
            }
            spec.memory = Some(MemorySpec {
                limit: read_u64(&mem, "memory.limit_in_bytes"),
                swap_limit: read_u64(&mem, "memory.memsw.limit_in_bytes"),
                reservation: read_u64(&mem, "memory.soft_limit_in_bytes"),
            });
            m.usage = read_u64(&mem, "memory.usage_in_bytes");
            m.max_usage = read_u64(&mem, "memory.max_usage_in_bytes");
            m.failcnt = read_u64(&mem, "memory.failcnt");
            m.kernel = read_u64(&mem, "memory.kmem.usage_in_bytes");
            let hierarchy = read_u64(&mem, "memory.use_hierarchy") == 1;
            let (cache, rss, swap, mapped) = if hierarchy {
                (
                    "total_cache",
                    "total_rss",
                    "total_swap",
                    "total_mapped_file",
                )
            } else {
                ("cache", "rss", "swap", "mapped_file")
            };
            m.cache = sv(cache);
            m.rss = sv(rss);
            m.swap = sv(swap);
            m.mapped_file = sv(mapped);
            m.active_file = sv("total_active_file");
            m.inactive_file = sv("total_inactive_file");
        }
        stats.oom_events = if v2 {
            read(&mem.join("memory.events.local"))
                .or_else(|| read(&mem.join("memory.events")))
                .and_then(|t| stat_value(&t, "oom_kill"))
        } else {
            read(&mem.join("memory.oom_control")).and_then(|t| stat_value(&t, "oom_kill"))
        };
        m.pgfault = sv("pgfault");
        m.pgmajfault = sv("pgmajfault");
        m.working_set = m.usage.saturating_sub(m.inactive_file);
        if let Some(d) = &pids_dir {
            stats.processes.threads = read_u64(d, "pids.current");
            let max = read_u64(d, "pids.max");
            stats.processes.threads_max = if max == u64::MAX { 0 } else { max };
        }
        Some((spec, stats))
    }

    /// The processes listed in the CPU controller's `cgroup.procs` of
    /// `rel`.
    pub fn procs(&self, rel: &str) -> Vec<u32> {
        self.dir_of("cpu", rel)
            .and_then(|d| read(&d.join("cgroup.procs")))
            .map(|t| t.lines().filter_map(|l| l.trim().parse().ok()).collect())
            .unwrap_or_default()
    }
}

/// Counts the open descriptors and sockets of `pids` (`/proc/<pid>/fd`),
/// as `processStatsFromProcs`; processes that went away are skipped.
pub fn fd_counts(proc_root: &Path, pids: &[u32]) -> (u64, u64) {
    let (mut fds, mut sockets) = (0u64, 0u64);
    for pid in pids {
        let Ok(dir) = std::fs::read_dir(proc_root.join(pid.to_string()).join("fd")) else {
            continue;
        };
        for e in dir.flatten() {
            fds += 1;
            if std::fs::read_link(e.path()).is_ok_and(|l| l.to_string_lossy().starts_with("socket"))
            {
                sockets += 1;
            }
        }
    }
    (fds, sockets)
}

/// The soft `Max open files` of a `/proc/<pid>/limits` text (-1 for
/// unlimited), cAdvisor's `processLimitsFile`.
pub fn max_open_files(limits: &str) -> Option<i64> {
    let line = limits
        .lines()
        .find_map(|l| l.strip_prefix("Max open files"))?;
    let soft = line.split_whitespace().next()?;
    if soft.eq_ignore_ascii_case("unlimited") {
        Some(-1)
    } else {
        soft.parse().ok()
    }
}

/// cAdvisor's `isIgnoredDevice`: loopback, veth, docker and nerdctl
/// devices are not counted.
pub fn ignored_device(name: &str) -> bool {
    ["lo", "veth", "docker", "nerdctl"]
        .iter()
        .any(|p| name.starts_with(p))
}

/// Interface counters of a `/proc/<pid>/net/dev` text, without the
/// ignored devices (cAdvisor's `scanInterfaceStats`).
pub fn interfaces(text: &str) -> Vec<InterfaceUsage> {
    text.lines()
        .skip(2)
        .filter_map(|l| {
            let (name, rest) = l.split_once(':')?;
            let name = name.trim();
            if ignored_device(name) {
                return None;
            }
            let f: Vec<u64> = rest
                .split_whitespace()
                .map(|v| v.parse().unwrap_or(0))
                .collect();
            let at = |i: usize| f.get(i).copied();
            Some(InterfaceUsage {
                name: name.to_string(),
                rx_bytes: at(0)?,
                rx_packets: at(1)?,
                rx_errors: at(2)?,
                rx_dropped: at(3)?,
                tx_bytes: at(8)?,
                tx_packets: at(9)?,
                tx_errors: at(10)?,
                tx_dropped: at(11)?,
            })
        })
        .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn weights_convert_as_cadvisor() {
        assert_eq!(weight_to_shares(1), Some(2));
        assert_eq!(weight_to_shares(100), Some(2597));
        assert_eq!(weight_to_shares(10_000), Some(262_144));
        assert_eq!(weight_to_shares(0), None);
    }

    #[test]
    fn open_files_limit() {
        let limits = "Limit                     Soft Limit           Hard Limit           Units     \nMax open files            1048576              1048576              files     \n";
        assert_eq!(max_open_files(limits), Some(1_048_576));
        assert_eq!(
            max_open_files(
                "Max open files            unlimited            unlimited            files\n"
            ),
            Some(-1)
        );
        assert_eq!(max_open_files("nothing"), None);
    }

    #[test]
    fn reads_a_v2_cgroup_as_cadvisor() {
        let d = tempfile::tempdir().unwrap();
        let cg = d.path().join("kubepods/podx/c1");
        std::fs::create_dir_all(&cg).unwrap();
        let w = |f: &str, t: &str| std::fs::write(cg.join(f), t).unwrap();
        w(
            "cpu.stat",
            "usage_usec 1500\nuser_usec 1000\nsystem_usec 500\nnr_periods 10\nnr_throttled 2\nthrottled_usec 30\n",
        );
        w("cpu.max", "50000 100000\n");
        w("cpu.weight", "100\n");
        w("memory.current", "1000000\n");
        w("memory.max", "67108864\n");
        w("memory.min", "0\n");
        w("memory.swap.max", "max\n");
        w(
            "memory.stat",
            "anon 500000\nfile 300000\nfile_mapped 1000\nactive_file 100000\ninactive_file 200000\npgfault 7\npgmajfault 1\n",
        );
        w("pids.current", "3\n");
        w("pids.max", "max\n");
        let l = Layout::V2 {
            mount: d.path().to_path_buf(),
        };
        let (spec, stats) = l.cgroup_info("kubepods/podx/c1", 0).unwrap();
        assert_eq!(
            spec.cpu,
            Some(CpuSpec {
                shares: 2597,
                period: 100_000,
                quota: 50_000
            })
        );
        assert_eq!(spec.memory.unwrap().limit, 64 << 20);
        assert_eq!(spec.memory.unwrap().swap_limit, u64::MAX);
        assert!(spec.creation_time.is_some());
        assert_eq!(stats.cpu.total, 1_500_000);
        assert_eq!(stats.cpu.user, 1_000_000);
        assert_eq!(stats.cpu.throttled_time, 30_000);
        assert_eq!(stats.memory.working_set, 800_000);
        assert_eq!(stats.memory.cache, 300_000);
        assert_eq!(stats.memory.rss, 500_000);
        assert_eq!(stats.memory.mapped_file, 1000);
        assert_eq!((stats.memory.pgfault, stats.memory.pgmajfault), (7, 1));
        assert_eq!(stats.processes.threads, 3);
        assert_eq!(stats.processes.threads_max, 0);
        assert!(l.cgroup_info("kubepods/none", 0).is_none());
    }

    #[test]
    fn reads_a_v1_cgroup_as_cadvisor() {
        let d = tempfile::tempdir().unwrap();
        let (cpu, mem) = (d.path().join("cpu"), d.path().join("memory"));
        for c in [&cpu, &mem] {
            std::fs::create_dir_all(c.join("p")).unwrap();
        }
        let w = |dir: &Path, f: &str, t: &str| std::fs::write(dir.join("p").join(f), t).unwrap();
        w(&cpu, "cpuacct.usage", "5000\n");
        w(&cpu, "cpuacct.stat", "user 3\nsystem 1\n");
        w(&cpu, "cpu.shares", "1024\n");
        w(&cpu, "cpu.cfs_period_us", "100000\n");
        w(&cpu, "cpu.cfs_quota_us", "-1\n");
        w(
            &cpu,
            "cpu.stat",
            "nr_periods 0\nnr_throttled 0\nthrottled_time 0\n",
        );
        w(&mem, "memory.usage_in_bytes", "4096\n");
        w(&mem, "memory.limit_in_bytes", "9223372036854771712\n");
        w(&mem, "memory.use_hierarchy", "1\n");
        w(
            &mem,
            "memory.stat",
            "cache 1\nrss 2\ntotal_cache 100\ntotal_rss 200\ntotal_inactive_file 1024\npgfault 9\n",
        );
        let l = Layout::V1 {
            cpu: Some(cpu.clone()),
            cpuacct: Some(cpu),
            memory: Some(mem),
            pids: None,
        };
        let (spec, stats) = l.cgroup_info("p", 0).unwrap();
        assert_eq!(spec.cpu.unwrap().quota, 0);
        assert_eq!(spec.cpu.unwrap().shares, 1024);
        assert_eq!(stats.cpu.total, 5000);
        assert_eq!(stats.cpu.user, 3_000_000_000 / clock_ticks());
        assert_eq!((stats.memory.cache, stats.memory.rss), (100, 200));
        assert_eq!(stats.memory.working_set, 3072);
        assert_eq!(stats.memory.pgfault, 9);
    }

    #[test]
    fn interface_counters() {
        let text = "Inter-|   Receive                                                |  Transmit\n face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed\n    lo:     100       1    0    0    0     0          0         0      100       1    0    0    0     0       0          0\n  eth0:    2000      20    3    4    0     0          0         0     4000      40    5    6    0     0       0          0\n";
        let i = interfaces(text);
        assert_eq!(i.len(), 1);
        assert_eq!(
            (
                i[0].rx_bytes,
                i[0].rx_packets,
                i[0].rx_errors,
                i[0].rx_dropped
            ),
            (2000, 20, 3, 4)
        );
        assert_eq!(
            (
                i[0].tx_bytes,
                i[0].tx_packets,
                i[0].tx_errors,
                i[0].tx_dropped
            ),
            (4000, 40, 5, 6)
        );
    }
}
