//! The upstream tier's test binary: one control plane (and one node per
//! kind of agent, started when a case first asks for it) serves every case
//! of the run, so the tier costs one cluster start rather than one per
//! case. It speaks enough of libtest's command line and output for
//! `cargo test` and `scripts/test`: name filters, `--exact`, `--skip`,
//! `--list`, `--test-threads`, and `test NAME ... ok|FAILED|ignored` lines
//! ending with `test result:`.
//!
//! Every case runs once per kind of agent it lists ([`Agents`]): named
//! `upstream_<agents>_<case>` (`upstream_keelson_node_registers`,
//! `upstream_kube_node_registers`). Where the tier cannot run (no
//! binaries, not root), each selected case is reported `ignored` and
//! recorded as skipped with the reason (`KEELSON_SKIP_LOG`).
//! `KEELSON_UPSTREAM_HOLD=SECONDS` keeps the cluster up after the cases.

use std::future::Future;
use std::pin::Pin;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use tokio::sync::Mutex;

use super::bins::can_run;
use super::control_plane::ControlPlane;
use super::node::{Agents, ClusterNode, NodeSpec};

/// What a case returns.
pub type CaseFuture = Pin<Box<dyn Future<Output = anyhow::Result<()>> + Send>>;
/// A case: runs against the shared environment with one kind of agents.
pub type CaseFn = fn(Arc<Env>, Agents) -> CaseFuture;

/// One case of the tier.
#[derive(Clone, Copy)]
pub struct Case {
    /// The case's name (the test name adds `upstream_<agents>_`).
    pub name: &'static str,
    /// The kinds of agents it runs with.
    pub agents: &'static [Agents],
    /// The case.
    pub run: CaseFn,
}

impl std::fmt::Debug for Case {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Case").field("name", &self.name).finish()
    }
}

/// The test name of `case` run with `agents`.
pub fn test_name(case: &str, agents: Agents) -> String {
    format!("upstream_{}_{case}", agents.name())
}

/// Longest time one case may take.
pub const CASE_TIMEOUT: Duration = Duration::from_secs(360);

/// What the cases share: the control plane, a cluster-admin client and the
/// shared nodes.
pub struct Env {
    /// The control plane.
    pub cp: Arc<ControlPlane>,
    /// A cluster-admin client (through the host relay).
    pub admin: kube::Client,
    keelson: SharedNode,
    upstream: SharedNode,
}

/// A shared node: not started yet, started, or failed to start (every
/// later case gets the same error at once instead of trying again).
type SharedNode = Mutex<Option<Result<Arc<ClusterNode>, String>>>;

impl std::fmt::Debug for Env {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Env")
            .field("cp", &self.cp)
            .finish_non_exhaustive()
    }
}

impl Env {
    /// The node every case of `agents` shares (started and Ready on first use).
    pub async fn node(&self, agents: Agents) -> anyhow::Result<Arc<ClusterNode>> {
        let mut slot = self.shared(agents).lock().await;
        if slot.is_none() {
            let name = format!("{}-shared", agents.name());
            let started = async {
                let node = self.start_node(&name, NodeSpec::of(agents)).await?;
                node.wait_ready(&self.admin).await?;
                anyhow::Ok(Arc::new(node))
            }
            .await;
            *slot = Some(started.map_err(|e| format!("{e:?}")));
        }
        match slot.as_ref() {
            Some(Ok(node)) => {
                node.check_running()?;
                Ok(node.clone())
            }
            Some(Err(e)) => Err(anyhow::anyhow!(
                "the shared {} node did not start: {e}",
                agents.name()
            )),
            None => Err(anyhow::anyhow!("the shared {} node is gone", agents.name())),
        }
    }

    /// A node of the case's own (stopped when dropped).
    pub async fn start_node(&self, name: &str, spec: NodeSpec) -> anyhow::Result<ClusterNode> {
        Ok(ClusterNode::start(&self.cp, name, spec).await?)
    }

    fn shared(&self, agents: Agents) -> &SharedNode {
        match agents {
            Agents::Keelson => &self.keelson,
            Agents::Upstream => &self.upstream,
        }
    }

    /// The shared node of `agents` if one runs (for failure reports).
    async fn started(&self, agents: Agents) -> Option<Arc<ClusterNode>> {
        self.shared(agents).lock().await.clone()?.ok()
    }

