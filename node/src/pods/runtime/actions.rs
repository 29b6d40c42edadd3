//! What a sync must do to bring the runtime to the pod spec (kubelet's
//! `computePodActions` and `computeInitContainerActions`): a pure function
//! of the Pod, the runtime's view of it and the probe results.

use k8s_openapi::api::core::v1::{Container, Pod};
use keelson_probes::ProbeState;

use super::resize::{Actuated, ContainerResize, ResizeActions, compute_container_resize};
use super::status::{ContainerState, ContainerStatus, RuntimePodStatus};
use crate::pod::hash::hash_container;
use crate::pod::podutil::{self, is_restartable_init};

/// Why a container is killed (decides the grace period source).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KillReason {
    /// Startup probe failed.
    StartupProbe,
    /// Liveness probe failed.
    LivenessProbe,
    /// postStart hook failed.
    FailedPostStartHook,
    /// The pod restarts in place (`reasonRestartAllContainers`).
    RestartAllContainers,
    /// Anything else.
    Unknown,
}

/// One container to kill.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KillInfo {
    /// Runtime container id.
    pub container_id: String,
    /// Container name.
    pub name: String,
    /// The `Killing` event message.
    pub message: String,
    /// Why.
    pub reason: KillReason,
}

/// One container to remove for a restart of the whole pod
/// (`containerToRemoveInfo`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResetInfo {
    /// Runtime container id.
    pub container_id: String,
    /// Container name.
    pub name: String,
    /// Kill it (without grace) before removing it: it has not exited.
    pub kill: bool,
}

/// The actions of one sync.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PodActions {
    /// Stop every container and the sandbox.
    pub kill_pod: bool,
    /// Create a (new) sandbox.
    pub create_sandbox: bool,
    /// The existing sandbox to start containers in (or to replace).
    pub sandbox_id: String,
    /// The sandbox attempt number.
    pub attempt: u32,
    /// Indexes into `spec.initContainers` to start, in order.
    pub init_containers_to_start: Vec<usize>,
    /// Indexes into `spec.containers` to start, in order.
    pub containers_to_start: Vec<usize>,
    /// Indexes into `spec.ephemeralContainers` to start
    /// (`EphemeralContainersToStart`): those the runtime has never seen.
    pub ephemeral_containers_to_start: Vec<usize>,
    /// Containers to kill first.
    pub containers_to_kill: Vec<KillInfo>,
    /// In-place resizes (`ContainersToUpdate`, `UpdatePodResources`,
    /// `UpdatePodLevelResources`).
    pub resize: ResizeActions,
    /// Every container instance to kill and remove, in this order, for a
    /// restart of the whole pod (`ContainersToReset`).
    pub containers_to_reset: Vec<ResetInfo>,
}

impl PodActions {
    fn kill(&mut self, info: KillInfo) {
        if !self
            .containers_to_kill
            .iter()
            .any(|k| k.container_id == info.container_id)
        {
            self.containers_to_kill.push(info);
        }
    }
}

/// Probe results the decision needs (results keyed by container id;
/// `None` = no result yet).
pub trait ProbeResults: Send + Sync {
    /// Liveness result of a container.
    fn liveness(&self, container_id: &str) -> Option<ProbeState>;
    /// Startup result of a container.
    fn startup(&self, container_id: &str) -> Option<ProbeState>;
}

/// No probes at all.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoProbes;

impl ProbeResults for NoProbes {
    fn liveness(&self, _: &str) -> Option<ProbeState> {
        None
    }
    fn startup(&self, _: &str) -> Option<ProbeState> {
        None
    }
}

/// `PodSandboxChanged`: whether a new sandbox is needed, its attempt
/// number and the id of the current one.
pub fn sandbox_changed(pod: &Pod, status: &RuntimePodStatus) -> (bool, u32, String) {
    let Some(newest) = status.sandboxes.first() else {
        return (true, 0, String::new());
    };
    let ready = status.sandboxes.iter().filter(|s| s.ready).count();
    if ready > 1 || !newest.ready {
        return (true, newest.attempt + 1, newest.id.clone());
    }
    let want_mode = if podutil::is_host_network(pod) { 2 } else { 0 };
    if newest.network_mode != want_mode {
        return (true, newest.attempt + 1, String::new());
    }
    if !podutil::is_host_network(pod) && newest.has_network && newest.ip.is_empty() {
        return (true, newest.attempt + 1, newest.id.clone());
    }
    (false, newest.attempt, newest.id.clone())
}

