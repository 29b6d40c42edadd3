//! The desired state of one service port: its Service data, its endpoints
//! and the endpoint choice for each traffic policy, plus the derived
//! decisions every data plane must render the same way (kube-proxy's
//! per-service logic in `syncProxyRules`).

use std::sync::Arc;

use super::endpoint::Endpoint;
use super::selection::{Categorized, NodeTopology, categorize};
use super::service::ServicePortInfo;
use super::types::ServicePortKey;

/// What to do with new connections to an address of a service port that has
/// no endpoint for that traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NoEndpointVerdict {
    /// The Service has no usable endpoint anywhere: reject (ICMP port
    /// unreachable / TCP reset), so clients fail fast.
    Reject,
    /// Endpoints exist but none for this policy on this node (iTP/eTP Local
    /// without a local endpoint): drop silently.
    Drop,
}

/// The desired state of one service port in one IP family.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServicePortState {
    /// Which service port and family.
    pub key: ServicePortKey,
    /// The Service data.
    pub info: Arc<ServicePortInfo>,
    /// Every endpoint known for the port (any condition), sorted by address.
    pub endpoints: Vec<Endpoint>,
    /// Endpoints for Cluster traffic policy (topology and KEP-1669 applied).
    pub cluster_endpoints: Vec<Endpoint>,
    /// Endpoints for Local traffic policy.
    pub local_endpoints: Vec<Endpoint>,
    /// A usable endpoint exists somewhere in the cluster.
    pub has_any_endpoints: bool,
}

impl ServicePortState {
    /// Builds the state: categorizes `endpoints` for this node.
    pub fn new(
        key: ServicePortKey,
        info: Arc<ServicePortInfo>,
        endpoints: Vec<Endpoint>,
        node: &NodeTopology,
    ) -> ServicePortState {
        let Categorized {
            cluster,
            local,
            has_any_endpoints,
        } = categorize(&endpoints, &info, node);
        ServicePortState {
            key,
            info,
            endpoints,
            cluster_endpoints: cluster,
            local_endpoints: local,
            has_any_endpoints,
        }
    }

    /// Whether the Cluster-policy endpoint set is in use (rendered).
    pub fn uses_cluster_policy(&self) -> bool {
        !self.cluster_endpoints.is_empty() && self.info.uses_cluster_endpoints()
    }

    /// Whether the Local-policy endpoint set is in use (rendered).
    pub fn uses_local_policy(&self) -> bool {
        !self.local_endpoints.is_empty() && self.info.uses_local_endpoints()
    }

    /// Endpoints for traffic to the ClusterIP (Local set when iTP=Local).
    pub fn internal_endpoints(&self) -> &[Endpoint] {
        if self.info.internal_policy_local {
            &self.local_endpoints
        } else {
            &self.cluster_endpoints
        }
    }

    /// Whether ClusterIP traffic has somewhere to go.
    pub fn has_internal_endpoints(&self) -> bool {
        self.has_any_endpoints
            && !(self.info.internal_policy_local && self.local_endpoints.is_empty())
    }

    /// Endpoints for external traffic (NodePort, externalIPs, LB IPs) that is
    /// not short-circuited (Local set when eTP=Local).
    pub fn external_endpoints(&self) -> &[Endpoint] {
        if self.info.external_policy_local {
            &self.local_endpoints
        } else {
            &self.cluster_endpoints
        }
    }

    /// Whether external traffic has somewhere to go.
    pub fn has_external_endpoints(&self) -> bool {
        self.has_any_endpoints
            && !(self.info.external_policy_local && self.local_endpoints.is_empty())
    }

    /// Verdict for ClusterIP traffic when it has no endpoint (`None` when it has).
    pub fn internal_no_endpoint_verdict(&self) -> Option<NoEndpointVerdict> {
        if !self.has_any_endpoints {
            Some(NoEndpointVerdict::Reject)
        } else if !self.has_internal_endpoints() {
            Some(NoEndpointVerdict::Drop)
        } else {
            None
        }
    }

    /// Verdict for external traffic when it has no endpoint (`None` when it has).
    pub fn external_no_endpoint_verdict(&self) -> Option<NoEndpointVerdict> {
        if !self.has_any_endpoints {
            Some(NoEndpointVerdict::Reject)
        } else if !self.has_external_endpoints() {
            Some(NoEndpointVerdict::Drop)
        } else {
            None
        }
    }

    /// Whether external addresses are routed through the "external" stage
    /// (masquerade for eTP=Cluster; short-circuit of pod and host traffic for
    /// eTP=Local). Present whenever the port is externally reachable and has
    /// endpoints anywhere, even with no local endpoint.
    pub fn uses_external_stage(&self) -> bool {
        self.has_any_endpoints && self.info.externally_accessible()
    }

    /// Every endpoint this node may send traffic to (Cluster ∪ Local in use).
    pub fn reachable_endpoints(&self) -> Vec<Endpoint> {
        Categorized {
            cluster: if self.uses_cluster_policy() {
                self.cluster_endpoints.clone()
            } else {
                Vec::new()
            },
            local: if self.uses_local_policy() {
                self.local_endpoints.clone()
            } else {
                Vec::new()
            },
            has_any_endpoints: self.has_any_endpoints,
        }
        .all_reachable()
    }

    /// Number of distinct local ready endpoint addresses (the health-check
    /// node port's `localEndpoints`).
    pub fn local_ready_ips(&self) -> impl Iterator<Item = std::net::IpAddr> + '_ {
        self.endpoints
            .iter()
            .filter(|e| e.is_local && e.ready)
            .map(|e| e.ip)
    }
}
