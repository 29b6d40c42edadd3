//! Registry credentials for image pulls beyond a pod's pull Secrets:
//! kubelet's credential provider plugins (`--image-credential-provider-config`,
//! `--image-credential-provider-bin-dir`; `pkg/credentialprovider/plugin`)
//! and the keyring both they and the pull Secrets feed
//! (`pkg/credentialprovider/keyring.go`).
//!
//! [`CredentialProviders::register`] is kubelet's
//! `RegisterCredentialProviderPlugins`: the bin dir must exist, the
//! configuration must read and validate, and each provider's executable
//! must be there; any failure stops the node role's start, as kubelet
//! exits. [`CredentialProviders::lookup`] is the external keyring's
//! `Lookup`: every provider's answer for the image goes into one keyring,
//! which then orders the matching credentials.

pub mod cache;
pub mod config;
pub mod docker_keyring;
pub mod exec;
pub mod metrics;
pub mod provider;
pub mod url_match;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use docker_keyring::{DockerKeyring, Tracked};
use exec::{ExecPlugin, PLUGIN_TIMEOUT};
use metrics::CredentialProviderMetrics;
use provider::{PluginProvider, PodRef, TokenSources};

/// Why the plugins could not be registered (the node role does not start).
#[derive(Debug, thiserror::Error)]
pub enum RegisterError {
    /// The bin dir does not exist.
    #[error("plugin binary directory {} did not exist", .0.display())]
    NoBinDir(PathBuf),
    /// The bin dir cannot be inspected.
    #[error("error inspecting binary directory {}: {}", .0.display(), keelson_common::gofmt::os_error_text(.1))]
    BinDir(PathBuf, std::io::Error),
    /// The configuration is unreadable or invalid.
    #[error(transparent)]
    Config(#[from] config::ConfigError),
    /// A provider's executable is missing.
    #[error("plugin binary executable {} did not exist", .0.display())]
    NoExecutable(PathBuf),
    /// A provider's executable cannot be run.
    #[error("error inspecting binary executable {}: {}", .0.display(), .1)]
    Executable(PathBuf, String),
}

/// The registered plugins, in configuration order.
#[derive(Debug, Clone, Default)]
pub struct CredentialProviders {
    providers: Vec<Arc<PluginProvider>>,
}

impl CredentialProviders {
    /// No plugins.
    pub fn none() -> Self {
        Self::default()
    }

    /// `RegisterCredentialProviderPlugins`. Called when either path is
    /// set (an empty one then fails as kubelet's does).
    pub fn register(
        config_path: &Path,
        bin_dir: &Path,
        registry: &prometheus::Registry,
        tokens: Option<TokenSources>,
    ) -> Result<Self, RegisterError> {
        let (cfg, hash) = Self::check(config_path, bin_dir)?;
        let metrics = CredentialProviderMetrics::register(registry, &hash);
        let mut providers = Vec::new();
        for p in &cfg.providers {
            let path = bin_dir.join(&p.name);
            let plugin = ExecPlugin {
                name: p.name.clone(),
                api_version: p.api_version.clone(),
                path,
                args: p.args.clone(),
                env: p.env.clone(),
                timeout: PLUGIN_TIMEOUT,
            };
            tracing::info!(provider = %p.name, "registered credential provider");
            providers.push(Arc::new(PluginProvider::new(
                p,
                plugin,
                tokens.clone(),
                metrics.clone(),
            )));
        }
        Ok(CredentialProviders { providers })
    }

    /// The checks of [`CredentialProviders::register`] without
    /// registering: the bin dir, the configuration (read and validated,
    /// with its hash) and each provider's executable. The node role runs
    /// them before it starts anything, so that a bad configuration stops
    /// it as it stops kubelet.
    pub fn check(
        config_path: &Path,
        bin_dir: &Path,
    ) -> Result<(config::CredentialProviderConfig, String), RegisterError> {
        if let Err(e) = std::fs::metadata(bin_dir) {
            return Err(if e.kind() == std::io::ErrorKind::NotFound {
                RegisterError::NoBinDir(bin_dir.into())
            } else {
                RegisterError::BinDir(bin_dir.into(), e)
            });
        }
        let (cfg, hash) = config::read(config_path)?;
        config::validate(&cfg)?;
        for p in &cfg.providers {
            check_executable(&bin_dir.join(&p.name))?;
        }
        Ok((cfg, hash))
    }

    /// True when no plugin is registered.
    pub fn is_empty(&self) -> bool {
        self.providers.is_empty()
    }

    /// The registered plugins.
    pub fn providers(&self) -> &[Arc<PluginProvider>] {
        &self.providers
    }

    /// `externalCredentialProviderKeyring.Lookup`: the plugins'
    /// credentials for `image` (a repository name, `reg.io/team/app`).
    pub async fn lookup(&self, image: &str, pod: &PodRef) -> Vec<Tracked> {
        if self.providers.is_empty() {
            return Vec::new();
        }
        let mut keyring = DockerKeyring::default();
        for p in &self.providers {
            let (config, source) = p.provide(image, pod).await;
            keyring.add(source.as_ref(), &config);
        }
        keyring.lookup(image)
    }
}

/// `exec.LookPath` on a path: a regular file with an execute bit.
fn check_executable(path: &Path) -> Result<(), RegisterError> {
    use std::os::unix::fs::PermissionsExt;
    match std::fs::metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            Err(RegisterError::NoExecutable(path.into()))
        }
        Err(e) => Err(RegisterError::Executable(
            path.into(),
            keelson_common::gofmt::os_error_text(&e),
        )),
        Ok(m) if m.is_dir() || m.permissions().mode() & 0o111 == 0 => {
            Err(RegisterError::Executable(
                path.into(),
                format!(
                    "exec: {}: permission denied",
                    keelson_common::gofmt::quote(&path.display().to_string())
                ),
            ))
        }
        Ok(_) => Ok(()),
    }
}
