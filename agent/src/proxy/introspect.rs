//! The proxy role's provider for `keelson diagnose` ([`ProxyIntrospect`]):
//! what the data plane was last told for a Service (the endpoints each port
//! programmed for Cluster and Local traffic), whether changes wait, and
//! kube-proxy's `/healthz` answer.

use keelson_netplane::proxier::ProxyHandle;

use crate::introspection::ProxyIntrospect;
use crate::introspection::types::{ProgrammedPort, ServiceState};

/// The proxy role's read-only view.
#[derive(Debug)]
pub struct ProxyIntrospector {
    handle: ProxyHandle,
    mode: String,
}

impl ProxyIntrospector {
    /// A view of `handle` in data plane `mode`.
    pub fn new(handle: ProxyHandle, mode: &str) -> ProxyIntrospector {
        ProxyIntrospector {
            handle,
            mode: mode.to_string(),
        }
    }
}

impl ProxyIntrospect for ProxyIntrospector {
    fn service(&self, namespace: &str, name: &str) -> ServiceState {
        let (ports, pending) = self.handle.programmed_service(namespace, name);
        let (healthz_code, healthz_body) = self.handle.health().healthz();
        ServiceState {
            proxy_role: true,
            mode: self.mode.clone(),
            pending,
            ports: ports
                .iter()
                .map(|s| ProgrammedPort {
                    name: format!("{}/{}", s.key.name, s.info.protocol.as_k8s()),
                    family: s.key.family.as_k8s().to_string(),
                    cluster_endpoints: if s.uses_cluster_policy() {
                        s.cluster_endpoints
                            .iter()
                            .map(|e| e.addr().to_string())
                            .collect()
                    } else {
                        Vec::new()
                    },
                    local_endpoints: if s.uses_local_policy() {
                        s.local_endpoints
                            .iter()
                            .map(|e| e.addr().to_string())
                            .collect()
                    } else {
                        Vec::new()
                    },
                })
                .collect(),
            healthz_code,
            healthz_body,
        }
    }

    fn mode(&self) -> String {
        self.mode.clone()
    }
}
