//! Container logs: reading them for `kubectl logs` ([`reader`], over the
//! CRI log format of [`format`], the files of [`files`], followers woken by
//! [`watch`]) and rotating them ([`rotation`]), as kubelet's
//! `cri-client/pkg/logs` and `pkg/kubelet/logs` do.

pub mod files;
pub mod format;
pub mod options;
pub mod reader;
pub mod rotation;
pub mod watch;

pub use options::{LogOptions, OptionsError};
pub use reader::{ContainerRunning, LogError, LogRequest, read_logs};
pub use watch::DirWatcher;
