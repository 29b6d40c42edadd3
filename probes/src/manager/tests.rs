//! Timing and threshold rules of the manager, on tokio's paused clock with a
//! fake `Exec` whose answers the tests set per container.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::{
    Container, ContainerPort, ExecAction, HTTPGetAction, Pod, PodSpec, Probe, TCPSocketAction,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::*;
use crate::events::{REASON_PROBE_WARNING, REASON_UNHEALTHY};
use crate::handlers::exec::{ExecError, ExecOutput};

const UID: &str = "uid-1";

/// What the fake runtime answers for a container.
#[derive(Clone, Debug)]
enum Reply {
    Exit(i32),
    Error(&'static str),
    Timeout,
    /// Takes this long, then exits 0.
    Slow(Duration),
}

/// One exec call: when, which container, which command.
type Call = (Instant, String, Vec<String>);

struct FakeExec {
    replies: Mutex<HashMap<String, Reply>>,
    calls: mpsc::UnboundedSender<Call>,
}

impl Exec for FakeExec {
    async fn exec(
        &self,
        container_id: &str,
        cmd: Vec<String>,
        _timeout: Duration,
    ) -> Result<ExecOutput, ExecError> {
        // Read the answer before reporting the call, so a test that reacts to
        // the call changes only the following runs.
        let reply = self
            .replies
            .lock()
            .ok()
            .and_then(|r| r.get(container_id).cloned())
            .unwrap_or(Reply::Exit(0));
        let _ = self
            .calls
            .send((Instant::now(), container_id.to_string(), cmd));
        match reply {
            Reply::Exit(code) => Ok(ExecOutput {
                exit_code: code,
                stdout: format!("exit {code}").into_bytes(),
                stderr: vec![],
            }),
            Reply::Error(message) => Err(ExecError::Failed(message.to_string())),
            Reply::Timeout => Err(ExecError::Timeout),
            Reply::Slow(d) => {
                tokio::time::sleep(d).await;
                Ok(ExecOutput::default())
            }
        }
    }
}

struct Harness {
    manager: ProbeManager,
    outputs: ProbeManagerOutputs,
    exec: std::sync::Arc<FakeExec>,
    calls: mpsc::UnboundedReceiver<Call>,
    registry: prometheus::Registry,
    t0: Instant,
}

impl Harness {
    fn new() -> Harness {
        Harness::with_config(ProbeManagerConfig {
            random_start_offset: false,
            ..ProbeManagerConfig::default()
        })
    }

    fn with_config(config: ProbeManagerConfig) -> Harness {
        let (tx, calls) = mpsc::unbounded_channel();
        let exec = std::sync::Arc::new(FakeExec {
            replies: Mutex::new(HashMap::new()),
            calls: tx,
        });
        let registry = prometheus::Registry::new();
        let (manager, outputs) = match ProbeManager::new(config, exec.clone(), &registry) {
            Ok(m) => m,
            Err(e) => panic!("manager: {e}"),
        };
        Harness {
            manager,
            outputs,
            exec,
            calls,
            registry,
            t0: Instant::now(),
        }
    }

    fn reply(&self, container_id: &str, reply: Reply) {
        if let Ok(mut r) = self.exec.replies.lock() {
            r.insert(container_id.to_string(), reply);
        }
    }

    fn add(&self, containers: Vec<Container>) {
        self.manager
            .add_pod(&pod(containers))
            .unwrap_or_else(|e| panic!("add_pod: {e}"));
    }

    /// Starts `container_id` now (or `ago` in the past).
    fn start(&self, container: &str, container_id: &str, ago: Duration) {
        self.start_with(container, container_id, ago, None);
    }

    fn start_with(
        &self,
        container: &str,
        container_id: &str,
        ago: Duration,
        adopted: Option<ReportedStatus>,
    ) {
        let start = ContainerStart {
            container_id: container_id.to_string(),
            started_at: self.manager.wall_now() - ago,
            pod_ips: vec!["127.0.0.1".into()],
            adopted,
        };
        self.manager
            .container_started(UID, container, start)
            .unwrap_or_else(|e| panic!("start: {e}"));
    }

    /// Seconds since the harness was created, to the millisecond.
    fn now_s(&self) -> f64 {
        (self.t0.elapsed().as_millis() as f64) / 1000.0
    }

    async fn next_update(&mut self) -> ProbeUpdate {
        match tokio::time::timeout(Duration::from_secs(3600), self.outputs.updates.recv()).await {
            Ok(Some(u)) => u,
            other => panic!("no update: {other:?}"),
        }
    }

