//! The API status of a pod from the runtime's view (kubelet's
//! `generateAPIPodStatus`, `convertToAPIContainerStatuses`, `getPhase`
//! and the condition generators of `status/generate.go`).

use std::collections::HashMap;
use std::time::SystemTime;

use k8s_openapi::api::core::v1::{
    Container, ContainerState as ApiState, ContainerStateRunning, ContainerStateTerminated,
    ContainerStateWaiting, ContainerStatus as ApiContainerStatus, HostIP, Pod, PodCondition, PodIP,
    PodStatus, VolumeMountStatus,
};

use crate::pod::podutil::{self, is_restartable_init};
use crate::pod::qos::pod_qos;
use crate::pods::clock::{from_nanos, to_api_time};
use crate::pods::restart_all;
use crate::pods::runtime::actions::{sandbox_changed, should_container_be_restarted};
use crate::pods::runtime::status::{ContainerState, ContainerStatus, RuntimePodStatus};

/// `waiting.reason` of a container not created yet.
pub const CONTAINER_CREATING: &str = "ContainerCreating";
/// `waiting.reason` of app containers while init containers run.
pub const POD_INITIALIZING: &str = "PodInitializing";
/// Reason of a container that vanished from the runtime.
pub const CONTAINER_STATUS_UNKNOWN: &str = "ContainerStatusUnknown";

/// Condition types kubelet owns.
pub const KUBELET_CONDITIONS: &[&str] = &[
    "PodScheduled",
    "Ready",
    "Initialized",
    "ContainersReady",
    "PodResizeInProgress",
    "PodResizePending",
    "PodReadyToStartContainers",
    restart_all::CONDITION,
];

/// Probe-derived container flags (kubelet's probe manager `UpdatePodStatus`).
pub trait ContainerReadiness: Send + Sync {
    /// `started` of a running container.
    fn started(&self, pod_uid: &str, container: &str, container_id: &str) -> bool;
    /// `ready` of a running, started container.
    fn ready(&self, pod_uid: &str, container: &str, container_id: &str) -> bool;
}

/// No probes: a running container is started and ready.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoReadinessProbes;

impl ContainerReadiness for NoReadinessProbes {
    fn started(&self, _: &str, _: &str, _: &str) -> bool {
        true
    }
    fn ready(&self, _: &str, _: &str, _: &str) -> bool {
        true
    }
}

/// Why the last start of a container failed (kubelet's reason cache).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StartFailure {
    /// `ErrImagePull`, `CrashLoopBackOff`, ...
    pub reason: String,
    /// The message.
    pub message: String,
}

/// Everything the status depends on besides the pod and the runtime.
pub struct StatusInputs<'a> {
    /// Last status kubelet produced (status manager cache), else the API's.
    pub old: &'a PodStatus,
    /// Start failures by container name.
    pub failures: &'a HashMap<String, StartFailure>,
    /// Probe results.
    pub readiness: &'a dyn ContainerReadiness,
    /// The node's IPs.
    pub host_ips: &'a [String],
    /// The runtime name (container id scheme).
    pub runtime_name: &'a str,
    /// Whether the pod is terminal (containers will not restart).
    pub pod_is_terminal: bool,
    /// A pod sync handler asks for the pod to fail (reason, message):
    /// kubelet's `ShouldEvict` (active deadline).
    pub evicted: Option<(&'a str, &'a str)>,
    /// `PodResizePending` / `PodResizeInProgress` as the allocation
    /// manager keeps them.
    pub resize_conditions: &'a [PodCondition],
    /// The pod cgroup's settings (`None`: not readable).
    pub pod_cgroup: Option<&'a crate::cgroups::ResourceConfig>,
}

fn waiting(reason: &str, message: &str) -> ApiState {
    ApiState {
        waiting: Some(ContainerStateWaiting {
            reason: (!reason.is_empty()).then(|| reason.to_string()),
            message: (!message.is_empty()).then(|| message.to_string()),
        }),
        running: None,
        terminated: None,
    }
}

fn time(nanos: i64) -> Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time> {
    Some(to_api_time(from_nanos(nanos)))
}

/// A container state that only says "terminated" (the form kubelet
/// propagates into `lastState`).
fn terminated_only(t: ContainerStateTerminated) -> ApiState {
    ApiState {
        terminated: Some(t),
        ..Default::default()
    }
}

