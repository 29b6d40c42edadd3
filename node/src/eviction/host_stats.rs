//! The real [`SummaryProvider`]: what kubelet gets from cAdvisor and CRI,
//! read directly.
//!
//! - node memory: the root memory cgroup (v1: `memory.usage_in_bytes` minus
//!   `total_inactive_file`; v2: `/proc/meminfo` `MemTotal − MemFree` minus
//!   `Inactive(file)`), available = `MemTotal` − working set;
//! - pods' memory: the `kubepods` cgroup, available = its memory limit − its
//!   working set (no limit: no signal, as upstream);
//! - nodefs: statvfs of the root dir; imagefs: statvfs of the mountpoint
//!   CRI ImageFsInfo names (containerfs: the same unless the runtime
//!   reports a separate one);
//! - PIDs: min(`kernel.pid_max`, `kernel.threads-max`) and the running task
//!   count of `/proc/loadavg`;
//! - per pod: its cgroup's working set and `pids.current`, CRI container
//!   stats (working set, writable layer), and the disk usage of its log
//!   directory and its volumes (walked like `du`).

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::{Pod, Volume};
use keelson_cri::RuntimeClient;
use tokio::time::Instant;

use super::summary::{
    ContainerStats, DiskUsage, FsStats, MemoryStats, PodStats, RlimitStats, Summary,
    SummaryProvider, VolumeStats,
};
use crate::cgroups::{CgroupMode, CgroupName};
use crate::pod::qos::{QosClass, pod_qos};

/// Values at or above this are "no limit" in cgroup v1.
const V1_UNLIMITED: u64 = 1 << 62;

