//! System test of the probes wired into the pod workers on real containerd:
//! a readiness file removed through ExecSync makes the pod NotReady and
//! back; a liveness failure restarts the container (restartCount 1, last
//! state terminated) after the probe's own terminationGracePeriodSeconds,
//! not the pod's; a startup probe holds liveness off until it passes.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use crate::system_pods_support::*;
use keelson_tests::support::require_root;
use serde_json::json;

const T: Duration = Duration::from_secs(60);

fn ready(p: &k8s_openapi::api::core::v1::Pod) -> (bool, String) {
    (
        container_status(p, "app").is_some_and(|c| c.ready),
        condition(p, "Ready")
            .map(|c| c.status.clone())
            .unwrap_or_default(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_liveness_and_startup_on_real_containers() {
    if !require_root("readiness_liveness_and_startup_on_real_containers") {
        return;
    }
    let w = SysWorld::start().await;
    let probe = |path: &str, extra: serde_json::Value| {
        let mut p =
            json!({"exec": {"command": ["cat", path]}, "periodSeconds": 1, "failureThreshold": 1});
        for (k, v) in extra.as_object().unwrap() {
            p[k] = v.clone();
        }
        p
    };
    // Readiness.
    w.create_pod(
        "ready",
        json!({"terminationGracePeriodSeconds": 2, "automountServiceAccountToken": false,
               "containers": [{"name": "app", "image": IMAGE,
                   "command": ["sh", "-c", "touch /tmp/ready; sleep 3600"],
                   "readinessProbe": probe("/tmp/ready", json!({}))}]}),
    )
    .await;
    // Liveness.
    w.create_pod(
        "live",
        json!({"terminationGracePeriodSeconds": 30, "automountServiceAccountToken": false,
               "containers": [{"name": "app", "image": IMAGE,
                   "command": ["sh", "-c", "touch /tmp/alive; sleep 3600"],
                   "livenessProbe": probe("/tmp/alive", json!({"terminationGracePeriodSeconds": 2}))}]}),
    )
    .await;
    // Startup holds liveness off (liveness would fail: no /tmp/alive).
    w.create_pod(
        "startup",
        json!({"terminationGracePeriodSeconds": 2, "automountServiceAccountToken": false,
               "containers": [{"name": "app", "image": IMAGE, "command": ["sleep", "3600"],
                   "startupProbe": probe("/tmp/started", json!({"failureThreshold": 60})),
                   "livenessProbe": probe("/tmp/alive", json!({}))}]}),
    )
    .await;

    let p = w
        .wait_pod("ready", "ready", T, |p| match ready(p) {
            (true, c) if c == "True" => Ok(p.clone()),
            s => Err(format!("{s:?}")),
        })
        .await;
    let id = container_status(&p, "app")
        .unwrap()
        .container_id
        .clone()
        .unwrap();
    assert_eq!(w.exec(&id, &["rm", "/tmp/ready"]).await, 0);
    w.wait_pod("ready", "not ready", T, |p| match ready(p) {
        (false, c) if c == "False" => Ok(()),
        s => Err(format!("{s:?}")),
    })
    .await;
    assert_eq!(w.exec(&id, &["touch", "/tmp/ready"]).await, 0);
    w.wait_pod("ready", "ready again", T, |p| match ready(p) {
        (true, c) if c == "True" => Ok(()),
        s => Err(format!("{s:?}")),
    })
    .await;

    let p = w.wait_phase("live", "Running", T).await;
    let id = container_status(&p, "app")
        .unwrap()
        .container_id
        .clone()
        .unwrap();
    let broken = std::time::Instant::now();
    assert_eq!(w.exec(&id, &["rm", "/tmp/alive"]).await, 0);
    let p = w
        .wait_pod("live", "restarted after liveness failure", T, |p| {
            let c = container_status(p, "app").ok_or("no status")?;
            if c.restart_count == 1 && c.state.as_ref().is_some_and(|s| s.running.is_some()) {
                Ok(p.clone())
            } else {
                Err(format!("{c:?}"))
            }
        })
        .await;
    let c = container_status(&p, "app").unwrap();
    let last = c.last_state.clone().unwrap().terminated.unwrap();
    // sh as PID 1 ignores SIGTERM: killed after the probe's 2 s grace.
    assert_eq!(
        (last.exit_code, last.reason.as_deref()),
        (137, Some("Error"))
    );
    // The SIGKILL came after the probe's terminationGracePeriodSeconds (2 s),
    // not the pod's (30 s): with the pod's the restart could not be seen
    // before 30 s after the failure (probe period 1 s, one failure kills).
    let restarted_after = broken.elapsed();
    assert!(
        restarted_after < Duration::from_secs(20),
        "restart seen {restarted_after:?} after the liveness file was removed; the probe's 2 s grace was not used"
    );
    assert_eq!(last.container_id.as_deref(), Some(id.as_str()));
    let evs = w.events("live").await;
    assert!(
        evs.iter()
            .any(|(r, m)| r == "Unhealthy" && m.starts_with("Liveness probe failed:")),
        "{evs:?}"
    );
    assert!(
        evs.iter().any(|(r, m)| r == "Killing"
            && m == "Container app failed liveness probe, will be restarted"),
        "{evs:?}"
    );

    let p = w.wait_phase("startup", "Running", T).await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    let p2 = w.pods().get("startup").await.unwrap();
    let c = container_status(&p2, "app").unwrap();
    assert_eq!(
        (c.started, c.restart_count),
        (Some(false), 0),
        "liveness held off while starting"
    );
    let id = container_status(&p, "app")
        .unwrap()
        .container_id
        .clone()
        .unwrap();
    assert_eq!(w.exec(&id, &["touch", "/tmp/started"]).await, 0);
    w.wait_pod("startup", "liveness after startup", T, |p| {
        let c = container_status(p, "app").ok_or("no status")?;
        if c.restart_count >= 1 {
            Ok(())
        } else {
            Err(format!("{c:?}"))
        }
    })
    .await;
}
