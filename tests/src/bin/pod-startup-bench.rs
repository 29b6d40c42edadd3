//! Pod startup benchmark: the real `keelson` binary (node role) on a
//! private real containerd. For batches of 1, 30 and 100 pods it reports
//! the startup latency of each pod — from the create request to the first
//! `Running` seen through a watch — as p50/p99, and the node agent's CPU
//! seconds and peak RSS meanwhile.
//!
//! - Without `--kubelet`: pods are created through the test API server.
//! - With `--kubelet PATH`: a real control plane (kube-apiserver,
//!   kube-controller-manager and etcd; the first two from PATH's
//!   directory, as `../shared/k8s/unpack DIR` writes them) and one private
//!   containerd; keelson runs the batches, then the real kubelet on the same
//!   containerd and network runs the same batches, and the report ends with
//!   the ratios kubelet / keelson.
//!
//! Needs root. Use a release build of keelson for meaningful figures:
//!
//! ```text
//! cargo build --release -p keelson -p keelson-tests --bin keelson --bin pod-startup-bench
//! sudo KEELSON_BIN=target/release/keelson target/release/pod-startup-bench \
//!     [--sizes 1,30,100] [--kubelet DIR/kubelet]
//! ```

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use keelson_tests::containerd::Containerd;
use keelson_tests::images::BUSYBOX_IMAGE;
use keelson_tests::node_harness::{BinaryNode, BinaryNodeOptions};
use keelson_tests::testapi::{TestApiOptions, TestApiServer};
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::runtime::watcher::{self, Event};
use serde_json::json;
use tokio::sync::mpsc;

/// CPU ticks per second of /proc/<pid>/stat.
fn clock_ticks() -> f64 {
    nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .map(|v| v as f64)
        .unwrap_or(100.0)
}

/// The pid of the keelson process started with `config`.
fn keelson_pid(config: &Path) -> Result<i32> {
    let needle = config.display().to_string();
    for entry in std::fs::read_dir("/proc")? {
        let entry = entry?;
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<String> = cmdline
            .split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        if args.iter().any(|a| a == "run") && args.iter().any(|a| a == &needle) {
            return Ok(pid);
        }
    }
    bail!("keelson process with config {needle} not found")
}

/// (utime + stime) in seconds.
fn cpu_seconds(pid: i32) -> Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let after = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or(&stat);
    let f: Vec<&str> = after.split_whitespace().collect();
    // Fields after "(comm)": state is [0], utime [11], stime [12].
    let utime: f64 = f.get(11).context("utime")?.parse()?;
    let stime: f64 = f.get(12).context("stime")?.parse()?;
    Ok((utime + stime) / clock_ticks())
}

