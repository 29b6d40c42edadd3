//! Serves [`Introspection`] on a Unix socket, read-only: `GET` requests
//! only (any other method gets 405), owner root, mode 0600 (the node's
//! private state: pod logs excerpts, probe output, request errors). A
//! stale socket left by a killed daemon is replaced; a live one (another
//! keelson answering) is an error.
//!
//! Routes (JSON, [`super::types`]): `/v1/info`, `/v1/node`,
//! `/v1/pods/{namespace}/{name}`, `/v1/services/{namespace}/{name}`,
//! `/v1/timeline?since=RFC3339&kind=&namespace=&name=&uid=`.

use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};

use axum::Json;
use axum::Router;
use axum::extract::{Path as UrlPath, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use tokio_util::sync::CancellationToken;

use super::Introspection;
use super::timeline::Filter;
use super::types::{ErrorBody, NodeState, ServiceState};

/// Why the socket could not be served.
#[derive(Debug, thiserror::Error)]
pub enum SocketError {
    /// The path is taken by a live daemon or by something that is not a socket.
    #[error("diagnoseSocket {path}: {reason}")]
    InUse {
        /// The path.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// Creating, binding or securing the socket failed.
    #[error("diagnoseSocket {path}: {source}")]
    Io {
        /// The path.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}

fn not_found(what: String) -> Response {
    (StatusCode::NOT_FOUND, Json(ErrorBody { error: what })).into_response()
}

async fn info(State(s): State<Introspection>) -> Response {
    Json(s.info()).into_response()
}

async fn node(State(s): State<Introspection>) -> Response {
    match s.node() {
        Some(n) => Json(n.node()).into_response(),
        None => Json(NodeState::default()).into_response(),
    }
}

async fn pod(
    State(s): State<Introspection>,
    UrlPath((namespace, name)): UrlPath<(String, String)>,
) -> Response {
    let Some(n) = s.node() else {
        return not_found("the node role does not run in this daemon".into());
    };
    match n.pod(&namespace, &name) {
        Some(p) => Json(p).into_response(),
        None => not_found(format!("pod {namespace}/{name} is not known to this node")),
    }
}

async fn service(
    State(s): State<Introspection>,
    UrlPath((namespace, name)): UrlPath<(String, String)>,
) -> Response {
    match s.proxy() {
        Some(p) => Json(p.service(&namespace, &name)).into_response(),
        None => Json(ServiceState::default()).into_response(),
    }
}

#[derive(Debug, serde::Deserialize, Default)]
struct TimelineQuery {
    since: Option<String>,
    kind: Option<String>,
    namespace: Option<String>,
    name: Option<String>,
    uid: Option<String>,
}

async fn timeline(State(s): State<Introspection>, Query(q): Query<TimelineQuery>) -> Response {
    let since = match q.since.as_deref().map(str::parse::<jiff::Timestamp>) {
        None => None,
        Some(Ok(t)) => Some(std::time::SystemTime::from(t)),
        Some(Err(e)) => {
            return (
                StatusCode::BAD_REQUEST,
                Json(ErrorBody {
                    error: format!("since: {e}"),
                }),
            )
                .into_response();
        }
    };
    let filter = Filter {
        since,
        kind: q.kind,
        namespace: q.namespace,
        name: q.name,
        uid: q.uid,
    };
    Json(s.timeline().query(&filter)).into_response()
}

/// The routes (for tests over any transport).
pub fn router(state: Introspection) -> Router {
    Router::new()
        .route("/v1/info", get(info))
        .route("/v1/node", get(node))
        .route("/v1/pods/{namespace}/{name}", get(pod))
        .route("/v1/services/{namespace}/{name}", get(service))
        .route("/v1/timeline", get(timeline))
        .fallback(|| async { not_found("no such path".into()) })
        .with_state(state)
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> SocketError + '_ {
    move |source| SocketError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Removes a socket file nobody answers on; refuses to touch anything else.
fn clear_stale(path: &Path) -> Result<(), SocketError> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io_err(path)(e)),
    };
    if !meta.file_type().is_socket() {
        return Err(SocketError::InUse {
            path: path.to_path_buf(),
            reason: "exists and is not a socket".into(),
        });
    }
    if std::os::unix::net::UnixStream::connect(path).is_ok() {
        return Err(SocketError::InUse {
            path: path.to_path_buf(),
            reason: "another process answers on it (is another keelson running?)".into(),
        });
    }
    std::fs::remove_file(path).map_err(io_err(path))
}

/// Binds `path` (mode 0600) and serves until `shutdown`; the socket file
/// is removed when serving ends.
pub async fn start(
    path: &Path,
    state: Introspection,
    shutdown: CancellationToken,
) -> Result<(), SocketError> {
    if let Some(dir) = path.parent()
        && !dir.as_os_str().is_empty()
        && !dir.exists()
    {
        std::fs::create_dir_all(dir).map_err(io_err(path))?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .map_err(io_err(path))?;
    }
    clear_stale(path)?;
    // The file is created with the process umask; narrow it before the
    // first connection can be accepted.
    let listener = tokio::net::UnixListener::bind(path).map_err(io_err(path))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(io_err(path))?;
    tracing::info!(socket = %path.display(), "serving diagnose state");
    let owned = path.to_path_buf();
    tokio::spawn(async move {
        let res = axum::serve(listener, router(state))
            .with_graceful_shutdown(async move { shutdown.cancelled().await })
            .await;
        if let Err(e) = res {
            tracing::warn!(error = %e, "diagnose socket server failed");
        }
        let _ = std::fs::remove_file(&owned);
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn serves_get_only_with_private_permissions_and_replaces_a_stale_socket() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("sub").join("diagnose.sock");
        // A stale socket file from a killed daemon.
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        drop(std::os::unix::net::UnixListener::bind(&path).expect("stale bind"));
        let stop = CancellationToken::new();
        start(&path, Introspection::new("n1"), stop.clone())
            .await
            .expect("serve");
        let mode = std::fs::metadata(&path)
            .expect("socket")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        // A second daemon on the same path is refused.
        let again = start(&path, Introspection::new("n1"), stop.clone()).await;
        assert!(matches!(again, Err(SocketError::InUse { .. })), "{again:?}");

        let ask = |method: &'static str, uri: &'static str| {
            let path = path.clone();
            async move {
                use tokio::io::{AsyncReadExt, AsyncWriteExt};
                let mut s = tokio::net::UnixStream::connect(&path)
                    .await
                    .expect("connect");
                s.write_all(
                    format!("{method} {uri} HTTP/1.1\r\nHost: keelson\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                        .as_bytes(),
                )
                .await
                .expect("write");
                let mut out = String::new();
                s.read_to_string(&mut out).await.expect("read");
                out
            }
        };
        let info = ask("GET", "/v1/info").await;
        assert!(info.starts_with("HTTP/1.1 200"), "{info}");
        assert!(info.contains("\"nodeName\":\"n1\""), "{info}");
        let post = ask("POST", "/v1/info").await;
        assert!(post.starts_with("HTTP/1.1 405"), "{post}");
        let pod = ask("GET", "/v1/pods/default/web").await;
        assert!(pod.starts_with("HTTP/1.1 404"), "{pod}");
        let bad = ask("GET", "/v1/timeline?since=yesterday").await;
        assert!(bad.starts_with("HTTP/1.1 400"), "{bad}");
        stop.cancel();
        // The socket file goes when serving ends.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while path.exists() {
            assert!(
                std::time::Instant::now() < deadline,
                "socket file left behind"
            );
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }
}
