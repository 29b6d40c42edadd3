//! Wiring of the `keelson-probes` crate into the pod lifecycle: exec probes
//! through CRI ExecSync, probe workers started and stopped with each
//! container instance (adopted containers start from what the API last
//! showed, as kubelet after a restart),
//! liveness/startup results feeding `computePodActions`, readiness feeding
//! `ready` and the pod conditions, result changes waking the pod's worker,
//! and probe events recorded on the container.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::{Pod, PodStatus};
use keelson_cri::RuntimeClient;
use keelson_probes::{
    ContainerStart, Exec, ExecError, ExecOutput, ProbeEvent, ProbeManager, ProbeManagerConfig,
    ProbeManagerError, ProbeManagerOutputs, ProbeState, ReportedStatus,
};
use tokio::sync::mpsc;

use super::clock::from_nanos;
use super::events::PodEvents;
use super::runtime::actions::ProbeResults;
use super::runtime::errors::grpc_text;
use super::runtime::status::{ContainerState, RuntimePodStatus};
use super::status::ContainerReadiness;
use super::store::PodStore;
use crate::pod::podutil::{self, is_restartable_init};
use keelson_common::events::EventType;

/// Exec probes over CRI `ExecSync`.
#[derive(Debug, Clone)]
pub struct CriExec {
    cri: RuntimeClient,
}

impl CriExec {
    /// Exec through `cri`.
    pub fn new(cri: RuntimeClient) -> Self {
        CriExec { cri }
    }
}

impl Exec for CriExec {
    async fn exec(
        &self,
        container_id: &str,
        cmd: Vec<String>,
        timeout: Duration,
    ) -> Result<ExecOutput, ExecError> {
        match self.cri.exec_sync(container_id, cmd, timeout).await {
            Ok(r) => Ok(ExecOutput {
                exit_code: r.exit_code,
                stdout: r.stdout,
                stderr: r.stderr,
            }),
            Err(e) if e.is_deadline_exceeded() => Err(ExecError::Timeout),
            Err(e) => Err(ExecError::Failed(grpc_text(&e))),
        }
    }
}

/// The probe manager as the pod lifecycle uses it.
#[derive(Clone)]
pub struct PodProbes {
    manager: ProbeManager,
    /// pod uid → container name → container id told to the manager.
    started: Arc<Mutex<HashMap<String, HashMap<String, String>>>>,
    /// When this keelson started: containers started before are adopted.
    process_start: SystemTime,
}

impl std::fmt::Debug for PodProbes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PodProbes").finish_non_exhaustive()
    }
}

impl PodProbes {
    /// Creates the probe manager (exec through `cri`, metrics into
    /// `registry`); `process_start` tells adopted containers apart.
    pub fn new(
        cri: RuntimeClient,
        registry: &prometheus::Registry,
        config: ProbeManagerConfig,
        process_start: SystemTime,
    ) -> Result<(PodProbes, ProbeManagerOutputs), ProbeManagerError> {
        let (manager, outputs) = ProbeManager::new(config, Arc::new(CriExec::new(cri)), registry)?;
        Ok((
            PodProbes {
                manager,
                started: Arc::new(Mutex::new(HashMap::new())),
                process_start,
            },
            outputs,
        ))
    }

    fn started(&self) -> MutexGuard<'_, HashMap<String, HashMap<String, String>>> {
        self.started.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The underlying manager.
    pub fn manager(&self) -> &ProbeManager {
        &self.manager
    }

    /// Records the pod's probes (idempotent).
    pub fn add_pod(&self, pod: &Pod) {
        if let Err(e) = self.manager.add_pod(pod) {
            tracing::warn!(pod = %podutil::key(pod), error = %e, "cannot register the pod's probes");
        }
    }