/// Peak resident set (VmHWM) in MiB.
fn peak_rss_mib(pid: i32) -> Result<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    for line in status.lines() {
        if let Some(v) = line.strip_prefix("VmHWM:") {
            let kb: f64 = v.trim().trim_end_matches("kB").trim().parse()?;
            return Ok(kb / 1024.0);
        }
    }
    bail!("no VmHWM")
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (p / 100.0 * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

struct BatchResult {
    size: usize,
    p50: f64,
    p99: f64,
    max: f64,
    wall: f64,
    cpu: f64,
    peak_rss: f64,
}

async fn run_batch(
    api: &Api<Pod>,
    node_name: &str,
    size: usize,
    batch: &str,
    pid: i32,
) -> Result<BatchResult> {
    let prefix = format!("bench{batch}-");
    // Watch first, so no transition is missed.
    let (tx, mut rx) = mpsc::unbounded_channel::<(String, Instant)>();
    let watch_api = api.clone();
    let p = prefix.clone();
    let watch = tokio::spawn(async move {
        let mut s = watcher::watcher(watch_api, watcher::Config::default()).boxed();
        while let Some(ev) = s.next().await {
            let pods = match ev {
                Ok(Event::Apply(p)) | Ok(Event::InitApply(p)) => vec![p],
                _ => continue,
            };
            for pod in pods {
                let name = pod.metadata.name.clone().unwrap_or_default();
                let running =
                    pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
                if running && name.starts_with(&p) {
                    let _ = tx.send((name, Instant::now()));
                }
            }
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let cpu0 = cpu_seconds(pid)?;
    let t0 = Instant::now();
    let mut created: HashMap<String, Instant> = HashMap::new();
    for i in 0..size {
        let name = format!("{prefix}{i}");
        let pod: Pod = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"nodeName": node_name, "terminationGracePeriodSeconds": 1,
                     "containers": [{"name": "app", "image": BUSYBOX_IMAGE, "command": ["sleep", "3600"]}]}
        }))?;
        created.insert(name, Instant::now());
        api.create(&PostParams::default(), &pod).await?;
    }
    let mut latencies: HashMap<String, f64> = HashMap::new();
    let deadline = Instant::now() + Duration::from_secs(600);
    while latencies.len() < size {
        let left = deadline.saturating_duration_since(Instant::now());
        let Ok(Some((name, at))) = tokio::time::timeout(left, rx.recv()).await else {
            bail!("only {} of {size} pods reached Running", latencies.len());
        };
        if let Some(c) = created.get(&name) {
            latencies
                .entry(name)
                .or_insert_with(|| at.duration_since(*c).as_secs_f64());
        }
    }
    let wall = t0.elapsed().as_secs_f64();
    let cpu = cpu_seconds(pid)? - cpu0;
    let peak = peak_rss_mib(pid)?;
    watch.abort();
    let mut v: Vec<f64> = latencies.values().copied().collect();
    v.sort_by(|a, b| a.total_cmp(b));
    // Clean up the batch before the next one.
    for i in 0..size {
        let _ = api
            .delete(&format!("{prefix}{i}"), &DeleteParams::default())
            .await;
    }
    let clean_deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let left = api
            .list(&ListParams::default())
            .await?
            .items
            .iter()
            .filter(|p| {
                p.metadata
                    .name
                    .as_deref()
                    .is_some_and(|n| n.starts_with(&prefix))
            })
            .count();
        if left == 0 {
            break;
        }
        if Instant::now() > clean_deadline {
            bail!("{left} pods of batch {batch} not removed");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Ok(BatchResult {
        size,
        p50: percentile(&v, 50.0),
        p99: percentile(&v, 99.0),
        max: v.last().copied().unwrap_or(0.0),
        wall,
        cpu,
        peak_rss: peak,
    })
}

struct Args {
    sizes: Vec<usize>,
    kubelet: Option<std::path::PathBuf>,
}

fn args() -> Result<Args> {
    let mut a = Args {
        sizes: vec![1, 30, 100],
        kubelet: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--sizes" => {
                a.sizes = it
                    .next()
                    .context("--sizes needs a list")?
                    .split(',')
                    .map(|s| s.parse())
                    .collect::<Result<_, _>>()?;
            }
            "--kubelet" => a.kubelet = Some(it.next().context("--kubelet needs a path")?.into()),
            other => bail!("unknown argument {other:?} (--sizes LIST, --kubelet PATH)"),
        }
    }
    Ok(a)
}

const HEADER: &str =
    "  pods    p50 (s)    p99 (s)    max (s)   wall (s)    agent CPU s   peak RSS MiB";

fn row(r: &BatchResult) -> String {
    format!(
        "{:>6}  {:>9.3}  {:>9.3}  {:>9.3}  {:>9.2}  {:>13.2}  {:>13.1}",
        r.size, r.p50, r.p99, r.max, r.wall, r.cpu, r.peak_rss
    )
}

async fn batches(
    api: &Api<Pod>,
    node: &str,
    sizes: &[usize],
    pid: i32,
    tag: &str,
) -> Result<Vec<BatchResult>> {
    let mut out = Vec::new();
    for (i, size) in sizes.iter().enumerate() {
        let r = run_batch(api, node, *size, &format!("{tag}{i}"), pid).await?;
        println!("{}", row(&r));
        out.push(r);
    }
    Ok(out)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let args = args()?;
    if !nix::unistd::geteuid().is_root() {
        bail!("the pod startup benchmark needs root (containerd, network namespaces, cgroups)");
    }
    let bin = std::env::var("KEELSON_BIN")
        .unwrap_or_else(|_| "target/debug/keelson (debug build!)".into());
    match &args.kubelet {
        None => against_test_api(&args, &bin).await,
        Some(kubelet) => side_by_side(&args, &bin, kubelet).await,
    }
}

