//! What the eviction manager needs from the pod lifecycle: the active pods,
//! killing one with a grace period and a final status, and knowing when its
//! resources are gone. Implemented for the pod lifecycle's
//! [`PodsHandle`](crate::pods::PodsHandle); tests use their own.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{Pod, PodCondition};

/// `Evicted`: the reason of an evicted pod's status and of the event.
pub const REASON_EVICTED: &str = "Evicted";

/// The pods the eviction manager acts on.
pub trait EvictionPods: Send + Sync + 'static {
    /// Pods that should be running (not terminating).
    fn active_pods(&self) -> Vec<Arc<Pod>>;

    /// Kills `pod` within `grace_seconds`; it ends with phase `Failed`,
    /// reason `Evicted`, `message`, and `condition` when given. False when
    /// the pod is unknown.
    fn kill(
        &self,
        pod: &Pod,
        grace_seconds: i64,
        message: &str,
        condition: Option<PodCondition>,
    ) -> bool;

    /// Whether the pod's containers are gone.
    fn is_cleaned_up(&self, uid: &str) -> bool;
}

/// kubelet's `IsCriticalPod`: static, mirror, or priority of at least
/// `system-cluster-critical`.
pub fn is_critical(pod: &Pod) -> bool {
    crate::pod::podutil::is_critical(pod)
}
