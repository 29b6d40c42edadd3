//! What the eviction manager measures, in the shape of kubelet's stats
//! summary (the part eviction reads): node memory, the pods' (`kubepods`)
//! memory, the node, image and container filesystems, PIDs, and per-pod
//! usage (memory working set, processes, container writable layers and logs,
//! local volumes).
//!
//! [`SummaryProvider`] is the seam: [`super::stats_summary::StatsSummary`]
//! reads the node's statistics sampler; unit tests hand in figures.

use std::collections::BTreeMap;

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Pod;
use tokio::time::Instant;

/// Memory of the node or of the pods' cgroup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryStats {
    /// Capacity (node) or limit (pods) minus the working set.
    pub available: u64,
    /// Usage minus inactive file pages.
    pub working_set: u64,
    /// Usage as the cgroup reports it.
    pub usage: u64,
    /// When it was read.
    pub time: Instant,
}

/// One filesystem.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FsStats {
    /// Total bytes.
    pub capacity: u64,
    /// Bytes available to unprivileged users.
    pub available: u64,
    /// Total inodes.
    pub inodes: u64,
    /// Free inodes.
    pub inodes_free: u64,
    /// When it was read.
    pub time: Instant,
}

/// PID limits (kubelet's `RlimitStats`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RlimitStats {
    /// min(`kernel.pid_max`, `kernel.threads-max`).
    pub max_pid: u64,
    /// Tasks running now.
    pub running: u64,
    /// When it was read.
    pub time: Instant,
}

pub use crate::stats::DiskUsage;

/// One container of a pod.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ContainerStats {
    /// Container name.
    pub name: String,
    /// Memory working set.
    pub memory_working_set: Option<u64>,
    /// The writable layer.
    pub rootfs: Option<DiskUsage>,
    /// Its log files.
    pub logs: Option<DiskUsage>,
}

/// One volume of a pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeStats {
    /// Volume name.
    pub name: String,
    /// Its usage.
    pub usage: DiskUsage,
    /// A local ephemeral volume on the node's disk (emptyDir with the
    /// default medium, configMap): counts as the pod's
    /// ephemeral storage. Memory-backed volumes are measured only for
    /// their `sizeLimit`.
    pub local_ephemeral: bool,
}

/// One pod.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PodStats {
    /// Memory working set of the pod's cgroup.
    pub memory_working_set: Option<u64>,
    /// Processes in the pod.
    pub process_count: Option<u64>,
    /// Its containers.
    pub containers: Vec<ContainerStats>,
    /// Its local volumes (emptyDir on disk, ...).
    pub volumes: Vec<VolumeStats>,
}

impl PodStats {
    /// Total ephemeral storage (writable layers, logs, local volumes), as
    /// the summary's `EphemeralStorage` adds it up.
    pub fn ephemeral_storage_used(&self) -> u64 {
        let containers: u64 = self
            .containers
            .iter()
            .map(|c| {
                c.rootfs.map(|u| u.used_bytes).unwrap_or(0)
                    + c.logs.map(|u| u.used_bytes).unwrap_or(0)
            })
            .sum();
        let volumes: u64 = self
            .volumes
            .iter()
            .filter(|v| v.local_ephemeral)
            .map(|v| v.usage.used_bytes)
            .sum();
        containers + volumes
    }
}

/// Everything measured in one round.
#[derive(Debug, Clone, Default)]
pub struct Summary {
    /// The node's memory.
    pub node_memory: Option<MemoryStats>,
    /// The pods' cgroup memory (allocatable).
    pub pods_memory: Option<MemoryStats>,
    /// The filesystem of the root dir.
    pub node_fs: Option<FsStats>,
    /// Where the runtime keeps images.
    pub image_fs: Option<FsStats>,
    /// Where the runtime keeps writable layers.
    pub container_fs: Option<FsStats>,
    /// PIDs.
    pub rlimit: Option<RlimitStats>,
    /// Per pod, by UID.
    pub pods: BTreeMap<String, PodStats>,
}

/// Why the eviction manager has no figures this round.
#[derive(Debug, Clone, thiserror::Error)]
pub enum SummaryError {
    /// The statistics round failed.
    #[error(transparent)]
    Stats(#[from] crate::stats::StatsError),
    /// The runtime did not say where its images are.
    #[error("CRI ImageFsInfo failed: {0}")]
    ImageFsInfo(keelson_cri::CriError),
    /// The runtime's answer names no image filesystem.
    #[error("CRI ImageFsInfo names no image filesystem")]
    NoImageFs,
    /// A filesystem could not be examined.
    #[error("stat {path}: {error}")]
    Stat {
        /// What was examined.
        path: String,
        /// The system's error.
        error: String,
    },
}

/// Where summaries come from.
pub trait SummaryProvider: Send + Sync + 'static {
    /// Measures everything; `pods` are the pods to report per-pod usage for.
    fn summary<'a>(
        &'a self,
        pods: &'a [std::sync::Arc<Pod>],
    ) -> BoxFuture<'a, Result<Summary, SummaryError>>;

    /// Whether images live on another filesystem than the root dir.
    fn has_dedicated_image_fs(&self) -> BoxFuture<'_, Result<bool, SummaryError>>;
}
