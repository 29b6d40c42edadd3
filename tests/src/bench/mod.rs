//! `keelson-bench`: keelson's proxy role next to kube-proxy, measured in
//! one run on the same objects and the same traffic probes.
//!
//! - [`scenario`]: N Services × M endpoints and the churn changes.
//! - [`api`]: writes them to the test API server or any cluster.
//! - [`topology`], [`backends`]: a fabric namespace, backend namespaces
//!   answering on whole address blocks, one node namespace per contestant.
//! - [`contestant`]: the real `keelson run --proxy-only` (nftables, eBPF)
//!   and the real kube-proxy (nftables, iptables) started in those nodes.
//! - [`agent`]: the probe process inside a node (and its eBPF cgroup).
//! - [`phases`], [`churn`], [`changes`]: what is measured and how.
//! - [`kernel`], [`procstat`], [`metrics`]: kernel objects, CPU/RSS, the
//!   contestants' own metrics.
//! - [`results`], [`report`], [`plot`]: JSON, markdown and the plot.
//!
//! Benchmarks are not tests: this prints figures. The smoke test
//! (`tests/tests/system/bench_smoke.rs`) only checks that every contestant
//! programmed the scenario correctly in `--quick` mode.

pub mod agent;
pub mod api;
pub mod backends;
pub mod changes;
pub mod churn;
pub mod clock;
pub mod config;
pub mod contestant;
pub mod error;
pub mod kernel;
pub mod metrics;
pub mod phases;
pub mod plot;
pub mod procstat;
pub mod relay;
pub mod report;
pub mod results;
pub mod run;
pub mod scenario;
pub mod stats;
pub mod topology;

pub use config::BenchConfig;
pub use contestant::ContestantKind;
pub use error::BenchError;
pub use results::{BenchReport, RunResult};
