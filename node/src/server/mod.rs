//! The node API: kubelet's HTTPS server on `address:port` (10250), the
//! one the API server proxies `kubectl logs`, `exec`, `attach`,
//! `port-forward`, `get --raw /api/v1/nodes/<n>/proxy/...` and
//! metrics-server's scrapes to (`pkg/kubelet/server/server.go`).
//!
//! - [`serving_cert`]: the swappable serving certificate (files, or a
//!   self-signed one under `rootDir/pki/`);
//! - [`serving_bootstrap`]: `serverTLSBootstrap`, the certificate manager
//!   requesting and renewing it through `kubernetes.io/kubelet-serving`
//!   CSRs;
//! - [`listener`]: TLS (tlsMinVersion, tlsCipherSuites, client
//!   certificates requested), HTTP/1.1 with upgrades and HTTP/2;
//! - [`authn`], [`authz`]: kubelet's delegating authentication and
//!   authorization (TokenReview, SubjectAccessReview, caches);
//! - [`routes`]: the paths, with kubelet's answers; the handlers live in
//!   [`container_logs`], [`streaming`] (exec/attach/port-forward/run
//!   through CRI and the runtime's streaming server; WebSocket v5
//!   exec/attach through [`ws_translator`] and its SPDY client [`spdy`],
//!   WebSocket port-forward through [`ws_tunnel`]), [`basic`] (`/pods`,
//!   `/runningpods/`, `/healthz`, `/configz`) and [`stats_routes`]
//!   (`/stats/summary`, `/metrics/*`).

pub(crate) mod authn;
pub(crate) mod authz;
pub(crate) mod basic;
pub(crate) mod body;
pub(crate) mod checkpoint;
pub(crate) mod client_ca;
pub(crate) mod container_logs;
pub(crate) mod listener;
pub(crate) mod metrics;
pub(crate) mod mux;
pub(crate) mod remotecommand;
pub(crate) mod retry;
pub(crate) mod routes;
pub(crate) mod serving_bootstrap;
pub(crate) mod serving_cert;
pub(crate) mod slis;
pub(crate) mod spdy;
pub(crate) mod stats_routes;
pub(crate) mod streaming;
pub(crate) mod ttl_cache;
pub(crate) mod upgrade_proxy;
pub(crate) mod user;
pub(crate) mod ws_translator;
pub(crate) mod ws_tunnel;
pub(crate) mod wsstream;

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use keelson_cri::RuntimeClient;
use tokio::task::JoinSet;

pub use serving_cert::ServingCertificate;

use crate::NodeContext;
use crate::config::kubelet_api::AuthorizationMode;
use crate::pods::PodsHandle;
use crate::stats::StatsCache;

/// Why the node API could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// A certificate or key could not be read, made or used.
    #[error("node API certificate: {0}")]
    Certificate(String),
    /// The TLS settings could not be applied.
    #[error("node API TLS settings: {0}")]
    Tls(String),
    /// The address could not be bound.
    #[error("node API: cannot listen on {addr}: {error}")]
    Listen {
        /// The address.
        addr: SocketAddr,
        /// The bind error (in the text, so not also the source).
        error: std::io::Error,
    },
    /// No authentication method is configured.
    #[error(
        "node.authentication: no authentication method configured (enable x509.clientCAFile, webhook or anonymous)"
    )]
    NoAuthentication,
}

/// Filled in once the pod lifecycle has started (it waits for the
/// runtime); until then the API knows no pods.
pub type PodsSlot = Arc<OnceLock<PodsHandle>>;

/// What the handlers share.
pub struct NodeApi {
    /// Configuration, node name, client, registry, health, shutdown.
    pub ctx: NodeContext,
    /// The CRI client.
    pub cri: RuntimeClient,
    /// The pod lifecycle, once started.
    pub pods: PodsSlot,
    /// Node and pod statistics.
    pub stats: Arc<StatsCache>,
    /// Request metrics.
    pub metrics: metrics::ServerMetrics,
    /// Authentication (`None` on the read-only port).
    pub authn: Option<authn::Authenticator>,
    /// Authorization (`None` on the read-only port).
    pub authz: Option<authz::Authorizer>,
    /// Wakes `logs -f` followers.
    pub log_watcher: crate::logs::DirWatcher,
    /// The health checks as SLIs (`/metrics/slis`).
    pub slis: slis::Slis,
}

impl std::fmt::Debug for NodeApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeApi")
            .field("node", &self.ctx.node_name)
            .field("read_only", &self.authn.is_none())
            .finish_non_exhaustive()
    }
}

/// What the node API is started with.
#[derive(Debug, Clone)]
pub struct ServerDeps {
    /// The role context.
    pub ctx: NodeContext,
    /// The CRI client.
    pub cri: RuntimeClient,
    /// The pod lifecycle slot.
    pub pods: PodsSlot,
    /// Statistics.
    pub stats: Arc<StatsCache>,
    /// The node's addresses (self-signed serving certificate SANs).
    pub node_ips: Vec<IpAddr>,
    /// The node status (its `status.addresses`: the SANs requested with
    /// `serverTLSBootstrap`).
    pub status: crate::status::NodeStatusHandle,
}

