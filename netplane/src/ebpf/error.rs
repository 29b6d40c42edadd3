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

    /// An aya error with its whole source chain (aya puts the errno in
    /// the source of its syscall errors).
    pub(crate) fn bpf(context: impl Into<String>, e: impl std::error::Error) -> Self {
        EbpfError::Bpf {
            context: context.into(),
            detail: chain(&e),
        }
    }

    pub(crate) fn bpf_msg(context: impl Into<String>, detail: impl Into<String>) -> Self {
        EbpfError::Bpf {
            context: context.into(),
            detail: detail.into(),
        }
    }
}

/// `e: source: source...` in one line.
pub(crate) fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut src = e.source();
    while let Some(s) = src {
        let s_text = s.to_string();
        if !text.contains(&s_text) {
            text.push_str(": ");
            text.push_str(&s_text);
        }
        src = s.source();
    }
    text
}
