//! The pod lifecycle event generator (kubelet's generic and evented PLEG):
//! relists every sandbox and container each second, compares with the
//! previous relist, refreshes the runtime cache of pods whose containers
//! changed and wakes only their workers. When the runtime offers CRI
//! `GetContainerEvents`, events wake workers at once and the relist stays
//! as the safety net; when it answers Unimplemented (containerd 1.6) the
//! PLEG says so once and relists only. Healthy while a relist completed
//! within the last 3 minutes. A pod worker can ask for one pod to be
//! relisted at once (`RequestRelist`, kubelet's PLEGOnDemandRelist, beta and
//! on in v1.36, after a sync that did something) or to be inspected and
//! synced at the next relist even if nothing changed (`RequestReinspect`,
//! after an in-place resize).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use futures::StreamExt;
use keelson_common::gofmt;
use keelson_cri::api;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::cache::RuntimeCache;
use super::metrics::PodMetrics;
use super::runtime::RuntimeManager;
use crate::pod::labels::{POD_NAME, POD_NAMESPACE, POD_UID};

/// kubelet's relist period.
pub const RELIST_PERIOD: Duration = Duration::from_secs(1);
/// kubelet's `relistThreshold`.
pub const RELIST_THRESHOLD: Duration = Duration::from_secs(180);
/// Stream attempts before the evented part gives up for a while.
const MAX_STREAM_RETRIES: u32 = 5;
/// How long the evented part waits before trying again after giving up.
const STREAM_RETRY_AFTER: Duration = Duration::from_secs(300);

/// What a relist saw of one pod.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct PodRecord {
    name: String,
    namespace: String,
    /// container or sandbox id → state (sandboxes: 0 ready, 1 not ready;
    /// containers: CRI state + 10).
    states: BTreeMap<String, i32>,
}

/// Requests to the PLEG from pod workers; cheap to clone.
#[derive(Debug, Clone)]
pub struct PlegRequests {
    relist: mpsc::UnboundedSender<(String, Instant)>,
    reinspect: Arc<Mutex<HashSet<String>>>,
}

/// The PLEG's end of [`PlegRequests`].
#[derive(Debug)]
pub struct PlegRequestsRx {
    relist: mpsc::UnboundedReceiver<(String, Instant)>,
    reinspect: Arc<Mutex<HashSet<String>>>,
}

/// A request channel for a PLEG made later.
pub fn requests() -> (PlegRequests, PlegRequestsRx) {
    let (tx, rx) = mpsc::unbounded_channel();
    let reinspect = Arc::new(Mutex::new(HashSet::new()));
    (
        PlegRequests {
            relist: tx,
            reinspect: reinspect.clone(),
        },
        PlegRequestsRx {
            relist: rx,
            reinspect,
        },
    )
}

impl PlegRequests {
    /// `RequestRelist`: relist this pod now (unless a full relist starts
    /// first), so that a container the sync started or stopped shows at
    /// once rather than at the next relist.
    pub fn relist(&self, uid: &str) {
        let _ = self.relist.send((uid.to_string(), Instant::now()));
    }

    /// `RequestReinspect`: at the next relist, read the pod's status and
    /// sync it even if no container changed state (a resize changes
    /// resources, not states).
    pub fn reinspect(&self, uid: &str) {
        self.reinspect
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(uid.to_string());
    }
}

/// A change the PLEG saw (for tests and logs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodLifecycleEvent {
    /// The pod.
    pub uid: String,
    /// The container or sandbox concerned.
    pub id: String,
    /// What happened.
    pub kind: EventKind,
}

/// kubelet's PLEG event types.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    /// A container started.
    ContainerStarted,
    /// A container exited.
    ContainerDied,
    /// A container was removed.
    ContainerRemoved,
    /// Anything else (created, unknown).
    ContainerChanged,
}

/// Why the PLEG is unhealthy, in kubelet's words (`GenericPLEG.Healthy`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlegUnhealthy {
    /// No relist has finished yet.
    #[error("pleg has yet to be successful")]
    NotYetRelisted,
    /// The last relist is older than the threshold (the age, in seconds).
    #[error(
        "pleg was last seen active {} ago; threshold is {}",
        gofmt::duration(*.0),
        gofmt::duration(RELIST_THRESHOLD)
    )]
    Stale(Duration),
}

/// How the PLEG is doing; cheap to clone.
#[derive(Debug, Clone)]
pub struct PlegHealth {
    inner: Arc<Mutex<HealthState>>,
}

