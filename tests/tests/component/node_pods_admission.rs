//! Component tests of kubelet's admission in keelson (test API server +
//! fake CRI runtime + the pod lifecycle in-process): a refused pod ends
//! `Failed` with kubelet's reason and `Pod was rejected: <message>`, a
//! Warning event with the same reason, and never reaches the runtime.
//! Resource fit (overhead and pod-level resources counted, pods count),
//! node selector/affinity (re-read from the API), node name, NoExecute
//! taints, host ports, sysctls, AppArmor, supplementalGroupsPolicy,
//! node-declared features, and admission one pod at a time.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use crate::node_pods_support::*;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::json;

const T: Duration = Duration::from_secs(20);

/// Waits for the pod to be refused and checks what kubelet would show:
/// phase, reason, message, the Warning event, and no sandbox.
async fn assert_rejected(w: &World, name: &str, reason: &str, message: &str) -> Pod {
    let p = w.wait_phase(name, "Failed", T).await;
    let s = p.status.clone().unwrap();
    assert_eq!(s.reason.as_deref(), Some(reason), "{name}");
    assert_eq!(
        s.message.as_deref(),
        Some(format!("Pod was rejected: {message}").as_str()),
        "{name}"
    );
    w.wait_event(name, reason, message, T).await;
    let evs = w.events(name).await;
    assert!(
        evs.iter().any(|(r, m, _)| r == reason && m == message),
        "{evs:?}"
    );
    assert!(
        w.fake
            .calls_to("RunPodSandbox")
            .iter()
            .all(|c| c.subject != format!("default/{name}")),
        "a refused pod never runs"
    );
    p
}

