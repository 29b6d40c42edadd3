//! Running a prepared probe: one [`Prober`] per node (shared by every
//! worker) and one [`Action`] per worker, prepared when the container starts
//! so a probe run does no parsing or lookups.

use std::sync::Arc;
use std::time::Duration;

use crate::handlers::exec::{DynExec, probe_exec};
use crate::handlers::grpc::probe_grpc;
use crate::handlers::http::{HttpProber, HttpRequest};
use crate::handlers::tcp::probe_tcp;
use crate::result::ProbeResult;
use crate::spec::ProbeHandler;

/// Upstream retries a probe whose handler errored this many times per run.
pub const MAX_PROBE_RETRIES: usize = 3;

/// What a worker runs each period.
#[derive(Debug, Clone)]
pub enum Action {
    /// Exec `command` in container `container_id`.
    Exec {
        /// Container instance.
        container_id: String,
        /// Expanded command.
        command: Vec<String>,
    },
    /// An HTTP GET.
    Http(Box<HttpRequest>),
    /// A TCP connect.
    Tcp {
        /// Target host.
        host: String,
        /// Target port.
        port: u16,
    },
    /// A gRPC health check.
    Grpc {
        /// Target host (the pod IP).
        host: String,
        /// Target port, as written in the probe.
        port: i32,
        /// Service name.
        service: String,
    },
    /// The probe cannot run; each run reports this error (upstream does the
    /// same for an unresolvable port or a probe without a handler).
    Errored(String),
}

impl Action {
    /// Prepares `handler` for container `container_id` of a pod at `pod_ip`.
    /// `missing_handler` names the container for the "missing probe handler"
    /// error (`<pod>_<namespace>(<uid>):<container>`).
    pub fn prepare(
        handler: &ProbeHandler,
        pod_ip: &str,
        container_id: &str,
        user_agent: &str,
        missing_handler: &str,
    ) -> Action {
        match handler {
            ProbeHandler::Exec { command } => Action::Exec {
                container_id: container_id.to_string(),
                command: command.clone(),
            },
            ProbeHandler::HttpGet(spec) => match HttpRequest::new(spec, pod_ip, user_agent) {
                Ok(request) => Action::Http(Box::new(request)),
                Err(e) => Action::Errored(e.to_string()),
            },
            ProbeHandler::TcpSocket { host, port } => match port {
                Ok(port) => Action::Tcp {
                    host: host.clone().unwrap_or_else(|| pod_ip.to_string()),
                    port: *port,
                },
                Err(e) => Action::Errored(e.to_string()),
            },
            ProbeHandler::Grpc { port, service } => Action::Grpc {
                host: pod_ip.to_string(),
                port: *port,
                service: service.clone(),
            },
            ProbeHandler::Missing => {
                Action::Errored(format!("missing probe handler for {missing_handler}"))
            }
        }
    }
}

/// Runs actions. Cheap to clone.
#[derive(Clone)]
pub struct Prober {
    exec: Arc<dyn DynExec>,
    http: HttpProber,
    user_agent: Arc<str>,
}

impl std::fmt::Debug for Prober {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prober")
            .field("user_agent", &self.user_agent)
            .finish_non_exhaustive()
    }
}

impl Prober {
    /// Creates a prober that runs exec probes through `exec` and identifies
    /// itself as `user_agent` (`kube-probe/1.36`).
    pub(crate) fn new(exec: Arc<dyn DynExec>, user_agent: &str) -> Result<Prober, rustls::Error> {
        Ok(Prober {
            exec,
            http: HttpProber::new()?,
            user_agent: Arc::from(user_agent),
        })
    }

    /// The `User-Agent` of HTTP and gRPC probes.
    pub fn user_agent(&self) -> &str {
        &self.user_agent
    }

    /// Runs `action` once.
    pub async fn run(&self, action: &Action, timeout: Duration) -> ProbeResult {
        match action {
            Action::Exec {
                container_id,
                command,
            } => probe_exec(&*self.exec, container_id, command, timeout).await,
            Action::Http(request) => self.http.probe(request, timeout).await,
            Action::Tcp { host, port } => probe_tcp(host, *port, timeout).await,
            Action::Grpc {
                host,
                port,
                service,
            } => probe_grpc(host, *port, service, timeout, &self.user_agent).await,
            Action::Errored(message) => ProbeResult::Unknown(message.clone()),
        }
    }

    /// Runs `action`, again while it errors, at most [`MAX_PROBE_RETRIES`]
    /// times (upstream `runProbeWithRetries`).
    pub async fn run_with_retries(&self, action: &Action, timeout: Duration) -> ProbeResult {
        let mut result = self.run(action, timeout).await;
        for _ in 1..MAX_PROBE_RETRIES {
            if !matches!(result, ProbeResult::Unknown(_)) || matches!(action, Action::Errored(_)) {
                break;
            }
            result = self.run(action, timeout).await;
        }
        result
    }
}
