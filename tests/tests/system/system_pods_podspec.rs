//! System tests of PodSpec fields on real parts (the `keelson` binary, a
//! private containerd with runc and the CNI bridge, the host's cgroup
//! hierarchies below a test-owned root):
//!
//! - two pods that together exceed the node's allocatable memory: the
//!   second is refused `OutOfmemory` and never runs;
//! - a pod with an unsafe sysctl is refused `SysctlForbidden`; a safe one
//!   reaches the container's network namespace;
//! - a RuntimeClass naming a handler containerd does not have fails the
//!   sandbox with `FailedCreatePodSandBox` and containerd's own error;
//! - `activeDeadlineSeconds: 5` ends `Failed`/`DeadlineExceeded` with the
//!   container stopped;
//! - a resize of a running pod's memory and CPU changes the pod's and the
//!   container's cgroups without restarting the container.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::PathBuf;
use std::time::Duration;

use crate::system_pods_support::*;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::node::v1::RuntimeClass;
use keelson_tests::support::{require_root, wait_for};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;

const T: Duration = Duration::from_secs(90);

fn sleeper(extra: serde_json::Value) -> serde_json::Value {
    let mut s = json!({"terminationGracePeriodSeconds": 2,
        "containers": [{"name": "app", "image": IMAGE, "command": ["sleep", "3600"]}]});
    if let Some(o) = extra.as_object() {
        for (k, v) in o {
            s[k] = v.clone();
        }
    }
    s
}

/// The node's allocatable memory in bytes, once the node reported it.
async fn allocatable_memory(w: &SysWorld) -> u64 {
    let nodes: Api<Node> = Api::all(w.admin.clone());
    wait_for(
        "node allocatable",
        T,
        Duration::from_millis(200),
        || async {
            let n = nodes
                .get_opt(&w.node_name)
                .await
                .map_err(|e| e.to_string())?;
            n.and_then(|n| n.status?.allocatable?.get("memory").cloned())
                .and_then(|q| keelson::quantity::Quantity::parse(&q.0).ok())
                .map(|q| q.value_u64())
                .filter(|m| *m > 0)
                .ok_or_else(|| "no allocatable memory yet".to_string())
        },
    )
    .await
    .unwrap()
}

