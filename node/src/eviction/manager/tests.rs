//! The eviction loop against fake signals and fake pods.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::{
    Container, EmptyDirVolumeSource, Pod, PodCondition, PodSpec, ResourceRequirements, Volume,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as ApiQuantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use tokio::time::Instant;

use super::*;
use crate::config::eviction::{Threshold, ThresholdValue};
use crate::eviction::summary::{
    ContainerStats, DiskUsage, FsStats, MemoryStats, PodStats, SummaryError, VolumeStats,
};
use crate::status::PressureSource;

const MI: u64 = 1024 * 1024;

#[derive(Default)]
struct FakeSummary {
    summary: Mutex<Summary>,
    dedicated: bool,
}

impl FakeSummary {
    fn set(&self, f: impl FnOnce(&mut Summary)) {
        f(&mut self.summary.lock().expect("lock"));
    }
}

impl SummaryProvider for FakeSummary {
    fn summary<'a>(
        &'a self,
        _pods: &'a [Arc<Pod>],
    ) -> BoxFuture<'a, Result<Summary, SummaryError>> {
        let s = self.summary.lock().expect("lock").clone();
        Box::pin(async move { Ok(s) })
    }
    fn has_dedicated_image_fs(&self) -> BoxFuture<'_, Result<bool, SummaryError>> {
        let d = self.dedicated;
        Box::pin(async move { Ok(d) })
    }
}

#[derive(Debug, Clone, PartialEq)]
struct Kill {
    name: String,
    grace: i64,
    message: String,
    condition: Option<PodCondition>,
}

#[derive(Default)]
struct FakePods {
    pods: Mutex<Vec<Arc<Pod>>>,
    kills: Mutex<Vec<Kill>>,
}

impl EvictionPods for FakePods {
    fn active_pods(&self) -> Vec<Arc<Pod>> {
        let killed: Vec<String> = self
            .kills
            .lock()
            .expect("lock")
            .iter()
            .map(|k| k.name.clone())
            .collect();
        self.pods
            .lock()
            .expect("lock")
            .iter()
            .filter(|p| !killed.contains(p.metadata.name.as_ref().expect("name")))
            .cloned()
            .collect()
    }
    fn kill(&self, pod: &Pod, grace: i64, message: &str, condition: Option<PodCondition>) -> bool {
        self.kills.lock().expect("lock").push(Kill {
            name: pod.metadata.name.clone().unwrap_or_default(),
            grace,
            message: message.to_string(),
            condition,
        });
        true
    }
    fn is_cleaned_up(&self, _uid: &str) -> bool {
        true
    }
}

#[derive(Default)]
struct FakeReclaim {
    frees: Mutex<Option<(Arc<FakeSummary>, u64)>>,
    calls: Mutex<Vec<&'static str>>,
}

impl NodeReclaim for FakeReclaim {
    fn delete_all_unused_containers(&self) -> BoxFuture<'_, Result<(), crate::gc::GcError>> {
        self.calls.lock().expect("lock").push("containers");
        Box::pin(async { Ok(()) })
    }
    fn delete_unused_images(&self) -> BoxFuture<'_, Result<(), crate::gc::GcError>> {
        self.calls.lock().expect("lock").push("images");
        if let Some((s, bytes)) = self.frees.lock().expect("lock").as_ref() {
            s.set(|sum| {
                if let Some(fs) = sum.node_fs.as_mut() {
                    fs.available += bytes;
                }
            });
        }
        Box::pin(async { Ok(()) })
    }
}

fn pod(name: &str, memory_request: Option<&str>, grace: Option<i64>) -> Arc<Pod> {
    let resources = memory_request.map(|r| ResourceRequirements {
        requests: Some([("memory".to_string(), ApiQuantity(r.into()))].into()),
        limits: Some([("memory".to_string(), ApiQuantity(r.into()))].into()),
        ..Default::default()
    });
    Arc::new(Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("default".into()),
            uid: Some(format!("uid-{name}")),
            ..Default::default()
        },
        spec: Some(PodSpec {
            containers: vec![Container {
                name: "app".into(),
                resources,
                ..Default::default()
            }],
            termination_grace_period_seconds: grace,
            ..Default::default()
        }),
        status: None,
    })
}

