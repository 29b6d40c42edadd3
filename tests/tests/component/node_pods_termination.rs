//! Component tests of pod termination: a deleted pod runs its preStop
//! hook, stops its containers (sidecars after the app), stops its sandbox,
//! removes its cgroup and then its API object (grace 0, UID
//! precondition); a deletion interrupts a sync stuck in an image pull.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use crate::node_pods_support::*;
use keelson_cri::fake::{ExecScript, ExitScript};
use serde_json::json;

const T: Duration = Duration::from_secs(20);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_runs_pre_stop_stops_within_grace_and_removes_the_object() {
    let w = World::new().await;
    w.fake.script_exec(
        ExecScript::new(&["sh", "-c", "sleep 1; echo bye"], "bye\n", 0)
            .taking(Duration::from_secs(1)),
    );
    let pod = w
        .create_pod(
            "stopme",
            json!({"terminationGracePeriodSeconds": 10,
                   "containers": [{"name": "app", "image": IMAGE,
                       "lifecycle": {"preStop": {"exec": {"command": ["sh", "-c", "sleep 1; echo bye"]}}}}]}),
        )
        .await;
    w.wait_phase("stopme", "Running", T).await;
    let uid = pod.metadata.uid.clone().unwrap();
    let cg = w
        .cgroup_root
        .join("kubepods/besteffort")
        .join(format!("pod{uid}"));
    assert!(cg.is_dir());
    w.fake.clear_calls();
    let t0 = Instant::now();
    w.delete("stopme", None).await;
    w.wait_gone("stopme", T).await;
    let took = t0.elapsed();
    assert!(
        took >= Duration::from_secs(1),
        "the preStop hook takes 1 s; took {took:?}"
    );
    assert!(
        took < Duration::from_secs(10),
        "stopped within the grace period; took {took:?}"
    );
    let calls: Vec<&'static str> = w
        .fake
        .calls()
        .into_iter()
        .map(|c| c.method)
        .filter(|m| matches!(*m, "ExecSync" | "StopContainer" | "StopPodSandbox"))
        .collect();
    let first = |m: &str| {
        calls
            .iter()
            .position(|c| *c == m)
            .unwrap_or_else(|| panic!("no {m} in {calls:?}"))
    };
    assert!(first("ExecSync") < first("StopContainer"), "{calls:?}");
    assert!(
        first("StopContainer") < first("StopPodSandbox"),
        "{calls:?}"
    );
    // The container ended with SIGTERM within its grace period.
    let c = w
        .fake
        .containers()
        .into_iter()
        .find(|c| c.labels["io.kubernetes.pod.uid"] == uid)
        .unwrap();
    assert_eq!(c.exit_code, 143);
    assert!(!cg.exists(), "pod cgroup removed");
    w.wait_event("stopme", "Killing", "Stopping container app", T)
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sidecars_stop_after_the_app() {
    let w = World::new().await;
    w.create_pod(
        "withsidecar",
        json!({"terminationGracePeriodSeconds": 10,
               "initContainers": [{"name": "proxy", "image": IMAGE, "restartPolicy": "Always"}],
               "containers": [{"name": "app", "image": IMAGE}]}),
    )
    .await;
    w.wait_phase("withsidecar", "Running", T).await;
    let ids: std::collections::HashMap<String, String> = w
        .fake
        .containers()
        .into_iter()
        .map(|c| (c.id.clone(), c.metadata.unwrap().name))
        .collect();
    w.fake.clear_calls();
    w.delete("withsidecar", None).await;
    w.wait_gone("withsidecar", T).await;
    let stops: Vec<String> = w
        .fake
        .calls_to("StopContainer")
        .into_iter()
        .map(|c| ids.get(&c.subject).cloned().unwrap_or(c.subject))
        .collect();
    assert_eq!(stops, vec!["app", "proxy"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deletion_interrupts_a_pod_stuck_pulling() {
    let w = World::new().await;
    let image = "registry.example/slow:1";
    w.fake.add_registry_image(image, None);
    w.fake.set_latency("PullImage", Duration::from_secs(60));
    w.create_pod(
        "slow",
        json!({"terminationGracePeriodSeconds": 5, "containers": [{"name": "app", "image": image}]}),
    )
    .await;
    w.wait_event("slow", "Pulling", "Pulling image", T).await;
    let t0 = Instant::now();
    w.delete("slow", None).await;
    w.wait_gone("slow", T).await;
    assert!(t0.elapsed() < Duration::from_secs(15), "{:?}", t0.elapsed());
    // Nothing runs for it.
    assert!(w.fake.containers().is_empty());
    assert!(w.fake.sandboxes().iter().all(|s| s.state != 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_deleted_pod_is_stopped() {
    let w = World::new().await;
    w.fake
        .script_exit("never", ExitScript::code(0, Duration::from_secs(3600)));
    w.create_pod("forced", busybox(json!({}))).await;
    w.wait_phase("forced", "Running", T).await;
    w.delete("forced", Some(0)).await;
    keelson_tests::support::wait_for(
        "containers stopped",
        T,
        Duration::from_millis(50),
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
                Err(format!(
                    "{running} running containers, {ready} ready sandboxes"
                ))
            }
        },
    )
    .await
    .unwrap();
}
