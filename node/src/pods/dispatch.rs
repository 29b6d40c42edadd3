//! The pod dispatcher (kubelet's `HandlePodAdditions`, `HandlePodUpdates`,
//! `HandlePodRemoves` and the allocation manager's pending-resize loop):
//! source events go to the pod workers, new pods through admission first,
//! changed resources through the resize queue, each pod as its allocated
//! version (`UpdatePodFromAllocation`).
//!
//! A rejected pod never reaches a worker: it ends `Failed` with the
//! rejection's reason and `Pod was rejected: <message>`, with a Warning
//! event, and stays rejected. Pods are admitted one at a time here
//! (kubelet's allocation mutex), each against the pods admitted before it.
//! A resize is allocated when admission (resize operation) accepts the new
//! resources against the other admitted pods: `ResizeStarted` and
//! `PodResizeInProgress`; else `PodResizePending` `Deferred` (retried when
//! pods leave or end, and every 3 minutes) or `Infeasible`, with
//! `ResizeDeferred`/`ResizeInfeasible` events.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, PodStatus};
use tokio::time::Instant;

use super::admission::{self, Admitter, Operation};
use super::allocation::{AllocationManager, resize_message};
use super::events as reasons;
use super::lifecycle::UpdateKind;
use super::source::SourceEvent;
use super::store::PodStore;
use super::workers::{KillRequest, PodWorkers};
use crate::pod::podutil;
use crate::pod::qos;
use keelson_common::events::EventType;

/// UIDs of pods admission rejected, shared with the status manager's view
/// of the workers.
pub type Rejected = Arc<Mutex<HashSet<String>>>;

/// Whether admission rejected the pod.
pub fn rejected_contains(r: &Rejected, uid: &str) -> bool {
    r.lock()
        .unwrap_or_else(PoisonError::into_inner)
        .contains(uid)
}

/// kubelet's `initialRetryDelay` of pending resizes.
const INITIAL_RETRY_DELAY: Duration = Duration::from_secs(30);
/// kubelet's `retryDelay` of pending resizes.
const RETRY_DELAY: Duration = Duration::from_secs(180);

/// What a pod's resources look like, to notice a resize
/// (`recordResizeOperations`).
fn resources_fingerprint(pod: &Pod) -> String {
    let spec = podutil::spec(pod);
    let containers: Vec<_> = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .map(|c| (&c.name, &c.resources))
        .collect();
    serde_json::to_string(&(&spec.resources, containers)).unwrap_or_default()
}

/// What kubelet's pod config compares to decide whether a pod changed
/// (`podsDifferSemantically`): spec, labels, annotations, deletion
/// timestamp and grace; a change of status alone is a reconcile.
fn semantic_fingerprint(pod: &Pod) -> String {
    let m = &pod.metadata;
    serde_json::to_string(&(
        &pod.spec,
        &m.labels,
        &m.annotations,
        &m.deletion_timestamp,
        &m.deletion_grace_period_seconds,
    ))
    .unwrap_or_default()
}

/// `NeedToReconcilePodReadiness`: a pod with readiness gates whose Ready
/// condition no longer says what its conditions imply.
fn needs_readiness_reconcile(pod: &Pod) -> bool {
    if podutil::spec(pod)
        .readiness_gates
        .as_ref()
        .is_none_or(Vec::is_empty)
    {
        return false;
    }
    let Some(status) = pod.status.as_ref() else {
        return false;
    };
    let conditions = status.conditions.clone().unwrap_or_default();
    let Some(current) = conditions.iter().find(|c| c.type_ == "Ready") else {
        return false;
    };
    let want = super::status::generate::ready_condition(
        pod,
        &conditions,
        status.container_statuses.as_deref(),
        status.phase.as_deref().unwrap_or_default(),
    );
    current.status != want.status || current.message != want.message
}

/// The dispatcher's state.
pub struct Dispatcher {
    workers: PodWorkers,
    store: PodStore,
    admitter: Admitter,
    allocation: Arc<AllocationManager>,
    rejected: Rejected,
    seen_resources: HashMap<String, String>,
    seen_semantic: HashMap<String, String>,
    next_retry: Instant,
    api_synced: Arc<AtomicBool>,
    static_synced: Arc<AtomicBool>,
}

impl Dispatcher {
    /// A dispatcher feeding `workers`.
    pub fn new(
        workers: PodWorkers,
        store: PodStore,
        admitter: Admitter,
        allocation: Arc<AllocationManager>,
        rejected: Rejected,
        synced: (Arc<AtomicBool>, Arc<AtomicBool>),
    ) -> Self {
        Dispatcher {
            workers,
            store,
            admitter,
            allocation,
            rejected,
            seen_resources: HashMap::new(),
            seen_semantic: HashMap::new(),
            next_retry: Instant::now() + INITIAL_RETRY_DELAY,
            api_synced: synced.0,
            static_synced: synced.1,
        }
    }

