//! The prober manager: one worker per (pod UID, container, probe kind),
//! bound to one container instance, driven by the agent's lifecycle calls.
//!
//! The agent (pod lifecycle) calls:
//! - [`ProbeManager::add_pod`] when it admits a pod (records the probe specs),
//! - [`ProbeManager::container_started`] after CRI `StartContainer` succeeded
//!   (or when it adopts a running container after a restart),
//! - [`ProbeManager::container_stopped`] when the container exited or was
//!   killed,
//! - [`ProbeManager::stop_liveness_and_startup`] when the pod starts
//!   terminating (readiness keeps running so the pod leaves endpoints),
//! - [`ProbeManager::remove_pod`] when the pod is gone.
//!
//! It reads results with [`ProbeManager::is_started`],
//! [`ProbeManager::is_ready`] and [`ProbeManager::liveness`], and wakes the
//! pod worker on every [`ProbeUpdate`] from [`ProbeManagerOutputs::updates`];
//! [`ProbeManagerOutputs::events`] carries the `Unhealthy`/`ProbeWarning`
//! events to record.
//!
//! Timing (tokio time throughout, so tests can pause it):
//! - the first probe is due `initialDelaySeconds` after the container started
//!   (the start time the runtime reports, so an adopted container is not
//!   held back again);
//! - liveness and startup probes then wait a random part of one period, and
//!   so does every probe of an adopted container, so thousands of probes do
//!   not fire together; a new container's readiness probe runs as soon as it
//!   is due (upstream triggers it on the first status sync);
//! - after that a probe runs every `periodSeconds` (fixed rate: a run longer
//!   than the period makes the next one start right after it);
//! - a startup probe holds liveness and readiness off until it succeeds;
//!   they start then;
//! - readiness starts as Failure, liveness as Success, startup as Unknown; a
//!   new container ID starts over from these values;
//! - a result changes only after `successThreshold` / `failureThreshold`
//!   consecutive runs agree; a run that errored counts for neither;
//! - a liveness or startup probe that reached its failure threshold, and a
//!   startup probe that succeeded, stop until the next container instance.

mod clock;
mod results;
mod worker;

#[cfg(test)]
mod tests;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::Pod;
use tokio::runtime::Handle;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

pub use results::ProbeUpdate;

use crate::events::ProbeEvent;
use crate::handlers::exec::Exec;
use crate::metrics::{ProberMetrics, SeriesLabels, WorkerMetrics};
use crate::prober::{Action, Prober};
use crate::result::{ProbeKind, ProbeState};
use crate::spec::ContainerProbes;
use clock::Clock;
use results::{Notifier, Results};
use worker::Worker;

/// The Kubernetes `major.minor` keelson implements; probes send
/// `User-Agent: kube-probe/1.36`.
pub const KUBE_VERSION: &str = "1.36";

/// Settings of a [`ProbeManager`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeManagerConfig {
    /// `major.minor` used in the probes' `User-Agent` (`kube-probe/<this>`).
    pub kube_version: String,
    /// Spread first probes over a random part of their period (see the
    /// module docs). Tests turn it off to check exact times.
    pub random_start_offset: bool,
    /// Events buffered for the agent; when full, new events are dropped (as
    /// upstream's event broadcaster does) and logged.
    pub event_queue: usize,
}

impl Default for ProbeManagerConfig {
    fn default() -> Self {
        ProbeManagerConfig {
            kube_version: KUBE_VERSION.to_string(),
            random_start_offset: true,
            event_queue: 1024,
        }
    }
}

/// What the manager reports to the agent.
#[derive(Debug)]
pub struct ProbeManagerOutputs {
    /// A probe result changed: wake this pod's worker.
    pub updates: mpsc::UnboundedReceiver<ProbeUpdate>,
    /// Events to record on containers.
    pub events: mpsc::Receiver<ProbeEvent>,
}

/// A container instance that has started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerStart {
    /// The runtime's container ID (results are keyed by it).
    pub container_id: String,
    /// When the container started (CRI `ContainerStatus.started_at`);
    /// `initialDelaySeconds` counts from here.
    pub started_at: SystemTime,
    /// The pod's IPs; the first is probed (`host` defaults to it).
    pub pod_ips: Vec<String>,
    /// Set when the container was already running before keelson saw it
    /// start (keelson restarted and adopts it), with what the API last
    /// reported for this container ID; results start from that instead of
    /// the initial values, and first probes get a random offset.
    pub adopted: Option<ReportedStatus>,
}