fn convert(
    cs: &ContainerStatus,
    old: Option<&ApiContainerStatus>,
    runtime: &str,
    allocated: Option<&Container>,
    pod_restarting: bool,
) -> ApiContainerStatus {
    let cid = cs.api_id(runtime);
    let resources =
        allocated.map(|c| super::resources::container_status_resources(c, cs, &cid, old));
    let allocated_resources =
        allocated.and_then(|c| c.resources.as_ref().and_then(|r| r.requests.clone()));
    // `toKubeContainerUser` + `convertContainerStatusUser`: a reported
    // user without its Linux part is an empty `user`.
    let user = cs
        .user
        .as_ref()
        .map(|u| k8s_openapi::api::core::v1::ContainerUser {
            linux: u
                .linux
                .as_ref()
                .map(|l| k8s_openapi::api::core::v1::LinuxContainerUser {
                    uid: l.uid,
                    gid: l.gid,
                    supplemental_groups: (!l.supplemental_groups.is_empty())
                        .then(|| l.supplemental_groups.clone()),
                }),
        });
    let mut s = ApiContainerStatus {
        resources,
        allocated_resources,
        user,
        name: cs.name.clone(),
        restart_count: cs.restart_count,
        image: cs.image.clone(),
        image_id: cs.image_ref.clone(),
        container_id: Some(cid.clone()),
        volume_mounts: old.and_then(|o| o.volume_mounts.clone()),
        last_state: Some(ApiState::default()),
        ..Default::default()
    };
    let old_terminated = old.and_then(|o| o.state.as_ref().and_then(|st| st.terminated.clone()));
    if let Some(o) = old {
        // RestartAllContainersOnContainerExits (on in v1.36): the runtime
        // forgets removed containers, so the restart count never goes
        // down and the last termination comes from the previous status
        // when the container id changed.
        s.restart_count = s.restart_count.max(o.restart_count);
        let last = match &old_terminated {
            Some(t) if o.container_id.as_deref() != Some(cid.as_str()) => Some(t.clone()),
            _ => o.last_state.as_ref().and_then(|l| l.terminated.clone()),
        };
        if let Some(t) = last {
            s.last_state = Some(terminated_only(t));
        }
    }
    s.state = Some(match cs.state {
        ContainerState::Running => {
            if let Some(o) = old
                && old_terminated.is_some()
                && o.restart_count >= cs.restart_count
            {
                s.restart_count = o.restart_count + 1;
            }
            ApiState {
                running: Some(ContainerStateRunning {
                    started_at: time(cs.started_at),
                }),
                ..Default::default()
            }
        }
        ContainerState::Created => waiting("", ""),
        ContainerState::Exited => ApiState {
            terminated: Some(ContainerStateTerminated {
                exit_code: cs.exit_code,
                reason: (!cs.reason.is_empty()).then(|| cs.reason.clone()),
                message: (!cs.message.is_empty()).then(|| cs.message.clone()),
                started_at: time(cs.started_at),
                finished_at: time(cs.finished_at),
                container_id: Some(cid),
                signal: None,
            }),
            ..Default::default()
        },
        ContainerState::Unknown
            if old.is_some_and(|o| o.state.as_ref().is_some_and(|st| st.running.is_some())) =>
        {
            s.restart_count = old.map(|o| o.restart_count + 1).unwrap_or(0);
            let reason = if pod_restarting {
                restart_all::RESTARTING_REASON
            } else {
                CONTAINER_STATUS_UNKNOWN
            };
            ApiState {
                terminated: Some(ContainerStateTerminated {
                    exit_code: 137,
                    reason: Some(reason.into()),
                    message: Some(
                        "The container could not be located when the pod was terminated".into(),
                    ),
                    ..Default::default()
                }),
                ..Default::default()
            }
        }
        ContainerState::Unknown => waiting("", ""),
    });
    s
}

