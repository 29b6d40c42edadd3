//! WebSocket request checks and the server handshake for kubelet's
//! WebSocket streaming (`ExtendWebSocketsToKubelet`):
//! `wsstream.IsWebSocketRequestWithStreamCloseProtocol` and
//! `IsWebSocketRequestWithTunnelingProtocol`
//! (`k8s.io/streaming/pkg/httpstream/wsstream/conn.go`), and the 101
//! answer (RFC 6455 section 4.2.2) with the chosen subprotocol. The
//! frames themselves are tungstenite's.

use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode, header};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::protocol::{Role, WebSocketConfig};

use super::body::{self, Body};

/// The remotecommand protocol with the stream-close signal.
pub const STREAM_PROTOCOL_V5: &str = "v5.channel.k8s.io";
/// The prefix of a SPDY protocol tunneled through WebSocket
/// (`portforward.WebsocketsSPDYTunnelingPrefix`).
pub const SPDY_TUNNELING_PREFIX: &str = "SPDY/3.1+";
/// `portforward.KubernetesSuffix`.
pub const KUBERNETES_SUFFIX: &str = ".k8s.io";

/// An upgraded server-side WebSocket.
pub type Socket = WebSocketStream<TokioIo<hyper::upgrade::Upgraded>>;

fn header_str(h: &HeaderMap, name: header::HeaderName) -> &str {
    h.get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
}

/// `IsWebSocketRequest`: `Upgrade: websocket` and a `Connection` header
/// naming `upgrade`.
pub fn is_websocket_request(h: &HeaderMap) -> bool {
    let conn_upgrade = h
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.to_ascii_lowercase().contains("upgrade"));
    header_str(h, header::UPGRADE).eq_ignore_ascii_case("websocket") && conn_upgrade
}

/// The subprotocols the client asked for (`Sec-WebSocket-Protocol`, first
/// header, comma separated, trimmed).
pub fn requested_protocols(h: &HeaderMap) -> Vec<String> {
    header_str(h, header::SEC_WEBSOCKET_PROTOCOL)
        .split(',')
        .map(|p| p.trim().to_string())
        .filter(|p| !p.is_empty())
        .collect()
}

/// `IsWebSocketRequestWithStreamCloseProtocol`.
pub fn with_stream_close_protocol(h: &HeaderMap) -> bool {
    is_websocket_request(h)
        && requested_protocols(h)
            .iter()
            .any(|p| p == STREAM_PROTOCOL_V5)
}

/// Whether `p` is a tunneled Kubernetes SPDY protocol.
pub fn is_tunneling_protocol(p: &str) -> bool {
    p.starts_with(SPDY_TUNNELING_PREFIX) && p.ends_with(KUBERNETES_SUFFIX)
}

/// `IsWebSocketRequestWithTunnelingProtocol`.
pub fn with_tunneling_protocol(h: &HeaderMap) -> bool {
    is_websocket_request(h)
        && requested_protocols(h)
            .iter()
            .any(|p| is_tunneling_protocol(p))
}

/// Checks the client's handshake and builds the 101 answer choosing
/// `protocol` (none when `None`). Errors are the answer to send instead
/// (boxed: a response is large).
pub fn accept(
    req: &Request<Incoming>,
    protocol: Option<&str>,
) -> Result<Response<Body>, Box<Response<Body>>> {
    let h = req.headers();
    if req.method() != Method::GET {
        return Err(Box::new(body::http_error(
            StatusCode::METHOD_NOT_ALLOWED,
            "websocket: upgrade: request method is not GET",
        )));
    }
    if header_str(h, header::SEC_WEBSOCKET_VERSION) != "13" {
        let mut r = body::http_error(
            StatusCode::BAD_REQUEST,
            "websocket: upgrade: unsupported version: 13 not found in 'Sec-Websocket-Version' header",
        );
        r.headers_mut().insert(
            header::SEC_WEBSOCKET_VERSION,
            HeaderValue::from_static("13"),
        );
        return Err(Box::new(r));
    }
    let Some(key) = h.get(header::SEC_WEBSOCKET_KEY) else {
        return Err(Box::new(body::http_error(
            StatusCode::BAD_REQUEST,
            "websocket: not a websocket handshake: 'Sec-WebSocket-Key' header is missing",
        )));
    };
    let accept = tokio_tungstenite::tungstenite::handshake::derive_accept_key(key.as_bytes());
    let mut r = Response::new(body::empty());
    *r.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let hm = r.headers_mut();
    hm.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    hm.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    if let Ok(v) = HeaderValue::from_str(&accept) {
        hm.insert(header::SEC_WEBSOCKET_ACCEPT, v);
    }
    if let Some(p) = protocol
        && let Ok(v) = HeaderValue::from_str(p)
    {
        hm.insert(header::SEC_WEBSOCKET_PROTOCOL, v);
    }
    Ok(r)
}

/// Wraps the upgraded connection as the server end of a WebSocket.
pub async fn socket(up: hyper::upgrade::Upgraded) -> Socket {
    let config = WebSocketConfig::default();
    WebSocketStream::from_raw_socket(TokioIo::new(up), Role::Server, Some(config)).await
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn h(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut m = HeaderMap::new();
        for (k, v) in pairs {
            m.append(
                header::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        m
    }

    #[test]
    fn protocol_checks_as_wsstream() {
        let v5 = h(&[
            ("Connection", "Upgrade"),
            ("Upgrade", "websocket"),
            (
                "Sec-WebSocket-Protocol",
                "v4.channel.k8s.io, v5.channel.k8s.io",
            ),
        ]);
        assert!(with_stream_close_protocol(&v5));
        assert!(!with_tunneling_protocol(&v5));
        let pf = h(&[
            ("Connection", "keep-alive, Upgrade"),
            ("Upgrade", "WebSocket"),
            ("Sec-WebSocket-Protocol", "SPDY/3.1+portforward.k8s.io"),
        ]);
        assert!(with_tunneling_protocol(&pf));
        assert!(!with_stream_close_protocol(&pf));
        // Older WebSocket protocols and SPDY keep the plain proxy.
        let v4 = h(&[
            ("Connection", "Upgrade"),
            ("Upgrade", "websocket"),
            ("Sec-WebSocket-Protocol", "v4.channel.k8s.io"),
        ]);
        assert!(!with_stream_close_protocol(&v4));
        let spdy = h(&[
            ("Connection", "Upgrade"),
            ("Upgrade", "SPDY/3.1"),
            ("Sec-WebSocket-Protocol", "v5.channel.k8s.io"),
        ]);
        assert!(!with_stream_close_protocol(&spdy));
        let no_conn = h(&[
            ("Upgrade", "websocket"),
            ("Sec-WebSocket-Protocol", "v5.channel.k8s.io"),
        ]);
        assert!(!with_stream_close_protocol(&no_conn));
    }
}