/// A value of a `memory.stat`-style file (`key value` lines).
pub fn stat_value(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

/// The running task count of `/proc/loadavg` (`1.36 3.49 4.53 2/3518 3715089`).
pub fn loadavg_tasks(text: &str) -> Option<u64> {
    text.split_whitespace()
        .nth(3)?
        .split_once('/')?
        .1
        .parse()
        .ok()
}

/// A cgroup memory limit: `None` for no limit (`max`, or v1's huge value).
pub fn parse_limit(text: &str) -> Option<u64> {
    let t = text.trim();
    if t == "max" {
        return None;
    }
    t.parse::<u64>().ok().filter(|v| *v < V1_UNLIMITED)
}

/// Disk usage of a tree, like `du -x`: allocated bytes and inodes, not
/// following symlinks and not crossing into other filesystems.
pub fn du(path: &Path) -> Option<DiskUsage> {
    let root = std::fs::symlink_metadata(path).ok()?;
    let dev = root.dev();
    let mut usage = DiskUsage::default();
    let mut stack = vec![path.to_path_buf()];
    while let Some(p) = stack.pop() {
        let Ok(m) = std::fs::symlink_metadata(&p) else {
            continue;
        };
        if m.dev() != dev {
            continue;
        }
        usage.used_bytes = usage
            .used_bytes
            .saturating_add(m.blocks().saturating_mul(512));
        usage.inodes_used += 1;
        if m.is_dir()
            && let Ok(rd) = std::fs::read_dir(&p)
        {
            stack.extend(rd.flatten().map(|e| e.path()));
        }
    }
    Some(usage)
}

/// Where the cgroup controllers the stats need are mounted.
#[derive(Debug, Clone)]
pub enum CgroupLayout {
    /// v1: the memory and pids controllers' mounts.
    V1 {
        /// `memory` mount.
        memory: Option<PathBuf>,
        /// `pids` mount.
        pids: Option<PathBuf>,
    },
    /// v2: the unified mount.
    V2 {
        /// The mount.
        mount: PathBuf,
    },
}

impl CgroupLayout {
    /// From the detected mode.
    pub fn from_mode(mode: &CgroupMode) -> CgroupLayout {
        match mode {
            CgroupMode::V2 { mount } => CgroupLayout::V2 {
                mount: mount.clone(),
            },
            CgroupMode::V1 { mounts } => CgroupLayout::V1 {
                memory: mounts.get("memory").cloned(),
                pids: mounts.get("pids").cloned(),
            },
        }
    }

    fn memory_dir(&self, cg: &CgroupName) -> Option<PathBuf> {
        let rel = cg.relative();
        match self {
            CgroupLayout::V1 { memory, .. } => memory.as_ref().map(|m| m.join(&rel)),
            CgroupLayout::V2 { mount } => Some(mount.join(&rel)),
        }
    }

    fn pids_dir(&self, cg: &CgroupName) -> Option<PathBuf> {
        let rel = cg.relative();
        match self {
            CgroupLayout::V1 { pids, .. } => pids.as_ref().map(|m| m.join(&rel)),
            CgroupLayout::V2 { mount } => Some(mount.join(&rel)),
        }
    }

    /// (usage, working set, limit) of a non-root cgroup.
    pub fn memory(&self, cg: &CgroupName) -> Option<(u64, u64, Option<u64>)> {
        let dir = self.memory_dir(cg)?;
        let read = |f: &str| std::fs::read_to_string(dir.join(f)).ok();
        let (usage, inactive, limit) = match self {
            CgroupLayout::V1 { .. } => (
                read("memory.usage_in_bytes")?.trim().parse::<u64>().ok()?,
                stat_value(&read("memory.stat")?, "total_inactive_file").unwrap_or(0),
                read("memory.limit_in_bytes").and_then(|t| parse_limit(&t)),
            ),
            CgroupLayout::V2 { .. } => (
                read("memory.current")?.trim().parse::<u64>().ok()?,
                stat_value(&read("memory.stat")?, "inactive_file").unwrap_or(0),
                read("memory.max").and_then(|t| parse_limit(&t)),
            ),
        };
        Some((usage, usage.saturating_sub(inactive), limit))
    }

    /// Tasks in a cgroup.
    pub fn pids(&self, cg: &CgroupName) -> Option<u64> {
        let dir = self.pids_dir(cg)?;
        std::fs::read_to_string(dir.join("pids.current"))
            .ok()?
            .trim()
            .parse()
            .ok()
    }
}

/// Settings of [`HostStats`].
#[derive(Debug, Clone)]
pub struct HostStatsConfig {
    /// The root dir (nodefs).
    pub root_dir: PathBuf,
    /// Pod log directories' parent.
    pub pod_logs_dir: PathBuf,
    /// `cgroupRoot` (cgroupfs form).
    pub cgroup_root: String,
    /// How the cgroups are named on the host (`cgroupDriver`).
    pub cgroup_driver: crate::config::CgroupDriver,
    /// procfs mount.
    pub proc_root: PathBuf,
}

impl HostStatsConfig {
    /// The node role's: its directories, cgroup root and driver, the
    /// host's procfs.
    pub fn for_node(n: &crate::config::NodeConfig) -> HostStatsConfig {
        HostStatsConfig {
            root_dir: n.root_dir.clone(),
            pod_logs_dir: n.pod_logs_dir.clone(),
            cgroup_root: n.cgroup_root.clone(),
            cgroup_driver: n.cgroup_driver,
            proc_root: PathBuf::from("/proc"),
        }
    }
}

/// The real summary provider.
#[derive(Clone)]
pub struct HostStats {
    cfg: Arc<HostStatsConfig>,
    cri: RuntimeClient,
    cgroups: Option<CgroupLayout>,
}

impl std::fmt::Debug for HostStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostStats")
            .field("cfg", &self.cfg)
            .finish_non_exhaustive()
    }
}

fn statvfs(path: &Path, now: Instant) -> Option<FsStats> {
    let s = nix::sys::statvfs::statvfs(path).ok()?;
    let frsize = s.fragment_size() as u64;
    Some(FsStats {
        capacity: frsize.saturating_mul(s.blocks() as u64),
        available: frsize.saturating_mul(s.blocks_available() as u64),
        inodes: s.files() as u64,
        inodes_free: s.files_free() as u64,
        time: now,
    })
}

impl HostStats {
    /// A provider; cgroup layout detected from `/proc/self/mountinfo`.
    pub fn new(cfg: HostStatsConfig, cri: RuntimeClient) -> HostStats {
        let cgroups = match crate::cgroups::detect_mode(&cfg.proc_root.join("self/mountinfo")) {
            Ok(mode) => Some(CgroupLayout::from_mode(&mode)),
            Err(e) => {
                tracing::warn!(error = %e, "cannot detect cgroups; memory signals unavailable");
                None
            }
        };
        HostStats {
            cfg: Arc::new(cfg),
            cri,
            cgroups,
        }
    }

    fn kubepods_name(&self) -> CgroupName {
        CgroupName::from_cgroupfs(&self.cfg.cgroup_root).child("kubepods")
    }

    /// `name` as directories on the host (the driver's form).
    fn on_host(&self, name: &CgroupName) -> CgroupName {
        CgroupName::from_cgroupfs(&crate::cgroups::literal_name(self.cfg.cgroup_driver, name))
    }