async fn against_test_api(args: &Args, bin: &str) -> Result<()> {
    let ctrd = Containerd::start().await.context("starting containerd")?;
    let testapi = TestApiServer::start(TestApiOptions::default()).await?;
    let admin = testapi.client().await;
    let node = BinaryNode::start(
        &ctrd,
        &testapi,
        BinaryNodeOptions {
            log_filter: "warn".into(),
            ..BinaryNodeOptions::default()
        },
    )?;
    let config = node.dir().join("config.yaml");
    // Wait for keelson to be up.
    let mut pid = None;
    for _ in 0..100 {
        if let Ok(p) = keelson_pid(&config) {
            pid = Some(p);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let pid = pid.context("keelson did not start")?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let api: Api<Pod> = Api::namespaced(admin, "default");
    println!("pod startup: create request → Running seen through a watch (test API server)");
    println!(
        "keelson: {bin}; containerd {}",
        ctrd.client().version().await?.runtime_version
    );
    println!("{HEADER}");
    batches(&api, &node.node_name, &args.sizes, pid, "bench").await?;
    drop(node);
    Ok(())
}

/// keelson, then the real kubelet, on one containerd against one real
/// control plane.
async fn side_by_side(args: &Args, bin: &str, kubelet: &Path) -> Result<()> {
    use keelson_tests::upstream::{
        Agents, ClusterNode, ControlPlane, NodeSpec, ProxyAgent, UpstreamBins,
    };
    let dir = kubelet.parent().context("--kubelet has no directory")?;
    let bins = UpstreamBins::in_dir(dir).map_err(anyhow::Error::msg)?;
    let cp = std::sync::Arc::new(ControlPlane::start(&bins).await?);
    let admin = cp.admin_client().await?;
    let quiet = |agents: Agents| NodeSpec {
        proxy: ProxyAgent::None,
        quiet: true,
        ..NodeSpec::of(agents)
    };
    let mut node = ClusterNode::start(&cp, "bench-keelson", quiet(Agents::Keelson)).await?;
    node.wait_ready(&admin).await?;
    let version = node.containerd().client().version().await?.runtime_version;
    let api: Api<Pod> = Api::namespaced(admin.clone(), "default");
    println!("pod startup: create request → Running seen through a watch");
    println!(
        "real kube-apiserver v1.36 ({}); containerd {version}; one containerd for both agents",
        bins.dir().display()
    );
    println!("\nkeelson ({bin}):\n{HEADER}");
    let pid = agent_pid(&node)?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mine = batches(&api, &node.name, &args.sizes, pid, "k").await?;

    node.replace_agents("bench-kubelet", quiet(Agents::Upstream))?;
    node.wait_ready(&admin).await?;
    let pid = agent_pid(&node)?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    println!("\nkubelet ({}):\n{HEADER}", kubelet.display());
    let theirs = batches(&api, &node.name, &args.sizes, pid, "u").await?;

    println!("\nkubelet / keelson (above 1: keelson is faster or smaller):");
    println!("  pods    p50     p99     CPU     peak RSS");
    for (m, t) in mine.iter().zip(&theirs) {
        let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { f64::NAN };
        println!(
            "{:>6}  {:>5.2}x  {:>5.2}x  {:>5.2}x  {:>5.2}x",
            m.size,
            ratio(t.p50, m.p50),
            ratio(t.p99, m.p99),
            ratio(t.cpu, m.cpu),
            ratio(t.peak_rss, m.peak_rss)
        );
    }
    drop(node);
    Ok(())
}

fn agent_pid(node: &keelson_tests::upstream::ClusterNode) -> Result<i32> {
    let pid = node
        .node_agent_pid()
        .context("the node agent is not running")?;
    Ok(i32::try_from(pid)?)
}
