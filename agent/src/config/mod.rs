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

pub mod proxy;
pub mod upstream;

// The node section lives with the node role (crate keelson-node); the
// durations and the small checks are shared with the proxy section.
pub use keelson_node::config::{
    FieldError, check_cloud_provider, check_socket_addr, duration, eviction, is_dns_subdomain,
    kubelet_api, node, node_labels, socket_addr, usable_node_ip,
};

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub use duration::KubeDuration;
pub use node::{CgroupDriver, NodeConfig};
pub use proxy::{ProxyConfig, ProxyMode};

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
    /// `--cloud-provider` (kubelet's flag): `node.cloudProvider`.
    pub cloud_provider: Option<String>,
    /// `--image-credential-provider-config` (kubelet's flag):
    /// `node.imageCredentialProviderConfig`.
    pub image_credential_provider_config: Option<PathBuf>,
    /// `--image-credential-provider-bin-dir` (kubelet's flag):
    /// `node.imageCredentialProviderBinDir`.
    pub image_credential_provider_bin_dir: Option<PathBuf>,
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
        if let Some(c) = &o.cloud_provider {
            self.node.cloud_provider = c.clone();
        }
        if let Some(p) = &o.image_credential_provider_config {
            self.node.image_credential_provider_config = Some(p.clone());
        }
        if let Some(p) = &o.image_credential_provider_bin_dir {
            self.node.image_credential_provider_bin_dir = Some(p.clone());
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
        keelson_node::config::validate(&self.node, &mut errs);
        kubelet_api::validate(&self.node, &mut errs);
        self.validate_proxy(&mut errs);
        if errs.is_empty() { Ok(()) } else { Err(errs) }
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

/// serde_path_to_error prints Rust-side keys as written in the file already
/// (we rename to camelCase), so the path is the file's path; `.` for the root.
fn camel_path(p: &str) -> String {
    if p.is_empty() {
        ".".to_string()
    } else {
        p.to_string()
    }
}

#[cfg(test)]
mod tests;