    fn kubepods(&self) -> CgroupName {
        self.on_host(&self.kubepods_name())
    }

    fn pod_cgroup(&self, pod: &Pod) -> CgroupName {
        let uid = pod.metadata.uid.as_deref().unwrap_or_default();
        let kubepods = self.kubepods_name();
        let tier = match pod_qos(pod) {
            QosClass::Guaranteed => kubepods,
            QosClass::Burstable => kubepods.child("burstable"),
            QosClass::BestEffort => kubepods.child("besteffort"),
        };
        self.on_host(&tier.child(&format!("pod{uid}")))
    }

    fn meminfo(&self) -> Option<String> {
        std::fs::read_to_string(self.cfg.proc_root.join("meminfo")).ok()
    }

    fn node_memory(&self, now: Instant) -> Option<MemoryStats> {
        let meminfo = self.meminfo()?;
        let field = |k| crate::status::host::meminfo_field(&meminfo, k);
        let total = field("MemTotal")?;
        let (usage, working_set) = match self.cgroups.as_ref()? {
            CgroupLayout::V1 { memory, .. } => {
                let dir = memory.as_ref()?;
                let usage: u64 = std::fs::read_to_string(dir.join("memory.usage_in_bytes"))
                    .ok()?
                    .trim()
                    .parse()
                    .ok()?;
                let stat = std::fs::read_to_string(dir.join("memory.stat")).ok()?;
                let inactive = stat_value(&stat, "total_inactive_file").unwrap_or(0);
                (usage, usage.saturating_sub(inactive))
            }
            CgroupLayout::V2 { .. } => {
                let usage = total.saturating_sub(field("MemFree")?);
                let inactive = field("Inactive(file)").unwrap_or(0);
                (usage, usage.saturating_sub(inactive))
            }
        };
        Some(MemoryStats {
            available: total.saturating_sub(working_set),
            working_set,
            usage,
            time: now,
        })
    }

    fn pods_memory(&self, now: Instant) -> Option<MemoryStats> {
        let (usage, working_set, limit) = self.cgroups.as_ref()?.memory(&self.kubepods())?;
        Some(MemoryStats {
            available: limit?.saturating_sub(working_set),
            working_set,
            usage,
            time: now,
        })
    }

    fn rlimit(&self, now: Instant) -> Option<RlimitStats> {
        let read = |f: &str| -> Option<u64> {
            std::fs::read_to_string(self.cfg.proc_root.join(f))
                .ok()?
                .trim()
                .parse()
                .ok()
        };
        let max_pid = [read("sys/kernel/pid_max"), read("sys/kernel/threads-max")]
            .into_iter()
            .flatten()
            .min()?;
        let running =
            loadavg_tasks(&std::fs::read_to_string(self.cfg.proc_root.join("loadavg")).ok()?)?;
        Some(RlimitStats {
            max_pid,
            running,
            time: now,
        })
    }

    async fn image_fs(&self, now: Instant) -> (Option<FsStats>, Option<FsStats>) {
        let info = match self.cri.image_fs_info().await {
            Ok(i) => i,
            Err(e) => {
                tracing::warn!(error = %e, "CRI ImageFsInfo failed; imagefs signals unavailable");
                return (None, None);
            }
        };
        let fs_of = |list: &[keelson_cri::api::FilesystemUsage]| {
            list.iter()
                .find_map(|f| f.fs_id.as_ref().map(|id| id.mountpoint.clone()))
                .filter(|m| !m.is_empty())
                .and_then(|m| statvfs(Path::new(&m), now))
        };
        let image = fs_of(&info.image_filesystems);
        let container = fs_of(&info.container_filesystems).or(image);
        (image, container)
    }

