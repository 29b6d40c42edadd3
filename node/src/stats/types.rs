//! The Summary API's JSON (`stats/v1alpha1`,
//! `staging/src/k8s.io/kubelet/pkg/apis/stats/v1alpha1/types.go`), field
//! names and omissions as kubelet writes them. Times are RFC 3339 strings.

use serde::Serialize;

/// `/stats/summary`.
#[derive(Debug, Clone, Serialize, Default, PartialEq)]
pub struct Summary {
    /// The node.
    pub node: NodeStats,
    /// Its pods.
    pub pods: Vec<PodStats>,
}

impl Summary {
    /// The part `GetCPUAndMemoryStats` reports (`?only_cpu_and_memory=true`
    /// and `/metrics/resource`): the node's and the system containers'
    /// CPU and memory, and each pod's and container's.
    pub fn cpu_and_memory(&self) -> Summary {
        let node = &self.node;
        Summary {
            node: NodeStats {
                node_name: node.node_name.clone(),
                system_containers: node
                    .system_containers
                    .iter()
                    .map(ContainerStats::cpu_and_memory)
                    .collect(),
                start_time: node.start_time.clone(),
                cpu: node.cpu.clone(),
                memory: node.memory.clone(),
                ..Default::default()
            },
            pods: self
                .pods
                .iter()
                .map(|p| PodStats {
                    pod_ref: p.pod_ref.clone(),
                    start_time: p.start_time.clone(),
                    containers: p
                        .containers
                        .iter()
                        .map(ContainerStats::cpu_and_memory)
                        .collect(),
                    cpu: p.cpu.clone(),
                    memory: p.memory.clone(),
                    ..Default::default()
                })
                .collect(),
        }
    }
}

/// `NodeStats`.
#[derive(Debug, Clone, Serialize, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NodeStats {
    /// Node name.
    pub node_name: String,
    /// `pods` (the `kubepods` cgroup) and the like.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub system_containers: Vec<ContainerStats>,
    /// Boot time.
    pub start_time: String,
    /// CPU.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu: Option<CpuStats>,
    /// Memory.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryStats>,
    /// Network.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkStats>,
    /// The root dir's filesystem.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fs: Option<FsStats>,
    /// The runtime's filesystems.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub runtime: Option<RuntimeStats>,
    /// PIDs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rlimit: Option<RlimitStats>,
}

/// `RlimitStats`.
#[derive(Debug, Clone, Serialize, Default, PartialEq)]
pub struct RlimitStats {
    /// When.
    pub time: String,
    /// Max PIDs.
    #[serde(rename = "maxpid", skip_serializing_if = "Option::is_none")]
    pub max_pid: Option<i64>,
    /// Running processes.
    #[serde(rename = "curproc", skip_serializing_if = "Option::is_none")]
    pub cur_proc: Option<i64>,
}

/// `RuntimeStats`.
#[derive(Debug, Clone, Serialize, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RuntimeStats {
    /// Images.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image_fs: Option<FsStats>,
    /// Writable layers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub container_fs: Option<FsStats>,
}

/// `ProcessStats`.
#[derive(Debug, Clone, Serialize, Default, PartialEq)]
pub struct ProcessStats {
    /// Processes in the pod.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub process_count: Option<u64>,
}

/// `PodStats`.
#[derive(Debug, Clone, Serialize, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PodStats {
    /// The pod.
    pub pod_ref: PodReference,
    /// When its sandbox was created.
    pub start_time: String,
    /// Its containers.
    pub containers: Vec<ContainerStats>,
    /// CPU of the pod cgroup.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu: Option<CpuStats>,
    /// Memory of the pod cgroup.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryStats>,
    /// The pod network namespace's interfaces.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkStats>,
    /// Volumes.
    #[serde(rename = "volume", skip_serializing_if = "Vec::is_empty")]
    pub volume_stats: Vec<VolumeStats>,
    /// Writable layers + logs + local ephemeral volumes.
    #[serde(rename = "ephemeral-storage", skip_serializing_if = "Option::is_none")]
    pub ephemeral_storage: Option<FsStats>,
    /// Processes.
    #[serde(rename = "process_stats", skip_serializing_if = "Option::is_none")]
    pub process_stats: Option<ProcessStats>,
}

/// `ContainerStats`.
#[derive(Debug, Clone, Serialize, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ContainerStats {
    /// Name.
    pub name: String,
    /// When it started.
    pub start_time: String,
    /// CPU.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu: Option<CpuStats>,
    /// Memory.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryStats>,
    /// Writable layer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rootfs: Option<FsStats>,
    /// Log files.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub logs: Option<FsStats>,
}