/// A container's status as last reported to the API (`started`, `ready`),
/// used to carry probe results across a keelson restart.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReportedStatus {
    /// `containerStatuses[].started`.
    pub started: bool,
    /// `containerStatuses[].ready`.
    pub ready: bool,
}

/// Errors of the manager's API.
#[derive(Debug, thiserror::Error)]
pub enum ProbeManagerError {
    /// `new` was called outside a tokio runtime.
    #[error("the probe manager must be created inside a tokio runtime")]
    NoRuntime,
    /// The metric families could not be registered (already registered?).
    #[error("registering prober metrics: {0}")]
    Metrics(prometheus::Error),
    /// The TLS client for HTTPS probes could not be built.
    #[error("building the TLS client for HTTPS probes: {0}")]
    Tls(#[from] rustls::Error),
    /// The pod has no `metadata.uid`.
    #[error("pod {namespace}/{name} has no metadata.uid")]
    PodWithoutUid {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
    },
    /// `container_started` for a pod that `add_pod` never saw.
    #[error("pod {0} is not known to the probe manager (call add_pod first)")]
    UnknownPod(String),
    /// `container_started` for a container the pod spec does not have.
    #[error("pod {pod_uid} has no container {container}")]
    UnknownContainer {
        /// Pod UID.
        pod_uid: String,
        /// Container name.
        container: String,
    },
}

/// Runs every container's probes and keeps their results. Cheap to clone
/// (a handle); [`ProbeManager::shutdown`] stops all workers.
#[derive(Clone)]
pub struct ProbeManager {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for ProbeManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProbeManager")
            .field("workers", &self.worker_count())
            .finish_non_exhaustive()
    }
}

pub(crate) struct Inner {
    state: Mutex<State>,
    prober: Prober,
    metrics: ProberMetrics,
    notifier: Notifier,
    events: mpsc::Sender<ProbeEvent>,
    config: ProbeManagerConfig,
    clock: Clock,
    runtime: Handle,
    root: CancellationToken,
}

#[derive(Default)]
struct State {
    pods: HashMap<String, PodEntry>,
    workers: HashMap<WorkerKey, WorkerSlot>,
    results: Results,
    next_generation: u64,
}

/// Identifies a worker slot.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct WorkerKey {
    pub pod_uid: String,
    pub container: String,
    pub kind: ProbeKind,
}

struct WorkerSlot {
    container_id: String,
    generation: u64,
    token: CancellationToken,
}

struct PodEntry {
    meta: Arc<PodMeta>,
    containers: HashMap<String, Arc<ContainerProbes>>,
    running: HashMap<String, RunningContainer>,
    /// The pod is terminating: its liveness and startup probes stopped.
    terminating: bool,
}

/// The pod a worker probes, for labels and events.
#[derive(Debug)]
pub(crate) struct PodMeta {
    pub uid: String,
    pub namespace: String,
    pub name: String,
}

/// One probe run as a worker reports it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RunRecord {
    /// Success (including warnings) or Failure.
    pub value: ProbeState,
    /// How long the run took.
    pub took: Duration,
    /// Whether enough runs in a row agree to set the result.
    pub reached_threshold: bool,
}

#[derive(Debug, Clone)]
struct RunningContainer {
    container_id: String,
    started_at: SystemTime,
    pod_ip: String,
    adopted: bool,
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state.lock().unwrap_or_else(PoisonError::into_inner)
}

impl ProbeManager {
    /// Creates a manager that runs exec probes through `exec` and registers
    /// its metrics into `registry`. Must be called inside a tokio runtime
    /// (workers are spawned on it).
    pub fn new<E: Exec>(
        config: ProbeManagerConfig,
        exec: Arc<E>,
        registry: &prometheus::Registry,
    ) -> Result<(ProbeManager, ProbeManagerOutputs), ProbeManagerError> {
        let runtime = Handle::try_current().map_err(|_| ProbeManagerError::NoRuntime)?;
        let metrics = ProberMetrics::register(registry).map_err(ProbeManagerError::Metrics)?;
        let prober = Prober::new(exec, &format!("kube-probe/{}", config.kube_version))?;
        let (updates_tx, updates) = mpsc::unbounded_channel();
        let (events_tx, events) = mpsc::channel(config.event_queue.max(1));
        let inner = Inner {
            state: Mutex::new(State::default()),
            prober,
            metrics,
            notifier: Notifier::new(updates_tx),
            events: events_tx,
            config,
            clock: Clock::new(),
            runtime,
            root: CancellationToken::new(),
        };
        Ok((
            ProbeManager {
                inner: Arc::new(inner),
            },
            ProbeManagerOutputs { updates, events },
        ))
    }

