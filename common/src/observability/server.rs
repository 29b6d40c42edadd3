//! The local HTTP servers: `/healthz`, `/livez`, `/readyz` on
//! `healthzBindAddress` (kubelet's 127.0.0.1:10248) and `/metrics` on
//! `metricsBindAddress` (kube-proxy's 127.0.0.1:10249). When both addresses
//! are the same, one server answers everything.

use std::net::SocketAddr;

use axum::Router;
use axum::extract::{Path, Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use prometheus::Registry;
use tokio_util::sync::CancellationToken;

use super::health::{Health, ProbeKind};
use super::metrics;

/// Why a server could not start.
#[derive(Debug, thiserror::Error)]
#[error("cannot listen on {addr} for {what}: {source}")]
pub struct ServeError {
    /// The address.
    pub addr: SocketAddr,
    /// Which server.
    pub what: &'static str,
    /// The bind error.
    #[source]
    pub source: std::io::Error,
}

#[derive(Clone)]
struct AppState {
    health: Health,
    registry: Registry,
}

#[derive(serde::Deserialize, Default)]
struct HealthQuery {
    verbose: Option<String>,
    exclude: Option<String>,
}

fn health_answer(state: &AppState, kind: ProbeKind, q: &HealthQuery) -> Response {
    let verbose = q.verbose.is_some();
    let exclude: Vec<String> = q
        .exclude
        .as_deref()
        .map(|e| e.split(',').map(str::to_string).collect())
        .unwrap_or_default();
    let (ok, body) = state.health.render(kind, verbose, &exclude);
    let code = if ok {
        StatusCode::OK
    } else {
        StatusCode::INTERNAL_SERVER_ERROR
    };
    (
        code,
        [
            (header::CONTENT_TYPE, "text/plain; charset=utf-8"),
            (
                header::HeaderName::from_static("x-content-type-options"),
                "nosniff",
            ),
        ],
        body,
    )
        .into_response()
}

async fn healthz(State(s): State<AppState>, Query(q): Query<HealthQuery>) -> Response {
    health_answer(&s, ProbeKind::Liveness, &q)
}

async fn readyz(State(s): State<AppState>, Query(q): Query<HealthQuery>) -> Response {
    health_answer(&s, ProbeKind::Readiness, &q)
}

async fn healthz_one(State(s): State<AppState>, Path(name): Path<String>) -> Response {
    single(&s, ProbeKind::Liveness, &name)
}

async fn readyz_one(State(s): State<AppState>, Path(name): Path<String>) -> Response {
    single(&s, ProbeKind::Readiness, &name)
}

fn single(s: &AppState, kind: ProbeKind, name: &str) -> Response {
    match s.health.single(kind, name) {
        Some(Ok(())) => (StatusCode::OK, "ok").into_response(),
        Some(Err(e)) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("internal server error: {e}"),
        )
            .into_response(),
        None => (StatusCode::NOT_FOUND, "404 page not found").into_response(),
    }
}

async fn metrics_handler(State(s): State<AppState>) -> Response {
    (
        StatusCode::OK,
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        metrics::render(&s.registry),
    )
        .into_response()
}

fn health_routes(r: Router<AppState>) -> Router<AppState> {
    r.route("/healthz", get(healthz))
        .route("/livez", get(healthz))
        .route("/readyz", get(readyz))
        .route("/healthz/{name}", get(healthz_one))
        .route("/livez/{name}", get(healthz_one))
        .route("/readyz/{name}", get(readyz_one))
}

/// Binds the health and metrics listeners (an empty address disables that
/// server) and serves them until `shutdown`. Returns the bound addresses
/// (useful with port 0) once listening.
pub async fn start(
    healthz_addr: Option<SocketAddr>,
    metrics_addr: Option<SocketAddr>,
    health: Health,
    registry: Registry,
    shutdown: CancellationToken,
) -> Result<(Option<SocketAddr>, Option<SocketAddr>), ServeError> {
    let state = AppState { health, registry };
    // Port 0 asks for two distinct ephemeral ports, never one shared server.
    let same = healthz_addr.is_some_and(|a| a.port() != 0) && healthz_addr == metrics_addr;
    let mut bound = (None, None);
    if let Some(addr) = healthz_addr {
        let mut router = health_routes(Router::new());
        if same {
            router = router.route("/metrics", get(metrics_handler));
        }
        let local = serve(
            addr,
            "health",
            router.with_state(state.clone()),
            shutdown.clone(),
        )
        .await?;
        bound.0 = Some(local);
        if same {
            bound.1 = Some(local);
        }
    }
    if let Some(addr) = metrics_addr
        && !same
    {
        // kube-proxy's metrics server also answers /healthz.
        let router = health_routes(Router::new()).route("/metrics", get(metrics_handler));
        bound.1 = Some(serve(addr, "metrics", router.with_state(state), shutdown).await?);
    }
    Ok(bound)
}

async fn serve(
    addr: SocketAddr,
    what: &'static str,
    router: Router,
    shutdown: CancellationToken,
) -> Result<SocketAddr, ServeError> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| ServeError { addr, what, source })?;
    let local = listener
        .local_addr()
        .map_err(|source| ServeError { addr, what, source })?;
    tracing::info!(address = %local, server = what, "serving");
    tokio::spawn(async move {
        let res = axum::serve(listener, router)
            .with_graceful_shutdown(async move { shutdown.cancelled().await })
            .await;
        if let Err(e) = res {
            tracing::error!(error = %e, server = what, "http server failed");
        }
    });
    Ok(local)
}
