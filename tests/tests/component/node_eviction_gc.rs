//! Component tests of container and image garbage collection against the
//! fake CRI runtime (real gRPC on a unix socket): which dead containers,
//! sandboxes, pod log directories and images go, and which stay.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use keelson::node::gc::images::ImageFsUsage;
use keelson::node::gc::{
    ContainerGc, ContainerGcPolicy, ImageGc, ImageGcMetrics, ImageGcPolicy, PodState,
};
use keelson_cri::fake::{FakeImage, FakeRuntime};
use keelson_cri::{RuntimeClient, api, image_spec};
use tokio::time::Instant;

const BUSYBOX: &str = "keelson.local/busybox:1";

#[derive(Default)]
struct Pods {
    /// UIDs whose content may be removed (deleted or evicted).
    gone: Mutex<BTreeSet<String>>,
    /// UIDs whose runtime may be removed (terminated).
    terminated: Mutex<BTreeSet<String>>,
    ready: Mutex<bool>,
}

impl PodState for Pods {
    fn should_pod_content_be_removed(&self, uid: &str) -> bool {
        self.gone.lock().expect("lock").contains(uid)
    }
    fn should_pod_runtime_be_removed(&self, uid: &str) -> bool {
        self.terminated.lock().expect("lock").contains(uid)
            || self.should_pod_content_be_removed(uid)
    }
    fn all_sources_ready(&self) -> bool {
        *self.ready.lock().expect("lock")
    }
}

struct Setup {
    dir: tempfile::TempDir,
    fake: FakeRuntime,
    cri: RuntimeClient,
}

async fn setup() -> Setup {
    let dir = tempfile::tempdir().expect("tempdir");
    let fake = FakeRuntime::start(dir.path().join("cri.sock"))
        .await
        .expect("fake");
    fake.add_image(BUSYBOX);
    let cri = RuntimeClient::connect(&fake.endpoint(), Duration::from_secs(10))
        .await
        .expect("connect");
    Setup { dir, fake, cri }
}

