//! The commands both binaries have: `run`, `check-config`, `version` and
//! `cleanup`. Each returns the process's exit code and says what went
//! wrong on stderr, once.

use std::process::ExitCode;

use tokio_util::sync::CancellationToken;

use crate::cli::{CheckConfigArgs, CleanupArgs, Roles, RunArgs};
use crate::config::{Config, ConfigError};
use crate::run::{NodeRole, RunError};
use crate::{lifecycle, version};

/// `version`: keelson's version and the Kubernetes version it implements.
pub fn version() -> ExitCode {
    println!("keelson {}", version::KEELSON_VERSION);
    println!("kubernetes {}", version::KUBERNETES_VERSION);
    ExitCode::SUCCESS
}

/// `check-config`: validates the sources and prints the effective
/// configuration (a KeelsonConfiguration with every default filled in).
pub fn check_config<R: Roles>(args: CheckConfigArgs<R>) -> ExitCode {
    let CheckConfigArgs {
        file,
        mut sources,
        roles,
    } = args;
    if file.is_some() {
        if sources.config.is_some() {
            eprintln!("error: give the KeelsonConfiguration once (FILE or --config)");
            return ExitCode::from(2);
        }
        sources.config = file;
    }
    match sources.load(&roles) {
        Ok(loaded) => {
            if let Err(e) = roles.check_node(&loaded.config.node) {
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

/// `cleanup`: removes the proxy role's nftables tables and eBPF programs
/// from this network namespace (kube-proxy's `--cleanup`).
pub fn cleanup(args: CleanupArgs) -> ExitCode {
    let cfg = match args.config.as_deref().map(Config::load).transpose() {
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
    match crate::proxy::cleanup(&cfg.proxy) {
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

/// `run`: the enabled roles until a signal, `N` being the binary's node
/// role.
pub fn run<N: NodeRole, R: Roles>(args: RunArgs<R>) -> ExitCode {
    match run_roles::<N, R>(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // One line, on stderr as the log: said once.
            eprintln!("error: {}", crate::error_chain::error_chain(&e));
            ExitCode::FAILURE
        }
    }
}

/// Why `run` stopped with an error.
#[derive(Debug, thiserror::Error)]
enum RunCommandError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("starting the async runtime")]
    Runtime(#[source] std::io::Error),
    #[error("installing signal handlers")]
    Signals(#[source] std::io::Error),
    #[error(transparent)]
    Run(#[from] RunError),
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

fn run_roles<N: NodeRole, R: Roles>(args: RunArgs<R>) -> Result<(), RunCommandError> {
    let loaded = args.sources.load(&args.roles)?;
    let files = args.sources.files();
    let cfg = loaded.config;
    crate::logging::init(&cfg.logging);
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
    let rt = builder.build().map_err(RunCommandError::Runtime)?;
    rt.block_on(async move {
        let shutdown = CancellationToken::new();
        lifecycle::cancel_on_signals(shutdown.clone()).map_err(RunCommandError::Signals)?;
        crate::run::run::<N>(cfg, &files, shutdown).await?;
        Ok(())
    })
}
