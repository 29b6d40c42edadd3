//! The `node:` section of keelson's configuration (KubeletConfiguration
//! names), its validation, and the small checks both sections use. The
//! whole file (`Config`, the `proxy:` section, loading and upstream files)
//! is the binary's (`keelson::config`).

pub mod eviction;
pub mod kubelet_api;
pub mod node;
pub mod node_labels;
pub mod shutdown;

use std::fmt;
use std::net::{IpAddr, SocketAddr};

pub use keelson_common::duration::{self, KubeDuration};
pub use node::{CgroupDriver, NodeConfig};

use keelson_common::quantity::Quantity;

/// One invalid field: its path in the file and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// Dotted path, e.g. `node.maxPods` or `proxy.conntrack.min`.
    pub path: String,
    /// The reason.
    pub reason: String,
}

impl FieldError {
    /// Builds one.
    pub fn new(path: impl Into<String>, reason: impl fmt::Display) -> Self {
        FieldError {
            path: path.into(),
            reason: reason.to_string(),
        }
    }
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.reason)
    }
}

/// `cloudProvider` for a cloud controller manager outside kubelet
/// (cloud-provider's `IsExternal`).
pub const EXTERNAL_CLOUD_PROVIDER: &str = "external";

/// kubelet's check of `--cloud-provider` (pkg/kubelet/kubelet.go,
/// cloud-provider's `ErrorForDisabledProvider`): none or `external`.
pub fn check_cloud_provider(name: &str) -> Result<(), BuiltInCloudProvider> {
    if name.is_empty() || name == EXTERNAL_CLOUD_PROVIDER {
        return Ok(());
    }
    Err(BuiltInCloudProvider(name.to_string()))
}

/// `cloudProvider` names a built-in provider, which kubelet no longer has.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "cloud provider {0:?} was specified, but built-in cloud providers are disabled: set \"external\" and run the provider's external cloud controller manager, or leave it empty"
)]
pub struct BuiltInCloudProvider(pub String);

