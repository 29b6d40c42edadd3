//! The pod lifecycle of the node role (kubelet's pod workers, kuberuntime,
//! PLEG, status manager and pod sources).

pub mod backoff;
pub mod clock;
pub mod deps;
pub mod events;
pub mod metrics;
pub mod podutil;
pub mod qos;
pub mod resources;
pub mod runtime;
pub mod status;