impl ContainerStats {
    fn cpu_and_memory(&self) -> ContainerStats {
        ContainerStats {
            name: self.name.clone(),
            start_time: self.start_time.clone(),
            cpu: self.cpu.clone(),
            memory: self.memory.clone(),
            ..Default::default()
        }
    }
}

/// `PodReference`.
#[derive(Debug, Clone, Serialize, Default, PartialEq, Eq)]
pub struct PodReference {
    /// Name.
    pub name: String,
    /// Namespace.
    pub namespace: String,
    /// UID.
    pub uid: String,
}

/// `InterfaceStats`.
#[derive(Debug, Clone, Serialize, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct InterfaceStats {
    /// Interface.
    pub name: String,
    /// Received bytes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rx_bytes: Option<u64>,
    /// Receive errors.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rx_errors: Option<u64>,
    /// Sent bytes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tx_bytes: Option<u64>,
    /// Send errors.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tx_errors: Option<u64>,
}

/// `NetworkStats`: the default interface (`eth0`) inline, all in `interfaces`.
#[derive(Debug, Clone, Serialize, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct NetworkStats {
    /// When.
    pub time: String,
    /// The default interface.
    #[serde(flatten)]
    pub default: InterfaceStats,
    /// Every interface.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub interfaces: Vec<InterfaceStats>,
}

/// `CPUStats`.
#[derive(Debug, Clone, Serialize, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct CpuStats {
    /// When.
    pub time: String,
    /// Average usage over the last sampling window, in nanocores.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage_nano_cores: Option<u64>,
    /// Cumulative usage.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage_core_nano_seconds: Option<u64>,
}

/// `MemoryStats`.
#[derive(Debug, Clone, Serialize, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct MemoryStats {
    /// When.
    pub time: String,
    /// Limit (or capacity) minus working set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub available_bytes: Option<u64>,
    /// Usage.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage_bytes: Option<u64>,
    /// Usage minus inactive file pages.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub working_set_bytes: Option<u64>,
    /// Anonymous memory and swap cache.
    #[serde(rename = "rssBytes", skip_serializing_if = "Option::is_none")]
    pub rss_bytes: Option<u64>,
    /// Page faults.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub page_faults: Option<u64>,
    /// Major page faults.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub major_page_faults: Option<u64>,
}

/// `VolumeStats`.
#[derive(Debug, Clone, Serialize, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct VolumeStats {
    /// Usage.
    #[serde(flatten)]
    pub fs: FsStats,
    /// Volume name.
    pub name: String,
    /// The claim behind a `persistentVolumeClaim` or generic `ephemeral`
    /// volume.
    #[serde(rename = "pvcRef", skip_serializing_if = "Option::is_none")]
    pub pvc_ref: Option<PvcReference>,
    /// The CSI volume condition (kubelet's CSIVolumeHealth gate).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub volume_health_stats: Option<VolumeHealthStats>,
}

/// `PVCReference`.
#[derive(Debug, Clone, Serialize, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PvcReference {
    /// The claim's name.
    pub name: String,
    /// The claim's namespace (the pod's).
    pub namespace: String,
}

/// `VolumeHealthStats`.
#[derive(Debug, Clone, Copy, Serialize, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct VolumeHealthStats {
    /// The driver reports the volume abnormal.
    pub abnormal: bool,
}

/// `FsStats`.
#[derive(Debug, Clone, Serialize, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct FsStats {
    /// When.
    pub time: String,
    /// Available bytes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub available_bytes: Option<u64>,
    /// Capacity.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub capacity_bytes: Option<u64>,
    /// Used bytes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub used_bytes: Option<u64>,
    /// Free inodes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub inodes_free: Option<u64>,
    /// Inodes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub inodes: Option<u64>,
    /// Used inodes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub inodes_used: Option<u64>,
}

/// RFC 3339 (seconds, `Z`) of a system time, as `metav1.Time` marshals.
pub fn rfc3339(t: std::time::SystemTime) -> String {
    jiff::Timestamp::try_from(t)
        .map(|ts| ts.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
        .unwrap_or_default()
}

/// RFC 3339 of ns since the epoch.
pub fn rfc3339_ns(ns: i64) -> String {
    jiff::Timestamp::from_nanosecond(i128::from(ns))
        .map(|ts| ts.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
        .unwrap_or_default()
}
