//! Component tests of adoption: after keelson restarts, running sandboxes
//! and containers are matched to their pods by CRI labels and kept — no
//! new sandbox, no new container, restart counts unchanged — and a pod
//! deleted while keelson was down is stopped; containers started by a
//! kubelet (same labels and hash) are adopted too.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use crate::node_pods_support::*;
use keelson_cri::fake::ExitScript;
use keelson_tests::support::wait_for;
use kube::api::DeleteParams;
use serde_json::json;

const T: Duration = Duration::from_secs(20);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_adopts_running_pods_without_restarting_them() {
    let mut w = World::new().await;
    w.fake
        .script_exit("init", ExitScript::code(0, Duration::from_millis(100)));
    w.fake
        .script_exit("crashy", ExitScript::code(2, Duration::from_millis(300)));
    w.create_pod(
        "keep",
        json!({"terminationGracePeriodSeconds": 5,
               "initContainers": [{"name": "init", "image": IMAGE}],
               "containers": [{"name": "app", "image": IMAGE}]}),
    )
    .await;
    w.create_pod(
        "crash",
        json!({"restartPolicy": "Never", "terminationGracePeriodSeconds": 5,
               "containers": [{"name": "crashy", "image": IMAGE}]}),
    )
    .await;
    let before = w.wait_phase("keep", "Running", T).await;
    w.wait_phase("crash", "Failed", T).await;
    let app_id = container_status(&before, "app")
        .unwrap()
        .container_id
        .clone();
    let creates = w.fake.calls_to("CreateContainer").len();
    let sandboxes = w.fake.calls_to("RunPodSandbox").len();

    w.restart(false).await;
    // Give the new lifecycle time to list, sync and write status.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after = w.wait_phase("keep", "Running", T).await;
    assert_eq!(
        w.fake.calls_to("CreateContainer").len(),
        creates,
        "no container created again"
    );
    assert_eq!(
        w.fake.calls_to("RunPodSandbox").len(),
        sandboxes,
        "no sandbox created again"
    );
    assert!(w.fake.calls_to("StopContainer").is_empty());
    let app = container_status(&after, "app").unwrap();
    assert_eq!(app.container_id, app_id);
    assert_eq!(app.restart_count, 0);
    assert!(app.ready);
    // The finished pod stays finished.
    assert_eq!(
        w.get("crash")
            .await
            .unwrap()
            .status
            .unwrap()
            .phase
            .as_deref(),
        Some("Failed")
    );

    // The adopted container still restarts per policy, counting on.
    let id = app_id
        .unwrap()
        .trim_start_matches("containerd://")
        .to_string();
    w.fake.exit_container(&id, 1, None).unwrap();
    let p = w
        .wait_pod("keep", "restartCount 1", T, |p| {
            let c = container_status(p, "app").ok_or("no status")?;
            if c.restart_count == 1 && c.state.as_ref().is_some_and(|s| s.running.is_some()) {
                Ok(p.clone())
            } else {
                Err(format!("{c:?}"))
            }
        })
        .await;
    let last = container_status(&p, "app")
        .unwrap()
        .last_state
        .clone()
        .unwrap()
        .terminated
        .unwrap();
    assert_eq!(last.exit_code, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_deleted_while_down_is_stopped_after_restart() {
    let mut w = World::new().await;
    w.create_pod("gone", busybox(json!({}))).await;
    w.wait_phase("gone", "Running", T).await;
    w.stop.cancel();
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Force-delete while keelson is down.
    let dp = DeleteParams {
        grace_period_seconds: Some(0),
        ..Default::default()
    };
    let _ = w.pods().delete("gone", &dp).await.unwrap();
    assert!(w.get("gone").await.is_none());
    w.restart(false).await;
    wait_for(
        "orphaned pod stopped",
        T,
        Duration::from_millis(100),
        || async {
            let running = w
                .fake
                .containers()
                .into_iter()
                .filter(|c| c.state == 1)
                .count();
            let ready = w
                .fake
                .sandboxes()
                .into_iter()
                .filter(|s| s.state == 0)
                .count();
            if running == 0 && ready == 0 {
                Ok(())
            } else {
                Err(format!("{running} running, {ready} ready sandboxes"))
            }
        },
    )
    .await
    .unwrap();
}
