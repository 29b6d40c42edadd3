//! Component tests of RuntimeClass support (test API server with the
//! RuntimeClass admission plugin + fake CRI runtime with containerd's
//! handler semantics + the pod lifecycle in-process): the class's handler
//! reaches RunPodSandbox, its overhead is counted, and a class that is
//! missing or names a handler the runtime lacks fails the sandbox with
//! kubelet's `FailedCreatePodSandBox` message — the pod never runs under
//! the default runtime instead.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use crate::node_pods_support::*;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::node::v1::RuntimeClass;
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use serde_json::json;

const T: Duration = Duration::from_secs(20);

async fn runtime_class(w: &World, name: &str, handler: &str, extra: serde_json::Value) {
    let mut rc = json!({"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass",
                        "metadata": {"name": name}, "handler": handler});
    if let Some(o) = extra.as_object() {
        for (k, v) in o {
            rc[k] = v.clone();
        }
    }
    let rc: RuntimeClass = serde_json::from_value(rc).unwrap();
    Api::<RuntimeClass>::all(w.admin.clone())
        .create(&PostParams::default(), &rc)
        .await
        .unwrap();
}

fn with_class(class: &str) -> serde_json::Value {
    let mut s = busybox(json!({}));
    s["runtimeClassName"] = json!(class);
    s
}

/// The runtime handler of the pod's sandbox(es).
fn handlers_of(w: &World, name: &str) -> Vec<String> {
    w.fake
        .sandbox_configs()
        .into_iter()
        .filter(|(c, _)| c.metadata.as_ref().unwrap().name == name)
        .map(|(_, h)| h)
        .collect()
}

