//! keelson's configuration: one YAML file,
//! `apiVersion: keelson.dev/v1alpha1`, `kind: KeelsonConfiguration`, with a
//! `node:` section (KubeletConfiguration names) and a `proxy:` section
//! (KubeProxyConfiguration names). Unknown fields, wrong types and invalid
//! values fail at start with the field's path and the reason.
//!
//! ```
//! let cfg = keelson::config::Config::from_yaml_str("
//! apiVersion: keelson.dev/v1alpha1
//! kind: KeelsonConfiguration
//! node:
//!   maxPods: 50
//! ").unwrap();
//! assert_eq!(cfg.node.max_pods, 50);
//! assert_eq!(cfg.node.node_status_update_frequency.get().as_secs(), 10);
//! ```

pub mod duration;
pub mod eviction;
pub mod kubelet_api;
pub mod node;
pub mod node_labels;
pub mod proxy;
pub mod upstream;

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub use duration::KubeDuration;
pub use node::{CgroupDriver, NodeConfig};
pub use proxy::{ProxyConfig, ProxyMode};

use crate::quantity::Quantity;

/// The `apiVersion` keelson reads.
pub const API_VERSION: &str = "keelson.dev/v1alpha1";
/// The `kind` keelson reads.
pub const KIND: &str = "KeelsonConfiguration";
/// kubelet's healthz address (`healthzBindAddress` + `healthzPort`), the
/// default of [`Config::healthz_bind_address`] when the node role runs.
pub const NODE_HEALTHZ_BIND_ADDRESS: &str = "127.0.0.1:10248";
/// The diagnose socket's file name under `node.rootDir` (the default of
/// [`Config::diagnose_socket`] when the node role runs).
pub const DIAGNOSE_SOCKET_NAME: &str = "diagnose.sock";

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// Logging settings (`logging`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct LoggingConfig {
    /// `text` or `json`.
    pub format: LogFormat,
    /// A tracing filter: a level (`info`, `debug`) or directives
    /// (`info,keelson::proxy=debug`). `RUST_LOG` overrides it.
    pub level: String,
}

impl Default for LoggingConfig {
    fn default() -> Self {
        LoggingConfig {
            format: LogFormat::Text,
            level: "info".to_string(),
        }
    }
}

/// The whole configuration file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Config {
    /// Must be `keelson.dev/v1alpha1`.
    pub api_version: String,
    /// Must be `KeelsonConfiguration`.
    pub kind: String,
    /// This node's name (kubelet `--hostname-override`, kube-proxy
    /// `hostnameOverride`). Empty: the host name, lowercased.
    pub node_name: Option<String>,
    /// Where `/healthz`, `/livez` and `/readyz` are served: kubelet's
    /// healthz address. Unset: [`NODE_HEALTHZ_BIND_ADDRESS`] when the node
    /// role runs, nothing when only the proxy role runs (that port is
    /// kubelet's; kube-proxy's health is `proxy.healthzBindAddress`). Empty
    /// disables it.
    pub healthz_bind_address: Option<String>,
    /// Where `/metrics` is served (kube-proxy's `metricsBindAddress`, 127.0.0.1:10249).
    pub metrics_bind_address: String,
    /// The Unix socket `keelson diagnose` reads the daemon's state from
    /// (owner root, mode 0600). Unset: `<node.rootDir>/diagnose.sock` when
    /// the node role runs, none with only the proxy role (set it to serve
    /// one there). Empty disables it.
    pub diagnose_socket: Option<PathBuf>,
    /// Longest time shutdown may take before keelson exits anyway.
    pub shutdown_timeout: KubeDuration,
    /// Logging.
    pub logging: LoggingConfig,
    /// The node role (kubelet).
    pub node: NodeConfig,
    /// The proxy role (kube-proxy).
    pub proxy: ProxyConfig,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            api_version: API_VERSION.to_string(),
            kind: KIND.to_string(),
            node_name: None,
            healthz_bind_address: None,
            metrics_bind_address: "127.0.0.1:10249".to_string(),
            diagnose_socket: None,
            shutdown_timeout: KubeDuration::from_secs(30),
            logging: LoggingConfig::default(),
            node: NodeConfig::default(),
            proxy: ProxyConfig::default(),
        }
    }
}

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
    pub fn new(path: impl Into<String>, reason: impl Into<String>) -> Self {
        FieldError {
            path: path.into(),
            reason: reason.into(),
        }
    }
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.reason)
    }
}

