//! Component tests (test API server + fake CRI runtime + the pod lifecycle
//! in-process) of ephemeral containers, as kubelet v1.36 runs them:
//! `computePodActions`/`SyncPod` step 6 (pkg/kubelet/kuberuntime/
//! kuberuntime_manager.go), `startContainer`/`getTargetID`
//! (kuberuntime_container.go), the TARGET pid namespace
//! (kuberuntime_container_linux.go) and `ephemeralContainerStatuses`
//! (pkg/kubelet/kubelet_pods.go `generateAPIPodStatus`). The container is
//! added the way `kubectl debug` and the e2e suite's
//! `AddEphemeralContainerSync` add it: a strategic merge PATCH of the
//! `pods/ephemeralcontainers` subresource.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use crate::node_pods_support::*;
use k8s_openapi::api::core::v1::{ContainerStatus, Pod};
use keelson_cri::api;
use kube::api::{Patch, PatchParams};
use serde_json::json;

const T: Duration = Duration::from_secs(20);

/// Adds ephemeral containers through the subresource.
async fn add_ephemeral(w: &World, pod: &str, containers: serde_json::Value) -> Pod {
    w.pods()
        .patch_ephemeral_containers(
            pod,
            &PatchParams::default(),
            &Patch::Strategic(json!({"spec": {"ephemeralContainers": containers}})),
        )
        .await
        .unwrap()
}

fn ephemeral_status<'a>(p: &'a Pod, name: &str) -> Option<&'a ContainerStatus> {
    p.status
        .as_ref()?
        .ephemeral_container_statuses
        .iter()
        .flatten()
        .find(|c| c.name == name)
}

/// Waits until the ephemeral container's status satisfies `check`.
async fn wait_ephemeral(
    w: &World,
    pod: &str,
    name: &str,
    what: &str,
    check: impl Fn(&ContainerStatus) -> bool,
) -> ContainerStatus {
    w.wait_pod(pod, what, T, |p| match ephemeral_status(p, name) {
        Some(s) if check(s) => Ok(s.clone()),
        other => Err(format!("{other:?}")),
    })
    .await
}

/// The CreateContainer requests for container `name`, oldest first.
fn created(w: &World, name: &str) -> Vec<api::ContainerConfig> {
    w.fake
        .container_configs()
        .into_iter()
        .filter(|(c, _)| c.metadata.as_ref().is_some_and(|m| m.name == name))
        .map(|(c, _)| c)
        .collect()
}

fn pid_namespace(c: &api::ContainerConfig) -> (i32, String) {
    let ns = c
        .linux
        .as_ref()
        .and_then(|l| l.security_context.as_ref())
        .and_then(|s| s.namespace_options.clone())
        .expect("namespace options");
    (ns.pid, ns.target_id)
}

