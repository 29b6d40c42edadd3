//! The status manager (kubelet's `status.manager`): caches the status the
//! pod workers generate, versions it, and writes it to the API server with
//! a strategic merge patch of `status` only when it changed — retried with
//! backoff while the API server is away, reconciled every 10 s, never
//! regressing a terminal phase, never reporting a terminal phase while
//! containers may still run, and deleting a terminated pod's object (grace
//! 0, UID precondition) once its resources are reclaimed.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use k8s_openapi::api::core::v1::{
    ContainerState as ApiState, ContainerStateTerminated, Pod, PodCondition, PodStatus,
};
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::generate::{CONTAINER_STATUS_UNKNOWN, KUBELET_CONDITIONS};
use super::patch::status_patch;
use crate::pod::podutil;
use crate::pods::clock::{SharedClock, to_api_time};
use crate::pods::metrics::PodMetrics;

/// How often every cached status is compared with the API's (`syncPeriod`).
pub const RECONCILE_PERIOD: Duration = Duration::from_secs(10);
/// First retry delay after a failed write.
const RETRY_INITIAL: Duration = Duration::from_millis(500);
/// Longest retry delay.
const RETRY_MAX: Duration = Duration::from_secs(10);

/// Where statuses go and what the pod workers know.
pub trait StatusTargets: Send + Sync {
    /// The API object (the pod, or a static pod's mirror) from the watch
    /// cache, by the pod's UID.
    fn api_pod(&self, uid: &str) -> Option<Pod>;
    /// False once the pod's worker has stopped every container.
    fn could_have_running_containers(&self, uid: &str) -> bool;
}

#[derive(Debug, Clone)]
struct Versioned {
    status: PodStatus,
    version: u64,
    name: String,
    namespace: String,
    is_static: bool,
    pod_is_finished: bool,
    at: Instant,
}

#[derive(Debug, Default)]
struct State {
    statuses: HashMap<String, Versioned>,
    api_versions: HashMap<String, u64>,
    retry: HashMap<String, (Instant, Duration)>,
}

struct Shared {
    state: Mutex<State>,
    wake: Notify,
    client: kube::Client,
    metrics: PodMetrics,
    clock: SharedClock,
    targets: Arc<dyn StatusTargets>,
}

/// Handle to the status manager; cheap to clone.
#[derive(Clone)]
pub struct StatusManager {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for StatusManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StatusManager").finish_non_exhaustive()
    }
}

fn conditions_of(s: &PodStatus) -> impl Iterator<Item = &PodCondition> {
    s.conditions.iter().flatten()
}

fn kubelet_owned(c: &PodCondition) -> bool {
    KUBELET_CONDITIONS.contains(&c.type_.as_str()) || c.type_ == "DisruptionTarget"
}

/// `isPodStatusByKubeletEqual`: equal in everything but conditions other
/// writers own and transition times.
pub fn status_equal_by_kubelet(a: &PodStatus, b: &PodStatus) -> bool {
    let owned = |s: &PodStatus| -> HashMap<String, (String, Option<String>, Option<String>)> {
        conditions_of(s)
            .filter(|c| kubelet_owned(c))
            .map(|c| {
                (
                    c.type_.clone(),
                    (c.status.clone(), c.reason.clone(), c.message.clone()),
                )
            })
            .collect()
    };
    if owned(a) != owned(b) {
        return false;
    }
    let mut a2 = a.clone();
    let mut b2 = b.clone();
    a2.conditions = None;
    b2.conditions = None;
    serde_json::to_value(&a2).ok() == serde_json::to_value(&b2).ok()
}

fn is_terminated(s: &k8s_openapi::api::core::v1::ContainerStatus) -> bool {
    s.state.as_ref().is_some_and(|st| st.terminated.is_some())
}