    async fn next_call(&mut self) -> f64 {
        match tokio::time::timeout(Duration::from_secs(3600), self.calls.recv()).await {
            Ok(Some((at, _, _))) => ((at - self.t0).as_millis() as f64) / 1000.0,
            other => panic!("no call: {other:?}"),
        }
    }

    /// Times (s) of the exec calls made so far and in the next `secs`
    /// seconds (tests wait off the probe grid, so no call races the end).
    async fn calls_during(&mut self, secs: f64) -> Vec<f64> {
        tokio::time::sleep(Duration::from_secs_f64(secs)).await;
        let mut out = Vec::new();
        while let Ok((at, _, _)) = self.calls.try_recv() {
            out.push(((at - self.t0).as_millis() as f64) / 1000.0);
        }
        out
    }

    fn drain_updates(&mut self) -> Vec<ProbeUpdate> {
        let mut out = Vec::new();
        while let Ok(u) = self.outputs.updates.try_recv() {
            out.push(u);
        }
        out
    }

    fn drain_events(&mut self) -> Vec<ProbeEvent> {
        let mut out = Vec::new();
        while let Ok(e) = self.outputs.events.try_recv() {
            out.push(e);
        }
        out
    }

    /// The value of the first sample named `name` (a histogram's
    /// `_count`) carrying all `labels`, from the text exposition.
    fn metric(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        use prometheus::Encoder;
        let mut buf = Vec::new();
        prometheus::TextEncoder::new()
            .encode(&self.registry.gather(), &mut buf)
            .ok()?;
        let text = String::from_utf8(buf).ok()?;
        let sample = if name.ends_with("_seconds") {
            format!("{name}_count")
        } else {
            name.to_string()
        };
        text.lines()
            .filter(|line| line.starts_with(&format!("{sample}{{")))
            .find(|line| {
                labels
                    .iter()
                    .all(|(k, v)| line.contains(&format!("{k}=\"{v}\"")))
            })
            .and_then(|line| line.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
    }
}

fn pod(containers: Vec<Container>) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some("web-0".into()),
            namespace: Some("shop".into()),
            uid: Some(UID.into()),
            ..Default::default()
        },
        spec: Some(PodSpec {
            containers,
            ..Default::default()
        }),
        status: None,
    }
}

fn exec_probe(initial_delay: i32, period: i32, success: i32, failure: i32) -> Probe {
    Probe {
        exec: Some(ExecAction {
            command: Some(vec!["check".into()]),
        }),
        initial_delay_seconds: Some(initial_delay),
        period_seconds: Some(period),
        timeout_seconds: Some(1),
        success_threshold: Some(success),
        failure_threshold: Some(failure),
        ..Default::default()
    }
}

fn container(name: &str) -> Container {
    Container {
        name: name.into(),
        ..Default::default()
    }
}

fn s(secs: u64) -> Duration {
    Duration::from_secs(secs)
}

#[tokio::test(start_paused = true)]
async fn readiness_starts_not_ready_and_becomes_ready_at_initial_delay() {
    let mut h = Harness::new();
    h.add(vec![Container {
        readiness_probe: Some(exec_probe(5, 10, 1, 3)),
        ..container("app")
    }]);
    h.start("app", "c1", Duration::ZERO);
    assert_eq!(h.manager.readiness("c1"), Some(ProbeState::Failure));
    assert!(!h.manager.is_ready(UID, "app", "c1"));
    assert!(h.manager.is_started(UID, "app", "c1"));

    let update = h.next_update().await;
    assert_eq!(h.now_s(), 5.0, "first probe at initialDelaySeconds");
    assert_eq!(
        update,
        ProbeUpdate {
            pod_uid: UID.into(),
            container_name: "app".into(),
            container_id: "c1".into(),
            kind: ProbeKind::Readiness,
            state: ProbeState::Success
        }
    );
    assert!(h.manager.is_ready(UID, "app", "c1"));
    assert_eq!(
        h.calls_during(30.5).await,
        [5.0, 15.0, 25.0, 35.0],
        "then every periodSeconds"
    );
    assert!(
        h.drain_updates().is_empty(),
        "no update while the result does not change"
    );
}

#[tokio::test(start_paused = true)]
async fn initial_delay_counts_from_container_start() {
    let mut h = Harness::new();
    h.add(vec![Container {
        readiness_probe: Some(exec_probe(5, 10, 1, 3)),
        ..container("app")
    }]);
    h.start("app", "c1", s(3));
    assert_eq!(h.next_call().await, 2.0);
    h.manager.container_stopped(UID, "app", "c1");
    h.start("app", "c2", s(60));
    assert_eq!(
        h.next_call().await,
        2.0,
        "a container past its delay is probed at once"
    );
}

