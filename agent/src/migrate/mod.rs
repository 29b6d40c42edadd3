//! `keelson migrate`: replace kubelet (and, when asked, kube-proxy) on a
//! kubeadm node with keelson, and go back.
//!
//! - [`plan`]: kubelet's files (and kube-proxy's ConfigMap when the API
//!   answers) read through `config::upstream`, the KeelsonConfiguration
//!   made of them, the differences and the steps (`--from-kubelet`);
//! - [`apply`]: the steps carried out after a [`backup`] (`--apply`);
//! - [`rollback`]: kubelet restored from the backup (`--rollback`);
//! - [`host`]: the root directory and systemctl everything goes through
//!   (`--root`, `--systemctl`), [`install`]: install.sh as shipped,
//!   [`api`]: the few API calls, [`layout`]: kubeadm's and keelson's paths.

pub mod api;
pub mod apply;
pub mod backup;
pub mod host;
pub mod install;
pub mod layout;
pub mod plan;
pub mod rollback;

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::config::duration::KubeDuration;

pub use host::{Host, SYSTEMCTL_ENV};
pub use plan::{Plan, PlanOptions, ProxySource};

/// Why a migration step failed.
#[derive(Debug, thiserror::Error)]
pub enum MigrateError {
    /// The node does not have kubeadm's kubelet layout.
    #[error("not a kubeadm node: {0}")]
    NotKubeadm(String),
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The host path.
        path: String,
        /// The reason.
        #[source]
        source: std::io::Error,
    },
    /// systemctl failed.
    #[error("systemctl {args}: {reason}")]
    Systemctl {
        /// Its arguments.
        args: String,
        /// Why.
        reason: String,
    },
    /// install.sh failed (its own message is above).
    #[error("install.sh {args} failed: {reason}")]
    Install {
        /// Its arguments.
        args: String,
        /// Exit status.
        reason: String,
    },
    /// An API request failed.
    #[error("{0}")]
    Api(String),
    /// A wait ran out of time.
    #[error("timed out waiting for {what}: {last}")]
    Timeout {
        /// What was awaited.
        what: String,
        /// The last thing seen.
        last: String,
    },
    /// The plan has problems the operator must fix first.
    #[error("the migration is refused:\n{}", .0.iter().map(|r| format!("  - {r}")).collect::<Vec<_>>().join("\n"))]
    Refused(Vec<String>),
    /// A backup (a migration) already exists.
    #[error(
        "a migration was already applied on this node (backup in {0}): run keelson migrate --rollback first"
    )]
    AlreadyApplied(String),
    /// No backup to roll back from.
    #[error("no migration to roll back: {0} has no manifest")]
    NoBackup(String),
    /// The backup is unreadable or unwritable.
    #[error("backup: {0}")]
    Backup(String),
    /// Containers were restarted instead of adopted.
    #[error("the Node is Ready but containers were not adopted as they ran:\n{}", .0.iter().map(|r| format!("  - {r}")).collect::<Vec<_>>().join("\n"))]
    NotAdopted(Vec<String>),
    /// `--apply` stopped after the backup.
    #[error(
        "{cause}\nthe migration stopped part-way; `keelson migrate --rollback` restores kubelet from the backup in {backup}"
    )]
    Interrupted {
        /// What failed.
        cause: Box<MigrateError>,
        /// The backup directory.
        backup: String,
    },
}

impl MigrateError {
    fn io(path: &Path, source: std::io::Error) -> MigrateError {
        MigrateError::Io {
            path: path.display().to_string(),
            source,
        }
    }
}

