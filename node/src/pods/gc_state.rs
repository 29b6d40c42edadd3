//! The pod lifecycle as the container garbage collector's pod state
//! provider (kubelet's `podStateProvider`).

use super::PodsHandle;
use crate::gc::PodState;

impl PodState for PodsHandle {
    fn should_pod_content_be_removed(&self, uid: &str) -> bool {
        PodsHandle::should_pod_content_be_removed(self, uid)
    }

    fn should_pod_runtime_be_removed(&self, uid: &str) -> bool {
        PodsHandle::should_pod_runtime_be_removed(self, uid)
    }

    fn all_sources_ready(&self) -> bool {
        PodsHandle::all_sources_ready(self)
    }
}