    /// Tells the manager which container instances run now: a new
    /// instance starts its probes, a stopped one stops them. `reported` is
    /// the pod status the API holds (for containers adopted after a restart).
    pub fn sync_containers(&self, pod: &Pod, rt: &RuntimePodStatus, reported: Option<&PodStatus>) {
        let uid = podutil::uid(pod).to_string();
        let probed: Vec<&k8s_openapi::api::core::v1::Container> = podutil::containers(pod)
            .iter()
            .chain(
                podutil::init_containers(pod)
                    .iter()
                    .filter(|c| is_restartable_init(c)),
            )
            .filter(|c| {
                c.liveness_probe.is_some()
                    || c.readiness_probe.is_some()
                    || c.startup_probe.is_some()
            })
            .collect();
        let mut started = self.started();
        let entry = started.entry(uid.clone()).or_default();
        for c in probed {
            let current = rt
                .containers_named(&c.name)
                .find(|s| s.state == ContainerState::Running);
            let known = entry.get(&c.name).cloned();
            match (current, known) {
                (Some(s), Some(k)) if s.id == k => {}
                (Some(s), previous) => {
                    if let Some(prev) = previous {
                        self.manager.container_stopped(&uid, &c.name, &prev);
                    }
                    let started_at = from_nanos(s.started_at);
                    let adopted =
                        adopted_status(started_at, self.process_start, reported, &c.name, &s.id);
                    let res = self.manager.container_started(
                        &uid,
                        &c.name,
                        ContainerStart {
                            container_id: s.id.clone(),
                            started_at,
                            pod_ips: rt.ips.clone(),
                            adopted,
                        },
                    );
                    match res {
                        Ok(()) => {
                            entry.insert(c.name.clone(), s.id.clone());
                        }
                        Err(e) => {
                            tracing::warn!(pod = %podutil::key(pod), container = %c.name, error = %e, "cannot start probes");
                        }
                    }
                }
                (None, Some(prev)) => {
                    self.manager.container_stopped(&uid, &c.name, &prev);
                    entry.remove(&c.name);
                }
                (None, None) => {}
            }
        }
    }

    /// The pod is terminating: liveness and startup stop.
    pub fn stop_liveness_and_startup(&self, uid: &str) {
        self.manager.stop_liveness_and_startup(uid);
    }

    /// The pod is gone.
    pub fn remove_pod(&self, uid: &str) {
        self.manager.remove_pod(uid);
        self.started().remove(uid);
    }

    /// Removes pods not in `desired`.
    pub fn cleanup_pods(&self, desired: &HashSet<String>) {
        self.manager.cleanup_pods(desired);
        self.started().retain(|uid, _| desired.contains(uid));
    }
}

impl ProbeResults for PodProbes {
    fn liveness(&self, container_id: &str) -> Option<ProbeState> {
        self.manager.liveness(container_id)
    }
    fn startup(&self, container_id: &str) -> Option<ProbeState> {
        self.manager.startup(container_id)
    }
}

impl ContainerReadiness for PodProbes {
    fn started(&self, pod_uid: &str, container: &str, container_id: &str) -> bool {
        self.manager.is_started(pod_uid, container, container_id)
    }
    fn ready(&self, pod_uid: &str, container: &str, container_id: &str) -> bool {
        self.manager.is_ready(pod_uid, container, container_id)
    }
}

/// Forwards probe result changes to `wake` (the pod's worker) and records
/// probe events on containers, until both channels close.
pub async fn forward_outputs(
    mut outputs: ProbeManagerOutputs,
    wake: mpsc::UnboundedSender<String>,
    store: PodStore,
    events: PodEvents,
) {
    loop {
        tokio::select! {
            u = outputs.updates.recv() => match u {
                Some(u) => {
                    tracing::debug!(pod = %u.pod_uid, container = %u.container_name, kind = %u.kind, state = %u.state, "probe result changed");
                    let _ = wake.send(u.pod_uid);
                }
                None => return,
            },
            e = outputs.events.recv() => match e {
                Some(e) => record_event(&store, &events, e),
                None => return,
            },
        }
    }
}

