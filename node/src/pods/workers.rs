//! Pod workers (kubelet's `podWorkers`): one task per pod UID, serial and
//! level-triggered. Each wake-up takes the newest pod object and a runtime
//! view newer than the previous sync, and runs the phase the pod is in:
//! syncing (keep it running), terminating (stop it within the grace
//! period), terminated (release volumes and cgroups), finished. A
//! termination request cancels a sync in flight; the grace period only
//! ever shortens. Syncs repeat every `syncFrequency` (jittered), after a
//! failure every ~10 s, and exactly when a restart or pull backoff ends.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::Pod;
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::lifecycle::{FinalStatus, PodLifecycle, SyncOutcome, UpdateKind};
use crate::pod::podutil;

/// kubelet's `backOffPeriod`: the retry delay after a failed sync.
pub const BACKOFF_PERIOD: Duration = Duration::from_secs(10);
/// `workerBackOffPeriodJitterFactor`.
const BACKOFF_JITTER: f64 = 0.5;
/// `workerResyncIntervalJitterFactor`.
const RESYNC_JITTER: f64 = 0.5;
/// `backOffOnTransientErrorPeriod` (network not ready).
const TRANSIENT_BACKOFF: Duration = Duration::from_secs(1);

/// The phase of a pod's worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// The pod should run.
    Syncing,
    /// Stopping every container.
    Terminating,
    /// Releasing volumes and cgroups.
    Terminated,
    /// Nothing left to do.
    Finished,
}

/// A request to terminate a pod.
#[derive(Debug, Clone, Default)]
pub struct KillRequest {
    /// Grace period override in seconds.
    pub grace: Option<i64>,
    /// The status to end with (eviction).
    pub final_status: Option<FinalStatus>,
    /// The pod left its source (deleted from the API, manifest removed).
    pub removed: bool,
}

#[derive(Debug)]
struct State {
    pod: Arc<Pod>,
    kind: UpdateKind,
    phase: Phase,
    grace: Option<i64>,
    final_status: Option<FinalStatus>,
    removed: bool,
    pending: bool,
    requeue_at: Option<Instant>,
    last_sync_end: SystemTime,
    in_flight: Option<CancellationToken>,
}

struct Worker {
    state: Mutex<State>,
    wake: Notify,
}

impl Worker {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// All pod workers; cheap to clone.
#[derive(Clone)]
pub struct PodWorkers {
    workers: Arc<Mutex<HashMap<String, Arc<Worker>>>>,
    lifecycle: Arc<PodLifecycle>,
    resync: Duration,
    stop: CancellationToken,
}

impl std::fmt::Debug for PodWorkers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PodWorkers")
            .field("workers", &self.lock().len())
            .finish()
    }
}

fn jitter(d: Duration, factor: f64) -> Duration {
    let extra = rand::random::<f64>() * factor * d.as_secs_f64();
    d + Duration::from_secs_f64(extra)
}

/// kubelet's `calculateEffectiveGracePeriod` (pod_workers.go) for a pod
/// not yet terminating: the deletion grace, then an override (eviction's)
/// only where it is shorter — a zero so far takes either — else the spec's;
/// at least 1 s. The worker keeps the value from only decreasing.
pub fn effective_grace(pod: &Pod, override_grace: Option<i64>) -> i64 {
    let mut g = 0;
    let mut overridden = false;
    for o in [pod.metadata.deletion_grace_period_seconds, override_grace]
        .into_iter()
        .flatten()
    {
        if g == 0 || o < g {
            g = o;
            overridden = true;
        }
    }
    if !overridden && g == 0 {
        g = podutil::termination_grace(pod);
    }
    g.max(1)
}

