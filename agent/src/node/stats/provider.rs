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
//!   it (`<pod cgroup>/<container id>`, containerd's cgroupfs layout; CRI
//!   ContainerStats when absent), the pod's network namespace through its
//!   first process, writable layers (CRI), log and volume usage (walked
//!   like `du`, cached for a minute as kubelet's volume stats are).
//!
//! `usageNanoCores` is the rate between the two most recent samples (at
//! least a second apart) of the cumulative usage, as cAdvisor computes it
//! between housekeeping rounds; [`StatsProvider::sample`] runs every 10 s.

use std::collections::{BTreeMap, HashMap};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use keelson_cri::{RuntimeClient, api};
use tokio::time::Instant;

use super::cgroup::{CgroupUsage, Layout, net_dev};
use super::types::*;
use crate::node::eviction::host_stats::{du, loadavg_tasks, stat_value};
use crate::node::eviction::summary::DiskUsage;
use crate::node::pods::runtime::labels;

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
    /// procfs.
    pub proc_root: PathBuf,
}

/// How long walked disk usage is reused (kubelet's volume stats period).
const DU_TTL: Duration = Duration::from_secs(60);
/// How long the runtime's writable-layer and image filesystem figures and
/// the pods' network counters are reused (cAdvisor's housekeeping period;
/// kubelet serves its cached figures too). CPU and memory are read live.
const SLOW_TTL: Duration = Duration::from_secs(10);

/// Figures that cost a runtime round trip or a procfs walk per pod.
#[derive(Default)]
struct SlowFigures {
    runtime: Option<(Instant, Arc<RuntimeFigures>)>,
    network: HashMap<String, (Instant, Option<NetworkStats>)>,
}

/// Writable layers by container ID, and the image and container filesystems.
#[derive(Default)]
struct RuntimeFigures {
    writable: HashMap<String, DiskUsage>,
    image_fs: Option<FsStats>,
    container_fs: Option<FsStats>,
}
/// Shortest window for a CPU rate.
const MIN_RATE_WINDOW: Duration = Duration::from_secs(1);

#[derive(Debug, Clone, Copy)]
struct CpuSample {
    at: Instant,
    usage: u64,
    rate: Option<u64>,
}

/// The statistics of this node; shared.
pub struct StatsProvider {
    cfg: StatsConfig,
    cri: RuntimeClient,
    layout: Option<Layout>,
    boot_time: String,
    cpu: Mutex<HashMap<String, CpuSample>>,
    du_cache: Mutex<HashMap<PathBuf, (Instant, Option<DiskUsage>)>>,
    slow: Mutex<SlowFigures>,
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

/// cAdvisor's `isIgnoredDevice`.
fn ignored_device(name: &str) -> bool {
    ["lo", "veth", "docker", "nerdctl"]
        .iter()
        .any(|p| name.starts_with(p))
}

fn network_of(text: &str, node: bool) -> Option<NetworkStats> {
    let ifaces: Vec<InterfaceStats> = net_dev(text)
        .into_iter()
        .filter(|(n, ..)| !node || !ignored_device(n))
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
}

/// A ready sandbox and its running containers.
#[derive(Debug, Clone)]
struct RunningPod {
    uid: String,
    name: String,
    namespace: String,
    created_at: i64,
    containers: Vec<RunningContainer>,
}

impl StatsProvider {
    /// A provider reading this host's cgroups.
    pub fn new(cfg: StatsConfig, cri: RuntimeClient) -> Arc<Self> {
        let layout = match crate::node::cgroups::detect_mode(&cfg.proc_root.join("self/mountinfo"))
        {
            Ok(mode) => Some(Layout::from_mode(&mode)),
            Err(e) => {
                tracing::warn!(error = %e, "cannot detect cgroups; CPU and memory statistics unavailable");
                None
            }
        };
        Self::with_layout(cfg, cri, layout)
    }

