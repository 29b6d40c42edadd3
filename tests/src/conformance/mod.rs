//! Kubernetes' own e2e conformance suite (`e2e.test` v1.36.2) against a
//! cluster whose nodes run keelson, or the real kubelet and kube-proxy as
//! the baseline: `scripts/conformance` (the `keelson-conformance` binary).
//!
//! One run ([`run`]):
//! 1. [`cluster::Cluster::start`]: the upstream tier's control plane (etcd,
//!    kube-apiserver, kube-controller-manager) plus kube-scheduler and
//!    cluster DNS ([`dns`]: `kube-dns` behind `kube-system/kube-dns`), and
//!    `--nodes` nodes, each a private containerd (bridge + portmap CNI, the
//!    e2e images imported under their upstream names, `pause:3.10.2` as the
//!    sandbox image) in its own network namespace with its own agent root
//!    dir, cgroup root and pod CIDR, routed to the others through the
//!    control plane's namespace;
//! 2. [`suite::run_suite`]: `ginkgo --procs=N e2e.test` inside the control
//!    plane's namespace (so the test process reaches node and pod IPs as
//!    it would in a real cluster) with the `[Conformance]` label filter,
//!    the run's focus/skip and the environment skips ([`skips`]), which
//!    apply to both agents alike;
//! 3. [`record::RunRecord`]: every conformance test's outcome and duration,
//!    written as `<out>/<agent>.json` beside ginkgo's own reports.
//!
//! [`table::write_markdown`] turns one record of each agent into
//! `docs/conformance.md`. Everything a run creates is removed when it
//! ends, also on failure or Ctrl-C (the harness's drops; a killed run is
//! cleaned up by the next start).

pub mod cluster;
pub mod dns;
pub mod record;
pub mod skips;
pub mod suite;
pub mod table;

use std::path::PathBuf;

use crate::upstream::{Agents, UpstreamBins, UpstreamError};

/// kubectl v1.36, where `scripts/install-deps` puts it.
pub const KUBECTL: &str = "/usr/local/lib/keelson/bin/kubectl";

/// What a run is asked to do.
#[derive(Debug, Clone)]
pub struct Options {
    /// Who runs the nodes' roles.
    pub agents: Agents,
    /// How many nodes.
    pub nodes: usize,
    /// ginkgo's `--procs`.
    pub parallel: usize,
    /// Regular expressions a test's full name must match (any); empty: all.
    pub focus: Vec<String>,
    /// Regular expressions that leave a test out.
    pub skip: Vec<String>,
    /// Where the records and ginkgo's reports go.
    pub out: PathBuf,
    /// The unpacked binaries of `../shared/k8s`.
    pub bins: UpstreamBins,
    /// `e2e-image-files.tar.xz` (the upstream images' small files).
    pub image_files: PathBuf,
    /// kubectl v1.36 for the suite.
    pub kubectl: PathBuf,
}

/// What went wrong running the suite (not a test failing: that is a result).
#[derive(Debug, thiserror::Error)]
pub enum ConformanceError {
    /// Bringing up the cluster failed.
    #[error(transparent)]
    Cluster(#[from] UpstreamError),
    /// Building or importing the e2e images failed.
    #[error("building the e2e images: {0}")]
    Images(#[from] crate::images::ImageError),
    /// The suite could not be started or its report not read.
    #[error("{context}: {message}")]
    Suite {
        /// What we were doing.
        context: String,
        /// Why it failed.
        message: String,
    },
}

/// Brings the cluster up, runs the suite, tears the cluster down and
/// returns the record (also written to `<out>/<agent>.json`).
pub async fn run(opts: &Options) -> Result<record::RunRecord, ConformanceError> {
    std::fs::create_dir_all(&opts.out).map_err(|e| ConformanceError::Suite {
        context: format!("creating {}", opts.out.display()),
        message: e.to_string(),
    })?;
    let commit = record::git_commit();
    let listed = suite::list_conformance(&opts.bins)?;
    let started = std::time::Instant::now();
    let cluster = cluster::Cluster::start(opts).await?;
    let setup_seconds = started.elapsed().as_secs_f64();
    let outcome = suite::run_suite(opts, &cluster).await;
    let logs = cluster.save_logs(&opts.out.join(format!("{}-logs", opts.agents.name())));
    drop(cluster);
    let report = outcome?;
    if let Err(e) = logs {
        eprintln!("conformance: keeping the agents' logs failed: {e}");
    }
    let record = record::RunRecord::new(opts, commit, setup_seconds, &listed, &report);
    record.write(
        &opts
            .out
            .join(format!("{}.json", record::agent_key(opts.agents))),
    )?;
    Ok(record)
}
