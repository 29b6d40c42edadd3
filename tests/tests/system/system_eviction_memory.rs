//! System test of node-pressure eviction with real parts: the real `keelson`
//! binary runs pods on a private containerd with a small node allocatable
//! (`systemReserved` memory = all but 400Mi, so the pods' cgroup may use
//! 400Mi and `allocatableMemory.available < 100Mi` is reached by one pod
//! that fills 330MiB of a memory-backed emptyDir). The BestEffort pod that allocates is evicted, not
//! the Guaranteed one; the Node shows MemoryPressure; the evicted pod's
//! status and its `Evicted` event say why; the condition clears once the
//! transition period (5 s here) has passed.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Event, Node, Pod};
use keelson::config::KubeDuration;
use keelson_tests::containerd::Containerd;
use keelson_tests::images::BUSYBOX_IMAGE;
use keelson_tests::node_harness::{BinaryNode, BinaryNodeOptions, condition};
use keelson_tests::support::{require_root, wait_for};
use keelson_tests::testapi::{TestApiOptions, TestApiServer};
use kube::Api;
use kube::api::{ListParams, PostParams};
use serde_json::json;

/// What the pods' cgroup may use.
const POD_ALLOCATABLE_MI: u64 = 400;

fn mem_total_bytes() -> u64 {
    let text = std::fs::read_to_string("/proc/meminfo").expect("meminfo");
    keelson::node::status::host::meminfo_field(&text, "MemTotal").expect("MemTotal")
}

fn pod(name: &str, node: &str, command: &[&str], memory: Option<&str>) -> Pod {
    let resources = match memory {
        Some(m) => {
            json!({"requests": {"cpu": "100m", "memory": m}, "limits": {"cpu": "100m", "memory": m}})
        }
        None => json!({}),
    };
    serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "nodeName": node,
            "terminationGracePeriodSeconds": 30,
            "volumes": [{"name": "mem", "emptyDir": {"medium": "Memory"}}],
            "containers": [{
                "name": name,
                "image": BUSYBOX_IMAGE,
                "imagePullPolicy": "Never",
                "command": command,
                "resources": resources,
                "volumeMounts": [{"name": "mem", "mountPath": "/mem"}],
            }],
        },
    }))
    .expect("pod")
}

