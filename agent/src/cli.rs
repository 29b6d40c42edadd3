//! The command-line arguments both binaries share: `keelson` (every role)
//! and `keelson-proxy` (the proxy role alone, the DaemonSet form). Each
//! binary adds its own role selection ([`Roles`]); the configuration
//! sources and the settings that win over them are the same.

use std::path::PathBuf;

use crate::config::upstream::{self, Loaded, Sources};
use crate::config::{ConfigError, LogFormat, Overrides};

/// Which roles the command line asks for.
pub trait Roles: clap::Args + std::fmt::Debug {
    /// `(node_only, proxy_only)` as the configuration overrides take them.
    fn selection(&self) -> (bool, bool);

    /// What `check-config` checks beyond the files: the node role's
    /// credential provider plugins in `keelson` (nothing in
    /// `keelson-proxy`, which must not reach the node role's code).
    fn check_node(&self, _node: &keelson_node::config::NodeConfig) -> Result<(), CheckError> {
        Ok(())
    }
}

/// A check of `check-config` beyond the files failed.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    /// The credential provider plugins the node role would register.
    #[error("failed to register CRI auth plugins: {0}")]
    CredentialProviders(keelson_node::credentials::RegisterError),
}

/// `keelson`'s role flags.
#[derive(clap::Args, Debug, Default, Clone, Copy)]
pub struct RoleArgs {
    /// Run only the node role (kubelet).
    #[arg(long, conflicts_with = "proxy_only")]
    pub node_only: bool,
    /// Run only the proxy role (kube-proxy); the DaemonSet form.
    #[arg(long)]
    pub proxy_only: bool,
}

impl Roles for RoleArgs {
    fn selection(&self) -> (bool, bool) {
        (self.node_only, self.proxy_only)
    }

    /// The checks the node role runs at start (bin dir, configuration,
    /// executables), when it is enabled and a plugin setting is given.
    fn check_node(&self, n: &keelson_node::config::NodeConfig) -> Result<(), CheckError> {
        if !n.enabled
            || (n.image_credential_provider_config.is_none()
                && n.image_credential_provider_bin_dir.is_none())
        {
            return Ok(());
        }
        let empty = std::path::Path::new("");
        keelson_node::credentials::CredentialProviders::check(
            n.image_credential_provider_config
                .as_deref()
                .unwrap_or(empty),
            n.image_credential_provider_bin_dir
                .as_deref()
                .unwrap_or(empty),
        )
        .map(|_| ())
        .map_err(CheckError::CredentialProviders)
    }
}

/// `keelson-proxy`'s role flag: it runs the proxy role alone whatever the
/// files say, so its command line is `keelson run --proxy-only`'s.
#[derive(clap::Args, Debug, Default, Clone, Copy)]
pub struct ProxyOnlyArgs {
    /// Run only the proxy role (kube-proxy): always so for keelson-proxy;
    /// accepted so a `keelson run --proxy-only` command line works as is.
    #[arg(long)]
    pub proxy_only: bool,
}

impl Roles for ProxyOnlyArgs {
    fn selection(&self) -> (bool, bool) {
        (false, true)
    }
}