    /// Records the probes of `pod`'s containers and restartable init
    /// containers (sidecars). Idempotent; called again with a changed spec,
    /// the new probes apply from each container's next start. Nothing is
    /// probed until [`ProbeManager::container_started`].
    pub fn add_pod(&self, pod: &Pod) -> Result<(), ProbeManagerError> {
        let meta = &pod.metadata;
        let namespace = meta.namespace.clone().unwrap_or_default();
        let name = meta.name.clone().unwrap_or_default();
        let uid = match meta.uid.as_deref() {
            Some(uid) if !uid.is_empty() => uid.to_string(),
            _ => return Err(ProbeManagerError::PodWithoutUid { namespace, name }),
        };
        let mut containers = HashMap::new();
        if let Some(spec) = &pod.spec {
            let sidecars = spec
                .init_containers
                .iter()
                .flatten()
                .filter(|c| c.restart_policy.as_deref() == Some("Always"));
            for container in spec.containers.iter().chain(sidecars) {
                let (probes, warnings) = ContainerProbes::from_container(container);
                for (kind, w) in warnings {
                    tracing::warn!(
                        pod = %format!("{namespace}/{name}"), uid = %uid, container = %container.name,
                        probe = %kind, field = w.field, value = w.value, used = w.used,
                        "probe field out of range; using the default"
                    );
                }
                containers.insert(container.name.clone(), Arc::new(probes));
            }
        }
        let mut state = lock(&self.inner.state);
        match state.pods.get_mut(&uid) {
            Some(entry) => entry.containers = containers,
            None => {
                let meta = Arc::new(PodMeta {
                    uid: uid.clone(),
                    namespace,
                    name,
                });
                state.pods.insert(
                    uid,
                    PodEntry {
                        meta,
                        containers,
                        running: HashMap::new(),
                        terminating: false,
                    },
                );
            }
        }
        Ok(())
    }

    /// A container instance started: its probes begin (startup first, if
    /// it has one). A new container ID replaces the previous instance's
    /// workers and results; the same ID again is a no-op.
    pub fn container_started(
        &self,
        pod_uid: &str,
        container: &str,
        start: ContainerStart,
    ) -> Result<(), ProbeManagerError> {
        let mut guard = lock(&self.inner.state);
        let state = &mut *guard;
        let pod = state
            .pods
            .get_mut(pod_uid)
            .ok_or_else(|| ProbeManagerError::UnknownPod(pod_uid.to_string()))?;
        let probes = pod.containers.get(container).cloned().ok_or_else(|| {
            ProbeManagerError::UnknownContainer {
                pod_uid: pod_uid.to_string(),
                container: container.to_string(),
            }
        })?;
        let previous = pod.running.get(container).map(|r| r.container_id.clone());
        if previous.as_deref() != Some(start.container_id.as_str()) {
            if let Some(old) = previous {
                state.results.remove_container(&old);
                stop_container_workers(&mut state.workers, pod_uid, container, None);
            }
            let pod_ip = start.pod_ips.first().cloned().unwrap_or_default();
            let running = RunningContainer {
                container_id: start.container_id.clone(),
                started_at: start.started_at,
                pod_ip,
                adopted: start.adopted.is_some(),
            };
            pod.running.insert(container.to_string(), running);
            if let Some(reported) = start.adopted {
                seed_adopted(&mut state.results, &start.container_id, &probes, reported);
            }
        }
        let startup_done =
            state.results.get(&start.container_id, ProbeKind::Startup) == Some(ProbeState::Success);
        if probes.startup.is_some() && !startup_done {
            self.inner
                .ensure_worker(state, pod_uid, container, ProbeKind::Startup);
        } else {
            self.inner
                .ensure_worker(state, pod_uid, container, ProbeKind::Readiness);
            self.inner
                .ensure_worker(state, pod_uid, container, ProbeKind::Liveness);
        }
        Ok(())
    }