async fn phase(
    pods: &Api<Pod>,
    name: &str,
) -> Result<(String, Option<String>, Option<String>), String> {
    let p = pods.get(name).await.map_err(|e| e.to_string())?;
    let s = p.status.unwrap_or_default();
    Ok((s.phase.unwrap_or_default(), s.reason, s.message))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_best_effort_memory_hog_is_evicted_before_a_guaranteed_pod() {
    if !require_root("a_best_effort_memory_hog_is_evicted_before_a_guaranteed_pod") {
        return;
    }
    let ctrd = Containerd::start().await.expect("containerd");
    let api = TestApiServer::start(TestApiOptions::default())
        .await
        .expect("test API server");
    let admin = api.client().await;
    let reserved = mem_total_bytes() - POD_ALLOCATABLE_MI * 1024 * 1024;
    let node = BinaryNode::start(
        &ctrd,
        &api,
        BinaryNodeOptions {
            configure: Some(Arc::new(move |c| {
                c.node.node_status_update_frequency = KubeDuration::from_secs(1);
                c.node.eviction_pressure_transition_period = KubeDuration::from_secs(15);
                c.node.kernel_memcg_notification = true;
                c.node
                    .system_reserved
                    .insert("memory".into(), reserved.to_string());
            })),
            ..BinaryNodeOptions::default()
        },
    )
    .expect("keelson");
    let name = node.node_name.clone();
    let nodes = Api::<Node>::all(admin.clone());
    let node_condition = |type_: &'static str, status: &'static str| {
        let nodes = nodes.clone();
        let name = name.clone();
        move || {
            let nodes = nodes.clone();
            let name = name.clone();
            async move {
                let n = nodes.get(&name).await.map_err(|e| e.to_string())?;
                match condition(&n, type_) {
                    Some(c) if c.status == status => Ok(c.clone()),
                    Some(c) => Err(format!("{type_}={} {:?}", c.status, c.message)),
                    None => Err(format!("no {type_}")),
                }
            }
        }
    };
    if let Err(e) = wait_for(
        "the Node Ready",
        Duration::from_secs(60),
        Duration::from_millis(200),
        node_condition("Ready", "True"),
    )
    .await
    {
        panic!("{e}\n--- keelson log ---\n{}", node.log_tail(80));
    }

    let pods = Api::<Pod>::namespaced(admin.clone(), "default");
    pods.create(
        &PostParams::default(),
        &pod("steady", &name, &["sleep", "3600"], Some("64Mi")),
    )
    .await
    .expect("guaranteed pod");
    let running = |n: &'static str| {
        let pods = pods.clone();
        move || {
            let pods = pods.clone();
            async move {
                match phase(&pods, n).await? {
                    (p, _, _) if p == "Running" => Ok(()),
                    other => Err(format!("{other:?}")),
                }
            }
        }
    };
    if let Err(e) = wait_for(
        "the Guaranteed pod running",
        Duration::from_secs(60),
        Duration::from_millis(200),
        running("steady"),
    )
    .await
    {
        panic!("{e}\n--- keelson log ---\n{}", node.log_tail(80));
    }

    // The hog fills 330MiB of a memory-backed emptyDir (tmpfs pages are
    // charged to its cgroup's working set) and keeps them.
    pods.create(
        &PostParams::default(),
        &pod(
            "hog",
            &name,
            &[
                "sh",
                "-c",
                "dd if=/dev/zero of=/mem/fill bs=1M count=330 && sleep 3600",
            ],
            None,
        ),
    )
    .await
    .expect("best-effort pod");

    let (_, reason, message) = match wait_for(
        "the hog evicted",
        Duration::from_secs(90),
        Duration::from_millis(200),
        || async {
            match phase(&pods, "hog").await? {
                (p, r, m) if p == "Failed" => Ok((p, r, m)),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await
    {
        Ok(v) => v,
        Err(e) => panic!("{e}\n--- keelson log ---\n{}", node.log_tail(120)),
    };
    assert_eq!(reason.as_deref(), Some("Evicted"));
    let message = message.unwrap_or_default();
    assert!(
        message.starts_with(
            "The node was low on resource: memory. Threshold quantity: 100Mi, available: "
        ),
        "{message}"
    );
    assert!(
        message.contains("Container hog was using ")
            && message.contains(", request is 0, has larger consumption of memory. "),
        "{message}"
    );
    let hog = pods.get("hog").await.expect("hog");
    let disruption = hog
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "DisruptionTarget"))
        .cloned()
        .unwrap_or_else(|| {
            panic!(
                "no DisruptionTarget condition in {:?}\n--- keelson log ---\n{}",
                hog.status,
                node.log_tail(60)
            )
        });
    assert_eq!(disruption.reason.as_deref(), Some("TerminationByKubelet"));

    // The Node reports the pressure (it lasts the transition period).
    wait_for(
        "MemoryPressure True",
        Duration::from_secs(15),
        Duration::from_millis(100),
        node_condition("MemoryPressure", "True"),
    )
    .await
    .expect("memory pressure reported");

    // Under MemoryPressure a new BestEffort pod is not admitted.
    pods.create(
        &PostParams::default(),
        &pod("late", &name, &["sleep", "3600"], None),
    )
    .await
    .expect("late pod");
    let (_, late_reason, late_message) = wait_for(
        "the late pod rejected",
        Duration::from_secs(15),
        Duration::from_millis(100),
        || async {
            match phase(&pods, "late").await? {
                (p, r, m) if p == "Failed" => Ok((p, r, m)),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n--- keelson log ---\n{}", node.log_tail(60)));
    assert_eq!(late_reason.as_deref(), Some("Evicted"));
    assert_eq!(
        late_message.as_deref(),
        Some("Pod was rejected: The node had condition: [MemoryPressure]. ")
    );

    // The event says why.
    let events = Api::<Event>::namespaced(admin.clone(), "default");
    let ev = wait_for(
        "the Evicted event",
        Duration::from_secs(15),
        Duration::from_millis(200),
        || async {
            events
                .list(&ListParams::default())
                .await
                .map_err(|e| e.to_string())?
                .items
                .into_iter()
                .find(|e| {
                    e.reason.as_deref() == Some("Evicted")
                        && e.involved_object.name.as_deref() == Some("hog")
                })
                .ok_or_else(|| "no Evicted event yet".to_string())
        },
    )
    .await
    .expect("event");
    assert_eq!(ev.type_.as_deref(), Some("Warning"));
    assert_eq!(ev.message.as_deref(), Some(message.as_str()));

    // The Guaranteed pod was left alone.
    assert_eq!(phase(&pods, "steady").await.expect("steady").0, "Running");

    // The pressure is gone: the condition clears after the transition period.
    let cleared = wait_for(
        "MemoryPressure False",
        Duration::from_secs(45),
        Duration::from_millis(200),
        node_condition("MemoryPressure", "False"),
    )
    .await
    .expect("pressure cleared");
    assert_eq!(
        cleared.reason.as_deref(),
        Some("KubeletHasSufficientMemory")
    );
    let steady = phase(&pods, "steady").await.expect("steady");
    assert_eq!(
        steady.0,
        "Running",
        "{steady:?}\n--- keelson log ---\n{}",
        node.log_tail(120)
    );
    assert_eq!(
        phase(&pods, "hog").await.expect("hog").0,
        "Failed",
        "an evicted pod is not restarted"
    );

    let metrics = node.metrics(&ctrd).await.expect("metrics");
    assert!(
        metrics.contains("kubelet_evictions{eviction_signal=\"allocatableMemory.available\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics
            .contains("keelson_eviction_signal_available{signal=\"allocatableMemory.available\"}"),
        "{metrics}"
    );
    // The Node event kubelet writes before reclaiming.
    let node_events = events
        .list(&ListParams::default())
        .await
        .expect("events")
        .items;
    assert!(
        node_events.iter().any(|e| {
            e.reason.as_deref() == Some("EvictionThresholdMet")
                && e.involved_object.kind.as_deref() == Some("Node")
                && e.message.as_deref() == Some("Attempting to reclaim memory")
        }),
        "no EvictionThresholdMet event: {:?}",
        node_events
            .iter()
            .map(|e| (&e.reason, &e.message))
            .collect::<Vec<_>>()
    );
}
