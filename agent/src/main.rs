//! The `keelson` command.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};
use keelson::config::{Config, LogFormat, Overrides};
use keelson::{lifecycle, observability, run, version};
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
    /// Validate a configuration file and print the effective configuration.
    CheckConfig {
        /// The configuration file.
        file: PathBuf,
    },
    /// Print keelson's version and the Kubernetes version it implements.
    Version,
    /// Explain why a pod, this node or a Service does not work, link by
    /// link, from the node (read-only; docs/diagnose.md).
    Diagnose(keelson::diagnose::DiagnoseArgs),
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

#[derive(clap::Args, Debug)]
struct RunArgs {
    /// Configuration file (KeelsonConfiguration YAML). Defaults apply without one.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Kubeconfig for both roles (overrides node.kubeconfig and proxy.clientConnection.kubeconfig).
    #[arg(long, value_name = "FILE")]
    kubeconfig: Option<PathBuf>,
    /// This node's name (default: the host name).
    #[arg(long, value_name = "NAME")]
    node_name: Option<String>,
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

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Version => {
            println!("keelson {}", version::KEELSON_VERSION);
            println!("kubernetes {}", version::KUBERNETES_VERSION);
            ExitCode::SUCCESS
        }
        Command::CheckConfig { file } => match Config::load(&file) {
            Ok(cfg) => {
                print!("{}", cfg.to_yaml());
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::from(2)
            }
        },
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
                observability::logging::init(&keelson::config::LoggingConfig::default());
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
        Command::Run(args) => match run_command(args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e:#}");
                tracing::error!(error = format!("{e:#}"), "keelson exited with an error");
                ExitCode::FAILURE
            }
        },
    }
}

fn run_command(args: RunArgs) -> anyhow::Result<()> {
    let mut cfg = match &args.config {
        Some(path) => Config::load(path)?,
        None => Config::default(),
    };
    cfg.apply_overrides(&Overrides {
        kubeconfig: args.kubeconfig.clone(),
        node_name: args.node_name.clone(),
        node_only: args.node_only,
        proxy_only: args.proxy_only,
        log_format: args.log_format,
    })?;
    observability::logging::init(&cfg.logging);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("keelson")
        .build()
        .context("starting the async runtime")?;
    rt.block_on(async move {
        let shutdown = CancellationToken::new();
        lifecycle::cancel_on_signals(shutdown.clone()).context("installing signal handlers")?;
        run::run(cfg, shutdown).await?;
        Ok(())
    })
}
