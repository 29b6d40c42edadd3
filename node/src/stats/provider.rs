//! Builds the Summary API (`pkg/kubelet/server/stats/summary.go`,
//! `pkg/kubelet/stats/cri_stats_provider.go` and cAdvisor's figures) from
//! what keelson reads itself:
//!
//! - node CPU and memory: the root cgroup (v1 `cpuacct`/`memory`; v2
//!   `cpu.stat`, `/proc/meminfo`), `/proc/stat` when there is no root
//!   CPU figure; network: `/proc/net/dev` without loopback and veth/docker
//!   devices (cAdvisor's `isIgnoredDevice`); fs: statvfs of the root dir;
//!   image/container fs: CRI ImageFsInfo plus statvfs of its mountpoint;
//!   rlimit: `pid_max`/`threads-max` and the running task count;
//!   system container `pods`: the `kubepods` cgroup;
//! - each pod with a ready sandbox (CRI): its pod cgroup
//!   (`kubepods[/<qos>]/pod<uid>`), each running container's cgroup below
//!   it (`<pod cgroup>/<container id>`, containerd's cgroupfs layout; the
//!   runtime's ListContainerStats figures when absent), the pod's network namespace through its
//!   first process, writable layers (CRI), log usage (walked like `du` at
//!   every round, as kubelet measures logs per request) and the volume
//!   figures the pod's calculator measured last
//!   ([`super::volume_stats`]).
//!
//! [`StatsProvider::sample`] takes one sample of everything: the runtime's
//! lists and figures over CRI first, then every file read (cgroups, procfs,
//! statvfs, disk usage walks) on a blocking thread. The node API never calls
//! it: [`super::cache::StatsCache`] does, once per housekeeping interval,
//! and requests read its snapshot. `usageNanoCores` is the rate between two
//! consecutive samples ([`super::cpu_rate`]).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use futures::future::BoxFuture;
use keelson_cri::{RuntimeClient, api};
use tokio::time::Instant;

use super::cache::{Collect, Round};
use super::cadvisor::CadvisorInfo;
use super::cgroup::stat_value;
use super::cgroup::{CgroupUsage, Layout, net_dev};
use super::cgroup_info::{self, CgroupInfo, CgroupRef};
use super::cpu_rate::CpuRates;
use super::disk::{DiskUsage, du};
use super::error::StatsError;
use super::machine::Machine;
use super::types::*;
use super::volume_stats::VolumeStatsCalculator;
use crate::cgroups::{CgroupName, literal_name};
use crate::pod::labels;
use crate::status::Host;

/// The running task count of `/proc/loadavg` (`1.36 3.49 4.53 2/3518 3715089`).
pub fn loadavg_tasks(text: &str) -> Option<u64> {
    text.split_whitespace()
        .nth(3)?
        .split_once('/')?
        .1
        .parse()
        .ok()
}

/// Settings.
#[derive(Debug, Clone)]
pub struct StatsConfig {
    /// Node name.
    pub node_name: String,
    /// The root dir (nodefs; `pods/<uid>/volumes`).
    pub root_dir: PathBuf,
    /// Pod log directories' parent.
    pub pod_logs_dir: PathBuf,
    /// `cgroupRoot`.
    pub cgroup_root: String,
    /// How the cgroups are named on the host (`cgroupDriver`).
    pub cgroup_driver: crate::config::CgroupDriver,
    /// procfs.
    pub proc_root: PathBuf,
}

impl StatsConfig {
    /// The node role's: its directories, cgroup root and driver, the
    /// host's procfs.
    pub fn for_node(node_name: &str, n: &crate::config::NodeConfig) -> StatsConfig {
        StatsConfig {
            node_name: node_name.to_string(),
            root_dir: n.root_dir.clone(),
            pod_logs_dir: n.pod_logs_dir.clone(),
            cgroup_root: n.cgroup_root.clone(),
            cgroup_driver: n.cgroup_driver,
            proc_root: PathBuf::from("/proc"),
        }
    }
}

/// What one round asks the runtime: writable layers and CPU/memory by
/// container ID (ListContainerStats), and its filesystems (ImageFsInfo).
#[derive(Default)]
struct RuntimeFigures {
    writable: HashMap<String, DiskUsage>,
    usage: HashMap<String, api::ContainerStats>,
    image_fs_info: Option<api::ImageFsInfoResponse>,
    /// Image ID → its first tag (ListImages), for cAdvisor's `image`.
    image_names: HashMap<String, String>,
}

/// The statistics of this node; shared.
pub struct StatsProvider {
    cfg: StatsConfig,
    cri: RuntimeClient,
    layout: Option<Layout>,
    boot_time: String,
    cpu: Mutex<CpuRates>,
    /// The pods' volume figures (none: no volumes reported).
    volumes: Option<VolumeStatsCalculator>,
    /// Sandbox ID → its image, asked once per sandbox (PodSandboxStatus).
    sandbox_images: Mutex<HashMap<String, String>>,
}

impl std::fmt::Debug for StatsProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StatsProvider")
            .field("cfg", &self.cfg)
            .field("layout", &self.layout)
            .finish_non_exhaustive()
    }
}

fn now_str() -> String {
    rfc3339(SystemTime::now())
}

fn statvfs(path: &Path) -> Option<(u64, u64, u64, u64, u64)> {
    let s = nix::sys::statvfs::statvfs(path).ok()?;
    let fr = s.fragment_size() as u64;
    let capacity = fr.saturating_mul(s.blocks() as u64);
    let free = fr.saturating_mul(s.blocks_free() as u64);
    let available = fr.saturating_mul(s.blocks_available() as u64);
    Some((
        capacity,
        available,
        capacity.saturating_sub(free),
        s.files() as u64,
        s.files_free() as u64,
    ))
}

