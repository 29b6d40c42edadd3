//! `activeDeadlineSeconds` (kubelet's `activeDeadlineHandler`,
//! `pkg/kubelet/active_deadline.go`): once a pod has been active on the node
//! (since its `status.startTime`) for its deadline, every status the node
//! generates for it is `Failed` with reason `DeadlineExceeded`, with a
//! Normal event of the same reason; the pod worker then stops its
//! containers like any pod that reached a terminal phase. kubelet's sync
//! loop looks at every pod each second (`ShouldSync`); keelson's worker
//! instead resyncs the pod exactly when its deadline passes.

use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::pod::podutil;

/// The reason (status and event).
pub const REASON: &str = "DeadlineExceeded";
/// The message (status and event).
pub const MESSAGE: &str = "Pod was active on the node longer than the specified deadline";

/// When the pod's active deadline passes, given its start time (`None`:
/// no deadline, or not started).
pub fn deadline(pod: &Pod, start_time: Option<&Time>) -> Option<SystemTime> {
    let seconds = podutil::spec(pod).active_deadline_seconds?;
    let start: SystemTime = start_time?.0.into();
    // The API keeps whole seconds; so does `to_api_time`.
    let seconds = u64::try_from(seconds.max(0)).unwrap_or(0);
    start.checked_add(Duration::from_secs(seconds))
}

/// `pastActiveDeadline`.
pub fn past(pod: &Pod, start_time: Option<&Time>, now: SystemTime) -> bool {
    deadline(pod, start_time).is_some_and(|d| now >= d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deadline_counts_from_the_start_time() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "spec": {"activeDeadlineSeconds": 5, "containers": []}
        }))
        .expect("pod");
        let start = SystemTime::UNIX_EPOCH + Duration::from_secs(1000);
        let t = crate::pods::clock::to_api_time(start);
        assert!(!past(&pod, None, start + Duration::from_secs(100)));
        assert!(!past(&pod, Some(&t), start + Duration::from_millis(4999)));
        assert!(past(&pod, Some(&t), start + Duration::from_secs(5)));
        let none: Pod =
            serde_json::from_value(serde_json::json!({"spec": {"containers": []}})).expect("pod");
        assert_eq!(deadline(&none, Some(&t)), None);
    }
}
