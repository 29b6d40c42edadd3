//! `keelson-bench`: keelson's proxy role against kube-proxy, side by side
//! in one run — programming speed, data-path latency, footprint. Needs
//! root (network namespaces, nftables, eBPF). Prints a markdown table and
//! writes `results.json`, `report.md` and `latency.svg`/`.png` to `--out`.
//!
//! ```text
//! keelson-bench --quick
//! keelson-bench --services 100,1000,10000 --endpoints 10
//! keelson-bench --services 10000 --kube-proxy /usr/local/bin/kube-proxy
//! ```

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::{Args, Parser, Subcommand};
use keelson::config::KubeDuration;
use keelson_tests::bench::agent::server::{AgentArgs, run as run_agent};
use keelson_tests::bench::{BenchConfig, BenchReport, ContestantKind, plot, report, run};

#[derive(Parser, Debug)]
#[command(
    name = "keelson-bench",
    about = "Benchmark keelson's proxy role (nftables, eBPF) against kube-proxy (nftables, iptables) on the same Services, traffic and machine",
    args_conflicts_with_subcommands = true
)]
struct Cli {
    #[command(subcommand)]
    sub: Option<Sub>,
    #[command(flatten)]
    opts: Opts,
}

#[derive(Subcommand, Debug)]
enum Sub {
    /// Internal: the probe agent started by the benchmark inside a node.
    #[command(hide = true, name = "probe-agent")]
    ProbeAgent {
        /// Network namespace file to join.
        #[arg(long)]
        netns: PathBuf,
        /// cgroup v2 directory to join first.
        #[arg(long)]
        cgroup: Option<PathBuf>,
    },
}

#[derive(Args, Debug)]
struct Opts {
    /// Small and fast (a few dozen Services; what the smoke test runs).
    #[arg(long)]
    quick: bool,
    /// Service counts N to measure at, comma separated, ascending.
    #[arg(long, value_delimiter = ',')]
    services: Option<Vec<usize>>,
    /// Endpoints per Service (M).
    #[arg(long)]
    endpoints: Option<usize>,
    /// Backend namespaces (more are added when the endpoints need them).
    #[arg(long)]
    backends: Option<u8>,
    /// Contestants, comma separated: keelson-nftables, keelson-ebpf,
    /// keelson-proxy-nftables, keelson-proxy-ebpf, kube-proxy-nftables,
    /// kube-proxy-iptables. Default: both keelson modes, plus both
    /// keelson-proxy modes with --keelson-proxy and both kube-proxy modes
    /// with --kube-proxy.
    #[arg(long, value_delimiter = ',')]
    contestants: Option<Vec<String>>,
    /// The keelson binary (default: $KEELSON_BIN, else next to this binary).
    #[arg(long, value_name = "PATH")]
    keelson: Option<PathBuf>,
    /// The proxy-only keelson-proxy binary, run as `keelson-proxy run
    /// --proxy-only --config FILE` (two more contestants).
    #[arg(long = "keelson-proxy", value_name = "PATH")]
    keelson_proxy: Option<PathBuf>,
    /// A kube-proxy binary to compare with (never built or downloaded here).
    #[arg(long = "kube-proxy", value_name = "PATH")]
    kube_proxy: Option<PathBuf>,
    /// Use this cluster instead of the in-process test API server.
    #[arg(long, value_name = "PATH")]
    kubeconfig: Option<PathBuf>,
    /// Start a real control plane (kube-apiserver, kube-controller-manager
    /// and Debian's etcd) from the binaries in DIR instead of the test API
    /// server (default: $KEELSON_UPSTREAM_BIN when set with --upstream).
    #[arg(long, value_name = "DIR")]
    upstream: Option<PathBuf>,
    /// The Service ClusterIP range (the test API server's, or the cluster's).
    #[arg(long)]
    service_cidr: Option<String>,
    /// minSyncPeriod of every contestant (Go duration; default 0s).
    #[arg(long)]
    min_sync_period: Option<String>,
    /// Run kube-proxy's iptables mode on the legacy iptables backend
    /// (`iptables-legacy`, `iptables-legacy-save`, `iptables-legacy-restore`
    /// first in its PATH) instead of the host's default `iptables`.
    #[arg(long)]
    iptables_legacy: bool,
    /// Client-side API QPS of every contestant (keelson
    /// `clientConnection.qps`, kube-proxy `--kube-api-qps`; default 5).
    #[arg(long)]
    api_qps: Option<f32>,
    /// Client-side API burst of every contestant (default 10).
    #[arg(long)]
    api_burst: Option<u32>,
    /// Background endpoint changes per second during churn (K).
    #[arg(long)]
    churn_rate: Option<f64>,
    /// Length of the churn phase, seconds.
    #[arg(long)]
    churn_seconds: Option<f64>,
    /// Timed endpoint changes per second during churn.
    #[arg(long)]
    probe_rate: Option<f64>,
    /// Timed endpoint changes without churn.
    #[arg(long)]
    idle_probes: Option<usize>,
    /// New Services added (and timed) one at a time among N.
    #[arg(long)]
    service_adds: Option<usize>,
    /// Timed TCP connections through VIPs (and directly, for the baseline).
    #[arg(long)]
    latency_samples: Option<u32>,
    /// VIPs that must answer to call the cold sync done.
    #[arg(long)]
    sample_vips: Option<usize>,
    /// Check that every endpoint of every VIP answers (default in --quick).
    #[arg(long)]
    all_endpoints: bool,
    /// Seed of the change generator.
    #[arg(long)]
    seed: Option<u64>,
    /// Output directory.
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// Measure nothing: render report.md and the plot from a saved
    /// results.json into --out.
    #[arg(long, value_name = "FILE")]
    from_results: Option<PathBuf>,
}

