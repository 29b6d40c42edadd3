//! The eviction manager's figures, from the node's one statistics sampler
//! ([`crate::stats`]): kubelet's eviction manager reads the same summary
//! provider as its node API, asking it for fresh figures
//! (`updateStats=true`, `pkg/kubelet/eviction/eviction_manager.go`
//! `synchronize`); here each synchronize runs a round of the stats cache
//! ([`StatsCache::refresh`]) and reads what eviction needs from its summary:
//!
//! - node memory: the summary's node memory (root cgroup / meminfo),
//!   available = `MemTotal` − working set;
//! - pods' memory: the `pods` system container (the `kubepods` cgroup),
//!   available = its limit − its working set (no limit: no signal);
//! - nodefs, imagefs, containerfs: the summary's node and runtime
//!   filesystems (containerfs: imagefs unless the runtime names another);
//! - PIDs: the summary's rlimit;
//! - per pod: its cgroup's working set and process count, its containers'
//!   working sets, writable layers and logs, and the local volumes
//!   [`measured_volume`] names, from the pod's entry in the summary.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::Arc;

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::{Pod, Volume};
use keelson_cri::RuntimeClient;
use tokio::time::Instant;

use super::summary::{
    ContainerStats, DiskUsage, FsStats, MemoryStats, PodStats, RlimitStats, Summary, SummaryError,
    SummaryProvider, VolumeStats,
};
use crate::stats::types;
use crate::stats::volume_stats::PodVolumeLister;
use crate::stats::{StatsCache, StatsConfig, StatsProvider, VolumeStatsCalculator};

/// [`SummaryProvider`] over the node's statistics cache.
#[derive(Clone)]
pub struct StatsSummary {
    stats: Arc<StatsCache>,
    cri: RuntimeClient,
    root_dir: PathBuf,
}

impl std::fmt::Debug for StatsSummary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StatsSummary")
            .field("root_dir", &self.root_dir)
            .finish_non_exhaustive()
    }
}

impl StatsSummary {
    /// Figures from `stats`; `cri` and `root_dir` tell whether images have
    /// a filesystem of their own.
    pub fn new(stats: Arc<StatsCache>, cri: RuntimeClient, root_dir: PathBuf) -> StatsSummary {
        StatsSummary {
            stats,
            cri,
            root_dir,
        }
    }

    /// Figures from a sampler of its own, for `node_name` configured as
    /// `n` (`keelson diagnose`, beside or without the daemon), with the
    /// volumes of `volumes` measured once, now.
    pub async fn standalone(
        node_name: &str,
        n: &crate::config::NodeConfig,
        cri: RuntimeClient,
        volumes: &dyn PodVolumeLister,
    ) -> StatsSummary {
        let calculator = VolumeStatsCalculator::new(n.volume_stats_agg_period.get(), None, None);
        for uid in volumes.pods() {
            calculator.calculate(volumes, &uid).await;
        }
        let sampler = StatsCache::new(StatsProvider::with_volumes(
            StatsConfig::for_node(node_name, n),
            cri.clone(),
            Some(calculator),
        ));
        StatsSummary::new(sampler, cri, n.root_dir.clone())
    }
}

impl SummaryProvider for StatsSummary {
    fn summary<'a>(&'a self, pods: &'a [Arc<Pod>]) -> BoxFuture<'a, Result<Summary, SummaryError>> {
        Box::pin(async move {
            let snapshot = self.stats.refresh().await;
            let summary = snapshot.summary.as_ref().map_err(|e| e.clone())?;
            Ok(eviction_summary(summary, pods, Instant::now()))
        })
    }

    fn has_dedicated_image_fs(&self) -> BoxFuture<'_, Result<bool, SummaryError>> {
        Box::pin(async move {
            let info = self
                .cri
                .image_fs_info()
                .await
                .map_err(SummaryError::ImageFsInfo)?;
            let mount = info
                .image_filesystems
                .iter()
                .find_map(|f| f.fs_id.as_ref().map(|id| id.mountpoint.clone()))
                .ok_or(SummaryError::NoImageFs)?;
            let dev = |path: &std::path::Path| {
                std::fs::metadata(path)
                    .map(|m| m.dev())
                    .map_err(|e| SummaryError::Stat {
                        path: path.display().to_string(),
                        error: e.to_string(),
                    })
            };
            let image_dev = dev(std::path::Path::new(&mount))?;
            let root_dev = dev(&self.root_dir)?;
            Ok(image_dev != root_dev)
        })
    }
}

