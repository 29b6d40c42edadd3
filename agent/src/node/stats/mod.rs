//! Node and pod statistics for the node API: the Summary API
//! (`/stats/summary`), `/metrics/resource` and `/metrics/cadvisor`, from
//! cgroups, procfs, statvfs and CRI ([`provider`]), in kubelet's shapes
//! ([`types`], [`exposition`]).

pub mod cgroup;
pub mod exposition;
pub mod provider;
pub mod types;

pub use provider::{StatsConfig, StatsProvider};
