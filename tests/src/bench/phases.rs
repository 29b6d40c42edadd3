//! One contestant at one N, phase by phase: start it cold and time the
//! sync, check every VIP, time connections, add Services one at a time,
//! change endpoints idle and under churn, check every VIP again, count
//! kernel objects, read its metrics, stop it.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::agent::{Agent, SweepResult, Target};
use super::api::ApiTarget;
use super::changes::{prepare_endpoint_change, timed_endpoint_change, timed_service_add};
use super::churn::{self, ChurnPlan, probe_pool};
use super::clock::{mono_ns, since};
use super::config::BenchConfig;
use super::contestant::{
    ContestantKind, ContestantSettings, EbpfEnv, Launch, METRICS_ADDR, ProxyProcess,
};
use super::error::{BenchError, Result};
use super::kernel;
use super::metrics::SelfReported;
use super::results::{Correctness, RunResult};
use super::scenario::{Scenario, ServiceEntry};
use super::stats::Summary;
use super::topology::NodeNs;

/// A contestant's node: namespace, Node name, kubeconfig.
#[derive(Debug)]
pub struct ContestantNode {
    /// The namespace.
    pub node: NodeNs,
    /// Its Node object's name.
    pub name: String,
    /// Kubeconfig reaching the API server from inside the namespace.
    pub kubeconfig: PathBuf,
}

/// What a run borrows from the benchmark.
pub struct RunContext<'a> {
    /// Settings.
    pub cfg: &'a BenchConfig,
    /// How contestants start.
    pub settings: &'a ContestantSettings,
    /// The API server.
    pub api: &'a ApiTarget,
    /// The objects.
    pub scenario: &'a mut Scenario,
    /// The contestant's node.
    pub node: &'a ContestantNode,
    /// This binary (for the probe agent).
    pub exe: &'a Path,
    /// Config files go here.
    pub work: &'a Path,
    /// Contestant logs go here.
    pub logs: &'a Path,
}

/// Runs `kind` at the scenario's current size; failures are recorded in
/// the result, never thrown, so the other contestants still run.
pub async fn run_contestant(ctx: RunContext<'_>, kind: ContestantKind) -> RunResult {
    let n = ctx.scenario.services().len();
    let mut r = RunResult::new(kind, n, ctx.cfg.endpoints);
    if let Err(e) = run_inner(ctx, kind, &mut r).await {
        r.errors.push(e.to_string());
    }
    r
}

async fn run_inner(ctx: RunContext<'_>, kind: ContestantKind, r: &mut RunResult) -> Result<()> {
    reset_node(&ctx.node.node.ns, ctx.cfg.iptables_legacy);
    let ebpf = match kind {
        k if k.is_ebpf() => Some(EbpfEnv::create()?),
        _ => None,
    };
    let agent = Agent::spawn(
        ctx.exe,
        &ctx.node.node.ns.path(),
        ebpf.as_ref().map(EbpfEnv::cgroup),
    )
    .await?;
    let result = phases(ctx, kind, r, &agent, ebpf.as_ref()).await;
    // The contestant is stopped (dropped) inside `phases`; then the agent
    // leaves the cgroup, then the eBPF pins and cgroup go.
    agent.stop().await;
    drop(ebpf);
    result
}

/// Flushes what a previous contestant left in the namespace: nftables
/// (iptables-nft's rules included) and, when kube-proxy runs on the
/// legacy backend, the legacy iptables tables, which `nft` does not see.
fn reset_node(ns: &crate::netns::NetNs, iptables_legacy: bool) {
    if let Err(e) = ns.exec("nft", &["flush", "ruleset"]) {
        tracing::warn!(error = %e, "flushing the node's ruleset");
    }
    if iptables_legacy {
        for cmd in ["iptables-legacy", "ip6tables-legacy"] {
            for table in ["filter", "nat", "mangle", "raw"] {
                for op in ["-F", "-X"] {
                    if let Err(e) = ns.exec(cmd, &["-t", table, op]) {
                        tracing::warn!(error = %e, cmd, table, "flushing legacy iptables");
                    }
                }
            }
        }
    }
    // conntrack -F fails harmlessly when the table is empty or unloaded.
    let _ = ns.exec("conntrack", &["-F"]);
}

fn targets(scenario: &Scenario, idx: &[usize]) -> Vec<Target> {
    idx.iter()
        .filter_map(|i| scenario.service(*i).and_then(ServiceEntry::target))
        .collect()
}

