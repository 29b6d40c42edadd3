//! Container probes for keelson's node role: the exec, httpGet, tcpSocket and
//! grpc handlers, and the [`ProbeManager`] that runs every container's
//! startup, liveness and readiness probes with kubelet's timing, thresholds,
//! results, events and metrics.
//!
//! The crate knows nothing of CRI: exec probes go through the [`Exec`] trait
//! the agent implements with `ExecSync`.
//!
//! ```no_run
//! # use std::{sync::Arc, time::Duration};
//! # use keelson_probes::*;
//! struct CriExec; // the agent's CRI client
//! impl Exec for CriExec {
//!     async fn exec(&self, _id: &str, _cmd: Vec<String>, _timeout: Duration) -> Result<ExecOutput, ExecError> {
//!         Ok(ExecOutput::default())
//!     }
//! }
//! # async fn demo(pod: k8s_openapi::api::core::v1::Pod) -> Result<(), ProbeManagerError> {
//! let registry = prometheus::Registry::new();
//! let (probes, mut outputs) = ProbeManager::new(ProbeManagerConfig::default(), Arc::new(CriExec), &registry)?;
//! probes.add_pod(&pod)?;
//! let uid = pod.metadata.uid.clone().unwrap_or_default();
//! probes.container_started(&uid, "app", ContainerStart {
//!     container_id: "c1".into(),
//!     started_at: std::time::SystemTime::now(),
//!     pod_ips: vec!["10.244.0.7".into()],
//!     adopted: None,
//! })?;
//! while let Some(update) = outputs.updates.recv().await {
//!     // wake update.pod_uid's worker; it reads probes.is_ready(..), probes.liveness(..)
//! }
//! # Ok(()) }
//! ```

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod events;
mod expand;
pub mod handlers;
mod manager;
pub mod metrics;
mod port;
pub mod prober;
mod result;
pub mod spec;

pub use events::ProbeEvent;
pub use expand::expand_command;
pub use handlers::exec::{Exec, ExecError, ExecOutput};
pub use handlers::http::{HttpProber, HttpRequest};
pub use manager::{
    ContainerStart, KUBE_VERSION, ProbeManager, ProbeManagerConfig, ProbeManagerError,
    ProbeManagerOutputs, ProbeUpdate, ReportedStatus,
};
pub use metrics::ProberMetrics;
pub use port::{PortError, resolve_container_port};
pub use result::{ProbeKind, ProbeResult, ProbeState};
pub use spec::{ContainerProbes, HttpGetSpec, ProbeHandler, ProbeSpec};