#[derive(Debug)]
struct HealthState {
    /// `None` until the first relist completed.
    last_relist: Option<Instant>,
    events: EventsMode,
}

/// Whether CRI events are in use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventsMode {
    /// Not known yet.
    Starting,
    /// The event stream is open.
    Streaming,
    /// The runtime does not implement GetContainerEvents: relist only.
    Unimplemented,
    /// The stream keeps failing: relist only for now.
    Failing,
}

impl PlegHealth {
    fn new() -> Self {
        PlegHealth {
            inner: Arc::new(Mutex::new(HealthState {
                last_relist: None,
                events: EventsMode::Starting,
            })),
        }
    }

    fn lock(&self) -> MutexGuard<'_, HealthState> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// `Healthy`: Err with kubelet's message before the first relist and
    /// when the last relist is older than the threshold.
    pub fn check(&self) -> Result<(), PlegUnhealthy> {
        let Some(last) = self.lock().last_relist else {
            return Err(PlegUnhealthy::NotYetRelisted);
        };
        let elapsed = last.elapsed();
        if elapsed > RELIST_THRESHOLD {
            return Err(PlegUnhealthy::Stale(Duration::from_secs(elapsed.as_secs())));
        }
        Ok(())
    }

    /// The CRI events mode.
    pub fn events_mode(&self) -> EventsMode {
        self.lock().events
    }

    fn set_mode(&self, m: EventsMode) {
        self.lock().events = m;
    }

    fn relisted(&self, at: Instant) {
        self.lock().last_relist = Some(at);
    }
}

/// The PLEG.
pub struct Pleg {
    runtime: Arc<RuntimeManager>,
    cache: RuntimeCache,
    metrics: PodMetrics,
    wake: mpsc::UnboundedSender<String>,
    health: PlegHealth,
    records: Mutex<HashMap<String, PodRecord>>,
    period: Duration,
    requests: tokio::sync::Mutex<mpsc::UnboundedReceiver<(String, Instant)>>,
    reinspect: Arc<Mutex<HashSet<String>>>,
    /// When the last full relist started (`getRelistTime`).
    relist_started: Mutex<Option<Instant>>,
    /// One relist at a time (kubelet's `relistLock`).
    relist_lock: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for Pleg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pleg").finish_non_exhaustive()
    }
}

fn record_states(
    sandboxes: &[api::PodSandbox],
    containers: &[api::Container],
) -> HashMap<String, PodRecord> {
    let mut out: HashMap<String, PodRecord> = HashMap::new();
    for sb in sandboxes {
        let Some(md) = sb.metadata.as_ref() else {
            continue;
        };
        let rec = out.entry(md.uid.clone()).or_default();
        rec.name = md.name.clone();
        rec.namespace = md.namespace.clone();
        rec.states.insert(sb.id.clone(), sandbox_state(sb.state));
    }
    for c in containers {
        let Some(uid) = c.labels.get(POD_UID) else {
            continue;
        };
        let rec = out.entry(uid.clone()).or_default();
        if rec.name.is_empty() {
            rec.name = c.labels.get(POD_NAME).cloned().unwrap_or_default();
            rec.namespace = c.labels.get(POD_NAMESPACE).cloned().unwrap_or_default();
        }
        rec.states.insert(c.id.clone(), c.state + 10);
    }
    out
}

/// kubelet's PLEG sees a sandbox as a container: ready is running,
/// not ready is exited.
fn sandbox_state(state: i32) -> i32 {
    if state == api::PodSandboxState::SandboxReady as i32 {
        10 + api::ContainerState::ContainerRunning as i32
    } else {
        10 + api::ContainerState::ContainerExited as i32
    }
}

/// Whether kubelet would send any of `events` to the pod workers: a
/// `ContainerChanged` (created, unknown) only refreshes the cache.
fn wakes(events: &[PodLifecycleEvent]) -> bool {
    events.iter().any(|e| e.kind != EventKind::ContainerChanged)
}

fn events_between(
    uid: &str,
    old: Option<&PodRecord>,
    new: Option<&PodRecord>,
) -> Vec<PodLifecycleEvent> {
    let empty = BTreeMap::new();
    let o = old.map(|r| &r.states).unwrap_or(&empty);
    let n = new.map(|r| &r.states).unwrap_or(&empty);
    let mut out = Vec::new();
    let running = 10 + api::ContainerState::ContainerRunning as i32;
    let exited = 10 + api::ContainerState::ContainerExited as i32;
    for id in o.keys().chain(n.keys().filter(|k| !o.contains_key(*k))) {
        let (before, after) = (o.get(id), n.get(id));
        if before == after {
            continue;
        }
        let kind = match (before, after) {
            (_, Some(s)) if *s == running => EventKind::ContainerStarted,
            (_, Some(s)) if *s == exited => EventKind::ContainerDied,
            (Some(_), None) => EventKind::ContainerRemoved,
            _ => EventKind::ContainerChanged,
        };
        out.push(PodLifecycleEvent {
            uid: uid.to_string(),
            id: id.clone(),
            kind,
        });
    }
    out
}

