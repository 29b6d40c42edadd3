//! Component tests of in-place resize (test API server with the
//! `pods/resize` subresource + fake CRI runtime + fake cgroup v2 tree + the
//! pod lifecycle): the status carries what kubelet v1.36 shows (container
//! `resources` and `allocatedResources`, pod-level ones, the resize
//! conditions and events), a resize changes the pod cgroup and the
//! container through UpdateContainerResources without a restart, a resize
//! that does not fit is Deferred until room is made, `RestartContainer`
//! restarts, and a memory limit below usage is refused.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use crate::node_pods_support::*;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Patch, PatchParams};
use serde_json::json;

const T: Duration = Duration::from_secs(30);

async fn resize(w: &World, name: &str, container: &str, resources: serde_json::Value) -> Pod {
    w.pods()
        .patch_subresource(
            "resize",
            name,
            &PatchParams::default(),
            &Patch::Strategic(
                json!({"spec": {"containers": [{"name": container, "resources": resources}]}}),
            ),
        )
        .await
        .unwrap()
}

fn app(resources: serde_json::Value) -> serde_json::Value {
    let mut s = busybox(json!({}));
    s["containers"][0]["resources"] = resources;
    s
}

fn cgroup_of(w: &World, p: &Pod, tier: &str) -> std::path::PathBuf {
    w.cgroup_root
        .join("kubepods")
        .join(tier)
        .join(format!("pod{}", p.metadata.uid.clone().unwrap()))
}

fn status_resources(p: &Pod, c: &str) -> serde_json::Value {
    serde_json::to_value(&container_status(p, c).unwrap().resources).unwrap()
}

