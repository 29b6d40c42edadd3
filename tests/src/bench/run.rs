//! The whole benchmark: set up the API server, the network and the
//! contestants' nodes once; then, for each N, load the Services, measure
//! the no-proxy baseline and run each contestant in turn (alone, so none
//! competes with another for the CPU); then clean up.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::agent::{Agent, Target};
use super::api::ApiTarget;
use super::config::BenchConfig;
use super::contestant::{ContestantKind, ContestantSettings};
use super::error::{BenchError, Result};
use super::phases::{ContestantNode, RunContext, run_contestant};
use super::results::{Baseline, BenchReport, Machine};
use super::scenario::{Scenario, ScenarioConfig, backends_needed};
use super::stats::Summary;
use super::topology::{NodeNs, Topology};
use crate::netns::run_cmd;

/// Runs the benchmark described by `cfg`. `exe` is this binary (started
/// again as the probe agent); `command` is recorded in the report.
pub async fn run(cfg: BenchConfig, exe: &Path, command: String) -> Result<BenchReport> {
    cfg.validate()?;
    let out = &cfg.out_dir;
    let logs = out.join("logs");
    let work = out.join("work");
    for d in [out, &logs, &work] {
        std::fs::create_dir_all(d)
            .map_err(|e| BenchError::io(format!("creating {}", d.display()), e))?;
    }
    let mut machine = machine(&cfg);
    let started = super::api::now_rfc3339();

    let namespace = if cfg.kubeconfig.is_some() {
        format!("keelson-bench-{}", std::process::id())
    } else {
        "keelson-bench".to_string()
    };
    // A real control plane lives as long as the run (dropped at the end).
    let control_plane = match &cfg.upstream_bin {
        Some(dir) => {
            let bins = crate::upstream::UpstreamBins::in_dir(dir)
                .map_err(|e| BenchError::Invalid(format!("--upstream {}: {e}", dir.display())))?;
            let cp = crate::upstream::ControlPlane::start(&bins)
                .await
                .map_err(|e| BenchError::Invalid(format!("starting the control plane: {e}")))?;
            tracing::info!(dir = %cp.dir().display(), "upstream control plane ready");
            Some(cp)
        }
        None => None,
    };
    let mut api = match (&cfg.kubeconfig, &control_plane) {
        (Some(path), _) => ApiTarget::external(path, &namespace).await?,
        (None, Some(cp)) => ApiTarget::external(cp.admin_kubeconfig(), &namespace).await?,
        (None, None) => ApiTarget::test_server(&cfg.service_cidr, &namespace).await?,
    };
    let api_server = match (&cfg.kubeconfig, &control_plane) {
        (Some(p), _) => format!("cluster of {}", p.display()),
        (None, Some(cp)) => format!(
            "kube-apiserver and kube-controller-manager from {} ({}), etcd {}",
            cp.bins().dir().display(),
            run_cmd(
                &cp.bins().path("kube-apiserver").display().to_string(),
                &["--version"]
            )
            .unwrap_or_default()
            .trim(),
            run_cmd(&cp.bins().etcd().display().to_string(), &["--version"])
                .unwrap_or_default()
                .lines()
                .next()
                .unwrap_or_default()
                .trim()
        ),
        (None, None) => {
            "keelson test API server (in-process stand-in for kube-apiserver)".to_string()
        }
    };
    api.prepare_namespace().await?;

    let max_n = cfg.services.iter().copied().max().unwrap_or(0) as u64;
    let m = cfg.endpoints as u64;
    let per_run = cfg.service_adds as u64 * m
        + cfg.idle_probes as u64 * m
        + (cfg.churn_rate * cfg.churn_duration.as_secs_f64()) as u64
        + (cfg.probe_rate * cfg.churn_duration.as_secs_f64()).ceil() as u64 * m;
    let runs = (cfg.services.len() * cfg.contestants.len()) as u64;
    let backends = backends_needed(max_n * m + per_run * runs, cfg.backends);
    let mut scenario = Scenario::new(ScenarioConfig {
        namespace: namespace.clone(),
        endpoints_per_service: cfg.endpoints,
        backends,
        seed: cfg.seed,
    })?;
    let mut topo = Topology::create(backends, cfg.service_net()?)?;
    tracing::info!(backends, "network ready");

    let settings = ContestantSettings {
        keelson_bin: cfg.keelson_bin.clone(),
        keelson_proxy_bin: cfg.keelson_proxy_bin.clone(),
        kube_proxy_bin: cfg.kube_proxy_bin.clone(),
        min_sync_period: cfg.min_sync_period_kube(),
        json_only_api: api.is_test_server(),
        iptables_legacy: cfg.iptables_legacy,
        api_qps: cfg.api_qps,
        api_burst: cfg.api_burst,
    };
    let mut nodes: BTreeMap<ContestantKind, ContestantNode> = BTreeMap::new();
    for kind in &cfg.contestants {
        let node = topo.add_node("kbn")?;
        let name = format!("kb-{}-{}", kind.slug(), std::process::id());
        let kubeconfig = work.join(format!("{}.kubeconfig", kind.slug()));
        api.kubeconfig_for(&node.ns, &kubeconfig)?;
        api.create_node(&name, node.addr).await?;
        nodes.insert(
            *kind,
            ContestantNode {
                node,
                name,
                kubeconfig,
            },
        );
    }
    let baseline_node = topo.add_node("kbn")?;
    let baseline_agent = Agent::spawn(exe, &baseline_node.ns.path(), None).await?;

    let result = measure_all(
        &cfg,
        &settings,
        &api,
        &mut scenario,
        &nodes,
        (&baseline_node, &baseline_agent),
        exe,
        &work,
        &logs,
    )
    .await;

    baseline_agent.stop().await;
    let names: Vec<String> = nodes.values().map(|n| n.name.clone()).collect();
    api.cleanup(&names).await;
    drop(api);
    drop(control_plane);
    let (baselines, runs) = result?;
    machine.load_at_end = std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .trim()
        .to_string();
    Ok(BenchReport {
        command,
        started,
        machine,
        api_server,
        config: cfg,
        baselines,
        runs,
    })
}

