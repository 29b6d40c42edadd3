//! `keelson diagnose`: the node's end of every "why is it not working"
//! chain, answered in one command, read-only.
//!
//! - `keelson diagnose pod NS/NAME`: bound, admitted, volumes, sandbox,
//!   images, containers, probes, readiness gates, eviction risk
//!   ([`pod`]);
//! - `keelson diagnose node`: runtime, CNI, pressure, API server, Lease,
//!   client certificate, clock, cgroup driver, Ready ([`node`]);
//! - `keelson diagnose service NS/NAME[:PORT]`: the Service, its
//!   endpoints, this node's choice, the kernel's rules (and in eBPF mode
//!   the socket LB's maps, [`socket_lb`]) against the model, conntrack,
//!   and with `--probe` real connections and UDP datagrams ([`service`],
//!   [`probe`]).
//!
//! Sources: the API server (get and list only, [`api`]), the running
//! daemon's state on its Unix socket when it answers ([`daemon`]; the
//! daemon side is [`crate::introspection`]), the container runtime (CRI
//! List/Status calls, [`runtime`]), the kernel (nftables and conntrack
//! over netlink, the socket LB's pinned BPF maps; reads only). Output: text ([`render`]) or the JSON of
//! [`report`] (`-o json`, documented in docs/diagnose.md).

pub mod api;
pub mod certificate;
pub mod context;
pub mod daemon;
pub mod history;
pub mod logs;
pub mod node;
pub mod pod;
pub mod probe;
pub mod render;
pub mod report;
pub mod runtime;
pub mod service;
pub mod socket_lb;
pub mod thresholds;
pub mod words;

use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use keelson_cri::{ClientConfig, RuntimeClient};

use crate::apiclient::{ClientSettings, build_client};
use crate::config::Config;
use crate::introspection::types::StartedWith;
use context::Context;
use report::{Mark, Report};

/// Where `keelson diagnose` looks for the configuration when `--config` is
/// not given (the packaged location); defaults apply without it.
pub const DEFAULT_CONFIG: &str = "/etc/keelson/config.yaml";

/// Output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Output {
    /// Human text.
    #[default]
    Text,
    /// The JSON report (docs/diagnose.md).
    Json,
}

/// What to diagnose.
#[derive(Debug, Clone, PartialEq, Eq, clap::Subcommand)]
pub enum What {
    /// One pod on this node: NAMESPACE/NAME.
    Pod {
        /// NAMESPACE/NAME.
        name: String,
    },
    /// This node's Ready chain.
    Node,
    /// A Service as this node's proxy sees it: NAMESPACE/NAME[:PORT].
    Service {
        /// NAMESPACE/NAME, optionally `:PORT` (a port name or number).
        name: String,
        /// Also probe from this node the ClusterIP and each endpoint
        /// (at most 16): a TCP connection, or for UDP one datagram and its
        /// reply (silence shows as "no reply", not as a failure); SCTP
        /// is not probed.
        #[arg(long)]
        probe: bool,
    },
}

/// `keelson diagnose` options.
#[derive(Debug, Clone, clap::Args)]
pub struct DiagnoseArgs {
    /// What to diagnose.
    #[command(subcommand)]
    pub what: What,
    /// The daemon's configuration file (node name, sockets, thresholds).
    /// Default: /etc/keelson/config.yaml when it exists.
    #[arg(long, value_name = "FILE", global = true)]
    pub config: Option<PathBuf>,
    /// Credentials to read the API with (default: the node's kubeconfig;
    /// for `service`, the proxy role's when it runs).
    #[arg(long, value_name = "FILE", global = true)]
    pub kubeconfig: Option<PathBuf>,
    /// The daemon's diagnose socket (default: `diagnoseSocket` of the
    /// configuration).
    #[arg(long, value_name = "PATH", global = true)]
    pub socket: Option<PathBuf>,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value_t = Output::Text, global = true)]
    pub output: Output,
    /// Also show the timeline of this long (e.g. `10m`): Events,
    /// keelson's own records and its API writes, in one ordered list.
    #[arg(long, value_name = "DURATION", global = true)]
    pub since: Option<String>,
    /// How long one API request may take.
    #[arg(long, value_name = "DURATION", default_value = "10s", global = true)]
    pub request_timeout: String,
}