    /// Stops the shared nodes and the control plane, also when a case
    /// that outlived its deadline still holds one of them.
    async fn teardown(&self) {
        for agents in Agents::ALL {
            let Some(Ok(mut node)) = self.shared(agents).lock().await.take() else {
                continue;
            };
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                match Arc::try_unwrap(node) {
                    Ok(owned) => {
                        drop(owned);
                        break;
                    }
                    Err(shared) if Instant::now() >= deadline => {
                        eprintln!(
                            "warning: the shared {} node is still held; removing it",
                            agents.name()
                        );
                        shared.force_cleanup();
                        break;
                    }
                    Err(shared) => {
                        node = shared;
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
            }
        }
        self.cp.shutdown();
    }
}

/// libtest's command line, the part this runner honours.
#[derive(Debug, Default)]
struct Args {
    filters: Vec<String>,
    skip: Vec<String>,
    exact: bool,
    list: bool,
    threads: Option<usize>,
}

impl Args {
    fn parse(args: impl Iterator<Item = String>) -> Args {
        let mut a = Args::default();
        let mut it = args.peekable();
        while let Some(arg) = it.next() {
            match arg.as_str() {
                "--exact" => a.exact = true,
                "--list" => a.list = true,
                "--skip" => a.skip.extend(it.next()),
                "--test-threads" => a.threads = it.next().and_then(|n| n.parse().ok()),
                s if s.starts_with("--test-threads=") => {
                    a.threads = s["--test-threads=".len()..].parse().ok()
                }
                s if s.starts_with("--skip=") => a.skip.push(s["--skip=".len()..].to_string()),
                // Flags whose value is a separate argument.
                "--format" | "--color" | "--logfile" | "-Z" | "--report-time" => {
                    it.next();
                }
                s if s.starts_with('-') => {}
                s => a.filters.push(s.to_string()),
            }
        }
        a
    }

    fn selects(&self, name: &str) -> bool {
        let matches = |f: &String| {
            if self.exact {
                name == f
            } else {
                name.contains(f.as_str())
            }
        };
        (self.filters.is_empty() || self.filters.iter().any(matches))
            && !self.skip.iter().any(|s| name.contains(s.as_str()))
    }
}

enum Outcome {
    Ok,
    Failed(String),
}

/// The test binary's `main`: selects, runs and reports `cases`.
pub fn main(cases: &[Case]) -> ExitCode {
    let args = Args::parse(std::env::args().skip(1));
    let all: Vec<(String, Case, Agents)> = cases
        .iter()
        .flat_map(|c| {
            c.agents
                .iter()
                .map(move |a| (test_name(c.name, *a), *c, *a))
        })
        .collect();
    let total = all.len();
    let selected: Vec<(String, Case, Agents)> = all
        .into_iter()
        .filter(|(n, _, _)| args.selects(n))
        .collect();
    let filtered_out = total - selected.len();
    if args.list {
        for (name, _, _) in &selected {
            println!("{name}: test");
        }
        return ExitCode::SUCCESS;
    }
    println!("\nrunning {} tests", selected.len());
    let started = Instant::now();
    if selected.is_empty() {
        summary(0, 0, 0, filtered_out, started);
        return ExitCode::SUCCESS;
    }
    let bins = match can_run() {
        Ok(b) => b,
        Err(reason) => {
            for (name, _, _) in &selected {
                crate::support::record_skip(name, &reason, crate::support::CountedAs::Ignored);
                println!("test {name} ... ignored, {reason}");
            }
            summary(0, 0, selected.len(), filtered_out, started);
            return ExitCode::SUCCESS;
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("cannot start a runtime: {e}");
            return ExitCode::from(101);
        }
    };
    let jobs = args.threads.unwrap_or(4).clamp(1, 4);
    let results = runtime.block_on(run_all(&bins, selected, jobs));
    let failed: Vec<&(String, Outcome)> = results
        .iter()
        .filter(|(_, o)| matches!(o, Outcome::Failed(_)))
        .collect();
    if !failed.is_empty() {
        println!("\nfailures:\n");
        for (name, o) in &failed {
            if let Outcome::Failed(msg) = o {
                println!("---- {name} ----\n{msg}\n");
            }
        }
        println!("failures:");
        for (name, _) in &failed {
            println!("    {name}");
        }
    }
    let passed = results.len() - failed.len();
    summary(passed, failed.len(), 0, filtered_out, started);
    // Shut the runtime down before returning so nothing outlives the
    // cluster's teardown (done inside run_all).
    drop(runtime);
    if failed.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(101)
    }
}

