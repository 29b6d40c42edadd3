//! kubelet's `SyncPod` of the runtime manager: compute the actions, kill
//! what must go, (re)create the sandbox, start init containers one by one
//! and sidecars, then the app containers — each start guarded by
//! CrashLoopBackOff — and report every step's result.

use std::sync::Arc;
use std::time::SystemTime;

use k8s_openapi::api::core::v1::{Container, Pod, Secret};
use keelson_common::gofmt;
use keelson_cri::api;

use super::actions::{ProbeResults, compute_pod_actions_with};
use super::errors::{
    CONFIG_POD_SANDBOX_ERROR, CRASH_LOOP_BACK_OFF, CREATE_POD_SANDBOX_ERROR, GrpcError, StepError,
    grpc_text,
};
use super::manager::RuntimeManager;
use super::sandbox::{
    SandboxInputs, check_dynamic_resources, generate_sandbox_config, pod_logs_dir,
};
use super::status::{ContainerState, RuntimePodStatus};
use crate::pod::hash::hash_label;
use crate::pod::podutil::{self, is_restartable_init};
use crate::pods::clock::from_nanos;
use crate::pods::events as reasons;
use keelson_common::events::EventType;

/// The step a result is about (kubelet's `SyncAction`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncAction {
    /// Start (create + start) a container.
    StartContainer,
    /// Stop a container.
    KillContainer,
    /// Create the sandbox.
    CreatePodSandbox,
    /// Build the sandbox config.
    ConfigPodSandbox,
    /// Stop the sandbox.
    KillPodSandbox,
    /// Resize running containers in place.
    ResizePodInPlace,
    /// Remove a container (a restart of the whole pod).
    RemoveContainer,
}

impl SyncAction {
    fn as_str(self) -> &'static str {
        match self {
            SyncAction::StartContainer => "StartContainer",
            SyncAction::KillContainer => "KillContainer",
            SyncAction::CreatePodSandbox => "CreatePodSandbox",
            SyncAction::ConfigPodSandbox => "ConfigPodSandbox",
            SyncAction::KillPodSandbox => "KillPodSandbox",
            SyncAction::ResizePodInPlace => "ResizePodInPlace",
            SyncAction::RemoveContainer => "RemoveContainer",
        }
    }
}

/// One step's result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepResult {
    /// What.
    pub action: SyncAction,
    /// On what (container name, pod).
    pub target: String,
    /// The failure, if any.
    pub error: Option<StepError>,
}

/// What a sync did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodSyncResult {
    /// Each step.
    pub steps: Vec<StepResult>,
    /// When a backoff that stopped a step ends (the worker syncs again then).
    pub retry_at: Option<SystemTime>,
    /// The sandbox was created in this sync.
    pub created_sandbox: bool,
    /// Time spent pulling images in this sync.
    pub image_pull_time: std::time::Duration,
    /// Resources were changed in place (the runtime must be read again).
    pub resized: bool,
}

impl PodSyncResult {
    fn push(&mut self, action: SyncAction, target: &str, error: Option<StepError>) {
        self.steps.push(StepResult {
            action,
            target: target.to_string(),
            error,
        });
    }

    fn retry_no_later_than(&mut self, t: SystemTime) {
        self.retry_at = Some(match self.retry_at {
            Some(r) if r < t => r,
            _ => t,
        });
    }

    /// kubelet's aggregated error text, `None` when every step succeeded.
    pub fn error(&self) -> Option<String> {
        let errs: Vec<String> = self
            .steps
            .iter()
            .filter_map(|s| {
                s.error.as_ref().map(|e| {
                    format!(
                        "failed to {} for {} with {}: {}",
                        gofmt::quote(s.action.as_str()),
                        gofmt::quote(&s.target),
                        e.reason,
                        gofmt::quote(&e.message)
                    )
                })
            })
            .collect();
        match errs.len() {
            0 => None,
            1 => errs.into_iter().next(),
            _ => Some(format!("[{}]", errs.join(", "))),
        }
    }