/// Why diagnose could not run at all.
#[derive(Debug, thiserror::Error)]
pub enum DiagnoseError {
    /// Bad command line or configuration.
    #[error("{0}")]
    Usage(String),
    /// The object does not exist (or is not on this node).
    #[error(transparent)]
    Subject(#[from] SubjectError),
}

/// Why the pod or Service asked about cannot be diagnosed (a one-line
/// answer instead of a report).
#[derive(Debug, thiserror::Error)]
pub enum SubjectError {
    /// The API says it does not exist.
    #[error("{kind} {namespace}/{name} not found")]
    NotFound {
        /// `pod` or `service`.
        kind: &'static str,
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
    },
    /// The node's identity may not see the pod, and the daemon does not hold it.
    #[error(
        "pod {namespace}/{name}: not on node {node} (the API server does not show it to this node's identity: {reason})"
    )]
    PodNotOnNode {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// This node.
        node: String,
        /// The API's refusal.
        reason: String,
    },
    /// Neither the API nor the daemon knows the pod.
    #[error(
        "pod {namespace}/{name}: the API server cannot be read ({reason}) and the keelson daemon does not know the pod"
    )]
    PodUnreadable {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// Why the API cannot be read.
        reason: String,
    },
    /// No API client for a Service.
    #[error("service {namespace}/{name}: no API client ({reason})")]
    NoApiClient {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// Why there is none.
        reason: String,
    },
    /// The node's identity may not list Services.
    #[error("service {namespace}/{name}: {reason}; a rule that grants it: {rule}")]
    ServiceForbidden {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// The API's refusal.
        reason: String,
        /// An RBAC rule that would allow it.
        rule: String,
    },
    /// The API cannot be read for a Service.
    #[error("service {namespace}/{name}: the API server cannot be read: {reason}")]
    ServiceUnreadable {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// Why.
        reason: String,
    },
    /// `NAMESPACE/NAME:PORT` names no port of the Service.
    #[error("service {namespace}/{name} has no port {port} (ports: {ports})")]
    NoSuchPort {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// The port asked.
        port: String,
        /// The Service's ports.
        ports: String,
    },
}

fn split_name(text: &str, what: &str) -> Result<(String, String), DiagnoseError> {
    match text.split_once('/') {
        Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => {
            Ok((ns.to_string(), name.to_string()))
        }
        _ => Err(DiagnoseError::Usage(format!(
            "{what} must be given as NAMESPACE/NAME, got {text:?}"
        ))),
    }
}

fn duration(text: &str, flag: &str) -> Result<Duration, DiagnoseError> {
    crate::config::KubeDuration::parse(text)
        .map(|d| d.get())
        .map_err(|e| DiagnoseError::Usage(format!("{flag} {text:?}: {e}")))
}

/// Builds the context: configuration, API client, daemon, runtime.
///
/// The configuration is `--config`, else the running daemon's (it hands
/// over what it runs with on its socket: a command line's `--kubeconfig`
/// is in no file), else [`DEFAULT_CONFIG`], else the defaults. The
/// credentials are `--kubeconfig`, else the configuration's, else the
/// daemon's (also for the links that read the kubeconfig itself).
pub async fn context(args: &DiagnoseArgs) -> Result<Context, DiagnoseError> {
    let local = match &args.config {
        Some(p) => Some(Config::load(p).map_err(|e| DiagnoseError::Usage(e.to_string()))?),
        None if std::path::Path::new(DEFAULT_CONFIG).is_file() => Some(
            Config::load(std::path::Path::new(DEFAULT_CONFIG))
                .map_err(|e| DiagnoseError::Usage(e.to_string()))?,
        ),
        None => None,
    };
    let timeout = duration(&args.request_timeout, "--request-timeout")?;
    let since = match &args.since {
        Some(s) => Some(SystemTime::now() - duration(s, "--since")?),
        None => None,
    };
    let socket = args.socket.clone().or_else(|| {
        local.as_ref().map_or_else(
            || Config::default().effective_diagnose_socket(),
            |c| c.effective_diagnose_socket(),
        )
    });
    let daemon = match &socket {
        Some(s) => daemon::Daemon::connect(s).await,
        None => Err(daemon::DaemonError::NoSocket),
    };
    let started = daemon
        .as_ref()
        .ok()
        .and_then(|d| d.info.started_with.clone());
    let config = match (args.config.is_some(), local, &started) {
        (true, Some(c), _) => c,
        (false, local, Some(s)) => match Config::from_yaml_str(&s.config) {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "the daemon's configuration does not load here");
                local.unwrap_or_default()
            }
        },
        (_, local, _) => local.unwrap_or_default(),
    };
    let config = with_daemon_credentials(config, started.as_ref());
    let kubeconfig = args
        .kubeconfig
        .clone()
        .or_else(|| role_kubeconfig(&args.what, &config));
    let (api, api_error) = match build_client(&ClientSettings {
        kubeconfig: kubeconfig.as_deref(),
        qps: 50.0,
        burst: 100,
        role: "diagnose",
    })
    .await
    {
        Ok(c) => (Some(api::ReadApi::new(c, timeout)), None),
        Err(e) => (None, Some(e.to_string())),
    };
    let cri = RuntimeClient::new_lazy(
        &config.node.container_runtime_endpoint,
        ClientConfig::with_request_timeout(timeout),
    )
    .ok();
    let node = match &daemon {
        Ok(d) if !d.info.node_name.is_empty() => d.info.node_name.clone(),
        _ => config.effective_node_name(),
    };
    Ok(Context {
        config,
        node,
        api,
        api_error,
        daemon,
        socket,
        cri,
        since,
        probe: matches!(args.what, What::Service { probe: true, .. }),
    })
}

