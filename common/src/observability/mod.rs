//! What operators look at: logs, the health endpoints and Prometheus metrics.

pub mod health;
pub mod metrics;
pub mod server;

pub use health::{CheckFailed, Health, HealthFlag, ProbeKind};
