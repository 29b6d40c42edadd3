//! Component tests of runtime health in the Ready condition: the fake CRI
//! runtime's RuntimeReady/NetworkReady conditions and its outages flip
//! the Node's Ready condition with kubelet's reasons, messages and events,
//! and it recovers by itself. The runtime is asked every 200 ms here
//! (kubelet: 5 s) so each flip takes about a second.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Event, Node};
use keelson::config::KubeDuration;
use keelson::node::NodeOverrides;
use keelson_tests::node_harness::{InProcessNode, NodeHarnessOptions, condition};
use keelson_tests::support::wait_for;
use kube::Api;
use kube::api::ListParams;

async fn start() -> InProcessNode {
    InProcessNode::start(NodeHarnessOptions {
        configure: Some(Arc::new(|c| {
            c.node.node_status_update_frequency = KubeDuration::from_secs(1);
        })),
        fake: keelson_cri::fake::FakeConfig {
            runtime_version: "1.7.13".into(),
            ..Default::default()
        },
        overrides: NodeOverrides {
            runtime_status_period: Some(Duration::from_millis(200)),
            runtime_down_after: Some(Duration::from_secs(2)),
            ..NodeOverrides::default()
        },
        ..NodeHarnessOptions::default()
    })
    .await
    .expect("node")
}

fn ready_is(n: &Node, status: &str) -> Result<Node, String> {
    match condition(n, "Ready") {
        Some(c) if c.status == status => Ok(n.clone()),
        Some(c) => Err(format!("Ready={} ({:?})", c.status, c.message)),
        None => Err("no Ready condition".into()),
    }
}

async fn event_reasons(node: &InProcessNode) -> Vec<String> {
    Api::<Event>::namespaced(node.admin.clone(), "default")
        .list(&ListParams::default())
        .await
        .map(|l| {
            l.items
                .into_iter()
                .filter(|e| e.involved_object.name.as_deref() == Some(node.node_name.as_str()))
                .filter_map(|e| e.reason)
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ready_follows_the_runtime_conditions() {
    let node = start().await;
    let t = Duration::from_secs(15);
    let n = node
        .wait_node("Ready", t, |n| ready_is(n, "True"))
        .await
        .expect("ready");
    let first_transition = condition(&n, "Ready")
        .and_then(|c| c.last_transition_time.clone())
        .expect("transition time");
    // API times have second precision: break the runtime in a later second
    // than the first transition, so the new transition time must differ.
    let first_second = first_transition.0.as_second();
    while jiff::Timestamp::now().as_second() <= first_second {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    node.fake
        .set_runtime_ready(false, "RuntimeBroken", "the runtime broke");
    let n = node
        .wait_node("NotReady", t, |n| ready_is(n, "False"))
        .await
        .expect("not ready");
    let c = condition(&n, "Ready").expect("ready condition");
    assert_eq!(c.reason.as_deref(), Some("KubeletNotReady"));
    assert_eq!(
        c.message.as_deref(),
        Some(
            "container runtime not ready: RuntimeReady=false reason:RuntimeBroken message:the runtime broke"
        )
    );
    let not_ready_at = c.last_transition_time.clone().expect("transition");
    assert!(not_ready_at.0 > first_transition.0);
    // Later heartbeats keep the transition time.
    let hb = c.last_heartbeat_time.clone().expect("heartbeat");
    let n = node
        .wait_node("a later heartbeat", t, |n| {
            let c = condition(n, "Ready").ok_or("no Ready")?;
            if c.last_heartbeat_time.as_ref().is_some_and(|h| h.0 > hb.0) {
                Ok(n.clone())
            } else {
                Err("same heartbeat".to_string())
            }
        })
        .await
        .expect("heartbeat");
    assert_eq!(
        condition(&n, "Ready").and_then(|c| c.last_transition_time.clone()),
        Some(not_ready_at)
    );

    node.fake.set_runtime_ready(true, "", "");
    let n = node
        .wait_node("Ready again", t, |n| ready_is(n, "True"))
        .await
        .expect("ready again");
    assert_eq!(
        condition(&n, "Ready")
            .and_then(|c| c.reason.clone())
            .as_deref(),
        Some("KubeletReady")
    );

    node.fake.set_network_ready(
        false,
        "NetworkPluginNotReady",
        "Network plugin returns error: cni plugin not initialized",
    );
    let n = node
        .wait_node("network NotReady", t, |n| ready_is(n, "False"))
        .await
        .expect("network not ready");
    assert_eq!(
        condition(&n, "Ready")
            .and_then(|c| c.message.clone())
            .as_deref(),
        Some(
            "container runtime network not ready: NetworkReady=false reason:NetworkPluginNotReady message:Network plugin returns error: cni plugin not initialized"
        )
    );
    node.fake.set_network_ready(true, "", "");
    node.wait_node("Ready after network", t, |n| ready_is(n, "True"))
        .await
        .expect("ready");

    let reasons = wait_for(
        "NodeReady/NodeNotReady events",
        t,
        Duration::from_millis(100),
        || async {
            let r = event_reasons(&node).await;
            if r.iter().any(|x| x == "NodeNotReady") && r.iter().any(|x| x == "NodeReady") {
                Ok(r)
            } else {
                Err(format!("{r:?}"))
            }
        },
    )
    .await
    .expect("events");
    assert!(reasons.iter().any(|r| r == "NodeNotReady"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runtime_that_stops_answering_is_down_until_it_returns() {
    let node = start().await;
    let t = Duration::from_secs(15);
    node.wait_node("Ready", t, |n| ready_is(n, "True"))
        .await
        .expect("ready");

    node.fake.stop_serving();
    let n = node
        .wait_node("runtime down", t, |n| ready_is(n, "False"))
        .await
        .expect("not ready");
    let msg = condition(&n, "Ready")
        .and_then(|c| c.message.clone())
        .unwrap_or_default();
    assert!(msg.contains("container runtime is down"), "{msg}");
    let info = n
        .status
        .clone()
        .and_then(|s| s.node_info)
        .expect("nodeInfo");
    assert_eq!(info.container_runtime_version, "containerd://Unknown");

    node.fake.resume_serving().expect("serve again");
    let n = node
        .wait_node("Ready after the runtime returns", t, |n| {
            ready_is(n, "True")
        })
        .await
        .expect("ready again");
    let info = n.status.and_then(|s| s.node_info).expect("nodeInfo");
    assert_eq!(info.container_runtime_version, "containerd://1.7.13");
}