async fn phases(
    ctx: RunContext<'_>,
    kind: ContestantKind,
    r: &mut RunResult,
    agent: &Agent,
    ebpf: Option<&EbpfEnv>,
) -> Result<()> {
    let RunContext {
        cfg,
        settings,
        api,
        scenario,
        node,
        exe: _,
        work,
        logs,
    } = ctx;
    let n = scenario.services().len();
    let sample = scenario.sample(n, cfg.sample_vips);
    let sample_targets = targets(scenario, &sample);

    // Nothing may answer on a VIP before the contestant runs.
    let pre = agent.sweep(sample_targets[..1].to_vec(), false, 1).await?;
    if pre
        .first()
        .is_some_and(|s| !s.seen.is_empty() || !s.wrong.is_empty())
    {
        return Err(BenchError::Invalid(
            "a VIP answered before the contestant started (leftover rules?)".into(),
        ));
    }

    // Cold sync.
    let log = logs.join(format!("{}-n{n}.log", kind.slug()));
    tracing::info!(contestant = %kind, services = n, log = %log.display(), "starting");
    let launch = |log: &std::path::Path| {
        ProxyProcess::start(&Launch {
            kind,
            settings,
            ns: &node.node.ns,
            node_name: &node.name,
            kubeconfig: &node.kubeconfig,
            ebpf,
            work_dir: work,
            log,
        })
    };
    let t0 = mono_ns();
    let mut proc = launch(&log)?;
    let reach = guarded(
        &mut proc,
        agent.reach(sample_targets.clone(), cfg.cold_sync_timeout),
    )
    .await?;
    let missing: Vec<String> = reach
        .reached_ns
        .iter()
        .zip(&sample_targets)
        .zip(&reach.last_error)
        .filter(|((t, _), _)| t.is_none())
        .map(|((_, target), e)| format!("{}: {}", target.addr, e.as_deref().unwrap_or("?")))
        .collect();
    if !missing.is_empty() {
        return Err(BenchError::Contestant {
            name: kind.label().into(),
            message: format!(
                "cold sync: {} of {} sampled VIPs never answered from their endpoints within {:?}: {}; last log lines:\n{}",
                missing.len(),
                sample_targets.len(),
                cfg.cold_sync_timeout,
                missing
                    .iter()
                    .take(3)
                    .cloned()
                    .collect::<Vec<_>>()
                    .join("; "),
                proc.log_tail(15)
            ),
        });
    }
    let done = reach
        .reached_ns
        .iter()
        .flatten()
        .copied()
        .max()
        .unwrap_or(t0);
    r.cold_sync_ms = Some(since(t0, done).as_secs_f64() * 1000.0);
    r.cold_sync_cpu_s = proc.sample().map(|s| s.cpu.as_secs_f64());
    tracing::info!(contestant = %kind, cold_sync_ms = r.cold_sync_ms, "cold sync done");

    // Every VIP right? (conntrack flushed first: the count after the sweep
    // then shows how the sweep's own connections were translated.)
    let _ = node.node.ns.exec("conntrack", &["-F"]);
    r.correct_after_sync = verify(cfg, scenario, agent, &mut proc).await?;
    r.conntrack_after_sweep = kernel::conntrack_entries(&node.node.ns, &cfg.service_net()?.into())
        .map_err(|e| tracing::warn!(error = %e, "reading conntrack"))
        .ok();

    // Data path: connect() through VIPs.
    let lat_idx = scenario.sample(n, 500.min(n));
    let lat = agent
        .latency(targets(scenario, &lat_idx), cfg.latency_samples)
        .await?;
    r.connect = Summary::of(&durations(&lat.connect_ns));
    r.connect_failures = lat.wrong + lat.failed;
    if r.connect_failures > 0 {
        tracing::warn!(contestant = %kind, failures = r.connect_failures, last = ?lat.last_error, "timed connections failed");
    }

    // One new Service at a time among N.
    let mut adds = Vec::new();
    let mut added = Vec::new();
    for _ in 0..cfg.service_adds {
        let svc = scenario.extra_service(&format!("add-{}", kind.slug()))?;
        let (outcome, svc) = timed_service_add(api, agent, svc, cfg.change_timeout).await?;
        added.push(svc);
        match outcome.latency {
            Some(l) => adds.push(l),
            None => timeout(r, "new Service", outcome.last_error),
        }
    }
    r.service_add = Summary::of(&adds);
    proc.check_alive()?;

    // Endpoint changes, one at a time, nothing else going on.
    let mut idle = Vec::new();
    let mut writes = Vec::new();
    let pool = probe_pool(n);
    for _ in 0..cfg.idle_probes {
        let i = scenario.pick(pool.clone());
        let (svc, target) = prepare_endpoint_change(scenario, i)?;
        let o = timed_endpoint_change(api, agent, &svc, target, cfg.change_timeout).await?;
        writes.push(o.write);
        match o.latency {
            Some(l) => idle.push(l),
            None => timeout(r, "endpoint change", o.last_error),
        }
    }
    r.programming_idle = Summary::of(&idle);
    proc.check_alive()?;

    // Churn.
    let cpu_before = proc.sample().map(|s| s.cpu);
    let plan = ChurnPlan {
        services: n,
        rate: cfg.churn_rate,
        probe_rate: cfg.probe_rate,
        duration: cfg.churn_duration,
        change_timeout: cfg.change_timeout,
    };
    let churned = churn::run(plan, scenario, api, agent, &mut proc).await?;
    let cpu_after = proc.sample().map(|s| s.cpu);
    if let (Some(a), Some(b)) = (cpu_before, cpu_after) {
        r.churn_cpu_s = Some(b.saturating_sub(a).as_secs_f64());
    }
    let mut under_churn = Vec::new();
    for o in &churned.probes {
        writes.push(o.write);
        match o.latency {
            Some(l) => under_churn.push(l),
            None => timeout(r, "endpoint change under churn", o.last_error.clone()),
        }
    }
    r.programming_churn = Summary::of(&under_churn);
    r.api_write = Summary::of(&writes);
    r.churn = churned.stats;
    if let Some(e) = churned.first_write_error {
        r.errors.push(format!(
            "churn: {} API writes failed, first: {e}",
            r.churn.write_errors
        ));
    }

    // Still right after all that?
    r.correct_after_churn = verify(cfg, scenario, agent, &mut proc).await?;

    // Kernel objects and the contestant's own figures.
    let mut counts = kernel::nft_counts(&node.node.ns)?;
    if kind == ContestantKind::KubeProxyIptables && cfg.iptables_legacy {
        kernel::add_legacy_iptables(&node.node.ns, &mut counts)?;
    }
    if let Some(env) = ebpf {
        counts.bpf_map_entries = kernel::bpf_map_entries(&env.maps_dir())?;
    }
    r.kernel = Some(counts);
    let metrics_addr: SocketAddr = METRICS_ADDR
        .parse()
        .map_err(|e| BenchError::Invalid(format!("{METRICS_ADDR}: {e}")))?;
    match agent.scrape(metrics_addr, "/metrics").await {
        Ok(body) => r.self_reported = SelfReported::parse(&body),
        Err(e) => tracing::warn!(contestant = %kind, error = %e, "reading /metrics"),
    }

    for svc in &added {
        api.delete_service(svc).await?;
    }
    proc.check_alive()?;
    let stopped = proc.stop(Duration::from_secs(10));
    let last = stopped.last;
    r.total_cpu_s = last.map(|s| s.cpu.as_secs_f64());
    r.peak_rss_bytes = last.map(|s| s.peak_rss_bytes);
    r.end_rss_bytes = last.map(|s| s.rss_bytes);
    if stopped.memory.samples > 0 {
        r.peak_rss_anon_bytes = Some(stopped.memory.anon_bytes);
        r.peak_rss_file_bytes = Some(stopped.memory.file_bytes);
    }

    // Warm restart: the rules stay while the proxy is down; a new process
    // lists the objects and adopts what the kernel holds. The sampled
    // Services' endpoints as they are now (the probes and the churn
    // replaced some since the cold sync).
    let sample_targets = targets(scenario, &sample);
    let stopped = verify_sample(agent, &sample_targets).await?;
    let log = logs.join(format!("{}-n{n}-restart.log", kind.slug()));
    let started = mono_wall_now();
    let mut again = launch(&log)?;
    let synced = guarded(&mut again, async {
        Ok(wait_synced(agent, metrics_addr, started, cfg.cold_sync_timeout).await)
    })
    .await?;
    match synced {
        Some(at) => r.warm_restart_ms = Some((at - started).max(0.0) * 1000.0),
        None => r.errors.push(format!(
            "warm restart: no sync within {:?}; last log lines:\n{}",
            cfg.cold_sync_timeout,
            again.log_tail(10)
        )),
    }
    let after = verify_sample(agent, &sample_targets).await?;
    r.warm_restart_vips = Some((stopped, after, sample_targets.len()));
    let last = again.stop(Duration::from_secs(10)).last;
    r.warm_restart_peak_rss_bytes = last.map(|s| s.peak_rss_bytes);
    Ok(())
}

