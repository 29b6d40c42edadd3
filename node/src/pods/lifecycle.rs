//! What a pod worker runs for each phase of a pod (kubelet's `SyncPod`,
//! `SyncTerminatingPod` and `SyncTerminatedPod`): status generation, mirror
//! pods, the pod cgroup, volumes, pull secrets, probes and the runtime sync;
//! then stopping everything within the grace period; then releasing
//! volumes and cgroups and reporting the final status.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::SystemTime;

use k8s_openapi::api::core::v1::{Pod, PodCondition, PodStatus, Secret};
use tokio::time::Instant;

use super::active_deadline;
use super::allocation::{AllocationManager, resize_message};
use super::cache::RuntimeCache;
use super::clock::SharedClock;
use super::deps::{EnvSources, PodVolumes};
use super::events::{self as reasons, PodEvents};
use super::metrics::PodMetrics;
use super::probes::PodProbes;
use super::runtime::RuntimeManager;
use super::runtime::actions::{NoProbes, ProbeResults};
use super::runtime::status::RuntimePodStatus;
use super::runtime::sync::SyncAction;
use super::source::mirror::{MirrorClient, is_mirror_pod_of};
use super::status::{
    ContainerReadiness, NoReadinessProbes, StartFailure, StatusInputs, StatusManager,
    generate_pod_status,
};
use super::store::PodStore;
use crate::cgroups::PodCgroups;
use crate::pod::podutil;
use keelson_common::events::EventType;

/// kubelet's `NetworkNotReadyErrorMsg`.
pub const NETWORK_NOT_READY: &str = "network is not ready";

/// How often kubelet's WaitForAttachAndMount looks at the volumes again
/// (podAttachAndMountRetryInterval, pkg/kubelet/volumemanager/
/// volume_manager.go): the earliest a pod whose volumes are not ready is
/// synced again.
const VOLUME_POLL: std::time::Duration = std::time::Duration::from_millis(300);

/// How a worker was triggered (the `operation_type` of worker metrics).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpdateKind {
    /// First sight of the pod.
    Create,
    /// The pod changed.
    Update,
    /// A periodic or event-driven resync.
    Sync,
    /// Termination was requested.
    Kill,
}

impl UpdateKind {
    /// Metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            UpdateKind::Create => "create",
            UpdateKind::Update => "update",
            UpdateKind::Sync => "sync",
            UpdateKind::Kill => "kill",
        }
    }
}

/// The status a pod killed by the node itself ends with (eviction,
/// preemption): phase, reason, message and an optional condition.
#[derive(Debug, Clone, PartialEq)]
pub struct FinalStatus {
    /// Usually `Failed`.
    pub phase: String,
    /// E.g. `Evicted`.
    pub reason: String,
    /// Human message.
    pub message: String,
    /// E.g. a `DisruptionTarget` condition.
    pub condition: Option<PodCondition>,
    /// A pod whose generated status says `Succeeded` (every container
    /// exited 0) keeps that phase, without this reason and message, only
    /// the condition (graceful node shutdown: kubelet's status function
    /// leaves a succeeded pod alone, and `generateAPIPodStatus` keeps a
    /// reason only with the phase it came with); otherwise `phase`,
    /// `reason` and `message` replace the generated ones (eviction).
    pub keep_succeeded: bool,
}

/// What a successful `sync_pod` found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncOutcome {
    /// Keep syncing; resync by this time at the latest (a backoff ends).
    Running(Option<SystemTime>),
    /// The pod reached a terminal phase: terminate it.
    Terminal,
}

/// A sync failure with when to retry (a backoff end, if known).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyncFailure {
    /// kubelet's error text.
    pub message: String,
    /// When the failing step may succeed (end of a backoff).
    pub retry_at: Option<SystemTime>,
}

impl SyncFailure {
    fn msg(message: impl Into<String>) -> Self {
        SyncFailure {
            message: message.into(),
            retry_at: None,
        }
    }
}

/// Optional probe for network readiness (the node's runtime state).
pub type NetworkCheck = Arc<dyn Fn() -> Vec<String> + Send + Sync>;