/// `keelson migrate` options.
#[derive(Debug, Clone, clap::Args)]
#[command(group(clap::ArgGroup::new("mode").required(true).args(["from_kubelet", "rollback"])))]
pub struct MigrateArgs {
    /// Read kubelet's configuration on this kubeadm node and print the
    /// KeelsonConfiguration keelson would run with, the differences and the
    /// steps of --apply (nothing changes without --apply).
    #[arg(long)]
    pub from_kubelet: bool,
    /// Carry the plan out: back up, stop and disable kubelet, install and
    /// start keelson.service, wait for the Node to be Ready.
    #[arg(long, requires = "from_kubelet")]
    pub apply: bool,
    /// Restore kubelet as the backup of --apply found it.
    #[arg(long, conflicts_with_all = ["apply", "replace_kube_proxy"])]
    pub rollback: bool,
    /// keelson's proxy role takes over from kube-proxy: the node is
    /// labelled keelson.dev/proxy=node-agent so kube-proxy's DaemonSet
    /// leaves it (docs/install.md).
    #[arg(long)]
    pub replace_kube_proxy: bool,
    /// The proxy role's kubeconfig (kube-proxy's rights); needed with
    /// --replace-kube-proxy.
    #[arg(long, value_name = "FILE")]
    pub proxy_kubeconfig: Option<PathBuf>,
    /// kube-proxy's configuration (config.conf of kube-system/kube-proxy)
    /// instead of reading the ConfigMap.
    #[arg(long, value_name = "FILE")]
    pub proxy_config: Option<PathBuf>,
    /// Credentials for the API (default: kubelet's /etc/kubernetes/kubelet.conf).
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// Do not wait for kube-proxy to leave or for the Node to be Ready.
    #[arg(long)]
    pub no_wait: bool,
    /// How long each wait may take.
    #[arg(long, value_name = "DURATION", default_value = "5m")]
    pub timeout: String,
    /// The keelson binary to install (default: this one).
    #[arg(long, value_name = "FILE")]
    pub binary: Option<PathBuf>,
    /// Prefix every host path with DIR (tests; a node image).
    #[arg(long, value_name = "DIR", default_value = "/")]
    pub root: PathBuf,
    /// The systemctl command (default: $KEELSON_SYSTEMCTL, else systemctl).
    #[arg(long, value_name = "COMMAND")]
    pub systemctl: Option<String>,
}

/// Runs `keelson migrate`; returns the exit code (0 done, 1 failed, 2 the
/// plan is refused or the arguments are wrong).
pub async fn run(args: MigrateArgs) -> u8 {
    match run_inner(args).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e}");
            if matches!(e, MigrateError::Refused(_) | MigrateError::NotKubeadm(_)) {
                2
            } else {
                1
            }
        }
    }
}

async fn run_inner(args: MigrateArgs) -> Result<u8, MigrateError> {
    let systemctl = args
        .systemctl
        .clone()
        .or_else(|| std::env::var(SYSTEMCTL_ENV).ok())
        .unwrap_or_else(|| "systemctl".to_string());
    let host = Host::new(&args.root, systemctl);
    let kubeconfig = args
        .kubeconfig
        .clone()
        .unwrap_or_else(|| PathBuf::from(layout::KUBELET_KUBECONFIG));
    let mut out = std::io::stdout();
    if args.rollback {
        rollback::rollback(&host, &rollback::RollbackOptions { kubeconfig }, &mut out).await?;
        return Ok(0);
    }
    let timeout = KubeDuration::parse(&args.timeout)
        .map(Duration::from)
        .map_err(|e| MigrateError::Refused(vec![format!("--timeout {}: {e}", args.timeout)]))?;
    let proxy = match (&args.proxy_config, args.replace_kube_proxy) {
        (Some(p), _) => ProxySource::File(p.clone()),
        (None, false) => ProxySource::Unavailable("not asked for".to_string()),
        (None, true) => match api::client(&host, &kubeconfig).await {
            Ok(c) => match api::kube_proxy_config(&c).await {
                Ok(text) => ProxySource::ConfigMap(text),
                Err(e) => ProxySource::Unavailable(e.to_string()),
            },
            Err(e) => ProxySource::Unavailable(e.to_string()),
        },
    };
    let opts = PlanOptions {
        replace_kube_proxy: args.replace_kube_proxy,
        proxy_kubeconfig: args.proxy_kubeconfig.clone(),
    };
    let plan = plan::build(&host, &opts, proxy)?;
    print!("{}", plan.render());
    if !args.apply {
        return Ok(if plan.refused.is_empty() { 0 } else { 2 });
    }
    let binary = match args.binary.clone() {
        Some(b) => b,
        None => {
            std::env::current_exe().map_err(|e| MigrateError::io(Path::new("/proc/self/exe"), e))?
        }
    };
    println!();
    apply::apply(
        &host,
        &plan,
        &apply::ApplyOptions {
            binary,
            wait: (!args.no_wait).then_some(timeout),
            kubeconfig,
        },
        &mut out,
    )
    .await?;
    Ok(0)
}

#[cfg(test)]
mod tests;