/// kubelet's `ShouldContainerBeRestarted`.
pub fn should_container_be_restarted(c: &Container, pod: &Pod, status: &RuntimePodStatus) -> bool {
    if pod.metadata.deletion_timestamp.is_some() {
        return false;
    }
    let Some(s) = status.find_container(&c.name) else {
        return true;
    };
    match s.state {
        ContainerState::Running => false,
        ContainerState::Unknown | ContainerState::Created => true,
        // ContainerRestartRules (on in v1.36): the container's rules and
        // policy before the pod's.
        ContainerState::Exited => podutil::container_should_restart(c, pod, s.exit_code),
    }
}

/// `isInitContainerFailed`.
pub fn is_init_container_failed(s: &ContainerStatus) -> bool {
    s.reason == "OOMKilled"
        || (s.state == ContainerState::Exited && s.exit_code != 0)
        || s.state == ContainerState::Unknown
}

fn container_changed(c: &Container, s: &ContainerStatus) -> bool {
    s.hash != hash_container(c)
}

fn restart_on_failure(pod: &Pod) -> bool {
    podutil::restart_policy(pod) != "Never"
}

fn container_succeeded(c: &Container, status: &RuntimePodStatus) -> bool {
    status
        .find_container(&c.name)
        .is_some_and(|s| s.state == ContainerState::Exited && s.exit_code == 0)
}

fn has_any_regular_container_created(pod: &Pod, status: &RuntimePodStatus) -> bool {
    podutil::containers(pod).iter().any(|c| {
        status.find_container(&c.name).is_some_and(|s| {
            matches!(
                s.state,
                ContainerState::Created | ContainerState::Running | ContainerState::Exited
            )
        })
    })
}

/// kubelet's `computePodActions` without in-place resize.
pub fn compute_pod_actions(
    pod: &Pod,
    status: &RuntimePodStatus,
    probes: &dyn ProbeResults,
) -> PodActions {
    compute_pod_actions_with(pod, status, probes, None, false)
}

/// `getContainersToReset` for one list of containers: every instance the
/// runtime has of them, split into the sources (exited with a code their
/// rules answer with `RestartAllContainers`) and the targets (the rest;
/// those not exited are killed first).
fn containers_to_reset(
    containers: &[Container],
    status: &RuntimePodStatus,
) -> (Vec<ResetInfo>, Vec<ResetInfo>) {
    let (mut sources, mut targets) = (Vec::new(), Vec::new());
    for c in containers {
        for s in status.containers_named(&c.name) {
            let exited = s.state == ContainerState::Exited;
            let info = ResetInfo {
                container_id: s.id.clone(),
                name: c.name.clone(),
                kill: !exited,
            };
            if exited && crate::pod::podutil::triggers_restart_all(c, s.exit_code) {
                sources.push(info);
            } else {
                targets.push(info);
            }
        }
    }
    (sources, targets)
}

/// The kill for a container its resize policy restarts.
fn resize_restart(s: &ContainerStatus, c: &Container) -> KillInfo {
    KillInfo {
        container_id: s.id.clone(),
        name: s.name.clone(),
        message: format!("Container {} resize requires restart", c.name),
        reason: KillReason::Unknown,
    }
}

