//! Component test of an API server outage: the node role keeps running,
//! touches nothing in the runtime, keeps trying, and once the API server is
//! back the Node status (including a change that happened during the
//! outage) and the Lease are current within one status period.
//!
//! Time is scaled down tenfold: status every 1 s (kubelet 10 s), Lease
//! renewed every 0.5 s, outages of 6 s (the 60 s).

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use k8s_openapi::api::core::v1::Node;
use keelson::config::KubeDuration;
use keelson::node::NodeOverrides;
use keelson_cri::fake::FakeConfig;
use keelson_tests::node_harness::{InProcessNode, NodeHarnessOptions, condition};
use keelson_tests::support::wait_for;

const PERIOD: Duration = Duration::from_secs(1);
const OUTAGE: Duration = Duration::from_secs(6);
/// One period plus its jitter and the time one request takes to come back.
const CATCH_UP: Duration = Duration::from_millis(2500);

fn heartbeat_after(n: &Node, t: SystemTime, status: &str) -> Result<(), String> {
    let c = condition(n, "Ready").ok_or("no Ready")?;
    let hb = c.last_heartbeat_time.as_ref().ok_or("no heartbeat")?;
    let since = jiff::Timestamp::try_from(t).map_err(|e| e.to_string())?;
    // Times are whole seconds: a heartbeat in the same second counts.
    if hb.0.as_second() >= since.as_second() && c.status == status {
        Ok(())
    } else {
        Err(format!("Ready={} heartbeat {}", c.status, hb.0))
    }
}

async fn lease_renewed_after(node: &InProcessNode, t: SystemTime) -> Result<(), String> {
    let lease = node.lease().await?.ok_or("no lease")?;
    let renew = lease
        .spec
        .and_then(|s| s.renew_time)
        .ok_or("no renewTime")?;
    let since = jiff::Timestamp::try_from(t).map_err(|e| e.to_string())?;
    if renew.0 >= since {
        Ok(())
    } else {
        Err(format!("renewTime {}", renew.0))
    }
}

fn destructive_calls(node: &InProcessNode) -> Vec<String> {
    node.fake
        .calls()
        .into_iter()
        .map(|c| c.method)
        .filter(|m| {
            matches!(
                *m,
                "StopPodSandbox" | "RemovePodSandbox" | "StopContainer" | "RemoveContainer"
            )
        })
        .map(String::from)
        .collect()
}

async fn outage_and_recovery(node: &InProcessNode, refuse: bool, change_ready_to: bool) {
    let knobs = node.api.knobs();
    if refuse {
        knobs.refuse_connections();
    } else {
        knobs.stop_answering();
    }
    // Something changes while the API server is away.
    if change_ready_to {
        node.fake.set_runtime_ready(true, "", "");
    } else {
        node.fake
            .set_runtime_ready(false, "Maintenance", "runtime paused");
    }
    tokio::time::sleep(OUTAGE).await;
    knobs.resume();
    let resumed_wall = SystemTime::now();
    let resumed = Instant::now();
    let want = if change_ready_to { "True" } else { "False" };
    node.wait_node(
        "status current after the outage",
        Duration::from_secs(10),
        |n| heartbeat_after(n, resumed_wall, want),
    )
    .await
    .expect("status catches up");
    let status_after = resumed.elapsed();
    wait_for(
        "lease current after the outage",
        Duration::from_secs(10),
        Duration::from_millis(50),
        || lease_renewed_after(node, resumed_wall),
    )
    .await
    .expect("lease catches up");
    let lease_after = resumed.elapsed();
    assert!(
        status_after <= CATCH_UP,
        "status current {status_after:?} after recovery (refuse={refuse}); want within one period"
    );
    assert!(
        lease_after <= CATCH_UP,
        "lease renewed {lease_after:?} after recovery (refuse={refuse})"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_api_outage_loses_nothing_and_is_caught_up_within_a_period() {
    let node = InProcessNode::start(NodeHarnessOptions {
        configure: Some(Arc::new(|c| {
            c.node.node_status_update_frequency = KubeDuration::from_secs(PERIOD.as_secs());
            c.node.node_lease_duration_seconds = 2;
        })),
        fake: FakeConfig {
            runtime_version: "1.7.13".into(),
            ..FakeConfig::default()
        },
        overrides: NodeOverrides {
            runtime_status_period: Some(Duration::from_millis(200)),
            ..NodeOverrides::default()
        },
        ..NodeHarnessOptions::default()
    })
    .await
    .expect("node");
    node.wait_node("Ready", Duration::from_secs(15), |n| {
        condition(n, "Ready")
            .filter(|c| c.status == "True")
            .map(|_| ())
            .ok_or_else(|| "not ready".to_string())
    })
    .await
    .expect("ready");
    wait_for(
        "lease",
        Duration::from_secs(10),
        Duration::from_millis(50),
        || async {
            node.lease()
                .await?
                .map(|_| ())
                .ok_or_else(|| "no lease".to_string())
        },
    )
    .await
    .expect("lease");

    // A server that hangs, then one that refuses connections.
    outage_and_recovery(&node, false, false).await;
    outage_and_recovery(&node, true, true).await;

    assert!(
        destructive_calls(&node).is_empty(),
        "nothing may be stopped or removed because the API server was away: {:?}",
        destructive_calls(&node)
    );
    let m = node.metrics_text();
    assert!(
        m.contains("keelson_node_status_updates_total{result=\"error\"}"),
        "{m}"
    );
    assert!(
        m.contains("keelson_node_lease_renewals_total{result=\"error\"}"),
        "{m}"
    );
}