    /// A container instance stopped (exited, or was killed): its workers stop
    /// and its results are forgotten. An ID that is not the container's
    /// current one only stops workers still bound to it (late events are
    /// harmless).
    pub fn container_stopped(&self, pod_uid: &str, container: &str, container_id: &str) {
        let mut guard = lock(&self.inner.state);
        let state = &mut *guard;
        if let Some(pod) = state.pods.get_mut(pod_uid)
            && pod
                .running
                .get(container)
                .is_some_and(|r| r.container_id == container_id)
        {
            pod.running.remove(container);
        }
        stop_container_workers(&mut state.workers, pod_uid, container, Some(container_id));
        state.results.remove_container(container_id);
    }

    /// The pod is terminating (upstream `StopLivenessAndStartup`): stop its
    /// liveness and startup probes and forget their results, as an upstream
    /// worker does when it stops (pkg/kubelet/prober/worker.go). A running
    /// container then counts as started, and no liveness failure is left
    /// to act on; readiness keeps running until the containers stop.
    pub fn stop_liveness_and_startup(&self, pod_uid: &str) {
        let mut guard = lock(&self.inner.state);
        let state = &mut *guard;
        state.workers.retain(|key, slot| {
            let stop = key.pod_uid == pod_uid && key.kind != ProbeKind::Readiness;
            if stop {
                slot.token.cancel();
            }
            !stop
        });
        if let Some(pod) = state.pods.get_mut(pod_uid) {
            pod.terminating = true;
            for running in pod.running.values() {
                for kind in [ProbeKind::Liveness, ProbeKind::Startup] {
                    state.results.remove(&running.container_id, kind);
                }
            }
        }
    }

    /// The pod is gone: stop all its workers, forget its results and delete
    /// its metric series.
    pub fn remove_pod(&self, pod_uid: &str) {
        let mut guard = lock(&self.inner.state);
        let state = &mut *guard;
        state.workers.retain(|key, slot| {
            let stop = key.pod_uid == pod_uid;
            if stop {
                slot.token.cancel();
            }
            !stop
        });
        if let Some(pod) = state.pods.remove(pod_uid) {
            for running in pod.running.values() {
                state.results.remove_container(&running.container_id);
            }
            for (container, probes) in &pod.containers {
                for kind in ProbeKind::ALL {
                    if probes.get(kind).is_some() {
                        self.inner
                            .metrics
                            .remove(&series_labels(&pod.meta, container, kind));
                    }
                }
            }
        }
    }

    /// Removes every pod whose UID is not in `desired` (upstream
    /// `CleanupPods`, for pods deleted while keelson was down).
    pub fn cleanup_pods(&self, desired: &HashSet<String>) {
        let gone: Vec<String> = {
            let state = lock(&self.inner.state);
            state
                .pods
                .keys()
                .filter(|uid| !desired.contains(*uid))
                .cloned()
                .collect()
        };
        for uid in gone {
            self.remove_pod(&uid);
        }
    }

    /// The cached result of one probe of a container instance; `None` when
    /// the container has no such probe running (or never started).
    pub fn result(&self, kind: ProbeKind, container_id: &str) -> Option<ProbeState> {
        lock(&self.inner.state).results.get(container_id, kind)
    }

    /// The liveness result: `Some(Failure)` means kill the container (with
    /// the probe's `terminationGracePeriodSeconds` if set) and restart it per
    /// the restart policy.
    pub fn liveness(&self, container_id: &str) -> Option<ProbeState> {
        self.result(ProbeKind::Liveness, container_id)
    }

    /// The readiness result.
    pub fn readiness(&self, container_id: &str) -> Option<ProbeState> {
        self.result(ProbeKind::Readiness, container_id)
    }

    /// The startup result: `Some(Failure)` means kill and restart, like a
    /// liveness failure.
    pub fn startup(&self, container_id: &str) -> Option<ProbeState> {
        self.result(ProbeKind::Startup, container_id)
    }

    /// `containerStatuses[].started` of a running container: true when it
    /// has no startup probe or its startup probe succeeded (upstream
    /// `isContainerStarted`). A container of an unknown pod counts as having
    /// no probes.
    pub fn is_started(&self, pod_uid: &str, container: &str, container_id: &str) -> bool {
        let state = lock(&self.inner.state);
        is_started_locked(&state, pod_uid, container, container_id)
    }

    /// `containerStatuses[].ready` of a running container: started, and no
    /// readiness probe or a successful one (upstream `isContainerReady`).
    /// The caller answers `false` itself for a container that is not running.
    pub fn is_ready(&self, pod_uid: &str, container: &str, container_id: &str) -> bool {
        let state = lock(&self.inner.state);
        if !is_started_locked(&state, pod_uid, container, container_id) {
            return false;
        }
        match probes_of(&state, pod_uid, container) {
            Some(probes) if probes.readiness.is_some() => {
                state.results.get(container_id, ProbeKind::Readiness) == Some(ProbeState::Success)
            }
            _ => true,
        }
    }

