//! System tests of the node API with real parts: the keelson binary on a
//! private containerd, the real kubectl against the test API server, which
//! proxies to keelson's :10250 with its kubelet client certificate.
//! `kubectl logs` (`-f` across a rotation, `--previous`, `--tail`,
//! `--since`, `--timestamps` against the CRI log),
//! `kubectl exec` (stdin, a tty with its size and a resize, exit codes),
//! `kubectl attach`,
//! `kubectl port-forward` with real traffic, and `get --raw` of the stats
//! summary and resource metrics against the pod's own cgroup.
//! keelson declares `ExtendWebSocketsToKubelet`, so kubectl's WebSocket
//! requests reach it unchanged and it translates them to SPDY toward
//! containerd (exec/attach) or tunnels them (port-forward); its
//! `kubelet_websocket_streaming_requests_total` proves that path.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use crate::system_pods_support::{IMAGE, SysWorld, container_status};
use keelson::config::KubeDuration;
use keelson_tests::containerd::Containerd;
use keelson_tests::node_api::{kubectl, kubectl_exec_tty_resize, websocket_streaming_requests};
use keelson_tests::node_harness::{BinaryNode, BinaryNodeOptions};
use keelson_tests::support::{require_root, wait_for};
use keelson_tests::testapi::{TestApiOptions, TestApiServer};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};

const T: Duration = Duration::from_secs(90);

async fn world() -> SysWorld {
    let ctrd = Containerd::start().await.expect("containerd");
    let api = TestApiServer::start(TestApiOptions::default())
        .await
        .expect("test API server");
    let admin = api.client().await;
    let state = tempfile::Builder::new()
        .prefix("keelson-sysapi-")
        .tempdir()
        .unwrap();
    let mut w = SysWorld {
        node: None,
        api,
        admin,
        ctrd,
        node_name: format!("sysapi-{}", keelson_tests::netns::unique_suffix()),
        state,
        extra: None,
    };
    let root: PathBuf = w.state.path().join("root");
    let logs: PathBuf = w.state.path().join("pod-logs/pods");
    w.node = Some(
        BinaryNode::start(
            &w.ctrd,
            &w.api,
            BinaryNodeOptions {
                node_name: w.node_name.clone(),
                configure: Some(Arc::new(move |c| {
                    c.node.root_dir = root.clone();
                    c.node.pod_logs_dir = logs.clone();
                    c.node.node_status_update_frequency = KubeDuration::from_secs(2);
                    // Small logs rotate within the test.
                    c.node.container_log_max_size = "4Ki".into();
                    c.node.container_log_max_files = 3;
                    c.node.container_log_monitor_interval = KubeDuration::from_secs(3);
                })),
                ..BinaryNodeOptions::default()
            },
        )
        .expect("keelson started"),
    );
    w
}

fn k(w: &SysWorld) -> PathBuf {
    w.api.kubeconfig_path().to_path_buf()
}