/// The `volumeMounts` of a container's status, from its spec (the CRI
/// does not know volume names), as kubelet's `convertToAPIContainerStatuses`
/// with RecursiveReadOnlyMounts (GA): a read-only mount's
/// `recursiveReadOnly` is `Disabled`, or `Enabled` where the runtime makes
/// recursive read-only mounts. No runtime handler keelson knows reports
/// that support, so it is `Disabled` (and a mount requiring `Enabled` is
/// refused when the container is created).
fn volume_mount_statuses(c: &Container) -> Option<Vec<VolumeMountStatus>> {
    let mounts = c.volume_mounts.as_ref()?;
    Some(
        mounts
            .iter()
            .map(|m| {
                let read_only = m.read_only == Some(true);
                VolumeMountStatus {
                    name: m.name.clone(),
                    mount_path: m.mount_path.clone(),
                    read_only: read_only.then_some(true),
                    recursive_read_only: read_only.then(|| "Disabled".to_string()),
                    volume_status: None,
                }
            })
            .collect(),
    )
}

/// kubelet's `convertToAPIContainerStatuses` for one list of containers;
/// `pod_restarting`: the whole pod restarts in place
/// (`ShouldAllContainersRestart`).
#[allow(clippy::too_many_arguments)]
pub fn convert_container_statuses(
    pod: &Pod,
    rt: &RuntimePodStatus,
    previous: Option<&Vec<ApiContainerStatus>>,
    containers: &[Container],
    has_init_containers: bool,
    is_init: bool,
    failures: &HashMap<String, StartFailure>,
    runtime: &str,
    pod_restarting: bool,
) -> Vec<ApiContainerStatus> {
    let old: HashMap<&str, &ApiContainerStatus> = previous
        .into_iter()
        .flatten()
        .map(|s| (s.name.as_str(), s))
        .collect();
    let default_reason = if has_init_containers {
        POD_INITIALIZING
    } else {
        CONTAINER_CREATING
    };
    let mut statuses: HashMap<String, ApiContainerStatus> = HashMap::new();
    for c in containers {
        let mut s = ApiContainerStatus {
            name: c.name.clone(),
            image: c.image.clone().unwrap_or_default(),
            state: Some(waiting(default_reason, "")),
            last_state: Some(ApiState::default()),
            volume_mounts: volume_mount_statuses(c),
            ..Default::default()
        };
        if let Some(o) = old.get(c.name.as_str()) {
            if o.state.as_ref().is_some_and(|st| st.terminated.is_some()) {
                s = (*o).clone();
            } else {
                s.restart_count = o.restart_count;
                s.last_state = o.last_state.clone().or(Some(ApiState::default()));
            }
        }
        statuses.insert(c.name.clone(), s);
    }
    // A container that was running and vanished from the runtime.
    for c in containers {
        if rt.find_container(&c.name).is_some() {
            continue;
        }
        let Some(o) = old.get(c.name.as_str()) else {
            continue;
        };
        let st = o.state.clone().unwrap_or_default();
        // Removed by a restart of the whole pod: waiting, and the last
        // termination says why.
        if pod_restarting && st.waiting.is_none() {
            let Some(s) = statuses.get_mut(&c.name) else {
                continue;
            };
            s.state = Some(waiting(
                restart_all::RESTARTING_REASON,
                restart_all::REMOVED_MESSAGE,
            ));
            s.last_state = Some(terminated_only(ContainerStateTerminated {
                exit_code: 137,
                reason: Some(restart_all::RESTARTING_REASON.into()),
                message: Some(restart_all::REMOVED_MESSAGE.into()),
                ..Default::default()
            }));
            s.restart_count = o.restart_count + 1;
            continue;
        }
        if st.terminated.is_some() || st.running.is_none() {
            continue;
        }
        let Some(s) = statuses.get_mut(&c.name) else {
            continue;
        };
        let is_default = s
            .state
            .as_ref()
            .and_then(|x| x.waiting.as_ref())
            .is_some_and(|w| w.reason.as_deref() == Some(default_reason));
        if !is_default
            || s.last_state
                .as_ref()
                .is_some_and(|l| l.terminated.is_some())
        {
            continue;
        }
        s.last_state = Some(ApiState {
            terminated: Some(ContainerStateTerminated {
                exit_code: 137,
                reason: Some(CONTAINER_STATUS_UNKNOWN.into()),
                message: Some(
                    "The container could not be located when the pod was deleted.  The container used to be Running"
                        .into(),
                ),
                ..Default::default()
            }),
            ..Default::default()
        });
        if pod.metadata.deletion_timestamp.is_none() {
            s.restart_count += 1;
        }
    }
    // The runtime's instances, newest first: current state and last state.
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for cs in &rt.containers {
        if !statuses.contains_key(&cs.name) {
            continue;
        }
        let n = seen.entry(cs.name.as_str()).or_insert(0);
        if *n >= 2 {
            continue;
        }
        let spec = containers.iter().find(|c| c.name == cs.name);
        let converted = convert(
            cs,
            old.get(cs.name.as_str()).copied(),
            runtime,
            spec,
            pod_restarting,
        );
        if *n == 0 {
            statuses.insert(cs.name.clone(), converted);
        } else if let Some(s) = statuses.get_mut(&cs.name) {
            s.last_state = converted.state;
        }
        *n += 1;
    }
    // Containers that will be restarted show why they are waiting.
    for c in containers {
        if is_init
            && rt
                .find_container(&c.name)
                .is_some_and(|s| s.state == ContainerState::Exited && s.exit_code == 0)
        {
            continue;
        }
        if !should_container_be_restarted(c, pod, rt) {
            continue;
        }
        let Some(f) = failures.get(&c.name) else {
            continue;
        };
        let Some(s) = statuses.get_mut(&c.name) else {
            continue;
        };
        if s.state.as_ref().is_some_and(|st| st.terminated.is_some()) {
            s.last_state = s.state.clone();
        }
        s.state = Some(waiting(&f.reason, &f.message));
    }
    // Deterministic order: init containers as in the spec, others by name.
    let mut out: Vec<ApiContainerStatus> = if is_init {
        containers
            .iter()
            .filter_map(|c| statuses.remove(&c.name))
            .collect()
    } else {
        let mut v: Vec<_> = statuses.into_values().collect();
        v.sort_by(|a, b| a.name.cmp(&b.name));
        v
    };
    for s in &mut out {
        if s.last_state.is_none() {
            s.last_state = Some(ApiState::default());
        }
    }
    out
}