    async fn pod_stats(&self, pods: &[Arc<Pod>]) -> BTreeMap<String, PodStats> {
        let mut out = BTreeMap::new();
        if pods.is_empty() {
            return out;
        }
        // Container stats from CRI, grouped by pod UID.
        let mut containers: BTreeMap<String, Vec<ContainerStats>> = BTreeMap::new();
        match self.cri.list_container_stats(None).await {
            Ok(list) => {
                for s in list {
                    let Some(attr) = s.attributes.as_ref() else {
                        continue;
                    };
                    let uid = attr
                        .labels
                        .get("io.kubernetes.pod.uid")
                        .cloned()
                        .unwrap_or_default();
                    let name = attr
                        .metadata
                        .as_ref()
                        .map(|m| m.name.clone())
                        .unwrap_or_default();
                    let rootfs = s.writable_layer.as_ref().map(|w| DiskUsage {
                        used_bytes: w.used_bytes.as_ref().map(|v| v.value).unwrap_or(0),
                        inodes_used: w.inodes_used.as_ref().map(|v| v.value).unwrap_or(0),
                    });
                    containers.entry(uid).or_default().push(ContainerStats {
                        name,
                        memory_working_set: s
                            .memory
                            .as_ref()
                            .and_then(|m| m.working_set_bytes.as_ref())
                            .map(|v| v.value),
                        rootfs,
                        logs: None,
                    });
                }
            }
            Err(e) => tracing::warn!(error = %e, "CRI ListContainerStats failed"),
        }
        for pod in pods {
            let uid = pod.metadata.uid.clone().unwrap_or_default();
            let cg = self.pod_cgroup(pod);
            let (memory, pids) = match &self.cgroups {
                Some(l) => (l.memory(&cg).map(|(_, ws, _)| ws), l.pids(&cg)),
                None => (None, None),
            };
            let logs_dir = self.cfg.pod_logs_dir.join(format!(
                "{}_{}_{}",
                pod.metadata.namespace.as_deref().unwrap_or_default(),
                pod.metadata.name.as_deref().unwrap_or_default(),
                uid
            ));
            let volumes_dir = self.cfg.root_dir.join("pods").join(&uid).join("volumes");
            let spec_volumes = pod
                .spec
                .as_ref()
                .and_then(|s| s.volumes.clone())
                .unwrap_or_default();
            let mut cs = containers.remove(&uid).unwrap_or_default();
            let names: Vec<String> = cs.iter().map(|c| c.name.clone()).collect();
            let (logs, volumes) = tokio::task::spawn_blocking(move || {
                let logs: Vec<Option<DiskUsage>> =
                    names.iter().map(|n| du(&logs_dir.join(n))).collect();
                let mut volumes = Vec::new();
                for v in spec_volumes {
                    let Some((plugin, local)) = measured_volume(&v) else {
                        continue;
                    };
                    if let Some(usage) = du(&volumes_dir.join(plugin).join(&v.name)) {
                        volumes.push(VolumeStats {
                            name: v.name.clone(),
                            usage,
                            local_ephemeral: local,
                        });
                    }
                }
                (logs, volumes)
            })
            .await
            .unwrap_or_default();
            for (c, l) in cs.iter_mut().zip(logs) {
                c.logs = l;
            }
            out.insert(
                uid,
                PodStats {
                    memory_working_set: memory,
                    process_count: pids,
                    containers: cs,
                    volumes,
                },
            );
        }
        out
    }
}

impl SummaryProvider for HostStats {
    fn summary<'a>(&'a self, pods: &'a [Arc<Pod>]) -> BoxFuture<'a, Result<Summary, String>> {
        Box::pin(async move {
            let now = Instant::now();
            let (image_fs, container_fs) = self.image_fs(now).await;
            Ok(Summary {
                node_memory: self.node_memory(now),
                pods_memory: self.pods_memory(now),
                node_fs: statvfs(&self.cfg.root_dir, now),
                image_fs,
                container_fs,
                rlimit: self.rlimit(now),
                pods: self.pod_stats(pods).await,
            })
        })
    }

    fn has_dedicated_image_fs(&self) -> BoxFuture<'_, Result<bool, String>> {
        Box::pin(async move {
            let info = self.cri.image_fs_info().await.map_err(|e| e.to_string())?;
            let mount = info
                .image_filesystems
                .iter()
                .find_map(|f| f.fs_id.as_ref().map(|id| id.mountpoint.clone()))
                .ok_or("CRI ImageFsInfo names no image filesystem")?;
            let image_dev = std::fs::metadata(&mount)
                .map_err(|e| format!("stat {mount}: {e}"))?
                .dev();
            let root_dev = std::fs::metadata(&self.cfg.root_dir)
                .map_err(|e| format!("stat {}: {e}", self.cfg.root_dir.display()))?
                .dev();
            Ok(image_dev != root_dev)
        })
    }
}