    /// Whether a container was removed without error (kubelet requeues the
    /// pod at once after such a restart of the whole pod).
    pub fn removed_containers(&self) -> bool {
        self.steps
            .iter()
            .any(|s| s.action == SyncAction::RemoveContainer && s.error.is_none())
    }

    /// Whether every failed step failed only because of a backoff.
    pub fn only_backoff(&self) -> bool {
        self.steps.iter().filter_map(|s| s.error.as_ref()).all(|e| {
            e.reason == CRASH_LOOP_BACK_OFF || e.reason == super::errors::IMAGE_PULL_BACK_OFF
        })
    }
}

/// kubelet's `GetStableKey`: the CrashLoopBackOff key of a container.
pub fn stable_key(pod: &Pod, c: &Container) -> String {
    format!(
        "{}_{}_{}_{}_{}",
        podutil::name(pod),
        podutil::namespace(pod),
        podutil::uid(pod),
        c.name,
        hash_label(c)
    )
}

/// Which kind of container a start is for (metric label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartKind {
    /// `spec.initContainers[i]`.
    Init,
    /// `spec.containers[i]`.
    Regular,
    /// `spec.ephemeralContainers[i]`.
    Ephemeral,
}

impl StartKind {
    /// The `container_type` metric label.
    pub fn metric_label(self) -> &'static str {
        match self {
            StartKind::Init => "init_container",
            StartKind::Regular => "container",
            StartKind::Ephemeral => "ephemeral_container",
        }
    }
}

impl RuntimeManager {
    /// `doBackOff`: whether the container is in CrashLoopBackOff; records
    /// the restart in the backoff when it is not.
    fn do_backoff(
        &self,
        pod: &Pod,
        c: &Container,
        status: &RuntimePodStatus,
    ) -> Option<(StepError, Option<SystemTime>)> {
        let exited = status
            .containers_named(&c.name)
            .find(|s| s.state == ContainerState::Exited)?;
        let finished = from_nanos(exited.finished_at);
        let key = stable_key(pod, c);
        if self.crash_backoff.is_in_backoff_since(&key, finished) {
            self.events.container(
                pod,
                &c.name,
                "",
                EventType::Warning,
                reasons::BACK_OFF,
                format!(
                    "Back-off restarting failed container {} in pod {}",
                    c.name,
                    podutil::format_pod(pod)
                ),
            );
            let msg = format!(
                "back-off {} restarting failed container={} pod={}",
                gofmt::duration(self.crash_backoff.get(&key)),
                c.name,
                podutil::format_pod(pod)
            );
            return Some((
                StepError::new(CRASH_LOOP_BACK_OFF, msg),
                self.crash_backoff.expires_at(&key, finished),
            ));
        }
        self.crash_backoff.next(&key, finished);
        None
    }

    /// The first sync of a pod whose sandbox an earlier keelson or a
    /// kubelet started says, once, what was found and what is kept: the
    /// proof in the log that a restart or a takeover from kubelet adopted
    /// the pod (or, at warn, what it is about to replace).
    fn log_adoption(
        &self,
        pod: &Pod,
        status: &RuntimePodStatus,
        actions: &super::actions::PodActions,
    ) {
        let Some(sandbox) = status.sandboxes.first() else {
            return;
        };
        if from_nanos(sandbox.created_at) >= self.started {
            return;
        }
        let first = self
            .adoption_logged
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(podutil::uid(pod).to_string());
        if !first {
            return;
        }
        let running: Vec<String> = status
            .containers
            .iter()
            .filter(|c| c.state == ContainerState::Running)
            .map(|c| format!("{}={}", c.name, c.id))
            .collect();
        let killed: Vec<&str> = actions
            .containers_to_kill
            .iter()
            .map(|k| k.name.as_str())
            .collect();
        if actions.create_sandbox || actions.kill_pod || !killed.is_empty() {
            tracing::warn!(
                pod = %podutil::key(pod),
                sandbox = %sandbox.id,
                containers = ?running,
                create_sandbox = actions.create_sandbox,
                kill_pod = actions.kill_pod,
                kill = ?killed,
                "found the pod running from before this start and replaces part of it"
            );
        } else {
            tracing::info!(
                pod = %podutil::key(pod),
                sandbox = %sandbox.id,
                attempt = sandbox.attempt,
                containers = ?running,
                "adopted the pod's running sandbox and containers"
            );
        }
    }

