//! The `keelson-proxy` command: keelson's proxy role alone (kube-proxy's
//! replacement), for the proxy-only DaemonSet. The same configuration
//! files and flags as `keelson run --proxy-only`; it never names the node
//! role, so the linker leaves that code out and the text the proxy pages
//! in is its own (docs/design/build.md).

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use keelson::cli::{CheckConfigArgs, CleanupArgs, ProxyOnlyArgs, RunArgs};
use keelson::node_role::NoNodeRole;
use keelson::{commands, lifecycle};

/// keelson-proxy: keelson's proxy role alone, replacing kube-proxy.
#[derive(Parser, Debug)]
#[command(name = "keelson-proxy", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the proxy role (as `keelson run --proxy-only`).
    Run(RunArgs<ProxyOnlyArgs>),
    /// Validate configuration files and print the effective configuration
    /// (a KeelsonConfiguration with every default filled in; the node
    /// role off).
    CheckConfig(CheckConfigArgs<ProxyOnlyArgs>),
    /// Print keelson's version and the Kubernetes version it implements.
    Version,
    /// Remove the proxy role's nftables tables and eBPF programs from this
    /// network namespace and exit (kube-proxy's `--cleanup`). Stop the
    /// proxy first. Does nothing when the configuration disables the proxy
    /// role.
    Cleanup(CleanupArgs),
}

fn main() -> ExitCode {
    lifecycle::mark_started();
    match Cli::parse().command {
        Command::Version => commands::version(),
        Command::CheckConfig(args) => commands::check_config(args),
        Command::Cleanup(args) => commands::cleanup(args),
        Command::Run(args) => commands::run::<NoNodeRole, _>(args),
    }
}
