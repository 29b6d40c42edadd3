//! Proxies an upgrade request (SPDY or WebSocket) to the runtime's
//! streaming server and splices the two connections, as kubelet's
//! `proxy.NewUpgradeAwareHandler(url, nil, false, true, responder)` does
//! (`k8s.io/apimachinery/pkg/util/proxy/upgradeaware.go`): the request
//! goes to the URL CRI returned (its path, not the client's), with the
//! client's headers; a 101 answer is relayed and bytes flow both ways
//! until either side closes; any other answer is relayed as is. The
//! protocols inside (stdin/stdout/stderr/error/resize channels, port
//! streams, exit codes) are the runtime's and the client's business.
//!
//! A stream with no traffic either way for `streamingConnectionIdleTimeout`
//! is closed; a client that goes away closes the runtime side at once.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode, header};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::time::Instant;

use super::body::{self, Body};

/// Whether the request asks for a protocol upgrade (`Connection: Upgrade`
/// and an `Upgrade` header).
pub fn is_upgrade(req: &Request<Incoming>) -> bool {
    let conn_upgrade = req
        .headers()
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case("upgrade"));
    conn_upgrade && req.headers().contains_key(header::UPGRADE)
}

/// kubelet's responder: errors while proxying are 500 with the text.
pub fn proxy_error(msg: impl std::fmt::Display) -> Response<Body> {
    tracing::warn!(error = %msg, "error while proxying request");
    body::http_error(StatusCode::INTERNAL_SERVER_ERROR, &msg.to_string())
}

/// Why an upgrade request did not reach the runtime's streaming server
/// (kubelet's responder texts).
#[derive(Debug, thiserror::Error)]
pub enum UpgradeError {
    /// The runtime's streaming URL does not parse.
    #[error("invalid streaming URL {location:?}: {error}")]
    InvalidUrl {
        /// The URL.
        location: String,
        /// Why.
        error: http::uri::InvalidUri,
    },
    /// Not an `http://` URL.
    #[error("streaming URL {0:?}: only http:// runtime streaming servers are supported")]
    NotHttp(String),
    /// A URL without a host.
    #[error("streaming URL {0:?} has no host")]
    NoHost(String),
    /// The TCP connection did not open.
    #[error("error dialing backend: {0}")]
    Dial(std::io::Error),
    /// The HTTP handshake failed.
    #[error("error dialing backend: {0}")]
    Handshake(hyper::Error),
    /// The request could not be built from the client's headers.
    #[error("{0}")]
    Request(http::Error),
    /// The runtime did not answer.
    #[error("error proxying to the runtime: {0}")]
    Proxy(hyper::Error),
}

/// Sends an upgrade request to the runtime's streaming URL `location`
/// (an `http://host:port/path` URL): its path, `method` and `headers`
/// (`Host` is the runtime's). The answer's body or upgrade belongs to the
/// caller; errors are kubelet's responder text.
pub async fn request_upgrade(
    location: &str,
    method: http::Method,
    headers: &http::HeaderMap,
) -> Result<Response<Incoming>, UpgradeError> {
    let uri: http::Uri = location.parse().map_err(|error| UpgradeError::InvalidUrl {
        location: location.to_string(),
        error,
    })?;
    if uri.scheme_str() != Some("http") {
        return Err(UpgradeError::NotHttp(location.to_string()));
    }
    let Some(authority) = uri.authority().cloned() else {
        return Err(UpgradeError::NoHost(location.to_string()));
    };
    let stream = tokio::net::TcpStream::connect(authority.as_str())
        .await
        .map_err(UpgradeError::Dial)?;
    let _ = stream.set_nodelay(true);
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake::<_, http_body_util::Empty<Bytes>>(TokioIo::new(
            stream,
        ))
        .await
        .map_err(UpgradeError::Handshake)?;
    tokio::spawn(async move {
        if let Err(e) = conn.with_upgrades().await {
            tracing::debug!(error = %e, "streaming backend connection ended");
        }
    });
    let path = uri
        .path_and_query()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| "/".into());
    let mut out = Request::builder().method(method).uri(path);
    for (k, v) in headers {
        if k == header::HOST {
            continue;
        }
        out = out.header(k, v);
    }
    out = out.header(header::HOST, authority.as_str());
    let out = out
        .body(http_body_util::Empty::new())
        .map_err(UpgradeError::Request)?;
    sender.send_request(out).await.map_err(UpgradeError::Proxy)
}