/// Why a status was not written: kubelet's `checkContainerStateTransition`
/// refusal, or the API call that failed (logged, retried by the next sync).
#[derive(Debug, thiserror::Error)]
pub(crate) enum StatusError {
    /// A container that will not restart would leave the terminated state.
    #[error("terminated container {0} attempted illegal transition to non-terminated state")]
    IllegalTransition(String),
    /// Reading or patching the pod failed.
    #[error(transparent)]
    Api(#[from] kube::Error),
    /// Deleting the finished pod failed.
    #[error("deleting pod: {0}")]
    Delete(kube::Error),
}

/// `checkContainerStateTransition`: a container that will not restart
/// (by the pod's policy, or its own rules and policy) cannot leave the
/// terminated state.
fn check_transition(old: &PodStatus, new: &PodStatus, pod: &Pod) -> Result<(), StatusError> {
    let policy = podutil::restart_policy(pod);
    if policy == "Always" {
        return Ok(());
    }
    // A pod that can restart in place lets every container leave the
    // terminated state (RestartAllContainersOnContainerExits).
    if crate::pods::restart_all::could_restart(pod) {
        return Ok(());
    }
    let check = |olds: Option<&Vec<k8s_openapi::api::core::v1::ContainerStatus>>,
                 news: Option<&Vec<k8s_openapi::api::core::v1::ContainerStatus>>,
                 init: bool|
     -> Result<(), StatusError> {
        for o in olds.into_iter().flatten() {
            if !is_terminated(o) {
                continue;
            }
            if init
                && podutil::init_containers(pod)
                    .iter()
                    .any(|c| c.name == o.name && podutil::is_restartable_init(c))
            {
                continue;
            }
            let code = o
                .state
                .as_ref()
                .and_then(|s| s.terminated.as_ref())
                .map(|t| t.exit_code)
                .unwrap_or(0);
            if policy == "OnFailure" && code != 0 {
                continue;
            }
            // ContainerRestartRules: the container's rules and policy may
            // restart it.
            let spec = if init {
                podutil::init_containers(pod)
            } else {
                podutil::containers(pod)
            };
            if spec
                .iter()
                .any(|c| c.name == o.name && podutil::container_should_restart(c, pod, code))
            {
                continue;
            }
            for n in news.into_iter().flatten() {
                if n.name == o.name && !is_terminated(n) {
                    return Err(StatusError::IllegalTransition(n.name.clone()));
                }
            }
        }
        Ok(())
    };
    check(
        old.container_statuses.as_ref(),
        new.container_statuses.as_ref(),
        false,
    )?;
    check(
        old.init_container_statuses.as_ref(),
        new.init_container_statuses.as_ref(),
        true,
    )
}

fn set_transition_times(
    new: &mut PodStatus,
    old: &PodStatus,
    now: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time,
) {
    let olds: HashMap<String, PodCondition> = conditions_of(old)
        .map(|c| (c.type_.clone(), c.clone()))
        .collect();
    for c in new.conditions.iter_mut().flatten() {
        // Resize conditions carry their own times.
        if !kubelet_owned(c) || c.type_.starts_with("PodResize") {
            continue;
        }
        c.last_transition_time = match olds.get(&c.type_) {
            Some(o) if o.status == c.status && o.last_transition_time.is_some() => {
                o.last_transition_time.clone()
            }
            _ => Some(now.clone()),
        };
    }
}

fn waiting(c: &k8s_openapi::api::core::v1::ContainerStatus) -> bool {
    c.state.as_ref().is_some_and(|s| s.waiting.is_some())
}

fn last_terminated(c: &k8s_openapi::api::core::v1::ContainerStatus) -> bool {
    c.last_state
        .as_ref()
        .is_some_and(|s| s.terminated.is_some())
}

/// `initializedContainers`: how many leading init statuses attempted to
/// start (at least one).
fn initialized_prefix(inits: &[k8s_openapi::api::core::v1::ContainerStatus]) -> usize {
    for i in (0..inits.len()).rev() {
        if !waiting(&inits[i]) || last_terminated(&inits[i]) {
            return i + 1;
        }
    }
    inits.len().min(1)
}

/// `hasPodInitialized`, from the API's status of the pod.
fn has_pod_initialized(pod: &Pod) -> bool {
    if podutil::init_containers(pod).is_empty() {
        return true;
    }
    let status = pod.status.clone().unwrap_or_default();
    if status
        .container_statuses
        .iter()
        .flatten()
        .any(|c| last_terminated(c) || !waiting(c))
    {
        return true;
    }
    let inits = status.init_container_statuses.unwrap_or_default();
    let (Some(last), Some(spec)) = (
        inits.last(),
        podutil::init_containers(pod).get(inits.len().wrapping_sub(1)),
    ) else {
        return false;
    };
    if podutil::is_restartable_init(spec) {
        return last.state.as_ref().is_some_and(|s| s.running.is_some())
            && last.started == Some(true);
    }
    let completed = |s: Option<&ApiState>| {
        s.and_then(|s| s.terminated.as_ref())
            .is_some_and(|t| t.reason.as_deref() == Some("Completed"))
    };
    completed(last.last_state.as_ref()) || completed(last.state.as_ref())
}

/// `mergePodStatus`: keep others' conditions, hold a terminal phase back
/// while containers may run, force Ready false on a terminal phase.
pub fn merge_pod_status(api: &PodStatus, new: &PodStatus, could_have_running: bool) -> PodStatus {
    let mut merged = new.clone();
    // Conditions shared with other writers (DisruptionTarget) stay as the
    // API has them unless this write moves the pod to a terminal phase.
    let mut conditions: Vec<PodCondition> = conditions_of(api)
        .filter(|c| !KUBELET_CONDITIONS.contains(&c.type_.as_str()))
        .cloned()
        .collect();
    let api_phase = api.phase.as_deref().unwrap_or_default();
    let new_phase = new.phase.as_deref().unwrap_or_default();
    let to_terminal =
        !podutil::is_terminal_phase(api_phase) && podutil::is_terminal_phase(new_phase);
    for c in conditions_of(new) {
        if KUBELET_CONDITIONS.contains(&c.type_.as_str()) {
            conditions.push(c.clone());
        } else if c.type_ == "DisruptionTarget" && to_terminal && !could_have_running {
            conditions.retain(|x| x.type_ != c.type_);
            conditions.push(c.clone());
        }
    }
    merged.conditions = Some(conditions);
    merged.resource_claim_statuses = api.resource_claim_statuses.clone();
    if to_terminal && could_have_running {
        merged.phase = api.phase.clone();
        merged.reason = api.reason.clone();
        merged.message = api.message.clone();
    }
    if podutil::is_terminal_phase(merged.phase.as_deref().unwrap_or_default()) {
        let reason = if merged.phase.as_deref() == Some("Failed") {
            "PodFailed"
        } else {
            "PodCompleted"
        };
        for c in merged.conditions.iter_mut().flatten() {
            if (c.type_ == "Ready" || c.type_ == "ContainersReady") && c.status == "True" {
                c.status = "False".into();
                c.reason = Some(reason.into());
                c.message = None;
            }
        }
    }
    merged
}

impl StatusManager {
    /// A status manager writing through `client`.
    pub fn new(
        client: kube::Client,
        metrics: PodMetrics,
        clock: SharedClock,
        targets: Arc<dyn StatusTargets>,
    ) -> Self {
        StatusManager {
            shared: Arc::new(Shared {
                state: Mutex::new(State::default()),
                wake: Notify::new(),
                client,
                metrics,
                clock,
                targets,
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.shared
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The cached status of a pod.
    pub fn get(&self, uid: &str) -> Option<PodStatus> {
        self.lock().statuses.get(uid).map(|v| v.status.clone())
    }

    /// `SetPodStatus`.
    pub fn set_pod_status(&self, pod: &Pod, status: PodStatus) {
        self.update(pod, status, false, false);
    }

    /// `TerminatePod`: every container not terminated becomes terminated
    /// (`ContainerStatusUnknown`), the phase becomes terminal.
    pub fn terminate_pod(&self, pod: &Pod) {
        let mut status = self
            .get(podutil::uid(pod))
            .or_else(|| pod.status.clone())
            .unwrap_or_default();
        let unknown = || ApiState {
            terminated: Some(ContainerStateTerminated {
                exit_code: 137,
                reason: Some(CONTAINER_STATUS_UNKNOWN.into()),
                message: Some(
                    "The container could not be located when the pod was terminated".into(),
                ),
                ..Default::default()
            }),
            ..Default::default()
        };
        if has_pod_initialized(pod) {
            for c in status.container_statuses.iter_mut().flatten() {
                if !is_terminated(c) {
                    c.state = Some(unknown());
                }
            }
        }
        // Init containers that attempted to start and are now waiting are
        // marked failed; the never-started suffix stays waiting.
        let inits = status
            .init_container_statuses
            .as_deref()
            .unwrap_or_default();
        let prefix = initialized_prefix(inits);
        for c in status
            .init_container_statuses
            .iter_mut()
            .flatten()
            .take(prefix)
        {
            let st = c.state.clone().unwrap_or_default();
            let skip = st.terminated.is_some()
                || st
                    .waiting
                    .as_ref()
                    .is_none_or(|w| w.reason.as_deref() == Some("PodInitializing"));
            if !skip {
                c.state = Some(unknown());
            }
        }
        if !podutil::is_static(pod) {
            match status.phase.as_deref() {
                Some("Succeeded") | Some("Failed") => {}
                _ => status.phase = Some("Failed".into()),
            }
        }
        self.update(pod, status, true, true);
    }

    fn update(&self, pod: &Pod, mut status: PodStatus, force: bool, mut finished: bool) {
        let uid = podutil::uid(pod).to_string();
        let now = to_api_time(self.shared.clock.now());
        let mut st = self.lock();
        let cached = st.statuses.get(&uid).cloned();
        let old = match &cached {
            Some(c) => {
                if c.pod_is_finished && !finished && !podutil::is_static(pod) {
                    finished = true;
                }
                c.status.clone()
            }
            None => pod.status.clone().unwrap_or_default(),
        };
        if let Err(e) = check_transition(&old, &status, pod) {
            tracing::error!(pod = %podutil::key(pod), error = %e, "status update on pod aborted");
            return;
        }
        super::normalize::normalize(pod, &mut status);
        set_transition_times(&mut status, &old, &now);
        match &old.start_time {
            Some(t) => status.start_time = Some(t.clone()),
            None if status.start_time.is_none() => status.start_time = Some(now.clone()),
            None => {}
        }
        if let Some(c) = &cached
            && !force
            && status_equal_by_kubelet(&c.status, &status)
        {
            return;
        }
        let version = cached.as_ref().map(|c| c.version).unwrap_or(0) + 1;
        let at = cached.as_ref().map(|c| c.at).unwrap_or_else(Instant::now);
        st.statuses.insert(
            uid.clone(),
            Versioned {
                status,
                version,
                name: podutil::name(pod).to_string(),
                namespace: podutil::namespace(pod).to_string(),
                is_static: podutil::is_static(pod),
                pod_is_finished: finished,
                at,
            },
        );
        st.retry.remove(&uid);
        drop(st);
        self.shared.wake.notify_one();
    }

    /// Forgets statuses of pods not in `keep` (`RemoveOrphanedStatuses`).
    pub fn remove_orphans(&self, keep: &HashSet<String>) {
        let mut st = self.lock();
        st.statuses.retain(|uid, _| keep.contains(uid));
        st.api_versions.retain(|uid, _| keep.contains(uid));
        st.retry.retain(|uid, _| keep.contains(uid));
    }

    /// Forgets one pod's status.
    pub fn remove(&self, uid: &str) {
        let mut st = self.lock();
        st.statuses.remove(uid);
        st.api_versions.remove(uid);
        st.retry.remove(uid);
    }

    /// Writes statuses until `stop` is cancelled.
    pub async fn run(self, stop: CancellationToken) {
        let mut reconcile = tokio::time::interval(RECONCILE_PERIOD);
        reconcile.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let next_retry = self.lock().retry.values().map(|(at, _)| *at).min();
            let sleep_until = next_retry.unwrap_or_else(|| Instant::now() + RECONCILE_PERIOD * 100);
            let full = tokio::select! {
                _ = stop.cancelled() => return,
                _ = self.shared.wake.notified() => false,
                _ = reconcile.tick() => true,
                _ = tokio::time::sleep_until(sleep_until) => false,
            };
            self.sync_batch(full).await;
        }
    }

    /// `syncBatch`: writes what changed (and with `full`, what differs from
    /// the API's copy).
    pub async fn sync_batch(&self, full: bool) {
        let now = Instant::now();
        let work: Vec<(String, Versioned)> = {
            let st = self.lock();
            st.statuses
                .iter()
                .filter(|(uid, v)| {
                    if let Some((at, _)) = st.retry.get(*uid)
                        && *at > now
                    {
                        return false;
                    }
                    let behind = st.api_versions.get(*uid).is_none_or(|a| *a < v.version);
                    behind || (full && self.needs_reconcile(uid, v))
                })
                .map(|(u, v)| (u.clone(), v.clone()))
                .collect()
        };
        for (uid, v) in work {
            match self.sync_pod(&uid, &v).await {
                Ok(()) => {
                    let mut st = self.lock();
                    st.retry.remove(&uid);
                }
                Err(e) => {
                    self.shared
                        .metrics
                        .status_patches_total
                        .with_label_values(&["error"])
                        .inc();
                    let mut st = self.lock();
                    let delay = st
                        .retry
                        .get(&uid)
                        .map(|(_, d)| (*d * 2).min(RETRY_MAX))
                        .unwrap_or(RETRY_INITIAL);
                    st.retry
                        .insert(uid.clone(), (Instant::now() + delay, delay));
                    tracing::info!(pod = %format!("{}/{}", v.namespace, v.name), error = %e, retry_in = ?delay, "failed to update pod status; will retry");
                }
            }
        }
    }

    fn needs_reconcile(&self, uid: &str, v: &Versioned) -> bool {
        match self.shared.targets.api_pod(uid) {
            Some(p) => {
                let api = p.status.clone().unwrap_or_default();
                !status_equal_by_kubelet(&merge_pod_status(&api, &v.status, true), &api)
            }
            None => false,
        }
    }

    async fn sync_pod(&self, uid: &str, v: &Versioned) -> Result<(), StatusError> {
        let api: Api<Pod> = Api::namespaced(self.shared.client.clone(), &v.namespace);
        let pod = match self.shared.targets.api_pod(uid) {
            Some(p) => p,
            None => match api.get_opt(&v.name).await {
                Ok(Some(p)) => p,
                Ok(None) => {
                    tracing::debug!(pod = %v.name, "pod does not exist on the server; status not written");
                    return Ok(());
                }
                Err(e) => return Err(e.into()),
            },
        };
        let api_uid = podutil::uid(&pod).to_string();
        if !v.is_static && api_uid != uid {
            tracing::info!(pod = %podutil::key(&pod), "pod was deleted and then recreated, skipping status update");
            self.remove(uid);
            return Ok(());
        }
        let could_run = self.shared.targets.could_have_running_containers(uid);
        let api_status = pod.status.clone().unwrap_or_default();
        let merged = merge_pod_status(&api_status, &v.status, could_run);
        let mut current = pod.clone();
        match status_patch(&api_uid, &api_status, &merged) {
            None => {
                self.shared
                    .metrics
                    .status_patches_total
                    .with_label_values(&["skipped_unchanged"])
                    .inc();
            }
            Some(patch) => {
                tracing::debug!(pod = %podutil::key(&pod), %patch, "patching pod status");
                let updated = api
                    .patch_status(
                        podutil::name(&pod),
                        &PatchParams::default(),
                        &Patch::Strategic(&patch),
                    )
                    .await;
                match updated {
                    Ok(p) => {
                        self.shared
                            .metrics
                            .status_patches_total
                            .with_label_values(&["success"])
                            .inc();
                        current = p;
                    }
                    Err(kube::Error::Api(s)) if s.code == 404 => {
                        tracing::debug!(pod = %podutil::key(&pod), "pod gone while writing status");
                        return Ok(());
                    }
                    Err(e) => return Err(e.into()),
                }
            }
        }
        {
            let mut st = self.lock();
            st.api_versions.insert(uid.to_string(), v.version);
        }
        if self.can_be_deleted(&current, v) {
            let dp = DeleteParams {
                grace_period_seconds: Some(0),
                preconditions: Some(Preconditions {
                    uid: Some(api_uid.clone()),
                    resource_version: None,
                }),
                ..Default::default()
            };
            match api.delete(podutil::name(&current), &dp).await {
                Ok(_) => {
                    tracing::info!(pod = %podutil::key(&current), "pod fully terminated and removed from the API");
                    self.remove(uid);
                }
                Err(kube::Error::Api(s)) if s.code == 404 => self.remove(uid),
                Err(e) => return Err(StatusError::Delete(e)),
            }
        }
        Ok(())
    }

    /// `canBeDeleted`: deleted, not a mirror pod, terminal in the API, and
    /// its termination finished.
    fn can_be_deleted(&self, pod: &Pod, v: &Versioned) -> bool {
        pod.metadata.deletion_timestamp.is_some()
            && !podutil::is_mirror(pod)
            && podutil::is_terminal_phase(podutil::phase(pod))
            && v.pod_is_finished
    }

    /// Whether a status is waiting to be written (for tests and metrics).
    pub fn pending(&self) -> usize {
        let st = self.lock();
        st.statuses
            .iter()
            .filter(|(u, v)| st.api_versions.get(*u).is_none_or(|a| *a < v.version))
            .count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(v: serde_json::Value) -> PodStatus {
        serde_json::from_value(v).expect("status")
    }

    #[test]
    fn merge_keeps_foreign_conditions_and_holds_terminal_phase() {
        let api = status(serde_json::json!({
            "phase": "Running",
            "conditions": [{"type": "example.com/x", "status": "True"}, {"type": "Ready", "status": "True"}]
        }));
        let new = status(serde_json::json!({
            "phase": "Failed",
            "conditions": [{"type": "Ready", "status": "True"}, {"type": "ContainersReady", "status": "True"}]
        }));
        let held = merge_pod_status(&api, &new, true);
        assert_eq!(held.phase.as_deref(), Some("Running"));
        let types: Vec<_> = held
            .conditions
            .iter()
            .flatten()
            .map(|c| c.type_.as_str())
            .collect();
        assert_eq!(types, vec!["example.com/x", "Ready", "ContainersReady"]);
        let done = merge_pod_status(&api, &new, false);
        assert_eq!(done.phase.as_deref(), Some("Failed"));
        let ready = done
            .conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == "Ready")
            .expect("ready");
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_deref()),
            ("False", Some("PodFailed"))
        );
    }

    #[test]
    fn disruption_target_survives_writes_after_the_terminal_one() {
        let api = status(serde_json::json!({
            "phase": "Failed",
            "conditions": [{"type": "DisruptionTarget", "status": "True", "reason": "TerminationByKubelet"}]
        }));
        let new = status(serde_json::json!({
            "phase": "Failed",
            "conditions": [{"type": "Ready", "status": "False"}]
        }));
        let merged = merge_pod_status(&api, &new, false);
        let types: Vec<_> = merged
            .conditions
            .iter()
            .flatten()
            .map(|c| c.type_.as_str())
            .collect();
        assert_eq!(types, vec!["DisruptionTarget", "Ready"]);
    }

    #[test]
    fn equality_ignores_foreign_conditions_and_times() {
        let a = status(serde_json::json!({
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": "2024-01-01T00:00:00Z"}]
        }));
        let b = status(serde_json::json!({
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True"}, {"type": "x", "status": "False"}]
        }));
        assert!(status_equal_by_kubelet(&a, &b));
        let c = status(
            serde_json::json!({"phase": "Running", "conditions": [{"type": "Ready", "status": "False"}]}),
        );
        assert!(!status_equal_by_kubelet(&a, &c));
    }

    #[test]
    fn never_restarting_container_cannot_leave_terminated() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p"}, "spec": {"restartPolicy": "Never", "containers": [{"name": "a"}]}
        }))
        .expect("pod");
        let old = status(
            serde_json::json!({"containerStatuses": [{"name": "a", "image": "", "imageID": "", "ready": false, "restartCount": 0,
            "state": {"terminated": {"exitCode": 0}}}]}),
        );
        let new = status(
            serde_json::json!({"containerStatuses": [{"name": "a", "image": "", "imageID": "", "ready": true, "restartCount": 0,
            "state": {"running": {}}}]}),
        );
        assert!(check_transition(&old, &new, &pod).is_err());
        assert!(check_transition(&new, &old, &pod).is_ok());
    }
}