/// The `FsStats` of a filesystem (used = capacity − free).
fn fs_of(path: &Path) -> Option<FsStats> {
    let (capacity, available, used, inodes, free) = statvfs(path)?;
    Some(FsStats {
        time: now_str(),
        available_bytes: Some(available),
        capacity_bytes: Some(capacity),
        used_bytes: Some(used),
        inodes_free: Some(free),
        inodes: Some(inodes),
        inodes_used: Some(inodes.saturating_sub(free)),
    })
}

/// `FsStats` of something using `usage` on the filesystem of `on`.
fn usage_on(on: &Path, usage: DiskUsage) -> FsStats {
    let mut f = fs_of(on).unwrap_or_else(|| FsStats {
        time: now_str(),
        ..Default::default()
    });
    f.used_bytes = Some(usage.used_bytes);
    f.inodes_used = Some(usage.inodes_used);
    f
}

fn network_of(text: &str, node: bool) -> Option<NetworkStats> {
    let ifaces: Vec<InterfaceStats> = net_dev(text)
        .into_iter()
        .filter(|(n, ..)| !node || !cgroup_info::ignored_device(n))
        .map(|(name, rx, rxe, tx, txe)| InterfaceStats {
            name,
            rx_bytes: Some(rx),
            rx_errors: Some(rxe),
            tx_bytes: Some(tx),
            tx_errors: Some(txe),
        })
        .collect();
    if ifaces.is_empty() {
        return None;
    }
    let default = ifaces
        .iter()
        .find(|i| i.name == "eth0")
        .cloned()
        .unwrap_or_default();
    Some(NetworkStats {
        time: now_str(),
        default,
        interfaces: ifaces,
    })
}

/// A running container of a ready sandbox.
#[derive(Debug, Clone)]
struct RunningContainer {
    id: String,
    name: String,
    created_at: i64,
    /// The image as the runtime lists it (an ID or a reference).
    image: String,
}

/// A ready sandbox and its running containers.
#[derive(Debug, Clone)]
struct RunningPod {
    uid: String,
    name: String,
    namespace: String,
    created_at: i64,
    sandbox_id: String,
    containers: Vec<RunningContainer>,
}

impl StatsProvider {
    /// A provider reading this host's cgroups, reporting the volume
    /// figures of `volumes`.
    pub fn with_volumes(
        cfg: StatsConfig,
        cri: RuntimeClient,
        volumes: Option<VolumeStatsCalculator>,
    ) -> Arc<Self> {
        let layout = match crate::cgroups::detect_mode(&cfg.proc_root.join("self/mountinfo")) {
            Ok(mode) => Some(Layout::from_mode(&mode)),
            Err(e) => {
                tracing::warn!(error = %e, "cannot detect cgroups; CPU and memory statistics unavailable");
                None
            }
        };
        Self::build(cfg, cri, layout, volumes)
    }

    /// A provider reading cgroups from `layout` (tests give a fake tree).
    #[cfg(test)]
    pub fn with_layout(cfg: StatsConfig, cri: RuntimeClient, layout: Option<Layout>) -> Arc<Self> {
        Self::build(cfg, cri, layout, None)
    }

    fn build(
        cfg: StatsConfig,
        cri: RuntimeClient,
        layout: Option<Layout>,
        volumes: Option<VolumeStatsCalculator>,
    ) -> Arc<Self> {
        let boot_time = std::fs::read_to_string(cfg.proc_root.join("stat"))
            .ok()
            .and_then(|s| stat_value(&s, "btime"))
            .map(|b| rfc3339(SystemTime::UNIX_EPOCH + Duration::from_secs(b)))
            .unwrap_or_default();
        Arc::new(StatsProvider {
            cfg,
            cri,
            layout,
            boot_time,
            cpu: Mutex::new(CpuRates::default()),
            volumes,
            sandbox_images: Mutex::new(HashMap::new()),
        })
    }

    /// The host path (relative to a hierarchy's mount) of a QoS-level
    /// cgroup, `kubepods` plus `tier` components, in the driver's form.
    fn qos_path(&self, tier: &[&str]) -> String {
        let mut name = CgroupName::from_cgroupfs(&self.cfg.cgroup_root).child("kubepods");
        for t in tier {
            name = name.child(t);
        }
        literal_name(self.cfg.cgroup_driver, &name)
            .trim_start_matches('/')
            .to_string()
    }

    fn kubepods(&self) -> String {
        self.qos_path(&[])
    }

    /// The pod cgroup of `uid` (whichever QoS tier holds it).
    fn pod_cgroup(&self, uid: &str) -> Option<String> {
        let layout = self.layout.as_ref()?;
        let pod = format!("pod{uid}");
        [
            self.qos_path(&[&pod]),
            self.qos_path(&["burstable", &pod]),
            self.qos_path(&["besteffort", &pod]),
        ]
        .into_iter()
        .find(|rel| layout.memory_dir(rel).is_some_and(|d| d.is_dir()))
    }

    /// A container's (or sandbox's) cgroup below its pod's: `<id>`
    /// (containerd with cgroupfs), or the runtime's scope with systemd
    /// (`cri-containerd-<id>.scope`, CRI-O's `crio-<id>.scope`).
    fn container_cgroup(&self, pod_cg: &str, id: &str) -> Option<String> {
        let layout = self.layout.as_ref()?;
        let exists = |rel: &String| layout.memory_dir(rel).is_some_and(|d| d.is_dir());
        match self.cfg.cgroup_driver {
            crate::config::CgroupDriver::Cgroupfs => Some(format!("{pod_cg}/{id}")).filter(exists),
            crate::config::CgroupDriver::Systemd => ["cri-containerd", "crio"]
                .iter()
                .map(|prefix| format!("{pod_cg}/{prefix}-{id}.scope"))
                .find(exists),
        }
    }

