//! Stopping containers and pods (kubelet's `killContainer`,
//! `killContainersWithSyncResult`, `killPodWithSyncResult` and the
//! sidecar termination ordering): the grace period (deletion grace, probe
//! grace for probe kills, the pod's), the preStop hook within it, sidecars
//! after the containers they serve, at least 2 s for SIGTERM, then the
//! sandbox.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use k8s_openapi::api::core::v1::{Container, Lifecycle, Pod, PodSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use tokio_util::sync::CancellationToken;

use super::actions::KillReason;
use super::errors::{GrpcError, KILL_CONTAINER_ERROR, KILL_POD_SANDBOX_ERROR, StepError};
use super::manager::RuntimeManager;
use super::status::RuntimePodStatus;
use super::sync::{PodSyncResult, SyncAction};
use crate::pod::labels::{container_info_from_annotations, container_info_from_labels};
use crate::pod::podutil::{self, is_restartable_init};
use crate::pods::events as reasons;
use keelson_common::events::EventType;

/// kubelet's `minimumGracePeriodInSeconds`.
pub const MINIMUM_GRACE_PERIOD: i64 = 2;

/// kubelet's `setTerminationGracePeriod`.
pub fn termination_grace_period(pod: &Pod, c: &Container, reason: KillReason) -> i64 {
    if let Some(g) = pod.metadata.deletion_grace_period_seconds {
        return g;
    }
    let Some(pod_grace) = podutil::spec(pod).termination_grace_period_seconds else {
        return MINIMUM_GRACE_PERIOD;
    };
    let probe = match reason {
        KillReason::StartupProbe => c.startup_probe.as_ref(),
        KillReason::LivenessProbe => c.liveness_probe.as_ref(),
        _ => None,
    };
    probe
        .and_then(|p| p.termination_grace_period_seconds)
        .unwrap_or(pod_grace)
}

/// Sidecars stop after the regular containers, in reverse start order
/// (kubelet's `terminationOrdering`).
#[derive(Debug, Default)]
pub struct TerminationOrdering {
    prereqs: HashMap<String, Vec<CancellationToken>>,
    terminated: HashMap<String, CancellationToken>,
}

impl TerminationOrdering {
    /// The ordering for `pod` with `running` container names.
    pub fn new(pod: &Pod, running: &[String]) -> Self {
        let mut o = TerminationOrdering::default();
        let mut main = Vec::new();
        for c in podutil::containers(pod) {
            let t = CancellationToken::new();
            if !running.contains(&c.name) {
                t.cancel();
            }
            main.push(t.clone());
            o.terminated.insert(c.name.clone(), t);
        }
        let mut previous_sidecar: Option<String> = None;
        for c in podutil::init_containers(pod).iter().rev() {
            let t = CancellationToken::new();
            if !running.contains(&c.name) {
                t.cancel();
            }
            o.terminated.insert(c.name.clone(), t);
            if is_restartable_init(c) {
                let mut pre = main.clone();
                if let Some(prev) = &previous_sidecar
                    && let Some(pt) = o.terminated.get(prev)
                {
                    pre.push(pt.clone());
                }
                o.prereqs.insert(c.name.clone(), pre);
                previous_sidecar = Some(c.name.clone());
            }
        }
        o
    }

    /// Waits (at most `grace` seconds) for the containers `name` must
    /// outlive; returns the seconds waited.
    pub async fn wait_for_turn(&self, name: &str, grace: i64) -> f64 {
        if grace <= 0 {
            return 0.0;
        }
        let start = tokio::time::Instant::now();
        // Not an Instant deadline: a huge terminationGracePeriodSeconds
        // would overflow it (tokio's timeout caps a far one itself).
        let limit = Duration::from_secs(u64::try_from(grace).unwrap_or(0));
        for t in self.prereqs.get(name).into_iter().flatten() {
            let left = limit.saturating_sub(start.elapsed());
            if tokio::time::timeout(left, t.cancelled()).await.is_err() {
                break;
            }
        }
        start.elapsed().as_secs_f64()
    }