#[tokio::test(start_paused = true)]
async fn success_threshold_needs_consecutive_successes() {
    let mut h = Harness::new();
    h.add(vec![Container {
        readiness_probe: Some(exec_probe(0, 1, 3, 1)),
        ..container("app")
    }]);
    h.reply("c1", Reply::Exit(0));
    h.start("app", "c1", Duration::ZERO);
    // t=0 ok, t=1 ok, t=2 fail (resets), t=3,4 ok, t=5 ok -> ready at 5
    let _ = h.next_call().await; // t=0
    let _ = h.next_call().await; // t=1
    h.reply("c1", Reply::Exit(1));
    let _ = h.next_call().await; // t=2 fails
    h.reply("c1", Reply::Exit(0));
    let update = h.next_update().await;
    // failureThreshold 1: the failure at t=2 sets Failure (already Failure: no update),
    // so the first update is the success after three more runs.
    assert_eq!((update.state, h.now_s()), (ProbeState::Success, 5.0));
}

#[tokio::test(start_paused = true)]
async fn readiness_failure_threshold_and_recovery() {
    let mut h = Harness::new();
    h.add(vec![Container {
        readiness_probe: Some(exec_probe(0, 10, 1, 3)),
        ..container("app")
    }]);
    h.start("app", "c1", Duration::ZERO);
    assert_eq!(h.next_update().await.state, ProbeState::Success);
    h.reply("c1", Reply::Exit(1));
    let update = h.next_update().await;
    assert_eq!(
        (update.state, h.now_s()),
        (ProbeState::Failure, 30.0),
        "third consecutive failure (10, 20, 30)"
    );
    assert!(!h.manager.is_ready(UID, "app", "c1"));
    h.reply("c1", Reply::Exit(0));
    let update = h.next_update().await;
    assert_eq!(
        (update.state, h.now_s()),
        (ProbeState::Success, 40.0),
        "readiness keeps probing and recovers"
    );
    let events = h.drain_events();
    assert_eq!(events.len(), 3);
    assert!(
        events
            .iter()
            .all(|e| e.reason == REASON_UNHEALTHY && e.message == "Readiness probe failed: exit 1")
    );
}

#[tokio::test(start_paused = true)]
async fn liveness_starts_successful_fails_at_threshold_and_stops_until_new_container() {
    let mut h = Harness::new();
    h.add(vec![Container {
        liveness_probe: Some(exec_probe(0, 10, 1, 3)),
        ..container("app")
    }]);
    h.reply("c1", Reply::Exit(1));
    h.start("app", "c1", Duration::ZERO);
    assert_eq!(h.manager.liveness("c1"), Some(ProbeState::Success));
    let update = h.next_update().await;
    assert_eq!(
        (update.kind, update.state, h.now_s()),
        (ProbeKind::Liveness, ProbeState::Failure, 20.0)
    );
    assert_eq!(
        h.calls_during(100.5).await.len(),
        3,
        "no probe after the terminal failure"
    );
    assert_eq!(h.manager.worker_count(), 0);
    assert_eq!(h.manager.liveness("c1"), Some(ProbeState::Failure));

    // The agent restarts the container: fresh results, probing resumes.
    h.manager.container_stopped(UID, "app", "c1");
    assert_eq!(h.manager.liveness("c1"), None);
    let restart = h.now_s();
    h.start("app", "c2", Duration::ZERO);
    assert_eq!(h.manager.liveness("c2"), Some(ProbeState::Success));
    assert_eq!(h.next_call().await, restart);
    assert_eq!(h.manager.worker_count(), 1);
}

#[tokio::test(start_paused = true)]
async fn same_container_started_twice_keeps_the_terminal_result() {
    let mut h = Harness::new();
    h.add(vec![Container {
        liveness_probe: Some(exec_probe(0, 1, 1, 1)),
        ..container("app")
    }]);
    h.reply("c1", Reply::Exit(1));
    h.start("app", "c1", Duration::ZERO);
    assert_eq!(h.next_update().await.state, ProbeState::Failure);
    h.start("app", "c1", Duration::ZERO);
    assert_eq!(
        h.calls_during(5.5).await,
        [0.0],
        "a failed instance is not probed again"
    );
    assert_eq!(h.manager.liveness("c1"), Some(ProbeState::Failure));
}