fn state_of(s: &ApiContainerStatus) -> ApiState {
    s.state.clone().unwrap_or_default()
}

fn last_terminated(s: &ApiContainerStatus) -> Option<&ContainerStateTerminated> {
    s.last_state.as_ref().and_then(|l| l.terminated.as_ref())
}

fn find<'a>(info: &'a [ApiContainerStatus], name: &str) -> Option<&'a ApiContainerStatus> {
    info.iter().find(|s| s.name == name)
}

/// `HasAnyRegularContainerStarted`.
pub fn has_any_regular_container_started(pod: &Pod, info: &[ApiContainerStatus]) -> bool {
    podutil::containers(pod).iter().any(|c| {
        find(info, &c.name).is_some_and(|s| {
            let st = state_of(s);
            st.running.is_some() || st.terminated.is_some()
        })
    })
}

/// kubelet's `HasAnyActiveRegularContainerStarted`: a regular container
/// exists in the newest sandbox, if that one is ready.
pub fn has_any_active_regular_container(pod: &Pod, rt: &RuntimePodStatus) -> bool {
    let Some(active) = rt.sandboxes.first().filter(|s| s.ready) else {
        return false;
    };
    rt.containers.iter().any(|c| {
        c.sandbox_id == active.id && podutil::containers(pod).iter().any(|s| s.name == c.name)
    })
}

/// Whether a container that ended (`t`) will run again
/// (ContainerRestartRules, on in v1.36): by its rules and policies, or
/// because a restart of the whole pod removed it.
fn restartable(c: &Container, pod: &Pod, t: &ContainerStateTerminated) -> bool {
    podutil::container_should_restart(c, pod, t.exit_code)
        || t.reason.as_deref() == Some(restart_all::RESTARTING_REASON)
}

