//! System tests of the pod lifecycle with real parts: the real `keelson`
//! binary, a private real containerd (runc, CNI bridge), busybox images
//! built locally, the service account token volume mounted by keelson.
//!
//! - An init container then a busybox `httpd` reach Running with a pod IP
//!   that answers HTTP from the node's network namespace; killing keelson
//!   and starting it again keeps the containers (same IDs, restartCount 0).
//! - A crashing container goes into CrashLoopBackOff with growing delays.
//! - Deleting a pod runs its preStop hook, stops it within the grace
//!   period and removes the object.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use crate::system_pods_support::*;
use keelson_tests::support::{require_root, wait_for};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const T: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn httpd_behind_an_init_container_runs_serves_and_survives_a_keelson_restart() {
    if !require_root("httpd_behind_an_init_container_runs_serves_and_survives_a_keelson_restart") {
        return;
    }
    let mut w = SysWorld::start().await;
    w.create_pod(
        "web",
        json!({
            "terminationGracePeriodSeconds": 5,
            "initContainers": [{"name": "init", "image": IMAGE, "command": ["sh", "-c", "echo initialized"]}],
            "containers": [{"name": "httpd", "image": IMAGE,
                            "command": ["httpd", "-f", "-p", "80", "-h", "/www"],
                            "ports": [{"containerPort": 80}],
                            "readinessProbe": {"tcpSocket": {"port": 80}, "periodSeconds": 1}}]
        }),
    )
    .await;
    let pod = w
        .wait_pod("web", "web Running and Ready", T, |p| {
            let ready = condition(p, "Ready").map(|c| c.status.as_str()) == Some("True");
            if p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running") && ready {
                Ok(p.clone())
            } else {
                Err(serde_json::to_string(&p.status).unwrap())
            }
        })
        .await;
    let ip: IpAddr = pod.status.clone().unwrap().pod_ip.unwrap().parse().unwrap();
    let body = wait_for(
        "httpd answers",
        Duration::from_secs(20),
        Duration::from_millis(200),
        || async { w.http_get(SocketAddr::new(ip, 80)).await },
    )
    .await
    .unwrap();
    assert!(body.starts_with("HTTP/1.1 200 OK"), "{body}");
    assert!(body.contains("keelson busybox"), "{body}");
    // The pod's cgroup (cgroup v1 here) under the BestEffort tier, with the
    // container's cgroup below it.
    let root = w.node.as_ref().unwrap().config.node.cgroup_root.clone();
    let uid = pod.metadata.uid.clone().unwrap();
    let pod_cg = std::path::Path::new("/sys/fs/cgroup/cpu")
        .join(root.trim_start_matches('/'))
        .join(format!("kubepods/besteffort/pod{uid}"));
    assert_eq!(
        std::fs::read_to_string(pod_cg.join("cpu.shares"))
            .unwrap()
            .trim(),
        "2"
    );
    let init = container_status(&pod, "init").unwrap();
    assert_eq!(
        init.state
            .as_ref()
            .unwrap()
            .terminated
            .as_ref()
            .unwrap()
            .exit_code,
        0
    );
    let httpd = container_status(&pod, "httpd").unwrap();
    let id = httpd.container_id.clone().unwrap();
    assert!(id.starts_with("containerd://"));
    assert!(
        pod_cg.join(id.trim_start_matches("containerd://")).is_dir(),
        "the container runs in the pod's cgroup"
    );
    // The projected service account token is mounted by keelson.
    assert_eq!(
        w.exec(
            &id,
            &[
                "test",
                "-s",
                "/var/run/secrets/kubernetes.io/serviceaccount/token"
            ]
        )
        .await,
        0
    );
    let before = w.ctrd.client().list_containers(None).await.unwrap().len();

    // keelson dies; the pod keeps serving; a new keelson adopts it.
    let _ = w.kill_keelson();
    assert!(
        w.http_get(SocketAddr::new(ip, 80))
            .await
            .unwrap()
            .contains("keelson busybox")
    );
    w.start_keelson();
    // Let the new keelson list, sync and write status a few times.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let after = w.wait_phase("web", "Running", T).await;
    let httpd = container_status(&after, "httpd").unwrap();
    assert_eq!(
        httpd.container_id.as_deref(),
        Some(id.as_str()),
        "same container"
    );
    assert_eq!(httpd.restart_count, 0);
    assert!(httpd.ready, "readiness kept across the restart");
    assert_eq!(
        w.ctrd.client().list_containers(None).await.unwrap().len(),
        before,
        "no container created"
    );
    assert!(
        w.http_get(SocketAddr::new(ip, 80))
            .await
            .unwrap()
            .contains("keelson busybox")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crashing_container_backs_off_with_growing_delays() {
    if !require_root("crashing_container_backs_off_with_growing_delays") {
        return;
    }
    let w = SysWorld::start().await;
    w.create_pod(
        "crash",
        json!({"terminationGracePeriodSeconds": 2, "automountServiceAccountToken": false,
               "containers": [{"name": "app", "image": IMAGE, "command": ["sh", "-c", "exit 3"]}]}),
    )
    .await;
    // kubelet shows the crashed container `terminated` through each
    // back-off and `waiting`/CrashLoopBackOff only at its end, for as long
    // as the restart takes (node_pods_backoff and the upstream tier's
    // crash-loop comparison pin that sequence down); a poll can miss so
    // short a state. The back-off is read from the statuses instead: the
    // gap between one instance's end and the next one's start (RFC 3339
    // seconds, hence the one-second slack).
    let gap = |restarts: i32, limit: Duration| {
        let w = &w;
        async move {
            w.wait_pod("crash", &format!("restart {restarts}"), limit, |p| {
                let c = container_status(p, "app").ok_or("no status")?;
                if c.restart_count != restarts {
                    return Err(format!("{c:?}"));
                }
                let ended = c
                    .last_state
                    .as_ref()
                    .and_then(|l| l.terminated.as_ref())
                    .and_then(|t| t.finished_at.clone())
                    .ok_or_else(|| format!("no last state: {c:?}"))?;
                let st = c.state.clone().unwrap_or_default();
                let started = st
                    .running
                    .and_then(|r| r.started_at)
                    .or_else(|| st.terminated.and_then(|t| t.started_at))
                    .ok_or_else(|| format!("not started yet: {c:?}"))?;
                let last = c.last_state.clone().and_then(|l| l.terminated);
                Ok((started.0.duration_since(ended.0).as_secs_f64(), last))
            })
            .await
        }
    };
    let (first, _) = gap(1, T).await;
    assert!(first < 5.0, "the first restart is immediate: {first} s");
    let (second, _) = gap(2, T).await;
    assert!(second >= 9.0, "the 10 s back-off was honoured: {second} s");
    let (third, last) = gap(3, T).await;
    assert!(third >= 19.0, "the back-off doubled to 20 s: {third} s");
    let last = last.unwrap();
    assert_eq!((last.exit_code, last.reason.as_deref()), (3, Some("Error")));
    let evs = w.events("crash").await;
    assert!(
        evs.iter().any(|(r, m)| r == "BackOff"
            && m.starts_with("Back-off restarting failed container app in pod crash_default")),
        "{evs:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_runs_pre_stop_stops_within_grace_and_removes_the_pod() {
    if !require_root("delete_runs_pre_stop_stops_within_grace_and_removes_the_pod") {
        return;
    }
    let w = SysWorld::start().await;
    // The preStop hook calls back to a server of ours on the node's address.
    let listener = w
        .ctrd
        .netns()
        .tcp_listener(SocketAddr::from(([0, 0, 0, 0], 0)))
        .unwrap();
    let port = listener.local_addr().unwrap().port();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(Instant, String)>();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let mut buf = vec![0u8; 2048];
            let n = s.read(&mut buf).await.unwrap_or(0);
            let _ = tx.send((
                Instant::now(),
                String::from_utf8_lossy(&buf[..n]).into_owned(),
            ));
            let _ = s
                .write_all(b"HTTP/1.0 200 OK\r\ncontent-length: 0\r\n\r\n")
                .await;
        }
    });
    let node_ip = keelson_tests::node_harness::SYSTEM_NODE_IP.to_string();
    w.create_pod(
        "graceful",
        json!({"terminationGracePeriodSeconds": 15, "automountServiceAccountToken": false,
               "containers": [{"name": "app", "image": IMAGE,
                   "command": ["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 0.2; done"],
                   "lifecycle": {"preStop": {"httpGet": {"host": node_ip, "port": port, "path": "/prestop"}}}}]}),
    )
    .await;
    let pod = w.wait_phase("graceful", "Running", T).await;
    let cgroup = pod.metadata.uid.clone().unwrap();
    let t0 = Instant::now();
    w.delete("graceful").await;
    let (at, req) = tokio::time::timeout(Duration::from_secs(20), rx.recv())
        .await
        .expect("preStop request within the grace period")
        .expect("preStop request");
    assert!(req.starts_with("GET /prestop HTTP/1.1"), "{req}");
    assert!(
        req.to_lowercase().contains("user-agent: kube-lifecycle/"),
        "{req}"
    );
    w.wait_gone("graceful", Duration::from_secs(30)).await;
    let took = t0.elapsed();
    assert!(at - t0 < took);
    assert!(
        took < Duration::from_secs(15),
        "stopped within the 15 s grace period: {took:?}"
    );
    // The container ended on SIGTERM (exit 0 from its trap), not SIGKILL.
    let cs = w.ctrd.client().list_containers(None).await.unwrap();
    for c in cs
        .iter()
        .filter(|c| c.labels.get("io.kubernetes.pod.uid") == Some(&cgroup))
    {
        let s = w
            .ctrd
            .client()
            .container_status(&c.id, false)
            .await
            .unwrap()
            .status
            .unwrap();
        assert_eq!(s.exit_code, 0, "{s:?}");
    }
}