#[tokio::test(start_paused = true)]
async fn startup_probe_holds_liveness_and_readiness() {
    let mut h = Harness::new();
    h.add(vec![Container {
        startup_probe: Some(exec_probe(0, 2, 1, 30)),
        liveness_probe: Some(exec_probe(0, 10, 1, 3)),
        readiness_probe: Some(exec_probe(0, 10, 1, 3)),
        ..container("app")
    }]);
    h.reply("c1", Reply::Exit(1));
    h.start("app", "c1", Duration::ZERO);
    assert!(!h.manager.is_started(UID, "app", "c1"));
    assert!(!h.manager.is_ready(UID, "app", "c1"));
    assert_eq!(h.manager.startup("c1"), Some(ProbeState::Unknown));
    assert_eq!(h.manager.readiness("c1"), None, "readiness not running yet");
    assert_eq!(
        h.calls_during(5.0).await,
        [0.0, 2.0, 4.0],
        "only the startup probe runs"
    );
    assert_eq!(h.manager.worker_count(), 1);

    h.reply("c1", Reply::Exit(0));
    let update = h.next_update().await;
    assert_eq!(
        (update.kind, update.state, h.now_s()),
        (ProbeKind::Startup, ProbeState::Success, 6.0)
    );
    assert!(h.manager.is_started(UID, "app", "c1"));
    let update = h.next_update().await;
    assert_eq!(
        (update.kind, update.state, h.now_s()),
        (ProbeKind::Readiness, ProbeState::Success, 6.0)
    );
    assert!(h.manager.is_ready(UID, "app", "c1"));
    assert_eq!(h.manager.liveness("c1"), Some(ProbeState::Success));
    assert_eq!(
        h.manager.worker_count(),
        2,
        "startup stopped, liveness and readiness run"
    );
    // Readiness and liveness at 6 (just probed), then 16, 26; no more startup probes.
    let calls = h.calls_during(25.0).await;
    assert_eq!(calls, [6.0, 6.0, 6.0, 16.0, 16.0, 26.0, 26.0]);
}

#[tokio::test(start_paused = true)]
async fn startup_failure_threshold_is_terminal() {
    let mut h = Harness::new();
    h.add(vec![Container {
        startup_probe: Some(exec_probe(0, 1, 1, 3)),
        liveness_probe: Some(exec_probe(0, 1, 1, 3)),
        ..container("app")
    }]);
    h.reply("c1", Reply::Exit(1));
    h.start("app", "c1", Duration::ZERO);
    let update = h.next_update().await;
    assert_eq!(
        (update.kind, update.state, h.now_s()),
        (ProbeKind::Startup, ProbeState::Failure, 2.0)
    );
    assert!(
        h.calls_during(10.5).await.len() == 3,
        "startup stops, liveness never starts"
    );
    assert_eq!(h.manager.worker_count(), 0);
    assert!(!h.manager.is_started(UID, "app", "c1"));
}

#[tokio::test(start_paused = true)]
async fn probe_errors_count_for_no_threshold_and_are_retried() {
    let mut h = Harness::new();
    h.add(vec![Container {
        liveness_probe: Some(exec_probe(0, 10, 1, 2)),
        ..container("app")
    }]);
    h.reply("c1", Reply::Error("container not found"));
    h.start("app", "c1", Duration::ZERO);
    let calls = h.calls_during(25.5).await;
    assert_eq!(
        calls,
        [0.0, 0.0, 0.0, 10.0, 10.0, 10.0, 20.0, 20.0, 20.0],
        "three tries per run"
    );
    assert_eq!(
        h.manager.liveness("c1"),
        Some(ProbeState::Success),
        "errors never fail the probe"
    );
    let events = h.drain_events();
    assert_eq!(events.len(), 3);
    assert_eq!(
        events[0].message,
        "Liveness probe errored and resulted in unknown state: container not found"
    );
    assert!(h.drain_updates().is_empty());
    assert_eq!(
        h.metric("prober_probe_total", &[("result", "failed")]),
        None
    );
}

#[tokio::test(start_paused = true)]
async fn exec_timeout_is_a_failure() {
    let mut h = Harness::new();
    h.add(vec![Container {
        liveness_probe: Some(exec_probe(0, 10, 1, 1)),
        ..container("app")
    }]);
    h.reply("c1", Reply::Timeout);
    h.start("app", "c1", Duration::ZERO);
    assert_eq!(h.next_update().await.state, ProbeState::Failure);
    let events = h.drain_events();
    assert_eq!(
        events[0].message,
        "Liveness probe failed: command \"check\" timed out"
    );
    assert_eq!(events[0].container_id, "c1");
    assert_eq!(
        (events[0].namespace.as_str(), events[0].pod_name.as_str()),
        ("shop", "web-0")
    );
}

