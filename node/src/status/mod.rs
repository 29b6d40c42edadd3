//! Node registration and Node status, as kubelet keeps them: the Node is
//! created (or adopted), then its status — capacity, allocatable,
//! conditions, addresses, daemon endpoints, nodeInfo, images — is
//! recomputed every `nodeStatusUpdateFrequency` and written when it
//! changed or `nodeStatusReportFrequency` passed.
//!
//! Layout, one concept per file: [`host`] (machine facts), [`runtime`]
//! (runtime health for Ready), [`capacity`], [`conditions`], [`node_info`],
//! [`images`], [`addresses`], [`setters`] (all of them in kubelet's order),
//! [`registration`], [`patch`] (the strategic merge patch and the change
//! test), [`manager`] (the loop), [`handle`] (what other parts read),
//! [`metrics`], [`format`] (quantity text), [`volumes_in_use`] (what the
//! volume manager reports in `volumesInUse`).

pub mod addresses;
pub(crate) mod call;
pub mod capacity;
pub mod conditions;
pub mod features;
pub mod format;
pub mod handle;
pub mod host;
pub mod images;
pub mod manager;
pub mod metrics;
pub mod node_info;
pub mod patch;
pub mod registration;
pub mod runtime;
pub mod setters;
pub mod shutting_down;
pub mod volumes_in_use;

pub use handle::{NoPressure, NodeStatusHandle, PressureSource};
pub use host::{Host, RealHost};
pub use manager::{NodeStatusManager, StatusConfig, StatusDeps};
pub use metrics::StatusMetrics;
pub use runtime::RuntimeState;
pub use setters::PressureFlags;
pub use shutting_down::ShuttingDown;
pub use volumes_in_use::VolumesInUse;