impl Pleg {
    /// A PLEG that refreshes `cache` and sends changed pod UIDs to `wake`.
    pub fn new(
        runtime: Arc<RuntimeManager>,
        cache: RuntimeCache,
        metrics: PodMetrics,
        wake: mpsc::UnboundedSender<String>,
        requests: PlegRequestsRx,
    ) -> Self {
        Pleg {
            runtime,
            cache,
            metrics,
            wake,
            health: PlegHealth::new(),
            records: Mutex::new(HashMap::new()),
            period: RELIST_PERIOD,
            requests: tokio::sync::Mutex::new(requests.relist),
            reinspect: requests.reinspect,
            relist_started: Mutex::new(None),
            relist_lock: tokio::sync::Mutex::new(()),
        }
    }

    fn take_reinspect(&self, uid: &str) -> bool {
        self.reinspect
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(uid)
    }

    /// Refreshes a pod's cache entry and, if `wake`, its worker.
    async fn refresh(&self, uid: &str, name: &str, namespace: &str, wake: bool) {
        match self.runtime.get_pod_status(uid, name, namespace).await {
            Ok(s) => self.cache.set(s),
            Err(e) => {
                tracing::debug!(pod = %uid, error = %e, "PLEG could not refresh a pod's status");
                // Inspected again at the next relist.
                self.reinspect
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .insert(uid.to_string());
                return;
            }
        }
        if wake && self.wake.send(uid.to_string()).is_err() {
            self.metrics.pleg_discard_events.inc();
        }
    }

    /// `relistPod`: one pod's sandboxes and containers compared with its
    /// record, its cache refreshed and its worker woken if they changed.
    pub async fn relist_pod(&self, uid: &str) {
        let _guard = self.relist_lock.lock().await;
        let cri = self.runtime.cri();
        let selector: HashMap<String, String> = [(POD_UID.to_string(), uid.to_string())].into();
        let listed = async {
            let sandboxes = cri
                .list_pod_sandbox(Some(api::PodSandboxFilter {
                    label_selector: selector.clone(),
                    ..Default::default()
                }))
                .await?;
            let containers = cri
                .list_containers(Some(api::ContainerFilter {
                    label_selector: selector.clone(),
                    ..Default::default()
                }))
                .await?;
            Ok::<_, keelson_cri::CriError>((sandboxes, containers))
        }
        .await;
        let (sandboxes, containers) = match listed {
            Ok(v) => v,
            Err(e) => {
                // The next full relist tries again.
                tracing::info!(pod = %uid, error = %e, "PLEG could not relist a pod");
                return;
            }
        };
        let now = record_states(&sandboxes, &containers).remove(uid);
        let (events, rec) = {
            let mut records = self.records();
            let old = records.get(uid).cloned();
            let events = events_between(uid, old.as_ref(), now.as_ref());
            let rec = now.clone().or(old).unwrap_or_default();
            match now {
                Some(n) => {
                    records.insert(uid.to_string(), n);
                }
                None => {
                    records.remove(uid);
                }
            }
            (events, rec)
        };
        let reinspect = self.take_reinspect(uid);
        if events.is_empty() && !reinspect {
            return;
        }
        self.refresh(uid, &rec.name, &rec.namespace, reinspect || wakes(&events))
            .await;
    }

    /// The health handle (for the node's Ready condition).
    pub fn health(&self) -> PlegHealth {
        self.health.clone()
    }

