//! What a diagnosis reads from: the configuration (node name, sockets,
//! thresholds), the API (read-only), the daemon when it answers, and the
//! container runtime.

use std::path::PathBuf;
use std::time::SystemTime;

use keelson_cri::RuntimeClient;

use super::api::ReadApi;
use super::daemon::{Daemon, DaemonError};
use super::report::{DaemonStatus, Link, Report, Target};
use crate::config::Config;

/// Everything a chain may consult.
pub struct Context {
    /// The effective configuration.
    pub config: Config,
    /// This node's name.
    pub node: String,
    /// The API, when a client could be built.
    pub api: Option<ReadApi>,
    /// Why there is no API client.
    pub api_error: Option<String>,
    /// The daemon, or why it does not answer.
    pub daemon: Result<Daemon, DaemonError>,
    /// The socket asked.
    pub socket: Option<PathBuf>,
    /// The container runtime (lazy: an unreachable runtime shows in its calls).
    pub cri: Option<RuntimeClient>,
    /// `--since`.
    pub since: Option<SystemTime>,
    /// `--probe`.
    pub probe: bool,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("node", &self.node)
            .finish_non_exhaustive()
    }
}

impl Context {
    /// The daemon, if it answered.
    pub fn daemon(&self) -> Option<&Daemon> {
        self.daemon.as_ref().ok()
    }

    /// The daemon's status line for the report.
    pub fn daemon_status(&self) -> DaemonStatus {
        let socket = self
            .socket
            .as_ref()
            .map(|p| p.display().to_string())
            .unwrap_or_else(|| "(none configured)".to_string());
        match &self.daemon {
            Ok(d) => DaemonStatus {
                running: true,
                socket,
                version: Some(d.info.version.clone()),
                pid: Some(d.info.pid),
                error: None,
            },
            Err(e) => DaemonStatus {
                running: false,
                socket,
                version: None,
                pid: None,
                error: Some(e.to_string()),
            },
        }
    }

    /// The report of a chain on `target`: this node, the daemon's status
    /// and the permissions the API refused on the way.
    pub fn report(&self, target: Target, links: Vec<Link>) -> Report {
        let missing = self.api.as_ref().map(|a| a.missing()).unwrap_or_default();
        Report::new(target, &self.node, self.daemon_status(), links, missing)
    }
}