fn labels(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn sandbox_config(pod: &str, attempt: u32) -> api::PodSandboxConfig {
    let uid = format!("uid-{pod}");
    api::PodSandboxConfig {
        metadata: Some(api::PodSandboxMetadata {
            name: pod.into(),
            uid: uid.clone(),
            namespace: "default".into(),
            attempt,
        }),
        labels: labels(&[
            ("io.kubernetes.pod.uid", &uid),
            ("io.kubernetes.pod.name", pod),
        ]),
        ..Default::default()
    }
}

async fn sandbox(s: &Setup, pod: &str, attempt: u32) -> String {
    s.cri
        .run_pod_sandbox(sandbox_config(pod, attempt), "")
        .await
        .expect("sandbox")
}

/// A container of `pod` that ran and exited (or still runs).
async fn container(
    s: &Setup,
    sb: &str,
    pod: &str,
    name: &str,
    attempt: u32,
    running: bool,
) -> String {
    let uid = format!("uid-{pod}");
    let cfg = api::ContainerConfig {
        metadata: Some(api::ContainerMetadata {
            name: name.into(),
            attempt,
        }),
        image: Some(image_spec(BUSYBOX)),
        labels: labels(&[
            ("io.kubernetes.pod.uid", &uid),
            ("io.kubernetes.container.name", name),
        ]),
        ..Default::default()
    };
    let id = s
        .cri
        .create_container(sb, cfg, sandbox_config(pod, 0))
        .await
        .expect("create");
    s.cri.start_container(&id).await.expect("start");
    if !running {
        s.fake.exit_container(&id, 1, None).expect("exit");
    }
    id
}

fn container_ids(fake: &FakeRuntime) -> BTreeSet<String> {
    fake.containers().into_iter().map(|c| c.id).collect()
}

fn sandbox_ids(fake: &FakeRuntime) -> BTreeSet<String> {
    fake.sandboxes().into_iter().map(|s| s.id).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn container_gc_keeps_the_last_dead_container_and_clears_gone_pods() {
    let s = setup().await;
    let logs = s.dir.path().join("pod-logs");
    for pod in ["kept", "gone"] {
        std::fs::create_dir_all(logs.join(format!("default_{pod}_uid-{pod}/app"))).expect("logs");
    }
    // A live pod: three dead attempts of "app", one running "sidecar",
    // an old dead sandbox and its current one.
    let old_sb = sandbox(&s, "kept", 0).await;
    s.cri
        .stop_pod_sandbox(&old_sb)
        .await
        .expect("stop old sandbox");
    let sb = sandbox(&s, "kept", 1).await;
    let a0 = container(&s, &sb, "kept", "app", 0, false).await;
    let a1 = container(&s, &sb, "kept", "app", 1, false).await;
    let a2 = container(&s, &sb, "kept", "app", 2, false).await;
    let side = container(&s, &sb, "kept", "sidecar", 0, true).await;
    // A deleted pod: its sandbox stopped, two dead containers.
    let gone_sb = sandbox(&s, "gone", 0).await;
    let g0 = container(&s, &gone_sb, "gone", "app", 0, false).await;
    let g1 = container(&s, &gone_sb, "gone", "app", 1, false).await;
    s.cri.stop_pod_sandbox(&gone_sb).await.expect("stop");

    let pods = Arc::new(Pods::default());
    pods.gone.lock().expect("lock").insert("uid-gone".into());
    let gc = ContainerGc::new(
        s.cri.clone(),
        pods.clone(),
        ContainerGcPolicy::default(),
        logs.clone(),
        None,
    );

    // Sources not ready yet: only the per-container limit applies.
    gc.garbage_collect(false).await.expect("gc");
    let ids = container_ids(&s.fake);
    assert!(
        !ids.contains(&a0) && !ids.contains(&a1),
        "older dead attempts removed"
    );
    assert!(
        ids.contains(&a2),
        "the newest dead attempt is kept for logs"
    );
    assert!(ids.contains(&side), "running containers are never removed");
    assert!(
        ids.contains(&g1) && !ids.contains(&g0),
        "a gone pod keeps its newest until sources are ready"
    );
    assert!(
        !sandbox_ids(&s.fake).contains(&old_sb),
        "an old dead sandbox without containers goes"
    );
    assert!(sandbox_ids(&s.fake).contains(&sb));
    assert!(
        logs.join("default_gone_uid-gone").exists(),
        "logs stay until sources are ready"
    );

    // Every source listed: everything of the gone pod goes.
    *pods.ready.lock().expect("lock") = true;
    gc.garbage_collect(false).await.expect("gc");
    let ids = container_ids(&s.fake);
    assert!(!ids.contains(&g1));
    assert!(ids.contains(&a2) && ids.contains(&side));
    assert!(!sandbox_ids(&s.fake).contains(&gone_sb));
    assert!(
        sandbox_ids(&s.fake).contains(&sb),
        "the live pod's sandbox stays"
    );
    assert!(!logs.join("default_gone_uid-gone").exists());
    assert!(logs.join("default_kept_uid-kept").exists());

    // Eviction's reclaim (terminated pods too): a terminated pod's dead container goes.
    pods.terminated
        .lock()
        .expect("lock")
        .insert("uid-kept".into());
    gc.garbage_collect(false).await.expect("gc");
    assert!(container_ids(&s.fake).contains(&a2), "periodic GC keeps it");
    gc.garbage_collect(true).await.expect("gc");
    let ids = container_ids(&s.fake);
    assert!(!ids.contains(&a2));
    assert!(ids.contains(&side), "still running");
    let removed: Vec<_> = s
        .fake
        .calls_to("RemoveContainer")
        .into_iter()
        .map(|c| c.subject)
        .collect();
    assert!(
        !removed.iter().any(|id| id.starts_with(&side[..12])),
        "{removed:?}"
    );
}

fn image(id: u8, size: u64, pinned: bool) -> FakeImage {
    FakeImage {
        id: format!("sha256:{id:064x}"),
        repo_tags: vec![format!("keelson.local/img{id}:1")],
        repo_digests: vec![],
        size,
        pinned,
        uid: None,
        username: String::new(),
    }
}

fn image_ids(fake: &FakeRuntime) -> BTreeSet<String> {
    fake.images().into_iter().map(|i| i.id).collect()
}

fn gc_with(s: &Setup, min_age: Duration, max_age: Duration) -> ImageGc {
    ImageGc::new(
        s.cri.clone(),
        ImageGcPolicy {
            high_threshold_percent: 85,
            low_threshold_percent: 80,
            min_age,
            max_age,
        },
        None,
        "n1",
        ImageGcMetrics::unregistered(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn image_gc_frees_least_recently_used_unused_images_down_to_the_low_threshold() {
    let s = setup().await;
    for (id, size, pinned) in [
        (1u8, 60, false),
        (2, 70, false),
        (3, 500, true),
        (4, 80, false),
    ] {
        s.fake.add_image_with(image(id, size, pinned));
    }
    // A container uses the busybox image.
    let sb = sandbox(&s, "p", 0).await;
    container(&s, &sb, "p", "app", 0, true).await;
    let busybox_id = s
        .cri
        .image_status(image_spec(BUSYBOX))
        .await
        .expect("status")
        .expect("present")
        .id;
    let gc = gc_with(&s, Duration::ZERO, Duration::ZERO);
    let began = Instant::now();
    gc.detect_images(began).await.expect("detect");
    // Below the high threshold (84 % used): nothing happens.
    gc.garbage_collect_with(
        began,
        ImageFsUsage {
            capacity: 1000,
            available: 160,
        },
    )
    .await
    .expect("gc");
    assert_eq!(image_ids(&s.fake).len(), 5);
    // 90 % used: free 1000 × 20 % − 100 = 100 bytes, oldest unused first
    // (img1 60 + img2 70), never the pinned one or the one in use.
    gc.garbage_collect_with(
        began,
        ImageFsUsage {
            capacity: 1000,
            available: 100,
        },
    )
    .await
    .expect("gc");
    let left = image_ids(&s.fake);
    assert!(
        !left.contains(&image(1, 0, false).id) && !left.contains(&image(2, 0, false).id),
        "{left:?}"
    );
    assert!(
        left.contains(&image(4, 0, false).id),
        "freed enough before img4"
    );
    assert!(left.contains(&image(3, 0, false).id), "pinned");
    assert!(left.contains(&busybox_id), "in use");
    // Not enough left to free: an error (FreeDiskSpaceFailed), what could go went.
    let e = gc
        .garbage_collect_with(
            began,
            ImageFsUsage {
                capacity: 1000,
                available: 0,
            },
        )
        .await
        .expect_err("cannot free 200 bytes");
    assert!(
        matches!(
            e,
            keelson::node::gc::GcError::NotEnoughFreed {
                wanted: 200,
                freed: 80
            }
        ),
        "{e}"
    );
    assert!(
        e.to_string()
            .contains("Attempted to free 200 bytes, but only found 80 bytes eligible to free"),
        "{e}"
    );
    assert_eq!(image_ids(&s.fake).len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn image_gc_respects_minimum_age_and_removes_by_maximum_age() {
    let s = setup().await;
    s.fake.add_image_with(image(1, 100, false));
    let young = gc_with(&s, Duration::from_secs(3600), Duration::ZERO);
    let began = Instant::now();
    young
        .garbage_collect_with(
            began,
            ImageFsUsage {
                capacity: 1000,
                available: 0,
            },
        )
        .await
        .expect_err("nothing old enough to free");
    assert!(
        image_ids(&s.fake).contains(&image(1, 0, false).id),
        "younger than imageMinimumGCAge"
    );

    // imageMaximumGCAge: once keelson ran longer than it, unused images go
    // even without disk pressure.
    let aged = gc_with(&s, Duration::ZERO, Duration::from_millis(200));
    let began = Instant::now();
    aged.detect_images(began).await.expect("detect");
    aged.garbage_collect_with(
        began,
        ImageFsUsage {
            capacity: 1000,
            available: 900,
        },
    )
    .await
    .expect("gc");
    assert!(
        image_ids(&s.fake).contains(&image(1, 0, false).id),
        "not yet: keelson started < max age ago"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    aged.garbage_collect_with(
        began,
        ImageFsUsage {
            capacity: 1000,
            available: 900,
        },
    )
    .await
    .expect("gc");
    // Both unused images are older than the maximum age: both go.
    assert!(image_ids(&s.fake).is_empty(), "{:?}", image_ids(&s.fake));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_unused_images_removes_every_unused_unpinned_image() {
    let s = setup().await;
    s.fake.add_image_with(image(1, 10, false));
    s.fake.add_image_with(image(2, 10, true));
    let sb = sandbox(&s, "p", 0).await;
    container(&s, &sb, "p", "app", 0, false).await;
    let gc = gc_with(&s, Duration::ZERO, Duration::ZERO);
    gc.delete_unused_images().await.expect("delete");
    let left = image_ids(&s.fake);
    assert!(!left.contains(&image(1, 0, false).id));
    assert!(left.contains(&image(2, 0, false).id), "pinned");
    assert_eq!(
        left.len(),
        2,
        "busybox is used by a dead container: kept {left:?}"
    );
}
