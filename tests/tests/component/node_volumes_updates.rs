//! Component tests of how volumes change while a pod runs: atomic updates
//! under a concurrent reader, token rotation driven by a test clock, and
//! the shape of the node's API traffic (one watch per referenced object,
//! nothing listed cluster-wide, watches stopped when unused or immutable).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::node_volumes_support::*;
use base64::Engine;
use keelson_common::clock::Clock;
use keelson_tests::support::{require_root, wait_for};
use kube::api::PostParams;
use serde_json::json;

fn jwt_claims(token: &str) -> serde_json::Value {
    let payload = token.split('.').nth(1).expect("JWT payload");
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload)
        .expect("base64");
    serde_json::from_slice(&bytes).expect("claims")
}

/// Content of version `v` of a key: large enough that a torn write would
/// be visible, uniform so that any mix of versions is detectable.
fn content(key: &str, v: u64) -> String {
    format!("{key}:{v};").repeat(8192)
}

fn version_of(key: &str, text: &str) -> Option<u64> {
    let first = text.split(';').next()?;
    let v: u64 = first.strip_prefix(&format!("{key}:"))?.parse().ok()?;
    (text == content(key, v)).then_some(v)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_reader_never_sees_a_partial_update() {
    if !require_root("concurrent_reader_never_sees_a_partial_update") {
        return;
    }
    let w = World::new(Duration::from_secs(2)).await;
    let (a0, b0) = (content("a", 0), content("b", 0));
    w.create_config_map("atomic", &[("a", &a0), ("b", &b0)])
        .await;
    let pod = w
        .pod(
            "reader",
            json!({
                "containers": [{"name": "app", "image": "busybox", "volumeMounts": [{"name": "cfg", "mountPath": "/cfg"}]}],
                "volumes": [{"name": "cfg", "configMap": {"name": "atomic"}}]
            }),
        )
        .await;
    w.vm.setup_pod(&pod).await.unwrap();
    let dir = volume_dir(&w, &pod, "kubernetes.io~configmap", "cfg");

    let stop = Arc::new(AtomicBool::new(false));
    let reads = Arc::new(AtomicU64::new(0));
    let problems = Arc::new(Mutex::new(Vec::<String>::new()));
    let reader = {
        let (dir, stop, reads, problems) =
            (dir.clone(), stop.clone(), reads.clone(), problems.clone());
        std::thread::spawn(move || {
            let note = |p: String| problems.lock().unwrap().push(p);
            while !stop.load(Ordering::Relaxed) {
                // Through the visible symlinks: each file is one whole version.
                for key in ["a", "b"] {
                    match std::fs::read_to_string(dir.join(key)) {
                        Ok(t) if version_of(key, &t).is_none() => {
                            note(format!("torn {key}: {}…", &t[..20.min(t.len())]))
                        }
                        Ok(_) => {}
                        // The path went through `..data` to the version
                        // that was just replaced and removed (kubelet's
                        // atomic writer removes the old version right
                        // after the swap): a reader retries, as below.
                        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                        Err(e) => note(format!("reading {key}: {e}")),
                    }
                }
                // Through one resolution of ..data: both files of one version.
                let Ok(ts) = std::fs::read_link(dir.join("..data")) else {
                    note("..data missing".into());
                    continue;
                };
                let snap: PathBuf = dir.join(ts);
                let (ra, rb) = (
                    std::fs::read_to_string(snap.join("a")),
                    std::fs::read_to_string(snap.join("b")),
                );
                match (ra, rb) {
                    (Ok(a), Ok(b)) => {
                        let (va, vb) = (version_of("a", &a), version_of("b", &b));
                        if va.is_none() || va != vb {
                            note(format!("mixed snapshot: a={va:?} b={vb:?}"));
                        }
                    }
                    // The snapshot was replaced and removed meanwhile: retry.
                    (Err(e), _) | (_, Err(e)) if e.kind() == std::io::ErrorKind::NotFound => {
                        continue;
                    }
                    (Err(e), _) | (_, Err(e)) => note(format!("reading snapshot: {e}")),
                }
                reads.fetch_add(1, Ordering::Relaxed);
            }
        })
    };

    for v in 1..=15u64 {
        let (a, b) = (content("a", v), content("b", v));
        w.set_config_map("atomic", &[("a", &a), ("b", &b)]).await;
        let d = dir.clone();
        wait_for(
            &format!("version {v} in the volume"),
            Duration::from_secs(5),
            Duration::from_millis(5),
            || {
                let d = d.clone();
                async move {
                    let t = read(&d.join("b"))?;
                    match version_of("b", &t) {
                        Some(got) if got == v => Ok(()),
                        other => Err(format!("{other:?}")),
                    }
                }
            },
        )
        .await
        .unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    reader.join().unwrap();
    let problems = problems.lock().unwrap().clone();
    assert!(problems.is_empty(), "reader saw: {problems:?}");
    assert!(
        reads.load(Ordering::Relaxed) > 50,
        "reader ran {} times",
        reads.load(Ordering::Relaxed)
    );
    w.vm.teardown_pod(&uid(&pod)).await.unwrap();
}

/// A clock the test moves by hand.
#[derive(Debug)]
struct ManualClock(Mutex<jiff::Timestamp>);

impl Clock for ManualClock {
    fn now(&self) -> std::time::SystemTime {
        (*self.0.lock().unwrap()).into()
    }
}

impl ManualClock {
    /// Sets the clock to `secs` after the token's issue time.
    fn at(&self, token: &str, secs: i64) {
        let iat = jwt_claims(token)["iat"].as_i64().unwrap();
        *self.0.lock().unwrap() = jiff::Timestamp::from_second(iat + secs).unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn projected_tokens_rotate_at_eighty_percent() {
    if !require_root("projected_tokens_rotate_at_eighty_percent") {
        return;
    }
    let clock = Arc::new(ManualClock(Mutex::new(jiff::Timestamp::now())));
    let c = clock.clone();
    let w = World::with(Duration::from_secs(1), move |b| b.clock(c)).await;
    let pod = w
        .pod(
            "rot",
            json!({
                "automountServiceAccountToken": false,
                "containers": [{"name": "app", "image": "busybox", "volumeMounts": [{"name": "tok", "mountPath": "/tok"}]}],
                "volumes": [{"name": "tok", "projected": {"sources": [
                    {"serviceAccountToken": {"path": "token", "expirationSeconds": 1000}}
                ]}}]
            }),
        )
        .await;
    w.vm.setup_pod(&pod).await.unwrap();
    let file = volume_dir(&w, &pod, "kubernetes.io~projected", "tok").join("token");
    let first = read(&file).unwrap();
    let claims = jwt_claims(&first);
    assert_eq!(claims["kubernetes.io"]["pod"]["uid"], json!(uid(&pod)));
    assert_eq!(
        claims["exp"].as_i64().unwrap() - claims["iat"].as_i64().unwrap(),
        1000
    );

    // 70 % of the lifetime: still the same token.
    clock.at(&first, 700);
    w.vm.setup_pod(&pod).await.unwrap();
    assert_eq!(read(&file).unwrap(), first);

    // Past 80 % (and the 10 s jitter): a new token, bound to the same pod.
    clock.at(&first, 811);
    w.vm.setup_pod(&pod).await.unwrap();
    let second = read(&file).unwrap();
    assert_ne!(second, first);
    let c2 = jwt_claims(&second);
    assert_eq!(c2["kubernetes.io"]["pod"]["uid"], json!(uid(&pod)));
    assert_ne!(c2["jti"], claims["jti"]);

    // The manager's own periodic sync rotates without the pod workers.
    clock.at(&second, 811);
    wait_for(
        "rotation by the periodic sync",
        Duration::from_secs(5),
        Duration::from_millis(50),
        || async {
            let now = read(&file)?;
            if now != second {
                Ok(())
            } else {
                Err("token unchanged".into())
            }
        },
    )
    .await
    .unwrap();

    // TokenRequest failing: the cached token is served while valid...
    let third = read(&file).unwrap();
    w.api
        .knobs()
        .fail_next(1000, Some("create"), Some("serviceaccounts/token"), 500);
    clock.at(&third, 900);
    w.vm.setup_pod(&pod).await.unwrap();
    assert_eq!(read(&file).unwrap(), third);
    assert!(
        w.api
            .knobs()
            .requests()
            .iter()
            .any(|r| r.subresource == "token" && r.status == 500),
        "a refresh was attempted"
    );
    // ...and once it expired the volume keeps its last content, with an event.
    clock.at(&third, 1001);
    w.vm.setup_pod(&pod).await.unwrap();
    assert_eq!(read(&file).unwrap(), third);
    w.wait_event(
        "rot",
        "FailedMount",
        "MountVolume.SetUp failed for volume \"tok\"",
    )
    .await;
    w.api.knobs().clear_failures();
    w.vm.teardown_pod(&uid(&pod)).await.unwrap();
}

fn query_has_name_selector(query: &str, name: &str) -> bool {
    query.contains(&format!("fieldSelector=metadata.name%3D{name}"))
        || query.contains(&format!("fieldSelector=metadata.name={name}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_watch_per_referenced_object() {
    if !require_root("one_watch_per_referenced_object") {
        return;
    }
    let w = World::new(Duration::from_secs(30)).await;
    w.create_config_map("one", &[("k", "v")]).await;
    w.create_secret("two", &[("k", b"v")]).await;
    let frozen = k8s_openapi::api::core::v1::ConfigMap {
        metadata: kube::api::ObjectMeta {
            name: Some("frozen".into()),
            ..Default::default()
        },
        data: Some([("k".to_string(), "v".to_string())].into()),
        immutable: Some(true),
        ..Default::default()
    };
    w.config_maps()
        .create(&PostParams::default(), &frozen)
        .await
        .unwrap();
    w.api.knobs().clear_requests();
    let pod = w
        .pod(
            "watcher",
            json!({
                "automountServiceAccountToken": false,
                "containers": [{"name": "app", "image": "busybox",
                    "env": [{"name": "S", "valueFrom": {"secretKeyRef": {"name": "two", "key": "k"}}}],
                    "volumeMounts": [{"name": "a", "mountPath": "/a"}, {"name": "f", "mountPath": "/f"}]}],
                "volumes": [{"name": "a", "configMap": {"name": "one"}}, {"name": "f", "configMap": {"name": "frozen"}}]
            }),
        )
        .await;
    w.vm.setup_pod(&pod).await.unwrap();
    assert_eq!(
        w.vm.env_secret_key(
            "default",
            &serde_json::from_value(json!({"name": "two", "key": "k"})).unwrap()
        )
        .await
        .unwrap(),
        Some("v".into())
    );
    // The immutable ConfigMap stopped its watch after the first read.
    let (cms, secrets) = w.vm.open_watches();
    assert_eq!((cms, secrets), (1, 1));

    let requests = w.api.knobs().requests();
    let node_reads: Vec<_> = requests
        .iter()
        .filter(|r| r.resource == "configmaps" || r.resource == "secrets")
        .filter(|r| r.verb != "create" && r.verb != "update")
        .collect();
    assert!(!node_reads.is_empty());
    for r in &node_reads {
        assert!(
            (r.verb == "list" || r.verb == "watch")
                && (query_has_name_selector(&r.query, "one")
                    || query_has_name_selector(&r.query, "two")
                    || query_has_name_selector(&r.query, "frozen")),
            "the node read more than single referenced objects: {} {} ?{}",
            r.verb,
            r.path,
            r.query
        );
    }
    assert!(node_reads.iter().all(|r| r.namespace == "default"));

    // Pod gone: its watches stop.
    w.vm.unregister_pod(&uid(&pod));
    assert_eq!(w.vm.open_watches(), (0, 0));
    w.vm.remove_pod_dir(&uid(&pod)).await.unwrap();
    assert!(!w.vm.pod_dir(&uid(&pod)).exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_server_unreachable_then_back() {
    if !require_root("api_server_unreachable_then_back") {
        return;
    }
    let w = World::new(Duration::from_secs(1)).await;
    w.create_config_map("late", &[("k", "v")]).await;
    let pod = w
        .pod(
            "offline",
            json!({
                "automountServiceAccountToken": false,
                "containers": [{"name": "app", "image": "busybox", "volumeMounts": [{"name": "a", "mountPath": "/a"}]}],
                "volumes": [{"name": "a", "configMap": {"name": "late"}}]
            }),
        )
        .await;
    w.api.knobs().refuse_connections();
    let err = w.vm.setup_pod(&pod).await.unwrap_err().to_string();
    assert!(
        err.ends_with("MountVolume.SetUp failed for volume \"a\" : failed to sync configmap cache: timed out waiting for the condition"),
        "{err}"
    );
    w.api.knobs().resume();
    let dir = volume_dir(&w, &pod, "kubernetes.io~configmap", "a");
    let vm = w.vm.clone();
    wait_for(
        "volume set up once the API is back",
        Duration::from_secs(15),
        Duration::from_millis(100),
        || {
            let (vm, pod) = (vm.clone(), pod.clone());
            async move { vm.setup_pod(&pod).await.map_err(|e| e.to_string()) }
        },
    )
    .await
    .unwrap();
    assert_eq!(read(&dir.join("k")).unwrap(), "v");
    assert!(Path::new(&dir).is_dir());
    w.vm.teardown_pod(&uid(&pod)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_watches_pause_and_resume_on_read() {
    if !require_root("idle_watches_pause_and_resume_on_read") {
        return;
    }
    let w = World::with(Duration::from_secs(30), |b| {
        b.watch_idle_limit(Duration::from_millis(200))
    })
    .await;
    w.create_config_map("env-only", &[("k", "v1")]).await;
    let pod = w
        .pod(
            "idle",
            json!({
                "automountServiceAccountToken": false,
                "containers": [{"name": "app", "image": "busybox",
                    "env": [{"name": "K", "valueFrom": {"configMapKeyRef": {"name": "env-only", "key": "k"}}}]}]
            }),
        )
        .await;
    w.vm.register_pod(&pod);
    let sel = serde_json::from_value(json!({"name": "env-only", "key": "k"})).unwrap();
    assert_eq!(
        w.vm.env_config_map_key("default", &sel).await.unwrap(),
        Some("v1".into())
    );
    assert_eq!(w.vm.open_watches(), (1, 0));

    // Not read for the idle limit: the watch pauses.
    let vm = w.vm.clone();
    wait_for(
        "idle watch paused",
        Duration::from_secs(5),
        Duration::from_millis(50),
        || {
            let vm = vm.clone();
            async move {
                vm.recycle_idle_watches();
                match vm.open_watches() {
                    (0, 0) => Ok(()),
                    other => Err(format!("{other:?} watches open")),
                }
            }
        },
    )
    .await
    .unwrap();

    // Changed while paused; the next read lists it afresh.
    w.set_config_map("env-only", &[("k", "v2")]).await;
    assert_eq!(
        w.vm.env_config_map_key("default", &sel).await.unwrap(),
        Some("v2".into())
    );
    assert_eq!(w.vm.open_watches(), (1, 0));
}