    /// Marks `name` as exited.
    pub fn container_terminated(&self, name: &str) {
        if let Some(t) = self.terminated.get(name) {
            t.cancel();
        }
    }
}

/// Why a container or pod could not be stopped (the `KillContainerError` /
/// `KillPodSandboxError` message and the `FailedKillPod` event).
#[derive(Debug, Clone, thiserror::Error)]
pub enum KillError {
    /// The container is in neither the pod's spec nor its labels.
    #[error(
        "failed to get containerSpec {name:?} (id={container:?}) in pod {pod:?} when killing container for reason {message:?}"
    )]
    NoContainerSpec {
        /// The container's name.
        name: String,
        /// `<runtime>://<id>`.
        container: String,
        /// The pod as kubelet formats it.
        pod: String,
        /// Why it was being killed.
        message: String,
    },
    /// StopContainer failed.
    #[error(transparent)]
    StopContainer(GrpcError),
    /// StopPodSandbox failed.
    #[error(transparent)]
    StopSandbox(GrpcError),
}

impl RuntimeManager {
    /// kubelet's `killContainer`. `pod` may be a pod restored from the
    /// container's labels (a pod deleted while keelson was down).
    #[allow(clippy::too_many_arguments)]
    pub async fn kill_container(
        &self,
        pod: &Pod,
        container_id: &str,
        name: &str,
        message: &str,
        reason: KillReason,
        grace_override: Option<i64>,
        ordering: Option<&TerminationOrdering>,
    ) -> Result<(), KillError> {
        // kubelet's `GetContainerSpec` visits ephemeral containers too:
        // they stop with the pod like the others.
        let ephemeral;
        let spec = match podutil::container_spec(pod, name) {
            Some(s) => Some(s),
            None => {
                ephemeral = podutil::ephemeral_container_spec(pod, name);
                ephemeral.as_ref()
            }
        };
        let Some(spec) = spec else {
            return Err(KillError::NoContainerSpec {
                name: name.to_string(),
                container: format!("{}://{container_id}", self.settings.runtime_name),
                pod: podutil::format_pod(pod),
                message: message.to_string(),
            });
        };
        let mut grace = termination_grace_period(pod, spec, reason);
        let message = if message.is_empty() {
            format!("Stopping container {name}")
        } else {
            message.to_string()
        };
        self.events.container(
            pod,
            name,
            container_id,
            EventType::Normal,
            reasons::KILLING,
            message,
        );
        if let Some(g) = grace_override {
            grace = g;
        }
        if let Some(pre_stop) = spec.lifecycle.as_ref().and_then(|l| l.pre_stop.as_ref())
            && grace > 0
        {
            grace -= self
                .run_pre_stop(pod, spec, container_id, pre_stop, grace)
                .await;
        }
        if let Some(o) = ordering
            && grace > 0
        {
            grace -= o.wait_for_turn(name, grace).await as i64;
        }
        if grace < MINIMUM_GRACE_PERIOD {
            grace = MINIMUM_GRACE_PERIOD;
        }
        tracing::info!(pod = %podutil::key(pod), container = name, container_id, grace, "killing container with a grace period");
        match self
            .metrics
            .runtime_op(
                "stop_container",
                self.cri
                    .stop_container(container_id, Duration::from_secs(grace as u64)),
            )
            .await
        {
            Ok(()) => {}
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err(KillError::StopContainer(GrpcError(e))),
        }
        if let Some(o) = ordering {
            o.container_terminated(name);
        }
        Ok(())
    }

