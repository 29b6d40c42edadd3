//! Graceful node shutdown against a double of systemd-logind on a private
//! D-Bus ([`LogindDouble`], never the host's logind): the node raises
//! logind's maximum delay with its drop-in, holds a `delay` lock on
//! `shutdown`, and when logind announces the shutdown it reports NotReady,
//! refuses new pods, stops its pods lowest priority first with kubelet's
//! status, and releases the lock; a cancelled shutdown takes the lock
//! again and the node becomes Ready (kubelet v1.36,
//! pkg/kubelet/nodeshutdown/).

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Event, Node, Pod};
use keelson::config::KubeDuration;
use keelson::node::NodeOverrides;
use keelson_tests::logind_double::LogindDouble;
use keelson_tests::node_harness::{InProcessNode, NodeHarnessOptions, condition};
use keelson_tests::private_bus::dbus_daemon;
use keelson_tests::support::{skip, wait_for};
use kube::Api;
use kube::api::{ListParams, PostParams};
use serde_json::json;

const IMAGE: &str = "keelson.local/busybox:1";
const T: Duration = Duration::from_secs(60);
const POLL: Duration = Duration::from_millis(100);

fn ready(n: &Node, status: &str) -> Result<String, String> {
    match condition(n, "Ready") {
        Some(c) if c.status == status => Ok(c.message.clone().unwrap_or_default()),
        Some(c) => Err(format!("Ready={} ({:?})", c.status, c.message)),
        None => Err("no Ready condition".into()),
    }
}

async fn node_event_messages(node: &InProcessNode, reason: &str) -> Vec<String> {
    Api::<Event>::namespaced(node.admin.clone(), "default")
        .list(&ListParams::default())
        .await
        .map(|l| {
            l.items
                .into_iter()
                .filter(|e| e.involved_object.name.as_deref() == Some(node.node_name.as_str()))
                .filter(|e| e.reason.as_deref() == Some(reason))
                .filter_map(|e| e.message)
                .collect()
        })
        .unwrap_or_default()
}

fn pod(node: &str, name: &str, priority: Option<i32>) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "nodeName": node,
            "priority": priority,
            "terminationGracePeriodSeconds": 30,
            "containers": [{"name": "app", "image": IMAGE}]
        }
    }))
    .expect("pod")
}

