//! The client side of the daemon's diagnose socket
//! ([`crate::introspection::server`]): plain HTTP/1.1 `GET`s over the Unix
//! socket, JSON bodies of [`crate::introspection::types`]. A daemon that
//! does not answer is not an error: diagnose says it is down and reads
//! CRI, the kernel and the API itself.

use std::path::{Path, PathBuf};
use std::time::Duration;

use http_body_util::BodyExt;
use hyper_util::rt::TokioIo;
use serde::de::DeserializeOwned;

use crate::introspection::types::{DaemonInfo, NodeState, PodState, ServiceState, TimelineRecord};

/// How long one request to the daemon may take.
const TIMEOUT: Duration = Duration::from_secs(5);

/// Why the daemon gave no answer (shown as the report's daemon status).
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// No socket is configured.
    #[error("no diagnoseSocket is configured")]
    NoSocket,
    /// Nothing listens on the socket.
    #[error("connect {}: {error}", socket.display())]
    Connect {
        /// The socket.
        socket: PathBuf,
        /// Why.
        error: std::io::Error,
    },
    /// The HTTP exchange failed.
    #[error(transparent)]
    Http(#[from] hyper::Error),
    /// The request could not be built.
    #[error(transparent)]
    Request(#[from] http::Error),
    /// No answer in time.
    #[error("no answer from {} within {TIMEOUT:?}", .0.display())]
    Timeout(PathBuf),
    /// An answer that is not the expected JSON.
    #[error("{path}: {error}")]
    Decode {
        /// The request path.
        path: String,
        /// Why.
        error: serde_json::Error,
    },
    /// An error status.
    #[error("{path}: HTTP {status}: {body}")]
    Status {
        /// The request path.
        path: String,
        /// The status code.
        status: u16,
        /// The answer's body.
        body: String,
    },
    /// The socket is some other server's.
    #[error("the socket does not serve /v1/info (not a keelson daemon?)")]
    NotKeelson,
}

/// A daemon that answered on its socket.
#[derive(Debug, Clone)]
pub struct Daemon {
    socket: PathBuf,
    /// What it said about itself.
    pub info: DaemonInfo,
}

/// Percent-encodes a query value (RFC 3986 unreserved characters kept).
fn encode(v: &str) -> String {
    v.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

async fn get_raw(socket: &Path, path: &str) -> Result<(u16, Vec<u8>), DaemonError> {
    let work = async {
        let stream = tokio::net::UnixStream::connect(socket)
            .await
            .map_err(|error| DaemonError::Connect {
                socket: socket.to_path_buf(),
                error,
            })?;
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        let req = http::Request::get(path)
            .header(http::header::HOST, "keelson")
            .body(http_body_util::Empty::<bytes::Bytes>::new())?;
        let resp = sender.send_request(req).await?;
        let status = resp.status().as_u16();
        let body = resp.into_body().collect().await?.to_bytes().to_vec();
        Ok((status, body))
    };
    tokio::time::timeout(TIMEOUT, work)
        .await
        .map_err(|_| DaemonError::Timeout(socket.to_path_buf()))?
}

async fn get_json<T: DeserializeOwned>(
    socket: &Path,
    path: &str,
) -> Result<Option<T>, DaemonError> {
    let (status, body) = get_raw(socket, path).await?;
    match status {
        200 => serde_json::from_slice(&body)
            .map(Some)
            .map_err(|error| DaemonError::Decode {
                path: path.to_string(),
                error,
            }),
        404 => Ok(None),
        status => Err(DaemonError::Status {
            path: path.to_string(),
            status,
            body: String::from_utf8_lossy(&body).into_owned(),
        }),
    }
}

impl Daemon {
    /// Asks the daemon on `socket` who it is; `Err` says why it is down.
    pub async fn connect(socket: &Path) -> Result<Daemon, DaemonError> {
        let info = get_json::<DaemonInfo>(socket, "/v1/info")
            .await?
            .ok_or(DaemonError::NotKeelson)?;
        Ok(Daemon {
            socket: socket.to_path_buf(),
            info,
        })
    }

    /// The node role's state.
    pub async fn node(&self) -> Result<NodeState, DaemonError> {
        Ok(get_json(&self.socket, "/v1/node")
            .await?
            .unwrap_or_default())
    }

    /// A pod, if the node holds it.
    pub async fn pod(&self, namespace: &str, name: &str) -> Result<Option<PodState>, DaemonError> {
        get_json(
            &self.socket,
            &format!("/v1/pods/{}/{}", encode(namespace), encode(name)),
        )
        .await
    }

    /// What the proxy role programmed for a Service.
    pub async fn service(&self, namespace: &str, name: &str) -> Result<ServiceState, DaemonError> {
        Ok(get_json(
            &self.socket,
            &format!("/v1/services/{}/{}", encode(namespace), encode(name)),
        )
        .await?
        .unwrap_or_default())
    }

    /// Timeline records about one object since `since` (RFC 3339).
    pub async fn timeline(
        &self,
        kind: &str,
        namespace: Option<&str>,
        name: &str,
        since: &str,
    ) -> Result<Vec<TimelineRecord>, DaemonError> {
        let mut q = format!(
            "/v1/timeline?kind={}&name={}&since={}",
            encode(kind),
            encode(name),
            encode(since)
        );
        if let Some(ns) = namespace {
            q.push_str(&format!("&namespace={}", encode(ns)));
        }
        Ok(get_json(&self.socket, &q).await?.unwrap_or_default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::introspection::Introspection;
    use tokio_util::sync::CancellationToken;

    #[tokio::test]
    async fn reads_what_the_server_serves_and_reports_a_missing_daemon() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("d.sock");
        let down = Daemon::connect(&path)
            .await
            .expect_err("nothing listens")
            .to_string();
        assert!(down.contains("connect"), "{down}");
        let state = Introspection::new("n1");
        let started = crate::introspection::types::StartedWith {
            files: vec!["/etc/keelson/config.yaml".into()],
            node_kubeconfig: Some("/etc/kubernetes/kubelet.conf".into()),
            proxy_kubeconfig: None,
            config: "node:\n  enabled: true\n".into(),
        };
        state.set_started_with(started.clone());
        state.timeline().record(
            crate::introspection::types::RecordSource::Event,
            crate::introspection::ObjectKey {
                kind: "Pod".into(),
                namespace: "default".into(),
                name: "web".into(),
                ..Default::default()
            },
            "Warning",
            "BackOff",
            "Back-off restarting failed container app in pod web_default(u)",
        );
        let stop = CancellationToken::new();
        crate::introspection::server::start(&path, state, stop.clone())
            .await
            .expect("serve");
        let d = Daemon::connect(&path).await.expect("connect");
        assert_eq!(d.info.node_name, "n1");
        assert_eq!(d.info.started_with, Some(started));
        assert_eq!(d.pod("default", "web").await.expect("pod"), None);
        let t = d
            .timeline("Pod", Some("default"), "web", "1970-01-01T00:00:00Z")
            .await
            .expect("timeline");
        assert_eq!(t.len(), 1);
        assert_eq!(t[0].reason, "BackOff");
        assert!(!d.node().await.expect("node").node_role);
        stop.cancel();
    }

    #[test]
    fn query_values_are_encoded() {
        assert_eq!(encode("2025-01-01T00:00:00Z"), "2025-01-01T00%3A00%3A00Z");
        assert_eq!(encode("a b/c"), "a%20b%2Fc");
    }
}