    /// Runs the preStop hook for at most `grace` seconds; returns the whole
    /// seconds it took.
    async fn run_pre_stop(
        &self,
        pod: &Pod,
        c: &Container,
        container_id: &str,
        handler: &k8s_openapi::api::core::v1::LifecycleHandler,
        grace: i64,
    ) -> i64 {
        let start = tokio::time::Instant::now();
        let pod_ip = pod
            .status
            .as_ref()
            .and_then(|s| s.pod_ip.clone())
            .unwrap_or_default();
        let runner = self.hooks.clone();
        let events = self.events.clone();
        let (pod2, c2, id2, h2) = (
            pod.clone(),
            c.clone(),
            container_id.to_string(),
            handler.clone(),
        );
        let task = tokio::spawn(async move {
            if let Err(msg) = runner.run(&pod2, &c2, &id2, &h2, &pod_ip).await {
                tracing::warn!(pod = %podutil::key(&pod2), container = %c2.name, error = %msg, "preStop hook failed");
                events.container(
                    &pod2,
                    &c2.name,
                    &id2,
                    EventType::Warning,
                    reasons::FAILED_PRE_STOP_HOOK,
                    "PreStopHook failed",
                );
            }
        });
        let limit = Duration::from_secs(u64::try_from(grace).unwrap_or(0));
        if tokio::time::timeout(limit, task).await.is_err() {
            tracing::info!(pod = %podutil::key(pod), container = %c.name, grace, "preStop hook not completed in grace period");
        }
        start.elapsed().as_secs() as i64
    }

    /// Stops every running container (in parallel, sidecars last) and every
    /// sandbox of the pod. `pod` is `None` when only the runtime knows the
    /// pod (its spec is restored from container labels).
    pub async fn kill_pod(
        &self,
        pod: Option<&Pod>,
        running: &RuntimePodStatus,
        grace_override: Option<i64>,
        result: &mut PodSyncResult,
    ) -> Result<(), KillError> {
        let containers: Vec<_> = running.running().cloned().collect();
        let restored;
        let pod_ref: &Pod = match pod {
            Some(p) => p,
            None => {
                restored = self.restore_pod(running).await;
                &restored
            }
        };
        let names: Vec<String> = containers.iter().map(|c| c.name.clone()).collect();
        let ordering = podutil::has_restartable_init(pod_ref)
            .then(|| Arc::new(TerminationOrdering::new(pod_ref, &names)));
        let kills = containers.iter().map(|c| {
            let ordering = ordering.clone();
            Box::pin(async move {
                let r = self
                    .kill_container(
                        pod_ref,
                        &c.id,
                        &c.name,
                        "",
                        KillReason::Unknown,
                        grace_override,
                        ordering.as_deref(),
                    )
                    .await;
                (c.name.clone(), r)
            })
        });
        let mut first_error = None;
        for (name, r) in join_all(kills).await {
            if let Err(e) = &r {
                tracing::warn!(pod = %running.namespace, container = %name, error = %e, "kill container failed");
                first_error.get_or_insert_with(|| e.clone());
            }
            result.steps.push(super::sync::StepResult {
                action: SyncAction::KillContainer,
                target: name,
                error: r
                    .err()
                    .map(|e| StepError::new(KILL_CONTAINER_ERROR, e.to_string())),
            });
        }
        let mut sandbox_error = None;
        for sb in &running.sandboxes {
            if let Err(e) = self
                .metrics
                .runtime_op("stop_podsandbox", self.cri.stop_pod_sandbox(&sb.id))
                .await
                && !e.is_not_found()
            {
                sandbox_error = Some(KillError::StopSandbox(GrpcError(e)));
            }
        }
        result.steps.push(super::sync::StepResult {
            action: SyncAction::KillPodSandbox,
            target: running.uid.clone(),
            error: sandbox_error
                .clone()
                .map(|e| StepError::new(KILL_POD_SANDBOX_ERROR, e.to_string())),
        });
        match first_error.or(sandbox_error) {
            Some(e) => {
                if let Some(p) = pod {
                    self.events.pod(
                        p,
                        EventType::Warning,
                        reasons::FAILED_KILL_POD,
                        format!("error killing pod: {e}"),
                    );
                }
                Err(e)
            }
            None => Ok(()),
        }
    }