    fn records(&self) -> MutexGuard<'_, HashMap<String, PodRecord>> {
        self.records.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// One relist: returns the events it generated.
    pub async fn relist(&self) -> Vec<PodLifecycleEvent> {
        let _guard = self.relist_lock.lock().await;
        let start = Instant::now();
        *self
            .relist_started
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(start);
        let cri = self.runtime.cri();
        let listed = async {
            let sandboxes = cri.list_pod_sandbox(None).await?;
            let containers = cri.list_containers(None).await?;
            Ok::<_, keelson_cri::CriError>((sandboxes, containers))
        }
        .await;
        let (sandboxes, containers) = match listed {
            Ok(v) => v,
            Err(e) => {
                tracing::warn!(error = %e, "PLEG relist failed");
                return Vec::new();
            }
        };
        self.update_running_metrics(&sandboxes, &containers);
        let now_records = record_states(&sandboxes, &containers);
        let old_records = std::mem::take(&mut *self.records());
        let mut events = Vec::new();
        let mut uids: Vec<&String> = now_records.keys().collect();
        for u in old_records.keys() {
            if !now_records.contains_key(u) {
                uids.push(u);
            }
        }
        let mut changed: Vec<(String, String, String, bool)> = Vec::new();
        for uid in uids {
            let (o, n) = (old_records.get(uid), now_records.get(uid));
            let evs = events_between(uid, o, n);
            let reinspect = self.take_reinspect(uid);
            if !evs.is_empty() || reinspect {
                let rec = n.or(o).cloned().unwrap_or_default();
                changed.push((
                    uid.clone(),
                    rec.name,
                    rec.namespace,
                    reinspect || wakes(&evs),
                ));
                events.extend(evs);
            }
        }
        *self.records() = now_records;
        for (uid, name, ns, wake) in changed {
            self.refresh(&uid, &name, &ns, wake).await;
        }
        let elapsed = start.elapsed();
        self.metrics
            .pleg_relist_duration
            .observe(elapsed.as_secs_f64());
        self.metrics
            .pleg_last_seen
            .set(crate::pods::clock::to_nanos(std::time::SystemTime::now()) as f64 / 1e9);
        self.health.relisted(start);
        events
    }

    fn update_running_metrics(&self, sandboxes: &[api::PodSandbox], containers: &[api::Container]) {
        let ready_pods: std::collections::HashSet<&str> = sandboxes
            .iter()
            .filter(|s| s.state == api::PodSandboxState::SandboxReady as i32)
            .filter_map(|s| s.metadata.as_ref().map(|m| m.uid.as_str()))
            .collect();
        self.metrics.running_pods.set(ready_pods.len() as i64);
        let mut by_state: HashMap<&str, i64> = HashMap::from([
            ("created", 0),
            ("running", 0),
            ("exited", 0),
            ("unknown", 0),
        ]);
        for c in containers {
            let s = match api::ContainerState::try_from(c.state) {
                Ok(api::ContainerState::ContainerCreated) => "created",
                Ok(api::ContainerState::ContainerRunning) => "running",
                Ok(api::ContainerState::ContainerExited) => "exited",
                _ => "unknown",
            };
            *by_state.entry(s).or_default() += 1;
        }
        for (s, n) in by_state {
            self.metrics
                .running_containers
                .with_label_values(&[s])
                .set(n);
        }
    }

    /// Runs the relist loop and the event stream until `stop`.
    pub async fn run(self: Arc<Self>, stop: CancellationToken) {
        let events = {
            let this = self.clone();
            let stop = stop.clone();
            tokio::spawn(async move { this.watch_events(stop).await })
        };
        let mut last = Instant::now();
        let mut tick = tokio::time::interval(self.period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut requests = self.requests.lock().await;
        let mut open = true;
        loop {
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = tick.tick() => {}
                req = requests.recv(), if open => {
                    let Some((uid, at)) = req else {
                        open = false;
                        continue;
                    };
                    let served = self
                        .relist_started
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .is_some_and(|t| t >= at);
                    if !served {
                        self.relist_pod(&uid).await;
                    }
                    continue;
                }
            }
            let now = Instant::now();
            self.metrics
                .pleg_relist_interval
                .observe(now.duration_since(last).as_secs_f64());
            last = now;
            self.relist().await;
        }
        events.abort();
    }