/// Whether a pod volume is measured, and how: its plugin directory under
/// `<pod>/volumes` and whether it is local ephemeral storage (upstream's
/// `IsLocalEphemeralVolume`: a default-medium emptyDir or a configMap;
/// gitRepo is not supported here). emptyDirs of every medium are measured
/// for their `sizeLimit`; Memory and HugePages ones do not count as disk.
/// Other volumes (secret, downwardAPI and projected live on tmpfs, hostPath
/// is not the pod's) are not measured.
fn measured_volume(v: &Volume) -> Option<(&'static str, bool)> {
    if let Some(ed) = &v.empty_dir {
        Some((
            "kubernetes.io~empty-dir",
            ed.medium.as_deref().unwrap_or_default().is_empty(),
        ))
    } else if v.config_map.is_some() {
        Some(("kubernetes.io~configmap", true))
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_default_medium_empty_dirs_and_config_maps_are_local_storage() {
        let vol =
            |json: serde_json::Value| -> Volume { serde_json::from_value(json).expect("volume") };
        let cases = [
            (
                serde_json::json!({"name": "a", "emptyDir": {}}),
                Some(("kubernetes.io~empty-dir", true)),
            ),
            (
                serde_json::json!({"name": "b", "emptyDir": {"medium": ""}}),
                Some(("kubernetes.io~empty-dir", true)),
            ),
            (
                serde_json::json!({"name": "c", "emptyDir": {"medium": "Memory"}}),
                Some(("kubernetes.io~empty-dir", false)),
            ),
            (
                serde_json::json!({"name": "d", "emptyDir": {"medium": "HugePages"}}),
                Some(("kubernetes.io~empty-dir", false)),
            ),
            (
                serde_json::json!({"name": "e", "emptyDir": {"medium": "HugePages-2Mi"}}),
                Some(("kubernetes.io~empty-dir", false)),
            ),
            (
                serde_json::json!({"name": "f", "configMap": {"name": "cm"}}),
                Some(("kubernetes.io~configmap", true)),
            ),
            (
                serde_json::json!({"name": "g", "downwardAPI": {"items": []}}),
                None,
            ),
            (
                serde_json::json!({"name": "h", "secret": {"secretName": "s"}}),
                None,
            ),
            (
                serde_json::json!({"name": "i", "hostPath": {"path": "/x"}}),
                None,
            ),
        ];
        for (json, want) in cases {
            let v = vol(json);
            assert_eq!(measured_volume(&v), want, "{}", v.name);
        }
    }

    #[test]
    fn parsers() {
        let stat = "cache 10\ntotal_inactive_file 4096\ninactive_file 1\n";
        assert_eq!(stat_value(stat, "total_inactive_file"), Some(4096));
        assert_eq!(stat_value(stat, "inactive_file"), Some(1));
        assert_eq!(stat_value(stat, "nope"), None);
        assert_eq!(loadavg_tasks("1.36 3.49 4.53 2/3518 3715089\n"), Some(3518));
        assert_eq!(loadavg_tasks("garbage"), None);
        assert_eq!(parse_limit("max\n"), None);
        assert_eq!(parse_limit("9223372036854771712\n"), None);
        assert_eq!(parse_limit("419430400\n"), Some(419_430_400));
    }

    #[test]
    fn cgroup_files_v2() {
        let root = tempfile::tempdir().expect("tmp");
        let dir = root.path().join("kubepods");
        std::fs::create_dir_all(&dir).expect("mkdir");
        std::fs::write(dir.join("memory.current"), "300\n").expect("w");
        std::fs::write(dir.join("memory.stat"), "anon 200\ninactive_file 100\n").expect("w");
        std::fs::write(dir.join("memory.max"), "1000\n").expect("w");
        std::fs::write(dir.join("pids.current"), "7\n").expect("w");
        let l = CgroupLayout::V2 {
            mount: root.path().to_path_buf(),
        };
        let cg = CgroupName::from_cgroupfs("/kubepods");
        assert_eq!(l.memory(&cg), Some((300, 200, Some(1000))));
        assert_eq!(l.pids(&cg), Some(7));
        std::fs::write(dir.join("memory.max"), "max\n").expect("w");
        assert_eq!(l.memory(&cg), Some((300, 200, None)));
    }

    #[test]
    fn du_counts_blocks_and_inodes() {
        let root = tempfile::tempdir().expect("tmp");
        std::fs::create_dir(root.path().join("d")).expect("mkdir");
        std::fs::write(root.path().join("d/f"), vec![1u8; 64 * 1024]).expect("w");
        let u = du(root.path()).expect("du");
        assert_eq!(u.inodes_used, 3);
        assert!(u.used_bytes >= 64 * 1024, "{u:?}");
        assert_eq!(du(&root.path().join("missing")), None);
    }
}