async fn wait_event_count(w: &World, name: &str, reason: &str, n: usize) -> Vec<String> {
    keelson_tests::support::wait_for(
        &format!("{n} {reason} events"),
        T,
        Duration::from_millis(50),
        || async {
            let evs: Vec<String> = w
                .events(name)
                .await
                .into_iter()
                .filter(|(r, _, _)| r == reason)
                .map(|(_, m, _)| m)
                .collect();
            if evs.len() >= n {
                Ok(evs)
            } else {
                Err(format!("{:?}", w.events(name).await))
            }
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resize_changes_the_cgroup_and_the_container_without_a_restart() {
    let w = World::new().await;
    w.create_pod(
        "web",
        app(json!({"requests": {"cpu": "100m", "memory": "64Mi"},
                   "limits": {"cpu": "200m", "memory": "128Mi"}})),
    )
    .await;
    let p = w.wait_phase("web", "Running", T).await;
    // What kubelet v1.36 reports, and what lets the API server accept a resize.
    assert_eq!(
        status_resources(&p, "app"),
        json!({"limits": {"cpu": "200m", "memory": "128Mi"}, "requests": {"cpu": "100m", "memory": "64Mi"}})
    );
    let cs = container_status(&p, "app").unwrap();
    assert_eq!(
        serde_json::to_value(&cs.allocated_resources).unwrap(),
        json!({"cpu": "100m", "memory": "64Mi"})
    );
    let first_id = cs.container_id.clone().unwrap();
    let status = p.status.clone().unwrap();
    assert_eq!(
        serde_json::to_value(&status.allocated_resources).unwrap(),
        json!({"cpu": "100m", "memory": "64Mi"})
    );
    let cg = cgroup_of(&w, &p, "burstable");
    assert_eq!(
        std::fs::read_to_string(cg.join("cpu.max")).unwrap().trim(),
        "20000 100000"
    );

    let resized = resize(
        &w,
        "web",
        "app",
        json!({"requests": {"cpu": "300m", "memory": "64Mi"}, "limits": {"cpu": "400m", "memory": "256Mi"}}),
    )
    .await;
    assert_eq!(resized.metadata.generation, Some(2));
    let started = wait_event_count(&w, "web", "ResizeStarted", 1).await;
    assert_eq!(
        started[0],
        r#"Pod resize started: {"containers":[{"name":"app","resources":{"limits":{"cpu":"400m","memory":"256Mi"},"requests":{"cpu":"300m","memory":"64Mi"}}}],"generation":2}"#
    );
    let completed = wait_event_count(&w, "web", "ResizeCompleted", 1).await;
    assert_eq!(
        completed[0],
        r#"Pod resize completed: {"containers":[{"name":"app","resources":{"limits":{"cpu":"400m","memory":"256Mi"},"requests":{"cpu":"300m","memory":"64Mi"}}}],"generation":2}"#
    );
    // The pod cgroup and the container got the new values, in place.
    assert_eq!(
        std::fs::read_to_string(cg.join("cpu.max")).unwrap().trim(),
        "40000 100000"
    );
    assert_eq!(
        std::fs::read_to_string(cg.join("memory.max"))
            .unwrap()
            .trim(),
        (256u64 << 20).to_string()
    );
    let updates = w.fake.calls_to("UpdateContainerResources");
    assert!(!updates.is_empty());
    let c = w
        .fake
        .containers()
        .into_iter()
        .find(|c| c.metadata.as_ref().unwrap().name == "app")
        .unwrap();
    let linux = c.resources.unwrap().linux.unwrap();
    assert_eq!(
        (
            linux.cpu_quota,
            linux.memory_limit_in_bytes,
            linux.cpu_shares
        ),
        (40_000, 256 << 20, 307)
    );
    let p = w
        .wait_pod("web", "status shows the new resources", T, |p| {
            let r = status_resources(p, "app");
            if r["limits"]["cpu"] == "400m" && condition(p, "PodResizeInProgress").is_none() {
                Ok(p.clone())
            } else {
                Err(format!("{r} {:?}", p.status.as_ref().unwrap().conditions))
            }
        })
        .await;
    let cs = container_status(&p, "app").unwrap();
    assert_eq!(
        cs.container_id.as_deref(),
        Some(first_id.as_str()),
        "not restarted"
    );
    assert_eq!(cs.restart_count, 0);
    assert_eq!(
        serde_json::to_value(&cs.allocated_resources).unwrap(),
        json!({"cpu": "300m", "memory": "64Mi"})
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resize_that_does_not_fit_is_deferred_until_room_is_made() {
    let w = World::new().await;
    w.create_pod("big", app(json!({"requests": {"cpu": "3"}})))
        .await;
    w.create_pod("small", app(json!({"requests": {"cpu": "500m"}})))
        .await;
    w.wait_phase("big", "Running", T).await;
    w.wait_phase("small", "Running", T).await;
    resize(&w, "small", "app", json!({"requests": {"cpu": "1500m"}})).await;
    let p = w
        .wait_pod("small", "PodResizePending", T, |p| {
            condition(p, "PodResizePending")
                .cloned()
                .map(|c| (p.clone(), c))
                .ok_or_else(|| format!("{:?}", p.status.as_ref().unwrap().conditions))
        })
        .await;
    let c = p.1;
    assert_eq!(c.status, "True");
    assert_eq!(c.reason.as_deref(), Some("Deferred"));
    assert_eq!(
        c.message.as_deref(),
        Some("Node didn't have enough resource: cpu, requested: 1500, used: 3000, capacity: 4000")
    );
    assert_eq!(c.observed_generation, Some(2));
    let deferred = wait_event_count(&w, "small", "ResizeDeferred", 1).await;
    assert_eq!(
        deferred[0],
        r#"Pod resize OutOfcpu: {"containers":[{"name":"app","resources":{"requests":{"cpu":"1500m"}}}],"generation":2,"error":"Node didn't have enough resource: cpu, requested: 1500, used: 3000, capacity: 4000"}"#
    );
    // Still allocated at 500m.
    assert_eq!(
        serde_json::to_value(&container_status(&p.0, "app").unwrap().allocated_resources).unwrap(),
        json!({"cpu": "500m"})
    );
    // Room is made: the deferred resize goes through.
    w.delete("big", Some(0)).await;
    wait_event_count(&w, "small", "ResizeStarted", 1).await;
    let p = w
        .wait_pod("small", "resize done", T, |p| {
            let alloc =
                serde_json::to_value(&container_status(p, "app").unwrap().allocated_resources)
                    .unwrap();
            if alloc == json!({"cpu": "1500m"}) && condition(p, "PodResizePending").is_none() {
                Ok(p.clone())
            } else {
                Err(format!(
                    "{alloc} {:?}",
                    p.status.as_ref().unwrap().conditions
                ))
            }
        })
        .await;
    assert_eq!(container_status(&p, "app").unwrap().restart_count, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_container_policy_restarts_with_the_new_memory() {
    let w = World::new().await;
    let mut spec = app(json!({"requests": {"memory": "64Mi"}, "limits": {"memory": "64Mi"}}));
    spec["containers"][0]["resizePolicy"] = json!([
        {"resourceName": "memory", "restartPolicy": "RestartContainer"},
        {"resourceName": "cpu", "restartPolicy": "NotRequired"}]);
    w.create_pod("db", spec).await;
    w.wait_phase("db", "Running", T).await;
    resize(
        &w,
        "db",
        "app",
        json!({"requests": {"memory": "96Mi"}, "limits": {"memory": "96Mi"}}),
    )
    .await;
    let p = w
        .wait_pod("db", "restarted with the new memory", T, |p| {
            let cs = container_status(p, "app").unwrap();
            let running = cs.state.as_ref().unwrap().running.is_some();
            if cs.restart_count == 1
                && running
                && status_resources(p, "app")["limits"]["memory"] == "96Mi"
            {
                Ok(p.clone())
            } else {
                Err(format!("{cs:?}"))
            }
        })
        .await;
    assert!(condition(&p, "PodResizeInProgress").is_none());
    let evs = w.events("db").await;
    assert!(
        evs.iter()
            .any(|(r, m, _)| r == "Killing" && m == "Container app resize requires restart"),
        "{evs:?}"
    );
    let newest = w
        .fake
        .containers()
        .into_iter()
        .filter(|c| c.metadata.as_ref().unwrap().name == "app")
        .max_by_key(|c| c.created_at)
        .unwrap();
    assert_eq!(
        newest
            .resources
            .unwrap()
            .linux
            .unwrap()
            .memory_limit_in_bytes,
        96 << 20
    );
}

/// PLEG relists so far.
fn relists(w: &World) -> u64 {
    w.metrics()
        .lines()
        .find_map(|l| l.strip_prefix("kubelet_pleg_relist_duration_seconds_count "))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map_or(0, |v| v as u64)
}

/// Running instances of container `name` in the runtime.
fn running_instances(w: &World, name: &str) -> usize {
    w.fake
        .containers()
        .into_iter()
        .filter(|c| c.metadata.as_ref().is_some_and(|m| m.name == name))
        .filter(|c| c.state == keelson_cri::api::ContainerState::ContainerRunning as i32)
        .count()
}

/// A runtime read that began before the sync that restarts the container
/// and ended after it must not pass for newer than that sync (kubelet's
/// cache entries carry the time their read began): otherwise the next
/// sync, seeing the old instance still running with the old memory,
/// restarts it again and leaves two running instances.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runtime_read_spanning_the_restart_does_not_restart_it_twice() {
    let w = World::new().await;
    let mut spec = app(json!({"requests": {"memory": "64Mi"}, "limits": {"memory": "64Mi"}}));
    spec["containers"][0]["resizePolicy"] = json!([
        {"resourceName": "memory", "restartPolicy": "RestartContainer"}]);
    w.create_pod("db", spec).await;
    w.wait_phase("db", "Running", T).await;
    // Creating the new instance takes a second after the old one is
    // killed, so a PLEG relist (every second) sees the old one exited
    // before the new one exists; reading each container's status takes
    // longer still, so that PLEG read ends after the resize sync.
    w.fake
        .set_latency("CreateContainer", Duration::from_millis(1000));
    w.fake
        .set_latency("ContainerStatus", Duration::from_millis(1500));
    resize(
        &w,
        "db",
        "app",
        json!({"requests": {"memory": "96Mi"}, "limits": {"memory": "96Mi"}}),
    )
    .await;
    w.wait_pod("db", "restarted once with the new memory", T, |p| {
        let cs = container_status(p, "app").unwrap();
        if cs.restart_count >= 1 && cs.state.as_ref().unwrap().running.is_some() {
            Ok(())
        } else {
            Err(format!("{cs:?}"))
        }
    })
    .await;
    // Several relists later (each one reads the pod anew), still one
    // restart and one running instance.
    let from = relists(&w);
    let deadline = std::time::Instant::now() + T;
    while relists(&w) < from + 4 {
        assert!(
            std::time::Instant::now() < deadline,
            "no PLEG relist in {T:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(running_instances(&w, "app"), 1, "{:?}", w.fake.containers());
    // Two creations in all: the first instance and its one restart. (A
    // sync acting on the stale read creates a third; the fake, like
    // containerd, refuses its name when it reuses an attempt number.)
    let creates = w.fake.calls_to("CreateContainer");
    assert_eq!(creates.len(), 2, "{creates:?}");
    let p = w.get("db").await.unwrap();
    let cs = container_status(&p, "app").unwrap();
    assert_eq!(cs.restart_count, 1, "{cs:?}");
    assert!(
        cs.last_state.as_ref().is_none_or(|s| s.running.is_none()),
        "{cs:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_memory_limit_below_usage_is_refused() {
    let w = World::new().await;
    w.create_pod(
        "hog",
        app(json!({"requests": {"memory": "64Mi"}, "limits": {"memory": "128Mi"}})),
    )
    .await;
    w.wait_phase("hog", "Running", T).await;
    let c = w.fake.containers().into_iter().next().unwrap();
    w.fake
        .set_usage(
            &c.id,
            keelson_cri::fake::FakeUsage {
                memory_working_set_bytes: 100 << 20,
                ..Default::default()
            },
        )
        .unwrap();
    resize(
        &w,
        "hog",
        "app",
        json!({"requests": {"memory": "64Mi"}, "limits": {"memory": "80Mi"}}),
    )
    .await;
    let p = w
        .wait_pod("hog", "PodResizeInProgress Error", T, |p| {
            match condition(p, "PodResizeInProgress") {
                Some(c) if c.reason.as_deref() == Some("Error") => Ok(c.clone()),
                other => Err(format!("{other:?}")),
            }
        })
        .await;
    assert_eq!(
        p.message.as_deref(),
        Some(format!(
            "cannot decrease memory limits: [attempting to set pod memory limit ({limit}) below current usage ({usage}), attempting to set container \"app\" memory limit ({limit}) below current usage ({usage})]",
            limit = 80u64 << 20,
            usage = 100u64 << 20
        ).as_str())
    );
    let errs = wait_event_count(&w, "hog", "ResizeError", 1).await;
    assert!(errs[0].starts_with("Pod resize error: "), "{errs:?}");
    assert!(
        errs[0].contains("\"error\":\"cannot decrease memory limits"),
        "{errs:?}"
    );
    assert!(
        w.fake.calls_to("UpdateContainerResources").is_empty(),
        "nothing changed"
    );
}

/// A pod-level resize (InPlacePodLevelResourcesVerticalScaling, beta and
/// on in v1.36, declared in the Node's `status.declaredFeatures`): the API
/// server takes `spec.resources` through `pods/resize`, and kubelet
/// allocates it (`allocationFromPod` keeps the pod-level resources), sets
/// the pod cgroup (`doPodResizeAction` with `UpdatePodLevelResources`),
/// updates the containers whose limits come from the pod level
/// (`GetLimits`), and reports the pod's `status.resources` from the pod
/// cgroup and `status.allocatedResources` as `PodRequests`
/// (`convertToAPIPodLevelResourcesStatus`, `pkg/kubelet/kubelet_pods.go`).
/// The resize events list only the containers (`podResourceSummary` has
/// no pod-level part yet, `pkg/kubelet/events/resize.go`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_level_resize_changes_the_pod_cgroup_and_the_containers_in_place() {
    let w = World::new().await;
    let mut spec = busybox(json!({}));
    spec["resources"] = json!({"requests": {"cpu": "200m", "memory": "64Mi"},
                               "limits": {"cpu": "400m", "memory": "128Mi"}});
    w.create_pod("web", spec).await;
    let p = w.wait_phase("web", "Running", T).await;
    assert_eq!(
        p.status.as_ref().unwrap().qos_class.as_deref(),
        Some("Burstable")
    );
    let cg = cgroup_of(&w, &p, "burstable");
    assert_eq!(
        std::fs::read_to_string(cg.join("cpu.max")).unwrap().trim(),
        "40000 100000"
    );
    assert_eq!(
        std::fs::read_to_string(cg.join("memory.max"))
            .unwrap()
            .trim(),
        (128u64 << 20).to_string()
    );
    // Before the resize, what the API server needs to accept one: the
    // running container's status carries (empty) resources.
    let p = w
        .wait_pod("web", "pod-level status resources", T, |p| {
            let s = p.status.as_ref().unwrap();
            match &s.resources {
                Some(r) if r.limits.is_some() => Ok(p.clone()),
                other => Err(format!("{other:?}")),
            }
        })
        .await;
    assert_eq!(status_resources(&p, "app"), json!({}));
    let first_id = container_status(&p, "app")
        .unwrap()
        .container_id
        .clone()
        .unwrap();
    let s = p.status.clone().unwrap();
    // While the API does not show the pod Running yet, the allocated
    // figures; after, the pod cgroup's: 400m quota; shares 204 → cpu.weight
    // 8, read back by kubelet as 185 shares = 181m (`cpuWeightToCPUShares`,
    // `SharesToMilliCPU`).
    let r = serde_json::to_value(&s.resources).unwrap();
    assert_eq!(r["limits"], json!({"cpu": "400m", "memory": "128Mi"}));
    assert_eq!(r["requests"]["memory"], "64Mi");
    assert!(
        r["requests"]["cpu"] == "200m" || r["requests"]["cpu"] == "181m",
        "{r}"
    );
    assert_eq!(
        serde_json::to_value(&s.allocated_resources).unwrap(),
        json!({"cpu": "200m", "memory": "64Mi"})
    );

    let resized: Pod = w
        .pods()
        .patch_subresource(
            "resize",
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"resources": {
                "requests": {"cpu": "300m", "memory": "64Mi"},
                "limits": {"cpu": "800m", "memory": "256Mi"}}}})),
        )
        .await
        .unwrap();
    assert_eq!(resized.metadata.generation, Some(2));
    let started = wait_event_count(&w, "web", "ResizeStarted", 1).await;
    assert_eq!(
        started[0],
        r#"Pod resize started: {"containers":[{"name":"app","resources":{}}],"generation":2}"#
    );
    let completed = wait_event_count(&w, "web", "ResizeCompleted", 1).await;
    assert_eq!(
        completed[0],
        r#"Pod resize completed: {"containers":[{"name":"app","resources":{}}],"generation":2}"#
    );
    // The pod cgroup: quota, memory limit and weight (300m = 307 shares =
    // weight 12).
    assert_eq!(
        std::fs::read_to_string(cg.join("cpu.max")).unwrap().trim(),
        "80000 100000"
    );
    assert_eq!(
        std::fs::read_to_string(cg.join("memory.max"))
            .unwrap()
            .trim(),
        (256u64 << 20).to_string()
    );
    assert_eq!(
        std::fs::read_to_string(cg.join("cpu.weight"))
            .unwrap()
            .trim(),
        "12"
    );
    // The container takes its limits from the pod level.
    assert!(!w.fake.calls_to("UpdateContainerResources").is_empty());
    let c = w
        .fake
        .containers()
        .into_iter()
        .find(|c| c.metadata.as_ref().unwrap().name == "app")
        .unwrap();
    let linux = c.resources.unwrap().linux.unwrap();
    assert_eq!(
        (linux.cpu_quota, linux.memory_limit_in_bytes),
        (80_000, 256 << 20)
    );
    let p = w
        .wait_pod("web", "status shows the new pod resources", T, |p| {
            let s = p.status.as_ref().unwrap();
            let r = serde_json::to_value(&s.resources).unwrap();
            if r["limits"]["cpu"] == "800m" && condition(p, "PodResizeInProgress").is_none() {
                Ok(p.clone())
            } else {
                Err(format!("{r} {:?}", s.conditions))
            }
        })
        .await;
    let s = p.status.clone().unwrap();
    // Weight 12 reads back as 290 shares = 284m.
    assert_eq!(
        serde_json::to_value(&s.resources).unwrap(),
        json!({"limits": {"cpu": "800m", "memory": "256Mi"},
               "requests": {"cpu": "284m", "memory": "64Mi"}})
    );
    assert_eq!(
        serde_json::to_value(&s.allocated_resources).unwrap(),
        json!({"cpu": "300m", "memory": "64Mi"})
    );
    assert!(condition(&p, "PodResizePending").is_none());
    assert_eq!(s.observed_generation, Some(2));
    let cs = container_status(&p, "app").unwrap();
    assert_eq!(
        cs.container_id.as_deref(),
        Some(first_id.as_str()),
        "not restarted"
    );
    assert_eq!(cs.restart_count, 0);
}