/// Wall-clock now, Unix seconds (the unit of the contestants' sync
/// timestamps).
fn mono_wall_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// Polls the contestant's metrics until its last sync ended after `after`
/// (Unix seconds); returns that time, or `None` at the deadline.
async fn wait_synced(
    agent: &Agent,
    metrics: SocketAddr,
    after: f64,
    timeout: Duration,
) -> Option<f64> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(body) = agent.scrape(metrics, "/metrics").await
            && let Some(at) = super::metrics::gauge_max(&body, super::metrics::LAST_SYNC)
            && at >= after
        {
            return Some(at);
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// How many sampled VIPs answer only from their own endpoints now.
async fn verify_sample(agent: &Agent, targets: &[Target]) -> Result<usize> {
    let results = agent.sweep(targets.to_vec(), false, 3).await?;
    Ok(results
        .iter()
        .filter(|s| s.wrong.is_empty() && !s.seen.is_empty())
        .count())
}

fn timeout(r: &mut RunResult, what: &str, last_error: Option<String>) {
    r.probe_timeouts += 1;
    r.errors.push(format!(
        "{what} not seen programmed in time (last probe: {})",
        last_error.as_deref().unwrap_or("?")
    ));
}

fn durations(ns: &[u64]) -> Vec<Duration> {
    ns.iter().map(|n| Duration::from_nanos(*n)).collect()
}

/// Awaits `fut`, failing early if the contestant exits meanwhile.
async fn guarded<T>(
    proc: &mut ProxyProcess,
    fut: impl std::future::Future<Output = Result<T>>,
) -> Result<T> {
    tokio::pin!(fut);
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    loop {
        tokio::select! {
            v = &mut fut => return v,
            _ = tick.tick() => proc.check_alive()?,
        }
    }
}

fn sweep_ok(s: &SweepResult, all_endpoints: bool, expected: usize) -> bool {
    s.wrong.is_empty()
        && if all_endpoints {
            s.seen.len() == expected
        } else {
            !s.seen.is_empty()
        }
}

/// Checks every VIP of the scenario, re-checking failures until they pass
/// or the deadline (a contestant may still be applying the last writes).
async fn verify(
    cfg: &BenchConfig,
    scenario: &Scenario,
    agent: &Agent,
    proc: &mut ProxyProcess,
) -> Result<Correctness> {
    let n = scenario.services().len();
    let m = cfg.endpoints;
    let deadline = Instant::now()
        + if cfg.quick {
            Duration::from_secs(20)
        } else {
            Duration::from_secs(120)
        };
    let mut pending: Vec<usize> = (0..n).collect();
    loop {
        let results = agent
            .sweep(
                targets(scenario, &pending),
                cfg.all_endpoints_check,
                30 * m as u32,
            )
            .await?;
        let failed: Vec<(usize, SweepResult)> = pending
            .iter()
            .copied()
            .zip(results)
            .filter(|(_, s)| !sweep_ok(s, cfg.all_endpoints_check, m))
            .collect();
        if failed.is_empty() || Instant::now() >= deadline {
            let wrong = failed.iter().filter(|(_, s)| !s.wrong.is_empty()).count();
            return Ok(Correctness {
                checked: n,
                ok: n - failed.len(),
                wrong,
                unreached: failed.len() - wrong,
                examples: failed
                    .iter()
                    .take(5)
                    .map(|(i, s)| describe(scenario, *i, s))
                    .collect(),
            });
        }
        proc.check_alive()?;
        pending = failed.into_iter().map(|(i, _)| i).collect();
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

fn describe(scenario: &Scenario, i: usize, s: &SweepResult) -> String {
    let name = scenario.service(i).map_or("?", |s| s.name.as_str());
    format!(
        "{name}: saw {:?}, foreign {:?}, {} failures ({})",
        s.seen,
        s.wrong,
        s.failures,
        s.last_error.as_deref().unwrap_or("-")
    )
}