/// The credentials of the role that sees `what`: for a Service the proxy
/// role's when it runs, else the node role's, else the proxy role's.
fn role_kubeconfig(what: &What, config: &Config) -> Option<PathBuf> {
    match what {
        What::Service { .. } if config.proxy.enabled => {
            config.proxy.client_connection.kubeconfig.clone()
        }
        _ if config.node.enabled => config.node.kubeconfig.clone(),
        _ => config.proxy.client_connection.kubeconfig.clone(),
    }
}

/// Fills the kubeconfigs `config` lacks with the daemon's: its command
/// line gave them (`--kubeconfig`, `--proxy-kubeconfig`).
fn with_daemon_credentials(mut config: Config, started: Option<&StartedWith>) -> Config {
    if let Some(s) = started {
        if config.node.kubeconfig.is_none() {
            config.node.kubeconfig = s.node_kubeconfig.as_ref().map(PathBuf::from);
        }
        if config.proxy.client_connection.kubeconfig.is_none() {
            config.proxy.client_connection.kubeconfig =
                s.proxy_kubeconfig.as_ref().map(PathBuf::from);
        }
    }
    config
}

/// Runs one diagnosis.
pub async fn diagnose(args: &DiagnoseArgs) -> Result<Report, DiagnoseError> {
    let target = match &args.what {
        What::Pod { name } => Some(split_name(name, "the pod")?),
        What::Service { name, .. } => {
            let (ns, rest) = split_name(name, "the service")?;
            Some((ns, rest))
        }
        What::Node => None,
    };
    let ctx = context(args).await?;
    match (&args.what, target) {
        (What::Pod { .. }, Some((ns, name))) => pod::diagnose(&ctx, &ns, &name)
            .await
            .map_err(DiagnoseError::from),
        (What::Service { .. }, Some((ns, rest))) => {
            let (name, port) = match rest.split_once(':') {
                Some((n, p)) if !p.is_empty() => (n.to_string(), Some(p.to_string())),
                _ => (rest.clone(), None),
            };
            service::diagnose(&ctx, &ns, &name, port.as_deref())
                .await
                .map_err(DiagnoseError::from)
        }
        _ => Ok(node::diagnose(&ctx).await),
    }
}

/// `keelson diagnose`: prints the report; the exit code is 0 when no link
/// failed, 1 when one did, 2 when diagnose could not run.
pub async fn run(args: DiagnoseArgs) -> u8 {
    match diagnose(&args).await {
        Ok(report) => {
            match args.output {
                Output::Text => print!("{}", render::text(&report)),
                Output::Json => match serde_json::to_string_pretty(&report) {
                    Ok(j) => println!("{j}"),
                    Err(e) => {
                        eprintln!("error: {e}");
                        return 2;
                    }
                },
            }
            if report.status == Mark::Failed { 1 } else { 0 }
        }
        Err(e) => {
            eprintln!("error: {e}");
            2
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_daemons_kubeconfigs_fill_what_the_configuration_lacks() {
        let started = StartedWith {
            node_kubeconfig: Some("/etc/kubernetes/kubelet.conf".into()),
            proxy_kubeconfig: Some("/etc/keelson/proxy.kubeconfig".into()),
            ..Default::default()
        };
        let c = with_daemon_credentials(Config::default(), Some(&started));
        let node = What::Node;
        let service = What::Service {
            name: "default/web".into(),
            probe: false,
        };
        assert_eq!(
            role_kubeconfig(&node, &c),
            Some(PathBuf::from("/etc/kubernetes/kubelet.conf"))
        );
        assert_eq!(
            role_kubeconfig(&service, &c),
            Some(PathBuf::from("/etc/keelson/proxy.kubeconfig"))
        );
        // A kubeconfig the configuration names wins.
        let mut own = Config::default();
        own.node.kubeconfig = Some("/mine".into());
        let c = with_daemon_credentials(own, Some(&started));
        assert_eq!(role_kubeconfig(&node, &c), Some(PathBuf::from("/mine")));
        assert_eq!(
            with_daemon_credentials(Config::default(), None)
                .node
                .kubeconfig,
            None
        );
    }

    #[test]
    fn names_must_be_namespaced() {
        assert_eq!(
            split_name("default/web", "the pod").expect("ok"),
            ("default".to_string(), "web".to_string())
        );
        for bad in ["web", "/web", "default/", "a/b/c"] {
            let e = split_name(bad, "the pod").expect_err(bad);
            assert!(e.to_string().contains("NAMESPACE/NAME"), "{e}");
        }
    }
}