#[tokio::test(start_paused = true)]
async fn slow_probes_run_back_to_back_then_realign() {
    let mut h = Harness::new();
    h.add(vec![Container {
        readiness_probe: Some(exec_probe(0, 2, 1, 3)),
        ..container("app")
    }]);
    h.reply("c1", Reply::Slow(s(5)));
    h.start("app", "c1", Duration::ZERO);
    let _ = h.next_call().await;
    h.reply("c1", Reply::Exit(0));
    // Run 1 takes 0..5; the missed ticks (2, 4) collapse into one run at 5,
    // then the schedule continues on the period grid (6, 8).
    assert_eq!(h.calls_during(9.0).await, [5.0, 6.0, 8.0]);
}

#[tokio::test(start_paused = true)]
async fn stopped_container_stops_its_workers_and_late_stops_are_ignored() {
    let mut h = Harness::new();
    h.add(vec![Container {
        readiness_probe: Some(exec_probe(0, 1, 1, 3)),
        liveness_probe: Some(exec_probe(0, 1, 1, 3)),
        ..container("app")
    }]);
    h.start("app", "c1", Duration::ZERO);
    let _ = h.next_update().await;
    h.start("app", "c2", Duration::ZERO);
    assert_eq!(
        h.manager.readiness("c1"),
        None,
        "a new ID drops the old instance's results"
    );
    assert_eq!(
        h.manager.readiness("c2"),
        Some(ProbeState::Failure),
        "and starts over"
    );
    h.manager.container_stopped(UID, "app", "c1");
    assert_eq!(
        h.manager.worker_count(),
        2,
        "a stop for the old ID leaves the new workers alone"
    );
    h.manager.container_stopped(UID, "app", "c2");
    assert_eq!(h.manager.worker_count(), 0);
    assert_eq!(h.manager.cached_containers(), 0);
    let _ = h.calls_during(0.5).await;
    assert!(h.calls_during(10.0).await.is_empty());
}

#[tokio::test(start_paused = true)]
async fn stop_liveness_and_startup_keeps_readiness() {
    let mut h = Harness::new();
    h.add(vec![Container {
        readiness_probe: Some(exec_probe(0, 1, 1, 1)),
        liveness_probe: Some(exec_probe(0, 1, 1, 1)),
        ..container("app")
    }]);
    h.start("app", "c1", Duration::ZERO);
    let _ = h.next_update().await;
    h.manager.stop_liveness_and_startup(UID);
    assert_eq!(h.manager.worker_count(), 1);
    h.reply("c1", Reply::Exit(1));
    let update = h.next_update().await;
    assert_eq!(
        (update.kind, update.state),
        (ProbeKind::Readiness, ProbeState::Failure)
    );
    assert_eq!(
        h.manager.liveness("c1"),
        None,
        "liveness no longer probed, its result forgotten"
    );
}

#[tokio::test(start_paused = true)]
async fn a_terminating_pod_counts_its_running_containers_started() {
    let mut h = Harness::new();
    h.add(vec![Container {
        startup_probe: Some(exec_probe(0, 1, 1, 1)),
        ..container("app")
    }]);
    h.start("app", "c1", Duration::ZERO);
    h.reply("c1", Reply::Exit(1));
    let update = h.next_update().await;
    assert_eq!(
        (update.kind, update.state),
        (ProbeKind::Startup, ProbeState::Failure)
    );
    assert!(!h.manager.is_started(UID, "app", "c1"));
    h.manager.stop_liveness_and_startup(UID);
    assert!(h.manager.is_started(UID, "app", "c1"));
    assert_eq!(h.manager.worker_count(), 0);
}

