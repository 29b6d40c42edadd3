//! Errors of the eBPF data plane.

use std::path::PathBuf;

use super::maps::MapsError;
use super::sync::SyncError;

/// What failed while setting up, running or removing the socket LB.
#[derive(Debug, thiserror::Error)]
pub enum EbpfError {
    /// The kernel (or the node's setup) lacks something the socket LB needs.
    /// With `proxy.ebpf.fallbackToNftables` the wiring falls back to the
    /// nftables mode on this error.
    #[error("eBPF socket load balancing is not supported here: {reason}")]
    Unsupported {
        /// What is missing, in words an operator can act on.
        reason: String,
    },
    /// A filesystem step (bpffs mount, pin directories, cgroup) failed.
    #[error("{context} ({}): {source}", path.display())]
    Io {
        /// What we were doing.
        context: &'static str,
        /// The path involved.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// aya refused the embedded object or a program.
    #[error("{context}: {detail}")]
    Bpf {
        /// What we were doing.
        context: String,
        /// aya's error text (with the verifier log when it has one).
        detail: String,
    },
    /// A pinned map could not be opened or checked.
    #[error(transparent)]
    Maps(#[from] MapsError),
    /// Reading back the pinned maps at start failed.
    #[error(transparent)]
    Adopt(#[from] SyncError),
}

impl EbpfError {
    pub(crate) fn io(
        context: &'static str,
        path: impl Into<PathBuf>,
        source: std::io::Error,
    ) -> Self {
        EbpfError::Io {
            context,
            path: path.into(),
            source,
        }
    }

    pub(crate) fn bpf(context: impl Into<String>, e: impl std::fmt::Display) -> Self {
        EbpfError::Bpf {
            context: context.into(),
            detail: e.to_string(),
        }
    }
}
