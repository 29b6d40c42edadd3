//! Read-only views of the pod manager for the node API (kubelet's
//! `GetPods`, `GetPodByName`, used by `pkg/kubelet/server/server.go`).

use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;

use super::PodsHandle;

impl PodsHandle {
    /// Every pod this node should run (API and static pods; mirror pods
    /// excluded), as the pod manager holds them.
    pub fn pods(&self) -> Vec<Arc<Pod>> {
        self.workers.lifecycle().store.pods()
    }

    /// The pod named `namespace/name` (kubelet's `GetPodByName`).
    pub fn pod_by_name(&self, namespace: &str, name: &str) -> Option<Arc<Pod>> {
        self.workers
            .lifecycle()
            .store
            .pods_where(|p| {
                p.metadata.namespace.as_deref() == Some(namespace)
                    && p.metadata.name.as_deref() == Some(name)
            })
            .into_iter()
            .next()
    }
}

impl PodsHandle {
    /// kubelet's `GetActivePods` as the pod-resources API and the device
    /// manager use it: the pods whose worker still syncs them or is stopping
    /// them (their containers may hold the node's resources).
    pub fn pods_holding_resources(&self) -> Vec<Arc<Pod>> {
        let using: std::collections::BTreeSet<String> = self
            .workers
            .pods_using_resources()
            .into_iter()
            .map(|(p, _)| crate::pod::podutil::uid(&p).to_string())
            .collect();
        self.pods()
            .into_iter()
            .filter(|p| using.contains(crate::pod::podutil::uid(p)))
            .collect()
    }
}