    /// A pod good enough to kill containers with, rebuilt from their labels
    /// and annotations (`restoreSpecsFromContainerLabels`).
    async fn restore_pod(&self, running: &RuntimePodStatus) -> Pod {
        let mut containers = Vec::new();
        let mut deletion_grace = None;
        let mut termination_grace = None;
        for c in running.running() {
            let Ok(resp) = self.cri.container_status(&c.id, false).await else {
                containers.push(Container {
                    name: c.name.clone(),
                    ..Default::default()
                });
                continue;
            };
            let Some(s) = resp.status else { continue };
            let l = container_info_from_labels(&s.labels);
            let a = container_info_from_annotations(&s.annotations);
            deletion_grace = deletion_grace.or(a.pod_deletion_grace_period);
            termination_grace = termination_grace.or(a.pod_termination_grace_period);
            containers.push(Container {
                name: l.container_name,
                ports: (!a.ports.is_empty()).then_some(a.ports),
                termination_message_path: Some(a.termination_message_path),
                lifecycle: a.pre_stop.map(|p| Lifecycle {
                    pre_stop: Some(p),
                    ..Default::default()
                }),
                ..Default::default()
            });
        }
        Pod {
            metadata: ObjectMeta {
                uid: Some(running.uid.clone()),
                name: Some(running.name.clone()),
                namespace: Some(running.namespace.clone()),
                deletion_grace_period_seconds: deletion_grace,
                ..Default::default()
            },
            spec: Some(PodSpec {
                containers,
                termination_grace_period_seconds: termination_grace,
                ..Default::default()
            }),
            status: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(v: serde_json::Value) -> Pod {
        serde_json::from_value(v).expect("pod")
    }

    #[test]
    fn grace_period_sources() {
        let p = pod(serde_json::json!({
            "metadata": {"name": "p"},
            "spec": {"terminationGracePeriodSeconds": 30, "containers": [{"name": "c",
                "livenessProbe": {"exec": {"command": ["true"]}, "terminationGracePeriodSeconds": 5}}]}
        }));
        let c = &podutil::containers(&p)[0];
        assert_eq!(
            termination_grace_period(&p, c, KillReason::LivenessProbe),
            5
        );
        assert_eq!(
            termination_grace_period(&p, c, KillReason::StartupProbe),
            30
        );
        assert_eq!(termination_grace_period(&p, c, KillReason::Unknown), 30);
        let mut deleted = p.clone();
        deleted.metadata.deletion_grace_period_seconds = Some(7);
        assert_eq!(
            termination_grace_period(&deleted, c, KillReason::LivenessProbe),
            7
        );
        let mut none = p.clone();
        if let Some(s) = none.spec.as_mut() {
            s.termination_grace_period_seconds = None;
        }
        assert_eq!(termination_grace_period(&none, c, KillReason::Unknown), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn sidecars_wait_for_regular_containers_then_later_sidecars() {
        let p = pod(serde_json::json!({
            "spec": {"initContainers": [
                {"name": "s1", "restartPolicy": "Always"},
                {"name": "init"},
                {"name": "s2", "restartPolicy": "Always"}],
             "containers": [{"name": "app"}]}
        }));
        let running: Vec<String> = ["s1", "s2", "app"].iter().map(|s| s.to_string()).collect();
        let o = Arc::new(TerminationOrdering::new(&p, &running));
        // The app exits after 3 s: s2 may stop then; s1 after s2.
        let o2 = o.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(3)).await;
            o2.container_terminated("app");
        });
        let waited_s2 = o.wait_for_turn("s2", 30).await;
        assert!((3.0..3.1).contains(&waited_s2), "{waited_s2}");
        let o3 = o.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(2)).await;
            o3.container_terminated("s2");
        });
        let waited_s1 = o.wait_for_turn("s1", 30).await;
        assert!((2.0..2.1).contains(&waited_s1), "{waited_s1}");
        // A regular container never waits; a wait is capped by the grace.
        assert_eq!(o.wait_for_turn("app", 30).await, 0.0);
        let fresh = TerminationOrdering::new(&p, &running);
        let capped = fresh.wait_for_turn("s1", 4).await;
        assert!((4.0..4.1).contains(&capped), "{capped}");
        // The largest grace the API accepts does not overflow the wait.
        let huge = Arc::new(TerminationOrdering::new(&p, &running));
        let h2 = huge.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(1)).await;
            h2.container_terminated("app");
        });
        let waited = huge.wait_for_turn("s2", i64::MAX).await;
        assert!((1.0..1.1).contains(&waited), "{waited}");
    }
}