    /// The probe-level `terminationGracePeriodSeconds` of a container's
    /// liveness or startup probe, if set.
    pub fn termination_grace_period_seconds(
        &self,
        pod_uid: &str,
        container: &str,
        kind: ProbeKind,
    ) -> Option<i64> {
        let state = lock(&self.inner.state);
        probes_of(&state, pod_uid, container)?
            .get(kind)?
            .termination_grace_period_seconds
    }

    /// Number of running probe workers.
    pub fn worker_count(&self) -> usize {
        lock(&self.inner.state).workers.len()
    }

    /// Number of container instances with cached results.
    pub fn cached_containers(&self) -> usize {
        lock(&self.inner.state).results.containers()
    }

    /// The manager's wall clock (wall time at creation plus tokio time
    /// since), the clock `started_at` is compared with.
    pub fn wall_now(&self) -> SystemTime {
        self.inner.clock.wall_now()
    }

    /// Stops every worker and forgets all state.
    pub fn shutdown(&self) {
        self.inner.root.cancel();
        let mut state = lock(&self.inner.state);
        *state = State::default();
    }
}

fn probes_of<'a>(
    state: &'a State,
    pod_uid: &str,
    container: &str,
) -> Option<&'a Arc<ContainerProbes>> {
    state.pods.get(pod_uid)?.containers.get(container)
}

fn is_started_locked(state: &State, pod_uid: &str, container: &str, container_id: &str) -> bool {
    if state.pods.get(pod_uid).is_some_and(|p| p.terminating) {
        // No startup worker and no result left: started.
        return true;
    }
    match probes_of(state, pod_uid, container) {
        Some(probes) if probes.startup.is_some() => {
            state.results.get(container_id, ProbeKind::Startup) == Some(ProbeState::Success)
        }
        _ => true,
    }
}

/// Carries what the API last said across a restart (upstream adoption).
fn seed_adopted(
    results: &mut Results,
    container_id: &str,
    probes: &ContainerProbes,
    reported: ReportedStatus,
) {
    if probes.startup.is_some() && results.get(container_id, ProbeKind::Startup).is_none() {
        let state = if reported.started {
            ProbeState::Success
        } else {
            ProbeState::Unknown
        };
        results.seed(container_id, ProbeKind::Startup, state);
    }
    if probes.readiness.is_some() && results.get(container_id, ProbeKind::Readiness).is_none() {
        let state = if reported.ready {
            ProbeState::Success
        } else {
            ProbeState::Failure
        };
        results.seed(container_id, ProbeKind::Readiness, state);
    }
    if probes.liveness.is_some() && results.get(container_id, ProbeKind::Liveness).is_none() {
        results.seed(container_id, ProbeKind::Liveness, ProbeState::Success);
    }
}

/// Stops a container's workers; with `only_id`, only those bound to it.
fn stop_container_workers(
    workers: &mut HashMap<WorkerKey, WorkerSlot>,
    pod_uid: &str,
    container: &str,
    only_id: Option<&str>,
) {
    for kind in ProbeKind::ALL {
        let key = WorkerKey {
            pod_uid: pod_uid.to_string(),
            container: container.to_string(),
            kind,
        };
        let matches = workers
            .get(&key)
            .is_some_and(|slot| only_id.is_none_or(|id| slot.container_id == id));
        if matches && let Some(slot) = workers.remove(&key) {
            slot.token.cancel();
        }
    }
}

fn series_labels(meta: &PodMeta, container: &str, kind: ProbeKind) -> SeriesLabels {
    SeriesLabels {
        kind,
        container: container.to_string(),
        pod: meta.name.clone(),
        namespace: meta.namespace.clone(),
        pod_uid: meta.uid.clone(),
    }
}