    async fn watch_events(&self, stop: CancellationToken) {
        let mut attempts = 0u32;
        loop {
            if stop.is_cancelled() {
                return;
            }
            let mut stream = self.runtime.cri().get_container_events();
            let mut opened = false;
            let outcome = loop {
                let item = tokio::select! {
                    _ = stop.cancelled() => return,
                    item = stream.next() => item,
                };
                match item {
                    Some(Ok(ev)) => {
                        if !opened {
                            opened = true;
                            attempts = 0;
                            self.metrics.evented_pleg_connection_success_count.inc();
                            self.health.set_mode(EventsMode::Streaming);
                            tracing::info!(
                                "receiving container events from the runtime (GetContainerEvents)"
                            );
                        }
                        self.on_event(ev).await;
                    }
                    Some(Err(e)) => break Err(e),
                    None => break Ok(()),
                }
            };
            match outcome {
                Err(e) if e.is_unimplemented() => {
                    self.health.set_mode(EventsMode::Unimplemented);
                    tracing::info!(
                        "the container runtime does not implement CRI GetContainerEvents (containerd < 1.7); detecting container changes by relisting every {}",
                        gofmt::duration(self.period)
                    );
                    return;
                }
                Err(e) => {
                    self.metrics.evented_pleg_connection_error_count.inc();
                    attempts += 1;
                    tracing::info!(error = %e, attempt = attempts, "container event stream failed; relisting meanwhile");
                }
                Ok(()) => {
                    attempts += 1;
                    tracing::info!("container event stream ended; reconnecting");
                }
            }
            let delay = if attempts >= MAX_STREAM_RETRIES {
                self.health.set_mode(EventsMode::Failing);
                tracing::warn!(
                    "container event stream keeps failing; relisting every {} and retrying the stream in {}",
                    gofmt::duration(self.period),
                    gofmt::duration(STREAM_RETRY_AFTER)
                );
                attempts = 0;
                STREAM_RETRY_AFTER
            } else {
                Duration::from_secs(1) * attempts.max(1)
            };
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(delay) => {}
            }
        }
    }

    async fn on_event(&self, ev: api::ContainerEventResponse) {
        let Some(md) = ev
            .pod_sandbox_status
            .as_ref()
            .and_then(|s| s.metadata.as_ref())
        else {
            return;
        };
        // Record what the event says, so that the relist does not report
        // the same change again — and skip the event if a relist already
        // reported it: one wake-up per change, as kubelet's generic PLEG
        // gives (a second sync would show the back-off reason early).
        let changed = {
            let mut records = self.records();
            let rec = records.entry(md.uid.clone()).or_default();
            rec.name = md.name.clone();
            rec.namespace = md.namespace.clone();
            let mut changed = false;
            let mut set = |id: &str, state: i32| {
                if rec.states.insert(id.to_string(), state) != Some(state) {
                    changed = true;
                }
            };
            if let Some(sb) = &ev.pod_sandbox_status {
                set(&sb.id, sandbox_state(sb.state));
            }
            for c in &ev.containers_statuses {
                set(&c.id, c.state + 10);
            }
            if ev.container_event_type == api::ContainerEventType::ContainerDeletedEvent as i32
                && rec.states.remove(&ev.container_id).is_some()
            {
                changed = true;
            }
            changed
        };
        if !changed {
            return;
        }
        // A created container only refreshes the cache (kubelet's evented
        // PLEG sends no event for it, as the generic one does not).
        let wake = ev.container_event_type != api::ContainerEventType::ContainerCreatedEvent as i32;
        self.refresh(&md.uid, &md.name, &md.namespace, wake).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(states: &[(&str, i32)]) -> PodRecord {
        PodRecord {
            name: "p".into(),
            namespace: "n".into(),
            states: states.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
        }
    }

    #[test]
    fn events_from_state_changes() {
        let running = 10 + api::ContainerState::ContainerRunning as i32;
        let exited = 10 + api::ContainerState::ContainerExited as i32;
        let created = 10 + api::ContainerState::ContainerCreated as i32;
        let old = rec(&[("a", running), ("b", running), ("c", exited)]);
        let new = rec(&[("a", running), ("b", exited), ("d", created)]);
        let mut evs = events_between("u", Some(&old), Some(&new));
        evs.sort_by(|x, y| x.id.cmp(&y.id));
        let kinds: Vec<(&str, EventKind)> = evs.iter().map(|e| (e.id.as_str(), e.kind)).collect();
        assert_eq!(
            kinds,
            vec![
                ("b", EventKind::ContainerDied),
                ("c", EventKind::ContainerRemoved),
                ("d", EventKind::ContainerChanged)
            ]
        );
        assert!(events_between("u", Some(&old), Some(&old)).is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn health_threshold_message() {
        let h = PlegHealth::new();
        assert_eq!(
            h.check().map_err(|e| e.to_string()),
            Err("pleg has yet to be successful".to_string())
        );
        h.relisted(Instant::now());
        assert!(h.check().is_ok());
        tokio::time::advance(Duration::from_secs(181)).await;
        assert_eq!(
            h.check().map_err(|e| e.to_string()),
            Err("pleg was last seen active 3m1s ago; threshold is 3m0s".to_string())
        );
        h.relisted(Instant::now());
        assert!(h.check().is_ok());
    }
}
