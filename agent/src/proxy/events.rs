//! The proxy role's Kubernetes Events: a refused sync is a Warning on the
//! Node; a health-check node port that cannot be opened is kube-proxy's
//! `FailedToStartServiceHealthcheck` Warning on the Service.

use k8s_openapi::api::core::v1::ObjectReference;
use keelson_netplane::BackendError;
use keelson_netplane::proxier::{ListenFailure, ProxyEvents};

use crate::events::{EventRecorder, EventType};

/// Reason of the Node event for a refused sync.
pub const REASON_SYNC_FAILED: &str = "FailedToSyncProxyRules";
/// kube-proxy's reason for a health-check port that failed to open.
pub const REASON_HEALTHCHECK_FAILED: &str = "FailedToStartServiceHealthcheck";

/// Events through the agent's recorder.
#[derive(Debug, Clone)]
pub struct KubeEvents {
    recorder: EventRecorder,
    node: String,
}

impl KubeEvents {
    /// Events about node `node`.
    pub fn new(recorder: EventRecorder, node: &str) -> Self {
        KubeEvents {
            recorder,
            node: node.into(),
        }
    }

    fn node_ref(&self) -> ObjectReference {
        // kube-proxy refers to its node with the name as UID.
        ObjectReference {
            kind: Some("Node".into()),
            name: Some(self.node.clone()),
            uid: Some(self.node.clone()),
            ..Default::default()
        }
    }
}

/// The Node event message for a refused sync.
pub fn sync_failed_message(backend: &str, error: &BackendError) -> String {
    format!(
        "{backend} data plane refused the Service rules update; the previous rules stay in place: {error}"
    )
}

impl ProxyEvents for KubeEvents {
    fn sync_failed(&self, backend: &str, error: &BackendError) {
        tracing::error!(backend, %error, "proxy rules sync failed");
        self.recorder.event(
            &self.node_ref(),
            EventType::Warning,
            REASON_SYNC_FAILED,
            sync_failed_message(backend, error),
        );
    }

    fn healthcheck_failed(&self, failure: &ListenFailure) {
        let svc = &failure.service;
        let object = ObjectReference {
            kind: Some("Service".into()),
            namespace: Some(svc.namespace.to_string()),
            name: Some(svc.name.to_string()),
            uid: Some(svc.to_string()),
            ..Default::default()
        };
        self.recorder.event(
            &object,
            EventType::Warning,
            REASON_HEALTHCHECK_FAILED,
            format!(
                "node {} failed to start healthcheck \"{}\" on port {}: {}",
                self.node, svc, failure.port, failure.source
            ),
        );
    }
}