    /// Boot time, unix seconds.
    fn boot_secs(&self) -> i64 {
        self.boot_time
            .parse::<jiff::Timestamp>()
            .map(|t| t.as_second())
            .unwrap_or(0)
    }

    /// cAdvisor's view of the cgroup at `rel`: spec and figures, its
    /// processes' descriptors, and for `root_pid` (the root cgroup's
    /// PID 1, a container's first process) the soft open-files limit and,
    /// with `network`, the interfaces of its network namespace.
    fn cgroup_info(
        &self,
        layout: &Layout,
        rel: &str,
        reference: CgroupRef,
        root_pid: Option<u32>,
        network: bool,
    ) -> Option<CgroupInfo> {
        let (spec, mut stats) = layout.cgroup_info(rel, self.boot_secs())?;
        let procs = layout.procs(rel);
        let (fds, sockets) = cgroup_info::fd_counts(&self.cfg.proc_root, &procs);
        stats.processes.processes = procs.len() as u64;
        stats.processes.fds = fds;
        stats.processes.sockets = sockets;
        if let Some(pid) = root_pid {
            let dir = self.cfg.proc_root.join(pid.to_string());
            stats.processes.max_open_files = std::fs::read_to_string(dir.join("limits"))
                .ok()
                .and_then(|t| cgroup_info::max_open_files(&t));
            if network {
                stats.network = std::fs::read_to_string(dir.join("net/dev"))
                    .map(|t| cgroup_info::interfaces(&t))
                    .unwrap_or_default();
            }
        }
        Some(CgroupInfo {
            reference,
            spec,
            stats,
        })
    }

    /// The id (`/` + path) of the cgroup at `rel`.
    fn cgroup_id(rel: &str) -> String {
        format!("/{}", rel.trim_start_matches('/'))
    }

    /// `CPUStats` read now, with the rate since the previous sample of
    /// `key`.
    fn cpu_stats(&self, key: &str, usage: Option<u64>) -> Option<CpuStats> {
        let usage = usage?;
        let rate =
            self.cpu
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .observe(key, Instant::now(), usage);
        Some(CpuStats {
            time: now_str(),
            usage_nano_cores: rate,
            usage_core_nano_seconds: Some(usage),
        })
    }

    /// A cgroup's memory; `availableBytes` only under a limit, as kubelet
    /// gives it (`pkg/kubelet/stats/helper.go`, `isMemoryUnlimited`).
    fn memory_stats(u: &CgroupUsage) -> Option<MemoryStats> {
        let ws = u.working_set?;
        Some(MemoryStats {
            time: now_str(),
            available_bytes: u.memory_limit.map(|l| l.saturating_sub(ws)),
            usage_bytes: u.memory_usage,
            working_set_bytes: Some(ws),
            rss_bytes: u.rss,
            page_faults: u.page_faults,
            major_page_faults: u.major_page_faults,
        })
    }

    fn meminfo(&self, field: &str) -> Option<u64> {
        let text = std::fs::read_to_string(self.cfg.proc_root.join("meminfo")).ok()?;
        crate::status::host::meminfo_field(&text, field)
    }

    fn node_cpu_ns(&self, root: Option<&CgroupUsage>) -> Option<u64> {
        if let Some(ns) = root.and_then(|u| u.cpu_ns) {
            return Some(ns);
        }
        // /proc/stat: user nice system idle iowait irq softirq steal, in USER_HZ.
        let text = std::fs::read_to_string(self.cfg.proc_root.join("stat")).ok()?;
        let cpu = text.lines().find(|l| l.starts_with("cpu "))?;
        let f: Vec<u64> = cpu
            .split_whitespace()
            .skip(1)
            .map(|v| v.parse().unwrap_or(0))
            .collect();
        let busy = [0usize, 1, 2, 5, 6, 7]
            .iter()
            .map(|i| f.get(*i).copied().unwrap_or(0))
            .sum::<u64>();
        Some(busy.saturating_mul(10_000_000))
    }

    fn node_memory(&self) -> Option<MemoryStats> {
        let total = self.meminfo("MemTotal")?;
        let (usage, ws, rss, pf, pmf) = match self.layout.as_ref()? {
            Layout::V1 { memory, .. } => {
                let dir = memory.as_ref()?;
                let usage: u64 = std::fs::read_to_string(dir.join("memory.usage_in_bytes"))
                    .ok()?
                    .trim()
                    .parse()
                    .ok()?;
                let stat = std::fs::read_to_string(dir.join("memory.stat")).ok()?;
                let inactive = stat_value(&stat, "total_inactive_file").unwrap_or(0);
                (
                    usage,
                    usage.saturating_sub(inactive),
                    stat_value(&stat, "total_rss"),
                    stat_value(&stat, "total_pgfault"),
                    stat_value(&stat, "total_pgmajfault"),
                )
            }
            Layout::V2 { .. } => {
                let usage = total.saturating_sub(self.meminfo("MemFree")?);
                let inactive = self.meminfo("Inactive(file)").unwrap_or(0);
                (usage, usage.saturating_sub(inactive), None, None, None)
            }
        };
        Some(MemoryStats {
            time: now_str(),
            available_bytes: Some(total.saturating_sub(ws)),
            usage_bytes: Some(usage),
            working_set_bytes: Some(ws),
            rss_bytes: rss,
            page_faults: pf,
            major_page_faults: pmf,
        })
    }