fn requests(mem: &str) -> serde_json::Value {
    json!({"containers": [{"name": "app", "image": IMAGE, "command": ["sleep", "3600"],
                           "resources": {"requests": {"memory": mem}}}]})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn second_pod_exceeding_allocatable_memory_is_out_of_memory() {
    let w = World::new().await;
    w.create_pod("first", requests("5Gi")).await;
    w.wait_phase("first", "Running", T).await;
    w.create_pod("second", requests("4Gi")).await;
    assert_rejected(
        &w,
        "second",
        "OutOfmemory",
        &format!(
            "Node didn't have enough resource: memory, requested: {}, used: {}, capacity: {}",
            4u64 << 30,
            5u64 << 30,
            8u64 << 30
        ),
    )
    .await;
    // The first pod is untouched, and the metric counts the refusal.
    let first = w.get("first").await.unwrap();
    assert_eq!(first.status.unwrap().phase.as_deref(), Some("Running"));
    assert!(
        w.metrics()
            .contains("kubelet_admission_rejections_total{reason=\"OutOfmemory\"} 1"),
        "{}",
        w.metrics()
    );
    // Once the first pod is gone its memory is free again.
    w.delete("first", Some(0)).await;
    w.wait_gone("first", T).await;
    w.create_pod("third", requests("4Gi")).await;
    w.wait_phase("third", "Running", T).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overhead_and_pod_level_resources_count_in_the_fit() {
    let w = World::new().await;
    // 3 cpu of containers + 1500m overhead (from the RuntimeClass, copied
    // into the pod by the API server) > 4 cpu.
    let rc: k8s_openapi::api::node::v1::RuntimeClass = serde_json::from_value(json!({
        "metadata": {"name": "vm"}, "handler": "runc",
        "overhead": {"podFixed": {"cpu": "1500m"}}}))
    .unwrap();
    Api::<k8s_openapi::api::node::v1::RuntimeClass>::all(w.admin.clone())
        .create(&kube::api::PostParams::default(), &rc)
        .await
        .unwrap();
    let mut spec = json!({"runtimeClassName": "vm",
        "containers": [{"name": "app", "image": IMAGE, "resources": {"requests": {"cpu": "3"}}}]});
    w.create_pod("overhead", spec.clone()).await;
    assert_rejected(
        &w,
        "overhead",
        "OutOfcpu",
        "Node didn't have enough resource: cpu, requested: 4500, used: 0, capacity: 4000",
    )
    .await;
    // Pod-level requests replace the containers' sum.
    spec = json!({"resources": {"requests": {"cpu": "3500m"}, "limits": {"cpu": "4"}},
        "containers": [{"name": "app", "image": IMAGE, "command": ["sleep", "3600"]}]});
    w.create_pod("podlevel", spec).await;
    w.wait_phase("podlevel", "Running", T).await;
    w.create_pod(
        "small",
        json!({"containers": [{"name": "app", "image": IMAGE, "resources": {"requests": {"cpu": "600m"}}}]}),
    )
    .await;
    assert_rejected(
        &w,
        "small",
        "OutOfcpu",
        "Node didn't have enough resource: cpu, requested: 600, used: 3500, capacity: 4000",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_count_is_bounded_by_allocatable_pods() {
    let w = World::with(Options {
        node_status: Some(Box::new(|s| {
            s["allocatable"]["pods"] = json!("1");
        })),
        ..Options::default()
    })
    .await;
    w.create_pod("one", busybox(json!({}))).await;
    w.wait_phase("one", "Running", T).await;
    w.create_pod("two", busybox(json!({}))).await;
    assert_rejected(
        &w,
        "two",
        "OutOfpods",
        "Node didn't have enough resource: pods, requested: 1, used: 1, capacity: 1",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_selector_affinity_and_node_labels_read_again() {
    let w = World::new().await;
    let mut spec = busybox(json!({}));
    spec["nodeSelector"] = json!({"disk": "ssd"});
    w.create_pod("selector", spec.clone()).await;
    assert_rejected(
        &w,
        "selector",
        "NodeAffinity",
        "Predicate NodeAffinity failed: node(s) didn't match Pod's node affinity/selector",
    )
    .await;
    // Label the node; the next pod is admitted (the Node is read again
    // when only affinity fails, so no watch delay matters).
    Api::<Node>::all(w.admin.clone())
        .patch(
            &w.node,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"disk": "ssd"}}})),
        )
        .await
        .unwrap();
    w.create_pod("selector2", spec).await;
    w.wait_phase("selector2", "Running", T).await;
    // Required node affinity with an operator.
    let mut spec = busybox(json!({}));
    spec["affinity"] = json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "disk", "operator": "NotIn", "values": ["ssd"]}]}]}}});
    w.create_pod("affinity", spec).await;
    assert_rejected(
        &w,
        "affinity",
        "NodeAffinity",
        "Predicate NodeAffinity failed: node(s) didn't match Pod's node affinity/selector",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_execute_taints_and_host_ports() {
    // The taints are there before keelson starts; it lists the Node
    // before it watches pods, so the first pod already sees them.
    let w = World::with(Options {
        node_object: Some(Box::new(|n| {
            n["spec"] = json!({"taints": [
                {"key": "maintenance", "effect": "NoExecute"},
                {"key": "busy", "effect": "NoSchedule"}]});
        })),
        ..Options::default()
    })
    .await;
    // A NoSchedule taint alone never refuses a pod; the NoExecute one does.
    w.create_pod("untolerated", busybox(json!({}))).await;
    assert_rejected(
        &w,
        "untolerated",
        "TaintToleration",
        "Predicate TaintToleration failed: node(s) had taints that the pod didn't tolerate",
    )
    .await;
    let web = |extra: serde_json::Value| {
        let mut s = busybox(json!({"ports": [{"containerPort": 80, "hostPort": 8080}]}));
        s["tolerations"] =
            json!([{"key": "maintenance", "operator": "Exists", "effect": "NoExecute"}]);
        if let Some(o) = extra.as_object() {
            for (k, v) in o {
                s[k] = v.clone();
            }
        }
        s
    };
    w.create_pod("web1", web(json!({}))).await;
    w.wait_phase("web1", "Running", T).await;
    w.create_pod("web2", web(json!({}))).await;
    assert_rejected(
        &w,
        "web2",
        "NodePorts",
        "Predicate NodePorts failed: node(s) didn't have free ports for the requested pod ports",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sysctls_safe_unsafe_and_allowed() {
    let w = World::with(Options {
        configure: Some(Box::new(|c| {
            c.allowed_unsafe_sysctls = vec!["net.core.somaxconn".into(), "kernel.msg*".into()];
        })),
        ..Options::default()
    })
    .await;
    let with = |names: &[&str]| {
        let mut s = busybox(json!({}));
        s["securityContext"] = json!({"sysctls": names.iter()
            .map(|n| json!({"name": n, "value": "1"})).collect::<Vec<_>>()});
        s
    };
    w.create_pod("unsafe", with(&["kernel.sched_rt_runtime_us"]))
        .await;
    assert_rejected(
        &w,
        "unsafe",
        "SysctlForbidden",
        "forbidden sysctl: \"kernel.sched_rt_runtime_us\" not allowlisted",
    )
    .await;
    w.create_pod(
        "allowed",
        with(&[
            "net.core.somaxconn",
            "kernel.msgmax",
            "net.ipv4.ip_unprivileged_port_start",
        ]),
    )
    .await;
    w.wait_phase("allowed", "Running", T).await;
    // The sysctls reached the sandbox.
    let (cfg, _) = w
        .fake
        .sandbox_configs()
        .into_iter()
        .find(|(c, _)| c.metadata.as_ref().unwrap().name == "allowed")
        .unwrap();
    let sysctls = cfg.linux.unwrap().sysctls;
    assert_eq!(sysctls["net.core.somaxconn"], "1");
    assert_eq!(sysctls["kernel.msgmax"], "1");
    let mut host = with(&["net.core.somaxconn"]);
    host["hostNetwork"] = json!(true);
    w.create_pod("hostnet", host).await;
    assert_rejected(
        &w,
        "hostnet",
        "SysctlForbidden",
        "forbidden sysctl: \"net.core.somaxconn\" not allowed with host Net enabled",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apparmor_supplemental_groups_and_declared_features() {
    let w = World::new().await;
    let mut spec =
        busybox(json!({"securityContext": {"appArmorProfile": {"type": "RuntimeDefault"}}}));
    w.create_pod("apparmor", spec.clone()).await;
    let host = keelson::node::pods::admission::apparmor::validate_host(std::path::Path::new("/"));
    match host {
        Err(e) => {
            assert_rejected(
                &w,
                "apparmor",
                "AppArmor",
                &format!("Cannot enforce AppArmor: {e}"),
            )
            .await;
        }
        Ok(()) => {
            w.wait_phase("apparmor", "Running", T).await;
        }
    }
    // Strict needs `status.features.supplementalGroupsPolicy` on the Node.
    spec = busybox(json!({}));
    spec["securityContext"] = json!({"supplementalGroupsPolicy": "Strict"});
    w.create_pod("strict", spec).await;
    assert_rejected(
        &w,
        "strict",
        "SupplementalGroupsPolicyNotSupported",
        "SupplementalGroupsPolicy=Strict is not supported in this node",
    )
    .await;
    spec = json!({"restartPolicy": "Never", "containers": [{"name": "app", "image": IMAGE,
        "restartPolicy": "Never",
        "restartPolicyRules": [{"action": "RestartAllContainers", "exitCodes": {"operator": "In", "values": [42]}}]}]});
    // RestartAllContainersOnContainerExits is declared: admitted.
    w.create_pod("restartall", spec).await;
    w.wait_phase("restartall", "Running", T).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admission_is_serialized_so_two_pods_cannot_both_take_the_last_memory() {
    let w = World::new().await;
    // Created together: each fits alone, not both.
    let (a, b) = tokio::join!(
        w.create_pod("race-a", requests("5Gi")),
        w.create_pod("race-b", requests("5Gi"))
    );
    let _ = (a, b);
    let phases = wait_both_decided(&w).await;
    let running = phases.iter().filter(|p| p.as_str() == "Running").count();
    let failed = phases.iter().filter(|p| p.as_str() == "Failed").count();
    assert_eq!((running, failed), (1, 1), "{phases:?}");
}

async fn wait_both_decided(w: &World) -> Vec<String> {
    keelson_tests::support::wait_for(
        "both pods decided",
        T,
        Duration::from_millis(50),
        || async {
            let mut out = Vec::new();
            for n in ["race-a", "race-b"] {
                let p = w.get(n).await.ok_or("missing")?;
                let phase = p.status.and_then(|s| s.phase).unwrap_or_default();
                if phase != "Running" && phase != "Failed" {
                    return Err(format!("{n} {phase}"));
                }
                out.push(phase);
            }
            Ok(out)
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"))
}