/// kubelet's `getPhase` (v1.36, ContainerRestartRules on):
/// `pod_has_initialized` is `has_any_active_regular_container`.
pub fn get_phase(
    pod: &Pod,
    info: &[ApiContainerStatus],
    pod_is_terminal: bool,
    pod_has_initialized: bool,
) -> &'static str {
    let mut pending_restartable_init = 0;
    let mut pending_regular_init = 0;
    let mut failed_init_not_restartable = 0;
    for c in podutil::init_containers(pod) {
        if is_restartable_init(c) {
            continue;
        }
        let Some(s) = find(info, &c.name) else {
            pending_regular_init += 1;
            continue;
        };
        let st = state_of(s);
        if st.running.is_some() {
            pending_regular_init += 1;
        } else if let Some(t) = &st.terminated {
            if t.exit_code != 0 && !restartable(c, pod, t) {
                failed_init_not_restartable += 1;
            }
        } else if st.waiting.is_some() {
            match last_terminated(s) {
                Some(t) => {
                    if t.exit_code != 0 && !restartable(c, pod, t) {
                        failed_init_not_restartable += 1;
                    }
                }
                None => pending_regular_init += 1,
            }
        } else {
            pending_regular_init += 1;
        }
    }
    let (mut unknown, mut running, mut waiting_n) = (0, 0, 0);
    let (mut stopped, mut stopped_not_restartable, mut succeeded) = (0, 0, 0);
    for c in podutil::init_containers(pod) {
        if !is_restartable_init(c) {
            continue;
        }
        let Some(s) = find(info, &c.name) else {
            unknown += 1;
            continue;
        };
        let st = state_of(s);
        if st.running.is_some() {
            if s.started != Some(true) {
                pending_restartable_init += 1;
            }
            running += 1;
        } else if st.terminated.is_some() {
            // A stopped sidecar does not count for the phase.
        } else if st.waiting.is_some() {
            if last_terminated(s).is_none() {
                pending_restartable_init += 1;
                waiting_n += 1;
            }
        } else {
            pending_restartable_init += 1;
            unknown += 1;
        }
    }
    for c in podutil::containers(pod) {
        let Some(s) = find(info, &c.name) else {
            unknown += 1;
            continue;
        };
        let st = state_of(s);
        if st.running.is_some() {
            running += 1;
        } else if let Some(t) = &st.terminated {
            stopped += 1;
            if !restartable(c, pod, t) {
                stopped_not_restartable += 1;
            }
            if t.exit_code == 0 {
                succeeded += 1;
            }
        } else if st.waiting.is_some() {
            match last_terminated(s) {
                Some(t) => {
                    stopped += 1;
                    if !restartable(c, pod, t) {
                        stopped_not_restartable += 1;
                    }
                }
                None => waiting_n += 1,
            }
        } else {
            unknown += 1;
        }
    }
    if failed_init_not_restartable > 0 {
        return "Failed";
    }
    if pending_regular_init > 0
        || (pending_restartable_init > 0 && !pod_has_initialized)
        || waiting_n > 0
    {
        return "Pending";
    }
    if running > 0 && unknown == 0 {
        return "Running";
    }
    if running == 0 && stopped > 0 && unknown == 0 {
        if pod_is_terminal && !podutil::is_static(pod) {
            return if stopped == succeeded {
                "Succeeded"
            } else {
                "Failed"
            };
        }
        if stopped != stopped_not_restartable {
            // At least one container is restarting.
            return "Running";
        }
        return if stopped == succeeded {
            "Succeeded"
        } else {
            "Failed"
        };
    }
    "Pending"
}

fn condition(
    ty: &str,
    status: &str,
    reason: &str,
    message: &str,
    generation: Option<i64>,
) -> PodCondition {
    PodCondition {
        type_: ty.to_string(),
        status: status.to_string(),
        reason: (!reason.is_empty()).then(|| reason.to_string()),
        message: (!message.is_empty()).then(|| message.to_string()),
        observed_generation: generation,
        last_probe_time: None,
        last_transition_time: None,
    }
}

fn go_list(v: &[String]) -> String {
    format!("[{}]", v.join(" "))
}

/// `GenerateContainersReadyCondition`.
pub fn containers_ready_condition(
    pod: &Pod,
    info: Option<&[ApiContainerStatus]>,
    phase: &str,
) -> PodCondition {
    let generation = pod.metadata.generation;
    let Some(info) = info else {
        return condition(
            "ContainersReady",
            "False",
            "UnknownContainerStatuses",
            "",
            generation,
        );
    };
    let mut unknown = Vec::new();
    let mut unready = Vec::new();
    for c in podutil::init_containers(pod)
        .iter()
        .filter(|c| is_restartable_init(c))
    {
        match find(info, &c.name) {
            Some(s) if !s.ready => unready.push(c.name.clone()),
            Some(_) => {}
            None => unknown.push(c.name.clone()),
        }
    }
    for c in podutil::containers(pod) {
        match find(info, &c.name) {
            Some(s) if !s.ready => unready.push(c.name.clone()),
            Some(_) => {}
            None => unknown.push(c.name.clone()),
        }
    }
    if phase == "Succeeded" && unknown.is_empty() {
        return condition("ContainersReady", "False", "PodCompleted", "", generation);
    }
    if phase == "Failed" {
        return condition("ContainersReady", "False", "PodFailed", "", generation);
    }
    let mut msgs = Vec::new();
    if !unknown.is_empty() {
        msgs.push(format!(
            "containers with unknown status: {}",
            go_list(&unknown)
        ));
    }
    if !unready.is_empty() {
        msgs.push(format!(
            "containers with unready status: {}",
            go_list(&unready)
        ));
    }
    if !msgs.is_empty() {
        return condition(
            "ContainersReady",
            "False",
            "ContainersNotReady",
            &msgs.join(", "),
            generation,
        );
    }
    condition("ContainersReady", "True", "", "", generation)
}

