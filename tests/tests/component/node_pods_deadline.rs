//! Component tests of `activeDeadlineSeconds` (test API server + fake CRI
//! runtime + the pod lifecycle, on tokio's paused clock): the pod ends
//! `Failed` / `DeadlineExceeded` with kubelet's message and a Normal event,
//! its containers are stopped, and it is not restarted.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use crate::node_pods_support::*;
use serde_json::json;

const T: Duration = Duration::from_secs(60);

#[tokio::test(start_paused = true)]
async fn a_pod_past_its_active_deadline_fails_and_its_containers_stop() {
    let w = World::with(Options {
        paused: true,
        ..Options::default()
    })
    .await;
    let mut spec = busybox(json!({}));
    spec["activeDeadlineSeconds"] = json!(5);
    spec["restartPolicy"] = json!("Always");
    w.create_pod("job", spec).await;
    let running = w.wait_phase("job", "Running", T).await;
    let started: std::time::SystemTime = running
        .status
        .as_ref()
        .unwrap()
        .start_time
        .clone()
        .unwrap()
        .0
        .into();
    let p = w.wait_phase("job", "Failed", T).await;
    let s = p.status.clone().unwrap();
    assert_eq!(s.reason.as_deref(), Some("DeadlineExceeded"));
    assert_eq!(
        s.message.as_deref(),
        Some("Pod was active on the node longer than the specified deadline")
    );
    // Not before the deadline (the clock is tokio's paused one).
    let now = w.clock.now();
    assert!(
        now.duration_since(started).unwrap() >= Duration::from_secs(5),
        "failed {:?} after start",
        now.duration_since(started)
    );
    w.wait_event(
        "job",
        "DeadlineExceeded",
        "Pod was active on the node longer than the specified deadline",
        T,
    )
    .await;
    // The container is stopped and stays stopped (Always does not restart
    // a terminal pod).
    let p = w
        .wait_pod(
            "job",
            "container terminated",
            T,
            |p| match container_status(p, "app")
                .and_then(|c| c.state.clone())
                .and_then(|st| st.terminated)
            {
                Some(t) => Ok((p.clone(), t)),
                None => Err(format!("{:?}", container_status(p, "app"))),
            },
        )
        .await;
    assert_eq!(p.1.exit_code, 143);
    assert_eq!(
        condition(&p.0, "Ready")
            .and_then(|c| c.reason.clone())
            .as_deref(),
        Some("PodFailed")
    );
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(
        w.fake.calls_to("StartContainer").len(),
        1,
        "never restarted"
    );
    let p = w.get("job").await.unwrap();
    assert_eq!(p.status.unwrap().phase.as_deref(), Some("Failed"));
}