/// The configuration sources and the command-line settings that win over them.
#[derive(clap::Args, Debug, Default, Clone)]
pub struct SourceArgs {
    /// Configuration file (KeelsonConfiguration YAML). Defaults apply without one.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// kubelet's configuration file (KubeletConfiguration v1beta1), read as
    /// kubelet reads it (e.g. /var/lib/kubelet/config.yaml).
    #[arg(long, value_name = "FILE")]
    pub kubelet_config: Option<PathBuf>,
    /// kube-proxy's configuration file (KubeProxyConfiguration v1alpha1).
    #[arg(long, value_name = "FILE")]
    pub proxy_config: Option<PathBuf>,
    /// kubeadm's kubelet flags file (/var/lib/kubelet/kubeadm-flags.env).
    #[arg(long, value_name = "FILE")]
    pub kubeadm_flags: Option<PathBuf>,
    /// The node role's kubeconfig (kubelet's --kubeconfig); with
    /// --proxy-only, the proxy role's (kube-proxy's --kubeconfig).
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// The proxy role's kubeconfig (kube-proxy's rights).
    #[arg(long, value_name = "FILE")]
    pub proxy_kubeconfig: Option<PathBuf>,
    /// Kubeconfig used to request the node's client certificate when
    /// --kubeconfig is missing or expired (kubelet's --bootstrap-kubeconfig).
    #[arg(long, value_name = "FILE")]
    pub bootstrap_kubeconfig: Option<PathBuf>,
    /// Where the node role keeps pod volumes and its state (kubelet's
    /// --root-dir; node.rootDir).
    #[arg(long, value_name = "DIR")]
    pub root_dir: Option<PathBuf>,
    /// The node's IP (kubelet's --node-ip; node.nodeIP).
    #[arg(long, value_name = "IP")]
    pub node_ip: Option<std::net::IpAddr>,
    /// This node's name (default: the host name; kubelet's --hostname-override).
    #[arg(long, value_name = "NAME", alias = "hostname-override")]
    pub node_name: Option<String>,
    /// `external` when a cloud controller manager initializes the Node
    /// (kubelet's --cloud-provider; node.cloudProvider).
    #[arg(long, value_name = "NAME")]
    pub cloud_provider: Option<String>,
    /// Credential provider plugin configuration, a file or a directory
    /// (kubelet's --image-credential-provider-config;
    /// node.imageCredentialProviderConfig; docs/credential-providers.md).
    #[arg(long, value_name = "PATH")]
    pub image_credential_provider_config: Option<PathBuf>,
    /// Where the credential provider plugins' executables are (kubelet's
    /// --image-credential-provider-bin-dir; node.imageCredentialProviderBinDir).
    #[arg(long, value_name = "DIR")]
    pub image_credential_provider_bin_dir: Option<PathBuf>,
    /// Log format.
    #[arg(long, value_enum)]
    pub log_format: Option<LogFormat>,
}

impl SourceArgs {
    /// Reads the files and applies the command line, `roles` included.
    pub fn load(&self, roles: &impl Roles) -> Result<Loaded, ConfigError> {
        let (node_only, proxy_only) = roles.selection();
        upstream::load(
            &Sources {
                config: self.config.clone(),
                kubelet_config: self.kubelet_config.clone(),
                proxy_config: self.proxy_config.clone(),
                kubeadm_flags: self.kubeadm_flags.clone(),
                kubelet_extra_args: None,
            },
            &Overrides {
                kubeconfig: self.kubeconfig.clone(),
                proxy_kubeconfig: self.proxy_kubeconfig.clone(),
                bootstrap_kubeconfig: self.bootstrap_kubeconfig.clone(),
                root_dir: self.root_dir.clone(),
                node_ip: self.node_ip,
                node_name: self.node_name.clone(),
                cloud_provider: self.cloud_provider.clone(),
                image_credential_provider_config: self.image_credential_provider_config.clone(),
                image_credential_provider_bin_dir: self.image_credential_provider_bin_dir.clone(),
                node_only,
                proxy_only,
                log_format: self.log_format,
            },
        )
    }

    /// The configuration files given, for `keelson diagnose`.
    pub fn files(&self) -> Vec<PathBuf> {
        [
            &self.config,
            &self.kubelet_config,
            &self.proxy_config,
            &self.kubeadm_flags,
        ]
        .into_iter()
        .flatten()
        .cloned()
        .collect()
    }
}

/// `run`: the sources and the roles.
#[derive(clap::Args, Debug)]
pub struct RunArgs<R: Roles> {
    #[command(flatten)]
    pub sources: SourceArgs,
    #[command(flatten)]
    pub roles: R,
}

/// `check-config`.
#[derive(clap::Args, Debug)]
pub struct CheckConfigArgs<R: Roles> {
    /// A KeelsonConfiguration file (same as --config).
    pub file: Option<PathBuf>,
    #[command(flatten)]
    pub sources: SourceArgs,
    #[command(flatten)]
    pub roles: R,
}

/// `cleanup`.
#[derive(clap::Args, Debug)]
pub struct CleanupArgs {
    /// Configuration file (for `proxy.ebpf.bpffsPath`); defaults apply
    /// without one.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
}