    async fn running_pods(&self) -> Result<Vec<RunningPod>, StatsError> {
        let sandboxes = self
            .cri
            .list_pod_sandbox(Some(api::PodSandboxFilter {
                state: Some(api::PodSandboxStateValue {
                    state: api::PodSandboxState::SandboxReady as i32,
                }),
                ..Default::default()
            }))
            .await
            .map_err(StatsError::ListSandboxes)?;
        let containers = self
            .cri
            .list_containers(Some(api::ContainerFilter {
                state: Some(api::ContainerStateValue {
                    state: api::ContainerState::ContainerRunning as i32,
                }),
                ..Default::default()
            }))
            .await
            .map_err(StatsError::ListContainers)?;
        let mut by_sandbox: HashMap<String, Vec<RunningContainer>> = HashMap::new();
        for c in containers {
            let name = c
                .metadata
                .as_ref()
                .map(|m| m.name.clone())
                .or_else(|| c.labels.get(labels::CONTAINER_NAME).cloned())
                .unwrap_or_default();
            by_sandbox
                .entry(c.pod_sandbox_id.clone())
                .or_default()
                .push(RunningContainer {
                    image: c
                        .image
                        .as_ref()
                        .map(|i| i.image.clone())
                        .unwrap_or_default(),
                    id: c.id,
                    name,
                    created_at: c.created_at,
                });
        }
        // One entry per pod: the newest ready sandbox.
        let mut pods: BTreeMap<String, RunningPod> = BTreeMap::new();
        for s in sandboxes {
            let Some(m) = s.metadata.as_ref() else {
                continue;
            };
            if pods
                .get(&m.uid)
                .is_some_and(|p| p.created_at >= s.created_at)
            {
                continue;
            }
            let mut containers = by_sandbox.remove(&s.id).unwrap_or_default();
            containers.sort_by(|a, b| a.name.cmp(&b.name));
            pods.insert(
                m.uid.clone(),
                RunningPod {
                    uid: m.uid.clone(),
                    name: m.name.clone(),
                    namespace: m.namespace.clone(),
                    created_at: s.created_at,
                    sandbox_id: s.id.clone(),
                    containers,
                },
            );
        }
        Ok(pods.into_values().collect())
    }

    /// One sample of everything the Summary API reports: the runtime's
    /// pods, containers and figures over CRI, then every file on a
    /// blocking thread ([`Self::assemble`]).
    pub async fn sample(self: &Arc<Self>) -> Result<Round, StatsError> {
        let pods = self.running_pods().await?;
        let figures = self.runtime_figures().await;
        self.learn_sandbox_images(&pods).await;
        let this = self.clone();
        tokio::task::spawn_blocking(move || this.assemble(pods, &figures))
            .await
            .map_err(|e| StatsError::Interrupted(e.to_string()))
    }

    /// The image of each new sandbox, from its verbose PodSandboxStatus
    /// (containerd's `info.image`), asked once per sandbox; sandboxes no
    /// longer running are forgotten.
    async fn learn_sandbox_images(&self, pods: &[RunningPod]) {
        let known: Vec<String> = {
            let mut m = self
                .sandbox_images
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            m.retain(|id, _| pods.iter().any(|p| &p.sandbox_id == id));
            pods.iter()
                .filter(|p| !m.contains_key(&p.sandbox_id))
                .map(|p| p.sandbox_id.clone())
                .collect()
        };
        for id in known {
            let image = match self.cri.pod_sandbox_status(&id, true).await {
                Ok(r) => r
                    .info
                    .get("info")
                    .and_then(|i| serde_json::from_str::<serde_json::Value>(i).ok())
                    .and_then(|v| v["image"].as_str().map(str::to_string))
                    .unwrap_or_default(),
                Err(e) => {
                    tracing::debug!(sandbox = %id, error = %e, "CRI PodSandboxStatus failed");
                    continue;
                }
            };
            self.sandbox_images
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(id, image);
        }
    }

    /// The round of `pods` from the files (blocking: cgroups, procfs,
    /// statvfs, disk usage walks) and the runtime's `figures`: the summary
    /// and cAdvisor's view of the same cgroups (each pod and container
    /// cgroup is read once, for both). Each figure's `time` is when it was
    /// read; CPU rates are taken against the previous call's samples, and
    /// counters no longer present are forgotten.
    fn assemble(&self, pods: Vec<RunningPod>, figures: &RuntimeFigures) -> Round {
        let layout = self.layout.as_ref();
        let machine = self.machine();
        let mut cgroups = Vec::new();
        // The root (cAdvisor reads its processes and network through
        // PID 1, and gives it the machine's memory and swap as limits:
        // the raw handler's `GetSpec`), `kubepods` and the QoS tiers.
        if let Some(l) = layout {
            let root = CgroupRef {
                id: "/".to_string(),
                ..Default::default()
            };
            if let Some(mut info) = self.cgroup_info(l, "", root, Some(1), true) {
                if let (Some(m), Some(spec)) = (&machine, info.spec.memory.as_mut()) {
                    spec.limit = m.info.memory_capacity;
                    spec.swap_limit = m.info.swap_capacity;
                }
                cgroups.push(info);
            }
            for tier in [&[][..], &["burstable"], &["besteffort"]] {
                let rel = self.qos_path(tier);
                let r = CgroupRef {
                    id: Self::cgroup_id(&rel),
                    ..Default::default()
                };
                cgroups.extend(self.cgroup_info(l, &rel, r, None, false));
            }
        }
        let root = layout.and_then(|l| l.usage_rel(""));
        let (image_fs, container_fs) = Self::image_fs(figures.image_fs_info.as_ref());
        let mut node = NodeStats {
            node_name: self.cfg.node_name.clone(),
            start_time: self.boot_time.clone(),
            cpu: self.cpu_stats("/", self.node_cpu_ns(root.as_ref())),
            memory: self.node_memory(),
            network: std::fs::read_to_string(self.cfg.proc_root.join("net/dev"))
                .ok()
                .and_then(|t| network_of(&t, true)),
            fs: fs_of(&self.cfg.root_dir),
            runtime: Some(RuntimeStats {
                image_fs: image_fs.clone(),
                container_fs: container_fs.clone(),
            }),
            rlimit: self.rlimit(),
            ..Default::default()
        };
        let kp = self.kubepods();
        if let Some(u) = layout.and_then(|l| l.usage_rel(&kp)) {
            node.system_containers.push(ContainerStats {
                name: "pods".to_string(),
                start_time: self.boot_time.clone(),
                cpu: self.cpu_stats(&kp, u.cpu_ns),
                memory: Self::memory_stats(&u),
                ..Default::default()
            });
        }
        let container_fs = container_fs.or(image_fs);
        let out = pods
            .into_iter()
            .map(|p| self.pod_stats(p, figures, container_fs.as_ref(), &mut cgroups))
            .collect();
        self.cpu
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .end_round();
        Round {
            summary: Summary { node, pods: out },
            cadvisor: CadvisorInfo { cgroups, machine },
        }
    }

