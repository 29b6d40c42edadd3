//! Component tests of the probes wired into the pod workers (fake runtime
//! ExecSync answers the exec probes): readiness drives `ready` and the
//! Ready/ContainersReady conditions both ways; a liveness failure kills and
//! restarts the container with the right last state and kubelet's events;
//! a startup probe holds liveness off until it succeeds; a restarted
//! keelson keeps an adopted container's readiness.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use crate::node_pods_support::*;
use keelson_cri::fake::ExecScript;
use serde_json::json;

const T: Duration = Duration::from_secs(30);

fn probing(options: Options) -> Options {
    Options {
        probes: true,
        ..options
    }
}

fn exec_probe(cmd: &[&str], extra: serde_json::Value) -> serde_json::Value {
    let mut p = json!({"exec": {"command": cmd}, "periodSeconds": 1, "failureThreshold": 1});
    for (k, v) in extra.as_object().unwrap() {
        p[k] = v.clone();
    }
    p
}

fn ready_status(p: &k8s_openapi::api::core::v1::Pod) -> (bool, String) {
    let ready = container_status(p, "app").map(|c| c.ready).unwrap_or(false);
    let cond = condition(p, "Ready")
        .map(|c| c.status.clone())
        .unwrap_or_default();
    (ready, cond)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_follows_the_probe_both_ways() {
    let w = World::with(probing(Options::default())).await;
    let cmd = ["cat", "/tmp/ready"];
    w.fake.script_exec(ExecScript::new(&cmd, "ok", 0));
    w.create_pod(
        "ready",
        busybox(json!({"readinessProbe": exec_probe(&cmd, json!({}))})),
    )
    .await;
    w.wait_pod("ready", "ready", T, |p| match ready_status(p) {
        (true, c) if c == "True" => Ok(()),
        s => Err(format!("{s:?}")),
    })
    .await;
    // The file goes away: the container becomes unready, the pod NotReady.
    w.fake.script_exec(
        ExecScript::new(&cmd, "", 1)
            .with_stderr("cat: can't open '/tmp/ready': No such file or directory"),
    );
    let p = w
        .wait_pod("ready", "not ready", T, |p| match ready_status(p) {
            (false, c) if c == "False" => Ok(p.clone()),
            s => Err(format!("{s:?}")),
        })
        .await;
    let ready = condition(&p, "Ready").unwrap();
    assert_eq!(ready.reason.as_deref(), Some("ContainersNotReady"));
    assert_eq!(
        ready.message.as_deref(),
        Some("containers with unready status: [app]")
    );
    assert_eq!(p.status.clone().unwrap().phase.as_deref(), Some("Running"));
    w.wait_event(
        "ready",
        "Unhealthy",
        "Readiness probe failed: cat: can't open '/tmp/ready'",
        T,
    )
    .await;
    // And back.
    w.fake.script_exec(ExecScript::new(&cmd, "ok", 0));
    w.wait_pod("ready", "ready again", T, |p| match ready_status(p) {
        (true, c) if c == "True" => Ok(()),
        s => Err(format!("{s:?}")),
    })
    .await;
    // Readiness never restarts a container.
    assert_eq!(w.fake.calls_to("CreateContainer").len(), 1);
    assert!(w.metrics().contains("prober_probe_total"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn liveness_failure_restarts_the_container_with_its_last_state() {
    let w = World::with(probing(Options::default())).await;
    let cmd = ["cat", "/tmp/healthy"];
    w.fake.script_exec(ExecScript::new(&cmd, "", 0));
    w.create_pod(
        "live",
        busybox(
            json!({"livenessProbe": exec_probe(&cmd, json!({"terminationGracePeriodSeconds": 3}))}),
        ),
    )
    .await;
    w.wait_phase("live", "Running", T).await;
    w.fake
        .script_exec(ExecScript::new(&cmd, "", 1).with_stderr("no such file"));
    let p = w
        .wait_pod("live", "restarted after liveness failure", T, |p| {
            let c = container_status(p, "app").ok_or("no status")?;
            if c.restart_count >= 1
                && c.last_state
                    .as_ref()
                    .is_some_and(|l| l.terminated.is_some())
            {
                Ok(p.clone())
            } else {
                Err(format!("{c:?}"))
            }
        })
        .await;
    // Killed with SIGTERM (grace given), so exit 143, reason Error.
    let last = container_status(&p, "app")
        .unwrap()
        .last_state
        .clone()
        .unwrap()
        .terminated
        .unwrap();
    assert_eq!(
        (last.exit_code, last.reason.as_deref()),
        (143, Some("Error"))
    );
    w.wait_event(
        "live",
        "Unhealthy",
        "Liveness probe failed: no such file",
        T,
    )
    .await;
    w.wait_event(
        "live",
        "Killing",
        "Container app failed liveness probe, will be restarted",
        T,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn startup_probe_holds_liveness_off() {
    let w = World::with(probing(Options::default())).await;
    let startup = ["cat", "/tmp/started"];
    let live = ["cat", "/tmp/alive"];
    w.fake.script_exec(ExecScript::new(&startup, "", 1));
    w.fake.script_exec(ExecScript::new(&live, "", 1));
    w.create_pod(
        "slowstart",
        busybox(json!({
            "startupProbe": exec_probe(&startup, json!({"failureThreshold": 30})),
            "livenessProbe": exec_probe(&live, json!({}))
        })),
    )
    .await;
    let p = w.wait_phase("slowstart", "Running", T).await;
    assert_eq!(container_status(&p, "app").unwrap().started, Some(false));
    // Liveness fails all along, yet nothing is killed while starting up.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        w.fake.calls_to("StopContainer").is_empty(),
        "liveness ran during startup"
    );
    let p = w.get("slowstart").await.unwrap();
    let c = container_status(&p, "app").unwrap();
    assert_eq!(
        (c.started, c.ready, c.restart_count),
        (Some(false), false, 0)
    );
    // Started: liveness takes over and, failing, restarts the container.
    w.fake.script_exec(ExecScript::new(&startup, "", 0));
    w.wait_pod("slowstart", "liveness restart", T, |p| {
        let c = container_status(p, "app").ok_or("no status")?;
        if c.restart_count >= 1 {
            Ok(())
        } else {
            Err(format!("{c:?}"))
        }
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn adopted_container_keeps_its_readiness_across_a_restart() {
    let mut w = World::with(probing(Options {
        paused: true,
        ..Options::default()
    }))
    .await;
    let cmd = ["cat", "/tmp/ready"];
    w.fake.script_exec(ExecScript::new(&cmd, "ok", 0));
    w.create_pod(
        "adopted",
        busybox(json!({"readinessProbe": exec_probe(&cmd, json!({"periodSeconds": 5}))})),
    )
    .await;
    w.wait_pod("adopted", "ready", T, |p| match ready_status(p) {
        (true, _) => Ok(()),
        s => Err(format!("{s:?}")),
    })
    .await;
    // kubelet adopts the results of containers that started more than
    // 10 s before it did (kubeletRestartGracePeriod); time is paused, so
    // this moves the clock.
    tokio::time::sleep(Duration::from_secs(11)).await;
    w.restart(true).await;
    // The new probe workers start from what the API showed (the pod was
    // Ready): never unready.
    for _ in 0..20 {
        let p = w.get("adopted").await.unwrap();
        assert!(
            ready_status(&p).0,
            "readiness reset after restart: {:?}",
            p.status
        );
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
}