/// What eviction reads from the node's summary, for `pods` (by UID).
pub fn eviction_summary(s: &types::Summary, pods: &[Arc<Pod>], now: Instant) -> Summary {
    let memory = |m: Option<&types::MemoryStats>| {
        let m = m?;
        Some(MemoryStats {
            available: m.available_bytes?,
            working_set: m.working_set_bytes?,
            usage: m.usage_bytes.unwrap_or(0),
            time: now,
        })
    };
    let fs = |f: Option<&types::FsStats>| {
        let f = f?;
        Some(FsStats {
            capacity: f.capacity_bytes?,
            available: f.available_bytes?,
            inodes: f.inodes.unwrap_or(0),
            inodes_free: f.inodes_free.unwrap_or(0),
            time: now,
        })
    };
    let runtime = s.node.runtime.as_ref();
    let image_fs = fs(runtime.and_then(|r| r.image_fs.as_ref()));
    let container_fs = fs(runtime.and_then(|r| r.container_fs.as_ref())).or(image_fs);
    let pods_memory = memory(
        s.node
            .system_containers
            .iter()
            .find(|c| c.name == "pods")
            .and_then(|c| c.memory.as_ref()),
    );
    let rlimit = s.node.rlimit.as_ref().and_then(|r| {
        Some(RlimitStats {
            max_pid: u64::try_from(r.max_pid?).ok()?,
            running: u64::try_from(r.cur_proc?).ok()?,
            time: now,
        })
    });
    let by_uid: BTreeMap<&str, &types::PodStats> =
        s.pods.iter().map(|p| (p.pod_ref.uid.as_str(), p)).collect();
    let mut out = BTreeMap::new();
    for pod in pods {
        let uid = pod.metadata.uid.as_deref().unwrap_or_default();
        let Some(p) = by_uid.get(uid) else {
            continue;
        };
        out.insert(uid.to_string(), pod_stats(pod, p));
    }
    Summary {
        node_memory: memory(s.node.memory.as_ref()),
        pods_memory,
        node_fs: fs(s.node.fs.as_ref()),
        image_fs,
        container_fs,
        rlimit,
        pods: out,
    }
}

fn usage(f: Option<&types::FsStats>) -> Option<DiskUsage> {
    let f = f?;
    Some(DiskUsage {
        used_bytes: f.used_bytes?,
        inodes_used: f.inodes_used.unwrap_or(0),
    })
}

