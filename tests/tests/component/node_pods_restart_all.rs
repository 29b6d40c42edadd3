//! Component tests of RestartAllContainersOnContainerExits (beta and on in
//! kubelet v1.36): a container whose exit matches a `RestartAllContainers`
//! restart rule restarts the whole pod in place — `AllContainersRestarting`
//! True, every container killed and removed from the runtime, the sandbox
//! kept, the init containers run again, the condition False — while an
//! exit the rule does not match follows the container's own policy.
//! The expected statuses follow kubelet's `convertToAPIContainerStatuses`,
//! `getPhase` and `GenerateAllContainersRestartingCondition` (v1.36).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::node_pods_support::*;
use k8s_openapi::api::core::v1::Pod;
use keelson_cri::fake::ExitScript;
use serde_json::json;
use tonic::Code;

const NAMES: [&str; 4] = ["init", "side", "src", "app"];

/// init, a sidecar, `src` (restarts the whole pod when it exits 42) and
/// `app`; the pod itself never restarts containers.
fn spec() -> serde_json::Value {
    json!({
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 30,
        "initContainers": [
            {"name": "init", "image": IMAGE},
            {"name": "side", "image": IMAGE, "restartPolicy": "Always"}
        ],
        "containers": [
            {"name": "src", "image": IMAGE, "restartPolicy": "Never",
             "restartPolicyRules": [
                {"action": "RestartAllContainers", "exitCodes": {"operator": "In", "values": [42]}}
             ]},
            {"name": "app", "image": IMAGE}
        ]
    })
}

fn container_id(p: &Pod, name: &str) -> String {
    let id = container_status(p, name)
        .and_then(|s| s.container_id.clone())
        .unwrap_or_default();
    id.split_once("://")
        .map(|(_, id)| id.to_string())
        .unwrap_or(id)
}

fn phase(p: &Pod) -> String {
    p.status
        .as_ref()
        .and_then(|s| s.phase.clone())
        .unwrap_or_default()
}

/// Every container running, the init container done.
fn all_up(p: &Pod) -> Result<(), String> {
    let st = |n: &str| container_status(p, n).and_then(|s| s.state.clone());
    let init_done = st("init")
        .and_then(|s| s.terminated)
        .is_some_and(|t| t.exit_code == 0);
    let running = ["side", "src", "app"]
        .iter()
        .all(|n| st(n).is_some_and(|s| s.running.is_some()));
    if init_done && running && phase(p) == "Running" {
        Ok(())
    } else {
        Err(serde_json::to_string(&p.status).unwrap())
    }
}

/// A world whose `init` container exits 0 a second after each start.
async fn world() -> World {
    let w = World::with(Options {
        paused: true,
        ..Default::default()
    })
    .await;
    w.fake
        .script_exit("init", ExitScript::code(0, Duration::from_secs(1)));
    w
}