impl Inner {
    /// Starts the `kind` worker of a running container unless it already
    /// runs for this instance, the container has no such probe, or a
    /// terminal result (liveness/startup failure) was already reached.
    fn ensure_worker(
        self: &Arc<Self>,
        state: &mut State,
        pod_uid: &str,
        container: &str,
        kind: ProbeKind,
    ) {
        let Some(pod) = state.pods.get(pod_uid) else {
            return;
        };
        let (Some(probes), Some(running)) =
            (pod.containers.get(container), pod.running.get(container))
        else {
            return;
        };
        let Some(spec) = probes.get(kind).cloned() else {
            return;
        };
        let key = WorkerKey {
            pod_uid: pod_uid.to_string(),
            container: container.to_string(),
            kind,
        };
        if let Some(slot) = state.workers.get(&key) {
            if slot.container_id == running.container_id {
                return;
            }
            slot.token.cancel();
            state.workers.remove(&key);
        }
        match state.results.get(&running.container_id, kind) {
            Some(ProbeState::Failure) if kind != ProbeKind::Readiness => return,
            Some(_) => {}
            None => state
                .results
                .seed(&running.container_id, kind, kind.initial_state()),
        }

        let meta = Arc::clone(&pod.meta);
        let missing = format!(
            "{}_{}({}):{}",
            meta.name, meta.namespace, meta.uid, container
        );
        let action = Action::prepare(
            &spec.handler,
            &running.pod_ip,
            &running.container_id,
            self.prober.user_agent(),
            &missing,
        );
        let due = self
            .clock
            .instant_after(running.started_at, spec.initial_delay);
        let offset = if self.config.random_start_offset
            && (running.adopted || kind != ProbeKind::Readiness)
        {
            spec.period.mul_f64(rand::random::<f64>())
        } else {
            Duration::ZERO
        };
        let first_at: Instant = due + offset;

        state.next_generation += 1;
        let generation = state.next_generation;
        let token = self.root.child_token();
        let metrics = self
            .metrics
            .for_worker(series_labels(&meta, container, kind));
        let container_id = running.container_id.clone();
        state.workers.insert(
            key.clone(),
            WorkerSlot {
                container_id: container_id.clone(),
                generation,
                token: token.clone(),
            },
        );
        tracing::debug!(
            pod = %format!("{}/{}", meta.namespace, meta.name), uid = %meta.uid, container = %container,
            container_id = %container_id, probe = %kind, "starting probe worker"
        );
        let worker = Worker::new(
            Arc::clone(self),
            key,
            generation,
            token,
            spec,
            action,
            meta,
            container_id,
            first_at,
            metrics,
        );
        self.runtime.spawn(worker.run());
    }

    /// Accounts one probe run of a worker: counts it in the metrics and, when
    /// it reached its threshold, stores the result (notifying on change) and
    /// hands a passed startup probe over to liveness and readiness. Returns
    /// false when the worker was stopped or replaced meanwhile (nothing is
    /// recorded; doing this under the state lock keeps a removed pod's
    /// metric series from coming back).
    fn record_run(
        self: &Arc<Self>,
        key: &WorkerKey,
        generation: u64,
        container_id: &str,
        run: RunRecord,
        metrics: &mut WorkerMetrics,
    ) -> bool {
        let mut guard = lock(&self.state);
        let state = &mut *guard;
        if state
            .workers
            .get(key)
            .is_none_or(|slot| slot.generation != generation)
        {
            return false;
        }
        match run.value {
            ProbeState::Success => metrics.success(run.took.as_secs_f64()),
            _ => metrics.failure(),
        }
        if !run.reached_threshold {
            return true;
        }
        if state.results.set(container_id, key.kind, run.value) {
            self.notifier.send(ProbeUpdate {
                pod_uid: key.pod_uid.clone(),
                container_name: key.container.clone(),
                container_id: container_id.to_string(),
                kind: key.kind,
                state: run.value,
            });
        }
        if key.kind == ProbeKind::Startup && run.value == ProbeState::Success {
            self.ensure_worker(state, &key.pod_uid, &key.container, ProbeKind::Readiness);
            self.ensure_worker(state, &key.pod_uid, &key.container, ProbeKind::Liveness);
        }
        true
    }

    /// A worker ended on its own; free its slot if it still holds it.
    fn worker_exited(&self, key: &WorkerKey, generation: u64) {
        let mut state = lock(&self.state);
        if state
            .workers
            .get(key)
            .is_some_and(|slot| slot.generation == generation)
        {
            state.workers.remove(key);
        }
    }

    /// Hands an event to the agent, dropping it if the queue is full.
    fn emit(&self, event: ProbeEvent) {
        if let Err(mpsc::error::TrySendError::Full(event)) = self.events.try_send(event) {
            tracing::warn!(
                pod = %format!("{}/{}", event.namespace, event.pod_name), container = %event.container_name,
                reason = event.reason, message = %event.message, "probe event queue full; event dropped"
            );
        }
    }
}
