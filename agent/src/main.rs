//! The `keelson` command.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};
use keelson::config::upstream::{self, Loaded, Sources};
use keelson::config::{Config, LogFormat, Overrides};
use keelson::{lifecycle, run, version};
use tokio_util::sync::CancellationToken;

/// keelson: one daemon per Linux node replacing kubelet and kube-proxy.
#[derive(Parser, Debug)]
#[command(name = "keelson", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the enabled roles (node and proxy by default).
    Run(RunArgs),
    /// Validate configuration files and print the effective configuration
    /// (a KeelsonConfiguration with every default filled in).
    CheckConfig {
        /// A KeelsonConfiguration file (same as --config).
        file: Option<PathBuf>,
        #[command(flatten)]
        sources: SourceArgs,
    },
    /// Print keelson's version and the Kubernetes version it implements.
    Version,
    /// Explain why a pod, this node or a Service does not work, link by
    /// link, from the node (read-only; docs/diagnose.md).
    Diagnose(keelson::diagnose::DiagnoseArgs),
    /// Replace kubelet (and kube-proxy) on a kubeadm node with keelson, or
    /// go back (docs/install.md, 'Migrating a kubeadm node').
    Migrate(keelson::migrate::MigrateArgs),
    /// Remove the proxy role's nftables tables and eBPF programs from this
    /// network namespace and exit (kube-proxy's `--cleanup`). Stop keelson
    /// first. Does nothing when the configuration disables the proxy role.
    Cleanup {
        /// Configuration file (for `proxy.ebpf.bpffsPath`); defaults apply
        /// without one.
        #[arg(long, value_name = "FILE")]
        config: Option<PathBuf>,
    },
}

/// The configuration sources and the command-line settings that win over them.
#[derive(clap::Args, Debug, Default)]
struct SourceArgs {
    /// Configuration file (KeelsonConfiguration YAML). Defaults apply without one.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// kubelet's configuration file (KubeletConfiguration v1beta1), read as
    /// kubelet reads it (e.g. /var/lib/kubelet/config.yaml).
    #[arg(long, value_name = "FILE")]
    kubelet_config: Option<PathBuf>,
    /// kube-proxy's configuration file (KubeProxyConfiguration v1alpha1).
    #[arg(long, value_name = "FILE")]
    proxy_config: Option<PathBuf>,
    /// kubeadm's kubelet flags file (/var/lib/kubelet/kubeadm-flags.env).
    #[arg(long, value_name = "FILE")]
    kubeadm_flags: Option<PathBuf>,
    /// The node role's kubeconfig (kubelet's --kubeconfig); with
    /// --proxy-only, the proxy role's (kube-proxy's --kubeconfig).
    #[arg(long, value_name = "FILE")]
    kubeconfig: Option<PathBuf>,
    /// The proxy role's kubeconfig (kube-proxy's rights).
    #[arg(long, value_name = "FILE")]
    proxy_kubeconfig: Option<PathBuf>,
    /// Kubeconfig used to request the node's client certificate when
    /// --kubeconfig is missing or expired (kubelet's --bootstrap-kubeconfig).
    #[arg(long, value_name = "FILE")]
    bootstrap_kubeconfig: Option<PathBuf>,
    /// Where the node role keeps pod volumes and its state (kubelet's
    /// --root-dir; node.rootDir).
    #[arg(long, value_name = "DIR")]
    root_dir: Option<PathBuf>,
    /// The node's IP (kubelet's --node-ip; node.nodeIP).
    #[arg(long, value_name = "IP")]
    node_ip: Option<std::net::IpAddr>,
    /// This node's name (default: the host name; kubelet's --hostname-override).
    #[arg(long, value_name = "NAME", alias = "hostname-override")]
    node_name: Option<String>,
    /// `external` when a cloud controller manager initializes the Node
    /// (kubelet's --cloud-provider; node.cloudProvider).
    #[arg(long, value_name = "NAME")]
    cloud_provider: Option<String>,
    /// Credential provider plugin configuration, a file or a directory
    /// (kubelet's --image-credential-provider-config;
    /// node.imageCredentialProviderConfig; docs/credential-providers.md).
    #[arg(long, value_name = "PATH")]
    image_credential_provider_config: Option<PathBuf>,
    /// Where the credential provider plugins' executables are (kubelet's
    /// --image-credential-provider-bin-dir; node.imageCredentialProviderBinDir).
    #[arg(long, value_name = "DIR")]
    image_credential_provider_bin_dir: Option<PathBuf>,
    /// Run only the node role (kubelet).
    #[arg(long, conflicts_with = "proxy_only")]
    node_only: bool,
    /// Run only the proxy role (kube-proxy); the DaemonSet form.
    #[arg(long)]
    proxy_only: bool,
    /// Log format.
    #[arg(long, value_enum)]
    log_format: Option<LogFormat>,
}

impl SourceArgs {
    fn load(&self) -> Result<Loaded, keelson::config::ConfigError> {
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
                node_only: self.node_only,
                proxy_only: self.proxy_only,
                log_format: self.log_format,
            },
        )
    }
}

#[derive(clap::Args, Debug)]
struct RunArgs {
    #[command(flatten)]
    sources: SourceArgs,
}