fn runtime_id(w: &World, name: &str) -> String {
    w.fake
        .containers()
        .into_iter()
        .find(|c| c.metadata.as_ref().is_some_and(|m| m.name == name))
        .map(|c| c.id)
        .unwrap_or_else(|| panic!("no container {name}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ephemeral_container_runs_once_in_its_targets_process_namespace() {
    let w = World::new().await;
    w.create_pod("target", busybox(json!({}))).await;
    let p = w.wait_phase("target", "Running", T).await;
    assert_eq!(p.metadata.generation, Some(1));
    let app_id = runtime_id(&w, "app");

    let patched = add_ephemeral(
        &w,
        "target",
        json!([{"name": "debugger", "image": IMAGE,
                "command": ["sh", "-c", "while true; do echo polo; sleep 2; done"],
                "stdin": true, "tty": true, "targetContainerName": "app",
                "env": [{"name": "DEBUG", "value": "1"}]}]),
    )
    .await;
    assert_eq!(patched.metadata.generation, Some(2));

    let s = wait_ephemeral(&w, "target", "debugger", "debugger running", |s| {
        s.state.as_ref().is_some_and(|st| st.running.is_some())
    })
    .await;
    // As kubelet writes it: the regular conversion, never ready, no
    // `started` (the prober's UpdatePodStatus does not visit ephemeral
    // containers), restart count 0.
    assert!(!s.ready);
    assert_eq!(s.started, None);
    assert_eq!(s.restart_count, 0);
    assert_eq!(s.image, IMAGE);
    assert!(!s.image_id.is_empty(), "{s:?}");
    let debugger_id = runtime_id(&w, "debugger");
    assert_eq!(
        s.container_id.as_deref(),
        Some(format!("containerd://{debugger_id}").as_str())
    );
    let p = w.get("target").await.unwrap();
    let st = p.status.as_ref().unwrap();
    assert_eq!(st.phase.as_deref(), Some("Running"));
    // Readiness is the regular containers' alone.
    assert_eq!(condition(&p, "Ready").unwrap().status, "True");
    assert!(
        st.container_statuses
            .iter()
            .flatten()
            .all(|c| c.name == "app"),
        "{st:?}"
    );

    // What the runtime was asked: the target's pid namespace, stdin and
    // tty, the environment, in the pod's sandbox.
    let configs = created(&w, "debugger");
    assert_eq!(configs.len(), 1);
    let c = &configs[0];
    assert_eq!(
        pid_namespace(c),
        (api::NamespaceMode::Target as i32, app_id.clone())
    );
    assert!(c.stdin && c.tty);
    assert!(
        c.envs.iter().any(|e| e.key == "DEBUG" && e.value == "1"),
        "{:?}",
        c.envs
    );
    assert_eq!(c.log_path, "debugger/0.log");
    let sandbox = w.fake.sandboxes()[0].id.clone();
    let (_, in_sandbox) = w
        .fake
        .container_configs()
        .into_iter()
        .find(|(c, _)| c.metadata.as_ref().is_some_and(|m| m.name == "debugger"))
        .unwrap();
    assert_eq!(in_sandbox, sandbox);
    // The regular container keeps its own namespace.
    assert_eq!(
        pid_namespace(&created(&w, "app")[0]).0,
        api::NamespaceMode::Container as i32
    );
    let evs = w.events("target").await;
    assert!(
        evs.iter()
            .any(|(r, _, f)| r == "Started" && f == "spec.ephemeralContainers{debugger}"),
        "{evs:?}"
    );
    assert!(
        !evs.iter().any(|(r, _, _)| r == "Failed"),
        "no refusal any more: {evs:?}"
    );

    // It exits: terminated, and never started again although the pod's
    // policy is Always.
    w.fake.exit_container(&debugger_id, 3, None).unwrap();
    let s = wait_ephemeral(&w, "target", "debugger", "debugger terminated", |s| {
        s.state.as_ref().is_some_and(|st| st.terminated.is_some())
    })
    .await;
    let t = s.state.unwrap().terminated.unwrap();
    assert_eq!(t.exit_code, 3);
    assert_eq!(t.reason.as_deref(), Some("Error"));
    assert_eq!(s.restart_count, 0);
    // A second one (no target) starts while the first stays down.
    add_ephemeral(
        &w,
        "target",
        json!([{"name": "debugger2", "image": IMAGE, "command": ["sh"]}]),
    )
    .await;
    wait_ephemeral(&w, "target", "debugger2", "debugger2 running", |s| {
        s.state.as_ref().is_some_and(|st| st.running.is_some())
    })
    .await;
    assert_eq!(
        pid_namespace(&created(&w, "debugger2")[0]).0,
        api::NamespaceMode::Container as i32
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(created(&w, "debugger").len(), 1, "never restarted");
    let p = w.get("target").await.unwrap();
    assert_eq!(p.status.as_ref().unwrap().phase.as_deref(), Some("Running"));
    assert_eq!(
        ephemeral_status(&p, "debugger")
            .and_then(|s| s.state.as_ref())
            .and_then(|st| st.terminated.as_ref())
            .map(|t| t.exit_code),
        Some(3)
    );

    // The subresource keeps what was added: removing one is refused.
    let err = w
        .pods()
        .replace_ephemeral_containers("target", &kube::api::PostParams::default(), &{
            let mut p = w.get("target").await.unwrap();
            p.spec.as_mut().unwrap().ephemeral_containers = None;
            p
        })
        .await
        .expect_err("removal refused");
    assert!(err.to_string().contains("may not be removed"), "{err}");

    // They stop with the pod.
    let debugger2_id = runtime_id(&w, "debugger2");
    w.delete("target", Some(1)).await;
    w.wait_gone("target", T).await;
    assert!(
        w.fake
            .containers()
            .iter()
            .all(|c| c.state != api::ContainerState::ContainerRunning as i32),
        "{:?}",
        w.fake.containers()
    );
    let stopped: Vec<String> = w
        .fake
        .calls_to("StopContainer")
        .into_iter()
        .map(|c| c.subject)
        .collect();
    assert!(stopped.contains(&debugger2_id), "{stopped:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_process_namespace_wins_over_the_target_and_failures_show_as_waiting() {
    let w = World::new().await;
    let mut spec = busybox(json!({}));
    spec["shareProcessNamespace"] = json!(true);
    w.create_pod("shared", spec).await;
    w.wait_phase("shared", "Running", T).await;
    add_ephemeral(
        &w,
        "shared",
        json!([{"name": "dbg", "image": IMAGE, "command": ["sh"], "targetContainerName": "app"},
               {"name": "missing", "image": "keelson.local/not-there:1", "command": ["sh"]}]),
    )
    .await;
    wait_ephemeral(&w, "shared", "dbg", "dbg running", |s| {
        s.state.as_ref().is_some_and(|st| st.running.is_some())
    })
    .await;
    // shareProcessNamespace: the pod's namespace (POD), no target.
    assert_eq!(
        pid_namespace(&created(&w, "dbg")[0]),
        (api::NamespaceMode::Pod as i32, String::new())
    );
    // An image that cannot be pulled: waiting with kubelet's reason, as a
    // regular container would be; the pod keeps running.
    let s = wait_ephemeral(
        &w,
        "shared",
        "missing",
        "missing waiting on its image",
        |s| {
            s.state
                .as_ref()
                .and_then(|st| st.waiting.as_ref())
                .and_then(|w| w.reason.as_deref())
                .is_some_and(|r| r == "ErrImagePull" || r == "ImagePullBackOff")
        },
    )
    .await;
    assert!(!s.ready);
    let p = w.get("shared").await.unwrap();
    assert_eq!(p.status.as_ref().unwrap().phase.as_deref(), Some("Running"));
    assert_eq!(condition(&p, "Ready").unwrap().status, "True");
}