    /// The machine's figures (`None`, logged, when unreadable).
    fn machine(&self) -> Option<Machine> {
        let host = crate::status::RealHost {
            proc_root: self.cfg.proc_root.clone(),
            ..Default::default()
        };
        match host.machine_info() {
            Ok(info) => {
                let cpuinfo =
                    std::fs::read_to_string(self.cfg.proc_root.join("cpuinfo")).unwrap_or_default();
                Some(Machine::new(info, &cpuinfo))
            }
            Err(e) => {
                tracing::debug!(error = %e, "machine info unreadable");
                None
            }
        }
    }

    /// An image as cAdvisor labels it: the runtime's record of a container
    /// names its image by reference; CRI lists the ID the container was
    /// created from, named here by the image's first tag.
    fn image_name(figures: &RuntimeFigures, image: &str) -> String {
        figures
            .image_names
            .get(image)
            .cloned()
            .unwrap_or_else(|| image.to_string())
    }

    fn pod_stats(
        &self,
        p: RunningPod,
        figures: &RuntimeFigures,
        container_fs: Option<&FsStats>,
        cgroups: &mut Vec<CgroupInfo>,
    ) -> PodStats {
        let layout = self.layout.as_ref();
        let pod_cg = self.pod_cgroup(&p.uid);
        let pod_ref = |container: &str, name: &str, image: &str, rel: &str| CgroupRef {
            id: Self::cgroup_id(rel),
            name: name.to_string(),
            image: image.to_string(),
            pod: p.name.clone(),
            namespace: p.namespace.clone(),
            container: container.to_string(),
        };
        // Read once: the summary's figures are taken from cAdvisor's.
        let mut read = |rel: &str, r: CgroupRef, runtime: bool| -> Option<CgroupUsage> {
            let l = layout?;
            let root_pid = if runtime {
                l.procs(rel).first().copied()
            } else {
                None
            };
            let info = self.cgroup_info(l, rel, r, root_pid, runtime && root_pid.is_some())?;
            let usage = info.usage();
            cgroups.push(info);
            Some(usage)
        };
        let pod_usage = pod_cg
            .as_deref()
            .and_then(|rel| read(rel, pod_ref("", "", "", rel), false));
        if let Some(rel) = pod_cg
            .as_deref()
            .and_then(|pod| self.container_cgroup(pod, &p.sandbox_id))
        {
            let image = self
                .sandbox_images
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(&p.sandbox_id)
                .cloned()
                .unwrap_or_default();
            let mut r = pod_ref("", &p.sandbox_id, &image, &rel);
            r.image = Self::image_name(figures, &r.image);
            // Only the sandbox has a network namespace of its own
            // (cAdvisor's `RemoveNetMetrics` for the other containers).
            read(&rel, r, true);
        }
        let mut stats = PodStats {
            pod_ref: PodReference {
                name: p.name.clone(),
                namespace: p.namespace.clone(),
                uid: p.uid.clone(),
            },
            start_time: rfc3339_ns(p.created_at),
            cpu: pod_usage
                .as_ref()
                .and_then(|u| self.cpu_stats(&format!("pod/{}", p.uid), u.cpu_ns)),
            memory: pod_usage.as_ref().and_then(Self::memory_stats),
            ..Default::default()
        };
        let logs_dir = self
            .cfg
            .pod_logs_dir
            .join(format!("{}_{}_{}", p.namespace, p.name, p.uid));
        let mut ephemeral = DiskUsage::default();
        for c in &p.containers {
            let usage = pod_cg
                .as_deref()
                .and_then(|pod| self.container_cgroup(pod, &c.id))
                .and_then(|rel| {
                    let image = Self::image_name(figures, &c.image);
                    let mut r = pod_ref(&c.name, &c.id, &image, &rel);
                    r.name = c.id.clone();
                    let l = layout?;
                    let root_pid = l.procs(&rel).first().copied();
                    let info = self.cgroup_info(l, &rel, r, root_pid, false)?;
                    let usage = info.usage();
                    cgroups.push(info);
                    Some(usage)
                });
            let mut cs = ContainerStats {
                name: c.name.clone(),
                start_time: rfc3339_ns(c.created_at),
                cpu: usage
                    .as_ref()
                    .and_then(|u| self.cpu_stats(&format!("c/{}", c.id), u.cpu_ns)),
                memory: usage.as_ref().and_then(Self::memory_stats),
                ..Default::default()
            };
            if usage.is_none()
                && let Some(s) = figures.usage.get(&c.id)
            {
                // No cgroup where containerd's layout puts it: the
                // runtime's figures from this round's ListContainerStats.
                cs.cpu = s.cpu.as_ref().and_then(|cpu| {
                    self.cpu_stats(
                        &format!("c/{}", c.id),
                        cpu.usage_core_nano_seconds.as_ref().map(|v| v.value),
                    )
                });
                cs.memory = s.memory.as_ref().map(|m| MemoryStats {
                    time: now_str(),
                    working_set_bytes: m.working_set_bytes.as_ref().map(|v| v.value),
                    usage_bytes: m.usage_bytes.as_ref().map(|v| v.value),
                    rss_bytes: m.rss_bytes.as_ref().map(|v| v.value),
                    page_faults: m.page_faults.as_ref().map(|v| v.value),
                    major_page_faults: m.major_page_faults.as_ref().map(|v| v.value),
                    available_bytes: m.available_bytes.as_ref().map(|v| v.value),
                });
            }
            if let Some(w) = figures.writable.get(&c.id) {
                let mut fs = container_fs.cloned().unwrap_or_else(|| FsStats {
                    time: now_str(),
                    ..Default::default()
                });
                fs.used_bytes = Some(w.used_bytes);
                fs.inodes_used = Some(w.inodes_used);
                cs.rootfs = Some(fs);
                ephemeral.used_bytes += w.used_bytes;
                ephemeral.inodes_used += w.inodes_used;
            }
            // Walked at every round: kubelet measures log directories on
            // each request (`host_stats_provider.go`, `NewMetricsDu`); only
            // volume usage is cached.
            if let Some(u) = du(&logs_dir.join(&c.name)) {
                cs.logs = Some(usage_on(&self.cfg.pod_logs_dir, u));
                ephemeral.used_bytes += u.used_bytes;
                ephemeral.inodes_used += u.inodes_used;
            }
            stats.containers.push(cs);
        }
        if let (Some(l), Some(rel)) = (layout, pod_cg.as_deref()) {
            stats.process_stats = l.pids(rel).map(|n| ProcessStats {
                process_count: Some(n),
            });
            stats.network = self.pod_network(l, rel);
        }
        // `makePodStorageStats`: the local ephemeral volumes first, then
        // the others; only the former count in `ephemeral-storage`.
        if let Some(v) = self.volumes.as_ref().and_then(|c| c.get(&p.uid)) {
            for s in &v.ephemeral {
                ephemeral.used_bytes += s.fs.used_bytes.unwrap_or(0);
                ephemeral.inodes_used += s.fs.inodes_used.unwrap_or(0);
            }
            stats.volume_stats = v.ephemeral.into_iter().chain(v.persistent).collect();
        }
        stats.ephemeral_storage = Some(usage_on(&self.cfg.root_dir, ephemeral));
        stats
    }

