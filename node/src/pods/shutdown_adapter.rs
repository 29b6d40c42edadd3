//! The pod lifecycle as the graceful node shutdown manager's view of the
//! pods ([`ShutdownPods`]): the active pods, killing one with the
//! shutdown's final status (kubelet's `killPodFunc` status function in
//! pkg/kubelet/nodeshutdown/nodeshutdown_manager.go), whether it is gone.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{Pod, PodCondition};

use super::PodsHandle;
use super::lifecycle::FinalStatus;
use crate::shutdown::{MESSAGE, REASON, ShutdownPods};

impl ShutdownPods for PodsHandle {
    fn active_pods(&self) -> Vec<Arc<Pod>> {
        PodsHandle::active_pods(self)
            .into_iter()
            .map(|a| a.pod)
            .collect()
    }

    fn kill_for_shutdown(&self, pod: &Pod, grace: i64) -> bool {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        self.kill_pod(
            &uid,
            Some(grace),
            FinalStatus {
                phase: "Failed".to_string(),
                reason: REASON.to_string(),
                message: MESSAGE.to_string(),
                condition: Some(PodCondition {
                    type_: "DisruptionTarget".to_string(),
                    status: "True".to_string(),
                    reason: Some("TerminationByKubelet".to_string()),
                    message: Some(MESSAGE.to_string()),
                    ..PodCondition::default()
                }),
                keep_succeeded: true,
            },
        )
    }

    fn is_cleaned_up(&self, uid: &str) -> bool {
        self.is_terminated(uid)
    }
}
