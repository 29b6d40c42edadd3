//! The `node:` section: the kubelet replacement's settings. Field names,
//! meanings and defaults follow KubeletConfiguration (kubelet.config.k8s.io/v1beta1)
//! where the same setting exists there; `docs/configuration.md` lists each one.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::PathBuf;

use k8s_openapi::api::core::v1::Taint;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde::{Deserialize, Deserializer, Serialize};

use super::duration::KubeDuration;
use super::eviction::default_eviction_hard;
use super::kubelet_api::{KubeletAuthentication, KubeletAuthorization};
use super::shutdown::ShutdownGracePeriodByPodPriority;

/// How pod and QoS cgroups are named and created.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum CgroupDriver {
    /// keelson writes the cgroup filesystem itself (kubelet's `cgroupfs`).
    #[default]
    Cgroupfs,
    /// Pod and QoS cgroups are transient systemd slices created over D-Bus
    /// (kubelet's `systemd`; kubeadm's default).
    Systemd,
}

/// The node role's settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct NodeConfig {
    /// Run the node role (kubelet). `--proxy-only` turns it off.
    pub enabled: bool,
    /// Kubeconfig with the node's credentials (kubelet `--kubeconfig`).
    /// Empty: `--kubeconfig`, then `$KUBECONFIG`, then in-cluster.
    pub kubeconfig: Option<PathBuf>,
    /// The node's IP (kubelet `--node-ip`). Empty: the source address of the
    /// default route; never a loopback address.
    #[serde(rename = "nodeIP")]
    pub node_ip: Option<IpAddr>,
    /// Where keelson keeps pod volumes and its own state (kubelet `--root-dir`).
    pub root_dir: PathBuf,
    /// Where container logs go (`podLogsDir`).
    pub pod_logs_dir: PathBuf,
    /// Directory of static pod manifests (`staticPodPath`); empty disables.
    pub static_pod_path: Option<PathBuf>,
    /// How often the static pod directory is re-read (`fileCheckFrequency`).
    pub file_check_frequency: KubeDuration,
    /// Maximum time between full pod syncs (`syncFrequency`).
    pub sync_frequency: KubeDuration,
    /// CRI endpoint of the container runtime (`containerRuntimeEndpoint`).
    pub container_runtime_endpoint: String,
    /// CRI image service endpoint; empty means the runtime endpoint
    /// (`imageServiceEndpoint`). A different endpoint is refused by validation.
    pub image_service_endpoint: Option<String>,
    /// Deadline of every CRI call except image pulls (`runtimeRequestTimeout`).
    pub runtime_request_timeout: KubeDuration,
    /// Pods this node accepts; also `status.capacity.pods` (`maxPods`).
    pub max_pods: i32,
    /// Per-pod PID limit, -1 for none (`podPidsLimit`).
    pub pod_pids_limit: i64,
    /// The node's pod CIDR when not assigned by the control plane (`podCIDR`).
    #[serde(rename = "podCIDR")]
    pub pod_cidr: String,
    /// DNS servers for `ClusterFirst` pods (`clusterDNS`).
    #[serde(rename = "clusterDNS")]
    pub cluster_dns: Vec<IpAddr>,
    /// Cluster DNS domain for search paths (`clusterDomain`).
    pub cluster_domain: String,
    /// Resolver file used as the base for pod DNS (`resolvConf`).
    pub resolv_conf: PathBuf,
    /// How pod and QoS cgroups are made: `cgroupfs` or `systemd`
    /// (`cgroupDriver`). A runtime that reports its driver (CRI
    /// `RuntimeConfig`) is followed, as kubelet does.
    pub cgroup_driver: CgroupDriver,
    /// Root of the `kubepods` hierarchy (`cgroupRoot`).
    pub cgroup_root: String,
    /// Create QoS-level cgroups (`cgroupsPerQOS`).
    #[serde(rename = "cgroupsPerQOS")]
    pub cgroups_per_qos: bool,
    /// Enforce CPU limits with CFS quota (`cpuCFSQuota`).
    #[serde(rename = "cpuCFSQuota")]
    pub cpu_cfs_quota: bool,
    /// CFS period for CPU limits (`cpuCFSQuotaPeriod`).
    #[serde(rename = "cpuCFSQuotaPeriod")]
    pub cpu_cfs_quota_period: KubeDuration,
    /// Resources set aside for Kubernetes daemons (`kubeReserved`).
    pub kube_reserved: BTreeMap<String, String>,
    /// Resources set aside for the OS (`systemReserved`).
    pub system_reserved: BTreeMap<String, String>,
    /// Hard eviction thresholds (`evictionHard`). When given, replaces the
    /// defaults as a whole, like kubelet without MergeDefaultEvictionSettings.
    pub eviction_hard: BTreeMap<String, String>,
    /// Soft eviction thresholds (`evictionSoft`).
    pub eviction_soft: BTreeMap<String, String>,
    /// Grace period of each soft threshold (`evictionSoftGracePeriod`).
    pub eviction_soft_grace_period: BTreeMap<String, KubeDuration>,
    /// Minimum time a pressure condition stays after the signal recovers
    /// (`evictionPressureTransitionPeriod`).
    pub eviction_pressure_transition_period: KubeDuration,
    /// Longest grace period given to pods evicted by a soft threshold, in
    /// seconds; 0 or less means the pod's own (`evictionMaxPodGracePeriod`).
    pub eviction_max_pod_grace_period: i32,
    /// Extra reclaim beyond a threshold (`evictionMinimumReclaim`).
    pub eviction_minimum_reclaim: BTreeMap<String, String>,
    /// Let the kernel signal crossed memory eviction thresholds (cgroup v1
    /// `cgroup.event_control`) instead of waiting for the next 10 s check
    /// (`kernelMemcgNotification`).
    pub kernel_memcg_notification: bool,
    /// Image GC starts above this disk usage percentage (`imageGCHighThresholdPercent`).
    #[serde(rename = "imageGCHighThresholdPercent")]
    pub image_gc_high_threshold_percent: i32,
    /// Image GC frees down to this usage percentage (`imageGCLowThresholdPercent`).
    #[serde(rename = "imageGCLowThresholdPercent")]
    pub image_gc_low_threshold_percent: i32,
    /// Unused images younger than this are kept (`imageMinimumGCAge`).
    #[serde(rename = "imageMinimumGCAge")]
    pub image_minimum_gc_age: KubeDuration,
    /// Unused images older than this are removed; 0 disables (`imageMaximumGCAge`).
    #[serde(rename = "imageMaximumGCAge")]
    pub image_maximum_gc_age: KubeDuration,
    /// Pull one image at a time (`serializeImagePulls`).
    pub serialize_image_pulls: bool,
    /// Parallel pull limit when not serialized (`maxParallelImagePulls`).
    pub max_parallel_image_pulls: Option<i32>,
    /// How often node status is computed (`nodeStatusUpdateFrequency`).
    pub node_status_update_frequency: KubeDuration,
    /// Longest time between status writes when nothing changed (`nodeStatusReportFrequency`).
    pub node_status_report_frequency: KubeDuration,
    /// Lease duration in seconds; renewed every quarter of it (`nodeLeaseDurationSeconds`).
    pub node_lease_duration_seconds: i32,
    /// Images listed in node status, largest first; -1 for all (`nodeStatusMaxImages`).
    pub node_status_max_images: i32,
    /// Create the Node object when missing (`registerNode`).
    pub register_node: bool,
    /// Taints set when the Node is first registered (`registerWithTaints`).
    /// Items have core/v1 Taint's shape; unknown item fields are refused.
    #[serde(deserialize_with = "deserialize_taints")]
    pub register_with_taints: Vec<Taint>,
    /// Labels set when the Node is registered (kubelet `--node-labels`).
    pub node_labels: BTreeMap<String, String>,
    /// Cloud provider ID for `spec.providerID` (`providerID`).
    #[serde(rename = "providerID")]
    pub provider_id: String,
    /// kubelet's `--cloud-provider`: `""` (none) or `external` (a cloud
    /// controller manager initializes the Node: keelson registers it with
    /// the `node.cloudprovider.kubernetes.io/uninitialized` taint and
    /// leaves `status.addresses` to it). In-tree providers are refused, as
    /// kubelet v1.36 refuses them.
    pub cloud_provider: String,
    /// Client-side request rate to the API server (`kubeAPIQPS`).
    #[serde(rename = "kubeAPIQPS")]
    pub kube_api_qps: f32,
    /// Client-side burst to the API server (`kubeAPIBurst`).
    #[serde(rename = "kubeAPIBurst")]
    pub kube_api_burst: i32,
    /// Unsafe sysctls (or `prefix*` patterns) pods may set beyond kubelet's
    /// safe list (`allowedUnsafeSysctls`); others fail admission with
    /// `SysctlForbidden`.
    pub allowed_unsafe_sysctls: Vec<String>,
    /// Which images on the node a pod may use without showing credentials
    /// that pulled them (`imagePullCredentialsVerificationPolicy`):
    /// `NeverVerify`, `NeverVerifyPreloadedImages` (images the node did not
    /// pull), `NeverVerifyAllowlistedImages`, `AlwaysVerify`.
    pub image_pull_credentials_verification_policy: String,
    /// Images (names, or `registry/path/*`) any pod may use under
    /// `NeverVerifyAllowlistedImages` (`preloadedImagesVerificationAllowlist`).
    pub preloaded_images_verification_allowlist: Vec<String>,
    /// Credential provider plugin configuration, a file or a directory of
    /// `*.json`/`*.yaml`/`*.yml` files (kubelet's
    /// `--image-credential-provider-config`). Setting it or the bin dir
    /// turns the plugins on.
    pub image_credential_provider_config: Option<PathBuf>,
    /// Where the plugins' executables are (kubelet's
    /// `--image-credential-provider-bin-dir`).
    pub image_credential_provider_bin_dir: Option<PathBuf>,
    /// Address the node API (kubelet's HTTPS server) listens on (`address`).
    pub address: String,
    /// Port of the node API (`port`).
    pub port: i32,
    /// Port of the unauthenticated read-only API; 0 disables (`readOnlyPort`).
    pub read_only_port: i32,
    /// Serving certificate (followed by its CA chain) of the node API
    /// (`tlsCertFile`); unset: a self-signed one under `rootDir/pki/`.
    pub tls_cert_file: Option<PathBuf>,
    /// Private key of `tlsCertFile` (`tlsPrivateKeyFile`).
    pub tls_private_key_file: Option<PathBuf>,
    /// TLS 1.2 cipher suites offered, Go's names; empty: the defaults
    /// (`tlsCipherSuites`).
    pub tls_cipher_suites: Vec<String>,
    /// Lowest TLS version offered, Go's names (`tlsMinVersion`).
    pub tls_min_version: String,
    /// Who may call the node API (`authentication`).
    pub authentication: KubeletAuthentication,
    /// What callers may do (`authorization`).
    pub authorization: KubeletAuthorization,
    /// Serve exec, attach, port-forward, container logs and `/runningpods`
    /// (`enableDebuggingHandlers`).
    pub enable_debugging_handlers: bool,
    /// Longest time a proxied exec/attach/port-forward stream may stay idle
    /// (`streamingConnectionIdleTimeout`).
    pub streaming_connection_idle_timeout: KubeDuration,
    /// Size at which a container log is rotated; negative disables rotation
    /// (`containerLogMaxSize`).
    pub container_log_max_size: String,
    /// Log files kept per container, the live one included (`containerLogMaxFiles`).
    pub container_log_max_files: i32,
    /// Concurrent log rotations (`containerLogMaxWorkers`).
    pub container_log_max_workers: i32,
    /// How often container log sizes are checked (`containerLogMonitorInterval`).
    pub container_log_monitor_interval: KubeDuration,
    /// How often the node API's statistics are sampled: `/stats/summary`
    /// and the resource metrics serve the latest sample (kubelet's
    /// `--housekeeping-interval`, cAdvisor's housekeeping; no
    /// KubeletConfiguration field).
    pub housekeeping_interval: KubeDuration,
    /// How often each pod's volume usage is measured for `/stats/summary`
    /// and the `kubelet_volume_stats_*` metrics (`volumeStatsAggPeriod`;
    /// kubelet's `fsResourceAnalyzer` period, each pod's calculator
    /// jittered up to twice it).
    pub volume_stats_agg_period: KubeDuration,
    /// Kubeconfig used to request the node's client certificate when
    /// `kubeconfig` is missing or its certificate expired (kubelet
    /// `--bootstrap-kubeconfig`). Empty: no TLS bootstrap.
    pub bootstrap_kubeconfig: Option<PathBuf>,
    /// Renew the node's client certificate before it expires and use the new
    /// one without a restart (`rotateCertificates`).
    pub rotate_certificates: bool,
    /// Request the node API's serving certificate from the cluster (a
    /// `kubernetes.io/kubelet-serving` CSR someone else approves), renew it
    /// at 70–90 % of its lifetime and serve the new one without a restart
    /// (`serverTLSBootstrap`).
    #[serde(rename = "serverTLSBootstrap")]
    pub server_tls_bootstrap: bool,
    /// OOM score adjustment of keelson's own process, -1000..=1000
    /// (`oomScoreAdj`). Lowering it needs CAP_SYS_RESOURCE; a refused write
    /// is logged.
    pub oom_score_adj: i32,
    /// Refuse to start while swap is enabled on the node (`failSwapOn`).
    /// Containers get no swap either way (`memorySwap.swapBehavior:
    /// NoSwap`, the only behaviour keelson implements).
    pub fail_swap_on: bool,
    /// Let the kernel's OOM killer take a single process of a container
    /// (`singleProcessOOMKill`). Unset: true on cgroup v1, false on v2,
    /// where a container then gets `memory.oom.group=1` and an OOM kill
    /// takes all of its processes.
    #[serde(
        rename = "singleProcessOOMKill",
        skip_serializing_if = "Option::is_none"
    )]
    pub single_process_oom_kill: Option<bool>,
    /// Refuse to start on a host with cgroup v1 (`failCgroupV1`). keelson
    /// supports cgroup v1, so its own default is false; a KubeletConfiguration
    /// file gets upstream's default (true).
    #[serde(rename = "failCgroupV1")]
    pub fail_cgroup_v1: bool,
    /// How long the node holds its shutdown back for pods to stop, all
    /// priorities together (`shutdownGracePeriod`); 0 turns graceful node
    /// shutdown off.
    pub shutdown_grace_period: KubeDuration,
    /// The part of `shutdownGracePeriod` kept for critical pods
    /// (`shutdownGracePeriodCriticalPods`).
    pub shutdown_grace_period_critical_pods: KubeDuration,
    /// Grace periods by pod priority, instead of the two fields above
    /// (`shutdownGracePeriodByPodPriority`).
    pub shutdown_grace_period_by_pod_priority: Vec<ShutdownGracePeriodByPodPriority>,
}