fn record_event(store: &PodStore, events: &PodEvents, e: ProbeEvent) {
    let Some(pod) = store.get(&e.pod_uid) else {
        return;
    };
    events.container(
        &pod,
        &e.container_name,
        &e.container_id,
        EventType::Warning,
        e.reason,
        e.message,
    );
}

/// How long before this process's start a container must have started to
/// count as one the previous agent ran (kubelet's
/// `kubeletRestartGracePeriod`, pkg/kubelet/prober/prober_manager.go).
const RESTART_GRACE: Duration = Duration::from_secs(10);

/// What an adopted container's probes start from, as kubelet v1.36 does
/// after a restart (ChangeContainerStatusOnKubeletRestart off, its
/// default; prober/worker.go and `setReadyStateOnKubeletRestart` in
/// prober_manager.go): a container that started more than
/// [`RESTART_GRACE`] before this process keeps `started` as the API last
/// showed it, and its readiness is the pod's Ready condition (kubelet
/// reports a probed container ready only while the pod was Ready). A
/// container started later is new: its probes start from the initial
/// values. `None` for a new container.
fn adopted_status(
    started_at: SystemTime,
    process_start: SystemTime,
    reported: Option<&PodStatus>,
    name: &str,
    container_id: &str,
) -> Option<ReportedStatus> {
    if started_at + RESTART_GRACE >= process_start {
        return None;
    }
    let cid = format!("://{container_id}");
    let started = reported
        .into_iter()
        .flat_map(|r| {
            r.container_statuses
                .iter()
                .flatten()
                .chain(r.init_container_statuses.iter().flatten())
        })
        .find(|st| {
            st.name == name
                && st
                    .container_id
                    .as_deref()
                    .is_some_and(|x| x.ends_with(&cid))
        })
        .and_then(|st| st.started)
        .unwrap_or(false);
    let pod_ready = reported
        .and_then(|r| r.conditions.as_ref())
        .into_iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True");
    Some(ReportedStatus {
        started,
        ready: pod_ready,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(ready_condition: &str, container_ready: bool, started: bool) -> PodStatus {
        serde_json::from_value(serde_json::json!({
            "conditions": [{"type": "Ready", "status": ready_condition}],
            "containerStatuses": [{
                "name": "app", "containerID": "containerd://abc", "image": "i", "imageID": "",
                "ready": container_ready, "started": started, "restartCount": 0
            }]
        }))
        .expect("pod status")
    }

    #[test]
    fn adopted_readiness_follows_the_pods_ready_condition_as_kubelet() {
        let start = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
        let long_ago = start - Duration::from_secs(60);
        let ready = status("True", true, true);
        assert_eq!(
            adopted_status(long_ago, start, Some(&ready), "app", "abc"),
            Some(ReportedStatus {
                started: true,
                ready: true
            })
        );
        // The container was ready but the pod was not (another container):
        // kubelet reports it unready until its probe succeeds again.
        let pod_unready = status("False", true, true);
        assert_eq!(
            adopted_status(long_ago, start, Some(&pod_unready), "app", "abc"),
            Some(ReportedStatus {
                started: true,
                ready: false
            })
        );
        // Another instance (other ID): not started as far as the API knows.
        assert_eq!(
            adopted_status(long_ago, start, Some(&ready), "app", "other"),
            Some(ReportedStatus {
                started: false,
                ready: true
            })
        );
    }

    #[test]
    fn a_container_started_within_the_grace_before_the_restart_is_new() {
        let start = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
        let ready = status("True", true, true);
        for ago in [0, 1, 10] {
            assert_eq!(
                adopted_status(
                    start - Duration::from_secs(ago),
                    start,
                    Some(&ready),
                    "app",
                    "abc"
                ),
                None,
                "{ago} s before"
            );
        }
        assert!(
            adopted_status(
                start - Duration::from_secs(11),
                start,
                Some(&ready),
                "app",
                "abc"
            )
            .is_some()
        );
    }
}
