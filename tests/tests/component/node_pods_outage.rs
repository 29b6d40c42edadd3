//! Component tests of an API server outage: pods keep running, a crashed
//! container is still restarted, nothing is killed; once the API server is
//! back the status catches up. A watch whose resourceVersion was compacted
//! away (410 Gone) makes the pod source list again.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use crate::node_pods_support::*;
use keelson_tests::support::wait_for;
use serde_json::json;

const T: Duration = Duration::from_secs(20);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_keep_running_and_restarting_while_the_api_is_down() {
    let w = World::new().await;
    w.create_pod("steady", busybox(json!({}))).await;
    let p = w.wait_phase("steady", "Running", T).await;
    let id = container_status(&p, "app")
        .unwrap()
        .container_id
        .clone()
        .unwrap();
    let id = id.trim_start_matches("containerd://").to_string();
    let creates = w.fake.calls_to("CreateContainer").len();

    w.api.knobs().refuse_connections();
    w.fake.exit_container(&id, 7, None).unwrap();
    wait_for(
        "restarted during the outage",
        T,
        Duration::from_millis(50),
        || async {
            if w.fake.calls_to("CreateContainer").len() > creates {
                Ok(())
            } else {
                Err("not yet".to_string())
            }
        },
    )
    .await
    .unwrap();
    // Give the status writer time to fail a few times.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        w.fake.calls_to("StopPodSandbox").is_empty(),
        "nothing stopped for an API outage"
    );
    assert!(
        w.metrics()
            .contains("keelson_pod_status_patches_total{result=\"error\"}")
    );

    w.api.knobs().resume();
    let p = w
        .wait_pod("steady", "status caught up", Duration::from_secs(30), |p| {
            let c = container_status(p, "app").ok_or("no status")?;
            if c.restart_count == 1 && c.ready {
                Ok(p.clone())
            } else {
                Err(format!("{c:?}"))
            }
        })
        .await;
    let last = container_status(&p, "app")
        .unwrap()
        .last_state
        .clone()
        .unwrap()
        .terminated
        .unwrap();
    assert_eq!(last.exit_code, 7);
}

/// Pod lists of this node's pods (the pod source's initial list and its
/// relists) the API server answered since its request log was cleared.
fn node_pod_lists(w: &World) -> usize {
    w.api
        .knobs()
        .requests()
        .iter()
        .filter(|r| {
            r.verb == "list"
                && r.resource == "pods"
                && r.status == 200
                && r.query.contains("spec.nodeName")
        })
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compacted_watch_relists_and_new_pods_still_start() {
    let w = World::new().await;
    w.create_pod("first", busybox(json!({}))).await;
    w.wait_phase("first", "Running", T).await;

    // A dropped watch resumes from its resourceVersion: no new list.
    w.api.knobs().clear_requests();
    w.api.knobs().drop_watches();
    w.create_pod("second", busybox(json!({}))).await;
    w.wait_phase("second", "Running", T).await;
    assert_eq!(node_pod_lists(&w), 0, "a plain reconnect does not relist");

    // Once that resourceVersion is compacted away the resumed watch gets
    // 410 Gone; the source lists again and sees the new pod. The watches
    // are closed (and the API refuses service) before compacting, so the
    // source cannot see a change newer than the compaction first.
    w.api.knobs().refuse_connections();
    wait_for(
        "every watch closed",
        T,
        Duration::from_millis(20),
        || async {
            match w.api.knobs().active_watches() {
                0 => Ok(()),
                n => Err(format!("{n} watches open")),
            }
        },
    )
    .await
    .unwrap();
    w.api.knobs().compact();
    w.api.knobs().resume();
    w.create_pod("third", busybox(json!({}))).await;
    w.wait_phase("third", "Running", T).await;
    assert!(node_pod_lists(&w) >= 1, "relisted after 410 Gone");
    // The pods seen before keep running untouched.
    for name in ["first", "second"] {
        let p = w.get(name).await.unwrap();
        let c = container_status(&p, "app").unwrap();
        assert_eq!((c.restart_count, c.ready), (0, true), "{name}");
    }
    assert!(w.fake.calls_to("StopPodSandbox").is_empty());
    assert_eq!(w.fake.calls_to("RunPodSandbox").len(), 3);
}
