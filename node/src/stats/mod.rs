//! Node and pod statistics for the node API: the Summary API
//! (`/stats/summary`), `/metrics/resource` and `/metrics/cadvisor`, from
//! cgroups, procfs, statvfs and CRI ([`provider`], [`cgroup_info`],
//! [`machine`]), sampled every housekeeping interval into [`cache`]
//! (requests read its snapshot), in kubelet's shapes ([`types`],
//! [`exposition`], [`cadvisor`]).

pub mod cache;
pub mod cadvisor;
pub mod cgroup;
pub mod cgroup_info;
pub mod cpu_rate;
pub mod disk;
pub mod error;
pub mod exposition;
pub mod machine;
pub mod provider;
pub mod types;

pub use cache::StatsCache;
pub use disk::DiskUsage;
pub use error::StatsError;
pub use provider::{StatsConfig, StatsProvider};