/// Why a configuration could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("reading {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// YAML syntax error, wrong type or unknown field.
    #[error("{origin}: {path}: {reason}")]
    Parse {
        /// File name (or `<input>`).
        origin: String,
        /// Field path (`.` for the document).
        path: String,
        /// Parser message.
        reason: String,
    },
    /// Fields with invalid values.
    #[error("{origin}: invalid configuration:\n{}", .errors.iter().map(|e| format!("  {e}")).collect::<Vec<_>>().join("\n"))]
    Invalid {
        /// File name (or `<input>`).
        origin: String,
        /// Every invalid field.
        errors: Vec<FieldError>,
    },
    /// Problems across several files (upstream files included), each with
    /// the file it comes from, grouped by file.
    #[error("invalid configuration:{}", render_file_errors(.errors))]
    Files {
        /// (file, problem), in the order found.
        errors: Vec<(String, FieldError)>,
    },
}

impl ConfigError {
    /// The invalid field paths (empty for read errors), for tests and tools.
    pub fn field_paths(&self) -> Vec<String> {
        match self {
            ConfigError::Read { .. } => Vec::new(),
            ConfigError::Parse { path, .. } => vec![path.clone()],
            ConfigError::Invalid { errors, .. } => errors.iter().map(|e| e.path.clone()).collect(),
            ConfigError::Files { errors } => errors.iter().map(|(_, e)| e.path.clone()).collect(),
        }
    }
}

fn render_file_errors(errors: &[(String, FieldError)]) -> String {
    let mut out = String::new();
    let mut last: Option<&str> = None;
    for (origin, e) in errors {
        if last != Some(origin.as_str()) {
            out.push_str(&format!("\n  {origin}:"));
            last = Some(origin);
        }
        out.push_str(&format!("\n    {e}"));
    }
    out
}

/// Settings given on the command line; they win over the files.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    /// `--kubeconfig`: the node role's kubeconfig (kubelet's flag); with
    /// `--proxy-only`, the proxy role's (kube-proxy's flag).
    pub kubeconfig: Option<PathBuf>,
    /// `--proxy-kubeconfig`: the proxy role's kubeconfig.
    pub proxy_kubeconfig: Option<PathBuf>,
    /// `--bootstrap-kubeconfig`: the node role's bootstrap kubeconfig.
    pub bootstrap_kubeconfig: Option<PathBuf>,
    /// `--root-dir` (kubelet's flag): `node.rootDir`.
    pub root_dir: Option<PathBuf>,
    /// `--node-ip` (kubelet's flag): `node.nodeIP`.
    pub node_ip: Option<IpAddr>,
    /// `--node-name`.
    pub node_name: Option<String>,
    /// `--node-only`.
    pub node_only: bool,
    /// `--proxy-only`.
    pub proxy_only: bool,
    /// `--log-format`.
    pub log_format: Option<LogFormat>,
}