#[tokio::test(start_paused = true)]
async fn a_matching_exit_restarts_every_container_in_place() {
    let w = world().await;
    w.create_pod("all", spec()).await;
    let before = w
        .wait_pod("all", "every container up", Duration::from_secs(60), |p| {
            all_up(p).map(|()| p.clone())
        })
        .await;
    let old_ids: BTreeSet<String> = NAMES.iter().map(|n| container_id(&before, n)).collect();
    assert_eq!(old_ids.len(), 4, "{old_ids:?}");
    let sandboxes = w.fake.sandboxes();
    assert_eq!(sandboxes.len(), 1);

    // Every phase the API shows from now on.
    let phases = Arc::new(Mutex::new(BTreeSet::new()));
    let seen = |p: &Pod| {
        phases.lock().unwrap().insert(phase(p));
    };

    w.fake.clear_calls();
    // Removals fail until the test has seen the condition True: each sync
    // stops at the failure and the next one resumes the removals, the
    // condition staying True meanwhile (as under kubelet).
    w.fake.fail_next(
        "RemoveContainer",
        u32::MAX,
        Code::Unknown,
        "injected removal failure",
    );
    w.fake
        .exit_container(&container_id(&before, "src"), 42, None)
        .unwrap();

    let marked = w
        .wait_pod(
            "all",
            "AllContainersRestarting True",
            Duration::from_secs(60),
            |p| {
                seen(p);
                match condition(p, "AllContainersRestarting") {
                    Some(c) if c.status == "True" => Ok(c.clone()),
                    c => Err(format!("{c:?}")),
                }
            },
        )
        .await;
    assert_eq!(
        marked.reason.as_deref(),
        Some("RestartAllContainersStarted")
    );
    assert_eq!(
        marked.message.as_deref(),
        Some("container exited with restart policy rule")
    );
    assert!(marked.last_transition_time.is_some());
    let p = w.get("all").await.unwrap();
    assert_eq!(phase(&p), "Running");
    let src = container_status(&p, "src").unwrap();
    assert_eq!(
        src.state
            .as_ref()
            .and_then(|s| s.terminated.as_ref())
            .map(|t| t.exit_code),
        Some(42)
    );
    w.fake.fail_next("RemoveContainer", 0, Code::Unknown, "");

    // The pod starts over: new instances of everything, one restart each,
    // the condition False again.
    let after = w
        .wait_pod("all", "a restarted pod", Duration::from_secs(120), |p| {
            seen(p);
            all_up(p)?;
            let c = condition(p, "AllContainersRestarting").ok_or("no condition")?;
            if c.status != "False" {
                return Err(format!("{c:?}"));
            }
            for n in NAMES {
                if old_ids.contains(&container_id(p, n)) {
                    return Err(format!("{n} is the old instance"));
                }
            }
            Ok(p.clone())
        })
        .await;
    for n in NAMES {
        let s = container_status(&after, n).unwrap();
        // kubelet counts the removal as one restart and keeps the count
        // although the runtime's own count starts again at 0.
        assert_eq!(s.restart_count, 1, "{n}: {s:?}");
        let last = s
            .last_state
            .as_ref()
            .and_then(|l| l.terminated.as_ref())
            .unwrap_or_else(|| panic!("{n} has no last state: {s:?}"));
        assert_eq!(last.exit_code, 137, "{n}");
        assert_eq!(
            last.reason.as_deref(),
            Some("RestartingAllContainers"),
            "{n}"
        );
        assert_eq!(
            last.message.as_deref(),
            Some("The container is removed because RestartAllContainers in place"),
            "{n}"
        );
    }
    let c = condition(&after, "AllContainersRestarting").unwrap();
    assert_eq!((c.reason.as_deref(), c.message.as_deref()), (None, None));
    assert_eq!(condition(&after, "Initialized").unwrap().status, "True");
    let phases = phases.lock().unwrap().clone();
    assert!(
        phases.iter().all(|p| p == "Running" || p == "Pending"),
        "phases seen: {phases:?}"
    );

    // The runtime: the same sandbox, none of the old containers, the
    // running ones stopped first and every old one removed, the init
    // container run again.
    let sandboxes_now = w.fake.sandboxes();
    assert_eq!(sandboxes_now.len(), 1);
    assert_eq!(sandboxes_now[0].id, sandboxes[0].id);
    let runtime_ids: BTreeSet<String> = w.fake.containers().into_iter().map(|c| c.id).collect();
    assert!(
        runtime_ids.is_disjoint(&old_ids),
        "old containers left: {:?}",
        runtime_ids.intersection(&old_ids).collect::<Vec<_>>()
    );
    let removed: BTreeSet<String> = w
        .fake
        .calls_to("RemoveContainer")
        .into_iter()
        .map(|c| c.subject)
        .collect();
    assert!(old_ids.is_subset(&removed), "removed: {removed:?}");
    let stopped: BTreeSet<String> = w
        .fake
        .calls_to("StopContainer")
        .into_iter()
        .map(|c| c.subject)
        .collect();
    for n in ["side", "app"] {
        assert!(
            stopped.contains(&container_id(&before, n)),
            "{n} not stopped"
        );
    }
    assert!(!stopped.contains(&container_id(&before, "src")));
    assert!(w.fake.calls_to("RunPodSandbox").is_empty());
    assert_eq!(runtime_ids.len(), 4, "{runtime_ids:?}");

    // Events: kubelet's Killing "killing" for each container it stopped,
    // then the containers created and started again.
    let evs = w.events("all").await;
    for (n, path) in [
        ("side", "spec.initContainers{side}"),
        ("app", "spec.containers{app}"),
    ] {
        assert!(
            evs.iter()
                .any(|(r, m, f)| r == "Killing" && m == "killing" && f == path),
            "no Killing event for {n}: {evs:?}"
        );
    }
    assert!(
        !evs.iter()
            .any(|(r, _, f)| r == "Killing" && f == "spec.containers{src}"),
        "{evs:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn an_exit_the_rule_does_not_match_follows_the_containers_policy() {
    let w = world().await;
    w.create_pod("other", spec()).await;
    let before = w
        .wait_pod(
            "other",
            "every container up",
            Duration::from_secs(60),
            |p| all_up(p).map(|()| p.clone()),
        )
        .await;
    w.fake.clear_calls();
    w.fake
        .exit_container(&container_id(&before, "src"), 1, None)
        .unwrap();
    let p = w
        .wait_pod("other", "src terminated", Duration::from_secs(60), |p| {
            let t = container_status(p, "src")
                .and_then(|s| s.state.clone())
                .and_then(|s| s.terminated)
                .ok_or_else(|| serde_json::to_string(&p.status).unwrap())?;
            Ok((p.clone(), t.exit_code))
        })
        .await;
    assert_eq!(p.1, 1);
    // A minute later: `src` stays terminated (its policy is Never), the
    // rest keeps running in the same containers, nothing was removed.
    tokio::time::sleep(Duration::from_secs(60)).await;
    let p = w.get("other").await.unwrap();
    assert_eq!(phase(&p), "Running");
    let src = container_status(&p, "src").unwrap();
    assert_eq!(src.restart_count, 0);
    assert_eq!(
        src.state
            .as_ref()
            .and_then(|s| s.terminated.as_ref())
            .map(|t| t.exit_code),
        Some(1)
    );
    for n in ["init", "side", "app"] {
        assert_eq!(container_id(&p, n), container_id(&before, n), "{n}");
        assert_eq!(container_status(&p, n).unwrap().restart_count, 0, "{n}");
    }
    let c = condition(&p, "AllContainersRestarting").expect("condition");
    assert_eq!(c.status, "False");
    assert!(w.fake.calls_to("RemoveContainer").is_empty());
    assert!(w.fake.calls_to("CreateContainer").is_empty());
}