/// Checks every value of the `node:` section (paths `node.<field>`).
pub fn validate(n: &NodeConfig, errs: &mut Vec<FieldError>) {
    let positive = |errs: &mut Vec<FieldError>, path: &str, d: KubeDuration| {
        if d.get().is_zero() {
            errs.push(FieldError::new(
                format!("node.{path}"),
                "must be greater than 0",
            ));
        }
    };
    positive(errs, "fileCheckFrequency", n.file_check_frequency);
    positive(errs, "syncFrequency", n.sync_frequency);
    positive(errs, "runtimeRequestTimeout", n.runtime_request_timeout);
    positive(
        errs,
        "nodeStatusUpdateFrequency",
        n.node_status_update_frequency,
    );
    positive(
        errs,
        "nodeStatusReportFrequency",
        n.node_status_report_frequency,
    );
    positive(errs, "cpuCFSQuotaPeriod", n.cpu_cfs_quota_period);
    let period = n.cpu_cfs_quota_period.get();
    if period < std::time::Duration::from_millis(1) || period > std::time::Duration::from_secs(1) {
        errs.push(FieldError::new(
            "node.cpuCFSQuotaPeriod",
            "must be between 1ms and 1s, inclusive",
        ));
    }
    if n.max_pods <= 0 {
        errs.push(FieldError::new("node.maxPods", "must be greater than 0"));
    }
    if n.pod_pids_limit < -1 || n.pod_pids_limit == 0 {
        errs.push(FieldError::new(
            "node.podPidsLimit",
            "must be -1 (no limit) or greater than 0",
        ));
    }
    if n.node_lease_duration_seconds <= 0 {
        errs.push(FieldError::new(
            "node.nodeLeaseDurationSeconds",
            "must be greater than 0",
        ));
    }
    if n.node_status_max_images < -1 {
        errs.push(FieldError::new(
            "node.nodeStatusMaxImages",
            "must be -1 or greater",
        ));
    }
    if n.node_status_report_frequency < n.node_status_update_frequency {
        errs.push(FieldError::new(
            "node.nodeStatusReportFrequency",
            "must not be shorter than nodeStatusUpdateFrequency",
        ));
    }
    for (path, v) in [
        (
            "imageGCHighThresholdPercent",
            n.image_gc_high_threshold_percent,
        ),
        (
            "imageGCLowThresholdPercent",
            n.image_gc_low_threshold_percent,
        ),
    ] {
        if !(0..=100).contains(&v) {
            errs.push(FieldError::new(
                format!("node.{path}"),
                "must be between 0 and 100, inclusive",
            ));
        }
    }
    if n.image_gc_low_threshold_percent >= n.image_gc_high_threshold_percent {
        errs.push(FieldError::new(
            "node.imageGCLowThresholdPercent",
            "must be less than imageGCHighThresholdPercent",
        ));
    }
    if !n.image_maximum_gc_age.get().is_zero() && n.image_maximum_gc_age <= n.image_minimum_gc_age {
        errs.push(FieldError::new(
            "node.imageMaximumGCAge",
            "must be greater than imageMinimumGCAge",
        ));
    }
    if let Some(p) = n.max_parallel_image_pulls {
        if p < 1 {
            errs.push(FieldError::new(
                "node.maxParallelImagePulls",
                "must be greater than 0",
            ));
        } else if n.serialize_image_pulls && p > 1 {
            errs.push(FieldError::new(
                "node.maxParallelImagePulls",
                "must be 1 or unset when serializeImagePulls is true",
            ));
        }
    }
    if n.kube_api_qps <= 0.0 {
        errs.push(FieldError::new("node.kubeAPIQPS", "must be greater than 0"));
    }
    if n.kube_api_burst <= 0 {
        errs.push(FieldError::new(
            "node.kubeAPIBurst",
            "must be greater than 0",
        ));
    }
    if !n.container_runtime_endpoint.starts_with("unix://") {
        errs.push(FieldError::new(
            "node.containerRuntimeEndpoint",
            "must be a unix:// socket endpoint",
        ));
    }
    if let Some(e) = &n.image_service_endpoint
        && !e.is_empty()
    {
        if !e.starts_with("unix://") {
            errs.push(FieldError::new(
                "node.imageServiceEndpoint",
                "must be a unix:// socket endpoint",
            ));
        } else if *e != n.container_runtime_endpoint {
            errs.push(FieldError::new(
                "node.imageServiceEndpoint",
                "a separate image service is not supported: leave it empty or set it to containerRuntimeEndpoint",
            ));
        }
    }
    if let Some(ip) = n.node_ip
        && (ip.is_loopback() || ip.is_unspecified())
    {
        errs.push(FieldError::new(
            "node.nodeIP",
            "must not be a loopback or unspecified address",
        ));
    }
    if !n.pod_cidr.is_empty() {
        for part in n.pod_cidr.split(',') {
            if part.trim().parse::<ipnet::IpNet>().is_err() {
                errs.push(FieldError::new(
                    "node.podCIDR",
                    format!("{part:?} is not a CIDR"),
                ));
            }
        }
    }
    if !n.cgroup_root.starts_with('/') {
        errs.push(FieldError::new(
            "node.cgroupRoot",
            "must be an absolute cgroup path",
        ));
    }
    if !n.root_dir.is_absolute() {
        errs.push(FieldError::new("node.rootDir", "must be an absolute path"));
    }
    if !n.pod_logs_dir.is_absolute() {
        errs.push(FieldError::new(
            "node.podLogsDir",
            "must be an absolute path",
        ));
    }
    for (field, list) in [
        ("kubeReserved", &n.kube_reserved),
        ("systemReserved", &n.system_reserved),
    ] {
        for (res, val) in list {
            if !matches!(res.as_str(), "cpu" | "memory" | "ephemeral-storage" | "pid") {
                errs.push(FieldError::new(
                    format!("node.{field}[{res:?}]"),
                    "unknown resource (cpu, memory, ephemeral-storage, pid)",
                ));
            }
            match Quantity::parse(val) {
                Ok(q) if q.is_negative() => errs.push(FieldError::new(
                    format!("node.{field}[{res:?}]"),
                    "must not be negative",
                )),
                Ok(_) => {}
                Err(e) => errs.push(FieldError::new(
                    format!("node.{field}[{res:?}]"),
                    e.to_string(),
                )),
            }
        }
    }
    if let Err(mut e) = eviction::parse_thresholds(
        &n.eviction_hard,
        &n.eviction_soft,
        &n.eviction_soft_grace_period,
        &n.eviction_minimum_reclaim,
    ) {
        errs.append(&mut e);
    }
    if n.cluster_domain.starts_with('.') || n.cluster_domain.ends_with('.') {
        errs.push(FieldError::new(
            "node.clusterDomain",
            "must not start or end with '.'",
        ));
    }
    node_labels::validate(&n.node_labels, errs);
    shutdown::validate(n, errs);
    if !(-1000..=1000).contains(&n.oom_score_adj) {
        errs.push(FieldError::new(
            "node.oomScoreAdj",
            "must be between -1000 and 1000, inclusive",
        ));
    }
    // pkg/kubelet/kubelet.go (NewMainKubelet): in-tree cloud providers
    // were removed; cloud-provider's ErrorForDisabledProvider.
    if let Err(e) = check_cloud_provider(&n.cloud_provider) {
        errs.push(FieldError::new("node.cloudProvider", e));
    }
    for (i, t) in n.register_with_taints.iter().enumerate() {
        if !matches!(
            t.effect.as_str(),
            "NoSchedule" | "PreferNoSchedule" | "NoExecute"
        ) {
            errs.push(FieldError::new(
                format!("node.registerWithTaints[{i}].effect"),
                "must be NoSchedule, PreferNoSchedule or NoExecute",
            ));
        }
        if t.key.is_empty() {
            errs.push(FieldError::new(
                format!("node.registerWithTaints[{i}].key"),
                "must not be empty",
            ));
        }
    }
    for (i, pattern) in n.allowed_unsafe_sysctls.iter().enumerate() {
        if let Err(e) = crate::pods::admission::sysctl::check_pattern(pattern) {
            errs.push(FieldError::new(
                format!("node.allowedUnsafeSysctls[{i}]"),
                e,
            ));
        }
    }
    // kubelet's validation.go (KubeletEnsureSecretPulledImages on).
    let policy = n.image_pull_credentials_verification_policy.as_str();
    if let Err(e) = crate::pods::runtime::pull_records::VerificationPolicy::parse(policy, &[]) {
        errs.push(FieldError::new(
            "node.imagePullCredentialsVerificationPolicy",
            e,
        ));
    }
    if !n.preloaded_images_verification_allowlist.is_empty()
        && policy != "NeverVerifyAllowlistedImages"
    {
        errs.push(FieldError::new(
            "node.preloadedImagesVerificationAllowlist",
            "can't be set if imagePullCredentialsVerificationPolicy is not \"NeverVerifyAllowlistedImages\"",
        ));
    } else if let Err(e) = crate::pods::runtime::pull_records::Allowlist::new(
        &n.preloaded_images_verification_allowlist,
    ) {
        errs.push(FieldError::new(
            "node.preloadedImagesVerificationAllowlist",
            format!("invalid image pattern: {e}"),
        ));
    }
}

/// Records an error when `value` is neither empty nor an `IP:port`.
pub fn check_socket_addr(errs: &mut Vec<FieldError>, path: &str, value: &str) {
    if value.is_empty() {
        return; // empty disables the server
    }
    if value.parse::<SocketAddr>().is_err() {
        errs.push(FieldError::new(
            path,
            format!("{value:?} is not an IP:port address (empty disables the server)"),
        ));
    }
}

/// Parses an `IP:port` setting already validated.
pub fn socket_addr(value: &str) -> Option<SocketAddr> {
    value.parse().ok()
}

/// True for a lowercase RFC 1123 subdomain.
pub fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

/// An IP that is usable as the node's address (not loopback/unspecified).
pub fn usable_node_ip(ip: IpAddr) -> bool {
    !(ip.is_loopback() || ip.is_unspecified() || ip.is_multicast())
}
