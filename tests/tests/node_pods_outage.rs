//! Component tests of an API server outage: pods keep running, a crashed
//! container is still restarted, nothing is killed; once the API server is
//! back the status catches up.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod node_pods_support;

use std::time::Duration;

use keelson_tests::support::wait_for;
use node_pods_support::*;
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
