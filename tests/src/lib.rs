//! Test support for keelson: the test API server, the real-containerd harness,
//! locally built OCI images, network-namespace helpers, and shared utilities
//! used by the component tests, system tests and benchmarks.
//!
//! Nothing here is meant for production use: the test API server is a
//! stand-in for kube-apiserver on machines where none can be installed.

#[cfg(test)]
mod architecture;
pub mod bench;
pub mod conformance;
pub mod containerd;
pub mod csi_hostpath;
pub mod device_plugin;
pub mod ebpf_env;
pub mod images;
pub mod logind_double;
pub mod netns;
pub mod node_api;
pub mod node_harness;
pub mod private_bus;
pub mod private_systemd;
pub mod prom_text;
pub mod proxy_cases;
pub mod support;
pub mod systemd_double;
pub mod testapi;
pub mod upstream;
