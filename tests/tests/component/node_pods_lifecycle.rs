//! Component tests of the pod lifecycle (test API server + fake CRI
//! runtime + keelson's pod workers in-process): ordering of sandbox, init
//! containers and app containers; the status kubelet would report; restart
//! policies; configuration errors; pod cgroups; sandbox and start failures
//! (FailedCreatePodSandBox, RunContainerError) and `hostUsers: false`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use crate::node_pods_support::*;
use keelson_cri::fake::ExitScript;
use keelson_tests::support::wait_for;
use serde_json::json;
use tonic::Code;

const T: Duration = Duration::from_secs(20);

/// A paused-time world: the worker's ~10 s retry after a failed sync takes
/// no wall time.
async fn paused_world() -> World {
    World::with(Options {
        paused: true,
        ..Options::default()
    })
    .await
}

/// The value of an unlabelled metric in the exposition text.
fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn init_container_then_app_reaches_running_with_kubelet_status() {
    let w = World::new().await;
    w.fake
        .script_exit("init", ExitScript::code(0, Duration::from_millis(200)));
    w.create_pod(
        "web",
        json!({
            "terminationGracePeriodSeconds": 5,
            "initContainers": [{"name": "init", "image": IMAGE, "command": ["true"]}],
            "containers": [{"name": "app", "image": IMAGE, "command": ["httpd", "-f"],
                            "ports": [{"containerPort": 80}],
                            "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                                    {"name": "GREETING", "value": "hello $(POD_IP)"}],
                            "resources": {"requests": {"cpu": "100m", "memory": "32Mi"}, "limits": {"memory": "64Mi"}}}]
        }),
    )
    .await;
    let pod = w.wait_phase("web", "Running", T).await;
    let status = pod.status.clone().unwrap();
    let ip = status.pod_ip.clone().expect("pod IP");
    assert!(ip.starts_with("10.88."), "{ip}");
    assert_eq!(status.host_ip.as_deref(), Some("192.168.50.1"));
    assert_eq!(status.qos_class.as_deref(), Some("Burstable"));
    assert!(status.start_time.is_some());
    for ty in [
        "PodReadyToStartContainers",
        "Initialized",
        "Ready",
        "ContainersReady",
        "PodScheduled",
    ] {
        assert_eq!(
            condition(&pod, ty).map(|c| c.status.as_str()),
            Some("True"),
            "{ty}"
        );
    }
    let init = container_status(&pod, "init").unwrap();
    let term = init
        .state
        .as_ref()
        .unwrap()
        .terminated
        .as_ref()
        .expect("init terminated");
    assert_eq!(
        (term.exit_code, term.reason.as_deref()),
        (0, Some("Completed"))
    );
    let app = container_status(&pod, "app").unwrap();
    assert!(app.ready);
    assert_eq!(app.started, Some(true));
    assert_eq!(app.restart_count, 0);
    assert!(
        app.container_id
            .as_deref()
            .unwrap()
            .starts_with("containerd://")
    );
    assert!(app.state.as_ref().unwrap().running.is_some());

    // The runtime saw: sandbox, then init, then app.
    let order: Vec<(String, String)> = w
        .fake
        .calls()
        .into_iter()
        .filter(|c| c.method == "RunPodSandbox" || c.method == "CreateContainer")
        .map(|c| (c.method.to_string(), c.subject))
        .collect();
    assert_eq!(
        order,
        vec![
            ("RunPodSandbox".to_string(), "default/web".to_string()),
            ("CreateContainer".to_string(), "init".to_string()),
            ("CreateContainer".to_string(), "app".to_string())
        ]
    );
    // What the containers were given.
    let containers = w.fake.containers();
    let app_c = containers
        .iter()
        .find(|c| c.metadata.as_ref().unwrap().name == "app")
        .unwrap();
    assert_eq!(app_c.labels["io.kubernetes.pod.name"], "web");
    assert_eq!(app_c.labels["io.kubernetes.container.name"], "app");
    assert_eq!(
        app_c.annotations["io.kubernetes.container.restartCount"],
        "0"
    );
    assert!(app_c.log_path.ends_with("app/0.log"), "{}", app_c.log_path);
    let sandbox = w.fake.sandboxes().into_iter().next().unwrap();
    assert_eq!(
        sandbox.labels["io.kubernetes.pod.uid"],
        pod.metadata.uid.clone().unwrap()
    );
    // The sandbox is in the pod's cgroup under the burstable tier.
    let cg = w
        .cgroup_root
        .join("kubepods/burstable")
        .join(format!("pod{}", pod.metadata.uid.clone().unwrap()));
    assert!(cg.is_dir(), "{}", cg.display());
    // 100m requested: 102 shares, cpu.weight 4; no memory limit because the
    // init container declares none (kubelet's ResourceConfigForPod).
    assert_eq!(std::fs::read_to_string(cg.join("cpu.weight")).unwrap(), "4");
    assert!(!cg.join("memory.max").exists());

    // Events in kubelet's words and order for the app container.
    let evs: Vec<(String, String)> = w
        .events("web")
        .await
        .into_iter()
        .filter(|(_, _, f)| f == "spec.containers{app}")
        .map(|(r, m, _)| (r, m))
        .collect();
    assert_eq!(
        evs,
        vec![
            (
                "Pulled".into(),
                format!(
                    "Container image \"{IMAGE}\" already present on machine and can be accessed by the pod"
                )
            ),
            ("Created".into(), "Container created".into()),
            ("Started".into(), "Container started".into()),
        ]
    );
    assert!(
        w.metrics()
            .contains("kubelet_started_containers_total{container_type=\"init_container\"} 1")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_policies_decide_the_final_phase() {
    let w = World::new().await;
    w.fake
        .script_exit("ok", ExitScript::code(0, Duration::from_millis(100)));
    w.fake
        .script_exit("bad", ExitScript::code(3, Duration::from_millis(100)));
    let spec = |name: &str, policy: &str| {
        json!({"restartPolicy": policy, "terminationGracePeriodSeconds": 5,
               "containers": [{"name": name, "image": IMAGE}]})
    };
    w.create_pod("never-ok", spec("ok", "Never")).await;
    w.create_pod("never-bad", spec("bad", "Never")).await;
    w.create_pod("onfailure-ok", spec("ok", "OnFailure")).await;
    let p = w.wait_phase("never-ok", "Succeeded", T).await;
    let c = container_status(&p, "ok").unwrap();
    assert_eq!(
        c.state
            .as_ref()
            .unwrap()
            .terminated
            .as_ref()
            .unwrap()
            .reason
            .as_deref(),
        Some("Completed")
    );
    assert_eq!(
        condition(&p, "Ready").unwrap().reason.as_deref(),
        Some("PodCompleted")
    );
    let p = w.wait_phase("never-bad", "Failed", T).await;
    let t = container_status(&p, "bad")
        .unwrap()
        .state
        .clone()
        .unwrap()
        .terminated
        .unwrap();
    assert_eq!((t.exit_code, t.reason.as_deref()), (3, Some("Error")));
    w.wait_phase("onfailure-ok", "Succeeded", T).await;
    // A finished pod keeps its object and status; its sandbox is stopped.
    assert!(w.get("never-ok").await.is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_init_container_with_never_fails_the_pod() {
    let w = World::new().await;
    w.fake
        .script_exit("init", ExitScript::code(1, Duration::from_millis(100)));
    w.create_pod(
        "initfail",
        json!({"restartPolicy": "Never", "terminationGracePeriodSeconds": 5,
               "initContainers": [{"name": "init", "image": IMAGE}],
               "containers": [{"name": "app", "image": IMAGE}]}),
    )
    .await;
    let p = w.wait_phase("initfail", "Failed", T).await;
    let init = condition(&p, "Initialized").unwrap();
    assert_eq!(init.status, "False");
    // The app never started.
    assert!(
        w.fake
            .calls_to("CreateContainer")
            .iter()
            .all(|c| c.subject != "app")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sidecar_keeps_running_next_to_the_app() {
    let w = World::new().await;
    w.fake
        .script_exit("init", ExitScript::code(0, Duration::from_millis(100)));
    w.create_pod(
        "sidecar",
        json!({"terminationGracePeriodSeconds": 5,
               "initContainers": [{"name": "proxy", "image": IMAGE, "restartPolicy": "Always"},
                                  {"name": "init", "image": IMAGE}],
               "containers": [{"name": "app", "image": IMAGE}]}),
    )
    .await;
    let p = w.wait_phase("sidecar", "Running", T).await;
    let proxy = container_status(&p, "proxy").unwrap();
    assert!(proxy.state.as_ref().unwrap().running.is_some());
    assert_eq!(proxy.started, Some(true));
    let order: Vec<String> = w
        .fake
        .calls_to("CreateContainer")
        .into_iter()
        .map(|c| c.subject)
        .collect();
    assert_eq!(order, vec!["proxy", "init", "app"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_errors_leave_the_container_waiting_with_kubelets_reason() {
    let w = World::new().await;
    w.create_pod(
        "cfg",
        busybox(json!({"env": [{"name": "X", "valueFrom": {"configMapKeyRef": {"name": "missing", "key": "k"}}}]})),
    )
    .await;
    let p = w
        .wait_pod(
            "cfg",
            "CreateContainerConfigError",
            T,
            |p| match waiting_reason(p, "app").as_deref() {
                Some("CreateContainerConfigError") => Ok(p.clone()),
                other => Err(format!("{other:?}")),
            },
        )
        .await;
    let msg = container_status(&p, "app")
        .unwrap()
        .state
        .clone()
        .unwrap()
        .waiting
        .unwrap()
        .message
        .unwrap();
    assert_eq!(msg, "configmap \"missing\" not found");
    assert_eq!(p.status.unwrap().phase.as_deref(), Some("Pending"));
    w.wait_event("cfg", "Failed", "Error: configmap \"missing\" not found", T)
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn image_never_pulled_and_invalid_names() {
    let w = World::new().await;
    w.create_pod(
        "never",
        json!({"containers": [{"name": "app", "image": "keelson.local/absent:1", "imagePullPolicy": "Never"}]}),
    )
    .await;
    let p = w
        .wait_pod("never", "ErrImageNeverPull", T, |p| {
            match waiting_reason(p, "app").as_deref() {
                Some("ErrImageNeverPull") => Ok(p.clone()),
                other => Err(format!("{other:?}")),
            }
        })
        .await;
    let msg = container_status(&p, "app")
        .unwrap()
        .state
        .clone()
        .unwrap()
        .waiting
        .unwrap()
        .message
        .unwrap();
    assert_eq!(
        msg,
        "Container image \"keelson.local/absent:1\" is not present with pull policy of Never"
    );
    w.wait_event(
        "never",
        "ErrImageNeverPull",
        "is not present with pull policy of Never",
        T,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_rejected_by_admission_fails_without_running_and_others_start() {
    use keelson::node::pods::{AdmitFn, AdmitRejection};
    let admit: AdmitFn = std::sync::Arc::new(|pod: &k8s_openapi::api::core::v1::Pod| {
        if pod.metadata.name.as_deref() == Some("rejected") {
            Err(AdmitRejection {
                reason: "Evicted".into(),
                message: "The node had condition: [MemoryPressure]. ".into(),
            })
        } else {
            Ok(())
        }
    });
    let w = World::with(Options {
        admit: Some(admit),
        ..Options::default()
    })
    .await;
    w.create_pod("rejected", busybox(json!({}))).await;
    w.create_pod("admitted", busybox(json!({}))).await;
    let pod = w.wait_phase("rejected", "Failed", T).await;
    let status = pod.status.clone().unwrap();
    assert_eq!(status.reason.as_deref(), Some("Evicted"));
    assert_eq!(
        status.message.as_deref(),
        Some("Pod was rejected: The node had condition: [MemoryPressure]. ")
    );
    assert_eq!(status.qos_class.as_deref(), Some("BestEffort"));
    w.wait_event(
        "rejected",
        "Evicted",
        "The node had condition: [MemoryPressure]",
        T,
    )
    .await;
    w.wait_phase("admitted", "Running", T).await;
    // A later update does not admit the rejected pod again; deleting it
    // removes the object (nothing runs to wait for). The dispatcher takes
    // events in order, so once the object is gone the update was handled.
    let mut p = w.get("rejected").await.unwrap();
    p.metadata
        .labels
        .get_or_insert_with(Default::default)
        .insert("touched".into(), "yes".into());
    w.pods()
        .replace("rejected", &Default::default(), &p)
        .await
        .unwrap();
    w.delete("rejected", None).await;
    w.wait_gone("rejected", T).await;
    let sandboxes: Vec<String> = w
        .fake
        .sandboxes()
        .iter()
        .filter_map(|s| s.metadata.as_ref().map(|m| m.name.clone()))
        .collect();
    assert_eq!(sandboxes, vec!["admitted".to_string()]);
}

/// A pod name of 253 characters (the API server's limit) makes the log
/// directory `<ns>_<name>_<uid>` longer than a file name may be: the
/// sandbox fails with `os.MkdirAll`'s error as kubelet v1.36.2 prints it
/// (`kuberuntime_sandbox.go` `createPodSandbox`; the upstream
/// hostile_objects case), not Rust's `File name too long (os error 36)`.
#[tokio::test(start_paused = true)]
async fn a_name_too_long_for_the_log_directory_fails_the_sandbox_as_kubelets_does() {
    let w = paused_world().await;
    let name = format!("{}.{}", "a".repeat(126), "b".repeat(126));
    w.create_pod(&name, busybox(json!({}))).await;
    let dir_start = format!("_{name}_");
    w.wait_event(
        &name,
        "FailedCreatePodSandBox",
        "Failed to create pod sandbox: mkdir /",
        T,
    )
    .await;
    let events = w.events(&name).await;
    let (_, message, _) = events
        .iter()
        .find(|(r, _, _)| r == "FailedCreatePodSandBox")
        .unwrap();
    assert!(
        message.contains(&dir_start) && message.ends_with(": file name too long"),
        "{message}"
    );
}

#[tokio::test(start_paused = true)]
async fn host_users_false_fails_the_sandbox_instead_of_using_the_host_user_namespace() {
    let w = paused_world().await;
    let mut spec = busybox(json!({}));
    spec["hostUsers"] = json!(false);
    w.create_pod("userns", spec).await;
    w.wait_event(
        "userns",
        "FailedCreatePodSandBox",
        "Failed to create pod sandbox: can't set `spec.hostUsers: false`, keelson does not support user namespaces",
        T,
    )
    .await;
    // The worker retries (~10 s later) and fails the same way again.
    wait_for(
        "a second failed sandbox attempt",
        Duration::from_secs(60),
        Duration::from_millis(100),
        || async {
            let n = metric(&w.metrics(), "kubelet_started_pods_errors_total");
            if n >= 2.0 {
                Ok(())
            } else {
                Err(format!("{n} failed attempts"))
            }
        },
    )
    .await
    .unwrap();
    let p = w
        .wait_pod(
            "userns",
            "app waiting in ContainerCreating",
            T,
            |p| match waiting_reason(p, "app").as_deref() {
                Some("ContainerCreating") => Ok(p.clone()),
                other => Err(format!("{other:?}")),
            },
        )
        .await;
    assert_eq!(p.status.unwrap().phase.as_deref(), Some("Pending"));
    // Nothing reached the runtime: no sandbox, no container.
    assert!(w.fake.calls_to("RunPodSandbox").is_empty());
    assert!(w.fake.sandboxes().is_empty());
    assert!(w.fake.calls_to("CreateContainer").is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_failed_run_pod_sandbox_is_reported_then_retried_to_running() {
    let w = paused_world().await;
    w.fake.fail_next(
        "RunPodSandbox",
        1,
        Code::Unknown,
        "failed to setup network for sandbox: plugin failed",
    );
    w.create_pod("retry", busybox(json!({}))).await;
    w.wait_event(
        "retry",
        "FailedCreatePodSandBox",
        "Failed to create pod sandbox: rpc error: code = Unknown desc = failed to setup network for sandbox: plugin failed",
        T,
    )
    .await;
    w.wait_phase("retry", "Running", Duration::from_secs(60))
        .await;
    assert_eq!(w.fake.calls_to("RunPodSandbox").len(), 2);
    assert_eq!(w.fake.sandboxes().len(), 1);
    let text = w.metrics();
    assert_eq!(metric(&text, "kubelet_started_pods_errors_total"), 1.0);
    assert_eq!(metric(&text, "kubelet_started_pods_total"), 2.0);
}

#[tokio::test(start_paused = true)]
async fn a_failed_start_container_waits_with_run_container_error() {
    // The fake keeps a container whose start failed in the Created state
    // (containerd marks it exited with StartError, which backs off). With
    // CRI events every new Created container would wake the worker at once
    // and paused time would never advance; relisting (containerd 1.6)
    // retries once per PLEG period instead.
    let w = World::with(Options {
        paused: true,
        fake: keelson_cri::fake::FakeConfig {
            container_events: false,
            ..Default::default()
        },
        ..Options::default()
    })
    .await;
    w.fake.fail_next(
        "StartContainer",
        u32::MAX,
        Code::Unknown,
        "failed to create shim task: exec format error",
    );
    w.create_pod("nostart", busybox(json!({}))).await;
    let p = w
        .wait_pod(
            "nostart",
            "RunContainerError",
            T,
            |p| match waiting_reason(p, "app").as_deref() {
                Some("RunContainerError") => Ok(p.clone()),
                other => Err(format!("{other:?}")),
            },
        )
        .await;
    let waiting = container_status(&p, "app")
        .unwrap()
        .state
        .clone()
        .unwrap()
        .waiting
        .unwrap();
    assert_eq!(
        waiting.message.as_deref(),
        Some("failed to create shim task: exec format error")
    );
    assert_eq!(p.status.unwrap().phase.as_deref(), Some("Pending"));
    w.wait_event(
        "nostart",
        "Failed",
        "Error: failed to create shim task: exec format error",
        T,
    )
    .await;
    // Once the runtime starts containers again, the pod runs.
    w.fake.fail_next("StartContainer", 0, Code::Unknown, "");
    w.wait_phase("nostart", "Running", Duration::from_secs(120))
        .await;
}

/// kubelet's `OnPodSandboxReady` (pkg/kubelet/kubelet.go, called from
/// SyncPod in pkg/kubelet/kuberuntime/kuberuntime_manager.go): once the new
/// sandbox is ready, `PodReadyToStartContainers` is True in the API while
/// the image is still being pulled and the container still waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ready_to_start_containers_is_true_while_the_image_is_still_pulling() {
    let w = World::new().await;
    w.fake.add_registry_image(IMAGE, None);
    w.fake.set_latency("PullImage", Duration::from_secs(5));
    w.create_pod("slow", busybox(json!({"imagePullPolicy": "Always"})))
        .await;
    let p = w
        .wait_pod(
            "slow",
            "PodReadyToStartContainers True",
            T,
            |p| match condition(p, "PodReadyToStartContainers").map(|c| c.status.as_str()) {
                Some("True") => Ok(p.clone()),
                other => Err(format!("{other:?}")),
            },
        )
        .await;
    // The pull is still under way: nothing created, the container waits.
    assert!(
        w.fake.calls_to("CreateContainer").is_empty(),
        "{:?}",
        w.fake.calls()
    );
    let status = p.status.clone().unwrap();
    assert_eq!(status.phase.as_deref(), Some("Pending"));
    assert_eq!(
        waiting_reason(&p, "app").as_deref(),
        Some("ContainerCreating")
    );
    let c = condition(&p, "PodReadyToStartContainers").unwrap();
    assert!(c.last_transition_time.is_some(), "{c:?}");
    assert_eq!(
        condition(&p, "ContainersReady").map(|c| c.status.as_str()),
        Some("False")
    );
    // Then the pull ends and the pod runs, the condition still True.
    let p = w.wait_phase("slow", "Running", T).await;
    assert_eq!(
        condition(&p, "PodReadyToStartContainers").map(|c| c.status.as_str()),
        Some("True")
    );
}

/// `containerStatuses[].user`: kubelet v1.36 copies the user the runtime
/// reports in ContainerStatus (uid, gid, supplemental groups) into the API
/// status (`toKubeContainerUser`, `pkg/kubelet/kuberuntime/kuberuntime_container_linux.go`,
/// under SupplementalGroupsPolicy, GA and locked on since v1.35;
/// `convertContainerStatusUser`, `pkg/kubelet/kubelet_pods.go`); a runtime
/// that reports none (containerd 1.x) leaves the field out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn container_statuses_carry_the_user_the_runtime_reports() {
    let w = World::with(Options {
        fake: keelson_cri::fake::FakeConfig {
            report_user: true,
            ..Default::default()
        },
        ..Options::default()
    })
    .await;
    let mut spec = busybox(json!({}));
    spec["securityContext"] =
        json!({"runAsUser": 1000, "runAsGroup": 3000, "supplementalGroups": [4000, 5000]});
    let mut other = spec["containers"][0].clone();
    other["name"] = json!("other");
    other["securityContext"] = json!({"runAsUser": 2000});
    spec["containers"].as_array_mut().unwrap().push(other);
    w.create_pod("users", spec).await;
    let p = w.wait_phase("users", "Running", T).await;
    let user = |c: &str| serde_json::to_value(&container_status(&p, c).unwrap().user).unwrap();
    assert_eq!(
        user("app"),
        json!({"linux": {"uid": 1000, "gid": 3000, "supplementalGroups": [3000, 4000, 5000]}})
    );
    assert_eq!(
        user("other"),
        json!({"linux": {"uid": 2000, "gid": 3000, "supplementalGroups": [3000, 4000, 5000]}})
    );

    // containerd 1.x: no user.
    let w = World::new().await;
    w.create_pod("plain", busybox(json!({}))).await;
    let p = w.wait_phase("plain", "Running", T).await;
    assert!(container_status(&p, "app").unwrap().user.is_none());
}

/// The pod state container GC reads, with an API list taken once before
/// the pods of the test existed: a collection that runs while a pod is
/// created and completes reads such a list (kubelet's GC asks its pod
/// workers instead, `ShouldPodContentBeRemoved` in pod_workers.go).
struct ListedBefore(keelson::node::pods::LifecyclePodState);

impl keelson::node::gc::PodState for ListedBefore {
    fn should_pod_content_be_removed(&self, uid: &str) -> bool {
        self.0.should_pod_content_be_removed(uid)
    }
    fn should_pod_runtime_be_removed(&self, uid: &str) -> bool {
        self.0.should_pod_runtime_be_removed(uid)
    }
    fn all_sources_ready(&self) -> bool {
        self.0.all_sources_ready()
    }
}

/// A pod that ran to completion after the collector's last API list keeps
/// its logs until it is deleted: `kubectl logs` of a finished pod (e2e's
/// Secrets, EmptyDir and Downward API output tests) read an empty log on
/// keelson when GC took the list's word that the pod did not exist.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gc_keeps_the_logs_of_a_pod_completed_after_its_last_list() {
    use keelson::node::gc::{ContainerGc, ContainerGcPolicy, PodState};
    use keelson::node::pods::LifecyclePodState;
    use std::sync::Arc;

    let w = World::new().await;
    w.fake
        .script_exit("done", ExitScript::code(0, Duration::from_millis(100)));
    let cri = keelson_cri::RuntimeClient::connect(&w.fake.endpoint(), Duration::from_secs(10))
        .await
        .unwrap();
    let collector = |state: Arc<dyn PodState>| {
        ContainerGc::new(
            cri.clone(),
            state,
            ContainerGcPolicy::default(),
            w.config.pod_logs_dir.clone(),
            None,
        )
    };
    let stale = LifecyclePodState::new(w.handle.clone(), w.admin.clone(), &w.node);
    stale.refresh().await;
    assert!(stale.all_sources_ready(), "the first list succeeds");

    let spec = json!({"restartPolicy": "Never", "terminationGracePeriodSeconds": 5,
                      "containers": [{"name": "done", "image": IMAGE}]});
    let pod = w.create_pod("finished", spec).await;
    w.wait_phase("finished", "Succeeded", T).await;
    let logs = keelson::node::pods::runtime::sandbox::pod_logs_dir(&w.config.pod_logs_dir, &pod);
    assert!(logs.is_dir(), "{} exists once the pod ran", logs.display());

    collector(Arc::new(ListedBefore(stale)))
        .garbage_collect(false)
        .await
        .unwrap();
    assert!(
        logs.is_dir(),
        "a completed pod that still exists keeps its logs through a collection whose list predates it"
    );

    // Deleted (and terminated): the next collection removes them.
    w.delete("finished", Some(0)).await;
    w.wait_gone("finished", T).await;
    let fresh = Arc::new(LifecyclePodState::new(
        w.handle.clone(),
        w.admin.clone(),
        &w.node,
    ));
    let gc = collector(fresh);
    wait_for(
        "the deleted pod's logs removed",
        T,
        Duration::from_millis(100),
        || async {
            gc.garbage_collect(false).await.map_err(|e| e.to_string())?;
            if logs.exists() {
                Err(format!("{} still there", logs.display()))
            } else {
                Ok(())
            }
        },
    )
    .await
    .unwrap();
}
