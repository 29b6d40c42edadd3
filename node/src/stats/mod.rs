//! Node and pod statistics for the node API: the Summary API
//! (`/stats/summary`), `/metrics/resource` and `/metrics/cadvisor`, from
//! cgroups, procfs, statvfs and CRI ([`provider`], [`cgroup_info`],
//! [`machine`]), sampled every housekeeping interval into [`cache`]
//! (requests read its snapshot), in kubelet's shapes ([`types`],
//! [`exposition`], [`cadvisor`]); pod volumes measured in the background
//! every `volumeStatsAggPeriod` ([`volume_stats`]) and exposed as the
//! `kubelet_volume_stats_*` gauges ([`volume_metrics`]).

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
pub mod volume_metrics;
pub mod volume_stats;

pub use cache::StatsCache;
pub use disk::DiskUsage;
pub use error::StatsError;
pub use provider::{StatsConfig, StatsProvider};
pub use volume_stats::VolumeStatsCalculator;