/// `GeneratePodReadyCondition` (readiness gates included).
pub fn ready_condition(
    pod: &Pod,
    conditions: &[PodCondition],
    info: Option<&[ApiContainerStatus]>,
    phase: &str,
) -> PodCondition {
    let generation = pod.metadata.generation;
    let cr = containers_ready_condition(pod, info, phase);
    if cr.status != "True" {
        return PodCondition {
            type_: "Ready".into(),
            ..cr
        };
    }
    let mut msgs = Vec::new();
    for gate in podutil::spec(pod).readiness_gates.iter().flatten() {
        match conditions.iter().find(|c| c.type_ == gate.condition_type) {
            None => msgs.push(format!(
                "corresponding condition of pod readiness gate {:?} does not exist.",
                gate.condition_type
            )),
            Some(c) if c.status != "True" => msgs.push(format!(
                "the status of pod readiness gate {:?} is not \"True\", but {}",
                gate.condition_type, c.status
            )),
            Some(_) => {}
        }
    }
    if !msgs.is_empty() {
        return condition(
            "Ready",
            "False",
            "ReadinessGatesNotReady",
            &msgs.join(", "),
            generation,
        );
    }
    condition("Ready", "True", "", "", generation)
}

/// `GeneratePodInitializedCondition` (v1.36: once initialized, a pod
/// stays initialized while its init containers run again, as in a
/// restart of the whole pod).
pub fn initialized_condition(
    pod: &Pod,
    old: &PodStatus,
    info: Option<&[ApiContainerStatus]>,
    phase: &str,
) -> PodCondition {
    let generation = pod.metadata.generation;
    let inits = podutil::init_containers(pod);
    let Some(info) = info else {
        if !inits.is_empty() {
            return condition(
                "Initialized",
                "False",
                "UnknownContainerStatuses",
                "",
                generation,
            );
        }
        return condition("Initialized", "True", "", "", generation);
    };
    let mut unknown = Vec::new();
    let mut incomplete = Vec::new();
    for c in inits {
        let Some(s) = find(info, &c.name) else {
            unknown.push(c.name.clone());
            continue;
        };
        let initialized = if is_restartable_init(c) {
            s.started == Some(true)
        } else {
            s.ready
        };
        if !initialized {
            incomplete.push(c.name.clone());
        }
    }
    if phase == "Succeeded" && unknown.is_empty() {
        return condition("Initialized", "True", "PodCompleted", "", generation);
    }
    if has_any_regular_container_started(pod, info) {
        return condition("Initialized", "True", "", "", generation);
    }
    let mut msgs = Vec::new();
    if !unknown.is_empty() {
        msgs.push(format!(
            "containers with unknown status: {}",
            go_list(&unknown)
        ));
    }
    if !incomplete.is_empty() {
        msgs.push(format!(
            "containers with incomplete status: {}",
            go_list(&incomplete)
        ));
    }
    if !msgs.is_empty() {
        let was_initialized = old
            .conditions
            .iter()
            .flatten()
            .any(|c| c.type_ == "Initialized" && c.status == "True");
        if was_initialized {
            return condition("Initialized", "True", "", "", generation);
        }
        return condition(
            "Initialized",
            "False",
            "ContainersNotInitialized",
            &msgs.join(", "),
            generation,
        );
    }
    condition("Initialized", "True", "", "", generation)
}

