//! Prober cost benchmark: prints probes per CPU-second of the probing
//! process for
//! 1. 1,000 containers with an HTTP readiness probe at period 1 s against a
//!    local HTTP server (run in a child process, so its CPU is not counted);
//! 2. 100 containers with an exec probe at period 1 s through a fake `Exec`
//!    that answers at once (the prober's own overhead; the CRI round trip is
//!    the agent's and the runtime's cost).
//!
//! Run: `cargo run --release -p keelson-probes --example probe_bench`
//! (`-- --seconds N` sets the measuring window, default 10).
//!
//! CPU time is read from `/proc/self/task/*/schedstat` (nanoseconds on CPU
//! of every thread of this process).

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::{Container, ExecAction, HTTPGetAction, Pod, PodSpec, Probe};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use keelson_probes::{
    ContainerStart, Exec, ExecError, ExecOutput, ProbeManager, ProbeManagerConfig, ReportedStatus,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

struct InstantExec;

impl Exec for InstantExec {
    async fn exec(&self, _: &str, _: Vec<String>, _: Duration) -> Result<ExecOutput, ExecError> {
        Ok(ExecOutput {
            exit_code: 0,
            stdout: b"ok".to_vec(),
            stderr: Vec::new(),
        })
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.iter().any(|a| a == "--serve-http") {
        serve_http();
        return;
    }
    let seconds = args
        .iter()
        .position(|a| a == "--seconds")
        .and_then(|i| args.get(i + 1))
        .and_then(|s| s.parse::<u64>().ok())
        .unwrap_or(10);

    let (mut server, port) = start_server();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("runtime: {e}");
            let _ = server.kill();
            std::process::exit(1);
        }
    };
    println!(
        "probe_bench: {} CPU(s) available to this process, window {seconds} s",
        available_cpus()
    );
    runtime.block_on(async {
        let http = Scenario {
            name: "HTTP",
            containers: 1000,
            probe: http_probe(port),
        };
        http.run(seconds).await;
        let exec = Scenario {
            name: "exec (fake Exec)",
            containers: 100,
            probe: exec_probe(),
        };
        exec.run(seconds).await;
        timer_baseline(100, seconds).await;
    });
    let _ = server.kill();
    let _ = server.wait();
}

struct Scenario {
    name: &'static str,
    containers: usize,
    probe: Probe,
}

impl Scenario {
    async fn run(&self, seconds: u64) {
        let registry = prometheus::Registry::new();
        let (manager, mut outputs) = match ProbeManager::new(
            ProbeManagerConfig::default(),
            Arc::new(InstantExec),
            &registry,
        ) {
            Ok(m) => m,
            Err(e) => {
                eprintln!("manager: {e}");
                return;
            }
        };
        // Drain what the agent would consume.
        tokio::spawn(async move { while outputs.updates.recv().await.is_some() {} });
        let events = tokio::spawn(async move {
            let mut n = 0u64;
            while outputs.events.recv().await.is_some() {
                n += 1;
            }
            n
        });
        for i in 0..self.containers {
            let uid = format!("uid-{i}");
            if let Err(e) = manager.add_pod(&pod(&uid, self.probe.clone())) {
                eprintln!("add_pod: {e}");
                return;
            }
            // Adopted containers (as after a keelson restart): first probes
            // are spread over the period.
            let start = ContainerStart {
                container_id: format!("cid-{i}"),
                started_at: SystemTime::now() - Duration::from_secs(60),
                pod_ips: vec!["127.0.0.1".into()],
                adopted: Some(ReportedStatus {
                    started: true,
                    ready: true,
                }),
            };
            if let Err(e) = manager.container_started(&uid, "app", start) {
                eprintln!("container_started: {e}");
                return;
            }
        }
        // Warm up: let every worker run a few times.
        tokio::time::sleep(Duration::from_secs(3)).await;
        let (ok0, failed0) = totals(&registry);
        let cpu0 = cpu_ns();
        let wall0 = std::time::Instant::now();
        tokio::time::sleep(Duration::from_secs(seconds)).await;
        let cpu = (cpu_ns().saturating_sub(cpu0)) as f64 / 1e9;
        let wall = wall0.elapsed().as_secs_f64();
        let (ok1, failed1) = totals(&registry);
        let probes = (ok1 - ok0) + (failed1 - failed0);
        manager.shutdown();
        drop(manager);
        events.abort();
        println!(
            "{:<17} {:>5} containers, period 1 s: {:>7.0} probes in {:.1} s ({:.0}/s), {} failed; \
             CPU {:.3} s ({:.1}% of one core) => {:.0} probes per CPU-second; RSS {} KiB",
            self.name,
            self.containers,
            probes,
            wall,
            probes / wall,
            failed1 - failed0,
            cpu,
            100.0 * cpu / wall,
            if cpu > 0.0 {
                probes / cpu
            } else {
                f64::INFINITY
            },
            rss_kib(),
        );
    }
}