fn pod_stats(pod: &Pod, p: &types::PodStats) -> PodStats {
    let containers = p
        .containers
        .iter()
        .map(|c| ContainerStats {
            name: c.name.clone(),
            memory_working_set: c.memory.as_ref().and_then(|m| m.working_set_bytes),
            rootfs: usage(c.rootfs.as_ref()),
            logs: usage(c.logs.as_ref()),
        })
        .collect();
    let measured: BTreeMap<&str, bool> = pod
        .spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .filter_map(|v| measured_volume(v).map(|(_, local)| (v.name.as_str(), local)))
        .collect();
    let volumes = p
        .volume_stats
        .iter()
        .filter_map(|v| {
            let local = *measured.get(v.name.as_str())?;
            Some(VolumeStats {
                name: v.name.clone(),
                usage: usage(Some(&v.fs))?,
                local_ephemeral: local,
            })
        })
        .collect();
    PodStats {
        memory_working_set: p.memory.as_ref().and_then(|m| m.working_set_bytes),
        process_count: p.process_stats.as_ref().and_then(|s| s.process_count),
        containers,
        volumes,
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
    fn reads_what_eviction_needs_from_the_summary() {
        let fs = |cap: u64, avail: u64, used: Option<u64>| types::FsStats {
            capacity_bytes: Some(cap),
            available_bytes: Some(avail),
            used_bytes: used,
            inodes: Some(100),
            inodes_free: Some(40),
            inodes_used: used.map(|_| 3),
            ..Default::default()
        };
        let mem = |avail: Option<u64>, ws: u64| types::MemoryStats {
            available_bytes: avail,
            working_set_bytes: Some(ws),
            usage_bytes: Some(ws + 10),
            ..Default::default()
        };
        let summary = types::Summary {
            node: types::NodeStats {
                memory: Some(mem(Some(700), 300)),
                system_containers: vec![types::ContainerStats {
                    name: "pods".into(),
                    memory: Some(mem(None, 200)),
                    ..Default::default()
                }],
                fs: Some(fs(1000, 600, Some(400))),
                runtime: Some(types::RuntimeStats {
                    image_fs: Some(fs(2000, 1500, None)),
                    container_fs: None,
                }),
                rlimit: Some(types::RlimitStats {
                    max_pid: Some(4096),
                    cur_proc: Some(120),
                    ..Default::default()
                }),
                ..Default::default()
            },
            pods: vec![types::PodStats {
                pod_ref: types::PodReference {
                    name: "web".into(),
                    namespace: "default".into(),
                    uid: "u1".into(),
                },
                memory: Some(mem(None, 50)),
                process_stats: Some(types::ProcessStats {
                    process_count: Some(4),
                }),
                containers: vec![types::ContainerStats {
                    name: "app".into(),
                    memory: Some(mem(None, 45)),
                    rootfs: Some(fs(2000, 1500, Some(8))),
                    logs: Some(fs(1000, 600, Some(16))),
                    ..Default::default()
                }],
                volume_stats: vec![
                    types::VolumeStats {
                        name: "scratch".into(),
                        fs: fs(1000, 600, Some(32)),
                        ..Default::default()
                    },
                    types::VolumeStats {
                        name: "token".into(),
                        fs: fs(10, 10, Some(1)),
                        ..Default::default()
                    },
                ],
                ..Default::default()
            }],
        };
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web", "namespace": "default", "uid": "u1"},
            "spec": {"containers": [{"name": "app"}],
                     "volumes": [{"name": "scratch", "emptyDir": {}},
                                 {"name": "token", "secret": {"secretName": "s"}}]}
        }))
        .expect("pod");
        let other: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "gone", "namespace": "default", "uid": "u2"},
            "spec": {"containers": [{"name": "app"}]}
        }))
        .expect("pod");
        let now = Instant::now();
        let e = eviction_summary(&summary, &[Arc::new(pod), Arc::new(other)], now);
        let node = e.node_memory.expect("node memory");
        assert_eq!(
            (node.available, node.working_set, node.usage),
            (700, 300, 310)
        );
        assert_eq!(e.pods_memory, None, "no limit on kubepods: no signal");
        let nodefs = e.node_fs.expect("nodefs");
        assert_eq!(
            (
                nodefs.capacity,
                nodefs.available,
                nodefs.inodes,
                nodefs.inodes_free
            ),
            (1000, 600, 100, 40)
        );
        assert_eq!(e.image_fs.map(|f| f.capacity), Some(2000));
        assert_eq!(
            e.container_fs, e.image_fs,
            "containerfs falls back to imagefs"
        );
        let r = e.rlimit.expect("rlimit");
        assert_eq!((r.max_pid, r.running), (4096, 120));
        assert_eq!(e.pods.len(), 1, "only pods the summary has");
        let p = &e.pods["u1"];
        assert_eq!((p.memory_working_set, p.process_count), (Some(50), Some(4)));
        assert_eq!(p.containers[0].rootfs.map(|u| u.used_bytes), Some(8));
        assert_eq!(p.containers[0].logs.map(|u| u.used_bytes), Some(16));
        assert_eq!(p.volumes.len(), 1, "the secret volume is not measured");
        assert!(p.volumes[0].local_ephemeral);
        assert_eq!(p.ephemeral_storage_used(), 8 + 16 + 32);
    }
}
