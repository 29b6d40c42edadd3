//! keelson's Service data plane (the proxy role): the Service/EndpointSlice
//! model, change tracking and diffs ([`model`]), the [`Backend`] trait the
//! data planes implement, and the nftables backend.

pub mod backend;
pub mod ebpf;
pub mod fixtures;
pub mod model;
pub mod nftables;
pub mod proxier;

pub use backend::{Backend, BackendError, SyncOutcome};
/// The prometheus crate keelson's metrics use (so callers can build a registry).
pub use prometheus;
