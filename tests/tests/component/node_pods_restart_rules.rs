//! Component tests of container restart policies and rules
//! (ContainerRestartRules, beta and on in v1.36): a container's
//! `restartPolicyRules` and `restartPolicy` decide before the pod's
//! `restartPolicy` whether it runs again, and the phase follows.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use crate::node_pods_support::*;
use keelson_cri::fake::ExitScript;
use serde_json::json;

fn terminated_code(p: &k8s_openapi::api::core::v1::Pod) -> Option<i32> {
    container_status(p, "app")?
        .state
        .as_ref()?
        .terminated
        .as_ref()
        .map(|t| t.exit_code)
}

#[tokio::test(start_paused = true)]
async fn a_restart_rule_restarts_a_container_the_pod_would_not() {
    let w = World::with(Options {
        paused: true,
        ..Default::default()
    })
    .await;
    w.fake
        .script_exit("app", ExitScript::code(42, Duration::from_secs(1)));
    w.create_pod(
        "rules",
        json!({
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "app", "image": IMAGE,
                "restartPolicy": "Never",
                "restartPolicyRules": [
                    {"action": "Restart", "exitCodes": {"operator": "In", "values": [42]}}
                ]
            }]
        }),
    )
    .await;
    // Exit 42 matches the rule: restarted although the pod says Never.
    w.wait_pod("rules", "a restart", Duration::from_secs(60), |p| {
        let s = container_status(p, "app").ok_or("no status")?;
        if s.restart_count >= 1 {
            Ok(())
        } else {
            Err(format!("{s:?}"))
        }
    })
    .await;
    assert_eq!(
        w.get("rules")
            .await
            .unwrap()
            .status
            .unwrap()
            .phase
            .as_deref(),
        Some("Running")
    );
    // Exit 3 matches no rule: the container's Never holds and the pod fails.
    w.fake
        .script_exit("app", ExitScript::code(3, Duration::from_secs(1)));
    let p = w
        .wait_phase("rules", "Failed", Duration::from_secs(120))
        .await;
    assert_eq!(terminated_code(&p), Some(3));
    let restarts = container_status(&p, "app").unwrap().restart_count;
    tokio::time::sleep(Duration::from_secs(60)).await;
    let p = w.get("rules").await.unwrap();
    assert_eq!(container_status(&p, "app").unwrap().restart_count, restarts);
}

#[tokio::test(start_paused = true)]
async fn a_container_that_runs_once_ends_a_pod_that_would_restart_it() {
    let w = World::with(Options {
        paused: true,
        ..Default::default()
    })
    .await;
    w.fake
        .script_exit("app", ExitScript::code(0, Duration::from_secs(1)));
    w.create_pod(
        "once",
        json!({
            "restartPolicy": "Always",
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "app", "image": IMAGE, "restartPolicy": "OnFailure"}]
        }),
    )
    .await;
    let p = w
        .wait_phase("once", "Succeeded", Duration::from_secs(60))
        .await;
    assert_eq!(terminated_code(&p), Some(0));
    assert_eq!(container_status(&p, "app").unwrap().restart_count, 0);
}

#[tokio::test(start_paused = true)]
async fn a_container_that_always_restarts_keeps_a_never_pod_running() {
    let w = World::with(Options {
        paused: true,
        ..Default::default()
    })
    .await;
    w.fake
        .script_exit("app", ExitScript::code(0, Duration::from_secs(1)));
    w.create_pod(
        "always",
        json!({
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "app", "image": IMAGE, "restartPolicy": "Always"}]
        }),
    )
    .await;
    let p = w
        .wait_pod("always", "two restarts", Duration::from_secs(120), |p| {
            let s = container_status(p, "app").ok_or("no status")?;
            if s.restart_count >= 2 {
                Ok(p.clone())
            } else {
                Err(format!("{s:?}"))
            }
        })
        .await;
    assert_eq!(p.status.unwrap().phase.as_deref(), Some("Running"));
}