#[tokio::test(start_paused = true)]
async fn remove_pod_stops_everything_and_deletes_series() {
    let mut h = Harness::new();
    h.add(vec![Container {
        readiness_probe: Some(exec_probe(0, 1, 1, 1)),
        ..container("app")
    }]);
    h.start("app", "c1", Duration::ZERO);
    let _ = h.next_update().await;
    let labels = [
        ("probe_type", "Readiness"),
        ("result", "successful"),
        ("container", "app"),
        ("pod", "web-0"),
        ("namespace", "shop"),
        ("pod_uid", UID),
    ];
    assert_eq!(h.metric("prober_probe_total", &labels), Some(1.0));
    assert_eq!(
        h.metric(
            "prober_probe_duration_seconds",
            &[("probe_type", "Readiness"), ("pod", "web-0")]
        ),
        Some(1.0)
    );
    h.manager.remove_pod(UID);
    assert_eq!(h.manager.worker_count(), 0);
    assert_eq!(h.manager.readiness("c1"), None);
    assert_eq!(h.metric("prober_probe_total", &labels), None);
    assert_eq!(
        h.metric("prober_probe_duration_seconds", &[("pod", "web-0")]),
        None
    );
    assert!(matches!(
        h.manager.container_started(
            UID,
            "app",
            ContainerStart {
                container_id: "c9".into(),
                started_at: SystemTime::now(),
                pod_ips: vec![],
                adopted: None
            }
        ),
        Err(ProbeManagerError::UnknownPod(_))
    ));
}

#[tokio::test(start_paused = true)]
async fn cleanup_pods_removes_undesired_pods() {
    let h = Harness::new();
    h.add(vec![Container {
        readiness_probe: Some(exec_probe(0, 1, 1, 1)),
        ..container("app")
    }]);
    h.start("app", "c1", Duration::ZERO);
    h.manager.cleanup_pods(&HashSet::from([UID.to_string()]));
    assert_eq!(h.manager.worker_count(), 1);
    h.manager.cleanup_pods(&HashSet::new());
    assert_eq!(h.manager.worker_count(), 0);
}

#[tokio::test(start_paused = true)]
async fn metrics_count_results_with_upstream_labels() {
    let mut h = Harness::new();
    h.add(vec![Container {
        liveness_probe: Some(exec_probe(0, 1, 1, 3)),
        ..container("app")
    }]);
    h.start("app", "c1", Duration::ZERO);
    let _ = h.calls_during(2.5).await; // runs at 0, 1, 2
    h.reply("c1", Reply::Exit(1));
    let _ = h.calls_during(1.0).await; // run at 3 fails
    let base = [
        ("probe_type", "Liveness"),
        ("container", "app"),
        ("pod", "web-0"),
        ("namespace", "shop"),
        ("pod_uid", UID),
    ];
    let with = |result: &'static str| {
        let mut l = base.to_vec();
        l.push(("result", result));
        l
    };
    assert_eq!(
        h.metric("prober_probe_total", &with("successful")),
        Some(3.0)
    );
    assert_eq!(h.metric("prober_probe_total", &with("failed")), Some(1.0));
    assert_eq!(h.metric("prober_probe_total", &with("unknown")), None);
    assert_eq!(
        h.metric(
            "prober_probe_duration_seconds",
            &[("probe_type", "Liveness")]
        ),
        Some(3.0),
        "successes only"
    );
}