/// How often certificate and CA files are re-read.
pub const FILE_RELOAD_PERIOD: Duration = Duration::from_secs(10);

/// Binds the node API (and the read-only port when set) and serves them
/// as tasks of `tasks` until shutdown. Returns the serving certificate
/// (for the certificate manager) and the bound secure address.
pub async fn start(
    deps: ServerDeps,
    tasks: &mut JoinSet<&'static str>,
) -> Result<(Arc<ServingCertificate>, SocketAddr), ServerError> {
    let cfg = deps.ctx.config.clone();
    let n = &*cfg;
    let serving = ServingCertificate::new();
    let mut names = vec![deps.ctx.node_name.clone()];
    if let Ok(h) = nix::unistd::gethostname()
        && let Ok(h) = h.into_string()
    {
        let h = h.to_lowercase();
        if !names.contains(&h) {
            names.push(h);
        }
    }
    if n.server_tls_bootstrap {
        serving_bootstrap::start(&deps.ctx, deps.status.clone(), &serving, tasks)?;
    } else {
        let (cert_file, key_file) = serving_cert::load_configured(
            &serving,
            n.tls_cert_file.as_deref(),
            n.tls_private_key_file.as_deref(),
            &n.root_dir,
            &names,
            &deps.node_ips,
        )?;
        let (serving, stop) = (serving.clone(), deps.ctx.shutdown.clone());
        tasks.spawn(async move {
            serving_cert::reload_files(serving, cert_file, key_file, FILE_RELOAD_PERIOD, stop)
                .await;
            "node-api-certificate-reload"
        });
    }
    let client_ca = match &n.authentication.x509.client_ca_file {
        Some(p) => {
            let ca = client_ca::ClientCa::load(p.clone())?;
            let (ca2, stop) = (ca.clone(), deps.ctx.shutdown.clone());
            tasks.spawn(async move {
                ca2.reload(FILE_RELOAD_PERIOD, stop).await;
                "node-api-client-ca-reload"
            });
            Some(ca)
        }
        None => None,
    };
    let a = &n.authentication;
    let authn = authn::Authenticator {
        x509: client_ca.clone(),
        webhook: a
            .webhook
            .enabled
            .then(|| authn::TokenWebhook::new(deps.ctx.client.clone(), a.webhook.cache_ttl.get())),
        anonymous: a.anonymous.enabled,
    };
    if authn.x509.is_none() && authn.webhook.is_none() && !authn.anonymous {
        return Err(ServerError::NoAuthentication);
    }
    let z = &n.authorization;
    let authz = match z.mode {
        AuthorizationMode::AlwaysAllow => authz::Authorizer::AlwaysAllow,
        AuthorizationMode::Webhook => authz::Authorizer::Webhook(authz::SarWebhook::new(
            deps.ctx.client.clone(),
            z.webhook.cache_authorized_ttl.get(),
            z.webhook.cache_unauthorized_ttl.get(),
        )),
    };
    let metrics = metrics::ServerMetrics::new(&deps.ctx.registry);
    let log_watcher = crate::logs::DirWatcher::start();
    let slis = slis::Slis::default();
    let tls = listener::tls_config(n, serving.clone(), client_ca.is_some())?;
    let ip: IpAddr = n.address.parse().unwrap_or(IpAddr::from([0, 0, 0, 0]));
    let port = u16::try_from(n.port).unwrap_or(10250);
    let secure = Arc::new(NodeApi {
        ctx: deps.ctx.clone(),
        cri: deps.cri.clone(),
        pods: deps.pods.clone(),
        stats: deps.stats.clone(),
        metrics: metrics.clone(),
        authn: Some(authn),
        authz: Some(authz),
        log_watcher: log_watcher.clone(),
        slis: slis.clone(),
    });
    let (l, addr) = listener::bind(SocketAddr::new(ip, port)).await?;
    tracing::info!(address = %addr, "node API listening (HTTPS)");
    {
        let stop = deps.ctx.shutdown.clone();
        tasks.spawn(async move {
            listener::serve(l, Some(tls), secure, stop).await;
            "node-api"
        });
    }
    if n.read_only_port != 0 {
        let ro_port = u16::try_from(n.read_only_port).unwrap_or(10255);
        let ro = Arc::new(NodeApi {
            ctx: deps.ctx.clone(),
            cri: deps.cri.clone(),
            pods: deps.pods.clone(),
            stats: deps.stats.clone(),
            metrics,
            authn: None,
            authz: None,
            log_watcher,
            slis,
        });
        let (l, ro_addr) = listener::bind(SocketAddr::new(ip, ro_port)).await?;
        tracing::info!(address = %ro_addr, "node API read-only port listening (HTTP, no authentication)");
        let stop = deps.ctx.shutdown.clone();
        tasks.spawn(async move {
            listener::serve(l, None, ro, stop).await;
            "node-api-read-only"
        });
    }
    Ok((serving, addr))
}
