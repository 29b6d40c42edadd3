//! The node role's provider for `keelson diagnose` ([`NodeIntrospect`]):
//! runtime and network errors as the Ready condition sees them, the PLEG,
//! Lease renewals and node status writes from the daemon's request log, and
//! each pod's worker, probes and back-offs once the pod lifecycle runs.

use std::sync::{Arc, OnceLock};

use super::pods::PodsHandle;
use super::status::RuntimeState;
use keelson_common::introspection::types::{NodeState, PodState};
use keelson_common::introspection::{ApiLog, CallKind, NodeIntrospect};

/// The node role's read-only view.
pub struct NodeIntrospector {
    runtime: RuntimeState,
    api_log: ApiLog,
    pods: OnceLock<PodsHandle>,
}

impl NodeIntrospector {
    /// A view of `runtime`, with the node client's request log.
    pub fn new(runtime: RuntimeState, api_log: ApiLog) -> Arc<NodeIntrospector> {
        Arc::new(NodeIntrospector {
            runtime,
            api_log,
            pods: OnceLock::new(),
        })
    }

    /// The pod lifecycle started.
    pub fn set_pods(&self, pods: PodsHandle) {
        let _ = self.pods.set(pods);
    }
}

impl NodeIntrospect for NodeIntrospector {
    fn node(&self) -> NodeState {
        let (pleg_error, pod_workers) = self
            .pods
            .get()
            .map(PodsHandle::introspect_node)
            .unwrap_or((None, 0));
        NodeState {
            node_role: true,
            runtime_errors: self.runtime.runtime_errors(),
            network_errors: self.runtime.network_errors(),
            pleg_error,
            pods_started: self.pods.get().is_some(),
            pod_workers,
            lease: self.api_log.stats("node", CallKind::Lease),
            node_status: self.api_log.stats("node", CallKind::NodeStatus),
            api: self.api_log.stats("node", CallKind::All),
        }
    }

    fn pod(&self, namespace: &str, name: &str) -> Option<PodState> {
        self.pods.get()?.introspect(namespace, name)
    }
}
