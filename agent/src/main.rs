//! The `keelson` command: every role. `keelson-proxy`
//! (src/bin/keelson-proxy.rs) is the proxy role alone.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use keelson::cli::{CheckConfigArgs, CleanupArgs, RoleArgs, RunArgs};
use keelson::node_role::Kubelet;
use keelson::{commands, lifecycle};

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
    Run(RunArgs<RoleArgs>),
    /// Validate configuration files and print the effective configuration
    /// (a KeelsonConfiguration with every default filled in).
    CheckConfig(CheckConfigArgs<RoleArgs>),
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
    Cleanup(CleanupArgs),
}

fn main() -> ExitCode {
    lifecycle::mark_started();
    let cli = Cli::parse();
    match cli.command {
        Command::Version => commands::version(),
        Command::CheckConfig(args) => commands::check_config(args),
        Command::Cleanup(args) => commands::cleanup(args),
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
        Command::Run(args) => commands::run::<Kubelet, _>(args),
    }
}