impl PodWorkers {
    /// Workers syncing every `resync` (kubelet's `syncFrequency`).
    pub fn new(lifecycle: Arc<PodLifecycle>, resync: Duration, stop: CancellationToken) -> Self {
        PodWorkers {
            workers: Arc::new(Mutex::new(HashMap::new())),
            lifecycle,
            resync,
            stop,
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Arc<Worker>>> {
        self.workers.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The lifecycle the workers run.
    pub fn lifecycle(&self) -> &Arc<PodLifecycle> {
        &self.lifecycle
    }

    /// `UpdatePod`: hands the newest pod object (and maybe a kill request)
    /// to the pod's worker, starting one for a new UID.
    pub fn update_pod(&self, pod: Arc<Pod>, kind: UpdateKind, kill: Option<KillRequest>) {
        let uid = podutil::uid(&pod).to_string();
        if uid.is_empty() {
            tracing::warn!(pod = %podutil::key(&pod), "pod without UID ignored");
            return;
        }
        let (worker, created) = {
            let mut w = self.lock();
            match w.get(&uid) {
                Some(w) => (w.clone(), false),
                None => {
                    if kill.as_ref().is_some_and(|k| k.removed) {
                        // Gone before we ever ran it: nothing to stop here
                        // (housekeeping stops what the runtime still has).
                        return;
                    }
                    let worker = Arc::new(Worker {
                        state: Mutex::new(State {
                            pod: pod.clone(),
                            kind: UpdateKind::Create,
                            phase: Phase::Syncing,
                            grace: None,
                            final_status: None,
                            removed: false,
                            pending: true,
                            requeue_at: None,
                            last_sync_end: std::time::UNIX_EPOCH,
                            in_flight: None,
                        }),
                        wake: Notify::new(),
                    });
                    w.insert(uid.clone(), worker.clone());
                    (worker, true)
                }
            }
        };
        if created {
            self.lifecycle.mark_seen(&uid);
            let this = self.clone();
            let w = worker.clone();
            let u = uid.clone();
            tokio::spawn(async move { this.run_worker(u, w).await });
        }
        let mut st = worker.lock();
        if st.phase == Phase::Finished {
            st.pod = pod.clone();
            if kill.as_ref().is_some_and(|k| k.removed) {
                st.removed = true;
                st.pending = true;
            } else if pod.metadata.deletion_timestamp.is_some() {
                // A finished pod that is now deleted: report it terminal
                // again so the status manager removes the object.
                self.lifecycle.status.terminate_pod(&pod);
            }
            drop(st);
            worker.wake.notify_one();
            return;
        }
        if !created {
            st.kind = if kill.is_some() {
                UpdateKind::Kill
            } else {
                kind
            };
        }
        st.pod = pod.clone();
        let deleting = pod.metadata.deletion_timestamp.is_some();
        if deleting || kill.is_some() {
            let requested = kill.as_ref().and_then(|k| k.grace);
            let grace = effective_grace(&pod, requested);
            let shorter = st.grace.is_none_or(|g| grace < g);
            if st.phase == Phase::Syncing {
                st.phase = Phase::Terminating;
                st.grace = Some(grace);
            } else if st.phase == Phase::Terminating && shorter {
                st.grace = Some(grace);
            }
            if let Some(k) = kill {
                if k.final_status.is_some() {
                    st.final_status = k.final_status;
                }
                if k.removed {
                    st.removed = true;
                }
            }
            // Stop a sync in flight: termination goes first.
            if let Some(t) = st.in_flight.take()
                && (st.phase == Phase::Terminating)
                && (shorter || deleting)
            {
                t.cancel();
            }
        }
        st.pending = true;
        drop(st);
        worker.wake.notify_one();
    }

    /// Wakes a pod's worker for a resync (PLEG event, probe change).
    pub fn wake(&self, uid: &str) {
        let w = self.lock().get(uid).cloned();
        if let Some(w) = w {
            let mut st = w.lock();
            st.pending = true;
            if st.kind != UpdateKind::Kill {
                st.kind = UpdateKind::Sync;
            }
            drop(st);
            w.wake.notify_one();
        }
    }

    /// The phase of a pod's worker (`None`: no worker).
    pub fn phase(&self, uid: &str) -> Option<Phase> {
        self.lock().get(uid).map(|w| w.lock().phase)
    }

    /// What kubelet's pod state provider reports for `uid`:
    /// (terminated, deleted, evicted); `None` when no worker knows it.
    pub fn pod_state(&self, uid: &str) -> Option<(bool, bool, bool)> {
        let w = self.lock().get(uid).cloned()?;
        let st = w.lock();
        let terminated = matches!(st.phase, Phase::Terminated | Phase::Finished);
        let deleted = st.removed || st.pod.metadata.deletion_timestamp.is_some();
        let evicted = st
            .final_status
            .as_ref()
            .is_some_and(|f| f.reason == "Evicted");
        Some((terminated, deleted, evicted))
    }

    /// When a pod's last sync ended and when its worker syncs again at the
    /// latest (a back-off's end, a retry), for diagnose.
    pub fn timing(&self, uid: &str) -> Option<(SystemTime, Option<Instant>)> {
        let w = self.lock().get(uid).cloned()?;
        let st = w.lock();
        Some((st.last_sync_end, st.requeue_at))
    }

    /// UIDs with a worker.
    pub fn uids(&self) -> Vec<String> {
        self.lock().keys().cloned().collect()
    }

    /// `CouldHaveRunningContainers`.
    pub fn could_have_running_containers(&self, uid: &str) -> bool {
        match self.phase(uid) {
            Some(Phase::Terminated) | Some(Phase::Finished) => false,
            Some(_) => true,
            // Unknown to the workers: maybe adopted from the runtime.
            None => true,
        }
    }

    /// Pods whose worker is still syncing them (not terminating).
    pub fn syncing_pods(&self) -> Vec<Arc<Pod>> {
        self.lock()
            .values()
            .filter_map(|w| {
                let st = w.lock();
                (st.phase == Phase::Syncing).then(|| st.pod.clone())
            })
            .collect()
    }

    /// Replaces a pod's object without waking its worker: a change of
    /// status only (kubelet's pod manager takes it; the next sync uses it).
    pub fn replace_pod(&self, pod: Arc<Pod>) {
        let w = self.lock().get(podutil::uid(&pod)).cloned();
        if let Some(w) = w {
            let mut st = w.lock();
            if st.phase != Phase::Finished {
                st.pod = pod;
            }
        }
    }

    /// Pods whose containers may still use the node's resources: those
    /// syncing, and those terminating (`true`).
    pub fn pods_using_resources(&self) -> Vec<(Arc<Pod>, bool)> {
        self.lock()
            .values()
            .filter_map(|w| {
                let st = w.lock();
                match st.phase {
                    Phase::Syncing => Some((st.pod.clone(), false)),
                    Phase::Terminating => Some((st.pod.clone(), true)),
                    Phase::Terminated | Phase::Finished => None,
                }
            })
            .collect()
    }

    async fn wait(&self, w: &Worker) -> bool {
        loop {
            let requeue = {
                let mut st = w.lock();
                if st.pending {
                    st.pending = false;
                    return true;
                }
                match st.requeue_at {
                    Some(t) if t <= Instant::now() => {
                        st.requeue_at = None;
                        if st.kind != UpdateKind::Kill {
                            st.kind = UpdateKind::Sync;
                        }
                        return true;
                    }
                    other => other,
                }
            };
            let far = Instant::now() + Duration::from_secs(3600);
            tokio::select! {
                _ = self.stop.cancelled() => return false,
                _ = w.wake.notified() => {}
                _ = tokio::time::sleep_until(requeue.unwrap_or(far)) => {}
            }
        }
    }

    fn requeue(&self, w: &Worker, after: Duration) {
        let mut st = w.lock();
        let at = Instant::now() + after;
        st.requeue_at = Some(match st.requeue_at {
            Some(t) if t < at => t,
            _ => at,
        });
    }

    /// kubelet's `ShouldSync` of the active deadline handler: the pod is
    /// synced again when its `activeDeadlineSeconds` pass.
    fn requeue_at_deadline(&self, w: &Worker, pod: &Pod) {
        if let Some(t) = self.lifecycle.active_deadline(pod) {
            self.requeue(w, self.until(t));
        }
    }

    fn until(&self, t: SystemTime) -> Duration {
        t.duration_since(self.lifecycle.clock.now())
            .unwrap_or(Duration::ZERO)
    }

    async fn run_worker(self, uid: String, w: Arc<Worker>) {
        loop {
            if !self.wait(&w).await {
                return;
            }
            let (pod, phase, kind, grace, final_status, removed, newer_than) = {
                let st = w.lock();
                (
                    st.pod.clone(),
                    st.phase,
                    st.kind,
                    st.grace,
                    st.final_status.clone(),
                    st.removed,
                    st.last_sync_end,
                )
            };
            let started = Instant::now();
            match phase {
                Phase::Syncing => {
                    let token = CancellationToken::new();
                    w.lock().in_flight = Some(token.clone());
                    let outcome = tokio::select! {
                        _ = token.cancelled() => None,
                        r = Box::pin(self.sync_once(&pod, kind, newer_than)) => Some(r),
                    };
                    w.lock().in_flight = None;
                    self.lifecycle
                        .metrics
                        .pod_worker_duration
                        .with_label_values(&[kind.as_str()])
                        .observe(started.elapsed().as_secs_f64());
                    match outcome {
                        None => {
                            tracing::debug!(pod = %podutil::key(&pod), "sync cancelled by a termination request");
                        }
                        Some(Ok(SyncOutcome::Terminal)) => {
                            let mut st = w.lock();
                            if st.phase == Phase::Syncing {
                                st.phase = Phase::Terminating;
                                st.grace = Some(effective_grace(&st.pod, None));
                            }
                            st.pending = true;
                        }
                        Some(Ok(SyncOutcome::Running(retry_at))) => {
                            let mut next = jitter(self.resync, RESYNC_JITTER);
                            if let Some(t) = retry_at {
                                next = next.min(self.until(t));
                            }
                            self.requeue(&w, next);
                            self.requeue_at_deadline(&w, &pod);
                        }
                        Some(Err(f)) => {
                            if !only_backoff(&f.message) {
                                tracing::info!(pod = %podutil::key(&pod), error = %f.message, "error syncing pod, skipping");
                            }
                            let next = match f.retry_at {
                                // A backoff: retry once it ends (kubelet's
                                // `MinBackoffExpiration`, at most a resync).
                                Some(t) => jitter(self.until(t).min(self.resync), BACKOFF_JITTER),
                                None if f.message.contains(super::lifecycle::NETWORK_NOT_READY) => {
                                    jitter(TRANSIENT_BACKOFF, BACKOFF_JITTER)
                                }
                                None => jitter(BACKOFF_PERIOD, BACKOFF_JITTER),
                            };
                            self.requeue(&w, next);
                            self.requeue_at_deadline(&w, &pod);
                        }
                    }
                }
                Phase::Terminating => {
                    let grace = grace.unwrap_or_else(|| effective_grace(&pod, None));
                    let result = Box::pin(async {
                        let rt = self.lifecycle.runtime_status(&pod, newer_than).await?;
                        Box::pin(self.lifecycle.sync_terminating_pod(
                            &pod,
                            &rt,
                            grace,
                            final_status.as_ref(),
                        ))
                        .await
                    })
                    .await;
                    match result {
                        Ok(()) => {
                            let mut st = w.lock();
                            st.phase = Phase::Terminated;
                            st.pending = true;
                        }
                        Err(e) => {
                            tracing::warn!(pod = %podutil::key(&pod), error = %e, "error terminating pod; will retry");
                            self.requeue(&w, jitter(BACKOFF_PERIOD, BACKOFF_JITTER));
                        }
                    }
                }
                Phase::Terminated => {
                    let result = Box::pin(async {
                        let rt = self.lifecycle.runtime_status(&pod, newer_than).await?;
                        Box::pin(self.lifecycle.sync_terminated_pod(&pod, &rt)).await
                    })
                    .await;
                    match result {
                        Ok(()) => {
                            let mut st = w.lock();
                            st.phase = Phase::Finished;
                            st.pending = true;
                        }
                        Err(e) => {
                            tracing::warn!(pod = %podutil::key(&pod), error = %e, "error cleaning up terminated pod; will retry");
                            self.requeue(&w, jitter(BACKOFF_PERIOD, BACKOFF_JITTER));
                        }
                    }
                }
                Phase::Finished => {
                    if removed {
                        self.lock().remove(&uid);
                        self.lifecycle.forget(&uid).await;
                        tracing::debug!(pod = %podutil::key(&pod), "pod worker finished and removed");
                        return;
                    }
                }
            }
            w.lock().last_sync_end = self.lifecycle.clock.now();
        }
    }

    async fn sync_once(
        &self,
        pod: &Pod,
        kind: UpdateKind,
        newer_than: SystemTime,
    ) -> Result<SyncOutcome, super::lifecycle::SyncFailure> {
        let rt = self
            .lifecycle
            .runtime_status(pod, newer_than)
            .await
            .map_err(|e| {
                self.lifecycle.events.pod(
                    pod,
                    keelson_common::events::EventType::Warning,
                    super::events::FAILED_SYNC,
                    format!("error determining status: {e}"),
                );
                super::lifecycle::SyncFailure {
                    message: format!("error determining status: {e}"),
                    retry_at: None,
                }
            })?;
        let r = Box::pin(self.lifecycle.sync_pod(kind, pod, &rt)).await;
        // Probes follow the containers as they are after this sync.
        if self.lifecycle.probes.is_some() && has_probes(pod) {
            let now = self.lifecycle.clock.now();
            if let Ok(after) = self.lifecycle.runtime_status(pod, now).await {
                self.lifecycle.sync_probes(pod, &after);
            }
        }
        r
    }
}

fn has_probes(pod: &Pod) -> bool {
    podutil::containers(pod)
        .iter()
        .chain(podutil::init_containers(pod))
        .any(|c| {
            c.liveness_probe.is_some() || c.readiness_probe.is_some() || c.startup_probe.is_some()
        })
}

fn only_backoff(message: &str) -> bool {
    message.contains("CrashLoopBackOff") || message.contains("ImagePullBackOff")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn effective_grace_periods() {
        let mut p: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p"}, "spec": {"terminationGracePeriodSeconds": 20, "containers": []}
        }))
        .expect("pod");
        assert_eq!(effective_grace(&p, None), 20);
        p.metadata.deletion_grace_period_seconds = Some(5);
        assert_eq!(effective_grace(&p, None), 5);
        assert_eq!(effective_grace(&p, Some(0)), 1);
        assert_eq!(effective_grace(&p, Some(3)), 3);
        // A longer override does not extend the deletion's grace.
        assert_eq!(effective_grace(&p, Some(30)), 5);
        // Not being deleted: the override, shorter or longer than the spec's.
        p.metadata.deletion_grace_period_seconds = None;
        assert_eq!(effective_grace(&p, Some(30)), 30);
        assert_eq!(effective_grace(&p, Some(2)), 2);
        // A force deletion (0) so far: kubelet lets an override replace it.
        p.metadata.deletion_grace_period_seconds = Some(0);
        assert_eq!(effective_grace(&p, None), 1);
        assert_eq!(effective_grace(&p, Some(7)), 7);
    }
}