async fn wait_phase(pods: &Api<Pod>, name: &str, phase: &str) -> Pod {
    wait_for(&format!("{name} {phase}"), T, POLL, || async {
        let p = pods.get(name).await.map_err(|e| e.to_string())?;
        let now = p.status.as_ref().and_then(|s| s.phase.clone());
        if now.as_deref() == Some(phase) {
            Ok(p)
        } else {
            Err(format!("phase {now:?}"))
        }
    })
    .await
    .expect("phase")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_stops_pods_by_priority_and_a_cancellation_restores_the_node() {
    if dbus_daemon().is_none() {
        skip(
            "shutdown_stops_pods_by_priority_and_a_cancellation_restores_the_node",
            "dbus-daemon is not installed (scripts/install-deps)",
        );
        return;
    }
    // logind allows 5 s; the node needs 20 s + 10 s.
    let logind = LogindDouble::start(5).await.expect("logind double");
    let node = InProcessNode::start(NodeHarnessOptions {
        configure: Some(Arc::new(|c| {
            c.node.node_status_update_frequency = KubeDuration::from_secs(1);
            c.node.shutdown_grace_period = KubeDuration::from_secs(30);
            c.node.shutdown_grace_period_critical_pods = KubeDuration::from_secs(10);
        })),
        overrides: NodeOverrides {
            logind_bus: Some(logind.address().to_string()),
            logind_conf_dir: Some(logind.conf_dir().to_path_buf()),
            ..NodeOverrides::default()
        },
        ..NodeHarnessOptions::default()
    })
    .await
    .expect("node");
    node.fake.add_image(IMAGE);

    // The drop-in, logind reloaded, and a delay lock held.
    let lock = wait_for("the inhibitor lock", T, POLL, || async {
        match logind.inhibitors().as_slice() {
            [(args, true)] => Ok(args.clone()),
            other => Err(format!("locks: {other:?}")),
        }
    })
    .await
    .expect("lock");
    assert_eq!(
        lock,
        [
            "shutdown",
            "kubelet",
            "Kubelet needs time to handle node shutdown",
            "delay"
        ]
        .map(String::from)
    );
    assert_eq!(
        std::fs::read_to_string(logind.conf_dir().join("99-kubelet.conf")).expect("drop-in"),
        "# Kubelet logind override\n[Login]\nInhibitDelayMaxSec=30\n"
    );
    assert_eq!(
        logind.kill_unit_calls(),
        [("systemd-logind.service".to_string(), "all".to_string(), 1)]
    );
    assert_eq!(logind.delay_secs(), 30);

    let pods: Api<Pod> = Api::namespaced(node.admin.clone(), "default");
    for (name, priority) in [("plain", None), ("critical", Some(2_000_000_000))] {
        pods.create(
            &PostParams::default(),
            &pod(&node.node_name, name, priority),
        )
        .await
        .expect("create");
    }
    wait_phase(&pods, "plain", "Running").await;
    wait_phase(&pods, "critical", "Running").await;
    node.wait_node("Ready", T, |n| ready(n, "True"))
        .await
        .expect("ready");
    node.fake.clear_calls();

    logind.prepare_for_shutdown(true).await.expect("signal");

    let message = node
        .wait_node("NotReady while shutting down", T, |n| ready(n, "False"))
        .await
        .expect("not ready");
    assert!(message.contains("node is shutting down"), "{message}");
    for name in ["plain", "critical"] {
        let p = wait_phase(&pods, name, "Failed").await;
        let s = p.status.expect("status");
        assert_eq!(s.reason.as_deref(), Some("Terminated"), "{name}");
        assert_eq!(
            s.message.as_deref(),
            Some("Pod was terminated in response to imminent node shutdown."),
            "{name}"
        );
        let c = s
            .conditions
            .unwrap_or_default()
            .into_iter()
            .find(|c| c.type_ == "DisruptionTarget")
            .expect("DisruptionTarget");
        assert_eq!(
            (c.status.as_str(), c.reason.as_deref()),
            ("True", Some("TerminationByKubelet"))
        );
    }
    // The plain pod's group went first.
    let pod_of = |id: &str| {
        node.fake
            .containers()
            .into_iter()
            .find(|c| c.id == id)
            .and_then(|c| c.labels.get("io.kubernetes.pod.name").cloned())
            .unwrap_or_default()
    };
    let stopped: Vec<String> = node
        .fake
        .calls_to("StopContainer")
        .into_iter()
        .map(|c| pod_of(&c.subject))
        .collect();
    let first = |name: &str| stopped.iter().position(|p| p == name);
    assert!(
        first("plain").is_some() && first("plain") < first("critical"),
        "stop order: {stopped:?}"
    );
    // The lock is released once the pods are done.
    wait_for("the lock released", T, POLL, || async {
        match logind.inhibitors().as_slice() {
            [(_, false)] => Ok(()),
            other => Err(format!("locks: {other:?}")),
        }
    })
    .await
    .expect("released");
    wait_for("the NodeShutdown event", T, POLL, || async {
        let m = node_event_messages(&node, "NodeShutdown").await;
        if m.iter()
            .any(|m| m == "Shutdown manager detected shutdown event")
        {
            Ok(())
        } else {
            Err(format!("{m:?}"))
        }
    })
    .await
    .expect("event");

    // New pods are refused while the node shuts down.
    pods.create(&PostParams::default(), &pod(&node.node_name, "late", None))
        .await
        .expect("create");
    let late = wait_phase(&pods, "late", "Failed").await;
    let s = late.status.expect("status");
    assert_eq!(s.reason.as_deref(), Some("NodeShutdown"));
    assert_eq!(
        s.message.as_deref(),
        Some("Pod was rejected: Pod was rejected as the node is shutting down.")
    );

    // The shutdown is cancelled: a new lock, Ready again.
    logind.prepare_for_shutdown(false).await.expect("signal");
    wait_for("a new lock", T, POLL, || async {
        match logind.inhibitors().as_slice() {
            [(_, false), (_, true)] => Ok(()),
            other => Err(format!("locks: {other:?}")),
        }
    })
    .await
    .expect("lock again");
    node.wait_node("Ready again", T, |n| ready(n, "True"))
        .await
        .expect("ready");
    let state = std::fs::read_to_string(
        node.config
            .node
            .root_dir
            .join("graceful_node_shutdown_state"),
    )
    .expect("state file");
    let v: serde_json::Value = serde_json::from_str(&state).expect("json");
    assert!(
        v["startTime"].as_str().is_some_and(|t| t.starts_with("20"))
            && v["endTime"].as_str().is_some_and(|t| t.starts_with("20")),
        "{state}"
    );
    let metrics = node.metrics_text();
    assert!(
        metrics.lines().any(
            |l| l.starts_with("kubelet_graceful_shutdown_end_time_seconds ") && !l.ends_with(" 0")
        ),
        "{metrics}"
    );
}