    fn sources_ready(&self) -> bool {
        self.api_synced.load(Ordering::SeqCst) && self.static_synced.load(Ordering::SeqCst)
    }

    /// When the pending resizes are retried next.
    pub fn next_retry(&self) -> Instant {
        self.next_retry
    }

    /// kubelet's `GetActivePods`, allocated (`getAllocatedPods`): the pods
    /// the node should run (a pod deleted from its source no longer
    /// counts, even while it stops) whose worker still syncs them, unless
    /// their phase is terminal, or is stopping them.
    fn admitted_pods(&self) -> Vec<Arc<Pod>> {
        let lc = self.workers.lifecycle();
        self.workers
            .pods_using_resources()
            .into_iter()
            .filter_map(|(p, terminating)| {
                let current = self.store.get(podutil::uid(&p))?;
                let status_phase = lc.status.get(podutil::uid(&current)).and_then(|s| s.phase);
                let terminal = podutil::is_terminal_phase(podutil::phase(&current))
                    || status_phase
                        .as_deref()
                        .is_some_and(podutil::is_terminal_phase);
                (terminating || !terminal)
                    .then(|| Arc::new(self.allocation.update_pod_from_allocation(&current).0))
            })
            .collect()
    }

    /// `rejectPod`.
    fn reject(&self, pod: &Pod, rejection: admission::AdmitRejection) {
        let lc = self.workers.lifecycle();
        self.rejected
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(podutil::uid(pod).to_string());
        lc.events.pod(
            pod,
            EventType::Warning,
            &rejection.reason,
            rejection.message.clone(),
        );
        lc.status.set_pod_status(
            pod,
            PodStatus {
                qos_class: Some(qos::pod_qos(pod).as_str().to_string()),
                phase: Some("Failed".into()),
                reason: Some(rejection.reason),
                message: Some(format!("Pod was rejected: {}", rejection.message)),
                ..Default::default()
            },
        );
    }