/// kubelet's `computePodActions`; `actuated` (what the runtime manager
/// applied) enables in-place resize; `restart_all` (the pod's
/// `AllContainersRestarting` condition is True) asks for every container
/// to be killed and removed, regular containers before init containers and
/// the containers that triggered the restart last — nothing else happens
/// in that sync (`kuberuntime_manager.go`).
pub fn compute_pod_actions_with(
    pod: &Pod,
    status: &RuntimePodStatus,
    probes: &dyn ProbeResults,
    actuated: Option<&dyn Actuated>,
    restart_all: bool,
) -> PodActions {
    let (create, attempt, sandbox_id) = sandbox_changed(pod, status);
    let mut changes = PodActions {
        kill_pod: create,
        create_sandbox: create,
        sandbox_id,
        attempt,
        ..Default::default()
    };
    let spec_containers = podutil::containers(pod);

    if restart_all {
        let (init_sources, init_targets) =
            containers_to_reset(podutil::init_containers(pod), status);
        let (sources, targets) = containers_to_reset(spec_containers, status);
        changes.containers_to_reset = targets
            .into_iter()
            .chain(init_targets)
            .chain(sources)
            .chain(init_sources)
            .collect();
        return changes;
    }

    if create {
        if !restart_on_failure(pod) && attempt != 0 && !status.containers.is_empty() {
            // Never restart: do not build a sandbox for containers that ran.
            changes.create_sandbox = false;
            return changes;
        }
        // Containers that succeeded and run once (`OnFailure`, the
        // container's own policy before the pod's) stay done.
        let to_start: Vec<usize> = spec_containers
            .iter()
            .enumerate()
            .filter(|(_, c)| {
                let run_once = match c.restart_policy.as_deref() {
                    Some(p) => p == "OnFailure",
                    None => podutil::restart_policy(pod) == "OnFailure",
                };
                !(run_once && container_succeeded(c, status))
            })
            .map(|(i, _)| i)
            .collect();
        if to_start.is_empty() && has_any_regular_container_created(pod, status) {
            changes.create_sandbox = false;
            return changes;
        }
        if !podutil::init_containers(pod).is_empty() {
            changes.init_containers_to_start = vec![0];
            return changes;
        }
        changes.containers_to_start = to_start;
        return changes;
    }

    // Ephemeral containers may start before initialization is complete,
    // and only in a sandbox that is already there; they are never
    // restarted: one the runtime knows (running or exited) is left alone
    // (pkg/kubelet/kuberuntime/kuberuntime_manager.go, computePodActions).
    changes.ephemeral_containers_to_start = podutil::ephemeral_containers(pod)
        .iter()
        .enumerate()
        .filter(|(_, e)| status.find_container(&e.name).is_none())
        .map(|(i, _)| i)
        .collect();

    changes.resize.enabled = actuated.is_some();
    let initialized = compute_init_container_actions(pod, status, probes, actuated, &mut changes);
    if changes.kill_pod || !initialized {
        return changes;
    }

    let mut keep = 0usize;
    for (idx, c) in spec_containers.iter().enumerate() {
        let cs = status.find_container(&c.name);
        let running = cs.is_some_and(|s| s.state == ContainerState::Running);
        if !running {
            if should_container_be_restarted(c, pod, status) {
                changes.containers_to_start.push(idx);
                if let Some(s) = cs
                    && s.state == ContainerState::Unknown
                {
                    changes.kill(KillInfo {
                        container_id: s.id.clone(),
                        name: s.name.clone(),
                        message: format!(
                            "Container is in {:?} state, try killing it before restart",
                            s.state.as_str()
                        ),
                        reason: KillReason::Unknown,
                    });
                }
            }
            continue;
        }
        let Some(s) = cs else { continue };
        // A running container killed for a probe: its own policy (not its
        // rules: it has no exit code yet) before the pod's.
        let mut restart = match c.restart_policy.as_deref() {
            Some(p) => p != "Never",
            None => restart_on_failure(pod),
        };
        let (message, reason) = if container_changed(c, s) {
            restart = true;
            (
                format!("Container {} definition changed", c.name),
                KillReason::Unknown,
            )
        } else if probes.liveness(&s.id) == Some(ProbeState::Failure) {
            (
                format!("Container {} failed liveness probe", c.name),
                KillReason::LivenessProbe,
            )
        } else if probes.startup(&s.id) == Some(ProbeState::Failure) {
            (
                format!("Container {} failed startup probe", c.name),
                KillReason::StartupProbe,
            )
        } else if let Some(a) = actuated
            && compute_container_resize(pod, c, &s.id, a, &mut changes.resize)
                == ContainerResize::Restart
        {
            changes.kill(resize_restart(s, c));
            changes.containers_to_start.push(idx);
            continue;
        } else {
            keep += 1;
            continue;
        };
        let message = if restart {
            changes.containers_to_start.push(idx);
            format!("{message}, will be restarted")
        } else {
            message
        };
        changes.kill(KillInfo {
            container_id: s.id.clone(),
            name: s.name.clone(),
            message,
            reason,
        });
    }
    if keep == 0 && changes.containers_to_start.is_empty() {
        changes.kill_pod = true;
        // Sidecars must not keep a finished pod alive.
        changes.init_containers_to_start.clear();
    }
    if let Some(a) = actuated {
        changes.resize.update_pod_level = super::resize::compute_pod_level_resize(pod, a);
    }
    changes
}