#[allow(clippy::too_many_arguments)]
async fn measure_all(
    cfg: &BenchConfig,
    settings: &ContestantSettings,
    api: &ApiTarget,
    scenario: &mut Scenario,
    nodes: &BTreeMap<ContestantKind, ContestantNode>,
    baseline: (&NodeNs, &Agent),
    exe: &Path,
    work: &Path,
    logs: &Path,
) -> Result<(Vec<Baseline>, Vec<super::results::RunResult>)> {
    let mut baselines = Vec::new();
    let mut runs = Vec::new();
    for &n in &cfg.services {
        let range = scenario.grow_to(n)?;
        let t = Instant::now();
        let count = range.len();
        api.load(scenario, range).await?;
        tracing::info!(
            added = count,
            services = n,
            seconds = t.elapsed().as_secs_f64(),
            "Services and EndpointSlices created"
        );
        baselines.push(measure_baseline(cfg, scenario, baseline.1).await?);
        for kind in &cfg.contestants {
            let node = nodes
                .get(kind)
                .ok_or_else(|| BenchError::Invalid(format!("no node for {kind}")))?;
            let ctx = RunContext {
                cfg,
                settings,
                api,
                scenario,
                node,
                exe,
                work,
                logs,
            };
            let r = run_contestant(ctx, *kind).await;
            tracing::info!(
                contestant = %kind,
                services = n,
                correct = r.programmed_correctly(),
                cold_sync_ms = r.cold_sync_ms,
                add_p50_ms = r.service_add.p50_ms,
                churn_p99_ms = r.programming_churn.p99_ms,
                errors = ?r.errors,
                "run finished"
            );
            runs.push(r);
        }
    }
    Ok((baselines, runs))
}

/// Direct connections to endpoints from a namespace with no proxy at all.
async fn measure_baseline(
    cfg: &BenchConfig,
    scenario: &mut Scenario,
    agent: &Agent,
) -> Result<Baseline> {
    let n = scenario.services().len();
    let idx = scenario.sample(n, 500.min(n));
    let targets: Vec<Target> = idx
        .iter()
        .enumerate()
        .filter_map(|(k, i)| {
            let d = scenario.service(*i)?.direct_targets();
            d.get(k % d.len().max(1)).cloned()
        })
        .collect();
    let r = agent.latency(targets, cfg.latency_samples).await?;
    if r.failed + r.wrong > 0 {
        return Err(BenchError::Invalid(format!(
            "baseline: {} direct connections failed ({})",
            r.failed + r.wrong,
            r.last_error.unwrap_or_default()
        )));
    }
    let d: Vec<Duration> = r
        .connect_ns
        .iter()
        .map(|n| Duration::from_nanos(*n))
        .collect();
    Ok(Baseline {
        services: n,
        connect: Summary::of(&d),
    })
}

fn machine(cfg: &BenchConfig) -> Machine {
    let read = |p: &str| {
        std::fs::read_to_string(p)
            .unwrap_or_default()
            .trim()
            .to_string()
    };
    Machine {
        kernel: read("/proc/sys/kernel/osrelease"),
        cpus: std::thread::available_parallelism().map_or(0, |n| n.get()),
        load_at_start: read("/proc/loadavg"),
        load_at_end: String::new(),
        nft: run_cmd("nft", &["--version"])
            .unwrap_or_default()
            .trim()
            .to_string(),
        kube_proxy: cfg.kube_proxy_bin.as_ref().map(|p| {
            let p: &PathBuf = p;
            run_cmd(&p.display().to_string(), &["--version"])
                .unwrap_or_else(|e| format!("unknown ({e})"))
                .trim()
                .to_string()
        }),
    }
}