fn main() -> ExitCode {
    lifecycle::mark_started();
    let cli = Cli::parse();
    match cli.command {
        Command::Version => {
            println!("keelson {}", version::KEELSON_VERSION);
            println!("kubernetes {}", version::KUBERNETES_VERSION);
            ExitCode::SUCCESS
        }
        Command::CheckConfig { file, mut sources } => {
            if file.is_some() {
                if sources.config.is_some() {
                    eprintln!("error: give the KeelsonConfiguration once (FILE or --config)");
                    return ExitCode::from(2);
                }
                sources.config = file;
            }
            match sources.load() {
                Ok(loaded) => {
                    if let Err(e) = check_credential_providers(&loaded.config.node) {
                        eprintln!("error: {e}");
                        return ExitCode::from(2);
                    }
                    if !loaded.ignored.is_empty() {
                        eprintln!(
                            "warning: accepted with upstream's default value, not implemented by keelson: {}",
                            loaded.ignored.join(", ")
                        );
                    }
                    for n in &loaded.notes {
                        eprintln!("note: {n}");
                    }
                    print!("{}", loaded.config.to_yaml());
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("error: {e}");
                    ExitCode::from(2)
                }
            }
        }
        Command::Cleanup { config } => {
            let cfg = match config.as_deref().map(Config::load).transpose() {
                Ok(cfg) => cfg.unwrap_or_default(),
                Err(e) => {
                    eprintln!("error: {e}");
                    return ExitCode::from(2);
                }
            };
            if !cfg.proxy.enabled {
                // Another proxy (e.g. keelson's DaemonSet) may own the
                // tables of the same name on this node.
                println!("the proxy role is disabled in this configuration: nothing removed");
                return ExitCode::SUCCESS;
            }
            match keelson::proxy::cleanup(&cfg.proxy) {
                Ok(()) => {
                    println!("removed keelson's nftables tables and eBPF pins (if any)");
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("error: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Diagnose(args) => {
            // Quiet unless asked: the report is the output.
            if std::env::var_os("RUST_LOG").is_some() {
                keelson::logging::init(&keelson::config::LoggingConfig::default());
            }
            let rt = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    eprintln!("error: starting the async runtime: {e}");
                    return ExitCode::from(2);
                }
            };
            ExitCode::from(rt.block_on(keelson::diagnose::run(args)))
        }
        Command::Migrate(args) => {
            if std::env::var_os("RUST_LOG").is_some() {
                keelson::logging::init(&keelson::config::LoggingConfig::default());
            }
            let rt = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    eprintln!("error: starting the async runtime: {e}");
                    return ExitCode::from(2);
                }
            };
            ExitCode::from(rt.block_on(keelson::migrate::run(args)))
        }
        Command::Run(args) => match run_command(args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                // One line, on stderr as the log: said once.
                eprintln!("error: {e:#}");
                ExitCode::FAILURE
            }
        },
    }
}

/// The proxy role alone runs on one tokio worker (`TOKIO_WORKER_THREADS`
/// still decides when set): its syncs run off the worker
/// (`block_in_place`), the watchers need little, and each extra worker
/// keeps a malloc arena of its own (a few MiB of the proxy's RSS,
/// docs/benchmarks.md). With the node role, one worker per CPU.
fn worker_threads(cfg: &Config) -> Option<usize> {
    (cfg.proxy.enabled && !cfg.node.enabled && std::env::var_os("TOKIO_WORKER_THREADS").is_none())
        .then_some(1)
}

fn run_command(args: RunArgs) -> anyhow::Result<()> {
    let loaded = args.sources.load()?;
    let s = &args.sources;
    let files: Vec<PathBuf> = [
        &s.config,
        &s.kubelet_config,
        &s.proxy_config,
        &s.kubeadm_flags,
    ]
    .into_iter()
    .flatten()
    .cloned()
    .collect();
    let cfg = loaded.config;
    keelson::logging::init(&cfg.logging);
    if !loaded.ignored.is_empty() {
        tracing::warn!(
            fields = loaded.ignored.join(", "),
            "upstream settings keelson does not implement, accepted because they hold upstream's default value"
        );
    }
    for note in &loaded.notes {
        tracing::info!("{note}");
    }
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.enable_all().thread_name("keelson");
    if let Some(workers) = worker_threads(&cfg) {
        builder.worker_threads(workers);
    }
    let rt = builder.build().context("starting the async runtime")?;
    rt.block_on(async move {
        let shutdown = CancellationToken::new();
        lifecycle::cancel_on_signals(shutdown.clone()).context("installing signal handlers")?;
        run::run(cfg, &files, shutdown).await?;
        Ok(())
    })
}

/// `keelson check-config` also runs the credential provider checks the
/// node role runs at start (bin dir, configuration, executables).
fn check_credential_providers(n: &keelson::config::NodeConfig) -> Result<(), String> {
    if !n.enabled
        || (n.image_credential_provider_config.is_none()
            && n.image_credential_provider_bin_dir.is_none())
    {
        return Ok(());
    }
    let empty = std::path::Path::new("");
    keelson::node::credentials::CredentialProviders::check(
        n.image_credential_provider_config
            .as_deref()
            .unwrap_or(empty),
        n.image_credential_provider_bin_dir
            .as_deref()
            .unwrap_or(empty),
    )
    .map(|_| ())
    .map_err(|e| format!("failed to register CRI auth plugins: {e}"))
}