impl Config {
    /// Reads, parses and validates a file.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(&text, &path.display().to_string())
    }

    /// Parses and validates YAML text (for tests and examples).
    pub fn from_yaml_str(text: &str) -> Result<Config, ConfigError> {
        Self::parse(text, "<input>")
    }

    fn parse(text: &str, origin: &str) -> Result<Config, ConfigError> {
        let cfg: Config = if text.trim().is_empty() {
            Config::default()
        } else {
            let de = serde_yaml::Deserializer::from_str(text);
            serde_path_to_error::deserialize(de).map_err(|e| {
                let path = e.path().to_string();
                let inner = e.into_inner().to_string();
                ConfigError::Parse {
                    origin: origin.to_string(),
                    path: camel_path(&path),
                    reason: inner,
                }
            })?
        };
        cfg.validate().map_err(|errors| ConfigError::Invalid {
            origin: origin.to_string(),
            errors,
        })?;
        Ok(cfg)
    }

    /// Applies command-line overrides, then validates again.
    pub fn apply_overrides(&mut self, o: &Overrides) -> Result<(), ConfigError> {
        self.apply_overrides_unchecked(o);
        self.validate().map_err(|errors| ConfigError::Invalid {
            origin: "command line".to_string(),
            errors,
        })
    }

    /// Applies command-line overrides without validating.
    pub fn apply_overrides_unchecked(&mut self, o: &Overrides) {
        if let Some(k) = &o.kubeconfig {
            if o.proxy_only {
                self.proxy.client_connection.kubeconfig = Some(k.clone());
            } else {
                self.node.kubeconfig = Some(k.clone());
            }
        }
        if let Some(k) = &o.proxy_kubeconfig {
            self.proxy.client_connection.kubeconfig = Some(k.clone());
        }
        if let Some(k) = &o.bootstrap_kubeconfig {
            self.node.bootstrap_kubeconfig = Some(k.clone());
        }
        if let Some(d) = &o.root_dir {
            self.node.root_dir = d.clone();
        }
        if let Some(ip) = o.node_ip {
            self.node.node_ip = Some(ip);
        }
        if let Some(n) = &o.node_name {
            self.node_name = Some(n.clone());
        }
        if o.node_only {
            self.node.enabled = true;
            self.proxy.enabled = false;
        }
        if o.proxy_only {
            self.proxy.enabled = true;
            self.node.enabled = false;
        }
        if let Some(f) = o.log_format {
            self.logging.format = f;
        }
    }

    /// The effective YAML (defaults filled in), as `check-config` prints it.
    pub fn to_yaml(&self) -> String {
        serde_yaml::to_string(self).unwrap_or_else(|e| format!("# cannot render: {e}\n"))
    }

    /// Where keelson's own `/healthz` server listens, if anywhere: the
    /// configured address, else kubelet's port when the node role runs.
    /// A proxy-only keelson never takes kubelet's port by default, so it
    /// can run beside a real kubelet (as kube-proxy does).
    pub fn effective_healthz_bind_address(&self) -> Option<&str> {
        match self.healthz_bind_address.as_deref() {
            Some(a) => Some(a),
            None if self.node.enabled => Some(NODE_HEALTHZ_BIND_ADDRESS),
            None => None,
        }
    }

    /// Where the daemon serves its state to `keelson diagnose`, if
    /// anywhere: the configured path, else `<node.rootDir>/diagnose.sock`
    /// when the node role runs (like kubelet's sockets under its root dir).
    pub fn effective_diagnose_socket(&self) -> Option<PathBuf> {
        match &self.diagnose_socket {
            Some(p) if p.as_os_str().is_empty() => None,
            Some(p) => Some(p.clone()),
            None if self.node.enabled => Some(self.node.root_dir.join(DIAGNOSE_SOCKET_NAME)),
            None => None,
        }
    }

    /// This node's name: the configured one, else the host name lowercased.
    pub fn effective_node_name(&self) -> String {
        match self.node_name.as_deref() {
            Some(n) if !n.is_empty() => n.to_string(),
            _ => nix::unistd::gethostname()
                .ok()
                .and_then(|h| h.into_string().ok())
                .unwrap_or_else(|| "localhost".to_string())
                .to_lowercase(),
        }
    }

    /// Checks every value; returns all problems at once.
    pub fn validate(&self) -> Result<(), Vec<FieldError>> {
        let mut errs = Vec::new();
        if self.api_version != API_VERSION {
            errs.push(FieldError::new(
                "apiVersion",
                format!("must be {API_VERSION:?}, got {:?}", self.api_version),
            ));
        }
        if self.kind != KIND {
            errs.push(FieldError::new(
                "kind",
                format!("must be {KIND:?}, got {:?}", self.kind),
            ));
        }
        if let Some(n) = &self.node_name
            && !n.is_empty()
            && !is_dns_subdomain(n)
        {
            errs.push(FieldError::new(
                "nodeName",
                "must be a lowercase RFC 1123 subdomain (a-z, 0-9, '-', '.'; at most 253 characters)",
            ));
        }
        if let Some(a) = &self.healthz_bind_address {
            check_socket_addr(&mut errs, "healthzBindAddress", a);
        }
        check_socket_addr(&mut errs, "metricsBindAddress", &self.metrics_bind_address);
        if let Some(p) = &self.diagnose_socket
            && !p.as_os_str().is_empty()
            && !p.is_absolute()
        {
            errs.push(FieldError::new(
                "diagnoseSocket",
                "must be an absolute path (or empty to disable)",
            ));
        }
        if let Err(e) = tracing_subscriber::EnvFilter::try_new(&self.logging.level) {
            errs.push(FieldError::new("logging.level", e.to_string()));
        }
        if !self.node.enabled && !self.proxy.enabled {
            errs.push(FieldError::new(
                "node.enabled",
                "both roles are disabled (node.enabled and proxy.enabled are false): nothing to run",
            ));
        }
        self.validate_node(&mut errs);
        kubelet_api::validate(&self.node, &mut errs);
        self.validate_proxy(&mut errs);
        if errs.is_empty() { Ok(()) } else { Err(errs) }
    }

    fn validate_node(&self, errs: &mut Vec<FieldError>) {
        let n = &self.node;
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
        if period < std::time::Duration::from_millis(1)
            || period > std::time::Duration::from_secs(1)
        {
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
        if !n.image_maximum_gc_age.get().is_zero()
            && n.image_maximum_gc_age <= n.image_minimum_gc_age
        {
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
        if !(-1000..=1000).contains(&n.oom_score_adj) {
            errs.push(FieldError::new(
                "node.oomScoreAdj",
                "must be between -1000 and 1000, inclusive",
            ));
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
            if let Err(e) = crate::node::pods::admission::sysctl::check_pattern(pattern) {
                errs.push(FieldError::new(
                    format!("node.allowedUnsafeSysctls[{i}]"),
                    e,
                ));
            }
        }
        // kubelet's validation.go (KubeletEnsureSecretPulledImages on).
        let policy = n.image_pull_credentials_verification_policy.as_str();
        if let Err(e) =
            crate::node::pods::runtime::pull_records::VerificationPolicy::parse(policy, &[])
        {
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
        } else if let Err(e) = crate::node::pods::runtime::pull_records::Allowlist::new(
            &n.preloaded_images_verification_allowlist,
        ) {
            errs.push(FieldError::new(
                "node.preloadedImagesVerificationAllowlist",
                format!("invalid image pattern: {e}"),
            ));
        }
    }

    fn validate_proxy(&self, errs: &mut Vec<FieldError>) {
        let p = &self.proxy;
        check_socket_addr(errs, "proxy.healthzBindAddress", &p.healthz_bind_address);
        if p.sync_period.get().is_zero() {
            errs.push(FieldError::new(
                "proxy.syncPeriod",
                "must be greater than 0",
            ));
        }
        if p.min_sync_period > p.sync_period {
            errs.push(FieldError::new(
                "proxy.minSyncPeriod",
                "must not be longer than syncPeriod",
            ));
        }
        if !p.cluster_cidr.is_empty() {
            for part in p.cluster_cidr.split(',') {
                if part.trim().parse::<ipnet::IpNet>().is_err() {
                    errs.push(FieldError::new(
                        "proxy.clusterCIDR",
                        format!("{part:?} is not a CIDR"),
                    ));
                }
            }
        }
        for (i, a) in p.node_port_addresses.iter().enumerate() {
            if a != "primary" && a.parse::<ipnet::IpNet>().is_err() {
                errs.push(FieldError::new(
                    format!("proxy.nodePortAddresses[{i}]"),
                    format!("{a:?} is neither a CIDR nor \"primary\""),
                ));
            }
        }
        if p.node_port_addresses.len() > 1 && p.node_port_addresses.iter().any(|a| a == "primary") {
            errs.push(FieldError::new(
                "proxy.nodePortAddresses",
                "\"primary\" cannot be combined with CIDRs",
            ));
        }
        if !(0..=31).contains(&p.nftables.masquerade_bit) {
            errs.push(FieldError::new(
                "proxy.nftables.masqueradeBit",
                "must be between 0 and 31, inclusive",
            ));
        }
        if p.client_connection.qps < 0.0 {
            errs.push(FieldError::new(
                "proxy.clientConnection.qps",
                "must not be negative",
            ));
        }
        if p.client_connection.burst < 0 {
            errs.push(FieldError::new(
                "proxy.clientConnection.burst",
                "must not be negative",
            ));
        }
        if p.conntrack.max_per_core < 0 {
            errs.push(FieldError::new(
                "proxy.conntrack.maxPerCore",
                "must not be negative",
            ));
        }
        if p.conntrack.min < 0 {
            errs.push(FieldError::new(
                "proxy.conntrack.min",
                "must not be negative",
            ));
        }
        if !(-1000..=1000).contains(&p.oom_score_adj) {
            errs.push(FieldError::new(
                "proxy.oomScoreAdj",
                "must be between -1000 and 1000, inclusive",
            ));
        }
        if !p.ebpf.bpffs_path.is_absolute() {
            errs.push(FieldError::new(
                "proxy.ebpf.bpffsPath",
                "must be an absolute path",
            ));
        }
        if let Some(c) = &p.ebpf.cgroup_path
            && !c.is_absolute()
        {
            errs.push(FieldError::new(
                "proxy.ebpf.cgroupPath",
                "must be an absolute path",
            ));
        }
    }
}

fn check_socket_addr(errs: &mut Vec<FieldError>, path: &str, value: &str) {
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

/// serde_path_to_error prints Rust-side keys as written in the file already
/// (we rename to camelCase), so the path is the file's path; `.` for the root.
fn camel_path(p: &str) -> String {
    if p.is_empty() {
        ".".to_string()
    } else {
        p.to_string()
    }
}

/// An IP that is usable as the node's address (not loopback/unspecified).
pub fn usable_node_ip(ip: IpAddr) -> bool {
    !(ip.is_loopback() || ip.is_unspecified() || ip.is_multicast())
}

#[cfg(test)]
mod tests;
