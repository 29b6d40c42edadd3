//! Event reasons of the pod lifecycle, as kubelet spells them
//! (`pkg/kubelet/events`), and object references to pods and containers.

use k8s_openapi::api::core::v1::{ObjectReference, Pod};

use crate::pod::podutil;
use keelson_common::events::{EventRecorder, EventType, pod_ref};

/// A container was created.
pub const CREATED: &str = "Created";
/// A container was started.
pub const STARTED: &str = "Started";
/// Creating or starting a container failed; an image pull failed.
pub const FAILED: &str = "Failed";
/// A container is being stopped.
pub const KILLING: &str = "Killing";
/// Restart or pull held back by a backoff.
pub const BACK_OFF: &str = "BackOff";
/// Pulling an image.
pub const PULLING: &str = "Pulling";
/// An image was pulled or already present.
pub const PULLED: &str = "Pulled";
/// The image reference could not be understood or inspected.
pub const INSPECT_FAILED: &str = "InspectFailed";
/// Image not present with pull policy Never.
pub const ERR_IMAGE_NEVER_PULL: &str = "ErrImageNeverPull";
/// RunPodSandbox failed.
pub const FAILED_CREATE_POD_SANDBOX: &str = "FailedCreatePodSandBox";
/// The pod's dynamic resources (DRA claims) could not be prepared.
pub const FAILED_PREPARE_DYNAMIC_RESOURCES: &str = "FailedPrepareDynamicResources";
/// PodSandboxStatus failed.
pub const FAILED_POD_SANDBOX_STATUS: &str = "FailedPodSandBoxStatus";
/// The sandbox is recreated.
pub const SANDBOX_CHANGED: &str = "SandboxChanged";
/// postStart failed.
pub const FAILED_POST_START_HOOK: &str = "FailedPostStartHook";
/// preStop failed.
pub const FAILED_PRE_STOP_HOOK: &str = "FailedPreStopHook";
/// A probe failed.
pub const UNHEALTHY: &str = "Unhealthy";
/// A probe passed with a warning.
pub const PROBE_WARNING: &str = "ProbeWarning";
/// envFrom keys that are not valid variable names.
pub const INVALID_ENVIRONMENT_VARIABLE_NAMES: &str = "InvalidEnvironmentVariableNames";
/// The pod could not be stopped.
pub const FAILED_KILL_POD: &str = "FailedKillPod";
/// Creating the pod cgroup failed.
pub const FAILED_CREATE_POD_CONTAINER: &str = "FailedCreatePodContainer";
/// The pod network is not ready.
pub const NETWORK_NOT_READY: &str = "NetworkNotReady";
/// A sync failed for a reason not reported otherwise.
pub const FAILED_SYNC: &str = "FailedSync";
/// A resize was allocated and is being actuated.
pub const RESIZE_STARTED: &str = "ResizeStarted";
/// A resize does not fit now.
pub const RESIZE_DEFERRED: &str = "ResizeDeferred";
/// A resize can never fit.
pub const RESIZE_INFEASIBLE: &str = "ResizeInfeasible";
/// A resize finished.
pub const RESIZE_COMPLETED: &str = "ResizeCompleted";
/// Actuating a resize failed.
pub const RESIZE_ERROR: &str = "ResizeError";

/// `spec.containers{name}` / `spec.initContainers{name}`: the `fieldPath`
/// kubelet's events give a container (`GenerateContainerRef`).
pub fn container_field_path(pod: &Pod, container: &str) -> String {
    if podutil::is_init_container(pod, container) {
        format!("spec.initContainers{{{container}}}")
    } else if podutil::spec(pod)
        .ephemeral_containers
        .iter()
        .flatten()
        .any(|c| c.name == container)
    {
        format!("spec.ephemeralContainers{{{container}}}")
    } else {
        format!("spec.containers{{{container}}}")
    }
}

/// A reference to a container of a pod.
pub fn container_ref(pod: &Pod, container: &str) -> ObjectReference {
    pod_ref(pod, Some(container_field_path(pod, container)))
}

/// Records events about a pod and its containers; a recorder that is
/// absent (tests of pure logic) drops them.
#[derive(Debug, Clone)]
pub struct PodEvents {
    recorder: Option<EventRecorder>,
}

impl PodEvents {
    /// Events through `recorder`.
    pub fn new(recorder: EventRecorder) -> Self {
        PodEvents {
            recorder: Some(recorder),
        }
    }

    /// No events.
    pub fn none() -> Self {
        PodEvents { recorder: None }
    }

    /// An event on the pod.
    pub fn pod(&self, pod: &Pod, kind: EventType, reason: &str, message: impl Into<String>) {
        if let Some(r) = &self.recorder {
            r.event(&pod_ref(pod, None), kind, reason, message);
        }
    }

    /// An event on a container. A container id in the message is replaced
    /// by the container name, as kubelet does, so events fold together.
    pub fn container(
        &self,
        pod: &Pod,
        container: &str,
        container_id: &str,
        kind: EventType,
        reason: &str,
        message: impl Into<String>,
    ) {
        let Some(r) = &self.recorder else { return };
        let mut message = message.into();
        if !container_id.is_empty() {
            message = message.replace(container_id, container);
        }
        r.event(&container_ref(pod, container), kind, reason, message);
    }
}
