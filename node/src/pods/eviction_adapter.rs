//! The pod lifecycle as the eviction manager's view of the pods
//! ([`EvictionPods`]): the active pods, killing one as evicted, whether its
//! containers are gone.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{Pod, PodCondition};

use super::PodsHandle;
use super::lifecycle::FinalStatus;
use crate::eviction::{EvictionPods, REASON_EVICTED};

impl EvictionPods for PodsHandle {
    fn active_pods(&self) -> Vec<Arc<Pod>> {
        PodsHandle::active_pods(self)
            .into_iter()
            .map(|a| a.pod)
            .collect()
    }

    fn kill(
        &self,
        pod: &Pod,
        grace_seconds: i64,
        message: &str,
        condition: Option<PodCondition>,
    ) -> bool {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        self.kill_pod(
            &uid,
            Some(grace_seconds),
            FinalStatus {
                phase: "Failed".to_string(),
                reason: REASON_EVICTED.to_string(),
                message: message.to_string(),
                condition,
                keep_succeeded: false,
            },
        )
    }

    fn is_cleaned_up(&self, uid: &str) -> bool {
        self.is_terminated(uid)
    }
}