    /// kubelet's `SyncPod` for a pod that should run; `restart_all`: the
    /// pod's `AllContainersRestarting` condition is True; `sandbox_ready`
    /// is kubelet's `RuntimeHelper.OnPodSandboxReady`, called once a new
    /// sandbox is up (network set, volumes mounted), before any image is
    /// pulled.
    #[allow(clippy::too_many_arguments)]
    pub async fn sync_pod(
        &self,
        pod: &Pod,
        status: &RuntimePodStatus,
        pull_secrets: &[Secret],
        probes: &dyn ProbeResults,
        active_pods: &[Arc<Pod>],
        restart_all: bool,
        sandbox_ready: &(dyn Fn(&Pod) + Sync),
    ) -> PodSyncResult {
        let actions =
            compute_pod_actions_with(pod, status, probes, Some(&*self.actuated), restart_all);
        tracing::debug!(pod = %podutil::key(pod), ?actions, "computed pod actions");
        self.log_adoption(pod, status, &actions);
        let mut result = PodSyncResult::default();
        if actions.create_sandbox && !actions.sandbox_id.is_empty() {
            self.events.pod(
                pod,
                EventType::Normal,
                reasons::SANDBOX_CHANGED,
                "Pod sandbox changed, it will be killed and re-created.",
            );
        }
        if actions.kill_pod {
            if let Err(e) = Box::pin(self.kill_pod(Some(pod), status, None, &mut result)).await {
                tracing::warn!(pod = %podutil::key(pod), error = %e, "killing the pod failed");
                return result;
            }
            if actions.create_sandbox {
                self.purge_init_containers(pod, status).await;
            }
        } else {
            for k in &actions.containers_to_kill {
                let err = self
                    .kill_container(
                        pod,
                        &k.container_id,
                        &k.name,
                        &k.message,
                        k.reason,
                        None,
                        None,
                    )
                    .await;
                let failed = err.is_err();
                result.push(
                    SyncAction::KillContainer,
                    &k.name,
                    err.err()
                        .map(|e| StepError::new(super::errors::KILL_CONTAINER_ERROR, e)),
                );
                if failed {
                    return result;
                }
            }
            if !self
                .reset_containers(pod, &actions.containers_to_reset, &mut result)
                .await
            {
                return result;
            }
        }
        self.prune_init_containers(pod, status).await;

        let mut pod_ips = status.ips.clone();
        let mut sandbox_id = actions.sandbox_id.clone();
        let cgroup_parent = self.cgroups.cgroup_parent(pod);
        let inputs = SandboxInputs {
            dns: &self.settings.dns,
            pod_logs_root: &self.settings.pod_logs_root,
            cgroup_parent: &cgroup_parent,
            quota: self.settings.quota,
            host: &self.settings.linux_host,
        };
        if actions.create_sandbox {
            // kubelet prepares DRA claims first and, when that fails, only
            // records the event: the pod waits for the next sync.
            if let Err(e) = check_dynamic_resources(pod) {
                tracing::warn!(pod = %podutil::key(pod), error = %e, "failed to prepare dynamic resources");
                self.events.pod(
                    pod,
                    EventType::Warning,
                    reasons::FAILED_PREPARE_DYNAMIC_RESOURCES,
                    format!("Failed to prepare dynamic resources: {e}"),
                );
                return result;
            }
            self.metrics.started_pods_total.inc();
            match Box::pin(self.create_sandbox(pod, actions.attempt, &inputs, active_pods)).await {
                Ok((id, ips)) => {
                    sandbox_id = id;
                    result.created_sandbox = true;
                    if !podutil::is_host_network(pod) {
                        pod_ips = ips;
                    }
                    result.push(
                        SyncAction::CreatePodSandbox,
                        &podutil::format_pod(pod),
                        None,
                    );
                    // Step 5 of kubelet's SyncPod
                    // (pkg/kubelet/kuberuntime/kuberuntime_manager.go,
                    // `OnPodSandboxReady` after the sandbox status and IPs):
                    // sandbox, network and volumes are ready, so
                    // `PodReadyToStartContainers` turns True now rather than
                    // after the image pulls and container starts below.
                    sandbox_ready(pod);
                }
                Err(e) => {
                    self.metrics.started_pods_errors_total.inc();
                    result.push(
                        SyncAction::CreatePodSandbox,
                        &podutil::format_pod(pod),
                        Some(e),
                    );
                    return result;
                }
            }
        }
        let sandbox_config = match generate_sandbox_config(pod, actions.attempt, &inputs) {
            Ok((c, _)) => c,
            Err(e) => {
                let msg = format!(
                    "GeneratePodSandboxConfig for pod {} failed: {e}",
                    gofmt::quote(&podutil::format_pod(pod))
                );
                result.push(
                    SyncAction::ConfigPodSandbox,
                    &sandbox_id,
                    Some(StepError::new(CONFIG_POD_SANDBOX_ERROR, msg)),
                );
                return result;
            }
        };
        let pod_ip = pod_ips.first().cloned().unwrap_or_default();

        // Step 6 of kubelet's SyncPod: ephemeral containers (`kubectl
        // debug`), before the init containers so that a debugger runs even
        // when an init container cannot start; a failure stops nothing
        // else (pkg/kubelet/kuberuntime/kuberuntime_manager.go, SyncPod).
        for &idx in &actions.ephemeral_containers_to_start {
            let Some(e) = podutil::ephemeral_containers(pod).get(idx) else {
                continue;
            };
            let c = podutil::ephemeral_as_container(e);
            let target = e.target_container_name.as_deref().filter(|t| !t.is_empty());
            Box::pin(self.start_step(
                pod,
                &c,
                StartKind::Ephemeral,
                target,
                status,
                &sandbox_id,
                &sandbox_config,
                pull_secrets,
                &pod_ip,
                &pod_ips,
                &mut result,
            ))
            .await;
        }
        for &idx in &actions.init_containers_to_start {
            let Some(c) = podutil::init_containers(pod).get(idx) else {
                continue;
            };
            let ok = Box::pin(self.start_step(
                pod,
                c,
                StartKind::Init,
                None,
                status,
                &sandbox_id,
                &sandbox_config,
                pull_secrets,
                &pod_ip,
                &pod_ips,
                &mut result,
            ))
            .await;
            if !ok && !is_restartable_init(c) {
                return result;
            }
        }
        // Step 8: in-place resizes of running containers.
        if actions.resize.needed() {
            let r = Box::pin(self.do_pod_resize(pod, &sandbox_id, &actions.resize)).await;
            result.resized = true;
            result.push(
                SyncAction::ResizePodInPlace,
                &podutil::format_pod(pod),
                r.err().map(|e| {
                    StepError::new(super::errors::RESIZE_POD_IN_PLACE_ERROR, e.to_string())
                }),
            );
        }
        for &idx in &actions.containers_to_start {
            let Some(c) = podutil::containers(pod).get(idx) else {
                continue;
            };
            Box::pin(self.start_step(
                pod,
                c,
                StartKind::Regular,
                None,
                status,
                &sandbox_id,
                &sandbox_config,
                pull_secrets,
                &pod_ip,
                &pod_ips,
                &mut result,
            ))
            .await;
        }
        result
    }