fn pod_memory(name: &str, bytes: u64) -> (String, PodStats) {
    (
        format!("uid-{name}"),
        PodStats {
            memory_working_set: Some(bytes),
            containers: vec![ContainerStats {
                name: "app".into(),
                memory_working_set: Some(bytes),
                ..Default::default()
            }],
            ..Default::default()
        },
    )
}

fn memory(available: u64, working_set: u64, now: Instant) -> MemoryStats {
    MemoryStats {
        available,
        working_set,
        usage: working_set,
        time: now,
    }
}

fn threshold(signal: Signal, value: &str, grace: u64) -> Threshold {
    Threshold {
        signal,
        value: ThresholdValue::parse(value).expect("value"),
        grace_period: Duration::from_secs(grace),
        min_reclaim: None,
        hard: grace == 0,
    }
}

struct Setup {
    manager: EvictionManager,
    summary: Arc<FakeSummary>,
    pods: Arc<FakePods>,
    reclaim: Arc<FakeReclaim>,
    handle: EvictionHandle,
    metrics: EvictionMetrics,
}

fn setup(thresholds: Vec<Threshold>, transition: Duration, max_grace: i64) -> Setup {
    let summary = Arc::new(FakeSummary::default());
    let pods = Arc::new(FakePods::default());
    let reclaim = Arc::new(FakeReclaim::default());
    let handle = EvictionHandle::default();
    let metrics = EvictionMetrics::unregistered();
    let manager = EvictionManager::new(
        EvictionConfig {
            thresholds,
            pressure_transition_period: transition,
            max_pod_grace_period: max_grace,
            monitoring_interval: MONITORING_INTERVAL,
            local_storage_capacity_isolation: true,
        },
        EvictionDeps {
            summary: summary.clone(),
            pods: pods.clone(),
            reclaim: Some(reclaim.clone()),
            recorder: None,
            metrics: metrics.clone(),
            node_name: "n1".into(),
        },
        handle.clone(),
    );
    Setup {
        manager,
        summary,
        pods,
        reclaim,
        handle,
        metrics,
    }
}

fn names(kills: &[Kill]) -> Vec<&str> {
    kills.iter().map(|k| k.name.as_str()).collect()
}

#[tokio::test(start_paused = true)]
async fn hard_memory_threshold_evicts_best_effort_first_one_per_round() {
    let mut s = setup(
        signals::add_allocatable_thresholds(&[threshold(Signal::MemoryAvailable, "100Mi", 0)]),
        Duration::from_secs(300),
        0,
    );
    let t0 = Instant::now();
    *s.pods.pods.lock().expect("lock") = vec![
        pod("guaranteed", Some("200Mi"), Some(30)),
        pod("besteffort", None, Some(30)),
        pod("burstable-within", Some("300Mi"), None),
    ];
    s.summary.set(|sum| {
        sum.node_memory = Some(memory(8000 * MI, 1000 * MI, t0));
        // Pods' cgroup: 400Mi limit, 350Mi used: allocatable available 50Mi < 100Mi.
        sum.pods_memory = Some(memory(50 * MI, 350 * MI, t0));
        sum.pods = [
            pod_memory("guaranteed", 150 * MI),
            pod_memory("besteffort", 120 * MI),
            pod_memory("burstable-within", 80 * MI),
        ]
        .into();
    });
    let evicted = s.manager.synchronize(t0).await;
    assert_eq!(evicted.len(), 1);
    let kills = s.pods.kills.lock().expect("lock").clone();
    assert_eq!(names(&kills), ["besteffort"]);
    assert_eq!(kills[0].grace, IMMEDIATE_EVICTION_GRACE_PERIOD_SECONDS);
    assert_eq!(
        kills[0].message,
        "The node was low on resource: memory. Threshold quantity: 100Mi, available: 50Mi. Container app was using 120Mi, request is 0, has larger consumption of memory. "
    );
    let c = kills[0].condition.clone().expect("condition");
    assert_eq!(c.type_, "DisruptionTarget");
    assert_eq!(c.reason.as_deref(), Some("TerminationByKubelet"));
    assert_eq!(s.handle.node_conditions(), ["MemoryPressure"]);
    assert!(s.handle.pressure().memory);
    assert_eq!(
        s.metrics
            .evictions
            .with_label_values(&["allocatableMemory.available"])
            .get(),
        1
    );
    // Memory pressure is not relieved by node-level reclaim.
    assert!(s.reclaim.calls.lock().expect("lock").is_empty());

    // Still under pressure next round (fresh stats): the next in rank goes.
    let t1 = t0 + Duration::from_secs(10);
    s.summary.set(|sum| {
        sum.pods_memory = Some(memory(60 * MI, 340 * MI, t1));
        sum.node_memory = Some(memory(8000 * MI, 1000 * MI, t1));
    });
    s.manager.synchronize(t1).await;
    let kills = s.pods.kills.lock().expect("lock").clone();
    assert_eq!(
        names(&kills),
        ["besteffort", "guaranteed"],
        "both within their requests: the one closest to its request goes first"
    );
}

