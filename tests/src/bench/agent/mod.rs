//! The probe agent: a child process (this binary re-executed as
//! `keelson-bench probe-agent`) that joins a contestant's cgroup (eBPF mode:
//! its socket hooks only see sockets of processes in that cgroup) and then
//! its node network namespace, and runs the same traffic probes for every
//! contestant, so the measuring side is identical whatever the proxy.
//!
//! It speaks JSON lines on stdin/stdout ([`protocol`]); requests run
//! concurrently and answers carry the request id. Times it reports are
//! `CLOCK_MONOTONIC` nanoseconds ([`super::clock`]), comparable with the
//! benchmark process's.

pub mod client;
pub mod probe;
pub mod protocol;
pub mod server;

pub use client::Agent;
pub use protocol::{LatencyResult, ReachResult, Request, Response, SweepResult, Target};