    /// One container start with its backoff check; returns success.
    /// `target`: an ephemeral container's `targetContainerName`.
    #[allow(clippy::too_many_arguments)]
    async fn start_step(
        &self,
        pod: &Pod,
        c: &Container,
        kind: StartKind,
        target: Option<&str>,
        status: &RuntimePodStatus,
        sandbox_id: &str,
        sandbox_config: &api::PodSandboxConfig,
        pull_secrets: &[Secret],
        pod_ip: &str,
        pod_ips: &[String],
        result: &mut PodSyncResult,
    ) -> bool {
        if let Some((err, until)) = self.do_backoff(pod, c, status) {
            if let Some(t) = until {
                result.retry_no_later_than(t);
            }
            result.push(SyncAction::StartContainer, &c.name, Some(err));
            return false;
        }
        self.metrics
            .started_containers_total
            .with_label_values(&[kind.metric_label()])
            .inc();
        match Box::pin(self.start_container(
            sandbox_id,
            sandbox_config,
            c,
            target,
            pod,
            status,
            pull_secrets,
            pod_ip,
            pod_ips,
        ))
        .await
        {
            Ok(pulled_for) => {
                result.image_pull_time += pulled_for;
                result.push(SyncAction::StartContainer, &c.name, None);
                true
            }
            Err(e) => {
                self.metrics
                    .started_containers_errors_total
                    .with_label_values(&[kind.metric_label(), e.reason])
                    .inc();
                // Unlike CrashLoopBackOff, a pull failure carries no
                // backoff expiration (kubelet's `NewBackoffError` is only
                // for restarts): the worker retries after its usual
                // backoff period.
                tracing::info!(pod = %podutil::key(pod), container = %c.name, reason = e.reason, message = %e.message, "container start failed");
                result.push(SyncAction::StartContainer, &c.name, Some(e));
                false
            }
        }
    }