/// The pod lifecycle's shared parts.
pub struct PodLifecycle {
    pub(crate) runtime: Arc<RuntimeManager>,
    pub(crate) status: StatusManager,
    pub(crate) cache: RuntimeCache,
    pub(crate) store: PodStore,
    pub(crate) cgroups: Arc<PodCgroups>,
    pub(crate) volumes: Arc<dyn PodVolumes>,
    pub(crate) env: Arc<dyn EnvSources>,
    pub(crate) probes: Option<PodProbes>,
    pub(crate) mirror: Option<MirrorClient>,
    pub(crate) events: PodEvents,
    pub(crate) metrics: PodMetrics,
    pub(crate) clock: SharedClock,
    pub(crate) host_ips: Vec<String>,
    pub(crate) network: Option<NetworkCheck>,
    pub(crate) allocation: Arc<AllocationManager>,
    pub(crate) pleg: super::pleg::PlegRequests,
    reasons: Mutex<HashMap<String, HashMap<String, StartFailure>>>,
    first_seen: Mutex<HashMap<String, Instant>>,
    started_reported: Mutex<HashSet<String>>,
}

impl std::fmt::Debug for PodLifecycle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PodLifecycle").finish_non_exhaustive()
    }
}

/// The parts a lifecycle is made of.
pub struct LifecycleParts {
    /// Runtime manager.
    pub runtime: Arc<RuntimeManager>,
    /// Status manager.
    pub status: StatusManager,
    /// Runtime cache.
    pub cache: RuntimeCache,
    /// Pod store.
    pub store: PodStore,
    /// Pod cgroups.
    pub cgroups: Arc<PodCgroups>,
    /// Volumes.
    pub volumes: Arc<dyn PodVolumes>,
    /// ConfigMap/Secret lookups.
    pub env: Arc<dyn EnvSources>,
    /// Probes (none: every running container is ready).
    pub probes: Option<PodProbes>,
    /// Mirror pods (none: static pods get no mirror).
    pub mirror: Option<MirrorClient>,
    /// Events.
    pub events: PodEvents,
    /// Metrics.
    pub metrics: PodMetrics,
    /// Clock.
    pub clock: SharedClock,
    /// Node IPs.
    pub host_ips: Vec<String>,
    /// Network readiness.
    pub network: Option<NetworkCheck>,
    /// Allocated resources and resize conditions.
    pub allocation: Arc<AllocationManager>,
    /// Relist and reinspect requests to the PLEG.
    pub pleg: super::pleg::PlegRequests,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl PodLifecycle {
    /// Builds one.
    pub fn new(p: LifecycleParts) -> Self {
        PodLifecycle {
            runtime: p.runtime,
            status: p.status,
            cache: p.cache,
            store: p.store,
            cgroups: p.cgroups,
            volumes: p.volumes,
            env: p.env,
            probes: p.probes,
            mirror: p.mirror,
            events: p.events,
            metrics: p.metrics,
            clock: p.clock,
            host_ips: p.host_ips,
            network: p.network,
            allocation: p.allocation,
            pleg: p.pleg,
            reasons: Mutex::new(HashMap::new()),
            first_seen: Mutex::new(HashMap::new()),
            started_reported: Mutex::new(HashSet::new()),
        }
    }

    /// Records the first time the node saw a pod.
    pub fn mark_seen(&self, uid: &str) -> Instant {
        *lock(&self.first_seen)
            .entry(uid.to_string())
            .or_insert_with(Instant::now)
    }

    /// The runtime's view of a pod, taken at or after `newer_than`: the
    /// cached one when fresh enough, else asked from the runtime.
    pub async fn runtime_status(
        &self,
        pod: &Pod,
        newer_than: SystemTime,
    ) -> Result<Arc<RuntimePodStatus>, LifecycleError> {
        let uid = podutil::uid(pod);
        if let Some(s) = self.cache.get_newer_than(uid, newer_than) {
            return Ok(s);
        }
        let s = self
            .runtime
            .get_pod_status(uid, podutil::name(pod), podutil::namespace(pod))
            .await?;
        self.cache.set(s);
        self.cache.get(uid).ok_or(LifecycleError::CacheLost)
    }

    fn probe_results(&self) -> &dyn ProbeResults {
        match &self.probes {
            Some(p) => p,
            None => &NoProbes,
        }
    }

    fn readiness(&self) -> &dyn ContainerReadiness {
        match &self.probes {
            Some(p) => p,
            None => &NoReadinessProbes,
        }
    }

    /// `generateAPIPodStatus` with this node's inputs.
    pub fn generate_status(&self, pod: &Pod, rt: &RuntimePodStatus, terminal: bool) -> PodStatus {
        let uid = podutil::uid(pod);
        let old = self
            .status
            .get(uid)
            .or_else(|| pod.status.clone())
            .unwrap_or_default();
        let failures = lock(&self.reasons).get(uid).cloned().unwrap_or_default();
        // kubelet's pod sync handlers (`ShouldEvict`): past its active
        // deadline the pod is Failed (with a Normal event each time).
        let evicted = active_deadline::past(pod, old.start_time.as_ref(), self.clock.now());
        if evicted {
            self.events.pod(
                pod,
                EventType::Normal,
                active_deadline::REASON,
                active_deadline::MESSAGE,
            );
        }
        // `determinePodResizeStatus`: a terminal pod has no resize.
        let resize_conditions = if terminal {
            self.allocation.conditions().clear_in_progress(uid);
            self.allocation.conditions().clear_pending(uid);
            Vec::new()
        } else {
            self.allocation.conditions().list(uid)
        };
        let pod_cgroup = self
            .cgroups
            .qos()
            .and_then(|q| q.fs().read(&self.cgroups.name_of(pod)).ok())
            .map(|mut c| {
                // cgroup v2's "max" reads as -1: no limit.
                if c.memory.is_some_and(|m| m < 0) {
                    c.memory = None;
                }
                c
            });
        generate_pod_status(
            pod,
            rt,
            &StatusInputs {
                old: &old,
                failures: &failures,
                readiness: self.readiness(),
                host_ips: &self.host_ips,
                runtime_name: self.runtime.runtime_name(),
                pod_is_terminal: terminal,
                evicted: evicted.then_some((active_deadline::REASON, active_deadline::MESSAGE)),
                resize_conditions: &resize_conditions,
                pod_cgroup: pod_cgroup.as_ref(),
            },
        )
    }

    /// At the start of a sync (kubelet's `SyncPod`): a running container
    /// whose allocated resources are not actuated yet means a resize is in
    /// progress; once none is, the condition goes with a `ResizeCompleted`
    /// event.
    fn track_resize_progress(&self, pod: &Pod, rt: &RuntimePodStatus) {
        let uid = podutil::uid(pod);
        let running = |name: &str| {
            rt.find_container(name)
                .is_some_and(|c| c.state == super::runtime::status::ContainerState::Running)
        };
        let generation = pod.metadata.generation.unwrap_or(0);
        let conds = self.allocation.conditions();
        if super::runtime::resize::resize_in_progress(pod, &running, &**self.runtime.actuated()) {
            conds.set_in_progress(uid, "", "", generation);
        } else if let Some(g) = conds.clear_in_progress(uid) {
            self.events.pod(
                pod,
                EventType::Normal,
                reasons::RESIZE_COMPLETED,
                resize_message("Pod resize completed", pod, g, ""),
            );
        }
    }

    /// After the runtime sync: a failed in-place resize shows in the
    /// `PodResizeInProgress` condition (`Error`) and a `ResizeError` event.
    fn record_resize_result(&self, pod: &Pod, result: &super::runtime::PodSyncResult) {
        for s in &result.steps {
            if s.action != SyncAction::ResizePodInPlace {
                continue;
            }
            let Some(e) = &s.error else { continue };
            let (generation, updated) = self.allocation.conditions().set_in_progress(
                podutil::uid(pod),
                super::allocation::conditions::ERROR,
                &e.message,
                pod.metadata.generation.unwrap_or(0),
            );
            if updated {
                self.events.pod(
                    pod,
                    EventType::Warning,
                    reasons::RESIZE_ERROR,
                    resize_message("Pod resize error", pod, generation, &e.message),
                );
            }
        }
    }

    /// When the pod's active deadline passes (the worker syncs it then).
    pub fn active_deadline(&self, pod: &Pod) -> Option<SystemTime> {
        let start = self
            .status
            .get(podutil::uid(pod))
            .and_then(|s| s.start_time)
            .or_else(|| pod.status.as_ref().and_then(|s| s.start_time.clone()));
        active_deadline::deadline(pod, start.as_ref())
    }

    fn update_reasons(&self, uid: &str, result: &super::runtime::PodSyncResult) {
        let mut all = lock(&self.reasons);
        let entry = all.entry(uid.to_string()).or_default();
        for s in &result.steps {
            if s.action != SyncAction::StartContainer {
                continue;
            }
            match &s.error {
                Some(e) => {
                    entry.insert(
                        s.target.clone(),
                        StartFailure {
                            reason: e.reason.to_string(),
                            message: e.message.clone(),
                        },
                    );
                }
                None => {
                    entry.remove(&s.target);
                }
            }
        }
    }

    /// Pods to size the QoS cgroups and admission with: desired pods not
    /// in a terminal phase.
    /// Shared, not copied: every pod's sync asks for them (cloning every
    /// Pod there made the memory of a node grow with the square of its
    /// pods).
    pub fn active_pods(&self) -> Vec<Arc<Pod>> {
        self.store
            .pods()
            .into_iter()
            .filter(|p| !podutil::is_terminal_phase(podutil::phase(p)))
            .collect()
    }

    async fn pull_secrets(&self, pod: &Pod) -> Vec<Secret> {
        let ns = podutil::namespace(pod);
        let mut out = Vec::new();
        let mut missing = Vec::new();
        for r in podutil::spec(pod).image_pull_secrets.iter().flatten() {
            let name = r.name.as_str();
            match self.env.secret(ns, name).await {
                Ok(Some(s)) => out.push(s),
                Ok(None) => missing.push(format!("{ns}/{name}")),
                Err(e) => {
                    tracing::warn!(pod = %podutil::key(pod), secret = name, error = %e, "cannot read image pull secret");
                    missing.push(format!("{ns}/{name}"));
                }
            }
        }
        if !missing.is_empty() {
            self.events.pod(
                pod,
                EventType::Warning,
                "FailedToRetrieveImagePullSecret",
                format!(
                    "Unable to retrieve some image pull secrets ({}); attempting to pull the image may not succeed.",
                    missing.join(", ")
                ),
            );
        }
        out
    }

    async fn reconcile_mirror(&self, pod: &Pod) {
        if !podutil::is_static(pod) {
            return;
        }
        let Some(mirror) = &self.mirror else { return };
        let existing = self.store.mirror_of(pod);
        let mut deleted = false;
        if let Some(m) = &existing
            && (m.metadata.deletion_timestamp.is_some() || !is_mirror_pod_of(m, pod))
        {
            match mirror
                .delete(
                    podutil::namespace(m),
                    podutil::name(m),
                    Some(podutil::uid(m)),
                )
                .await
            {
                Ok(ok) => deleted = ok,
                Err(e) => {
                    tracing::warn!(pod = %podutil::key(pod), error = %e, "failed deleting mirror pod")
                }
            }
        }
        if (existing.is_none() || deleted)
            && let Err(e) = mirror.create(pod).await
        {
            tracing::warn!(pod = %podutil::key(pod), error = %e, "failed creating a mirror pod");
        }
    }

    /// kubelet's `SyncPod`: one sync of a pod that should run.
    pub async fn sync_pod(
        &self,
        kind: UpdateKind,
        pod: &Pod,
        rt: &RuntimePodStatus,
    ) -> Result<SyncOutcome, SyncFailure> {
        // The allocation as it is now, even if this sync started with an
        // older copy of the pod (a resize accepted meanwhile).
        let allocated = self.allocation.update_pod_from_allocation(pod).0;
        let pod = &allocated;
        let uid = podutil::uid(pod).to_string();
        let first_seen = self.mark_seen(&uid);
        if kind == UpdateKind::Create {
            self.metrics
                .pod_worker_start_duration
                .observe(first_seen.elapsed().as_secs_f64());
        }
        self.track_resize_progress(pod, rt);
        let api_status = self.generate_status(pod, rt, false);
        let previous_phase = self
            .status
            .get(&uid)
            .and_then(|s| s.phase)
            .or_else(|| pod.status.as_ref().and_then(|s| s.phase.clone()))
            .unwrap_or_default();
        let phase = api_status.phase.clone().unwrap_or_default();
        // The status just generated says whether the pod restarts in place
        // (kubelet's `restartingAllContainers`).
        let restarting_all = super::restart_all::condition_true(&api_status);
        if phase == "Running"
            && previous_phase != "Running"
            && lock(&self.started_reported).insert(uid.clone())
        {
            self.metrics
                .pod_start_duration
                .observe(first_seen.elapsed().as_secs_f64());
        }
        self.status.set_pod_status(pod, api_status);
        if podutil::is_terminal_phase(&phase) {
            return Ok(SyncOutcome::Terminal);
        }
        if !podutil::is_host_network(pod)
            && let Some(check) = &self.network
        {
            let errs = check();
            if !errs.is_empty() {
                let msg = format!("{NETWORK_NOT_READY}: {}", errs.join(", "));
                self.events.pod(
                    pod,
                    EventType::Warning,
                    reasons::NETWORK_NOT_READY,
                    msg.clone(),
                );
                return Err(SyncFailure::msg(msg));
            }
        }
        self.reconcile_mirror(pod).await;
        let active = self.active_pods();
        let existed = self.cgroups.exists(pod);
        if let Err(e) = self.cgroups.ensure(pod, &active) {
            let msg = format!("unable to ensure pod container exists: {e}");
            self.events.pod(
                pod,
                EventType::Warning,
                reasons::FAILED_CREATE_POD_CONTAINER,
                msg.clone(),
            );
            return Err(SyncFailure::msg(msg));
        }
        if !existed {
            // The new pod cgroup has the pod-level resources.
            self.runtime.set_actuated_pod_level(pod);
        }
        self.volumes.register_pod(pod);
        if let Err(e) = self.volumes.setup_pod(pod).await {
            tracing::info!(pod = %podutil::key(pod), error = %e, "volumes are not ready");
            return Err(SyncFailure {
                retry_at: e.retry_in.map(|d| SystemTime::now() + d.max(VOLUME_POLL)),
                message: e.message,
            });
        }
        let secrets = self.pull_secrets(pod).await;
        if let Some(p) = &self.probes {
            p.add_pod(pod);
        }
        let result = Box::pin(self.runtime.sync_pod(
            pod,
            rt,
            &secrets,
            self.probe_results(),
            &active,
            restarting_all,
            &|p: &Pod| self.on_pod_sandbox_ready(p),
        ))
        .await;
        self.update_reasons(&uid, &result);
        self.record_resize_result(pod, &result);
        if result.created_sandbox || result.resized {
            // The next sync reads the runtime anew.
            self.cache.delete(&uid);
        }
        if result.resized {
            // `RequestPodReinspect` (doPodResizeAction): the next relist
            // syncs the pod, which then sees the resize actuated.
            self.pleg.reinspect(&uid);
        }
        match result.error() {
            Some(message) => Err(SyncFailure {
                message,
                retry_at: result.retry_at,
            }),
            None => {
                if !result.steps.is_empty() {
                    // kubelet's postSync: `RequestPodRelist`, so what the
                    // sync started or stopped shows at once.
                    self.pleg.relist(&uid);
                }
                if restarting_all && result.removed_containers() {
                    // After a restart of the whole pod kubelet syncs the
                    // pod again at once: that sync finds no container,
                    // clears the condition and starts the pod over.
                    self.cache.delete(&uid);
                    return Ok(SyncOutcome::Running(Some(self.clock.now())));
                }
                Ok(SyncOutcome::Running(result.retry_at))
            }
        }
    }

    /// kubelet's `OnPodSandboxReady` (pkg/kubelet/kubelet.go): a new
    /// sandbox is ready, so the cached status (or the API's) gets
    /// `PodReadyToStartContainers=True` and goes to the status manager at
    /// once, without waiting for the containers of this sync to start.
    /// Upstream does it on a goroutine; `set_pod_status` only updates the
    /// cache and wakes the writer, so it runs inline here.
    fn on_pod_sandbox_ready(&self, pod: &Pod) {
        let mut status = self
            .status
            .get(podutil::uid(pod))
            .or_else(|| pod.status.clone())
            .unwrap_or_default();
        let ready = PodCondition {
            type_: "PodReadyToStartContainers".into(),
            status: "True".into(),
            observed_generation: pod.metadata.generation,
            ..PodCondition::default()
        };
        // `ReplaceOrAppendPodCondition`.
        let conditions = status.conditions.get_or_insert_with(Vec::new);
        match conditions.iter_mut().find(|c| c.type_ == ready.type_) {
            Some(c) => *c = ready,
            None => conditions.push(ready),
        }
        tracing::debug!(pod = %podutil::key(pod), "sandbox ready: PodReadyToStartContainers=True");
        self.status.set_pod_status(pod, status);
    }

    /// After a sync: probes follow the containers that now run.
    pub fn sync_probes(&self, pod: &Pod, rt: &RuntimePodStatus) {
        if let Some(p) = &self.probes {
            let reported = self
                .store
                .api_object(podutil::uid(pod))
                .and_then(|p| p.status.clone());
            p.sync_containers(pod, rt, reported.as_ref());
        }
    }

    /// kubelet's `SyncTerminatingPod`: report, stop probes, kill every
    /// container within `grace`, check nothing runs, report again.
    pub async fn sync_terminating_pod(
        &self,
        pod: &Pod,
        rt: &RuntimePodStatus,
        grace: i64,
        final_status: Option<&FinalStatus>,
    ) -> Result<(), LifecycleError> {
        let uid = podutil::uid(pod).to_string();
        let mut s = self.generate_status(pod, rt, false);
        if let Some(f) = final_status {
            apply_final_status(&mut s, f);
        }
        self.status.set_pod_status(pod, s);
        if let Some(p) = &self.probes {
            p.stop_liveness_and_startup(&uid);
        }
        let mut result = super::runtime::PodSyncResult::default();
        Box::pin(
            self.runtime
                .kill_pod(Some(pod), rt, Some(grace), &mut result),
        )
        .await?;
        if let Some(p) = &self.probes {
            p.remove_pod(&uid);
        }
        let stopped = self
            .runtime
            .get_pod_status(&uid, podutil::name(pod), podutil::namespace(pod))
            .await?;
        let still: Vec<String> = stopped.running().map(|c| c.name.clone()).collect();
        if !still.is_empty() {
            return Err(LifecycleError::StillRunning(still));
        }
        let mut s = self.generate_status(pod, &stopped, true);
        if let Some(f) = final_status {
            apply_final_status(&mut s, f);
        }
        self.status.set_pod_status(pod, s);
        self.cache.set(stopped);
        Ok(())
    }

    /// kubelet's `SyncTerminatedPod`: final status, volumes unmounted, pod
    /// cgroup removed, status marked finished.
    pub async fn sync_terminated_pod(
        &self,
        pod: &Pod,
        rt: &RuntimePodStatus,
    ) -> Result<(), LifecycleError> {
        let uid = podutil::uid(pod).to_string();
        let s = self.generate_status(pod, rt, true);
        self.status.set_pod_status(pod, s);
        self.volumes.teardown_pod(&uid).await?;
        let cg = self.cgroups.clone();
        let uid2 = uid.clone();
        tokio::task::spawn_blocking(move || cg.destroy(&uid2))
            .await?
            .map_err(LifecycleError::DestroyCgroup)?;
        self.status.terminate_pod(pod);
        Ok(())
    }

    /// Forgets a pod that left the node for good.
    pub async fn forget(&self, uid: &str) {
        self.allocation.remove(uid);
        self.runtime.actuated().remove(uid);
        lock(&self.reasons).remove(uid);
        lock(&self.first_seen).remove(uid);
        lock(&self.started_reported).remove(uid);
        self.cache.delete(uid);
        if let Some(p) = &self.probes {
            p.remove_pod(uid);
        }
        self.volumes.unregister_pod(uid);
        if let Err(e) = self.volumes.remove_pod_dir(uid).await {
            tracing::warn!(pod = %uid, error = %e, "cannot remove pod directory");
        }
        let backoff = self.runtime.crash_backoff();
        backoff.gc();
    }
}

/// Why a pod's runtime status could not be read or its termination not
/// finished (the pod worker logs it and tries again).
#[derive(Debug, thiserror::Error)]
pub enum LifecycleError {
    /// The runtime's status of the pod could not be read.
    #[error(transparent)]
    RuntimeStatus(#[from] keelson_cri::CriError),
    /// The status just stored is not in the cache.
    #[error("runtime cache lost a status")]
    CacheLost,
    /// Containers could not be stopped.
    #[error(transparent)]
    Kill(#[from] super::runtime::kill::KillError),
    /// Containers still run after every kill succeeded.
    #[error("detected running containers after a successful KillPod, CRI violation: {0:?}")]
    StillRunning(Vec<String>),
    /// The volumes could not be unmounted.
    #[error(transparent)]
    Volumes(#[from] super::deps::PodVolumesError),
    /// The cgroup removal task did not finish.
    #[error(transparent)]
    Task(#[from] tokio::task::JoinError),
    /// The pod cgroup could not be removed.
    #[error("unable to destroy pod cgroup: {0}")]
    DestroyCgroup(crate::cgroups::CgroupError),
}

/// Puts an eviction's final status over a generated one.
pub fn apply_final_status(s: &mut PodStatus, f: &FinalStatus) {
    if !(f.keep_succeeded && s.phase.as_deref() == Some("Succeeded")) {
        s.phase = Some(f.phase.clone());
        s.reason = Some(f.reason.clone());
        s.message = Some(f.message.clone());
    }
    if let Some(c) = &f.condition {
        let list = s.conditions.get_or_insert_with(Vec::new);
        list.retain(|x| x.type_ != c.type_);
        list.push(c.clone());
    }
}