/// kubelet's `computeInitContainerActions` (sidecar-aware); returns whether
/// the pod is initialized.
fn compute_init_container_actions(
    pod: &Pod,
    status: &RuntimePodStatus,
    probes: &dyn ProbeResults,
    actuated: Option<&dyn Actuated>,
    changes: &mut PodActions,
) -> bool {
    let inits = podutil::init_containers(pod);
    if inits.is_empty() {
        return true;
    }
    let mut initialized = podutil::containers(pod).iter().any(|c| {
        status
            .find_container(&c.name)
            .is_some_and(|s| matches!(s.state, ContainerState::Created | ContainerState::Running))
    });
    let mut previously_initialized = initialized;
    let restart_on_failure = restart_on_failure(pod);

    for i in (0..inits.len()).rev() {
        let c = &inits[i];
        let restartable = is_restartable_init(c);
        let Some(s) = status.find_container(&c.name) else {
            if previously_initialized && restartable {
                changes.init_containers_to_start.push(i);
            }
            continue;
        };
        if previously_initialized && !restartable {
            continue;
        }
        match s.state {
            ContainerState::Created => changes.init_containers_to_start.push(i),
            ContainerState::Running => {
                if restartable {
                    'sidecar: {
                        if c.startup_probe.is_some() {
                            match probes.startup(&s.id) {
                                None => break 'sidecar,
                                Some(ProbeState::Success) => {}
                                Some(ProbeState::Failure) => {
                                    changes.kill(KillInfo {
                                        container_id: s.id.clone(),
                                        name: c.name.clone(),
                                        message: format!(
                                            "Init container {} failed startup probe",
                                            c.name
                                        ),
                                        reason: KillReason::StartupProbe,
                                    });
                                    changes.init_containers_to_start.push(i);
                                    break 'sidecar;
                                }
                                Some(ProbeState::Unknown) => break 'sidecar,
                            }
                        }
                        if i == inits.len() - 1 {
                            initialized = true;
                        } else if !previously_initialized {
                            changes.init_containers_to_start.push(i + 1);
                        }
                        if container_changed(c, s) {
                            changes.kill(KillInfo {
                                container_id: s.id.clone(),
                                name: c.name.clone(),
                                message: format!("Init container {} definition changed", c.name),
                                reason: KillReason::Unknown,
                            });
                            changes.init_containers_to_start.push(i);
                            break 'sidecar;
                        }
                        if c.liveness_probe.is_some() {
                            match probes.liveness(&s.id) {
                                None => break 'sidecar,
                                Some(ProbeState::Failure) => {
                                    changes.kill(KillInfo {
                                        container_id: s.id.clone(),
                                        name: c.name.clone(),
                                        message: format!(
                                            "Init container {} failed liveness probe",
                                            c.name
                                        ),
                                        reason: KillReason::LivenessProbe,
                                    });
                                    changes.init_containers_to_start.push(i);
                                    break 'sidecar;
                                }
                                _ => {}
                            }
                        }
                        if let Some(a) = actuated
                            && compute_container_resize(pod, c, &s.id, a, &mut changes.resize)
                                == ContainerResize::Restart
                        {
                            changes.kill(resize_restart(s, c));
                            changes.init_containers_to_start.push(i);
                        }
                    }
                } else if let Some(a) = actuated {
                    // A regular init container waits to finish; its
                    // resources may change in place meanwhile.
                    let _ = compute_container_resize(pod, c, &s.id, a, &mut changes.resize);
                }
            }
            ContainerState::Exited => {
                if restartable {
                    changes.init_containers_to_start.push(i);
                } else if is_init_container_failed(s) {
                    // The init container's rules and policy first.
                    if !should_container_be_restarted(c, pod, status) {
                        changes.kill_pod = true;
                        changes.init_containers_to_start.clear();
                        return false;
                    }
                    changes.init_containers_to_start.push(i);
                } else if i == inits.len() - 1 {
                    initialized = true;
                } else {
                    changes.init_containers_to_start.push(i + 1);
                }
            }
            ContainerState::Unknown => {
                let message = format!(
                    "Init container is in {:?} state, try killing it before restart",
                    s.state.as_str()
                );
                if restartable {
                    changes.kill(KillInfo {
                        container_id: s.id.clone(),
                        name: c.name.clone(),
                        message,
                        reason: KillReason::Unknown,
                    });
                    changes.init_containers_to_start.push(i);
                } else {
                    // No exit code yet: the container's policy, not its
                    // rules.
                    let restart = match c.restart_policy.as_deref() {
                        Some(p) => p != "Never",
                        None => restart_on_failure,
                    };
                    if !restart {
                        changes.kill_pod = true;
                        changes.init_containers_to_start.clear();
                        return false;
                    }
                    changes.kill(KillInfo {
                        container_id: s.id.clone(),
                        name: c.name.clone(),
                        message,
                        reason: KillReason::Unknown,
                    });
                    changes.init_containers_to_start.push(i);
                }
            }
        }
        previously_initialized = true;
    }
    if !previously_initialized {
        changes.init_containers_to_start.push(0);
    }
    changes.init_containers_to_start.reverse();
    initialized
}

#[cfg(test)]
mod tests;