fn config(opts: &Opts) -> Result<BenchConfig> {
    let keelson = match &opts.keelson {
        Some(p) => p.clone(),
        None => {
            keelson_tests::node_harness::keelson_bin().unwrap_or_else(|_| PathBuf::from("keelson"))
        }
    };
    let mut c = if opts.quick {
        BenchConfig::quick(keelson)
    } else {
        BenchConfig::full(keelson)
    };
    if let Some(v) = &opts.services {
        c.services = v.clone();
    }
    if let Some(v) = opts.endpoints {
        c.endpoints = v;
    }
    if let Some(v) = opts.backends {
        c.backends = v;
    }
    c.kube_proxy_bin = opts.kube_proxy.clone();
    c.keelson_proxy_bin = opts.keelson_proxy.clone();
    c.kubeconfig = opts.kubeconfig.clone();
    c.upstream_bin = opts.upstream.clone();
    if c.upstream_bin.is_some() {
        // The control plane's ClusterIP range.
        c.service_cidr = keelson_tests::upstream::network::SERVICE_CIDR.to_string();
    }
    if let Some(v) = &opts.service_cidr {
        c.service_cidr = v.clone();
    }
    if let Some(v) = &opts.min_sync_period {
        c.min_sync_period = KubeDuration::parse(v)
            .with_context(|| format!("--min-sync-period {v}"))?
            .get();
    }
    c.api_qps = opts.api_qps;
    c.api_burst = opts.api_burst;
    c.iptables_legacy = opts.iptables_legacy;
    if let Some(v) = opts.churn_rate {
        c.churn_rate = v;
    }
    if let Some(v) = opts.churn_seconds {
        if !(v.is_finite() && v > 0.0) {
            bail!("--churn-seconds must be > 0");
        }
        c.churn_duration = Duration::from_secs_f64(v);
    }
    if let Some(v) = opts.probe_rate {
        c.probe_rate = v;
    }
    if let Some(v) = opts.idle_probes {
        c.idle_probes = v;
    }
    if let Some(v) = opts.service_adds {
        c.service_adds = v;
    }
    if let Some(v) = opts.latency_samples {
        c.latency_samples = v;
    }
    if let Some(v) = opts.sample_vips {
        c.sample_vips = v;
    }
    c.all_endpoints_check |= opts.all_endpoints;
    if let Some(v) = opts.seed {
        c.seed = v;
    }
    if let Some(v) = &opts.out {
        c.out_dir = v.clone();
    }
    c.contestants = match &opts.contestants {
        Some(list) => list
            .iter()
            .map(|s| {
                ContestantKind::from_slug(s.trim())
                    .with_context(|| format!("unknown contestant {s:?}"))
            })
            .collect::<Result<_>>()?,
        None => ContestantKind::ALL
            .into_iter()
            .filter(|k| !k.is_kube_proxy() || c.kube_proxy_bin.is_some())
            .filter(|k| !k.is_keelson_proxy() || c.keelson_proxy_bin.is_some())
            .collect(),
    };
    c.validate()?;
    Ok(c)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Some(Sub::ProbeAgent { netns, cgroup }) = cli.sub {
        return match run_agent(&AgentArgs { netns, cgroup }) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("probe agent: {e}");
                ExitCode::FAILURE
            }
        };
    }
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    match bench(&cli.opts) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!(
                "error: not every contestant programmed the scenario correctly (see the report)"
            );
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn bench(opts: &Opts) -> Result<bool> {
    if let Some(path) = &opts.from_results {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let report: BenchReport =
            serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
        let out = opts.out.clone().unwrap_or_else(|| PathBuf::from("."));
        std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
        return write_outputs(&report, &out);
    }
    if !nix::unistd::geteuid().is_root() {
        bail!("keelson-bench needs root (network namespaces, nftables, eBPF)");
    }
    let cfg = config(opts)?;
    let exe = std::env::current_exe().context("locating this binary")?;
    let command = std::env::args().collect::<Vec<_>>().join(" ");
    let out = cfg.out_dir.clone();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let report = rt.block_on(async {
        tokio::select! {
            r = run::run(cfg, &exe, command) => r.map_err(anyhow::Error::from),
            _ = tokio::signal::ctrl_c() => Err(anyhow::anyhow!("interrupted; cleaned up")),
        }
    })?;
    drop(rt);
    let json = serde_json::to_string_pretty(&report).context("encoding results")?;
    std::fs::write(out.join("results.json"), json).context("writing results.json")?;
    eprintln!("results: {}", out.join("results.json").display());
    write_outputs(&report, &out)
}

/// Writes report.md and the plot, prints the report; true when every
/// contestant programmed the scenario correctly.
fn write_outputs(report: &BenchReport, out: &std::path::Path) -> Result<bool> {
    let md = report::markdown(report);
    std::fs::write(out.join("report.md"), &md).context("writing report.md")?;
    println!("{md}");
    match plot::write(report, out, "latency") {
        Ok(files) => {
            for f in files {
                eprintln!("plot: {}", f.display());
            }
        }
        Err(e) => eprintln!("warning: plot not written: {e}"),
    }
    Ok(report.runs.iter().all(|r| r.programmed_correctly()))
}
