//! The interface every data plane implements.
//!
//! A backend turns the model's [`ProxyDiff`] into kernel state in one
//! atomic step and remembers what it wrote, so the next sync sends only the
//! difference. Contract:
//!
//! - [`Backend::sync`] programs exactly the changes of a diff. It is atomic:
//!   on `Err` the kernel keeps the previous state and the backend's memory of
//!   what it wrote is unchanged (the caller does not commit the diff and will
//!   send the same changes again, merged with newer ones).
//! - [`Backend::full_sync`] makes the kernel equal to a whole snapshot: at
//!   start (adopting or replacing what a previous instance left) and every
//!   `syncPeriod`. It should verify cheaply and rewrite only what differs;
//!   traffic to unchanged services must never see a gap.
//! - [`Backend::cleanup`] removes everything the backend ever installed
//!   (`keelson` uninstall / mode switch).
//!
//! Backends are synchronous: their work is a few system calls per sync; the
//! sync loop runs them on a blocking thread.

use crate::model::{ProxyDiff, ProxySnapshot};

/// What one successful sync did, for logs, metrics and the benchmark.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SyncOutcome {
    /// Kernel objects (rules, chains, set/map elements, BPF map entries)
    /// added, replaced or deleted.
    pub objects_changed: usize,
    /// Netlink messages / syscalls sent.
    pub messages: usize,
    /// A full sync found the kernel state differing from memory and repaired it.
    pub repaired: bool,
}

/// Why a backend could not program a change. The previous state stays.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// The kernel rejected the transaction (message and errno as reported).
    #[error("kernel refused {what}: {message}")]
    Refused {
        /// What was being programmed.
        what: String,
        /// The kernel's / netlink's message.
        message: String,
        /// errno, when the kernel gave one.
        errno: Option<i32>,
    },
    /// The kernel lacks something the backend needs (module, hook, map type).
    #[error("unsupported by this kernel: {0}")]
    Unsupported(String),
    /// Talking to the kernel failed (socket, namespace, permissions).
    #[error("{context}: {source}")]
    Io {
        /// What we were doing.
        context: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// The desired state cannot be expressed (a bug or unsupported input).
    #[error("{0}")]
    Invalid(String),
}

impl BackendError {
    /// A short reason for Events and metrics labels.
    pub fn reason(&self) -> &'static str {
        match self {
            BackendError::Refused { .. } => "KernelRefused",
            BackendError::Unsupported(_) => "Unsupported",
            BackendError::Io { .. } => "IOError",
            BackendError::Invalid(_) => "InvalidState",
        }
    }
}

/// A data plane: nftables, eBPF (socket LB + nftables for north-south), or a
/// test double.
pub trait Backend: Send {
    /// Short name for logs (`nftables`, `ebpf`).
    fn name(&self) -> &'static str;

    /// Programs the changes of `diff` atomically.
    fn sync(&mut self, diff: &ProxyDiff) -> Result<SyncOutcome, BackendError>;

    /// Makes the kernel state equal to `snapshot` (start and `syncPeriod`).
    fn full_sync(&mut self, snapshot: &ProxySnapshot) -> Result<SyncOutcome, BackendError>;

    /// Removes everything this backend installs.
    fn cleanup(&mut self) -> Result<(), BackendError>;
}