    /// Admission of a pod new to the node; `false` holds it back.
    async fn admit_new(&mut self, pod: &Pod) -> bool {
        let uid = podutil::uid(pod);
        if rejected_contains(&self.rejected, uid) {
            if pod.metadata.deletion_timestamp.is_some() {
                // Nothing runs: the status manager may delete the object.
                self.workers.lifecycle().status.terminate_pod(pod);
            }
            return false;
        }
        if self.workers.phase(uid).is_some() || podutil::is_terminal_phase(podutil::phase(pod)) {
            return true;
        }
        // After a restart the checkpoint has the allocation; it is what
        // admission weighs (`AddPod`).
        let (allocated, _) = self.allocation.update_pod_from_allocation(pod);
        let others = self.admitted_pods();
        if let Err(r) = self
            .admitter
            .admit(&allocated, &others, Operation::Add)
            .await
        {
            self.reject(pod, r);
            return false;
        }
        self.allocation.set_allocated(&allocated);
        // A resize the pod asked for before (or while keelson was down).
        let conditions = pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.clone())
            .unwrap_or_default();
        self.allocation.conditions().backfill(uid, &conditions);
        if self.allocation.update_pod_from_allocation(pod).1 {
            self.allocation.push_pending(uid);
            self.retry_pending("pods_added").await;
        }
        true
    }

    /// A known pod's resources changed (`HandlePodUpdates`).
    async fn resources_changed(&mut self, pod: &Pod) {
        let uid = podutil::uid(pod);
        if self.allocation.update_pod_from_allocation(pod).1 {
            self.allocation.push_pending(uid);
            self.retry_pending("pod_updated").await;
        } else {
            // A pending resize reverted.
            self.allocation.conditions().clear_pending(uid);
        }
    }

    /// `retryPendingResizes`.
    pub async fn retry_pending(&mut self, trigger: &str) {
        if !self.sources_ready() {
            self.next_retry = Instant::now() + INITIAL_RETRY_DELAY;
            return;
        }
        self.next_retry = Instant::now() + RETRY_DELAY;
        let conds = self.allocation.conditions();
        let mut still = Vec::new();
        for uid in self.allocation.take_pending() {
            let Some(pod) = self.store.get(&uid) else {
                continue;
            };
            let before = conds.list(&uid);
            let was_deferred = conds.is_deferred(&uid);
            let allocated = self.handle_resize(&pod).await;
            if conds.is_deferred(&uid) {
                still.push(uid.clone());
            } else if !conds.is_infeasible(&uid) && was_deferred {
                tracing::info!(pod = %podutil::key(&pod), trigger, "deferred resize accepted");
            }
            let after = conds.list(&uid);
            let changed = before.len() != after.len()
                || before.iter().zip(&after).any(|(a, b)| {
                    a.type_ != b.type_
                        || a.reason != b.reason
                        || a.message != b.message
                        || a.observed_generation != b.observed_generation
                });
            if allocated || changed {
                let (p, _) = self.allocation.update_pod_from_allocation(&pod);
                self.workers.update_pod(Arc::new(p), UpdateKind::Sync, None);
            }
        }
        for uid in still {
            self.allocation.push_pending(&uid);
        }
    }

    /// `handlePodResourcesResize`: whether the resize was allocated.
    async fn handle_resize(&self, pod: &Pod) -> bool {
        let uid = podutil::uid(pod);
        let conds = self.allocation.conditions();
        if !self.allocation.update_pod_from_allocation(pod).1 {
            conds.clear_pending(uid);
            return false;
        }
        let generation = pod.metadata.generation.unwrap_or(0);
        let others = self.admitted_pods();
        let events = &self.workers.lifecycle().events;
        match self.admitter.admit(pod, &others, Operation::Resize).await {
            Ok(()) => {
                self.allocation.set_allocated(pod);
                conds.clear_pending(uid);
                conds.clear_in_progress(uid);
                conds.set_in_progress(uid, "", "", generation);
                events.pod(
                    pod,
                    EventType::Normal,
                    reasons::RESIZE_STARTED,
                    resize_message("Pod resize started", pod, generation, ""),
                );
                true
            }
            Err(r) => {
                if conds.set_pending(uid, &r.reason, &r.message, generation) {
                    let infeasible = r.reason == super::allocation::conditions::INFEASIBLE;
                    events.pod(
                        pod,
                        EventType::Warning,
                        if infeasible {
                            reasons::RESIZE_INFEASIBLE
                        } else {
                            reasons::RESIZE_DEFERRED
                        },
                        resize_message(
                            &format!("Pod resize {}", r.reason),
                            pod,
                            generation,
                            &r.message,
                        ),
                    );
                }
                false
            }
        }
    }

    /// Handles one source event.
    pub async fn handle(&mut self, ev: SourceEvent) {
        match ev {
            SourceEvent::Upsert(pod) => self.upsert(pod).await,
            SourceEvent::Remove(pod) => self.remove(pod).await,
            SourceEvent::ApiSynced => self.api_synced.store(true, Ordering::SeqCst),
            SourceEvent::StaticSynced => self.static_synced.store(true, Ordering::SeqCst),
        }
    }

    fn wake_static_of_mirror(&self, pod: &Pod) {
        for p in self.store.pods_where(|p| {
            podutil::is_static(p) && podutil::full_name(p) == podutil::full_name(pod)
        }) {
            self.workers.wake(podutil::uid(&p));
        }
    }

    async fn upsert(&mut self, pod: Pod) {
        if podutil::is_mirror(&pod) {
            // The static pod's worker reconciles its mirror.
            self.wake_static_of_mirror(&pod);
            return;
        }
        let uid = podutil::uid(&pod).to_string();
        let known = self.workers.phase(&uid).is_some();
        if !known && !self.admit_new(&pod).await {
            return;
        }
        let fingerprint = resources_fingerprint(&pod);
        match self.seen_resources.insert(uid.clone(), fingerprint.clone()) {
            Some(old) if old != fingerprint && known => self.resources_changed(&pod).await,
            _ => {}
        }
        // A pod that just ended frees resources for deferred resizes.
        if known
            && self.allocation.has_pending()
            && podutil::is_terminal_phase(podutil::phase(&pod))
        {
            self.retry_pending("pod_terminated").await;
        }
        let kind = if known {
            UpdateKind::Update
        } else {
            UpdateKind::Create
        };
        let semantic = semantic_fingerprint(&pod);
        let prev = self.seen_semantic.insert(uid.clone(), semantic.clone());
        let changed = prev.is_none_or(|old| old != semantic);
        let current = self.store.get(&uid).unwrap_or_else(|| Arc::new(pod));
        let (allocated, _) = self.allocation.update_pod_from_allocation(&current);
        if known && !changed {
            // Only the status changed (`HandlePodReconcile`): the worker
            // takes the object; it syncs only for readiness gates.
            let reconcile = needs_readiness_reconcile(&allocated);
            let allocated = Arc::new(allocated);
            if reconcile {
                self.workers.update_pod(allocated, UpdateKind::Sync, None);
            } else {
                self.workers.replace_pod(allocated);
            }
            return;
        }
        self.workers.update_pod(Arc::new(allocated), kind, None);
    }

    async fn remove(&mut self, pod: Pod) {
        let uid = podutil::uid(&pod).to_string();
        self.seen_resources.remove(&uid);
        self.seen_semantic.remove(&uid);
        if self
            .rejected
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&uid)
        {
            return;
        }
        if podutil::is_mirror(&pod) {
            self.wake_static_of_mirror(&pod);
            return;
        }
        self.workers.update_pod(
            Arc::new(pod),
            UpdateKind::Kill,
            Some(KillRequest {
                grace: None,
                final_status: None,
                removed: true,
            }),
        );
        if self.allocation.has_pending() {
            self.retry_pending("pods_removed").await;
        }
    }
}
