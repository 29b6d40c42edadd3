//! Events the prober asks the agent to record on the container, worded as
//! kubelet's so they read the same in `kubectl describe pod`.

use crate::result::ProbeKind;

/// Event reason of a failed or errored probe run.
pub const REASON_UNHEALTHY: &str = "Unhealthy";
/// Event reason of a probe run that succeeded with a warning.
pub const REASON_PROBE_WARNING: &str = "ProbeWarning";
/// Event type of every probe event.
pub const EVENT_TYPE_WARNING: &str = "Warning";

/// One event about a container's probe. The agent records it against the
/// container (`involvedObject` = the pod, `fieldPath:
/// spec.containers{<name>}`), through its rate-limited recorder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeEvent {
    /// Pod UID.
    pub pod_uid: String,
    /// Pod namespace.
    pub namespace: String,
    /// Pod name.
    pub pod_name: String,
    /// Container name.
    pub container_name: String,
    /// The container instance probed.
    pub container_id: String,
    /// Which probe.
    pub probe: ProbeKind,
    /// Always [`EVENT_TYPE_WARNING`].
    pub event_type: &'static str,
    /// [`REASON_UNHEALTHY`] or [`REASON_PROBE_WARNING`].
    pub reason: &'static str,
    /// E.g. `Liveness probe failed: HTTP probe failed with statuscode: 500`.
    pub message: String,
}

/// `<Kind> probe failed: <output>`.
pub fn failed_message(kind: ProbeKind, output: &str) -> String {
    format!("{kind} probe failed: {output}")
}

/// `<Kind> probe warning: <output>`.
pub fn warning_message(kind: ProbeKind, output: &str) -> String {
    format!("{kind} probe warning: {output}")
}

/// `<Kind> probe errored and resulted in unknown state: <error>`.
pub fn errored_message(kind: ProbeKind, error: &str) -> String {
    format!("{kind} probe errored and resulted in unknown state: {error}")
}