impl Default for NodeConfig {
    fn default() -> Self {
        NodeConfig {
            enabled: true,
            kubeconfig: None,
            node_ip: None,
            root_dir: PathBuf::from("/var/lib/keelson"),
            pod_logs_dir: PathBuf::from("/var/log/pods"),
            static_pod_path: None,
            file_check_frequency: KubeDuration::from_secs(20),
            sync_frequency: KubeDuration::from_secs(60),
            container_runtime_endpoint: "unix:///run/containerd/containerd.sock".to_string(),
            image_service_endpoint: None,
            runtime_request_timeout: KubeDuration::from_secs(120),
            max_pods: 110,
            pod_pids_limit: -1,
            pod_cidr: String::new(),
            cluster_dns: Vec::new(),
            cluster_domain: String::new(),
            resolv_conf: PathBuf::from("/etc/resolv.conf"),
            cgroup_driver: CgroupDriver::Cgroupfs,
            cgroup_root: "/".to_string(),
            cgroups_per_qos: true,
            cpu_cfs_quota: true,
            cpu_cfs_quota_period: KubeDuration::from_millis(100),
            kube_reserved: BTreeMap::new(),
            system_reserved: BTreeMap::new(),
            eviction_hard: default_eviction_hard(),
            eviction_soft: BTreeMap::new(),
            eviction_soft_grace_period: BTreeMap::new(),
            eviction_pressure_transition_period: KubeDuration::from_secs(300),
            eviction_max_pod_grace_period: 0,
            eviction_minimum_reclaim: BTreeMap::new(),
            kernel_memcg_notification: false,
            image_gc_high_threshold_percent: 85,
            image_gc_low_threshold_percent: 80,
            image_minimum_gc_age: KubeDuration::from_secs(120),
            image_maximum_gc_age: KubeDuration::from_secs(0),
            serialize_image_pulls: true,
            max_parallel_image_pulls: None,
            node_status_update_frequency: KubeDuration::from_secs(10),
            node_status_report_frequency: KubeDuration::from_secs(300),
            node_lease_duration_seconds: 40,
            node_status_max_images: 50,
            register_node: true,
            register_with_taints: Vec::new(),
            node_labels: BTreeMap::new(),
            provider_id: String::new(),
            cloud_provider: String::new(),
            kube_api_qps: 50.0,
            kube_api_burst: 100,
            allowed_unsafe_sysctls: Vec::new(),
            image_pull_credentials_verification_policy: "NeverVerifyPreloadedImages".to_string(),
            preloaded_images_verification_allowlist: Vec::new(),
            image_credential_provider_config: None,
            image_credential_provider_bin_dir: None,
            address: "0.0.0.0".to_string(),
            port: 10250,
            read_only_port: 0,
            tls_cert_file: None,
            tls_private_key_file: None,
            tls_cipher_suites: Vec::new(),
            tls_min_version: String::new(),
            authentication: KubeletAuthentication::default(),
            authorization: KubeletAuthorization::default(),
            enable_debugging_handlers: true,
            streaming_connection_idle_timeout: KubeDuration::from_secs(4 * 3600),
            container_log_max_size: "10Mi".to_string(),
            container_log_max_files: 5,
            container_log_max_workers: 1,
            container_log_monitor_interval: KubeDuration::from_secs(10),
            housekeeping_interval: KubeDuration::from_secs(10),
            volume_stats_agg_period: KubeDuration::from_secs(60),
            bootstrap_kubeconfig: None,
            rotate_certificates: true,
            server_tls_bootstrap: false,
            oom_score_adj: -999,
            fail_swap_on: true,
            single_process_oom_kill: None,
            fail_cgroup_v1: false,
            shutdown_grace_period: KubeDuration::from_secs(0),
            shutdown_grace_period_critical_pods: KubeDuration::from_secs(0),
            shutdown_grace_period_by_pod_priority: Vec::new(),
        }
    }
}

/// One `registerWithTaints` item as written in the file: core/v1 Taint's
/// fields, and nothing else. k8s-openapi's `Taint` skips unknown fields, so
/// the file is read through this type to keep "unknown fields fail".
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TaintConfig {
    key: String,
    #[serde(default)]
    value: Option<String>,
    effect: String,
    #[serde(default)]
    time_added: Option<Time>,
}

impl From<TaintConfig> for Taint {
    fn from(t: TaintConfig) -> Self {
        Taint {
            key: t.key,
            value: t.value,
            effect: t.effect,
            time_added: t.time_added,
        }
    }
}

impl NodeConfig {
    /// Whether a cloud controller manager outside keelson initializes the
    /// Node (`cloudProvider: external`).
    pub fn external_cloud_provider(&self) -> bool {
        self.cloud_provider == super::EXTERNAL_CLOUD_PROVIDER
    }
}

fn deserialize_taints<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Taint>, D::Error> {
    let items = Vec::<TaintConfig>::deserialize(d)?;
    Ok(items.into_iter().map(Taint::from).collect())
}
