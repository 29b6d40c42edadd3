//! The upstream tier: keelson against the real Kubernetes v1.36 control
//! plane, and the same cases with the real kubelet and kube-proxy as the
//! agents, which proves that each case checks upstream behaviour.
//!
//! - [`ControlPlane`]: etcd (Debian), kube-apiserver (Node,RBAC
//!   authorization, NodeRestriction) and kube-controller-manager in a
//!   network namespace of their own; kubeconfigs for nodes, kube-proxy and
//!   any user; serving certificates the API server trusts.
//! - [`ClusterNode`]: a private containerd linked to it, with keelson or
//!   kubelet/kube-proxy as the agents ([`NodeSpec`]).
//! - [`runner`]: the test binary's `main` (one control plane and one
//!   node per kind of agent shared by every case of the run; libtest's
//!   output and filters).
//!
//! Binaries come from `KEELSON_UPSTREAM_BIN` ([`bins`]); where the tier
//! cannot run, every case is reported as skipped with the reason.

pub mod bins;
pub mod control_plane;
pub mod daemon;
pub mod kubeconfig;
pub mod kubelet;
pub mod network;
pub mod node;
pub mod pki;
pub mod runner;
mod stale;

pub use bins::{UpstreamBins, can_run, upstream_or_skip};
pub use control_plane::{ControlPlane, Reach};
pub use node::{Agents, ClusterNode, KeelsonFiles, NodeAgent, NodeSpec, ProxyAgent};
pub use runner::{Case, Env};

use crate::netns::NetNsError;

/// What went wrong setting up or running the upstream cluster.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    /// A step failed.
    #[error("{context}: {message}")]
    Setup {
        /// What we were doing.
        context: String,
        /// Why it failed.
        message: String,
    },
    /// A file or process operation failed.
    #[error("{context}: {source}")]
    Io {
        /// What we were doing.
        context: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// A process the harness started exited.
    #[error("{name} exited ({status})\n--- {name} log (tail) ---\n{log}")]
    Exited {
        /// Which one.
        name: String,
        /// Its exit status.
        status: String,
        /// The end of its log.
        log: String,
    },
    /// A network namespace operation failed.
    #[error(transparent)]
    Netns(#[from] NetNsError),
}

impl UpstreamError {
    /// Maps an I/O error with context.
    pub fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> UpstreamError {
        let context = context.into();
        move |source| UpstreamError::Io { context, source }
    }
}