#[tokio::test(start_paused = true)]
async fn the_runtime_class_handler_reaches_run_pod_sandbox() {
    // Paused time: a first sync that ran before the class reached the
    // watch is retried after kubelet's ~10 s backoff at no wall cost.
    let w = World::with(Options {
        paused: true,
        ..Options::default()
    })
    .await;
    w.fake.add_runtime_handler("runsc");
    runtime_class(&w, "gvisor", "runsc", json!({})).await;
    // The class may reach keelson's watch after the pod: a failed first
    // attempt is retried, never run under the default handler.
    w.create_pod("sandboxed", with_class("gvisor")).await;
    w.wait_phase("sandboxed", "Running", T).await;
    let handlers = handlers_of(&w, "sandboxed");
    assert!(!handlers.is_empty());
    assert!(handlers.iter().all(|h| h == "runsc"), "{handlers:?}");
    // No class: the default handler.
    w.create_pod("plain", busybox(json!({}))).await;
    w.wait_phase("plain", "Running", T).await;
    assert_eq!(handlers_of(&w, "plain"), vec![String::new()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_the_runtime_does_not_have_fails_the_sandbox() {
    let w = World::new().await;
    runtime_class(&w, "kata", "kata-qemu", json!({})).await;
    w.create_pod("kata", with_class("kata")).await;
    w.wait_event(
        "kata",
        "FailedCreatePodSandBox",
        "Failed to create pod sandbox: rpc error: code = Unknown desc = failed to get sandbox runtime: no runtime for \"kata-qemu\" is configured",
        T,
    )
    .await;
    let p = w.get("kata").await.unwrap();
    let s = p.status.unwrap();
    assert_eq!(s.phase.as_deref(), Some("Pending"));
    assert!(w.fake.sandboxes().is_empty(), "nothing runs");
    let c = s.container_statuses.unwrap();
    assert_eq!(
        c[0].state
            .as_ref()
            .unwrap()
            .waiting
            .as_ref()
            .unwrap()
            .reason
            .as_deref(),
        Some("ContainerCreating")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runtime_class_gone_before_the_pod_is_bound_fails_the_sandbox() {
    let mut w = World::new().await;
    runtime_class(&w, "gone", "runc", json!({})).await;
    // Created unscheduled (the admission plugin needs the class now), the
    // class deleted, then bound to this node as a scheduler would.
    let mut spec = with_class("gone");
    spec["automountServiceAccountToken"] = json!(false);
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "orphan", "namespace": w.ns}, "spec": spec
    }))
    .unwrap();
    w.pods().create(&PostParams::default(), &pod).await.unwrap();
    Api::<RuntimeClass>::all(w.admin.clone())
        .delete("gone", &DeleteParams::default())
        .await
        .unwrap();
    // A keelson started now has never seen the class.
    w.restart(false).await;
    let binding = json!({"apiVersion": "v1", "kind": "Binding",
        "metadata": {"name": "orphan"}, "target": {"kind": "Node", "name": w.node}});
    w.pods()
        .create_subresource::<_, serde_json::Value>(
            "binding",
            "orphan",
            &PostParams::default(),
            &binding,
        )
        .await
        .unwrap();
    w.wait_event(
        "orphan",
        "FailedCreatePodSandBox",
        "Failed to create pod sandbox: runtimeclass.node.k8s.io \"gone\" not found",
        T,
    )
    .await;
    assert!(w.fake.sandboxes().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_server_refuses_a_missing_runtime_class_and_a_stray_overhead() {
    let w = World::new().await;
    let pod = |spec: serde_json::Value| -> Pod {
        let mut spec = spec;
        spec["nodeName"] = json!(w.node);
        serde_json::from_value(json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "x", "namespace": w.ns}, "spec": spec}))
        .unwrap()
    };
    let e = w
        .pods()
        .create(&PostParams::default(), &pod(with_class("nope")))
        .await
        .expect_err("refused");
    assert!(
        e.to_string()
            .contains("pods \"x\" is forbidden: pod rejected: RuntimeClass \"nope\" not found"),
        "{e}"
    );
    let mut s = busybox(json!({}));
    s["overhead"] = json!({"cpu": "100m"});
    let e = w
        .pods()
        .create(&PostParams::default(), &pod(s))
        .await
        .expect_err("refused");
    assert!(
        e.to_string().contains(
            "pod rejected: Pod Overhead set without corresponding RuntimeClass defined Overhead"
        ),
        "{e}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_class_overhead_reaches_the_sandbox_and_the_fit() {
    let w = World::new().await;
    runtime_class(
        &w,
        "heavy",
        "runc",
        json!({"overhead": {"podFixed": {"cpu": "1500m", "memory": "64Mi"}}}),
    )
    .await;
    let mut spec = with_class("heavy");
    spec["containers"][0]["resources"] =
        json!({"requests": {"cpu": "2"}, "limits": {"cpu": "2", "memory": "128Mi"}});
    w.create_pod("first", spec.clone()).await;
    let p = w.wait_phase("first", "Running", T).await;
    assert_eq!(
        p.spec.unwrap().overhead.unwrap()["cpu"].0,
        "1500m",
        "the API server copied the overhead"
    );
    let (cfg, _) = w
        .fake
        .sandbox_configs()
        .into_iter()
        .find(|(c, _)| c.metadata.as_ref().unwrap().name == "first")
        .unwrap();
    let linux = cfg.linux.unwrap();
    let overhead = linux.overhead.expect("overhead passed to the runtime");
    assert_eq!(overhead.memory_limit_in_bytes, 64 << 20);
    // 2 cpu + 1500m overhead = 3500m of 4: a second pod of 600m no longer fits.
    let mut small = busybox(json!({}));
    small["containers"][0]["resources"] = json!({"requests": {"cpu": "600m"}});
    w.create_pod("second", small).await;
    let p = w.wait_phase("second", "Failed", T).await;
    assert_eq!(
        p.status.unwrap().message.as_deref(),
        Some(
            "Pod was rejected: Node didn't have enough resource: cpu, requested: 600, used: 3500, capacity: 4000"
        )
    );
}
