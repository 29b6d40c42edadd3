//! The backend-agnostic Service model of the proxy role.
//!
//! Data flow (one instance per proxy, both IP families in one model):
//!
//! ```text
//! Service / EndpointSlice / Node updates
//!     └─► ChangeTracker (per-Service dirty marks, coalesced; no-op updates ignored)
//!           └─► ChangeTracker::diff() ─► ProxyDiff { changes: [ServicePortChange { key, previous, current }], .. }
//!                 └─► Backend::sync(&diff)        (nftables, eBPF: one atomic change each)
//!                       └─► ChangeTracker::commit(&diff) on success
//! ```
//!
//! - [`ServicePortKey`] = (IP family, [`ServicePortName`] = ns/name:port + protocol)
//!   identifies one unit of routing. A dual-stack Service has one key per family.
//! - [`ServicePortInfo`] is the Service data of a port (ClusterIP, port,
//!   NodePort, externalIPs, LB ingress IPs, source ranges, affinity, traffic
//!   policies, health-check node port), read by [`service_ports`] with
//!   kube-proxy's filters (headless, ExternalName, `service-proxy-name`, family).
//! - [`Endpoint`]s come from EndpointSlices ([`slice_info`], [`endpoints_for_port`]).
//! - [`ServicePortState`] is the desired state of a port: its info, all its
//!   endpoints, and the endpoint choice computed ONCE by [`categorize`]
//!   (KEP-1669 terminating fallback, topology hints, iTP/eTP Local). Its
//!   methods give the decisions a data plane renders: which endpoints serve
//!   internal/external traffic, [`NoEndpointVerdict`] (reject vs drop),
//!   whether the external stage exists. Backends must not re-derive these.
//! - [`ProxyDiff`] lists the changed ports with their previous (committed)
//!   and current (desired) states; [`ProxySnapshot`] is the whole desired
//!   state for a full resync.

mod diff;
mod endpoint;
mod selection;
mod service;
mod state;
mod tracker;
mod types;

#[cfg(test)]
mod tests;

pub use diff::{NodePortAddresses, ProxyDiff, ProxySnapshot, ServicePortChange};
pub use endpoint::{
    ANNOTATION_LAST_CHANGE_TRIGGER_TIME, Endpoint, EndpointHints, LABEL_SERVICE_NAME, Names,
    SliceEndpoint, SliceInfo, SlicePort, SliceSkip, endpoints_for_port, last_change_trigger_time,
    slice_info, slice_info_with,
};
pub use selection::{Categorized, NodeTopology, TopologyMode, categorize, topology_mode};
pub use service::{
    DEFAULT_STICKY_TIMEOUT_SECONDS, LABEL_HEADLESS, LABEL_SERVICE_PROXY_NAME, ServicePortInfo,
    ServicePorts, SessionAffinity, SkipReason, service_ports,
};
pub use state::{NoEndpointVerdict, ServicePortState};
pub use tracker::ChangeTracker;
pub use types::{IpFamily, NamespacedName, Protocol, ServicePortKey, ServicePortName};
