//! Component tests: the CRI client against the fake runtime, over a real
//! unix socket and real gRPC.

use std::collections::HashMap;
use std::future::Future;
use std::time::Duration;

use futures::StreamExt;
use keelson_cri::api;
use keelson_cri::fake::{ExecScript, ExitScript, FakeConfig, FakeRuntime, FakeUsage};
use keelson_cri::{ClientConfig, Code, CriError, RuntimeClient, image_spec, runtime_condition};

const BUSYBOX: &str = "keelson.local/busybox:1";

struct Setup {
    _dir: tempfile::TempDir,
    fake: FakeRuntime,
    cri: RuntimeClient,
}

async fn setup_with(config: FakeConfig, timeout: Duration) -> Setup {
    let dir = tempfile::tempdir().expect("tempdir");
    let fake = FakeRuntime::start_with(dir.path().join("cri.sock"), config)
        .await
        .expect("start fake");
    fake.add_image(BUSYBOX);
    let cri = RuntimeClient::connect(&fake.endpoint(), timeout)
        .await
        .expect("connect");
    Setup {
        _dir: dir,
        fake,
        cri,
    }
}

async fn setup() -> Setup {
    setup_with(FakeConfig::default(), Duration::from_secs(10)).await
}

/// Polls `probe` until it yields `Some`, failing the test after 5 s.
async fn eventually<T, F, Fut>(what: &str, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        if let Some(v) = probe().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn labels(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn pod_config(name: &str, uid: &str) -> api::PodSandboxConfig {
    api::PodSandboxConfig {
        metadata: Some(api::PodSandboxMetadata {
            name: name.to_string(),
            uid: uid.to_string(),
            namespace: "default".to_string(),
            attempt: 0,
        }),
        hostname: name.to_string(),
        log_directory: format!("/var/log/pods/default_{name}_{uid}"),
        labels: labels(&[("io.kubernetes.pod.name", name), ("app", "web")]),
        annotations: labels(&[("note", "kept as is")]),
        ..Default::default()
    }
}

fn container_config(name: &str) -> api::ContainerConfig {
    api::ContainerConfig {
        metadata: Some(api::ContainerMetadata {
            name: name.to_string(),
            attempt: 0,
        }),
        image: Some(image_spec(BUSYBOX)),
        command: vec!["sleep".into(), "3600".into()],
        log_path: format!("{name}/0.log"),
        labels: labels(&[("io.kubernetes.container.name", name)]),
        annotations: labels(&[("io.kubernetes.container.hash", "abc")]),
        ..Default::default()
    }
}

async fn running_container(s: &Setup, pod: &str, name: &str) -> (String, String) {
    let sb = s
        .cri
        .run_pod_sandbox(pod_config(pod, &format!("uid-{pod}")), "")
        .await
        .expect("run sandbox");
    let id = s
        .cri
        .create_container(
            &sb,
            container_config(name),
            pod_config(pod, &format!("uid-{pod}")),
        )
        .await
        .expect("create");
    s.cri.start_container(&id).await.expect("start");
    (sb, id)
}

async fn container_state(cri: &RuntimeClient, id: &str) -> api::ContainerStatus {
    cri.container_status(id, false)
        .await
        .expect("status")
        .status
        .expect("status present")
}

#[tokio::test]
async fn version_status_and_runtime_config() {
    let s = setup().await;
    let v = s.cri.version().await.expect("version");
    assert_eq!(v.runtime_name, "containerd");
    assert_eq!(v.runtime_api_version, "v1");

    let status = s.cri.status().await.expect("status");
    assert!(
        runtime_condition(&status, "RuntimeReady")
            .expect("cond")
            .status
    );
    assert!(
        runtime_condition(&status, "NetworkReady")
            .expect("cond")
            .status
    );

    s.fake
        .set_network_ready(false, "NetworkPluginNotReady", "cni plugin not initialized");
    let status = s.cri.status().await.expect("status");
    let net = runtime_condition(&status, "NetworkReady").expect("cond");
    assert!(!net.status);
    assert_eq!(net.reason, "NetworkPluginNotReady");
    // Without a network, a pod-network sandbox cannot start.
    let err = s
        .cri
        .run_pod_sandbox(pod_config("nonet", "u0"), "")
        .await
        .expect_err("no network");
    assert_eq!(err.code(), Some(Code::Unknown), "{err}");
    s.fake.set_network_ready(true, "", "");

    s.cri
        .update_runtime_config("10.123.4.0/24")
        .await
        .expect("update config");
    assert_eq!(s.fake.pod_cidr(), "10.123.4.0/24");
    let sb = s
        .cri
        .run_pod_sandbox(pod_config("p", "u1"), "")
        .await
        .expect("run");
    let st = s.cri.pod_sandbox_status(&sb, false).await.expect("status");
    let ip = st
        .status
        .and_then(|s| s.network)
        .map(|n| n.ip)
        .unwrap_or_default();
    assert_eq!(ip, "10.123.4.2", "first host after the gateway");

    let err = s
        .cri
        .update_runtime_config("nonsense")
        .await
        .expect_err("bad cidr");
    assert!(matches!(err, CriError::InvalidArgument { .. }), "{err}");
}

#[tokio::test]
async fn sandbox_lifecycle_filters_and_errors() {
    let s = setup().await;
    s.fake.clock().set(1_000_000_000);
    let a = s
        .cri
        .run_pod_sandbox(pod_config("a", "ua"), "")
        .await
        .expect("a");
    s.fake.clock().advance(Duration::from_secs(1));
    let mut cfg_b = pod_config("b", "ub");
    cfg_b.labels.insert("app".into(), "db".into());
    let b = s.cri.run_pod_sandbox(cfg_b, "runc").await.expect("b");
    assert_eq!(a.len(), 64, "containerd-style id");
    assert_ne!(a, b);

    let st = s.cri.pod_sandbox_status(&a, false).await.expect("status");
    let status = st.status.expect("status");
    assert_eq!(status.created_at, 1_000_000_000);
    assert_eq!(status.state, api::PodSandboxState::SandboxReady as i32);
    assert_eq!(status.metadata.as_ref().map(|m| m.name.as_str()), Some("a"));
    assert_eq!(
        status.annotations.get("note").map(String::as_str),
        Some("kept as is")
    );
    let ip_a = status.network.map(|n| n.ip).unwrap_or_default();
    assert_eq!(ip_a, "10.88.0.2");

    // Same name, namespace, uid and attempt: the name is reserved.
    let err = s
        .cri
        .run_pod_sandbox(pod_config("a", "ua"), "")
        .await
        .expect_err("duplicate");
    assert!(err.to_string().contains("reserved"), "{err}");

    // Host-network sandboxes get no pod IP.
    let mut host = pod_config("h", "uh");
    host.linux = Some(api::LinuxPodSandboxConfig {
        security_context: Some(api::LinuxSandboxSecurityContext {
            namespace_options: Some(api::NamespaceOption {
                network: api::NamespaceMode::Node as i32,
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    });
    let h = s.cri.run_pod_sandbox(host, "").await.expect("host");
    let hs = s.cri.pod_sandbox_status(&h, false).await.expect("status");
    assert_eq!(
        hs.status.and_then(|s| s.network).map(|n| n.ip),
        Some(String::new())
    );

    // Filters: labels, id prefix, state (ANDed).
    let web = s
        .cri
        .list_pod_sandbox(Some(api::PodSandboxFilter {
            label_selector: labels(&[("app", "web")]),
            ..Default::default()
        }))
        .await
        .expect("list");
    let mut ids: Vec<_> = web.iter().map(|p| p.id.clone()).collect();
    ids.sort();
    let mut want = vec![a.clone(), h.clone()];
    want.sort();
    assert_eq!(ids, want);
    let by_prefix = s
        .cri
        .list_pod_sandbox(Some(api::PodSandboxFilter {
            id: b[..12].to_string(),
            ..Default::default()
        }))
        .await
        .expect("list");
    assert_eq!(by_prefix.len(), 1);
    assert_eq!(by_prefix[0].id, b);
    assert_eq!(by_prefix[0].runtime_handler, "runc");

    s.cri.stop_pod_sandbox(&a).await.expect("stop");
    s.cri
        .stop_pod_sandbox(&a)
        .await
        .expect("stop is idempotent");
    let not_ready = s
        .cri
        .list_pod_sandbox(Some(api::PodSandboxFilter {
            state: Some(api::PodSandboxStateValue {
                state: api::PodSandboxState::SandboxNotready as i32,
            }),
            ..Default::default()
        }))
        .await
        .expect("list");
    assert_eq!(
        not_ready.iter().map(|p| p.id.as_str()).collect::<Vec<_>>(),
        vec![a.as_str()]
    );

    s.cri.remove_pod_sandbox(&a).await.expect("remove");
    s.cri
        .remove_pod_sandbox(&a)
        .await
        .expect("removing again is fine");
    let err = s.cri.pod_sandbox_status(&a, false).await.expect_err("gone");
    assert!(err.is_not_found(), "{err}");
    assert!(err.to_string().contains("PodSandboxStatus"), "{err}");
    let err = s.cri.stop_pod_sandbox(&a).await.expect_err("gone");
    assert!(err.is_not_found(), "{err}");
    // The name is free again once removed.
    s.cri
        .run_pod_sandbox(pod_config("a", "ua"), "")
        .await
        .expect("re-run");
}

#[tokio::test]
async fn container_lifecycle_status_and_filters() {
    let s = setup().await;
    let sb = s
        .cri
        .run_pod_sandbox(pod_config("p", "up"), "")
        .await
        .expect("run");

    let mut bad = container_config("x");
    bad.image = Some(image_spec("keelson.local/absent:1"));
    let err = s
        .cri
        .create_container(&sb, bad, pod_config("p", "up"))
        .await
        .expect_err("no image");
    assert!(err.is_not_found(), "{err}");
    let err = s
        .cri
        .create_container("nope", container_config("x"), pod_config("p", "up"))
        .await
        .expect_err("no sandbox");
    assert!(err.is_not_found(), "{err}");

    s.fake.clock().set(5_000);
    let id = s
        .cri
        .create_container(&sb, container_config("app"), pod_config("p", "up"))
        .await
        .expect("create");
    let st = container_state(&s.cri, &id).await;
    assert_eq!(st.state, api::ContainerState::ContainerCreated as i32);
    assert_eq!(st.created_at, 5_000);
    assert_eq!(st.started_at, 0);
    assert_eq!(st.log_path, "/var/log/pods/default_p_up/app/0.log");
    assert_eq!(
        st.labels
            .get("io.kubernetes.container.name")
            .map(String::as_str),
        Some("app")
    );
    assert_eq!(
        st.annotations
            .get("io.kubernetes.container.hash")
            .map(String::as_str),
        Some("abc")
    );
    // containerd 1.6: the image id is in image_ref, image_id stays empty.
    assert!(st.image_ref.starts_with("sha256:"), "{}", st.image_ref);
    assert_eq!(st.image_id, "");

    s.fake.clock().set(6_000);
    s.cri.start_container(&id).await.expect("start");
    let err = s
        .cri
        .start_container(&id)
        .await
        .expect_err("already running");
    assert_eq!(err.code(), Some(Code::Unknown), "{err}");
    let st = container_state(&s.cri, &id).await;
    assert_eq!(st.state, api::ContainerState::ContainerRunning as i32);
    assert_eq!(st.started_at, 6_000);

    let other = s
        .cri
        .create_container(&sb, container_config("side"), pod_config("p", "up"))
        .await
        .expect("create side");
    let running = s
        .cri
        .list_containers(Some(api::ContainerFilter {
            state: Some(api::ContainerStateValue {
                state: api::ContainerState::ContainerRunning as i32,
            }),
            pod_sandbox_id: sb.clone(),
            ..Default::default()
        }))
        .await
        .expect("list");
    assert_eq!(
        running.iter().map(|c| c.id.as_str()).collect::<Vec<_>>(),
        vec![id.as_str()]
    );
    let by_label = s
        .cri
        .list_containers(Some(api::ContainerFilter {
            label_selector: labels(&[("io.kubernetes.container.name", "side")]),
            ..Default::default()
        }))
        .await
        .expect("list");
    assert_eq!(by_label.len(), 1);
    assert_eq!(by_label[0].id, other);
    assert_eq!(by_label[0].pod_sandbox_id, sb);
    let all = s.cri.list_containers(None).await.expect("list");
    assert_eq!(all.len(), 2, "sandboxes are not listed as containers");

    s.fake.clock().set(9_000);
    s.cri
        .stop_container(&id, Duration::from_secs(30))
        .await
        .expect("stop");
    let st = container_state(&s.cri, &id).await;
    assert_eq!(st.state, api::ContainerState::ContainerExited as i32);
    assert_eq!(
        (st.exit_code, st.reason.as_str(), st.finished_at),
        (143, "Error", 9_000)
    );
    s.cri
        .stop_container(&id, Duration::ZERO)
        .await
        .expect("stopping an exited container is fine");

    s.cri.remove_container(&id).await.expect("remove");
    s.cri
        .remove_container(&id)
        .await
        .expect("removing again is fine");
    let err = s.cri.container_status(&id, false).await.expect_err("gone");
    assert!(err.is_not_found(), "{err}");
    let err = s
        .cri
        .stop_container(&id, Duration::ZERO)
        .await
        .expect_err("gone");
    assert!(err.is_not_found(), "{err}");

    // Stopping the sandbox kills what runs in it; removing it removes them.
    s.cri.start_container(&other).await.expect("start side");
    s.cri.stop_pod_sandbox(&sb).await.expect("stop sandbox");
    let st = container_state(&s.cri, &other).await;
    assert_eq!((st.exit_code, st.reason.as_str()), (137, "Error"));
    s.cri.remove_pod_sandbox(&sb).await.expect("remove sandbox");
    assert!(s.cri.list_containers(None).await.expect("list").is_empty());
}

#[tokio::test]
async fn scripted_exits_report_code_and_reason() {
    let s = setup().await;
    s.fake
        .script_exit("fails", ExitScript::code(3, Duration::from_millis(30)));
    s.fake
        .script_exit("hog", ExitScript::oom_killed(Duration::from_millis(30)));
    s.fake
        .script_exit("done", ExitScript::code(0, Duration::ZERO));
    let (_, fails) = running_container(&s, "p1", "fails").await;
    let (_, hog) = running_container(&s, "p2", "hog").await;
    let (_, done) = running_container(&s, "p3", "done").await;
    for (id, code, reason) in [
        (&fails, 3, "Error"),
        (&hog, 137, "OOMKilled"),
        (&done, 0, "Completed"),
    ] {
        let st = eventually("container exit", || async {
            let st = container_state(&s.cri, id).await;
            (st.state == api::ContainerState::ContainerExited as i32).then_some(st)
        })
        .await;
        assert_eq!((st.exit_code, st.reason.as_str()), (code, reason));
        assert!(st.finished_at >= st.started_at && st.finished_at > 0);
    }
    // On demand.
    let (_, app) = running_container(&s, "p4", "app").await;
    s.fake.exit_container(&app, 42, None).expect("exit");
    let st = container_state(&s.cri, &app).await;
    assert_eq!((st.exit_code, st.reason.as_str()), (42, "Error"));
}

#[tokio::test]
async fn exec_sync_results_errors_and_timeouts() {
    let s = setup().await;
    s.fake
        .script_exec(ExecScript::new(&["cat", "/tmp/ready"], "ok\n", 0));
    s.fake.script_exec(
        ExecScript::new(&["check"], "", 1)
            .with_stderr("bad\n")
            .in_container("app"),
    );
    s.fake
        .script_exec(ExecScript::new(&["slow"], "", 0).taking(Duration::from_secs(6)));
    let (_, id) = running_container(&s, "p", "app").await;
    let argv = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();

    let r = s
        .cri
        .exec_sync(&id, argv(&["cat", "/tmp/ready"]), Duration::from_secs(1))
        .await
        .expect("exec");
    assert_eq!((r.stdout.as_slice(), r.exit_code), (b"ok\n".as_slice(), 0));
    let r = s
        .cri
        .exec_sync(&id, argv(&["check"]), Duration::from_secs(1))
        .await
        .expect("exec");
    assert_eq!((r.stderr.as_slice(), r.exit_code), (b"bad\n".as_slice(), 1));
    // A binary that is not there is an error, not an exit code (runc).
    let err = s
        .cri
        .exec_sync(&id, argv(&["unknown-cmd"]), Duration::from_secs(1))
        .await
        .expect_err("no such binary");
    assert_eq!(err.code(), Some(Code::Unknown), "{err}");
    assert!(
        err.to_string().contains("executable file not found"),
        "{err}"
    );

    let started = tokio::time::Instant::now();
    let err = s
        .cri
        .exec_sync(&id, argv(&["slow"]), Duration::from_secs(1))
        .await
        .expect_err("exec timeout");
    assert!(err.is_deadline_exceeded(), "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );

    s.cri
        .stop_container(&id, Duration::ZERO)
        .await
        .expect("stop");
    let err = s
        .cri
        .exec_sync(&id, argv(&["cat", "/tmp/ready"]), Duration::from_secs(1))
        .await
        .expect_err("not running");
    assert_eq!(err.code(), Some(Code::Unknown), "{err}");
    let err = s
        .cri
        .exec_sync("nope", argv(&["true"]), Duration::from_secs(1))
        .await
        .expect_err("unknown");
    assert!(err.is_not_found(), "{err}");
}

#[tokio::test]
async fn container_events_stream_lifecycle() {
    let s = setup().await;
    let mut events = s.cri.get_container_events();
    // The stream is opened on first poll; make sure it is subscribed
    // before acting, by waiting for the fake to log the call.
    let first = tokio::spawn(async move {
        let mut got = Vec::new();
        while let Some(item) = events.next().await {
            let ev = item.expect("event");
            let done = ev.container_event_type
                == api::ContainerEventType::ContainerDeletedEvent as i32
                && ev
                    .pod_sandbox_status
                    .as_ref()
                    .is_some_and(|p| p.id != ev.container_id);
            got.push(ev);
            if done {
                break;
            }
        }
        got
    });
    eventually("events subscription", || async {
        (!s.fake.calls_to("GetContainerEvents").is_empty()).then_some(())
    })
    .await;
    let (sb, id) = running_container(&s, "p", "app").await;
    s.cri
        .stop_container(&id, Duration::ZERO)
        .await
        .expect("stop");
    s.cri.remove_container(&id).await.expect("remove");
    let got = tokio::time::timeout(Duration::from_secs(5), first)
        .await
        .expect("events in time")
        .expect("task");
    let kinds: Vec<(String, i32)> = got
        .iter()
        .map(|e| (e.container_id.clone(), e.container_event_type))
        .collect();
    use api::ContainerEventType as E;
    assert_eq!(
        kinds,
        vec![
            (sb.clone(), E::ContainerCreatedEvent as i32),
            (sb.clone(), E::ContainerStartedEvent as i32),
            (id.clone(), E::ContainerCreatedEvent as i32),
            (id.clone(), E::ContainerStartedEvent as i32),
            (id.clone(), E::ContainerStoppedEvent as i32),
            (id.clone(), E::ContainerDeletedEvent as i32),
        ]
    );
    let stopped = &got[4];
    assert_eq!(
        stopped.pod_sandbox_status.as_ref().map(|p| p.id.as_str()),
        Some(sb.as_str())
    );
    let cs = stopped
        .containers_statuses
        .iter()
        .find(|c| c.id == id)
        .expect("container status in event");
    assert_eq!(cs.state, api::ContainerState::ContainerExited as i32);
    assert!(
        got[5].containers_statuses.iter().all(|c| c.id != id),
        "deleted container gone"
    );
}

#[tokio::test]
async fn container_events_unimplemented_is_distinct() {
    let s = setup_with(
        FakeConfig {
            container_events: false,
            ..FakeConfig::default()
        },
        Duration::from_secs(5),
    )
    .await;
    let mut events = s.cri.get_container_events();
    let first = events.next().await.expect("one item");
    let err = first.expect_err("unimplemented");
    assert!(err.is_unimplemented(), "{err}");
    assert!(err.to_string().contains("GetContainerEvents"), "{err}");
    assert!(events.next().await.is_none(), "stream ends after the error");
}

#[tokio::test]
async fn stats_of_containers_and_sandboxes() {
    let s = setup().await;
    let (sb, id) = running_container(&s, "p", "app").await;
    s.fake
        .set_usage(
            &id,
            FakeUsage {
                cpu_usage_core_nanos: 7_000,
                memory_working_set_bytes: 4096,
                writable_layer_bytes: 10,
            },
        )
        .expect("usage");
    let st = s.cri.container_stats(&id).await.expect("stats");
    assert_eq!(
        st.cpu
            .and_then(|c| c.usage_core_nano_seconds)
            .map(|v| v.value),
        Some(7_000)
    );
    assert_eq!(
        st.memory.and_then(|m| m.working_set_bytes).map(|v| v.value),
        Some(4096)
    );
    assert_eq!(st.attributes.map(|a| a.id), Some(id.clone()));
    let list = s
        .cri
        .list_container_stats(Some(api::ContainerStatsFilter {
            pod_sandbox_id: sb.clone(),
            ..Default::default()
        }))
        .await
        .expect("list");
    assert_eq!(list.len(), 1);
    let pod = s.cri.pod_sandbox_stats(&sb).await.expect("pod stats");
    let linux = pod.linux.expect("linux");
    assert_eq!(
        linux
            .memory
            .and_then(|m| m.working_set_bytes)
            .map(|v| v.value),
        Some(4096)
    );
    assert_eq!(linux.containers.len(), 1);
    let pods = s.cri.list_pod_sandbox_stats(None).await.expect("list pods");
    assert_eq!(pods.len(), 1);
    let err = s.cri.container_stats("nope").await.expect_err("unknown");
    assert!(err.is_not_found(), "{err}");
    s.cri
        .stop_container(&id, Duration::ZERO)
        .await
        .expect("stop");
    assert!(
        s.cri
            .list_container_stats(None)
            .await
            .expect("list")
            .is_empty(),
        "only running containers have stats"
    );
}

#[tokio::test]
async fn images_pull_with_auth_status_list_remove() {
    let s = setup().await;
    s.fake
        .add_registry_image("private.example/app:1", Some(("alice", "s3cret")));
    s.fake.add_registry_image("busybox", None);

    let err = s
        .cri
        .pull_image(image_spec("private.example/app:1"), None, None)
        .await
        .expect_err("no credentials");
    assert_eq!(err.code(), Some(Code::Unknown), "{err}");
    assert!(err.to_string().contains("401"), "{err}");
    let auth = api::AuthConfig {
        username: "alice".into(),
        password: "s3cret".into(),
        ..Default::default()
    };
    let image_ref = s
        .cri
        .pull_image(image_spec("private.example/app:1"), Some(auth), None)
        .await
        .expect("pull with auth");
    assert!(image_ref.starts_with("sha256:"), "{image_ref}");
    let err = s
        .cri
        .pull_image(image_spec("nowhere.example/x:1"), None, None)
        .await
        .expect_err("absent");
    assert!(err.is_not_found(), "{err}");

    // "busybox" normalizes to docker.io/library/busybox:latest.
    s.cri
        .pull_image(image_spec("busybox"), None, None)
        .await
        .expect("pull");
    let img = s
        .cri
        .image_status(image_spec("docker.io/library/busybox:latest"))
        .await
        .expect("status")
        .expect("present");
    assert_eq!(
        img.repo_tags,
        vec!["docker.io/library/busybox:latest".to_string()]
    );
    let by_id = s
        .cri
        .image_status(image_spec(&image_ref))
        .await
        .expect("status");
    assert_eq!(by_id.map(|i| i.id), Some(image_ref.clone()));
    assert!(
        s.cri
            .image_status(image_spec("absent:1"))
            .await
            .expect("status")
            .is_none()
    );

    let list = s.cri.list_images(None).await.expect("list");
    assert_eq!(list.len(), 3);
    let fs = s.cri.image_fs_info().await.expect("fs info");
    assert_eq!(fs.image_filesystems.len(), 1);
    assert!(
        fs.image_filesystems[0]
            .used_bytes
            .as_ref()
            .is_some_and(|u| u.value > 0)
    );

    s.cri
        .remove_image(image_spec("busybox"))
        .await
        .expect("remove");
    s.cri
        .remove_image(image_spec("busybox"))
        .await
        .expect("remove absent is fine");
    assert_eq!(s.cri.list_images(None).await.expect("list").len(), 2);
}

#[tokio::test]
async fn injected_errors_map_to_variants_and_calls_are_logged() {
    let s = setup().await;
    let cases = [
        (Code::NotFound, "not found"),
        (Code::Unavailable, "unavailable"),
        (Code::DeadlineExceeded, "deadline exceeded"),
        (Code::Unimplemented, "not implemented"),
        (Code::InvalidArgument, "invalid argument"),
        (Code::AlreadyExists, "already exists"),
        (Code::ResourceExhausted, "ResourceExhausted"),
    ];
    for (code, words) in cases {
        s.fake.fail_next("ListContainers", 1, code, "injected");
        let err = s.cri.list_containers(None).await.expect_err("injected");
        assert_eq!(err.code(), Some(code), "{err}");
        let text = err.to_string();
        assert!(
            text.contains("ListContainers") && text.contains(words) && text.contains("injected"),
            "{text}"
        );
    }
    assert!(
        s.cri.list_containers(None).await.is_ok(),
        "failures were used up"
    );

    s.fake.clear_calls();
    let (sb, id) = running_container(&s, "p", "app").await;
    let methods: Vec<_> = s
        .fake
        .calls()
        .iter()
        .map(|c| (c.method, c.subject.clone()))
        .collect();
    assert_eq!(
        methods,
        vec![
            ("RunPodSandbox", "default/p".to_string()),
            ("CreateContainer", "app".to_string()),
            ("StartContainer", id.clone()),
        ]
    );
    assert!(!sb.is_empty());
}

#[tokio::test]
async fn every_call_has_a_deadline() {
    let s = setup_with(FakeConfig::default(), Duration::from_millis(300)).await;
    s.fake.set_latency("*", Duration::from_secs(10));
    let started = tokio::time::Instant::now();
    let err = s.cri.version().await.expect_err("too slow");
    assert!(err.is_deadline_exceeded(), "{err}");
    let err = s.cri.list_pod_sandbox(None).await.expect_err("too slow");
    assert!(err.is_deadline_exceeded(), "{err}");
    let err = s
        .cri
        .image_status(image_spec(BUSYBOX))
        .await
        .expect_err("too slow");
    assert!(err.is_deadline_exceeded(), "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "three 300 ms deadlines, not 10 s latencies: {:?}",
        started.elapsed()
    );
    s.fake.set_latency("*", Duration::ZERO);
    s.cri.version().await.expect("fast again");

    // PullImage has its own deadline.
    let pulling = RuntimeClient::new_lazy(
        &s.fake.endpoint(),
        ClientConfig {
            request_timeout: Duration::from_millis(100),
            pull_image_timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(1),
        },
    )
    .expect("client");
    s.fake.add_registry_image("slow.example/a:1", None);
    s.fake.set_latency("PullImage", Duration::from_millis(400));
    pulling
        .pull_image(image_spec("slow.example/a:1"), None, None)
        .await
        .expect("pull outlives the request timeout");
}

#[tokio::test]
async fn reconnects_after_runtime_restart() {
    let s = setup().await;
    let sb = s
        .cri
        .run_pod_sandbox(pod_config("p", "u"), "")
        .await
        .expect("run");
    let mut events = s.cri.get_container_events();
    let pending = tokio::spawn(async move { events.next().await });
    eventually("events subscription", || async {
        (!s.fake.calls_to("GetContainerEvents").is_empty()).then_some(())
    })
    .await;

    s.fake.stop_serving();
    let ended = tokio::time::timeout(Duration::from_secs(5), pending)
        .await
        .expect("stream ends when the runtime goes")
        .expect("task");
    assert!(
        matches!(ended, None | Some(Err(_))),
        "stream ended without an event: {ended:?}"
    );
    let err = s.cri.version().await.expect_err("down");
    assert!(err.is_unavailable(), "{err}");

    s.fake.resume_serving().expect("resume");
    let status = eventually("client reconnects", || async {
        s.cri.pod_sandbox_status(&sb, false).await.ok()
    })
    .await;
    assert_eq!(
        status.status.map(|s| s.id),
        Some(sb.clone()),
        "state survived the restart"
    );

    s.fake.restart().expect("restart");
    eventually("client reconnects again", || async {
        s.cri.version().await.ok()
    })
    .await;
}

#[tokio::test]
async fn connect_errors() {
    let dir = tempfile::tempdir().expect("tempdir");
    let endpoint = format!("unix://{}", dir.path().join("absent.sock").display());
    let err = RuntimeClient::connect(&endpoint, Duration::from_secs(2))
        .await
        .expect_err("nothing listens");
    assert!(err.is_unavailable(), "{err}");
    assert!(err.to_string().contains("Version"), "{err}");
    let err = RuntimeClient::connect("tcp://127.0.0.1:1", Duration::from_secs(2))
        .await
        .expect_err("bad scheme");
    assert!(matches!(err, CriError::InvalidEndpoint { .. }), "{err}");
}

#[tokio::test]
async fn resources_log_reopen_and_verbose_status() {
    let s = setup().await;
    let (_, id) = running_container(&s, "p", "app").await;
    let limits = api::LinuxContainerResources {
        cpu_quota: 50_000,
        cpu_period: 100_000,
        memory_limit_in_bytes: 64 << 20,
        ..Default::default()
    };
    s.cri
        .update_container_resources(&id, Some(limits.clone()))
        .await
        .expect("update resources");
    let st = container_state(&s.cri, &id).await;
    assert_eq!(st.resources.and_then(|r| r.linux), Some(limits));
    let err = s
        .cri
        .update_container_resources("nope", None)
        .await
        .expect_err("unknown");
    assert!(err.is_not_found(), "{err}");

    s.cri.reopen_container_log(&id).await.expect("reopen");
    s.cri
        .stop_container(&id, Duration::ZERO)
        .await
        .expect("stop");
    let err = s
        .cri
        .reopen_container_log(&id)
        .await
        .expect_err("not running");
    assert_eq!(err.code(), Some(Code::Unknown), "{err}");

    let verbose = s.cri.status_verbose(true).await.expect("status");
    assert!(verbose.status.is_some());
    assert_eq!(s.fake.calls_to("Status").len(), 1, "one Status call logged");
}