    /// This round's runtime figures: writable layers and container CPU and
    /// memory (ListContainerStats), the runtime's filesystems (ImageFsInfo).
    /// A failed call leaves its figures out, as kubelet logs and goes on.
    async fn runtime_figures(&self) -> RuntimeFigures {
        let mut f = RuntimeFigures::default();
        match self.cri.list_container_stats(None).await {
            Ok(list) => {
                for s in list {
                    let Some(attr) = s.attributes.as_ref() else {
                        continue;
                    };
                    let id = attr.id.clone();
                    if let Some(w) = s.writable_layer.as_ref() {
                        f.writable.insert(
                            id.clone(),
                            DiskUsage {
                                used_bytes: w.used_bytes.map(|v| v.value).unwrap_or(0),
                                inodes_used: w.inodes_used.map(|v| v.value).unwrap_or(0),
                            },
                        );
                    }
                    f.usage.insert(id, s);
                }
            }
            Err(e) => tracing::debug!(error = %e, "CRI ListContainerStats failed"),
        }
        match self.cri.image_fs_info().await {
            Ok(i) => f.image_fs_info = Some(i),
            Err(e) => tracing::debug!(error = %e, "CRI ImageFsInfo failed"),
        }
        match self.cri.list_images(None).await {
            Ok(images) => {
                for i in images {
                    if let Some(tag) = i.repo_tags.first() {
                        f.image_names.insert(i.id.clone(), tag.clone());
                    }
                }
            }
            Err(e) => tracing::debug!(error = %e, "CRI ListImages failed"),
        }
        f
    }

    /// A pod's network counters, through its first process's namespace.
    fn pod_network(&self, layout: &Layout, rel: &str) -> Option<NetworkStats> {
        layout
            .first_pid(rel)
            .and_then(|pid| {
                std::fs::read_to_string(self.cfg.proc_root.join(format!("{pid}/net/dev"))).ok()
            })
            .and_then(|t| network_of(&t, false))
    }

    fn rlimit(&self) -> Option<RlimitStats> {
        let read = |f: &str| -> Option<u64> {
            std::fs::read_to_string(self.cfg.proc_root.join(f))
                .ok()?
                .trim()
                .parse()
                .ok()
        };
        let max = [read("sys/kernel/pid_max"), read("sys/kernel/threads-max")]
            .into_iter()
            .flatten()
            .min();
        let cur = std::fs::read_to_string(self.cfg.proc_root.join("loadavg"))
            .ok()
            .and_then(|t| loadavg_tasks(&t));
        Some(RlimitStats {
            time: now_str(),
            max_pid: max.and_then(|v| i64::try_from(v).ok()),
            cur_proc: cur.and_then(|v| i64::try_from(v).ok()),
        })
    }

    /// The image and container filesystems of an ImageFsInfo answer, with
    /// statvfs of their mountpoints (blocking).
    fn image_fs(info: Option<&api::ImageFsInfoResponse>) -> (Option<FsStats>, Option<FsStats>) {
        let Some(info) = info else {
            return (None, None);
        };
        let one = |list: &[api::FilesystemUsage]| {
            let f = list.first()?;
            let mount = f.fs_id.as_ref().map(|i| i.mountpoint.clone())?;
            let mut fs = fs_of(Path::new(&mount)).unwrap_or_else(|| FsStats {
                time: now_str(),
                ..Default::default()
            });
            fs.used_bytes = f.used_bytes.as_ref().map(|v| v.value);
            fs.inodes_used = f.inodes_used.as_ref().map(|v| v.value);
            Some(fs)
        };
        let image = one(&info.image_filesystems);
        let container = one(&info.container_filesystems).or_else(|| image.clone());
        (image, container)
    }
}