/// `GeneratePodReadyToStartContainersCondition`.
pub fn ready_to_start_condition(pod: &Pod, rt: &RuntimePodStatus) -> PodCondition {
    let generation = pod.metadata.generation;
    if sandbox_changed(pod, rt).0 {
        condition("PodReadyToStartContainers", "False", "", "", generation)
    } else {
        condition("PodReadyToStartContainers", "True", "", "", generation)
    }
}

/// Applies the probe results to the statuses (`UpdatePodStatus`).
pub fn apply_probe_results(
    pod: &Pod,
    statuses: &mut [ApiContainerStatus],
    init: bool,
    readiness: &dyn ContainerReadiness,
) {
    let uid = podutil::uid(pod);
    for s in statuses.iter_mut() {
        let running = s.state.as_ref().is_some_and(|st| st.running.is_some());
        let id = s
            .container_id
            .as_deref()
            .and_then(|c| c.split_once("://").map(|(_, id)| id))
            .unwrap_or_default()
            .to_string();
        let started = running && readiness.started(uid, &s.name, &id);
        s.started = Some(started);
        if init {
            let spec = podutil::init_containers(pod)
                .iter()
                .find(|c| c.name == s.name);
            if !spec.is_some_and(is_restartable_init) {
                s.ready = s
                    .state
                    .as_ref()
                    .and_then(|st| st.terminated.as_ref())
                    .is_some_and(|t| t.exit_code == 0);
                continue;
            }
        }
        if !started {
            s.ready = false;
            continue;
        }
        s.ready = readiness.ready(uid, &s.name, &id);
    }
}