/// Relays a runtime answer that is not an upgrade (e.g. an unsupported
/// protocol) as is.
pub fn relay(resp: Response<Incoming>) -> Response<Body> {
    let (parts, b) = resp.into_parts();
    let b = b.map_err(std::io::Error::other).boxed();
    Response::from_parts(parts, b)
}

/// Proxies `req` to `location` (an `http://host:port/path` URL).
pub async fn proxy(
    mut req: Request<Incoming>,
    location: &str,
    idle_timeout: Duration,
) -> Response<Body> {
    if !is_upgrade(&req) {
        return proxy_error("Upgrade request required");
    }
    let client_upgrade = hyper::upgrade::on(&mut req);
    let mut resp = match request_upgrade(location, req.method().clone(), req.headers()).await {
        Ok(r) => r,
        Err(e) => return proxy_error(e),
    };
    if resp.status() != StatusCode::SWITCHING_PROTOCOLS {
        // Relay the runtime's refusal (e.g. an unsupported protocol).
        return relay(resp);
    }
    let backend_upgrade = hyper::upgrade::on(&mut resp);
    let mut answer = Response::new(body::empty());
    *answer.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    *answer.headers_mut() = resp.headers().clone();
    tokio::spawn(async move {
        let (client, backend) = match tokio::join!(client_upgrade, backend_upgrade) {
            (Ok(c), Ok(b)) => (c, b),
            (Err(e), _) | (_, Err(e)) => {
                tracing::debug!(error = %e, "upgrade failed");
                return;
            }
        };
        splice(TokioIo::new(client), TokioIo::new(backend), idle_timeout).await;
    });
    answer
}

/// Copies both ways until both directions ended, or nothing moved for
/// `idle`.
pub async fn splice<A, B>(a: A, b: B, idle: Duration)
where
    A: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    B: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let start = Instant::now();
    let last = Arc::new(AtomicU64::new(0));
    let (ar, aw) = tokio::io::split(a);
    let (br, bw) = tokio::io::split(b);
    let up = pump(ar, bw, last.clone(), start);
    let down = pump(br, aw, last.clone(), start);
    let both = async { tokio::join!(up, down) };
    let watchdog = idle_watchdog(start, &last, idle);
    tokio::select! {
        _ = both => {}
        _ = watchdog => tracing::debug!(?idle, "stream idle too long; closed"),
    }
}

async fn pump<R, W>(mut r: R, mut w: W, last: Arc<AtomicU64>, start: Instant)
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buf = vec![0u8; 32 * 1024];
    loop {
        let n = match r.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if w.write_all(&buf[..n]).await.is_err() {
            break;
        }
        if w.flush().await.is_err() {
            break;
        }
        let ms = u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX);
        last.store(ms, Ordering::Relaxed);
    }
    let _ = w.shutdown().await;
}

/// Ends once nothing was seen for `idle`: `last` holds the milliseconds
/// since `start` of the last traffic (`streamingConnectionIdleTimeout`).
pub(super) async fn idle_watchdog(start: Instant, last: &AtomicU64, idle: Duration) {
    loop {
        let seen = Duration::from_millis(last.load(Ordering::Relaxed));
        let deadline = start + seen + idle;
        if Instant::now() >= deadline {
            return;
        }
        tokio::time::sleep_until(deadline).await;
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::panic)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn idle_streams_close() {
        let (a, _a_peer) = tokio::io::duplex(64);
        let (b, _b_peer) = tokio::io::duplex(64);
        let t = tokio::spawn(splice(a, b, Duration::from_secs(5)));
        tokio::time::sleep(Duration::from_secs(6)).await;
        assert!(t.is_finished());
    }

    #[tokio::test]
    async fn bytes_flow_both_ways_and_close_propagates() {
        let (a, mut a_peer) = tokio::io::duplex(64);
        let (b, mut b_peer) = tokio::io::duplex(64);
        let t = tokio::spawn(splice(a, b, Duration::from_secs(60)));
        a_peer.write_all(b"ping").await.unwrap();
        let mut buf = [0u8; 4];
        b_peer.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"ping");
        b_peer.write_all(b"pong").await.unwrap();
        a_peer.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"pong");
        drop(a_peer);
        drop(b_peer);
        tokio::time::timeout(Duration::from_secs(5), t)
            .await
            .unwrap()
            .unwrap();
    }
}
