//! Graceful node shutdown settings (`shutdownGracePeriod`,
//! `shutdownGracePeriodCriticalPods`, `shutdownGracePeriodByPodPriority`)
//! and their checks, as kubelet v1.36 validates them
//! (pkg/kubelet/apis/config/validation/validation.go).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{FieldError, NodeConfig};

/// How long pods of a priority and above (up to the next entry's) get to
/// stop when the node shuts down (`ShutdownGracePeriodByPodPriority`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ShutdownGracePeriodByPodPriority {
    /// The lowest pod priority of this group.
    pub priority: i32,
    /// Seconds the group's pods get (their own grace period if shorter).
    pub shutdown_grace_period_seconds: i64,
}

/// The checks kubelet makes on the three fields (its messages).
pub fn validate(n: &NodeConfig, errs: &mut Vec<FieldError>) {
    let total = n.shutdown_grace_period.get();
    let critical = n.shutdown_grace_period_critical_pods.get();
    if critical > total {
        errs.push(FieldError::new(
            "node.shutdownGracePeriodCriticalPods",
            format!(
                "{} must be <= shutdownGracePeriod {}",
                n.shutdown_grace_period_critical_pods, n.shutdown_grace_period
            ),
        ));
    }
    for (path, d, value) in [
        ("shutdownGracePeriod", total, n.shutdown_grace_period),
        (
            "shutdownGracePeriodCriticalPods",
            critical,
            n.shutdown_grace_period_critical_pods,
        ),
    ] {
        if !d.is_zero() && d < Duration::from_secs(1) {
            errs.push(FieldError::new(
                format!("node.{path}"),
                format!("{value} must be either zero or otherwise >= 1 sec"),
            ));
        }
    }
    if !n.shutdown_grace_period_by_pod_priority.is_empty()
        && (!total.is_zero() || !critical.is_zero())
    {
        errs.push(FieldError::new(
            "node.shutdownGracePeriodByPodPriority",
            "cannot be given together with shutdownGracePeriod or shutdownGracePeriodCriticalPods: use one or the other",
        ));
    }
    for (i, p) in n.shutdown_grace_period_by_pod_priority.iter().enumerate() {
        if p.shutdown_grace_period_seconds < 0 {
            errs.push(FieldError::new(
                format!("node.shutdownGracePeriodByPodPriority[{i}].shutdownGracePeriodSeconds"),
                format!("{} must not be negative", p.shutdown_grace_period_seconds),
            ));
        }
    }
}