    /// A provider reading cgroups from `layout` (tests give a fake tree).
    pub fn with_layout(cfg: StatsConfig, cri: RuntimeClient, layout: Option<Layout>) -> Arc<Self> {
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
            cpu: Mutex::new(HashMap::new()),
            du_cache: Mutex::new(HashMap::new()),
            slow: Mutex::new(SlowFigures::default()),
        })
    }

    fn kubepods(&self) -> String {
        let root = self.cfg.cgroup_root.trim_matches('/');
        if root.is_empty() {
            "kubepods".to_string()
        } else {
            format!("{root}/kubepods")
        }
    }

    /// The pod cgroup of `uid` (whichever QoS tier holds it).
    fn pod_cgroup(&self, uid: &str) -> Option<String> {
        let layout = self.layout.as_ref()?;
        let kp = self.kubepods();
        [
            format!("{kp}/pod{uid}"),
            format!("{kp}/burstable/pod{uid}"),
            format!("{kp}/besteffort/pod{uid}"),
        ]
        .into_iter()
        .find(|rel| layout.memory_dir(rel).is_some_and(|d| d.is_dir()))
    }

    /// `CPUStats` with the rate since the previous sample of `key`.
    fn cpu_stats(&self, key: &str, usage: Option<u64>) -> Option<CpuStats> {
        let usage = usage?;
        let now = Instant::now();
        let mut m = self.cpu.lock().unwrap_or_else(|p| p.into_inner());
        let rate = match m.get(key).copied() {
            Some(prev) if now.duration_since(prev.at) >= MIN_RATE_WINDOW => {
                let dt = now.duration_since(prev.at).as_secs_f64();
                let rate = (usage.saturating_sub(prev.usage) as f64 / dt) as u64;
                m.insert(
                    key.to_string(),
                    CpuSample {
                        at: now,
                        usage,
                        rate: Some(rate),
                    },
                );
                Some(rate)
            }
            Some(prev) => prev.rate,
            None => {
                m.insert(
                    key.to_string(),
                    CpuSample {
                        at: now,
                        usage,
                        rate: None,
                    },
                );
                None
            }
        };
        Some(CpuStats {
            time: now_str(),
            usage_nano_cores: rate,
            usage_core_nano_seconds: Some(usage),
        })
    }

    fn memory_stats(u: &CgroupUsage, capacity: Option<u64>) -> Option<MemoryStats> {
        let ws = u.working_set?;
        Some(MemoryStats {
            time: now_str(),
            available_bytes: u.memory_limit.or(capacity).map(|l| l.saturating_sub(ws)),
            usage_bytes: u.memory_usage,
            working_set_bytes: Some(ws),
            rss_bytes: u.rss,
            page_faults: u.page_faults,
            major_page_faults: u.major_page_faults,
        })
    }

    fn meminfo(&self, field: &str) -> Option<u64> {
        let text = std::fs::read_to_string(self.cfg.proc_root.join("meminfo")).ok()?;
        crate::node::status::host::meminfo_field(&text, field)
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

    async fn running_pods(&self) -> Result<Vec<RunningPod>, String> {
        let sandboxes = self
            .cri
            .list_pod_sandbox(Some(api::PodSandboxFilter {
                state: Some(api::PodSandboxStateValue {
                    state: api::PodSandboxState::SandboxReady as i32,
                }),
                ..Default::default()
            }))
            .await
            .map_err(|e| format!("failed to list pod sandboxes: {e}"))?;
        let containers = self
            .cri
            .list_containers(Some(api::ContainerFilter {
                state: Some(api::ContainerStateValue {
                    state: api::ContainerState::ContainerRunning as i32,
                }),
                ..Default::default()
            }))
            .await
            .map_err(|e| format!("failed to list containers: {e}"))?;
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
                    containers,
                },
            );
        }
        Ok(pods.into_values().collect())
    }

    /// Disk usage of `path`, walked at most once a minute.
    async fn du_cached(&self, path: PathBuf) -> Option<DiskUsage> {
        if let Some((at, v)) = self
            .du_cache
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&path)
            .copied()
            && at.elapsed() < DU_TTL
        {
            return v;
        }
        let p = path.clone();
        let v = tokio::task::spawn_blocking(move || du(&p))
            .await
            .ok()
            .flatten();
        let mut cache = self.du_cache.lock().unwrap_or_else(|p| p.into_inner());
        if cache.len() > 10_000 {
            cache.retain(|_, (at, _)| at.elapsed() < DU_TTL);
        }
        cache.insert(path, (Instant::now(), v));
        v
    }

    /// Volumes of a pod from `rootDir/pods/<uid>/volumes/<plugin>/<name>`:
    /// (name, usage stats, counts as local ephemeral storage).
    async fn volumes(&self, uid: &str) -> Vec<(VolumeStats, Option<DiskUsage>, bool)> {
        let base = self.cfg.root_dir.join("pods").join(uid).join("volumes");
        let mut out = Vec::new();
        let Ok(plugins) = std::fs::read_dir(&base) else {
            return out;
        };
        for plugin in plugins.flatten() {
            let pname = plugin.file_name().to_string_lossy().to_string();
            let local_kind = matches!(
                pname.as_str(),
                "kubernetes.io~empty-dir"
                    | "kubernetes.io~configmap"
                    | "kubernetes.io~downward-api"
            );
            let Ok(vols) = std::fs::read_dir(plugin.path()) else {
                continue;
            };
            for v in vols.flatten() {
                let path = v.path();
                let name = v.file_name().to_string_lossy().to_string();
                // A volume that is its own mount (tmpfs: Memory emptyDirs,
                // secrets, projected) is not disk of the node.
                let own_mount = match (std::fs::metadata(&path), std::fs::metadata(plugin.path())) {
                    (Ok(a), Ok(b)) => a.dev() != b.dev(),
                    _ => false,
                };
                let usage = self.du_cached(path.clone()).await;
                let mut fs = fs_of(&path).unwrap_or_else(|| FsStats {
                    time: now_str(),
                    ..Default::default()
                });
                if let Some(u) = usage {
                    fs.used_bytes = Some(u.used_bytes);
                    fs.inodes_used = Some(u.inodes_used);
                }
                out.push((VolumeStats { fs, name }, usage, local_kind && !own_mount));
            }
        }
        out.sort_by(|a, b| a.0.name.cmp(&b.0.name));
        out
    }

    /// `GetCPUAndMemoryStats` (`only_cpu_and_memory=true`, `/metrics/resource`)
    /// or the whole summary.
    pub async fn summary(&self, only_cpu_and_memory: bool) -> Result<Summary, String> {
        let layout = self.layout.as_ref();
        let root = layout.and_then(|l| l.usage_rel(""));
        let capacity = self.meminfo("MemTotal");
        let mut node = NodeStats {
            node_name: self.cfg.node_name.clone(),
            start_time: self.boot_time.clone(),
            cpu: self.cpu_stats("/", self.node_cpu_ns(root.as_ref())),
            memory: self.node_memory(),
            ..Default::default()
        };
        let kp = self.kubepods();
        if let Some(u) = layout.and_then(|l| l.usage_rel(&kp)) {
            node.system_containers.push(ContainerStats {
                name: "pods".to_string(),
                start_time: self.boot_time.clone(),
                cpu: self.cpu_stats(&kp, u.cpu_ns),
                memory: Self::memory_stats(&u, capacity),
                ..Default::default()
            });
        }
        let pods = self.running_pods().await?;
        let mut writable: HashMap<String, DiskUsage> = HashMap::new();
        let (mut image_fs, mut container_fs) = (None, None);
        if !only_cpu_and_memory {
            node.network = std::fs::read_to_string(self.cfg.proc_root.join("net/dev"))
                .ok()
                .and_then(|t| network_of(&t, true));
            node.fs = fs_of(&self.cfg.root_dir);
            node.rlimit = self.rlimit();
            let figures = self.runtime_figures().await;
            writable = figures.writable.clone();
            (image_fs, container_fs) = (figures.image_fs.clone(), figures.container_fs.clone());
            node.runtime = Some(RuntimeStats {
                image_fs: image_fs.clone(),
                container_fs: container_fs.clone(),
            });
        }
        let mut out = Vec::with_capacity(pods.len());
        for p in pods {
            out.push(
                self.pod_stats(
                    p,
                    only_cpu_and_memory,
                    capacity,
                    &writable,
                    container_fs.as_ref().or(image_fs.as_ref()),
                )
                .await,
            );
        }
        Ok(Summary { node, pods: out })
    }

    async fn pod_stats(
        &self,
        p: RunningPod,
        only_cpu_and_memory: bool,
        capacity: Option<u64>,
        writable: &HashMap<String, DiskUsage>,
        container_fs: Option<&FsStats>,
    ) -> PodStats {
        let layout = self.layout.as_ref();
        let pod_cg = self.pod_cgroup(&p.uid);
        let pod_usage = pod_cg
            .as_deref()
            .and_then(|rel| layout.and_then(|l| l.usage_rel(rel)));
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
            memory: pod_usage
                .as_ref()
                .and_then(|u| Self::memory_stats(u, capacity)),
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
                .and_then(|rel| layout.and_then(|l| l.usage_rel(&format!("{rel}/{}", c.id))));
            let mut cs = ContainerStats {
                name: c.name.clone(),
                start_time: rfc3339_ns(c.created_at),
                cpu: usage
                    .as_ref()
                    .and_then(|u| self.cpu_stats(&format!("c/{}", c.id), u.cpu_ns)),
                memory: usage.as_ref().and_then(|u| Self::memory_stats(u, capacity)),
                ..Default::default()
            };
            if usage.is_none() {
                // No cgroup where containerd's cgroupfs layout puts it:
                // take the runtime's figures.
                if let Ok(s) = self.cri.container_stats(&c.id).await {
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
            }
            if !only_cpu_and_memory {
                if let Some(w) = writable.get(&c.id) {
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
                if let Some(u) = self.du_cached(logs_dir.join(&c.name)).await {
                    cs.logs = Some(usage_on(&self.cfg.pod_logs_dir, u));
                    ephemeral.used_bytes += u.used_bytes;
                    ephemeral.inodes_used += u.inodes_used;
                }
            }
            stats.containers.push(cs);
        }
        if only_cpu_and_memory {
            return stats;
        }
        if let (Some(l), Some(rel)) = (layout, pod_cg.as_deref()) {
            stats.process_stats = l.pids(rel).map(|n| ProcessStats {
                process_count: Some(n),
            });
            stats.network = self.pod_network(&p.uid, l, rel);
        }
        for (v, usage, local) in self.volumes(&p.uid).await {
            if local && let Some(u) = usage {
                ephemeral.used_bytes += u.used_bytes;
                ephemeral.inodes_used += u.inodes_used;
            }
            stats.volume_stats.push(v);
        }
        stats.ephemeral_storage = Some(usage_on(&self.cfg.root_dir, ephemeral));
        stats
    }

    /// Writable layers and runtime filesystems, refreshed every `SLOW_TTL`.
    async fn runtime_figures(&self) -> Arc<RuntimeFigures> {
        if let Some((at, f)) = &self.slow.lock().unwrap_or_else(|p| p.into_inner()).runtime
            && at.elapsed() < SLOW_TTL
        {
            return f.clone();
        }
        let mut f = RuntimeFigures::default();
        match self.cri.list_container_stats(None).await {
            Ok(list) => {
                for s in list {
                    let (Some(attr), Some(w)) = (s.attributes, s.writable_layer) else {
                        continue;
                    };
                    f.writable.insert(
                        attr.id,
                        DiskUsage {
                            used_bytes: w.used_bytes.map(|v| v.value).unwrap_or(0),
                            inodes_used: w.inodes_used.map(|v| v.value).unwrap_or(0),
                        },
                    );
                }
            }
            Err(e) => tracing::debug!(error = %e, "CRI ListContainerStats failed"),
        }
        (f.image_fs, f.container_fs) = self.image_fs().await;
        let f = Arc::new(f);
        self.slow.lock().unwrap_or_else(|p| p.into_inner()).runtime =
            Some((Instant::now(), f.clone()));
        f
    }

    /// A pod's network counters, read at most every `SLOW_TTL`.
    fn pod_network(&self, uid: &str, layout: &Layout, rel: &str) -> Option<NetworkStats> {
        let mut slow = self.slow.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((at, n)) = slow.network.get(uid)
            && at.elapsed() < SLOW_TTL
        {
            return n.clone();
        }
        let n = layout
            .first_pid(rel)
            .and_then(|pid| {
                std::fs::read_to_string(self.cfg.proc_root.join(format!("{pid}/net/dev"))).ok()
            })
            .and_then(|t| network_of(&t, false));
        if slow.network.len() > 4096 {
            slow.network.retain(|_, (at, _)| at.elapsed() < SLOW_TTL);
        }
        slow.network
            .insert(uid.to_string(), (Instant::now(), n.clone()));
        n
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

    async fn image_fs(&self) -> (Option<FsStats>, Option<FsStats>) {
        let info = match self.cri.image_fs_info().await {
            Ok(i) => i,
            Err(e) => {
                tracing::debug!(error = %e, "CRI ImageFsInfo failed");
                return (None, None);
            }
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

    /// Refreshes the CPU samples (every 10 s, so `usageNanoCores` is
    /// there when metrics-server first asks).
    pub async fn sample(self: Arc<Self>, stop: tokio_util::sync::CancellationToken) {
        loop {
            let _ = self.summary(true).await;
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(Duration::from_secs(10)) => {}
            }
        }
    }
}
