//! `keelson run` (and `keelson-proxy run`): start the enabled roles, serve
//! health and metrics, tell systemd when ready, and shut everything down in
//! order on a signal. The binary names its node role ([`NodeRole`]).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use prometheus::Registry;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::apiclient::{self, ClientSettings};
use crate::config::{self, Config};
use crate::introspection::Introspection;
use crate::observability::{self, Health};
use crate::role::RoleContext;
use crate::{lifecycle, proxy};

/// Why `keelson run` stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// A role's API client could not be built (bad kubeconfig). The text
    /// holds the whole cause, once: no `source` for a chain to repeat.
    #[error("{role} role: {reason}")]
    Client {
        /// Which role.
        role: &'static str,
        /// The reason, with its causes.
        reason: String,
    },
    /// A role has no credentials: no kubeconfig was given for it and none
    /// could be inferred.
    #[error("{role} role: no credentials: give {how}; {found}")]
    NoCredentials {
        /// Which role.
        role: &'static str,
        /// Which setting gives them, and why another role's do not do.
        how: String,
        /// What keelson fell back on and why it was unusable.
        found: String,
    },
    /// The node's credentials could not be set up (kubeconfig, certificate
    /// store); the text holds the whole cause.
    #[error("node role: {0}")]
    Credentials(String),
    /// The configuration enables the node role in a binary without it.
    #[error(
        "node role: this binary has none (keelson-proxy runs the proxy role alone); run keelson for the node role"
    )]
    NoNodeRole,
    /// The health or metrics server could not listen.
    #[error(transparent)]
    Serve(#[from] observability::server::ServeError),
    /// A role stopped with an error.
    #[error("{role} role failed: {error}")]
    Role {
        /// Which role.
        role: &'static str,
        /// Its error.
        error: RoleError,
    },
    /// Shutdown took longer than `shutdownTimeout`.
    #[error("shutdown did not finish within {0:?}")]
    ShutdownTimeout(Duration),
}

