//! Pod state for garbage collection from what keelson can see: the pod
//! lifecycle's handle (which pods it still runs or terminates, the status it
//! gave them) and the API server's pods bound to this node (what still
//! exists), read once per collection.
//!
//! kubelet's GC asks its pod workers `ShouldPodContentBeRemoved` (deleted
//! and terminated, or evicted; an unknown pod once every source listed) and
//! `ShouldPodRuntimeBeRemoved` (terminated). Here "deleted" means not bound
//! to this node in the API (a static pod counts as existing while its mirror
//! pod does: the mirror carries the static pod's UID in
//! `kubernetes.io/config.mirror`), "sources listed" means the API list
//! succeeded, and "terminated" and "evicted" come from the pod lifecycle.

use std::collections::HashSet;
use std::sync::RwLock;

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::ListParams;

use crate::gc::PodState;
use crate::pods::PodsHandle;

/// [`PodState`] from the pod lifecycle and the API server.
pub struct LifecyclePodState {
    pods: PodsHandle,
    api: Api<Pod>,
    node_name: String,
    /// UIDs bound to this node at the last successful list (`None`: never listed).
    known: RwLock<Option<HashSet<String>>>,
}

impl std::fmt::Debug for LifecyclePodState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LifecyclePodState")
            .field("node_name", &self.node_name)
            .finish_non_exhaustive()
    }
}

impl LifecyclePodState {
    /// State for `node_name`'s pods, read with the node's client.
    pub fn new(pods: PodsHandle, client: kube::Client, node_name: &str) -> LifecyclePodState {
        LifecyclePodState {
            pods,
            api: Api::all(client),
            node_name: node_name.to_string(),
            known: RwLock::new(None),
        }
    }

    fn exists(&self, uid: &str) -> Option<bool> {
        self.known.read().ok()?.as_ref().map(|k| k.contains(uid))
    }

    fn evicted(&self, uid: &str) -> bool {
        self.pods.pod_status(uid).is_some_and(|s| {
            s.phase.as_deref() == Some("Failed") && s.reason.as_deref() == Some("Evicted")
        })
    }
}

impl PodState for LifecyclePodState {
    fn should_pod_content_be_removed(&self, uid: &str) -> bool {
        if self.evicted(uid) {
            return true;
        }
        // A pod a worker still tracks: the worker's own view decides, as
        // kubelet's pod workers do (pod_workers.go ShouldPodContentBeRemoved:
        // evicted, or deleted and terminated). The list below may predate
        // a pod created since it was read: a pod that ran to completion
        // meanwhile had its logs removed before `kubectl logs` could read
        // them (e2e's Secrets/EmptyDir/Downward API output tests).
        if self.pods.has_worker(uid) {
            return self.pods.should_pod_content_be_removed(uid);
        }
        match self.exists(uid) {
            None => false,
            Some(exists) => !exists && self.pods.is_terminated(uid),
        }
    }

    fn should_pod_runtime_be_removed(&self, uid: &str) -> bool {
        self.exists(uid).is_some() && self.pods.is_terminated(uid)
    }

    fn all_sources_ready(&self) -> bool {
        self.exists("").is_some()
    }

    fn refresh(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            let lp = ListParams::default().fields(&format!("spec.nodeName={}", self.node_name));
            match self.api.list(&lp).await {
                Ok(list) => {
                    let mut uids = HashSet::new();
                    for p in list.items {
                        if let Some(u) = p.metadata.uid.clone() {
                            uids.insert(u);
                        }
                        if let Some(h) = p
                            .metadata
                            .annotations
                            .as_ref()
                            .and_then(|a| a.get("kubernetes.io/config.mirror"))
                        {
                            uids.insert(h.clone());
                        }
                    }
                    if let Ok(mut k) = self.known.write() {
                        *k = Some(uids);
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %keelson_common::error_chain::error_chain(&e), "garbage collection: cannot list this node's pods; keeping what was known");
                }
            }
        })
    }
}