    /// Creates the sandbox (pod cgroup, log directory, RunPodSandbox) and
    /// returns its id and IPs.
    async fn create_sandbox(
        &self,
        pod: &Pod,
        attempt: u32,
        inputs: &SandboxInputs<'_>,
        active_pods: &[Arc<Pod>],
    ) -> Result<(String, Vec<String>), StepError> {
        let fail = |msg: String| StepError::new(CREATE_POD_SANDBOX_ERROR, msg);
        // kubelet records every failure of createPodSandbox as
        // FailedCreatePodSandBox with the underlying error.
        let failed_event = |err: &str| {
            self.events.pod(
                pod,
                EventType::Warning,
                reasons::FAILED_CREATE_POD_SANDBOX,
                format!("Failed to create pod sandbox: {err}"),
            );
        };
        let (config, warnings) = match generate_sandbox_config(pod, attempt, inputs) {
            Ok(v) => v,
            Err(e) => {
                tracing::warn!(pod = %podutil::key(pod), error = %e, "failed to generate sandbox config");
                failed_event(&e.to_string());
                return Err(fail(format!(
                    "Failed to generate sandbox config for pod {}: {e}",
                    gofmt::quote(&podutil::format_pod(pod))
                )));
            }
        };
        for w in warnings {
            self.events
                .pod(pod, EventType::Warning, w.reason, w.message);
        }
        if let Err(e) = self.cgroups.ensure(pod, active_pods) {
            self.events.pod(
                pod,
                EventType::Warning,
                reasons::FAILED_CREATE_POD_CONTAINER,
                format!("unable to ensure pod container exists: {e}"),
            );
            return Err(fail(format!("unable to ensure pod container exists: {e}")));
        }
        let log_dir = pod_logs_dir(&self.settings.pod_logs_root, pod);
        if let Err(e) = tokio::fs::create_dir_all(&log_dir).await {
            // `os.MkdirAll`'s error as kubelet prints it (a pod name of
            // 253 characters makes `<ns>_<name>_<uid>` too long a file
            // name: `mkdir <dir>: file name too long`).
            let e = gofmt::path_error_text("mkdir", &log_dir, &e);
            failed_event(&e);
            return Err(fail(format!(
                "Failed to create log directory for pod {}: {e}",
                gofmt::quote(&podutil::format_pod(pod))
            )));
        }
        let runtime_class = podutil::spec(pod).runtime_class_name.as_deref();
        let handler = match self.runtime_classes.lookup_handler(runtime_class) {
            Ok(h) => h,
            Err(e) => {
                failed_event(&e.to_string());
                return Err(fail(format!(
                    "Failed to create sandbox for pod {}: {e}",
                    gofmt::quote(&podutil::format_pod(pod))
                )));
            }
        };
        if !handler.is_empty() {
            tracing::debug!(pod = %podutil::key(pod), runtime_handler = %handler, "running pod with runtime handler");
        }
        let id = match self
            .metrics
            .runtime_op("run_podsandbox", self.cri.run_pod_sandbox(config, &handler))
            .await
        {
            Ok(id) => id,
            Err(e) => {
                let text = grpc_text(&e);
                failed_event(&text);
                return Err(fail(format!(
                    "Failed to create sandbox for pod {}: {text}",
                    gofmt::quote(&podutil::format_pod(pod))
                )));
            }
        };
        match self
            .metrics
            .runtime_op("podsandbox_status", self.cri.pod_sandbox_status(&id, false))
            .await
        {
            Ok(resp) => {
                let ips = resp
                    .status
                    .and_then(|s| s.network)
                    .map(|n| {
                        let mut v = vec![n.ip];
                        v.extend(n.additional_ips.into_iter().map(|i| i.ip));
                        v.into_iter().filter(|i| !i.is_empty()).collect()
                    })
                    .unwrap_or_default();
                Ok((id, ips))
            }
            Err(e) => {
                let text = grpc_text(&e);
                self.events.pod(
                    pod,
                    EventType::Warning,
                    reasons::FAILED_POD_SANDBOX_STATUS,
                    format!("Unable to get pod sandbox status: {text}"),
                );
                Err(fail(text))
            }
        }
    }