async fn run_all(
    bins: &super::UpstreamBins,
    selected: Vec<(String, Case, Agents)>,
    jobs: usize,
) -> Vec<(String, Outcome)> {
    let cp = match ControlPlane::start(bins).await {
        Ok(cp) => Arc::new(cp),
        Err(e) => {
            let msg = format!("the control plane did not start: {e}");
            return selected
                .into_iter()
                .map(|(n, _, _)| {
                    println!("test {n} ... FAILED");
                    (n, Outcome::Failed(msg.clone()))
                })
                .collect();
        }
    };
    let admin = match cp.admin_client().await {
        Ok(c) => c,
        Err(e) => {
            let msg = format!("no admin client: {e}");
            return selected
                .into_iter()
                .map(|(n, _, _)| (n, Outcome::Failed(msg.clone())))
                .collect();
        }
    };
    let env = Arc::new(Env {
        cp: cp.clone(),
        admin,
        keelson: Mutex::new(None),
        upstream: Mutex::new(None),
    });
    let results: Vec<(String, Outcome)> = futures::stream::iter(selected)
        .map(|(name, case, agents)| {
            let env = env.clone();
            async move {
                let outcome = run_one(env.clone(), case, agents).await;
                let outcome = match outcome {
                    Outcome::Failed(msg) => {
                        let mut report = msg;
                        if let Some(node) = env.started(agents).await {
                            report.push_str(&format!(
                                "\n\n=== shared {} node (log tails) ===\n{}",
                                agents.name(),
                                node.log_tails(25)
                            ));
                        }
                        if let Err(e) = env.cp.check_running() {
                            report.push_str(&format!("\n\n=== control plane ===\n{e}"));
                        }
                        println!("test {name} ... FAILED");
                        Outcome::Failed(report)
                    }
                    Outcome::Ok => {
                        println!("test {name} ... ok");
                        Outcome::Ok
                    }
                };
                (name, outcome)
            }
        })
        .buffer_unordered(jobs)
        .collect()
        .await;
    hold(&env).await;
    // Nodes first (their agents use the API), then the control plane.
    env.teardown().await;
    results
}

/// `KEELSON_UPSTREAM_HOLD=SECONDS`: keep the cluster up that long after
/// the cases, for a developer to look around (kubectl with the admin
/// kubeconfig, `nsenter --net` into a node).
async fn hold(env: &Env) {
    let Some(secs) = std::env::var("KEELSON_UPSTREAM_HOLD")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
    else {
        return;
    };
    eprintln!(
        "holding the cluster for {secs}s: KUBECONFIG={}",
        env.cp.admin_kubeconfig().display()
    );
    for agents in Agents::ALL {
        if let Some(node) = env.started(agents).await {
            eprintln!(
                "  node {} ({}): netns {}, files {}",
                node.name,
                node.ip,
                node.containerd().netns().name(),
                node.dir().display()
            );
        }
    }
    tokio::time::sleep(Duration::from_secs(secs)).await;
}

async fn run_one(env: Arc<Env>, case: Case, agents: Agents) -> Outcome {
    let mut task = tokio::spawn((case.run)(env, agents));
    match tokio::time::timeout(CASE_TIMEOUT, &mut task).await {
        Ok(Ok(Ok(()))) => Outcome::Ok,
        Ok(Ok(Err(e))) => Outcome::Failed(format!("{e:?}")),
        Ok(Err(join)) => Outcome::Failed(format!("the case panicked: {join}")),
        Err(_) => {
            task.abort();
            Outcome::Failed(format!("the case did not finish within {CASE_TIMEOUT:?}"))
        }
    }
}

fn summary(passed: usize, failed: usize, ignored: usize, filtered: usize, started: Instant) {
    let verdict = if failed == 0 { "ok" } else { "FAILED" };
    println!(
        "\ntest result: {verdict}. {passed} passed; {failed} failed; {ignored} ignored; 0 measured; {filtered} filtered out; finished in {:.2}s\n",
        started.elapsed().as_secs_f64()
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Args {
        Args::parse(a.iter().map(|s| s.to_string()))
    }

    #[test]
    fn filters_like_libtest() {
        let a = args(&["upstream_", "--test-threads=4", "--nocapture"]);
        assert_eq!(a.threads, Some(4));
        assert!(a.selects("upstream_keelson_node_registers"));
        assert!(!a.selects("something_else"));
        let exact = args(&["--exact", "upstream_kube_x", "--format", "terse"]);
        assert!(exact.selects("upstream_kube_x"));
        assert!(!exact.selects("upstream_kube_xy"));
        let skip = args(&["--skip", "kube_"]);
        assert!(skip.selects("upstream_keelson_a"));
        assert!(!skip.selects("upstream_kube_a"));
        assert!(args(&[]).selects("anything"));
    }
}