/// kubelet's `generateAPIPodStatus`.
pub fn generate_pod_status(pod: &Pod, rt: &RuntimePodStatus, inp: &StatusInputs<'_>) -> PodStatus {
    let old = inp.old;
    let api = pod.status.clone().unwrap_or_default();
    let has_init = !podutil::init_containers(pod).is_empty();
    let mut s = PodStatus::default();
    let ips: Vec<String> = sort_pod_ips(&rt.ips, inp.host_ips.first().map(String::as_str));
    if !ips.is_empty() {
        s.pod_ips = Some(ips.iter().map(|ip| PodIP { ip: ip.clone() }).collect());
        s.pod_ip = ips.first().cloned();
    }
    s.qos_class = Some(pod_qos(pod).as_str().to_string());
    let pod_restarting = restart_all::should_restart(pod, Some(rt), Some(old));
    let mut containers = convert_container_statuses(
        pod,
        rt,
        old.container_statuses.as_ref(),
        podutil::containers(pod),
        has_init,
        false,
        inp.failures,
        inp.runtime_name,
        pod_restarting,
    );
    let mut inits = convert_container_statuses(
        pod,
        rt,
        old.init_container_statuses.as_ref(),
        podutil::init_containers(pod),
        has_init,
        true,
        inp.failures,
        inp.runtime_name,
        pod_restarting,
    );
    // `ephemeralContainerStatuses` (generateAPIPodStatus,
    // pkg/kubelet/kubelet_pods.go): the same conversion as regular
    // containers, on the ephemeral containers as `v1.Container`s. They play
    // no part in the phase or the conditions, and the prober's
    // `UpdatePodStatus` never visits them: `ready` stays false and
    // `started` unset.
    let ephemeral_specs: Vec<Container> = podutil::ephemeral_containers(pod)
        .iter()
        .map(podutil::ephemeral_as_container)
        .collect();
    let ephemeral = convert_container_statuses(
        pod,
        rt,
        old.ephemeral_container_statuses.as_ref(),
        &ephemeral_specs,
        has_init,
        false,
        inp.failures,
        inp.runtime_name,
        pod_restarting,
    );
    // As upstream, the phase is computed before probe results are applied.
    let all: Vec<ApiContainerStatus> = containers.iter().chain(inits.iter()).cloned().collect();
    let mut phase = get_phase(
        pod,
        &all,
        inp.pod_is_terminal,
        has_any_active_regular_container(pod, rt),
    );
    apply_probe_results(pod, &mut containers, false, inp.readiness);
    apply_probe_results(pod, &mut inits, true, inp.readiness);
    if phase != "Failed" && phase != "Succeeded" {
        if podutil::is_terminal_phase(old.phase.as_deref().unwrap_or_default()) {
            phase = terminal(old.phase.as_deref());
        } else if podutil::is_terminal_phase(api.phase.as_deref().unwrap_or_default()) {
            phase = terminal(api.phase.as_deref());
        }
    }
    s.phase = Some(phase.to_string());
    if old.phase.as_deref() == Some(phase) {
        s.reason = old.reason.clone().or_else(|| api.reason.clone());
        s.message = old.message.clone().or_else(|| api.message.clone());
    }
    if let Some((reason, message)) = inp.evicted {
        s.phase = Some("Failed".into());
        s.reason = Some(reason.to_string());
        s.message = Some(message.to_string());
    }
    let phase = s.phase.clone().unwrap_or_default();
    let phase = phase.as_str();
    if podutil::is_terminal_phase(api.phase.as_deref().unwrap_or_default())
        && api.phase.as_deref() != Some(phase)
    {
        tracing::error!(pod = %podutil::key(pod), from = ?api.phase, to = phase, "pod attempted illegal phase transition");
        s.phase = api.phase.clone();
    }
    let phase = s.phase.clone().unwrap_or_default();

    let mut conditions: Vec<PodCondition> = api
        .conditions
        .iter()
        .flatten()
        .filter(|c| !KUBELET_CONDITIONS.contains(&c.type_.as_str()))
        .cloned()
        .collect();
    if !inp.pod_is_terminal {
        conditions.extend(inp.resize_conditions.iter().cloned());
    }
    if let Some(d) = old
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "DisruptionTarget")
    {
        conditions.retain(|c| c.type_ != "DisruptionTarget");
        conditions.push(d.clone());
    }
    let all: Vec<ApiContainerStatus> = inits.iter().chain(containers.iter()).cloned().collect();
    conditions.push(ready_to_start_condition(pod, rt));
    conditions.push(initialized_condition(pod, old, Some(&all), &phase));
    let ready = ready_condition(pod, &conditions, Some(&all), &phase);
    conditions.push(ready);
    conditions.push(containers_ready_condition(pod, Some(&all), &phase));
    conditions.push(condition(
        "PodScheduled",
        "True",
        "",
        "",
        pod.metadata.generation,
    ));
    if restart_all::could_restart(pod) {
        conditions.push(restart_all::condition(pod, rt, old, &phase));
    }
    s.conditions = Some(conditions);

    if let Some(first) = inp.host_ips.first() {
        s.host_ip = Some(first.clone());
        s.host_ips = Some(
            inp.host_ips
                .iter()
                .take(2)
                .map(|ip| HostIP { ip: ip.clone() })
                .collect(),
        );
        if podutil::is_host_network(pod) && s.pod_ip.is_none() {
            s.pod_ip = Some(first.clone());
            s.pod_ips = Some(
                inp.host_ips
                    .iter()
                    .take(2)
                    .map(|ip| PodIP { ip: ip.clone() })
                    .collect(),
            );
        }
    }
    s.container_statuses = Some(containers);
    s.init_container_statuses = (!inits.is_empty()).then_some(inits);
    s.ephemeral_container_statuses = (!ephemeral.is_empty()).then_some(ephemeral);
    s.resources = Some(super::resources::pod_status_resources(
        pod,
        old,
        inp.pod_cgroup,
    ));
    s.allocated_resources = super::resources::pod_allocated_resources(pod);
    s.observed_generation = pod.metadata.generation;
    s.start_time = old.start_time.clone();
    s
}

fn terminal(p: Option<&str>) -> &'static str {
    match p {
        Some("Succeeded") => "Succeeded",
        _ => "Failed",
    }
}

/// `sortPodIPs`: the first IP of the node's family, then the first of the
/// other family.
pub fn sort_pod_ips(ips: &[String], node_ip: Option<&str>) -> Vec<String> {
    let node_v6 = node_ip.is_some_and(|ip| ip.contains(':'));
    let mut out = Vec::new();
    if let Some(p) = ips.iter().find(|ip| ip.contains(':') == node_v6) {
        out.push(p.clone());
    }
    if let Some(s) = ips.iter().find(|ip| ip.contains(':') != node_v6) {
        out.push(s.clone());
    }
    out
}

/// The current wall time as an API time (for transitions and start times).
pub fn now_api(now: SystemTime) -> k8s_openapi::apimachinery::pkg::apis::meta::v1::Time {
    to_api_time(now)
}

#[cfg(test)]
mod tests;
