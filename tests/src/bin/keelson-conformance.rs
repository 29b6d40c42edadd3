//! `keelson-conformance`: Kubernetes' e2e conformance suite against a
//! cluster of keelson nodes, or of real kubelet + kube-proxy nodes as the
//! baseline, and docs/conformance.md from one run of each. Needs root.
//! `scripts/conformance` builds and calls it.
//!
//! ```text
//! keelson-conformance run --agent both --nodes 2 --parallel 4 --doc docs/conformance.md
//! keelson-conformance run --agent keelson --focus '\[sig-node\]' --skip '\[Serial\]'
//! keelson-conformance table --keelson OUT/keelson.json --kubelet OUT/kubelet.json --doc docs/conformance.md
//! ```

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand, ValueEnum};
use keelson_tests::conformance::cluster::Cluster;
use keelson_tests::conformance::record::{Outcome, RunRecord};
use keelson_tests::conformance::{self, Options, table};
use keelson_tests::upstream::{Agents, UpstreamBins};

#[derive(Parser, Debug)]
#[command(
    name = "keelson-conformance",
    about = "Run Kubernetes' e2e [Conformance] tests against keelson nodes or the real kubelet + kube-proxy"
)]
struct Cli {
    #[command(subcommand)]
    sub: Sub,
}

#[derive(Subcommand, Debug)]
enum Sub {
    /// Bring up a cluster, run the suite, tear the cluster down.
    Run {
        /// Which node agents: keelson, kubelet (kubelet + kube-proxy), or
        /// both (one after the other, same cluster shape).
        #[arg(long, value_enum, default_value = "keelson")]
        agent: AgentChoice,
        /// Nodes of the cluster.
        #[arg(long, default_value_t = 2)]
        nodes: usize,
        /// ginkgo processes.
        #[arg(long, default_value_t = 4)]
        parallel: usize,
        /// Only tests whose full name matches (a regular expression; repeatable).
        #[arg(long)]
        focus: Vec<String>,
        /// Leave out tests whose full name matches (repeatable).
        #[arg(long)]
        skip: Vec<String>,
        /// Where the run records, ginkgo's reports and the logs go.
        #[arg(long, default_value = "target/conformance")]
        out: PathBuf,
        /// The unpacked ../shared/k8s binaries (default: $KEELSON_UPSTREAM_BIN).
        #[arg(long)]
        upstream_bin: Option<PathBuf>,
        /// e2e-image-files.tar.xz (default: ../shared/k8s/e2e-image-files.tar.xz).
        #[arg(long)]
        image_files: Option<PathBuf>,
        /// kubectl v1.36.
        #[arg(long, default_value = conformance::KUBECTL)]
        kubectl: PathBuf,
        /// With `--agent both`: write the comparison page here.
        #[arg(long)]
        doc: Option<PathBuf>,
        /// Exit non-zero when a test fails (CI).
        #[arg(long)]
        fail_on_failure: bool,
    },
    /// Bring up the cluster a run would use and keep it until Ctrl-C (to
    /// run single tests by hand or look at a failure).
    Cluster {
        /// keelson or kubelet.
        #[arg(long, value_enum, default_value = "keelson")]
        agent: AgentChoice,
        /// Nodes of the cluster.
        #[arg(long, default_value_t = 2)]
        nodes: usize,
        /// Where the images are built.
        #[arg(long, default_value = "target/conformance")]
        out: PathBuf,
        /// The unpacked ../shared/k8s binaries (default: $KEELSON_UPSTREAM_BIN).
        #[arg(long)]
        upstream_bin: Option<PathBuf>,
        /// e2e-image-files.tar.xz (default: ../shared/k8s/e2e-image-files.tar.xz).
        #[arg(long)]
        image_files: Option<PathBuf>,
    },
    /// Write the comparison page from two run records.
    Table {
        /// keelson's record.
        #[arg(long)]
        keelson: PathBuf,
        /// The baseline's record.
        #[arg(long)]
        kubelet: PathBuf,
        /// The page to write.
        #[arg(long, default_value = "docs/conformance.md")]
        doc: PathBuf,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum AgentChoice {
    Keelson,
    Kubelet,
    Both,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("keelson-conformance: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<ExitCode> {
    match cli.sub {
        Sub::Table {
            keelson,
            kubelet,
            doc,
        } => {
            let k = RunRecord::read(&keelson)?;
            let b = RunRecord::read(&kubelet)?;
            write_doc(&doc, &k, &b)?;
            Ok(ExitCode::SUCCESS)
        }
        Sub::Cluster {
            agent,
            nodes,
            out,
            upstream_bin,
            image_files,
        } => {
            let agents = match agent {
                AgentChoice::Kubelet => Agents::Upstream,
                _ => Agents::Keelson,
            };
            let opts = Options {
                agents,
                nodes: nodes.max(1),
                parallel: 1,
                focus: Vec::new(),
                skip: Vec::new(),
                out,
                bins: upstream_bins(upstream_bin)?,
                image_files: image_files_or_default(image_files),
                kubectl: PathBuf::from(conformance::KUBECTL),
            };
            let runtime = tokio::runtime::Runtime::new().context("starting tokio")?;
            let interrupted = interrupt_token(&runtime);
            runtime.block_on(async {
                let cluster = tokio::select! {
                    c = Cluster::start(&opts) => c?,
                    _ = interrupted.cancelled() => anyhow::bail!("interrupted; the cluster was removed"),
                };
                println!(
                    "cluster up: KUBECONFIG={} inside the network namespace {} (nsenter --net=/run/netns/{}); Ctrl-C removes it",
                    cluster.kubeconfig.display(),
                    cluster.cp.net().netns().name(),
                    cluster.cp.net().netns().name()
                );
                interrupted.cancelled().await;
                drop(cluster);
                anyhow::Ok(())
            })?;
            Ok(ExitCode::SUCCESS)
        }
        Sub::Run {
            agent,
            nodes,
            parallel,
            focus,
            skip,
            out,
            upstream_bin,
            image_files,
            kubectl,
            doc,
            fail_on_failure,
        } => {
            let bins = upstream_bins(upstream_bin)?;
            let image_files = image_files_or_default(image_files);
            let agents = match agent {
                AgentChoice::Keelson => vec![Agents::Keelson],
                AgentChoice::Kubelet => vec![Agents::Upstream],
                AgentChoice::Both => vec![Agents::Keelson, Agents::Upstream],
            };
            let runtime = tokio::runtime::Runtime::new().context("starting tokio")?;
            let interrupted = interrupt_token(&runtime);
            let mut records = Vec::new();
            for agents in agents {
                let opts = Options {
                    agents,
                    nodes: nodes.max(1),
                    parallel,
                    focus: focus.clone(),
                    skip: skip.clone(),
                    out: out.clone(),
                    bins: bins.clone(),
                    image_files: image_files.clone(),
                    kubectl: kubectl.clone(),
                };
                let record = runtime.block_on(async {
                    tokio::select! {
                        r = conformance::run(&opts) => r.map_err(anyhow::Error::from),
                        _ = interrupted.cancelled() => Err(anyhow::anyhow!("interrupted; the cluster was removed")),
                    }
                })?;
                print_summary(&record);
                records.push(record);
            }
            if let (Some(doc), [k, b]) = (doc, records.as_slice()) {
                write_doc(&doc, k, b)?;
            }
            let failed = records.iter().map(|r| r.counts().1).sum::<usize>();
            Ok(if fail_on_failure && failed > 0 {
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            })
        }
    }
}

/// Cancelled at the first Ctrl-C (SIGINT), wherever the program is then:
/// one listener for the whole run, so a signal that arrives between two
/// runs of `--agent both` is not lost.
fn interrupt_token(runtime: &tokio::runtime::Runtime) -> tokio_util::sync::CancellationToken {
    let token = tokio_util::sync::CancellationToken::new();
    let cancel = token.clone();
    runtime.spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            cancel.cancel();
        }
    });
    token
}

