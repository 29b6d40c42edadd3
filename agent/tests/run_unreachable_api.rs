//! `keelson run --proxy-only` against an API server that does not answer:
//! it keeps retrying with backoff and says why, answers /healthz and
//! /metrics meanwhile, tells systemd it is ready, and exits cleanly on SIGTERM.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::net::UnixDatagram;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

struct KillOnDrop(Child);
impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn http_get(addr: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    let code = out
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = out
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Ok((code, body))
}

fn unused_port() -> u16 {
    // Bind and release: the kubeconfig must point at a port nobody serves.
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("ephemeral port")
}

#[test]
fn proxy_only_retries_serves_health_and_stops_on_sigterm() {
    let dir = tempfile::tempdir().expect("tempdir");
    let kubeconfig = dir.path().join("kubeconfig");
    let port = unused_port();
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: http://127.0.0.1:{port}\ncontexts:\n- name: c\n  context:\n    cluster: c\n    user: u\ncurrent-context: c\nusers:\n- name: u\n  user:\n    token: t\n"
        ),
    )
    .expect("write kubeconfig");
    let config = dir.path().join("config.yaml");
    std::fs::write(
        &config,
        "apiVersion: keelson.dev/v1alpha1\nkind: KeelsonConfiguration\nnodeName: test-node\nhealthzBindAddress: 127.0.0.1:0\nmetricsBindAddress: 127.0.0.1:0\nproxy:\n  healthzBindAddress: 127.0.0.1:0\n",
    )
    .expect("write config");
    let notify_path = dir.path().join("notify.sock");
    let notify = UnixDatagram::bind(&notify_path).expect("notify socket");
    notify
        .set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");

    let child = Command::new(env!("CARGO_BIN_EXE_keelson"))
        .args(["run", "--proxy-only", "--log-format", "json", "--config"])
        .arg(&config)
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .env("NOTIFY_SOCKET", &notify_path)
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start keelson");
    let mut child = KillOnDrop(child);
    let stderr = child.0.stderr.take().expect("stderr");
    let (tx, rx) = mpsc::channel::<serde_json::Value>();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Ok(v) = serde_json::from_str(&line)
                && tx.send(v).is_err()
            {
                break;
            }
        }
    });

    // systemd readiness
    let mut buf = [0u8; 256];
    let n = notify.recv(&mut buf).expect("READY=1 from keelson");
    assert!(String::from_utf8_lossy(&buf[..n]).contains("READY=1"));

    // Collect the bound addresses and at least two retry warnings naming the failure.
    let mut health_addr = None;
    let mut metrics_addr = None;
    let mut retries = 0;
    let deadline = Instant::now() + Duration::from_secs(30);
    while (health_addr.is_none() || metrics_addr.is_none() || retries < 2)
        && Instant::now() < deadline
    {
        let Ok(v) = rx.recv_timeout(Duration::from_secs(1)) else {
            continue;
        };
        let msg = v["message"].as_str().unwrap_or_default();
        if msg == "serving" {
            let addr: Option<SocketAddr> = v["address"].as_str().and_then(|a| a.parse().ok());
            match v["server"].as_str() {
                Some("health") => health_addr = addr,
                Some("metrics") => metrics_addr = addr,
                _ => {}
            }
        }
        if v["level"] == "WARN" && msg.contains("retrying") {
            let err = v["error"].as_str().unwrap_or_default().to_lowercase();
            assert!(
                err.contains("connect") || err.contains("refused") || err.contains("tcp"),
                "retry log says why: {v}"
            );
            retries += 1;
        }
    }
    let health_addr = health_addr.expect("health server address logged");
    let metrics_addr = metrics_addr.expect("metrics server address logged");
    assert!(retries >= 2, "keeps retrying (saw {retries} retries)");

    let (code, body) = http_get(health_addr, "/healthz").expect("healthz answers");
    assert_eq!((code, body.as_str()), (200, "ok"));
    let (code, body) = http_get(health_addr, "/readyz?verbose").expect("readyz answers");
    assert_eq!(code, 500, "not ready while the API is unreachable: {body}");
    assert!(body.contains("[-]proxy"), "{body}");
    let (code, body) = http_get(metrics_addr, "/metrics").expect("metrics answer");
    assert_eq!(code, 200);
    assert!(body.contains("process_resident_memory_bytes"), "{body}");
    assert!(body.contains("keelson_build_info"), "{body}");

    // SIGTERM: clean exit, STOPPING=1 first.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(child.0.id()).expect("pid")),
        nix::sys::signal::Signal::SIGTERM,
    )
    .expect("send SIGTERM");
    let mut seen = Vec::new();
    while !seen.iter().any(|m: &String| m.contains("STOPPING=1")) {
        let n = notify
            .recv(&mut buf)
            .unwrap_or_else(|e| panic!("STOPPING=1 from keelson (got {seen:?}): {e}"));
        seen.push(String::from_utf8_lossy(&buf[..n]).into_owned());
    }
    let deadline = Instant::now() + Duration::from_secs(15);
    let status = loop {
        if let Some(s) = child.0.try_wait().expect("wait") {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "keelson did not exit after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "clean exit: {status:?}");
}

#[test]
fn check_config_reports_the_field() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cases = [
        ("node:\n  maxPods: many\n", "node.maxPods"),
        ("node:\n  maxPod: 1\n", "node.maxPod"),
        ("proxy:\n  syncPeriod: -1s\n", "proxy.syncPeriod"),
    ];
    for (body, field) in cases {
        let f = dir.path().join("c.yaml");
        std::fs::write(
            &f,
            format!("apiVersion: keelson.dev/v1alpha1\nkind: KeelsonConfiguration\n{body}"),
        )
        .expect("write");
        let out = Command::new(env!("CARGO_BIN_EXE_keelson"))
            .arg("check-config")
            .arg(&f)
            .output()
            .expect("run check-config");
        assert!(!out.status.success(), "{body} must fail");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(field), "error names {field}: {err}");
    }
    let good = dir.path().join("good.yaml");
    std::fs::write(
        &good,
        "apiVersion: keelson.dev/v1alpha1\nkind: KeelsonConfiguration\nnode:\n  maxPods: 30\n",
    )
    .expect("write");
    let out = Command::new(env!("CARGO_BIN_EXE_keelson"))
        .arg("check-config")
        .arg(&good)
        .output()
        .expect("run check-config");
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("maxPods: 30") && text.contains("nodeStatusReportFrequency: 5m0s"),
        "{text}"
    );
}