    /// A restart of the whole pod: kills (grace 0, kill reason
    /// `RestartAllContainers`, message `killing`, as kubelet) and removes
    /// each container in order, keeping its logs; returns false at the
    /// first failure (the rest waits for the next sync).
    async fn reset_containers(
        &self,
        pod: &Pod,
        reset: &[super::actions::ResetInfo],
        result: &mut PodSyncResult,
    ) -> bool {
        for r in reset {
            tracing::debug!(pod = %podutil::key(pod), container = %r.name, container_id = %r.container_id, "removing container before the pod restarts");
            if r.kill
                && let Err(e) = self
                    .kill_container(
                        pod,
                        &r.container_id,
                        &r.name,
                        "killing",
                        super::actions::KillReason::RestartAllContainers,
                        Some(0),
                        None,
                    )
                    .await
            {
                tracing::warn!(pod = %podutil::key(pod), container = %r.name, error = %e, "killing a container for the pod's restart failed");
                result.push(
                    SyncAction::RemoveContainer,
                    &r.name,
                    Some(StepError::new(super::errors::KILL_CONTAINER_ERROR, e)),
                );
                return false;
            }
            // The logs stay until the pod goes (kubelet's `keepLogs`).
            let removed = self
                .metrics
                .runtime_op(
                    "remove_container",
                    self.cri.remove_container(&r.container_id),
                )
                .await
                .map_err(|e| grpc_text(&e));
            if let Err(e) = removed {
                tracing::warn!(pod = %podutil::key(pod), container = %r.name, error = %e, "removing a container for the pod's restart failed");
                result.push(
                    SyncAction::RemoveContainer,
                    &r.name,
                    Some(StepError::new(super::errors::REMOVE_CONTAINER_ERROR, e)),
                );
                return false;
            }
            result.push(SyncAction::RemoveContainer, &r.name, None);
        }
        true
    }

    /// Removes every init container of the pod (before a new sandbox).
    async fn purge_init_containers(&self, pod: &Pod, status: &RuntimePodStatus) {
        for c in podutil::init_containers(pod) {
            for s in status.containers_named(&c.name) {
                if let Err(e) = self.remove_container(&s.id).await {
                    tracing::warn!(pod = %podutil::key(pod), container = %c.name, error = %e, "removing init container failed");
                }
            }
        }
    }