impl Collect for StatsProvider {
    fn collect(self: Arc<Self>) -> BoxFuture<'static, Result<Round, StatsError>> {
        Box::pin(async move { self.sample().await })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn loadavg_running_tasks() {
        assert_eq!(loadavg_tasks("1.36 3.49 4.53 2/3518 3715089\n"), Some(3518));
        assert_eq!(loadavg_tasks("garbage"), None);
    }

    /// A provider over a fake v2 cgroup tree in a temp dir (nothing dials
    /// the runtime: [`StatsProvider::assemble`] is given its figures).
    struct Host {
        dir: tempfile::TempDir,
        provider: Arc<StatsProvider>,
    }

    impl Host {
        fn new() -> Host {
            let dir = tempfile::tempdir().unwrap();
            for d in ["cg", "proc", "root", "logs"] {
                std::fs::create_dir_all(dir.path().join(d)).unwrap();
            }
            let cfg = StatsConfig {
                node_name: "n1".to_string(),
                root_dir: dir.path().join("root"),
                pod_logs_dir: dir.path().join("logs"),
                cgroup_root: "/".to_string(),
                cgroup_driver: crate::config::CgroupDriver::Cgroupfs,
                proc_root: dir.path().join("proc"),
            };
            let cri = RuntimeClient::new_lazy(
                &format!("unix://{}", dir.path().join("none.sock").display()),
                Default::default(),
            )
            .unwrap();
            let layout = Layout::V2 {
                mount: dir.path().join("cg"),
            };
            let provider = StatsProvider::with_layout(cfg, cri, Some(layout));
            Host { dir, provider }
        }

        /// Writes a cgroup's CPU (µs, as `cpu.stat` has it) and memory.
        fn cgroup(&self, rel: &str, cpu_usec: u64, memory: u64) {
            let d = self.dir.path().join("cg").join(rel);
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("cpu.stat"), format!("usage_usec {cpu_usec}\n")).unwrap();
            std::fs::write(d.join("memory.current"), format!("{memory}\n")).unwrap();
            std::fs::write(d.join("memory.max"), "max\n").unwrap();
            std::fs::write(d.join("memory.stat"), "anon 0\ninactive_file 0\n").unwrap();
        }