/// The cost of the runtime alone: `tasks` tasks that wake every second and
/// do nothing (what any per-container timer costs on this machine).
async fn timer_baseline(tasks: usize, seconds: u64) {
    let mut handles = Vec::new();
    for i in 0..tasks {
        handles.push(tokio::spawn(async move {
            let offset = Duration::from_millis((i as u64 * 7919) % 1000);
            let mut ticker = tokio::time::interval_at(
                tokio::time::Instant::now() + offset,
                Duration::from_secs(1),
            );
            loop {
                ticker.tick().await;
            }
        }));
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let cpu0 = cpu_ns();
    let wall0 = std::time::Instant::now();
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    let cpu = (cpu_ns().saturating_sub(cpu0)) as f64 / 1e9;
    let wall = wall0.elapsed().as_secs_f64();
    for h in handles {
        h.abort();
    }
    let wakeups = tasks as f64 * wall;
    println!(
        "{:<17} {tasks:>5} tasks waking every 1 s, doing nothing: CPU {cpu:.3} s ({:.1}% of one core) => {:.0} wakeups per CPU-second",
        "runtime baseline",
        100.0 * cpu / wall,
        if cpu > 0.0 {
            wakeups / cpu
        } else {
            f64::INFINITY
        },
    );
}

fn http_probe(port: u16) -> Probe {
    Probe {
        http_get: Some(HTTPGetAction {
            port: IntOrString::Int(i32::from(port)),
            path: Some("/healthz".into()),
            ..Default::default()
        }),
        period_seconds: Some(1),
        timeout_seconds: Some(1),
        ..Default::default()
    }
}

fn exec_probe() -> Probe {
    Probe {
        exec: Some(ExecAction {
            command: Some(vec!["cat".into(), "/tmp/healthy".into()]),
        }),
        period_seconds: Some(1),
        timeout_seconds: Some(1),
        ..Default::default()
    }
}

fn pod(uid: &str, probe: Probe) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(format!("bench-{uid}")),
            namespace: Some("bench".into()),
            uid: Some(uid.into()),
            ..Default::default()
        },
        spec: Some(PodSpec {
            containers: vec![Container {
                name: "app".into(),
                readiness_probe: Some(probe),
                ..Default::default()
            }],
            ..Default::default()
        }),
        status: None,
    }
}

/// Sums of `prober_probe_total` by successful / failed.
fn totals(registry: &prometheus::Registry) -> (f64, f64) {
    use prometheus::Encoder;
    let mut buf = Vec::new();
    if prometheus::TextEncoder::new()
        .encode(&registry.gather(), &mut buf)
        .is_err()
    {
        return (0.0, 0.0);
    }
    let text = String::from_utf8_lossy(&buf);
    let (mut ok, mut failed) = (0.0, 0.0);
    for line in text
        .lines()
        .filter(|l| l.starts_with("prober_probe_total{"))
    {
        let value: f64 = line
            .rsplit(' ')
            .next()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0);
        if line.contains("result=\"successful\"") {
            ok += value;
        } else {
            failed += value;
        }
    }
    (ok, failed)
}

/// Nanoseconds on CPU of all threads of this process.
fn cpu_ns() -> u64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| {
            s.split_whitespace()
                .next()
                .and_then(|v| v.parse::<u64>().ok())
        })
        .sum()
}

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

fn available_cpus() -> usize {
    std::thread::available_parallelism()
        .map(usize::from)
        .unwrap_or(1)
}

/// Starts this program again as the HTTP server; returns it and its port.
fn start_server() -> (Child, u16) {
    let exe = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("current_exe: {e}");
            std::process::exit(1);
        }
    };
    let mut child = match Command::new(exe)
        .arg("--serve-http")
        .stdout(Stdio::piped())
        .spawn()
    {
        Ok(c) => c,
        Err(e) => {
            eprintln!("spawn server: {e}");
            std::process::exit(1);
        }
    };
    let port = child
        .stdout
        .take()
        .and_then(|out| BufReader::new(out).lines().next())
        .and_then(|line| line.ok())
        .and_then(|line| line.trim().parse::<u16>().ok());
    match port {
        Some(port) => (child, port),
        None => {
            eprintln!("server did not report its port");
            let _ = child.kill();
            std::process::exit(1);
        }
    }
}

/// A minimal HTTP/1.1 server on 127.0.0.1: `200 ok` to every request.
fn serve_http() {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("server runtime: {e}");
            return;
        }
    };
    runtime.block_on(async {
        let listener = match tokio::net::TcpListener::bind("127.0.0.1:0").await {
            Ok(l) => l,
            Err(e) => {
                eprintln!("server bind: {e}");
                return;
            }
        };
        let port = listener.local_addr().map(|a| a.port()).unwrap_or(0);
        let mut out = std::io::stdout();
        let _ = writeln!(out, "{port}");
        let _ = out.flush();
        while let Ok((mut sock, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut head = Vec::with_capacity(512);
                let mut buf = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match sock.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let _ = sock
                    .write_all(
                        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok",
                    )
                    .await;
                let _ = sock.shutdown().await;
            });
        }
    });
}
