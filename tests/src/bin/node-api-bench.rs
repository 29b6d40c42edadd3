//! Node API benchmark: the real `keelson` binary (node role) on a private
//! real containerd. Prints:
//!
//! 1. streaming a 100 MiB container log (`/containerLogs`, straight from
//!    the node API, and `kubectl logs` through the test API server):
//!    MiB/s and keelson's RSS growth;
//! 2. `/stats/summary` latency (p50/p99 of 200 requests) with 100 pods;
//! 3. 50 concurrent `logs -f` followers: keelson's RSS growth.
//!
//! With `--kubelet PATH` (the real kubelet, beside the other v1.36
//! binaries), it runs instead side by side against a real kube-apiserver
//! v1.36: `kubectl logs` of a 100 MiB container log through the API
//! server (which proxies to the node with its kubelet client
//! certificate), with keelson as the node agent and then with the real
//! kubelet on the same containerd, and each agent's RSS growth while it
//! streams; ratios kubelet / keelson.
//!
//! Needs root. Use release builds for meaningful figures:
//!
//! ```text
//! cargo build --release -p keelson -p keelson-tests --bin node-api-bench
//! sudo KEELSON_BIN=target/release/keelson target/release/node-api-bench [--pods 100]
//! sudo KEELSON_BIN=target/release/keelson target/release/node-api-bench --kubelet target/upstream-bin/kubelet
//! ```

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use k8s_openapi::api::core::v1::Pod;
use keelson::config::KubeDuration;
use keelson_tests::containerd::Containerd;
use keelson_tests::images::BUSYBOX_IMAGE;
use keelson_tests::node_api::{Credentials, tls_config};
use keelson_tests::node_harness::{BinaryNode, BinaryNodeOptions, SYSTEM_NODE_IP};
use keelson_tests::testapi::{TestApiOptions, TestApiServer};
use kube::Api;
use kube::api::PostParams;
use rustls::pki_types::ServerName;
use serde_json::json;

fn rss_of(pid: i32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse::<u64>().ok())
        })
        .unwrap_or(0)
        * 1024
}

/// Opens a TLS connection to the node API inside the namespace.
async fn node_conn(
    ns: &str,
    addr: SocketAddr,
    creds: &Credentials,
) -> Result<hyper::client::conn::http1::SendRequest<Empty<Bytes>>> {
    let ns = ns.to_string();
    let tcp = tokio::task::spawn_blocking(move || {
        keelson_tests::netns::connect_in(&ns, addr, Duration::from_secs(5))
    })
    .await??;
    let tls =
        tokio_rustls::TlsConnector::from(tls_config(creds, None).map_err(anyhow::Error::msg)?)
            .connect(ServerName::IpAddress(addr.ip().into()), tcp)
            .await?;
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls)).await?;
    tokio::spawn(conn);
    Ok(sender)
}

async fn get(
    sender: &mut hyper::client::conn::http1::SendRequest<Empty<Bytes>>,
    path: &str,
) -> Result<hyper::Response<hyper::body::Incoming>> {
    sender.ready().await?;
    let req = http::Request::builder()
        .uri(path)
        .header(http::header::HOST, "node")
        .body(Empty::new())?;
    Ok(sender.send_request(req).await?)
}