fn upstream_bins(dir: Option<PathBuf>) -> Result<UpstreamBins> {
    match dir {
        Some(dir) => UpstreamBins::in_dir(&dir),
        None => UpstreamBins::from_env(),
    }
    .map_err(anyhow::Error::msg)
    .context("finding the upstream binaries (unpack ../shared/k8s and pass --upstream-bin)")
}

fn image_files_or_default(path: Option<PathBuf>) -> PathBuf {
    path.unwrap_or_else(keelson_tests::images::e2e::image_files_tarball)
}

fn write_doc(path: &PathBuf, k: &RunRecord, b: &RunRecord) -> Result<()> {
    std::fs::write(path, table::write_markdown(k, b))
        .with_context(|| format!("writing {}", path.display()))?;
    println!("wrote {}", path.display());
    Ok(())
}

fn print_summary(r: &RunRecord) {
    println!("\n== conformance on {} ==", r.agents);
    for t in &r.tests {
        if let Outcome::Failed { state, message, .. } = &t.outcome {
            println!("  {state}: {}\n      {message}", t.name);
        }
    }
    let (passed, failed, not_run) = r.counts();
    println!(
        "suite {:.0} s (set-up {:.0} s) on {} nodes, {} procs",
        r.suite_seconds, r.setup_seconds, r.nodes, r.parallel
    );
    println!("{passed} passed, {failed} failed, {not_run} skipped");
}
