//! Component test of the eviction manager's `Evicted` event as the test API
//! server receives it: kubelet writes it with `AnnotatedEventf`, so the
//! Event object carries `evictionMessage`'s annotations on its metadata
//! (pkg/kubelet/eviction/eviction_manager.go `evictPod`,
//! pkg/kubelet/eviction/helpers.go `evictionMessage`).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::{Container, Event, Pod, PodCondition, PodSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use keelson::config::eviction::{Signal, Threshold, ThresholdValue};
use keelson::events::EventRecorder;
use keelson::node::eviction::summary::{
    ContainerStats, MemoryStats, PodStats, Summary, SummaryError,
};
use keelson::node::eviction::{
    EvictionConfig, EvictionDeps, EvictionHandle, EvictionManager, EvictionMetrics, EvictionPods,
    SummaryProvider, signals,
};
use keelson_tests::support::wait_for;
use keelson_tests::testapi::{TestApiOptions, TestApiServer};
use kube::api::{Api, ListParams};
use tokio::time::Instant;

const MI: u64 = 1024 * 1024;

struct FixedSummary(Summary);

impl SummaryProvider for FixedSummary {
    fn summary<'a>(
        &'a self,
        _pods: &'a [Arc<Pod>],
    ) -> BoxFuture<'a, Result<Summary, SummaryError>> {
        let s = self.0.clone();
        Box::pin(async move { Ok(s) })
    }
    fn has_dedicated_image_fs(&self) -> BoxFuture<'_, Result<bool, SummaryError>> {
        Box::pin(async { Ok(false) })
    }
}

#[derive(Default)]
struct Pods {
    pods: Vec<Arc<Pod>>,
    killed: Mutex<Vec<String>>,
}

impl EvictionPods for Pods {
    fn active_pods(&self) -> Vec<Arc<Pod>> {
        self.pods.clone()
    }
    fn kill(&self, pod: &Pod, _grace: i64, _message: &str, _c: Option<PodCondition>) -> bool {
        self.killed
            .lock()
            .expect("lock")
            .push(pod.metadata.name.clone().unwrap_or_default());
        true
    }
    fn is_cleaned_up(&self, _uid: &str) -> bool {
        true
    }
}

fn memory(available: u64, working_set: u64, time: Instant) -> MemoryStats {
    MemoryStats {
        available,
        working_set,
        usage: working_set,
        time,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_evicted_event_carries_kubelets_annotations() {
    let api = TestApiServer::start(TestApiOptions::default())
        .await
        .expect("api");
    let client = api.client().await;
    let registry = prometheus::Registry::new();
    let recorder = EventRecorder::start(client.clone(), "kubelet", "n1", &registry);

    let pod = Arc::new(Pod {
        metadata: ObjectMeta {
            name: Some("hog".into()),
            namespace: Some("default".into()),
            uid: Some("uid-hog".into()),
            ..Default::default()
        },
        spec: Some(PodSpec {
            containers: vec![
                Container {
                    name: "eater".into(),
                    ..Default::default()
                },
                Container {
                    name: "idle".into(),
                    ..Default::default()
                },
            ],
            ..Default::default()
        }),
        status: None,
    });
    let now = Instant::now();
    let summary = Summary {
        node_memory: Some(memory(50 * MI, 950 * MI, now)),
        pods: [(
            "uid-hog".to_string(),
            PodStats {
                memory_working_set: Some(300 * MI),
                containers: vec![
                    ContainerStats {
                        name: "eater".into(),
                        memory_working_set: Some(300 * MI),
                        ..Default::default()
                    },
                    // No usage figure: not blamed.
                    ContainerStats {
                        name: "idle".into(),
                        ..Default::default()
                    },
                ],
                ..Default::default()
            },
        )]
        .into(),
        ..Default::default()
    };
    let pods = Arc::new(Pods {
        pods: vec![pod],
        ..Default::default()
    });
    let mut manager = EvictionManager::new(
        EvictionConfig {
            thresholds: signals::add_allocatable_thresholds(&[Threshold {
                signal: Signal::MemoryAvailable,
                value: ThresholdValue::parse("100Mi").expect("value"),
                grace_period: Duration::ZERO,
                min_reclaim: None,
                hard: true,
            }]),
            pressure_transition_period: Duration::from_secs(300),
            max_pod_grace_period: 0,
            monitoring_interval: Duration::from_secs(10),
            local_storage_capacity_isolation: true,
        },
        EvictionDeps {
            summary: Arc::new(FixedSummary(summary)),
            pods: pods.clone(),
            reclaim: None,
            recorder: Some(recorder),
            metrics: EvictionMetrics::unregistered(),
            node_name: "n1".into(),
        },
        EvictionHandle::default(),
    );
    let evicted = manager.synchronize(now).await;
    assert_eq!(evicted.len(), 1);
    assert_eq!(*pods.killed.lock().expect("lock"), ["hog"]);

    let events: Api<Event> = Api::namespaced(client, "default");
    let ev = wait_for(
        "the Evicted event",
        Duration::from_secs(20),
        Duration::from_millis(50),
        || async {
            let list = events
                .list(&ListParams::default())
                .await
                .map_err(|e| e.to_string())?;
            list.items
                .into_iter()
                .find(|e| e.reason.as_deref() == Some("Evicted"))
                .ok_or_else(|| "no Evicted event yet".to_string())
        },
    )
    .await
    .expect("Evicted event");
    assert_eq!(ev.type_.as_deref(), Some("Warning"));
    assert_eq!(ev.involved_object.name.as_deref(), Some("hog"));
    assert_eq!(
        ev.message.as_deref(),
        Some(
            "The node was low on resource: memory. Threshold quantity: 100Mi, available: 50Mi. Container eater was using 300Mi, request is 0, has larger consumption of memory. "
        )
    );
    let want: BTreeMap<String, String> = [
        ("offending_containers", "eater"),
        ("offending_containers_usage", "300Mi"),
        ("starved_resource", "memory"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    assert_eq!(ev.metadata.annotations, Some(want));

    // Events without annotations (the node's EvictionThresholdMet) carry none.
    let list = events.list(&ListParams::default()).await.expect("list");
    for e in list
        .items
        .iter()
        .filter(|e| e.reason.as_deref() != Some("Evicted"))
    {
        assert_eq!(e.metadata.annotations, None, "{:?}", e.reason);
    }
}