#[tokio::test(start_paused = true)]
async fn soft_threshold_waits_for_its_grace_period_and_caps_pod_grace() {
    let mut s = setup(
        vec![threshold(Signal::MemoryAvailable, "1Gi", 30)],
        Duration::from_secs(300),
        10,
    );
    let t0 = Instant::now();
    *s.pods.pods.lock().expect("lock") = vec![pod("a", None, Some(60)), pod("b", None, Some(5))];
    let stats = |sum: &mut Summary, t| {
        sum.node_memory = Some(memory(512 * MI, 7000 * MI, t));
        sum.pods = [pod_memory("a", 300 * MI), pod_memory("b", 100 * MI)].into();
    };
    s.summary.set(|sum| stats(sum, t0));
    assert!(s.manager.synchronize(t0).await.is_empty());
    // The condition is raised at once, eviction waits.
    assert_eq!(s.handle.node_conditions(), ["MemoryPressure"]);
    let t29 = t0 + Duration::from_secs(29);
    s.summary.set(|sum| stats(sum, t29));
    assert!(s.manager.synchronize(t29).await.is_empty());
    let t30 = t0 + Duration::from_secs(30);
    s.summary.set(|sum| stats(sum, t30));
    assert_eq!(s.manager.synchronize(t30).await.len(), 1);
    let kills = s.pods.kills.lock().expect("lock").clone();
    // Soft: min(evictionMaxPodGracePeriod 10, the pod's 60).
    assert_eq!((kills[0].name.as_str(), kills[0].grace), ("a", 10));
    let t40 = t0 + Duration::from_secs(40);
    s.summary.set(|sum| stats(sum, t40));
    s.manager.synchronize(t40).await;
    let kills = s.pods.kills.lock().expect("lock").clone();
    assert_eq!((kills[1].name.as_str(), kills[1].grace), ("b", 5));
}

#[tokio::test(start_paused = true)]
async fn pressure_condition_outlives_the_pressure_by_the_transition_period() {
    let mut s = setup(
        vec![threshold(Signal::MemoryAvailable, "100Mi", 0)],
        Duration::from_secs(60),
        0,
    );
    let t0 = Instant::now();
    s.summary
        .set(|sum| sum.node_memory = Some(memory(50 * MI, 4000 * MI, t0)));
    s.manager.synchronize(t0).await;
    assert_eq!(s.handle.node_conditions(), ["MemoryPressure"]);
    for secs in [10u64, 59] {
        let t = t0 + Duration::from_secs(secs);
        s.summary
            .set(|sum| sum.node_memory = Some(memory(3000 * MI, 1000 * MI, t)));
        s.manager.synchronize(t).await;
        assert_eq!(s.handle.node_conditions(), ["MemoryPressure"], "at {secs}s");
    }
    let t = t0 + Duration::from_secs(60);
    s.summary
        .set(|sum| sum.node_memory = Some(memory(3000 * MI, 1000 * MI, t)));
    s.manager.synchronize(t).await;
    assert!(s.handle.node_conditions().is_empty());
    assert!(!s.handle.pressure().memory);
}