/// Why a role stopped.
#[derive(Debug, thiserror::Error)]
pub enum RoleError {
    /// The node role failed.
    #[error(transparent)]
    Node(#[from] keelson_node::NodeError),
    /// The proxy role failed.
    #[error(transparent)]
    Proxy(#[from] proxy::ProxyError),
    /// The role's task panicked.
    #[error(transparent)]
    Panicked(#[from] tokio::task::JoinError),
}

/// What the process needs to start a node role.
pub struct NodeStart<'a> {
    /// The effective configuration (its node role enabled).
    pub config: &'a Config,
    /// This node's name.
    pub node_name: &'a str,
    /// The shared health registry.
    pub health: &'a Health,
    /// The shared metrics registry.
    pub registry: &'a Registry,
    /// Stops the credential machinery (rotation, bootstrap).
    pub shutdown: CancellationToken,
    /// Where the role's API calls are logged for `keelson diagnose`.
    pub introspection: &'a Introspection,
}

/// A node role a binary can start (`crate::node_role`: kubelet's, or
/// none). What the binary never names, the linker leaves out.
pub trait NodeRole: Sized + Send + 'static {
    /// Sets up the node's credentials and API client; a broken kubeconfig
    /// is a start-up error.
    fn start(start: NodeStart<'_>) -> impl Future<Output = Result<Self, RunError>>;
    /// The API client the role's context carries.
    fn client(&self) -> kube::Client;
    /// Runs the role until `ctx.shutdown`.
    fn run(self, ctx: RoleContext) -> impl Future<Output = Result<(), RoleError>> + Send;
}

/// What `keelson diagnose` needs of this daemon's start: its effective
/// configuration and the kubeconfigs its command line may have given.
fn started_with(
    config: &Config,
    files: &[std::path::PathBuf],
) -> crate::introspection::types::StartedWith {
    let path = |p: &Option<std::path::PathBuf>| p.as_ref().map(|p| p.display().to_string());
    crate::introspection::types::StartedWith {
        files: files.iter().map(|f| f.display().to_string()).collect(),
        node_kubeconfig: path(&config.node.kubeconfig).filter(|_| config.node.enabled),
        proxy_kubeconfig: path(&config.proxy.client_connection.kubeconfig)
            .filter(|_| config.proxy.enabled),
        config: config.to_yaml(),
    }
}

/// How the proxy role gets credentials. With the node role, `--kubeconfig`
/// is the node's, whose rights (the Node authorizer's) do not cover what
/// kube-proxy watches; the roles never share credentials.
fn proxy_credentials(config: &Config) -> String {
    const FILE: &str = "(or proxy.clientConnection.kubeconfig) with kube-proxy's rights";
    if !config.node.enabled {
        return format!("--kubeconfig FILE {FILE}");
    }
    let node = match &config.node.kubeconfig {
        Some(p) => format!("the node's kubeconfig {}", p.display()),
        None => "the node's credentials".to_string(),
    };
    format!(
        "--proxy-kubeconfig FILE {FILE}; {node} is not used for the proxy role, as a node's rights do not cover the Services and EndpointSlices it watches"
    )
}

/// Runs until `shutdown` is cancelled (or a role fails). `files` are the
/// configuration files `config` was read from, for `keelson diagnose`.
/// `N` is the binary's node role, started when `config` enables it.
pub async fn run<N: NodeRole>(
    config: Config,
    files: &[std::path::PathBuf],
    shutdown: CancellationToken,
) -> Result<(), RunError> {
    let config = Arc::new(config);
    let node_name = config.effective_node_name();
    let registry = observability::metrics::new_registry();
    let health = Health::new();
    let introspection = Introspection::new(&node_name);
    introspection.set_started_with(started_with(&config, files));
    tracing::info!(
        node = %node_name,
        version = crate::version::KEELSON_VERSION,
        kubernetes = crate::version::KUBERNETES_VERSION,
        node_role = config.node.enabled,
        proxy_role = config.proxy.enabled,
        "starting keelson"
    );

    // kubelet and kube-proxy set their own OOM score first; with both
    // roles, kubelet's setting is the process's.
    lifecycle::apply_oom_score_adj(if config.node.enabled {
        config.node.oom_score_adj
    } else {
        config.proxy.oom_score_adj
    });
    if config.node.enabled
        && config.proxy.enabled
        && config.node.kubeconfig.is_some()
        && config.node.kubeconfig == config.proxy.client_connection.kubeconfig
    {
        tracing::warn!(
            kubeconfig = %config.node.kubeconfig.as_deref().map(|p| p.display().to_string()).unwrap_or_default(),
            "both roles use the same kubeconfig: the proxy role then has the node's rights, which do not cover listing Services and EndpointSlices on a cluster with the Node authorizer; give proxy.clientConnection.kubeconfig (or --proxy-kubeconfig) kube-proxy's credentials"
        );
    }

    // Build clients first: a broken kubeconfig is a start-up error.
    // The node's client may manage its certificate (bootstrap, rotation):
    // kubelet's wiring, in `certificates::node`.
    let node_role = if config.node.enabled {
        Some(
            N::start(NodeStart {
                config: &config,
                node_name: &node_name,
                health: &health,
                registry: &registry,
                shutdown: shutdown.child_token(),
                introspection: &introspection,
            })
            .await?,
        )
    } else {
        None
    };
    let proxy_client = if config.proxy.enabled {
        Some(
            apiclient::build_client_logged(
                &ClientSettings {
                    kubeconfig: config.proxy.client_connection.kubeconfig.as_deref(),
                    qps: config.proxy.client_connection.qps,
                    burst: u32::try_from(config.proxy.client_connection.burst).unwrap_or(0),
                    role: "proxy",
                },
                Some(introspection.api_log()),
            )
            .await
            .map_err(|e| match e {
                apiclient::ClientError::Infer(found) => RunError::NoCredentials {
                    role: "proxy",
                    how: proxy_credentials(&config),
                    found,
                },
                e => RunError::Client {
                    role: "proxy",
                    reason: crate::error_chain::error_chain(&e),
                },
            })?,
        )
    } else {
        None
    };

    let servers_stop = CancellationToken::new();
    observability::server::start(
        config
            .effective_healthz_bind_address()
            .and_then(config::socket_addr),
        config::socket_addr(&config.metrics_bind_address),
        health.clone(),
        registry.clone(),
        servers_stop.clone(),
    )
    .await?;
    // Read-only state for `keelson diagnose`; a socket that cannot be
    // served costs diagnose its daemon view, never the node its agent.
    if let Some(path) = config.effective_diagnose_socket()
        && let Err(e) =
            crate::introspection::server::start(&path, introspection.clone(), servers_stop.clone())
                .await
    {
        tracing::warn!(error = %e, "keelson diagnose will not see this daemon's state");
    }

    let roles_stop = shutdown.child_token();
    let mut roles: JoinSet<(&'static str, Result<(), RoleError>)> = JoinSet::new();
    let ctx = |client: kube::Client| RoleContext {
        config: config.clone(),
        node_name: node_name.clone(),
        client,
        registry: registry.clone(),
        health: health.clone(),
        introspection: introspection.clone(),
        shutdown: roles_stop.clone(),
    };
    if let Some(node) = node_role {
        let c = ctx(node.client());
        roles.spawn(async move { ("node", node.run(c).await) });
    }
    if let Some(client) = proxy_client {
        let c = ctx(client);
        roles.spawn(async move { ("proxy", proxy::run(c).await.map_err(RoleError::from)) });
    }
    lifecycle::notify_ready();
    lifecycle::notify_status("running");

    // Wait for the shutdown signal, or for a role to stop on its own.
    let mut failure = None;
    tokio::select! {
        _ = shutdown.cancelled() => {}
        Some(done) = roles.join_next() => {
            match done {
                Ok((role, Err(error))) => {
                    tracing::error!(role, error = %error, "role failed; shutting down");
                    failure = Some(RunError::Role { role, error });
                }
                Ok((role, Ok(()))) => tracing::warn!(role, "role stopped; shutting down"),
                Err(e) => {
                    tracing::error!(error = %e, "role task panicked; shutting down");
                    failure = Some(RunError::Role { role: "unknown", error: e.into() });
                }
            }
        }
    }
    lifecycle::notify_stopping();
    roles_stop.cancel();
    let limit = config.shutdown_timeout.get();
    let drained = tokio::time::timeout(limit, async {
        while let Some(done) = roles.join_next().await {
            match done {
                Ok((role, Ok(()))) => tracing::info!(role, "role stopped"),
                Ok((role, Err(e))) => {
                    tracing::warn!(role, error = %e, "role stopped with an error")
                }
                Err(e) => tracing::warn!(error = %e, "role task ended abnormally"),
            }
        }
    })
    .await;
    servers_stop.cancel();
    if drained.is_err() {
        roles.abort_all();
        tracing::error!(timeout = ?limit, "roles did not stop in time");
        return Err(failure.unwrap_or(RunError::ShutdownTimeout(limit)));
    }
    tracing::info!("keelson stopped");
    match failure {
        Some(f) => Err(f),
        None => Ok(()),
    }
}