#[tokio::test(start_paused = true)]
async fn random_offset_spreads_first_probes_within_one_period() {
    let mut h = Harness::with_config(ProbeManagerConfig::default());
    let probe = |cmd: &str| Probe {
        exec: Some(ExecAction {
            command: Some(vec![cmd.to_string()]),
        }),
        ..exec_probe(3, 10, 1, 3)
    };
    let containers: Vec<Container> = (0..50)
        .map(|i| Container {
            liveness_probe: Some(probe("live")),
            readiness_probe: Some(probe("ready")),
            ..container(&format!("c{i}"))
        })
        .collect();
    h.add(containers);
    for i in 0..50 {
        h.start(&format!("c{i}"), &format!("id-{i}"), Duration::ZERO);
    }
    tokio::time::sleep(Duration::from_millis(12_500)).await;
    let mut ready: HashMap<String, Vec<f64>> = HashMap::new();
    let mut live: HashMap<String, Vec<f64>> = HashMap::new();
    while let Ok((at, id, cmd)) = h.calls.try_recv() {
        let t = ((at - h.t0).as_millis() as f64) / 1000.0;
        let map = if cmd == ["ready"] {
            &mut ready
        } else {
            &mut live
        };
        map.entry(id).or_default().push(t);
    }
    assert_eq!(ready.len(), 50);
    assert!(
        ready.values().all(|t| t == &[3.0]),
        "a new container's readiness runs at its initial delay: {ready:?}"
    );
    let liveness_firsts: Vec<f64> = live.values().map(|t| t[0]).collect();
    assert!(
        liveness_firsts.len() >= 40,
        "most liveness probes ran within 12.5s: {}",
        liveness_firsts.len()
    );
    assert!(
        liveness_firsts.iter().all(|t| (3.0..13.0).contains(t)),
        "{liveness_firsts:?}"
    );
    let distinct: HashSet<u64> = liveness_firsts
        .iter()
        .map(|t| (t * 1000.0) as u64)
        .collect();
    assert!(
        distinct.len() > 20,
        "liveness first probes spread out: {liveness_firsts:?}"
    );

    // Adopted containers: every probe kind is offset.
    h.manager.remove_pod(UID);
    h.add(vec![Container {
        readiness_probe: Some(exec_probe(0, 10, 1, 3)),
        ..container("a")
    }]);
    let mut adopted_firsts = HashSet::new();
    for i in 0..20 {
        let before = h.now_s();
        h.start_with(
            "a",
            &format!("adopted-{i}"),
            s(100),
            Some(ReportedStatus {
                started: true,
                ready: true,
            }),
        );
        assert_eq!(
            h.manager.readiness(&format!("adopted-{i}")),
            Some(ProbeState::Success),
            "seeded from API status"
        );
        let first = h.next_call().await;
        assert!(
            (before..before + 10.0).contains(&first),
            "adopted first probe within one period"
        );
        adopted_firsts.insert(((first - before) * 1000.0) as u64);
        h.manager
            .container_stopped(UID, "a", &format!("adopted-{i}"));
    }
    assert!(
        adopted_firsts.len() > 10,
        "adopted offsets are random: {adopted_firsts:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn adoption_seeds_results_from_the_reported_status() {
    let h = Harness::new();
    h.add(vec![Container {
        startup_probe: Some(exec_probe(0, 10, 1, 3)),
        readiness_probe: Some(exec_probe(0, 10, 1, 3)),
        liveness_probe: Some(exec_probe(0, 10, 1, 3)),
        ..container("app")
    }]);
    h.start_with(
        "app",
        "c1",
        s(600),
        Some(ReportedStatus {
            started: true,
            ready: false,
        }),
    );
    assert_eq!(h.manager.startup("c1"), Some(ProbeState::Success));
    assert!(h.manager.is_started(UID, "app", "c1"));
    assert_eq!(h.manager.readiness("c1"), Some(ProbeState::Failure));
    assert_eq!(
        h.manager.worker_count(),
        2,
        "startup already passed: no startup worker"
    );
}

#[tokio::test]
async fn warning_results_are_successes_with_a_probe_warning_event() {
    // An HTTP probe redirected to another host: 302 without following it.
    let listener = match tokio::net::TcpListener::bind("127.0.0.1:0").await {
        Ok(l) => l,
        Err(e) => panic!("bind: {e}"),
    };
    let port = listener.local_addr().map(|a| a.port()).unwrap_or(0);
    tokio::spawn(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        while let Ok((mut sock, _)) = listener.accept().await {
            let mut buf = [0u8; 2048];
            let _ = sock.read(&mut buf).await;
            let _ = sock
                .write_all(b"HTTP/1.1 302 Found\r\nLocation: http://elsewhere.invalid/\r\nContent-Length: 5\r\n\r\nmoved")
                .await;
        }
    });
    let mut h = Harness::new();
    h.add(vec![Container {
        readiness_probe: Some(Probe {
            http_get: Some(HTTPGetAction {
                port: IntOrString::String("web".into()),
                ..Default::default()
            }),
            period_seconds: Some(3600),
            timeout_seconds: Some(30),
            ..Default::default()
        }),
        ports: Some(vec![ContainerPort {
            name: Some("web".into()),
            container_port: i32::from(port),
            ..Default::default()
        }]),
        ..container("app")
    }]);
    h.start("app", "c1", Duration::ZERO);
    let update = h.next_update().await;
    assert_eq!(update.state, ProbeState::Success);
    let events = h.drain_events();
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].reason, REASON_PROBE_WARNING);
    assert_eq!(
        events[0].message,
        "Readiness probe warning: Probe terminated redirects, Response body: moved"
    );
}

