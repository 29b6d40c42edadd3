//! Component tests of the PLEG: with CRI events (containerd ≥ 1.7) a
//! container's exit is acted on at once; without (containerd 1.6 answers
//! Unimplemented) the 1 s relist finds it; a broken event stream falls
//! back to relisting; PLEG health and metrics.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use crate::node_pods_support::*;
use keelson::node::pods::pleg::EventsMode;
use keelson_cri::fake::FakeConfig;
use keelson_tests::support::wait_for;
use serde_json::json;

const T: Duration = Duration::from_secs(20);

async fn exit_and_time_restart(w: &World, name: &str) -> Duration {
    let p = w.wait_phase(name, "Running", T).await;
    let id = container_status(&p, "app")
        .unwrap()
        .container_id
        .clone()
        .unwrap();
    let id = id.trim_start_matches("containerd://").to_string();
    let creates = w.fake.calls_to("CreateContainer").len();
    let t0 = Instant::now();
    w.fake.exit_container(&id, 1, None).unwrap();
    wait_for("restart", T, Duration::from_millis(10), || async {
        if w.fake.calls_to("CreateContainer").len() > creates {
            Ok(())
        } else {
            Err("not restarted".to_string())
        }
    })
    .await
    .unwrap();
    t0.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relist_only_when_the_runtime_has_no_events() {
    let w = World::with(Options {
        fake: FakeConfig {
            container_events: false,
            ..Default::default()
        },
        ..Default::default()
    })
    .await;
    w.create_pod("relisted", busybox(json!({}))).await;
    let took = exit_and_time_restart(&w, "relisted").await;
    assert!(
        took < Duration::from_secs(3),
        "relist found the exit in {took:?}"
    );
    wait_for(
        "events mode known",
        T,
        Duration::from_millis(50),
        || async {
            match w.handle.pleg_health().events_mode() {
                EventsMode::Unimplemented => Ok(()),
                m => Err(format!("{m:?}")),
            }
        },
    )
    .await
    .unwrap();
    assert!(w.handle.pleg_health().check().is_ok());
    wait_for("PLEG metrics", T, Duration::from_millis(100), || async {
        let m = w.metrics();
        if m.contains("kubelet_pleg_relist_duration_seconds_count")
            && m.contains("kubelet_running_pods 1")
        {
            Ok(())
        } else {
            Err(m
                .lines()
                .filter(|l| l.starts_with("kubelet_running") || l.starts_with("kubelet_pleg"))
                .collect::<Vec<_>>()
                .join("; "))
        }
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_wake_the_worker_at_once() {
    let w = World::new().await;
    w.create_pod("evented", busybox(json!({}))).await;
    wait_for("streaming", T, Duration::from_millis(50), || async {
        match w.handle.pleg_health().events_mode() {
            EventsMode::Streaming => Ok(()),
            m => Err(format!("{m:?}")),
        }
    })
    .await
    .unwrap();
    let took = exit_and_time_restart(&w, "evented").await;
    assert!(
        took < Duration::from_millis(900),
        "event-driven restart took {took:?}"
    );
    assert!(
        w.metrics()
            .contains("kubelet_evented_pleg_connection_success_count 1")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broken_event_stream_falls_back_to_relisting() {
    let w = World::new().await;
    w.create_pod("fallback", busybox(json!({}))).await;
    w.wait_phase("fallback", "Running", T).await;
    // The runtime restarts: the stream breaks; relisting keeps working.
    w.fake.restart().unwrap();
    let took = exit_and_time_restart(&w, "fallback").await;
    assert!(took < Duration::from_secs(3), "{took:?}");
}