        fn remove(&self, rel: &str) {
            std::fs::remove_dir_all(self.dir.path().join("cg").join(rel)).unwrap();
        }
    }

    fn pod(uid: &str, containers: &[&str]) -> RunningPod {
        RunningPod {
            uid: uid.to_string(),
            name: format!("pod-{uid}"),
            namespace: "default".to_string(),
            created_at: 1_700_000_000_000_000_000,
            sandbox_id: format!("sandbox-{uid}"),
            containers: containers
                .iter()
                .map(|id| RunningContainer {
                    image: "sha256:1".to_string(),
                    id: id.to_string(),
                    name: format!("name-{id}"),
                    created_at: 1_700_000_000_000_000_000,
                })
                .collect(),
        }
    }

    fn container<'a>(s: &'a Summary, id: &str) -> Option<&'a ContainerStats> {
        s.pods
            .iter()
            .flat_map(|p| &p.containers)
            .find(|c| c.name == format!("name-{id}"))
    }

    #[tokio::test(start_paused = true)]
    async fn usage_nano_cores_is_the_rate_between_two_rounds() {
        let h = Host::new();
        h.cgroup("kubepods/podu1", 1_000_000, 4096);
        h.cgroup("kubepods/podu1/c1", 500_000, 2048);
        let figures = RuntimeFigures::default();

        let first = h
            .provider
            .assemble(vec![pod("u1", &["c1"])], &figures)
            .summary;
        let cpu = first.pods[0].cpu.clone().unwrap();
        assert_eq!(cpu.usage_core_nano_seconds, Some(1_000_000_000));
        assert_eq!(cpu.usage_nano_cores, None, "one sample: no rate yet");
        assert_eq!(
            first.pods[0].memory.as_ref().unwrap().working_set_bytes,
            Some(4096)
        );

        // Ten seconds on, the pod used 5 s of CPU and its container 1 s.
        tokio::time::advance(Duration::from_secs(10)).await;
        h.cgroup("kubepods/podu1", 6_000_000, 4096);
        h.cgroup("kubepods/podu1/c1", 1_500_000, 2048);
        let second = h
            .provider
            .assemble(vec![pod("u1", &["c1"])], &figures)
            .summary;
        let cpu = second.pods[0].cpu.clone().unwrap();
        assert_eq!(cpu.usage_core_nano_seconds, Some(6_000_000_000));
        assert_eq!(cpu.usage_nano_cores, Some(500_000_000));
        let c1 = container(&second, "c1").unwrap().cpu.clone().unwrap();
        assert_eq!(c1.usage_nano_cores, Some(100_000_000));
    }

    #[tokio::test(start_paused = true)]
    async fn each_figure_carries_the_time_it_was_read() {
        let h = Host::new();
        h.cgroup("kubepods/podu1", 1, 1);
        let before = jiff::Timestamp::now().as_second();
        let s = h
            .provider
            .assemble(vec![pod("u1", &[])], &RuntimeFigures::default())
            .summary;
        let after = jiff::Timestamp::now().as_second();
        let cpu_time: jiff::Timestamp = s.pods[0].cpu.as_ref().unwrap().time.parse().unwrap();
        let mem_time: jiff::Timestamp = s.pods[0].memory.as_ref().unwrap().time.parse().unwrap();
        for t in [cpu_time.as_second(), mem_time.as_second()] {
            assert!(before <= t && t <= after, "{before} <= {t} <= {after}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn containers_come_and_go_with_the_rounds() {
        let h = Host::new();
        h.cgroup("kubepods/podu1", 1_000_000, 1);
        h.cgroup("kubepods/podu1/c1", 1_000_000, 1);
        let figures = RuntimeFigures::default();
        let s = h
            .provider
            .assemble(vec![pod("u1", &["c1"])], &figures)
            .summary;
        assert!(container(&s, "c1").is_some());
        assert!(container(&s, "c2").is_none());

        // c2 started: it is in the next round, with no rate on its first
        // sample; c1 keeps its history.
        tokio::time::advance(Duration::from_secs(10)).await;
        h.cgroup("kubepods/podu1/c2", 3_000_000, 1);
        let s = h
            .provider
            .assemble(vec![pod("u1", &["c1", "c2"])], &figures)
            .summary;
        let c2 = container(&s, "c2").unwrap().cpu.clone().unwrap();
        assert_eq!(c2.usage_core_nano_seconds, Some(3_000_000_000));
        assert_eq!(c2.usage_nano_cores, None);
        assert_eq!(
            container(&s, "c1")
                .unwrap()
                .cpu
                .as_ref()
                .unwrap()
                .usage_nano_cores,
            Some(0)
        );

        // c1 went away: gone from the summary, and its CPU history with it
        // (the node and `kubepods` have no CPU figures in this tree).
        tokio::time::advance(Duration::from_secs(10)).await;
        h.remove("kubepods/podu1/c1");
        let s = h
            .provider
            .assemble(vec![pod("u1", &["c2"])], &figures)
            .summary;
        assert!(container(&s, "c1").is_none());
        assert_eq!(h.provider.cpu.lock().unwrap().len(), 2, "the pod and c2");

        // The pod went away too.
        tokio::time::advance(Duration::from_secs(10)).await;
        let s = h.provider.assemble(Vec::new(), &figures).summary;
        assert!(s.pods.is_empty());
        assert!(h.provider.cpu.lock().unwrap().is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_container_without_a_cgroup_takes_the_runtimes_figures() {
        let h = Host::new();
        h.cgroup("kubepods/podu1", 1, 1);
        let mut figures = RuntimeFigures::default();
        figures.usage.insert(
            "c1".to_string(),
            api::ContainerStats {
                cpu: Some(api::CpuUsage {
                    usage_core_nano_seconds: Some(api::UInt64Value { value: 7 }),
                    ..Default::default()
                }),
                memory: Some(api::MemoryUsage {
                    working_set_bytes: Some(api::UInt64Value { value: 99 }),
                    ..Default::default()
                }),
                ..Default::default()
            },
        );
        let s = h
            .provider
            .assemble(vec![pod("u1", &["c1"])], &figures)
            .summary;
        let c1 = container(&s, "c1").unwrap();
        assert_eq!(c1.cpu.as_ref().unwrap().usage_core_nano_seconds, Some(7));
        assert_eq!(c1.memory.as_ref().unwrap().working_set_bytes, Some(99));
    }

    #[tokio::test(start_paused = true)]
    async fn a_round_gives_cadvisor_the_cgroups_it_read_for_the_summary() {
        let h = Host::new();
        h.cgroup("kubepods", 9_000_000, 1 << 20);
        h.cgroup("kubepods/podu1", 3_000_000, 8192);
        h.cgroup("kubepods/podu1/c1", 2_000_000, 4096);
        h.cgroup("kubepods/podu1/sandbox-u1", 1_000, 1024);
        let mut figures = RuntimeFigures::default();
        figures
            .image_names
            .insert("sha256:1".into(), "docker.io/library/busybox:1.36".into());
        let round = h.provider.assemble(vec![pod("u1", &["c1"])], &figures);
        let by_id = |id: &str| {
            round
                .cadvisor
                .cgroups
                .iter()
                .find(|c| c.reference.id == id)
                .unwrap_or_else(|| panic!("no {id}: {:#?}", round.cadvisor.cgroups))
        };
        let c1 = by_id("/kubepods/podu1/c1");
        assert_eq!(
            c1.reference,
            CgroupRef {
                id: "/kubepods/podu1/c1".into(),
                name: "c1".into(),
                image: "docker.io/library/busybox:1.36".into(),
                pod: "pod-u1".into(),
                namespace: "default".into(),
                container: "name-c1".into(),
            }
        );
        assert_eq!(c1.stats.cpu.total, 2_000_000_000);
        assert_eq!(c1.stats.memory.working_set, 4096);
        let pod_cg = by_id("/kubepods/podu1");
        assert_eq!(
            (
                pod_cg.reference.pod.as_str(),
                pod_cg.reference.container.as_str(),
                pod_cg.reference.name.as_str()
            ),
            ("pod-u1", "", "")
        );
        let sandbox = by_id("/kubepods/podu1/sandbox-u1");
        assert_eq!(sandbox.reference.name, "sandbox-u1");
        assert_eq!(sandbox.reference.container, "");
        assert_eq!(by_id("/kubepods").reference.pod, "");
        // The summary's figures are the same reads.
        let summary = &round.summary;
        let c = container(summary, "c1").unwrap();
        assert_eq!(
            c.cpu.as_ref().unwrap().usage_core_nano_seconds,
            Some(c1.stats.cpu.total)
        );
        assert_eq!(
            summary.pods[0].memory.as_ref().unwrap().working_set_bytes,
            Some(pod_cg.stats.memory.working_set)
        );
    }
}