#[tokio::test(start_paused = true)]
async fn probe_without_handler_or_port_is_reported_as_errored() {
    let mut h = Harness::new();
    h.add(vec![
        Container {
            readiness_probe: Some(Probe {
                period_seconds: Some(10),
                ..Default::default()
            }),
            ..container("a")
        },
        Container {
            liveness_probe: Some(Probe {
                tcp_socket: Some(TCPSocketAction {
                    host: None,
                    port: IntOrString::String("nope".into()),
                }),
                ..Default::default()
            }),
            ..container("b")
        },
    ]);
    h.start("a", "ca", Duration::ZERO);
    h.start("b", "cb", Duration::ZERO);
    tokio::time::sleep(s(1)).await;
    let mut messages: Vec<String> = h.drain_events().into_iter().map(|e| e.message).collect();
    messages.sort();
    assert_eq!(
        messages,
        [
            "Liveness probe errored and resulted in unknown state: strconv.Atoi: parsing \"nope\": invalid syntax",
            "Readiness probe errored and resulted in unknown state: missing probe handler for web-0_shop(uid-1):a",
        ]
    );
    assert_eq!(h.manager.readiness("ca"), Some(ProbeState::Failure));
    assert!(!h.manager.is_ready(UID, "a", "ca"));
}

#[tokio::test(start_paused = true)]
async fn containers_without_probes_are_started_and_ready() {
    let h = Harness::new();
    h.add(vec![container("plain")]);
    h.start("plain", "p1", Duration::ZERO);
    assert!(h.manager.is_started(UID, "plain", "p1"));
    assert!(h.manager.is_ready(UID, "plain", "p1"));
    assert_eq!(h.manager.worker_count(), 0);
    assert!(matches!(
        h.manager.container_started(
            UID,
            "ghost",
            ContainerStart {
                container_id: "g".into(),
                started_at: SystemTime::now(),
                pod_ips: vec![],
                adopted: None
            }
        ),
        Err(ProbeManagerError::UnknownContainer { .. })
    ));
}

#[tokio::test(start_paused = true)]
async fn sidecars_are_probed_and_plain_init_containers_are_not() {
    let h = Harness::new();
    let mut p = pod(vec![container("app")]);
    if let Some(spec) = p.spec.as_mut() {
        spec.init_containers = Some(vec![
            Container {
                restart_policy: Some("Always".into()),
                readiness_probe: Some(exec_probe(0, 1, 1, 1)),
                ..container("sidecar")
            },
            Container {
                readiness_probe: Some(exec_probe(0, 1, 1, 1)),
                ..container("init")
            },
        ]);
    }
    h.manager.add_pod(&p).unwrap_or_else(|e| panic!("{e}"));
    h.start("sidecar", "s1", Duration::ZERO);
    assert_eq!(h.manager.worker_count(), 1);
    assert!(
        h.manager
            .container_started(
                UID,
                "init",
                ContainerStart {
                    container_id: "i1".into(),
                    started_at: SystemTime::now(),
                    pod_ips: vec![],
                    adopted: None
                }
            )
            .is_err()
    );
}

#[tokio::test(start_paused = true)]
async fn shutdown_stops_all_workers() {
    let mut h = Harness::new();
    h.add(vec![Container {
        readiness_probe: Some(exec_probe(0, 1, 1, 1)),
        ..container("app")
    }]);
    h.start("app", "c1", Duration::ZERO);
    let _ = h.next_call().await;
    h.manager.shutdown();
    assert_eq!(h.manager.worker_count(), 0);
    let _ = h.calls_during(0.5).await;
    assert!(h.calls_during(5.0).await.is_empty());
}

#[tokio::test(start_paused = true)]
async fn pod_without_uid_is_rejected() {
    let h = Harness::new();
    let mut p = pod(vec![]);
    p.metadata.uid = None;
    assert!(matches!(
        h.manager.add_pod(&p),
        Err(ProbeManagerError::PodWithoutUid { .. })
    ));
}

#[tokio::test(start_paused = true)]
async fn termination_grace_period_of_the_probe_is_exposed() {
    let h = Harness::new();
    h.add(vec![Container {
        liveness_probe: Some(Probe {
            termination_grace_period_seconds: Some(7),
            ..exec_probe(0, 1, 1, 1)
        }),
        ..container("app")
    }]);
    assert_eq!(
        h.manager
            .termination_grace_period_seconds(UID, "app", ProbeKind::Liveness),
        Some(7)
    );
    assert_eq!(
        h.manager
            .termination_grace_period_seconds(UID, "app", ProbeKind::Startup),
        None
    );
}

#[test]
fn creating_outside_a_runtime_is_an_error() {
    let (tx, _rx) = mpsc::unbounded_channel();
    let exec = std::sync::Arc::new(FakeExec {
        replies: Mutex::new(HashMap::new()),
        calls: tx,
    });
    let registry = prometheus::Registry::new();
    assert!(matches!(
        ProbeManager::new(ProbeManagerConfig::default(), exec, &registry),
        Err(ProbeManagerError::NoRuntime)
    ));
}