fn pct(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

async fn wait_running(pods: &Api<Pod>, names: &[String], timeout: Duration) -> Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        let list = pods.list(&Default::default()).await?;
        let running = list
            .items
            .iter()
            .filter(|p| names.contains(p.metadata.name.as_ref().unwrap_or(&String::new())))
            .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
            .count();
        if running == names.len() {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("{running}/{} pods running after {timeout:?}", names.len());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Appends `mib` MiB of 121-byte CRI log lines to `path`; returns the
/// file's size.
fn write_log(path: &Path, mib: usize) -> Result<u64> {
    use std::io::Write;
    let mut f = std::io::BufWriter::new(std::fs::OpenOptions::new().append(true).open(path)?);
    let line = format!(
        "2024-05-01T10:00:00.123456789Z stdout F {}\n",
        "x".repeat(120)
    );
    let mut written = 0usize;
    while written < mib * 1024 * 1024 {
        f.write_all(line.as_bytes())?;
        written += line.len();
    }
    f.flush()?;
    Ok(std::fs::metadata(path)?.len())
}

/// One `kubectl logs` run: bytes received, seconds, and the agent's RSS
/// before and at its peak while it ran (sampled every 20 ms).
struct LogsRun {
    bytes: usize,
    secs: f64,
    rss0: u64,
    peak: u64,
}

async fn kubectl_logs(kubeconfig: &Path, ns: &str, pod: &str, pid: i32) -> Result<LogsRun> {
    let rss0 = rss_of(pid);
    let mut peak = rss0;
    let start = Instant::now();
    let mut child = tokio::process::Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(["-n", ns, "logs", pod])
        .stdout(std::process::Stdio::piped())
        .spawn()?;
    let mut stdout = child.stdout.take().context("kubectl's stdout")?;
    let reader = tokio::spawn(async move {
        use tokio::io::AsyncReadExt;
        let mut buf = vec![0u8; 1 << 20];
        let mut n = 0usize;
        loop {
            match stdout.read(&mut buf).await {
                Ok(0) | Err(_) => return n,
                Ok(k) => n += k,
            }
        }
    });
    let status = loop {
        if let Some(s) = child.try_wait()? {
            break s;
        }
        peak = peak.max(rss_of(pid));
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let bytes = reader.await?;
    let secs = start.elapsed().as_secs_f64();
    if !status.success() {
        bail!("kubectl logs {ns}/{pod}: {status}");
    }
    Ok(LogsRun {
        bytes,
        secs,
        rss0,
        peak: peak.max(rss_of(pid)),
    })
}

/// keelson, then the real kubelet, on one containerd against one real
/// control plane: `kubectl logs` of a 100 MiB log through kube-apiserver.
async fn side_by_side(kubelet: &Path) -> Result<()> {
    use keelson_tests::upstream::{
        Agents, ClusterNode, ControlPlane, NodeSpec, ProxyAgent, UpstreamBins,
    };
    let bin = std::env::var("KEELSON_BIN")
        .unwrap_or_else(|_| "target/debug/keelson (debug build!)".into());
    let dir = kubelet.parent().context("--kubelet has no directory")?;
    let bins = UpstreamBins::in_dir(dir).map_err(anyhow::Error::msg)?;
    let cp = Arc::new(ControlPlane::start(&bins).await?);
    let admin = cp.admin_client().await?;
    // Logs are not rotated during the run (both agents rotate at 10Mi by
    // default, and read only the current file).
    let quiet = |agents: Agents| NodeSpec {
        proxy: ProxyAgent::None,
        quiet: true,
        keelson: Some(Arc::new(|c: &mut keelson::config::Config| {
            c.node.container_log_max_size = "1Gi".into();
        })),
        kubelet: Some(Arc::new(|y: &mut serde_yaml::Mapping| {
            y.insert("containerLogMaxSize".into(), "1Gi".into());
        })),
        ..NodeSpec::of(agents)
    };
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    println!(
        "kubectl logs of a 100 MiB container log (121-byte CRI lines) through a real kube-apiserver v1.36 ({})",
        bins.dir().display()
    );
    let mut node = ClusterNode::start(&cp, "bench-keelson", quiet(Agents::Keelson)).await?;
    let mut rows = Vec::new();
    for (agents, label) in [
        (Agents::Keelson, format!("keelson ({bin})")),
        (Agents::Upstream, format!("kubelet ({})", kubelet.display())),
    ] {
        if agents == Agents::Upstream {
            node.replace_agents("bench-kubelet", quiet(Agents::Upstream))?;
        }
        node.wait_ready(&admin).await?;
        let pid = i32::try_from(
            node.node_agent_pid()
                .context("the node agent is not running")?,
        )?;
        let name = format!("talker-{}", agents.name());
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"nodeName": node.name, "terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "app", "image": BUSYBOX_IMAGE, "imagePullPolicy": "Never", "command": ["sleep", "36000"]}]}
        }))?;
        pods.create(&PostParams::default(), &pod).await?;
        wait_running(&pods, std::slice::from_ref(&name), Duration::from_secs(120)).await?;
        let uid = pods.get(&name).await?.metadata.uid.unwrap_or_default();
        let log = node
            .dir()
            .join(format!("pod-logs/default_{name}_{uid}/app/0.log"));
        let size = write_log(&log, 100)?;
        // Once to warm the page cache and the connections, then timed.
        kubectl_logs(cp.admin_kubeconfig(), "default", &name, pid).await?;
        let r = kubectl_logs(cp.admin_kubeconfig(), "default", &name, pid).await?;
        println!(
            "{label}: {:.1} MiB log, {:.1} MiB of content in {:.2} s = {:.0} MiB/s of log; agent RSS {:.1} -> peak {:.1} MiB (+{:.1} MiB)",
            size as f64 / 1048576.0,
            r.bytes as f64 / 1048576.0,
            r.secs,
            size as f64 / 1048576.0 / r.secs,
            r.rss0 as f64 / 1048576.0,
            r.peak as f64 / 1048576.0,
            r.peak.saturating_sub(r.rss0) as f64 / 1048576.0
        );
        rows.push((size as f64 / r.secs, r.peak.saturating_sub(r.rss0) as f64));
    }
    if let [(k_rate, k_rss), (u_rate, u_rss)] = rows[..] {
        println!(
            "keelson / kubelet: throughput x{:.2}; RSS growth {:.1} MiB against {:.1} MiB",
            k_rate / u_rate,
            k_rss / 1048576.0,
            u_rss / 1048576.0
        );
    }
    drop(node);
    Ok(())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--kubelet") {
        let kubelet = args.get(i + 1).context("--kubelet needs a path")?;
        return side_by_side(Path::new(kubelet)).await;
    }
    let n_pods: usize = args
        .iter()
        .position(|a| a == "--pods")
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(100);
    let ctrd = Containerd::start().await.context("containerd")?;
    let api = TestApiServer::start(TestApiOptions::default()).await?;
    let admin = api.client().await;
    let state = tempfile::tempdir()?;
    let logs_dir: PathBuf = state.path().join("pod-logs");
    let logs2 = logs_dir.clone();
    let mut node = BinaryNode::start(
        &ctrd,
        &api,
        BinaryNodeOptions {
            configure: Some(Arc::new(move |c| {
                c.node.pod_logs_dir = logs2.clone();
                c.node.container_log_max_size = "1Gi".into();
                c.node.max_pods = 250;
                c.node.node_status_update_frequency = KubeDuration::from_secs(2);
            })),
            log_filter: "info".into(),
            ..BinaryNodeOptions::default()
        },
    )?;
    let pid = node
        .wait_healthy(&ctrd, Duration::from_secs(60))
        .await
        .map_err(anyhow::Error::msg)?;
    let ns = ctrd.netns().name().to_string();
    let addr = SocketAddr::new(SYSTEM_NODE_IP.into(), 10250);
    let (cert, key) = api.issue_client_certificate("bench", Some("system:masters"))?;
    let creds = Credentials::Cert(cert, key);
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    let mk = |name: String| {
        serde_json::from_value::<Pod>(json!({
            "metadata": {"name": name},
            "spec": {"nodeName": node.node_name, "terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "app", "image": BUSYBOX_IMAGE, "command": ["sleep", "36000"]}]}
        }))
    };
    pods.create(&PostParams::default(), &mk("quiet".into())?)
        .await?;
    wait_running(&pods, &["quiet".to_string()], Duration::from_secs(120)).await?;
    let uid = pods.get("quiet").await?.metadata.uid.unwrap_or_default();
    let log = logs_dir.join(format!("default_quiet_{uid}/app/0.log"));

    // 1. a 100 MiB log.
    let size = write_log(&log, 100)?;
    let rss0 = rss_of(pid);
    let mut peak = rss0;
    let mut sender = node_conn(&ns, addr, &creds).await?;
    let start = Instant::now();
    let resp = get(&mut sender, "/containerLogs/default/quiet/app").await?;
    let mut body = resp.into_body();
    let mut got = 0u64;
    let mut last_sample = Instant::now();
    while let Some(frame) = body.frame().await {
        if let Ok(d) = frame?.into_data() {
            got += d.len() as u64;
        }
        if last_sample.elapsed() > Duration::from_millis(50) {
            peak = peak.max(rss_of(pid));
            last_sample = Instant::now();
        }
    }
    let secs = start.elapsed().as_secs_f64();
    peak = peak.max(rss_of(pid));
    println!(
        "logs (node API): a {:.1} MiB log file read in {:.2} s = {:.0} MiB/s of log ({:.1} MiB of content sent, {:.0} MiB/s); keelson RSS {:.1} MiB -> peak {:.1} MiB (+{:.1} MiB)",
        size as f64 / 1048576.0,
        secs,
        size as f64 / 1048576.0 / secs,
        got as f64 / 1048576.0,
        got as f64 / 1048576.0 / secs,
        rss0 as f64 / 1048576.0,
        peak as f64 / 1048576.0,
        (peak.saturating_sub(rss0)) as f64 / 1048576.0
    );
    let kstart = Instant::now();
    let out = tokio::process::Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(api.kubeconfig_path())
        .args(["logs", "quiet"])
        .stdout(std::process::Stdio::piped())
        .output()
        .await?;
    let ksecs = kstart.elapsed().as_secs_f64();
    println!(
        "logs (kubectl logs through the test API server): {:.1} MiB in {:.2} s = {:.0} MiB/s",
        out.stdout.len() as f64 / 1048576.0,
        ksecs,
        out.stdout.len() as f64 / 1048576.0 / ksecs
    );

    // 3. 50 followers.
    let rss_before = rss_of(pid);
    let mut followers = Vec::new();
    for _ in 0..50 {
        let mut s = node_conn(&ns, addr, &creds).await?;
        let resp = get(
            &mut s,
            "/containerLogs/default/quiet/app?follow=true&tailLines=1",
        )
        .await?;
        let mut b = resp.into_body();
        followers.push(tokio::spawn(async move {
            let _keep = s;
            let mut n = 0u64;
            while let Some(Ok(f)) = b.frame().await {
                if let Ok(d) = f.into_data() {
                    n += d.len() as u64;
                }
            }
            n
        }));
    }
    {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new().append(true).open(&log)?;
        for i in 0..50 {
            writeln!(f, "2024-05-01T10:00:01Z stdout F follow {i}")?;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rss_follow = rss_of(pid);
    println!(
        "50 logs -f followers: keelson RSS {:.1} MiB -> {:.1} MiB (+{:.1} MiB), threads {}",
        rss_before as f64 / 1048576.0,
        rss_follow as f64 / 1048576.0,
        rss_follow.saturating_sub(rss_before) as f64 / 1048576.0,
        std::fs::read_dir(format!("/proc/{pid}/task"))
            .map(|d| d.count())
            .unwrap_or(0)
    );
    for f in followers {
        f.abort();
    }

    // 2. /stats/summary with n pods.
    let names: Vec<String> = (0..n_pods.saturating_sub(1))
        .map(|i| format!("p{i}"))
        .collect();
    for n in &names {
        pods.create(&PostParams::default(), &mk(n.clone())?).await?;
    }
    wait_running(&pods, &names, Duration::from_secs(900)).await?;
    let mut s = node_conn(&ns, addr, &creds).await?;
    // The summary is the last housekeeping round's: wait (at most a
    // minute) for a round that saw every pod.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let r = get(&mut s, "/stats/summary").await?;
        let b = r.into_body().collect().await?.to_bytes();
        let v: serde_json::Value = serde_json::from_slice(&b)?;
        let seen = v["pods"].as_array().map(Vec::len).unwrap_or(0);
        if seen >= n_pods || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let mut times = Vec::new();
    let mut pods_seen = 0;
    for _ in 0..200 {
        let t = Instant::now();
        let r = get(&mut s, "/stats/summary").await?;
        let b = r.into_body().collect().await?.to_bytes();
        times.push(t.elapsed());
        let v: serde_json::Value = serde_json::from_slice(&b)?;
        pods_seen = v["pods"].as_array().map(Vec::len).unwrap_or(0);
    }
    times.sort();
    println!(
        "/stats/summary with {pods_seen} pods: p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms (200 requests)",
        pct(&times, 0.5).as_secs_f64() * 1e3,
        pct(&times, 0.99).as_secs_f64() * 1e3,
        times.last().copied().unwrap_or_default().as_secs_f64() * 1e3
    );
    let mut times = Vec::new();
    for _ in 0..200 {
        let t = Instant::now();
        let r = get(&mut s, "/metrics/resource").await?;
        let _ = r.into_body().collect().await?;
        times.push(t.elapsed());
    }
    times.sort();
    println!(
        "/metrics/resource with {pods_seen} pods: p50 {:.1} ms, p99 {:.1} ms",
        pct(&times, 0.5).as_secs_f64() * 1e3,
        pct(&times, 0.99).as_secs_f64() * 1e3
    );
    drop(node);
    Ok(())
}