    /// Keeps only the newest exited instance of each init container.
    async fn prune_init_containers(&self, pod: &Pod, status: &RuntimePodStatus) {
        for c in podutil::init_containers(pod) {
            let mut seen = 0;
            for s in status.containers_named(&c.name) {
                if !matches!(s.state, ContainerState::Exited | ContainerState::Unknown) {
                    continue;
                }
                seen += 1;
                if seen == 1 {
                    continue;
                }
                if let Err(e) = self.remove_container(&s.id).await {
                    tracing::warn!(pod = %podutil::key(pod), container = %c.name, error = %e, "pruning init container failed");
                }
            }
        }
    }

    /// Removes a container and its legacy log symlink.
    pub async fn remove_container(&self, id: &str) -> Result<(), GrpcError> {
        if let Some(dir) = &self.settings.legacy_log_dir
            && let Ok(resp) = self.cri.container_status(id, false).await
            && let Some(s) = resp.status
        {
            let info = crate::pod::labels::container_info_from_labels(&s.labels);
            if let Some(name) = legacy_log_name(
                &info.pod_name,
                &info.pod_namespace,
                &info.container_name,
                id,
            ) {
                let _ = tokio::fs::remove_file(dir.join(name)).await;
            }
        }
        self.metrics
            .runtime_op("remove_container", self.cri.remove_container(id))
            .await
            .map_err(GrpcError)
    }
}

/// `<pod>_<ns>_<container>-<id>.log`, the legacy symlink's name, cut to
/// 255 bytes (ext4's longest file name) before `.log` as kubelet's
/// `logSymlink` cuts it (`kuberuntime_container.go`). `None` when the
/// strings would make it other than one name in the directory (a `/` or a
/// NUL): they come from the runtime (a container's CRI labels and id) when
/// a container is removed, and kubelet's `filepath.Join` would follow a
/// `../` out of /var/log/containers.
pub fn legacy_log_name(pod: &str, ns: &str, container: &str, id: &str) -> Option<String> {
    const SUFFIX: &str = ".log";
    const MAX_NAME: usize = 255;
    let mut name = format!("{pod}_{ns}_{container}-{id}");
    if name.len() > MAX_NAME - SUFFIX.len() {
        let mut cut = MAX_NAME - SUFFIX.len();
        while !name.is_char_boundary(cut) {
            cut -= 1;
        }
        name.truncate(cut);
    }
    if name.contains(['/', '\0']) {
        return None;
    }
    name.push_str(SUFFIX);
    Some(name)
}

#[cfg(test)]
mod tests {
    use super::legacy_log_name;

    #[test]
    fn legacy_log_name_as_kubelet_names_it() {
        assert_eq!(
            legacy_log_name("web-0", "default", "nginx", "0123abcd").as_deref(),
            Some("web-0_default_nginx-0123abcd.log")
        );
    }

    #[test]
    fn legacy_log_name_is_cut_to_ext4s_longest_name() {
        // A 253-character pod name (the API's limit) and a 64-digit id:
        // kubelet's logSymlink keeps the first 251 bytes, then `.log`.
        let pod = "p".repeat(253);
        let id = "f".repeat(64);
        let name = legacy_log_name(&pod, "default", "c", &id).unwrap_or_default();
        assert_eq!(name.len(), 255);
        assert_eq!(name, format!("{}.log", "p".repeat(251)));
        // Cut on a character boundary (Go cuts bytes; names are ASCII there).
        let pod = format!("{}é", "p".repeat(250));
        let name = legacy_log_name(&pod, "ns", "c", &id).unwrap_or_default();
        assert_eq!(name, format!("{}.log", "p".repeat(250)));
    }

    #[test]
    fn runtime_strings_never_leave_the_directory() {
        // The names come from a removed container's CRI labels and id.
        let id = "f".repeat(64);
        assert_eq!(legacy_log_name("../../etc/cron.d/x", "ns", "c", &id), None);
        assert_eq!(legacy_log_name("p", "ns", "c", "../../x"), None);
        assert_eq!(legacy_log_name("p", "ns\0", "c", &id), None);
        // A `/` past the cut is cut off, not refused.
        let pod = "p".repeat(300);
        assert!(legacy_log_name(&pod, "ns", "c", "/x").is_some());
    }
}