/// The output of [`kubectl_exec_tty_resize`]: a tty, its first size as
/// kubectl's terminal has it, then the size after the resize.
fn assert_tty_sizes(text: &str) {
    assert!(text.contains("/dev/pts/"), "{text}");
    let sizes: Vec<&str> = text
        .lines()
        .filter_map(|l| l.trim_end_matches('\r').strip_prefix("size "))
        .collect();
    assert_eq!(sizes, ["40 100", "50 120"], "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn system_kubectl_logs_follow_rotation_and_previous() {
    if !require_root("system_kubectl_logs_follow_rotation_and_previous") {
        return;
    }
    let w = world().await;
    let kc = k(&w);
    // ~60 bytes a line, 20 lines a second: 4 KiB rotates every few seconds.
    w.create_pod(
        "talker",
        json!({"containers": [{"name": "app", "image": IMAGE, "command": ["sh", "-c",
            "i=0; while true; do echo \"line $i padding-padding-padding-padding-padding\"; i=$((i+1)); sleep 0.05; done"]}]}),
    )
    .await;
    w.wait_phase("talker", "Running", T).await;
    // Follow from the start, through at least one rotation.
    let mut follower = tokio::process::Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(&kc)
        .args(["logs", "-f", "talker"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(follower.stdout.take().unwrap()).lines();
    let pod = w.pods().get("talker").await.unwrap();
    let uid = pod.metadata.uid.clone().unwrap();
    let log_dir = w
        .state
        .path()
        .join(format!("pod-logs/pods/default_talker_{uid}/app"));
    wait_for(
        "a rotated log file",
        T,
        Duration::from_millis(200),
        || async {
            let n = std::fs::read_dir(&log_dir)
                .map_err(|e| e.to_string())?
                .flatten()
                .filter(|e| e.file_name().to_string_lossy().starts_with("0.log."))
                .count();
            if n > 0 {
                Ok(())
            } else {
                Err("none yet".into())
            }
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", w.log()));
    // The follower keeps receiving consecutive lines past the rotation.
    let mut expect = 0u64;
    let target = {
        // Lines written so far, plus a margin that needs the new file.
        let live = std::fs::read_to_string(log_dir.join("0.log")).unwrap_or_default();
        let last = live
            .lines()
            .last()
            .and_then(|l| l.split_whitespace().nth(4))
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap_or(0);
        last + 80
    };
    while expect <= target {
        let line = tokio::time::timeout(Duration::from_secs(20), lines.next_line())
            .await
            .unwrap_or_else(|_| panic!("follower stalled at line {expect}\n{}", w.log()))
            .unwrap()
            .unwrap_or_else(|| panic!("follower ended at line {expect}"));
        assert_eq!(
            line,
            format!("line {expect} padding-padding-padding-padding-padding"),
            "follower lost or repeated a line"
        );
        expect += 1;
    }
    drop(lines);
    drop(follower);
    // Non-follow reads span the rotated files: consecutive from line 0.
    let out = kubectl(&kc, &["logs", "talker"], None, T).await.unwrap();
    assert!(out.ok, "{out:?}");
    for (i, l) in out.stdout.lines().take(100).enumerate() {
        assert_eq!(
            l,
            format!("line {i} padding-padding-padding-padding-padding")
        );
    }
    let out = kubectl(&kc, &["logs", "talker", "--tail=3"], None, T)
        .await
        .unwrap();
    assert_eq!(out.stdout.lines().count(), 3, "{out:?}");
    // --since (relative: sinceSeconds): only what was written in the last
    // 2 s, from a log that started well before (line 0 is many seconds
    // and at least one rotation old). ~20 lines a second, so at most ~40.
    let asked = jiff::Timestamp::now();
    let out = kubectl(
        &kc,
        &["logs", "talker", "--since=2s", "--timestamps"],
        None,
        T,
    )
    .await
    .unwrap();
    let answered = jiff::Timestamp::now();
    assert!(out.ok, "{out:?}");
    let since: Vec<(jiff::Timestamp, u64)> = out
        .stdout
        .lines()
        .map(|l| {
            let (ts, rest) = l.split_once(' ').unwrap_or_else(|| panic!("{l:?}"));
            let n = rest
                .strip_prefix("line ")
                .and_then(|r| r.split_whitespace().next())
                .and_then(|n| n.parse().ok())
                .unwrap_or_else(|| panic!("{l:?}"));
            (ts.parse().unwrap_or_else(|e| panic!("{ts:?}: {e}")), n)
        })
        .collect();
    assert!(
        (1..=60).contains(&since.len()),
        "{} lines: {out:?}",
        since.len()
    );
    let window = jiff::SignedDuration::from_secs(2);
    for (i, (ts, n)) in since.iter().enumerate() {
        assert!(
            *ts >= asked - window && *ts <= answered,
            "line {n} at {ts}: not within 2 s before {asked}..{answered}"
        );
        // Consecutive lines: nothing skipped inside the window.
        assert_eq!(*n, since[0].1 + i as u64, "{out:?}");
    }
    assert!(since[0].1 > 0, "line 0 is older than 2 s: {out:?}");
    // --timestamps: each line is prefixed with the time the runtime
    // recorded in the CRI log (`<RFC3339Nano> stdout F line ...`), as
    // kubelet writes it: fixed width, nine fraction digits, UTC.
    let out = kubectl(
        &kc,
        &["logs", "talker", "--tail=5", "--timestamps"],
        None,
        T,
    )
    .await
    .unwrap();
    assert!(out.ok, "{out:?}");
    let cri: String = std::fs::read_dir(&log_dir)
        .unwrap()
        .flatten()
        .filter(|e| !e.file_name().to_string_lossy().ends_with(".gz"))
        .map(|e| std::fs::read_to_string(e.path()).unwrap_or_default())
        .collect();
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(lines.len(), 5, "{out:?}");
    for l in lines {
        let (ts, content) = l.split_once(' ').unwrap_or_else(|| panic!("{l:?}"));
        assert!(
            ts.len() == 30 && ts.as_bytes()[19] == b'.' && ts.ends_with('Z'),
            "{ts:?} is not RFC3339Nano with nine digits in UTC"
        );
        let ts: jiff::Timestamp = ts.parse().unwrap();
        let recorded = cri
            .lines()
            .find_map(|c| {
                let mut f = c.splitn(4, ' ');
                let (t, stream, tag, text) = (f.next()?, f.next()?, f.next()?, f.next()?);
                (stream == "stdout" && tag == "F" && text == content).then_some(t)
            })
            .unwrap_or_else(|| panic!("{content:?} not in the CRI log:\n{cri}"));
        assert_eq!(
            ts,
            recorded.parse::<jiff::Timestamp>().unwrap(),
            "{l:?} vs the CRI log's {recorded}"
        );
    }
    // Disk use stays bounded: at most containerLogMaxFiles files.
    let files = std::fs::read_dir(&log_dir).unwrap().count();
    assert!(files <= 3, "{files} log files");

    // --previous: the instance before the restart.
    w.create_pod(
        "crasher",
        json!({"volumes": [{"name": "d", "emptyDir": {}}],
               "containers": [{"name": "app", "image": IMAGE, "volumeMounts": [{"name": "d", "mountPath": "/d"}],
                 "command": ["sh", "-c", "n=$(cat /d/n 2>/dev/null || echo 0); n=$((n+1)); echo $n > /d/n; echo run $n; sleep 1; exit 3"]}]}),
    )
    .await;
    w.wait_pod("crasher", "restarted once", T, |p| {
        let c = container_status(p, "app").ok_or("no status")?;
        if c.restart_count >= 1
            && c.state.as_ref().is_some_and(|s| {
                s.running.is_some() || s.terminated.is_some() || s.waiting.is_some()
            })
        {
            Ok(())
        } else {
            Err(format!("{c:?}"))
        }
    })
    .await;
    let prev = kubectl(&kc, &["logs", "crasher", "--previous"], None, T)
        .await
        .unwrap();
    assert!(prev.ok, "{prev:?}");
    let n: u64 = prev
        .stdout
        .trim()
        .strip_prefix("run ")
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{prev:?}"));
    assert!(n >= 1);
    let cur = kubectl(&kc, &["logs", "crasher"], None, T).await.unwrap();
    assert!(cur.ok, "{cur:?}");
    assert_ne!(
        cur.stdout, prev.stdout,
        "current and previous instances differ"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn system_kubectl_exec_attach_port_forward_and_stats() {
    if !require_root("system_kubectl_exec_attach_port_forward_and_stats") {
        return;
    }
    let w = world().await;
    let kc = k(&w);
    w.create_pod(
        "web",
        json!({"containers": [{"name": "app", "image": IMAGE, "command": ["httpd", "-f", "-p", "8080", "-h", "/www"]}]}),
    )
    .await;
    w.wait_phase("web", "Running", T).await;

    // exec: output, stderr and the exit code.
    let out = kubectl(
        &kc,
        &[
            "exec",
            "web",
            "--",
            "sh",
            "-c",
            "echo out; echo err >&2; exit 7",
        ],
        None,
        T,
    )
    .await
    .unwrap();
    assert!(!out.ok);
    assert_eq!(out.stdout, "out\n", "{out:?}");
    assert!(out.stderr.contains("err"), "{out:?}");
    assert!(
        out.stderr.contains("command terminated with exit code 7"),
        "{out:?}"
    );
    // exec -i: stdin reaches the command and its end ends it.
    let out = kubectl(
        &kc,
        &["exec", "-i", "web", "--", "cat"],
        Some(b"hello stdin\n"),
        T,
    )
    .await
    .unwrap();
    assert!(out.ok, "{out:?}");
    assert_eq!(out.stdout, "hello stdin\n");
    // 4 MiB through stdin and back while it is still being written: input
    // and output move at once (no stall, nothing lost).
    let big: Vec<u8> = (0..4 << 20).map(|i| b'a' + (i % 26) as u8).collect();
    let out = kubectl(&kc, &["exec", "-i", "web", "--", "cat"], Some(&big), T)
        .await
        .unwrap();
    assert!(out.ok, "{}", out.stderr);
    assert_eq!(out.stdout.len(), big.len());
    assert!(out.stdout.as_bytes() == big.as_slice());
    // exec -it under a pseudo-terminal: the command has a tty, of the
    // size of kubectl's terminal, and a resize of that terminal reaches it.
    let text = kubectl_exec_tty_resize(&kc, None, "web", T).await.unwrap();
    assert_tty_sizes(&text);

    // port-forward with traffic.
    let mut pf = tokio::process::Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(&kc)
        .args(["port-forward", "pod/web", ":8080"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut pf_out = tokio::io::BufReader::new(pf.stdout.take().unwrap()).lines();
    let line = tokio::time::timeout(T, pf_out.next_line())
        .await
        .unwrap()
        .unwrap()
        .unwrap_or_default();
    // "Forwarding from 127.0.0.1:41234 -> 8080"
    let port: u16 = line
        .split("127.0.0.1:")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("{line}"));
    for _ in 0..3 {
        let mut c = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .unwrap();
        c.write_all(b"GET / HTTP/1.0\r\nHost: web\r\n\r\n")
            .await
            .unwrap();
        let mut body = String::new();
        tokio::time::timeout(Duration::from_secs(20), c.read_to_string(&mut body))
            .await
            .unwrap()
            .unwrap();
        assert!(
            body.starts_with("HTTP/1.0 200") || body.starts_with("HTTP/1.1 200"),
            "{body}"
        );
    }
    drop(pf);

    // attach: stdin to the container's process, its output back.
    w.create_pod(
        "reader",
        json!({"restartPolicy": "Never", "containers": [{"name": "app", "image": IMAGE, "stdin": true, "stdinOnce": true,
               "command": ["sh", "-c", "read l; echo got $l"]}]}),
    )
    .await;
    w.wait_phase("reader", "Running", T).await;
    let out = kubectl(&kc, &["attach", "-i", "reader"], Some(b"hi\n"), T)
        .await
        .unwrap();
    assert!(out.stdout.contains("got hi"), "{out:?}");

    // Every one of those went over WebSocket to keelson: three execs, an
    // attach, a port-forward.
    let counts = websocket_streaming_requests(&kc, &w.node_name, T)
        .await
        .unwrap();
    let n = |k: &str| counts.get(k).copied().unwrap_or(0.0);
    assert!(n("exec") >= 3.0, "{counts:?}");
    assert!(n("attach") >= 1.0, "{counts:?}");
    assert!(n("portforward") >= 1.0, "{counts:?}");

    // stats summary and resource metrics against the pod's cgroup.
    let pod = w.pods().get("web").await.unwrap();
    let uid = pod.metadata.uid.clone().unwrap();
    let cpuacct = format!(
        "/sys/fs/cgroup/cpuacct{}/kubepods/besteffort/pod{uid}/cpuacct.usage",
        w.ctrd.cgroup_parent()
    );
    let read_cpu = || -> u64 {
        std::fs::read_to_string(&cpuacct)
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    };
    // The summary serves the last housekeeping round: wait for a round
    // whose pod CPU sample (`time`, whole seconds) is later than the
    // second `before` was read in, so it was read after `before`.
    let before = read_cpu();
    let before_second = jiff::Timestamp::now().as_second();
    let path = format!("/api/v1/nodes/{}/proxy/stats/summary", w.node_name);
    let (s, web) = wait_for(
        "a stats round sampled after the cgroup was read",
        T,
        Duration::from_millis(500),
        || async {
            let out = kubectl(&kc, &["get", "--raw", &path], None, T)
                .await
                .map_err(|e| e.to_string())?;
            if !out.ok {
                return Err(format!("{out:?}"));
            }
            let s: Value = serde_json::from_str(&out.stdout).map_err(|e| e.to_string())?;
            let web = s["pods"]
                .as_array()
                .and_then(|p| p.iter().find(|p| p["podRef"]["name"] == "web"))
                .cloned()
                .ok_or_else(|| s.to_string())?;
            let sampled = web["cpu"]["time"]
                .as_str()
                .and_then(|t| t.parse::<jiff::Timestamp>().ok())
                .ok_or_else(|| web.to_string())?;
            if sampled.as_second() > before_second {
                Ok((s, web))
            } else {
                Err(format!("sampled at {sampled}"))
            }
        },
    )
    .await
    .unwrap();
    let after = read_cpu();
    let cpu = web["cpu"]["usageCoreNanoSeconds"].as_u64().unwrap();
    assert!(
        before <= cpu && cpu <= after,
        "{before} <= {cpu} <= {after}"
    );
    assert!(
        web["memory"]["workingSetBytes"].as_u64().unwrap() > 0,
        "{web}"
    );
    assert_eq!(web["containers"][0]["name"], "app", "{web}");
    assert!(web["ephemeral-storage"]["usedBytes"].is_u64(), "{web}");
    assert!(
        s["node"]["fs"]["capacityBytes"].as_u64().unwrap() > 0,
        "{s}"
    );
    let path = format!("/api/v1/nodes/{}/proxy/metrics/resource", w.node_name);
    let out = kubectl(&kc, &["get", "--raw", &path], None, T)
        .await
        .unwrap();
    assert!(out.ok, "{out:?}");
    let line = out
        .stdout
        .lines()
        .find(|l| l.starts_with("pod_cpu_usage_seconds_total{namespace=\"default\",pod=\"web\"}"))
        .unwrap_or_else(|| panic!("{}", out.stdout));
    let v: f64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    assert!(v * 1e9 >= before as f64 * 0.999, "{v} vs {before}");
}
