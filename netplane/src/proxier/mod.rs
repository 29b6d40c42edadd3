//! The proxy role's engine, independent of the API client: the sync loop
//! ([`Proxier`] fed through a [`ProxyHandle`]), kube-proxy's metrics
//! ([`ProxyMetrics`]), `/healthz` semantics and health-check node ports
//! ([`health`]), and UDP conntrack cleanup ([`conntrack`]).

pub mod conntrack;
pub mod health;
pub mod http;
pub mod metrics;
pub mod runner;

pub use conntrack::{ConntrackCleaner, CtFilter, Flow, filters_for, flows};
pub use health::{Listen, ListenFailure, ProxyHealth, ServiceHealthServer, StdListen};
pub use metrics::ProxyMetrics;
pub use runner::{LogEvents, Proxier, ProxierConfig, ProxyEvents, ProxyHandle, SyncReport};