#[tokio::test(start_paused = true)]
async fn minimum_reclaim_keeps_evicting_until_reclaimed() {
    let mut t = threshold(Signal::MemoryAvailable, "100Mi", 0);
    t.min_reclaim = Some(ThresholdValue::parse("200Mi").expect("v"));
    let mut s = setup(vec![t], Duration::from_secs(300), 0);
    *s.pods.pods.lock().expect("lock") = vec![
        pod("a", None, None),
        pod("b", None, None),
        pod("c", None, None),
    ];
    let t0 = Instant::now();
    let set = |s: &Setup, available: u64, at: Instant| {
        s.summary.set(|sum| {
            sum.node_memory = Some(memory(available * MI, 1000 * MI, at));
            sum.pods = [
                pod_memory("a", 300 * MI),
                pod_memory("b", 200 * MI),
                pod_memory("c", 100 * MI),
            ]
            .into();
        })
    };
    set(&s, 90, t0);
    s.manager.synchronize(t0).await;
    // 150Mi available: above the threshold, but not above threshold + minimum reclaim.
    let t1 = t0 + Duration::from_secs(10);
    set(&s, 150, t1);
    s.manager.synchronize(t1).await;
    let t2 = t0 + Duration::from_secs(20);
    set(&s, 350, t2);
    s.manager.synchronize(t2).await;
    let kills = s.pods.kills.lock().expect("lock").clone();
    assert_eq!(names(&kills), ["a", "b"], "300Mi ≥ 100Mi + 200Mi ends it");
}

#[tokio::test(start_paused = true)]
async fn critical_pods_are_never_evicted() {
    let mut s = setup(
        vec![threshold(Signal::MemoryAvailable, "100Mi", 0)],
        Duration::from_secs(300),
        0,
    );
    let mut critical = (*pod("node-critical", None, None)).clone();
    if let Some(spec) = critical.spec.as_mut() {
        spec.priority = Some(2_000_001_000);
    }
    let mut static_pod = (*pod("static", None, None)).clone();
    static_pod.metadata.annotations = Some(
        [(
            "kubernetes.io/config.source".to_string(),
            "file".to_string(),
        )]
        .into(),
    );
    *s.pods.pods.lock().expect("lock") = vec![
        Arc::new(critical),
        Arc::new(static_pod),
        pod("user", Some("1Gi"), None),
    ];
    let t0 = Instant::now();
    s.summary.set(|sum| {
        sum.node_memory = Some(memory(10 * MI, 4000 * MI, t0));
        sum.pods = [
            pod_memory("node-critical", 2000 * MI),
            pod_memory("static", 1000 * MI),
            pod_memory("user", 10 * MI),
        ]
        .into();
    });
    s.manager.synchronize(t0).await;
    let kills = s.pods.kills.lock().expect("lock").clone();
    assert_eq!(names(&kills), ["user"]);
}

