//! Component tests (test API server + fake CRI runtime + the pod lifecycle
//! in-process) of v1.36 pod fields keelson does not implement: each is
//! refused where an operator looks, as kubelet fails the same pod when it
//! cannot honour it, and the pod never runs with the field ignored. Also
//! `hostnameOverride`, which is honoured.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use crate::node_pods_support::*;
use serde_json::json;

const T: Duration = Duration::from_secs(20);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resource_claims_fail_to_prepare_and_nothing_runs() {
    let w = World::new().await;
    let mut spec = busybox(json!({"resources": {"claims": [{"name": "gpu"}]}}));
    spec["resourceClaims"] = json!([{"name": "gpu", "resourceClaimName": "gpu-claim"}]);
    w.create_pod("dra", spec).await;
    w.wait_event(
        "dra",
        "FailedPrepareDynamicResources",
        "Failed to prepare dynamic resources: keelson does not support dynamic resource allocation",
        T,
    )
    .await;
    let s = w.get("dra").await.unwrap().status.unwrap();
    assert_eq!(s.phase.as_deref(), Some("Pending"));
    assert!(
        w.fake.sandboxes().is_empty(),
        "no sandbox without the claims"
    );
    assert!(w.fake.containers().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_key_ref_variable_is_a_config_error_not_an_empty_value() {
    let w = World::new().await;
    // (The emptyDir the file would live in is left out: this world sets up
    // no volumes, and the refusal does not depend on it.)
    let spec = busybox(json!({"env": [{"name": "TOKEN", "valueFrom": {
        "fileKeyRef": {"volumeName": "cfg", "path": "env", "key": "TOKEN"}}}]}));
    w.create_pod("envfile", spec).await;
    let p = w
        .wait_pod("envfile", "CreateContainerConfigError", T, |p| {
            let s = p.status.as_ref().ok_or("no status")?;
            let waiting = s
                .container_statuses
                .iter()
                .flatten()
                .find_map(|c| c.state.as_ref()?.waiting.clone())
                .ok_or("not waiting")?;
            if waiting.reason.as_deref() == Some("CreateContainerConfigError") {
                Ok(waiting)
            } else {
                Err(format!("{waiting:?}"))
            }
        })
        .await;
    assert_eq!(
        p.message.as_deref(),
        Some("keelson does not support fileKeyRef environment variables (EnvFiles): TOKEN")
    );
    assert!(w.fake.containers().is_empty(), "the container never runs");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostname_override_names_the_sandbox() {
    let w = World::new().await;
    let mut spec = busybox(json!({}));
    spec["hostnameOverride"] = json!("db.example");
    spec["hostname"] = json!("ignored");
    w.create_pod("named", spec).await;
    w.wait_phase("named", "Running", T).await;
    let hostnames: Vec<String> = w
        .fake
        .sandbox_configs()
        .into_iter()
        .filter(|(c, _)| c.metadata.as_ref().unwrap().name == "named")
        .map(|(c, _)| c.hostname)
        .collect();
    assert_eq!(hostnames, ["db.example"]);
}