async fn wait_event(w: &SysWorld, name: &str, reason: &str, text: &str) -> String {
    match wait_for(
        &format!("event {reason} on {name}"),
        T,
        Duration::from_millis(200),
        || async {
            let evs = w.events(name).await;
            evs.iter()
                .find(|(r, m)| r == reason && m.contains(text))
                .map(|(_, m)| m.clone())
                .ok_or_else(|| format!("{evs:?}"))
        },
    )
    .await
    {
        Ok(m) => m,
        Err(e) => panic!("{e}\n--- keelson log ---\n{}", w.log()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admission_refuses_out_of_memory_and_unsafe_sysctls() {
    if !require_root("admission_refuses_out_of_memory_and_unsafe_sysctls") {
        return;
    }
    let w = SysWorld::start().await;
    let mem = allocatable_memory(&w).await;
    // 60 % each: the first fits, the second does not.
    let request = mem / 10 * 6;
    let with_request = || {
        let mut s = sleeper(json!({}));
        s["containers"][0]["resources"] = json!({"requests": {"memory": request.to_string()}});
        s
    };
    w.create_pod("first", with_request()).await;
    w.wait_phase("first", "Running", T).await;
    w.create_pod("second", with_request()).await;
    let p = w.wait_phase("second", "Failed", T).await;
    let s = p.status.unwrap();
    assert_eq!(s.reason.as_deref(), Some("OutOfmemory"));
    assert_eq!(
        s.message.as_deref(),
        Some(format!(
            "Pod was rejected: Node didn't have enough resource: memory, requested: {request}, used: {request}, capacity: {mem}"
        ).as_str())
    );
    wait_event(
        &w,
        "second",
        "OutOfmemory",
        "Node didn't have enough resource: memory",
    )
    .await;

    // An unsafe sysctl is refused; a safe one reaches the pod.
    let mut unsafe_pod = sleeper(json!({}));
    unsafe_pod["securityContext"] =
        json!({"sysctls": [{"name": "kernel.msgmax", "value": "65536"}]});
    w.create_pod("unsafe", unsafe_pod).await;
    let p = w.wait_phase("unsafe", "Failed", T).await;
    let s = p.status.unwrap();
    assert_eq!(s.reason.as_deref(), Some("SysctlForbidden"));
    assert_eq!(
        s.message.as_deref(),
        Some("Pod was rejected: forbidden sysctl: \"kernel.msgmax\" not allowlisted")
    );
    let mut safe = sleeper(json!({}));
    safe["securityContext"] =
        json!({"sysctls": [{"name": "net.ipv4.ip_unprivileged_port_start", "value": "123"}]});
    w.create_pod("safe", safe).await;
    let p = w.wait_phase("safe", "Running", T).await;
    let id = container_status(&p, "app")
        .unwrap()
        .container_id
        .clone()
        .unwrap();
    let rc = w
        .exec(
            &id,
            &[
                "sh",
                "-c",
                "test \"$(cat /proc/sys/net/ipv4/ip_unprivileged_port_start)\" = 123",
            ],
        )
        .await;
    assert_eq!(rc, 0, "the sysctl is set in the pod's network namespace");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runtime_class_with_a_missing_handler_fails_the_sandbox() {
    if !require_root("a_runtime_class_with_a_missing_handler_fails_the_sandbox") {
        return;
    }
    let w = SysWorld::start().await;
    let rc: RuntimeClass = serde_json::from_value(json!({
        "metadata": {"name": "sandboxed"}, "handler": "gvisor-missing"}))
    .unwrap();
    Api::<RuntimeClass>::all(w.admin.clone())
        .create(&PostParams::default(), &rc)
        .await
        .unwrap();
    w.create_pod(
        "sandboxed",
        sleeper(json!({"runtimeClassName": "sandboxed"})),
    )
    .await;
    let msg = wait_event(&w, "sandboxed", "FailedCreatePodSandBox", "gvisor-missing").await;
    assert!(
        msg.starts_with("Failed to create pod sandbox: rpc error: code = Unknown desc = failed to get sandbox runtime: no runtime for \"gvisor-missing\" is configured"),
        "{msg}"
    );
    let p = w.pods().get("sandboxed").await.unwrap();
    assert_eq!(p.status.unwrap().phase.as_deref(), Some("Pending"));
    let sandboxes = w.ctrd.client().list_pod_sandbox(None).await.unwrap();
    assert!(
        sandboxes
            .iter()
            .all(|s| s.metadata.as_ref().is_none_or(|m| m.name != "sandboxed")),
        "no sandbox under the default runtime"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn active_deadline_seconds_ends_the_pod() {
    if !require_root("active_deadline_seconds_ends_the_pod") {
        return;
    }
    let w = SysWorld::start().await;
    w.create_pod("job", sleeper(json!({"activeDeadlineSeconds": 5})))
        .await;
    w.wait_phase("job", "Running", T).await;
    let p = w.wait_phase("job", "Failed", T).await;
    let s = p.status.clone().unwrap();
    assert_eq!(s.reason.as_deref(), Some("DeadlineExceeded"));
    assert_eq!(
        s.message.as_deref(),
        Some("Pod was active on the node longer than the specified deadline")
    );
    wait_event(
        &w,
        "job",
        "DeadlineExceeded",
        "longer than the specified deadline",
    )
    .await;
    w.wait_pod("job", "container stopped", T, |p| {
        container_status(p, "app")
            .and_then(|c| c.state.clone())
            .and_then(|s| s.terminated)
            .ok_or_else(|| format!("{:?}", container_status(p, "app")))
    })
    .await;
}

/// The cgroup v1 mount of `controller`, if this host has one.
fn v1_mount(controller: &str) -> Option<PathBuf> {
    match keelson::node::cgroups::detect_mode(std::path::Path::new("/proc/self/mountinfo")).ok()? {
        keelson::node::cgroups::CgroupMode::V1 { mounts } => mounts.get(controller).cloned(),
        keelson::node::cgroups::CgroupMode::V2 { .. } => None,
    }
}

fn read(path: PathBuf) -> String {
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .trim()
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resize_changes_the_cgroups_without_a_restart() {
    if !require_root("a_resize_changes_the_cgroups_without_a_restart") {
        return;
    }
    let (Some(cpu), Some(memory)) = (v1_mount("cpu"), v1_mount("memory")) else {
        keelson_tests::support::skip(
            "a_resize_changes_the_cgroups_without_a_restart",
            "the cgroup checks read cgroup v1 files; this host runs cgroup v2",
        );
        return;
    };
    let w = SysWorld::start().await;
    let mut spec = sleeper(json!({}));
    spec["containers"][0]["resources"] = json!({
        "requests": {"cpu": "100m", "memory": "32Mi"}, "limits": {"cpu": "200m", "memory": "64Mi"}});
    w.create_pod("web", spec).await;
    let p = w.wait_phase("web", "Running", T).await;
    let uid = p.metadata.uid.clone().unwrap();
    let id = container_status(&p, "app")
        .unwrap()
        .container_id
        .clone()
        .unwrap();
    let cid = id.trim_start_matches("containerd://").to_string();
    let pod_cg = format!(
        "{}/kubepods/burstable/pod{uid}",
        w.ctrd.cgroup_parent().trim_start_matches('/')
    );
    let ctr_cg = format!("{pod_cg}/{cid}");
    assert_eq!(read(cpu.join(&pod_cg).join("cpu.cfs_quota_us")), "20000");
    assert_eq!(read(cpu.join(&ctr_cg).join("cpu.cfs_quota_us")), "20000");
    assert_eq!(
        read(memory.join(&ctr_cg).join("memory.limit_in_bytes")),
        (64u64 << 20).to_string()
    );

    w.pods()
        .patch_subresource(
            "resize",
            "web",
            &PatchParams::default(),
            &Patch::Strategic(
                json!({"spec": {"containers": [{"name": "app", "resources": {
                "requests": {"cpu": "300m", "memory": "48Mi"},
                "limits": {"cpu": "500m", "memory": "128Mi"}}}]}}),
            ),
        )
        .await
        .unwrap();
    wait_event(&w, "web", "ResizeCompleted", "Pod resize completed").await;
    assert_eq!(read(cpu.join(&pod_cg).join("cpu.cfs_quota_us")), "50000");
    assert_eq!(read(cpu.join(&ctr_cg).join("cpu.cfs_quota_us")), "50000");
    assert_eq!(read(cpu.join(&ctr_cg).join("cpu.shares")), "307");
    assert_eq!(
        read(memory.join(&pod_cg).join("memory.limit_in_bytes")),
        (128u64 << 20).to_string()
    );
    assert_eq!(
        read(memory.join(&ctr_cg).join("memory.limit_in_bytes")),
        (128u64 << 20).to_string()
    );
    let p = w
        .wait_pod("web", "status shows the resize", T, |p| {
            let cs = container_status(p, "app").unwrap();
            let r = serde_json::to_value(&cs.resources).unwrap();
            if r["limits"]["memory"] == "128Mi" && condition(p, "PodResizeInProgress").is_none() {
                Ok(p.clone())
            } else {
                Err(format!("{r}"))
            }
        })
        .await;
    let cs = container_status(&p, "app").unwrap();
    assert_eq!(
        cs.container_id.as_deref(),
        Some(id.as_str()),
        "same container"
    );
    assert_eq!(cs.restart_count, 0);
    assert_eq!(
        serde_json::to_value(&cs.resources).unwrap(),
        json!({"limits": {"cpu": "500m", "memory": "128Mi"}, "requests": {"cpu": "300m", "memory": "48Mi"}})
    );
}