#[tokio::test(start_paused = true)]
async fn disk_pressure_reclaims_node_resources_before_evicting() {
    let mut s = setup(
        vec![threshold(Signal::NodeFsAvailable, "10%", 0)],
        Duration::from_secs(300),
        0,
    );
    *s.pods.pods.lock().expect("lock") = vec![pod("a", None, None)];
    let t0 = Instant::now();
    let fs = |available| FsStats {
        capacity: 1000 * MI,
        available: available * MI,
        inodes: 1000,
        inodes_free: 900,
        time: t0,
    };
    s.summary.set(|sum| {
        sum.node_fs = Some(fs(50));
        sum.image_fs = Some(fs(50));
    });
    // Image GC frees 100Mi: enough, nobody is evicted.
    *s.reclaim.frees.lock().expect("lock") = Some((s.summary.clone(), 100 * MI));
    assert!(s.manager.synchronize(t0).await.is_empty());
    assert_eq!(
        *s.reclaim.calls.lock().expect("lock"),
        ["containers", "images"]
    );
    assert!(s.pods.kills.lock().expect("lock").is_empty());
    assert_eq!(s.handle.node_conditions(), ["DiskPressure"]);
    // The derived containerfs threshold follows nodefs on one filesystem.
    assert!(
        s.manager
            .thresholds()
            .iter()
            .any(|t| t.signal == Signal::ContainerFsAvailable)
    );
    // Not enough to reclaim: the pod goes.
    *s.reclaim.frees.lock().expect("lock") = None;
    let t1 = t0 + Duration::from_secs(10);
    s.summary.set(|sum| {
        sum.node_fs = Some(FsStats { time: t1, ..fs(10) });
        sum.pods = [("uid-a".to_string(), PodStats::default())].into();
    });
    s.manager.synchronize(t1).await;
    assert_eq!(names(&s.pods.kills.lock().expect("lock")), ["a"]);
}

#[tokio::test(start_paused = true)]
async fn an_empty_dir_over_its_size_limit_is_evicted_without_pressure() {
    let mut s = setup(
        vec![threshold(Signal::MemoryAvailable, "100Mi", 0)],
        Duration::from_secs(300),
        0,
    );
    let mut p = (*pod("scratchy", None, None)).clone();
    if let Some(spec) = p.spec.as_mut() {
        spec.volumes = Some(vec![Volume {
            name: "scratch".into(),
            empty_dir: Some(EmptyDirVolumeSource {
                size_limit: Some(ApiQuantity("10Mi".into())),
                ..Default::default()
            }),
            ..Default::default()
        }]);
    }
    *s.pods.pods.lock().expect("lock") = vec![Arc::new(p)];
    let t0 = Instant::now();
    s.summary.set(|sum| {
        sum.node_memory = Some(memory(8000 * MI, 100 * MI, t0));
        sum.pods = [(
            "uid-scratchy".to_string(),
            PodStats {
                volumes: vec![VolumeStats {
                    name: "scratch".into(),
                    usage: DiskUsage {
                        used_bytes: 11 * MI,
                        inodes_used: 2,
                    },
                    local_ephemeral: true,
                }],
                ..Default::default()
            },
        )]
        .into();
    });
    assert_eq!(s.manager.synchronize(t0).await.len(), 1);
    let kills = s.pods.kills.lock().expect("lock").clone();
    assert_eq!(
        kills[0].message,
        "Usage of EmptyDir volume \"scratch\" exceeds the limit \"10Mi\". "
    );
    assert_eq!(kills[0].grace, 1);
    assert_eq!(kills[0].condition, None);
    assert!(s.handle.node_conditions().is_empty());
    assert_eq!(
        s.metrics
            .evictions
            .with_label_values(&["emptydirfs.limit"])
            .get(),
        1
    );
}

#[tokio::test(start_paused = true)]
async fn pid_pressure_ranks_by_priority_then_processes() {
    let mut s = setup(
        vec![threshold(Signal::PidAvailable, "100", 0)],
        Duration::from_secs(300),
        0,
    );
    *s.pods.pods.lock().expect("lock") = vec![pod("few", None, None), pod("many", None, None)];
    let t0 = Instant::now();
    s.summary.set(|sum| {
        sum.rlimit = Some(crate::eviction::summary::RlimitStats {
            max_pid: 1000,
            running: 950,
            time: t0,
        });
        let proc = |n| PodStats {
            process_count: Some(n),
            ..Default::default()
        };
        sum.pods = BTreeMap::from([
            ("uid-few".to_string(), proc(3)),
            ("uid-many".to_string(), proc(400)),
        ]);
    });
    s.manager.synchronize(t0).await;
    assert_eq!(names(&s.pods.kills.lock().expect("lock")), ["many"]);
    assert_eq!(s.handle.node_conditions(), ["PIDPressure"]);
}
