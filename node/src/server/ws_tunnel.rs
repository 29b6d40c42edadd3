//! kubelet's SPDY-over-WebSocket tunnel for port-forward
//! (`ExtendWebSocketsToKubelet`; `translator.NewTunnelingHandler` in
//! `k8s.io/apiserver/pkg/util/proxy/streamtunnel.go`, client side
//! `client-go/tools/portforward/tunneling_connection.go`): the client
//! asks for `SPDY/3.1+portforward.k8s.io`; the runtime gets a plain SPDY
//! upgrade (`Upgrade: SPDY/3.1`, one `X-Stream-Protocol-Version` per
//! tunneled protocol, the WebSocket headers removed); once the runtime
//! switched protocols, the client gets the WebSocket 101 with the
//! runtime's protocol under the tunneling prefix, and the SPDY bytes
//! travel inside binary messages, unchanged, both ways. A runtime that
//! refuses is answered as it answered.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::time::Instant;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;

use super::body::{self, Body};
use super::wsstream;

/// The SPDY protocols inside the tunneling ones the client asked for
/// (`spdyProtocolsFromWebsocketProtocols`).
pub fn spdy_protocols(h: &http::HeaderMap) -> Vec<String> {
    wsstream::requested_protocols(h)
        .into_iter()
        .filter(|p| wsstream::is_tunneling_protocol(p))
        .map(|p| p[wsstream::SPDY_TUNNELING_PREFIX.len()..].to_string())
        .collect()
}

/// Answers a tunneling WebSocket port-forward request, tunneling to the
/// runtime's streaming URL `location`.
pub async fn serve(
    mut req: Request<Incoming>,
    location: &str,
    idle_timeout: Duration,
) -> Response<Body> {
    let protocols = spdy_protocols(req.headers());
    if protocols.is_empty() {
        return body::http_error(
            StatusCode::BAD_REQUEST,
            "unable to upgrade: no tunneling spdy protocols provided",
        );
    }
    // `createSPDYRequest`: the client's headers without the WebSocket
    // ones, as a SPDY upgrade.
    let mut h = req.headers().clone();
    for n in [
        header::SEC_WEBSOCKET_PROTOCOL,
        header::SEC_WEBSOCKET_KEY,
        header::SEC_WEBSOCKET_VERSION,
        header::UPGRADE,
    ] {
        h.remove(n);
    }
    h.insert(header::UPGRADE, HeaderValue::from_static("SPDY/3.1"));
    h.remove("x-stream-protocol-version");
    for p in &protocols {
        if let Ok(v) = HeaderValue::from_str(p) {
            h.append("x-stream-protocol-version", v);
        }
    }
    let client_upgrade = hyper::upgrade::on(&mut req);
    let mut resp = match super::upgrade_proxy::request_upgrade(location, Method::POST, &h).await {
        Ok(r) => r,
        Err(e) => return super::upgrade_proxy::proxy_error(e),
    };
    if resp.status() != StatusCode::SWITCHING_PROTOCOLS {
        tracing::warn!(status = %resp.status(), "SPDY upgrade failed");
        return super::upgrade_proxy::relay(resp);
    }
    let get = |n: header::HeaderName| {
        resp.headers()
            .get(n)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_ascii_lowercase()
    };
    if !get(header::CONNECTION).contains("upgrade") || !get(header::UPGRADE).contains("spdy/3.1") {
        return body::http_error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "unable to upgrade: missing upgrade headers in response",
        );
    }
    // The runtime's choice, under the tunneling prefix.
    let chosen = resp
        .headers()
        .get("x-stream-protocol-version")
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|p| format!("{}{p}", wsstream::SPDY_TUNNELING_PREFIX));
    // gorilla's Upgrader answers with the client's first protocol that
    // the server offers, else none.
    let chosen = chosen.filter(|c| wsstream::requested_protocols(req.headers()).contains(c));
    let answer = match wsstream::accept(&req, chosen.as_deref()) {
        Ok(a) => a,
        Err(r) => return *r,
    };
    let backend_upgrade = hyper::upgrade::on(&mut resp);
    tokio::spawn(async move {
        let (client, backend) = match tokio::join!(client_upgrade, backend_upgrade) {
            (Ok(c), Ok(b)) => (c, b),
            (Err(e), _) | (_, Err(e)) => {
                tracing::debug!(error = %e, "upgrade failed");
                return;
            }
        };
        let ws = wsstream::socket(client).await;
        tunnel(ws, TokioIo::new(backend), idle_timeout).await;
    });
    answer
}

/// Carries `backend`'s bytes in binary messages of `ws` and back, until
/// either side ends (then both are closed, as the upgrade-aware proxy
/// does) or nothing moved for `idle`.
pub async fn tunnel<S, B>(ws: WebSocketStream<S>, backend: B, idle: Duration)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    B: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let start = Instant::now();
    let last = Arc::new(AtomicU64::new(0));
    let touch = {
        let last = last.clone();
        move || {
            let ms = u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX);
            last.store(ms, Ordering::Relaxed);
        }
    };
    let (mut sink, mut source) = ws.split();
    let (mut br, mut bw) = tokio::io::split(backend);
    let up = {
        let touch = touch.clone();
        async move {
            while let Some(m) = source.next().await {
                match m {
                    Ok(Message::Binary(b)) => {
                        touch();
                        if bw.write_all(&b).await.is_err() || bw.flush().await.is_err() {
                            break;
                        }
                    }
                    // `TunnelingConnection.Read`: only binary messages.
                    Ok(Message::Text(_)) | Ok(Message::Close(_)) | Err(_) => break,
                    Ok(_) => {}
                }
            }
            let _ = bw.shutdown().await;
        }
    };
    let down = async move {
        let mut buf = vec![0u8; 32 * 1024];
        loop {
            let n = match br.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            touch();
            if sink
                .send(Message::Binary(bytes::Bytes::copy_from_slice(&buf[..n])))
                .await
                .is_err()
            {
                return;
            }
        }
        let _ = sink
            .send(Message::Close(Some(CloseFrame {
                code: CloseCode::Normal,
                reason: "".into(),
            })))
            .await;
    };
    let watchdog = super::upgrade_proxy::idle_watchdog(start, &last, idle);
    tokio::select! {
        _ = up => {}
        _ = down => {}
        _ = watchdog => tracing::debug!(?idle, "stream idle too long; closed"),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn tunneled_protocols() {
        let mut h = http::HeaderMap::new();
        h.insert(
            header::SEC_WEBSOCKET_PROTOCOL,
            HeaderValue::from_static(
                "SPDY/3.1+portforward.k8s.io, v4.channel.k8s.io, SPDY/3.1+x.example",
            ),
        );
        assert_eq!(spdy_protocols(&h), ["portforward.k8s.io"]);
    }

    /// A node API stand-in serving [`serve`] toward `runtime`, and a
    /// runtime that checks the SPDY upgrade it gets, answers `status` and,
    /// once upgraded, echoes what it reads.
    async fn node_and_runtime(status: StatusCode) -> std::net::SocketAddr {
        let rt = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/portforward/abc", rt.local_addr().unwrap());
        tokio::spawn(async move {
            let (tcp, _) = rt.accept().await.unwrap();
            let svc = hyper::service::service_fn(move |mut req: Request<Incoming>| {
                let h = req.headers();
                assert_eq!(req.method(), Method::POST);
                assert_eq!(h["upgrade"], "SPDY/3.1");
                assert_eq!(h["x-stream-protocol-version"], "portforward.k8s.io");
                assert!(!h.contains_key("sec-websocket-key"), "{h:?}");
                assert!(!h.contains_key("sec-websocket-protocol"), "{h:?}");
                let up = hyper::upgrade::on(&mut req);
                tokio::spawn(async move {
                    if let Ok(up) = up.await {
                        let mut io = TokioIo::new(up);
                        let mut b = [0u8; 64];
                        while let Ok(n) = io.read(&mut b).await {
                            if n == 0 || io.write_all(&b[..n]).await.is_err() {
                                break;
                            }
                        }
                    }
                });
                async move {
                    let mut r = Response::new(body::full("refused by the runtime"));
                    *r.status_mut() = status;
                    if status == StatusCode::SWITCHING_PROTOCOLS {
                        let h = r.headers_mut();
                        h.insert("connection", HeaderValue::from_static("Upgrade"));
                        h.insert("upgrade", HeaderValue::from_static("SPDY/3.1"));
                        h.insert(
                            "x-stream-protocol-version",
                            HeaderValue::from_static("portforward.k8s.io"),
                        );
                    }
                    Ok::<_, std::convert::Infallible>(r)
                }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(tcp), svc)
                .with_upgrades()
                .await;
        });
        let node = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = node.local_addr().unwrap();
        tokio::spawn(async move {
            let (tcp, _) = node.accept().await.unwrap();
            let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                let url = url.clone();
                async move {
                    Ok::<_, std::convert::Infallible>(
                        serve(req, &url, Duration::from_secs(60)).await,
                    )
                }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(tcp), svc)
                .with_upgrades()
                .await;
        });
        addr
    }

    fn ws_request(addr: std::net::SocketAddr) -> http::Request<()> {
        use tokio_tungstenite::tungstenite::client::IntoClientRequest;
        let mut req = format!("ws://{addr}/portForward/ns/pod")
            .into_client_request()
            .unwrap();
        req.headers_mut().insert(
            header::SEC_WEBSOCKET_PROTOCOL,
            HeaderValue::from_static("SPDY/3.1+portforward.k8s.io"),
        );
        req
    }

    #[tokio::test]
    async fn tunnel_through_a_spdy_upgrade() {
        let addr = node_and_runtime(StatusCode::SWITCHING_PROTOCOLS).await;
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (mut ws, resp) = tokio_tungstenite::client_async(ws_request(addr), tcp)
            .await
            .unwrap();
        assert_eq!(
            resp.headers()[header::SEC_WEBSOCKET_PROTOCOL],
            "SPDY/3.1+portforward.k8s.io"
        );
        ws.send(Message::Binary(bytes::Bytes::from_static(b"spdy bytes")))
            .await
            .unwrap();
        let m = tokio::time::timeout(Duration::from_secs(5), ws.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert_eq!(m, Message::Binary(bytes::Bytes::from_static(b"spdy bytes")));
    }

    #[tokio::test]
    async fn a_runtime_refusal_is_relayed() {
        let addr = node_and_runtime(StatusCode::FORBIDDEN).await;
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let err = tokio_tungstenite::client_async(ws_request(addr), tcp)
            .await
            .unwrap_err();
        let tokio_tungstenite::tungstenite::Error::Http(resp) = err else {
            panic!("{err:?}")
        };
        assert_eq!(resp.status(), StatusCode::FORBIDDEN);
        assert_eq!(resp.body().as_deref(), Some(&b"refused by the runtime"[..]));
    }

    #[tokio::test]
    async fn bytes_travel_in_binary_messages() {
        let (client_io, server_io) = tokio::io::duplex(1 << 16);
        let (backend, mut runtime) = tokio::io::duplex(1 << 16);
        let server = WebSocketStream::from_raw_socket(
            server_io,
            tokio_tungstenite::tungstenite::protocol::Role::Server,
            None,
        )
        .await;
        let t = tokio::spawn(tunnel(server, backend, Duration::from_secs(60)));
        let mut client = WebSocketStream::from_raw_socket(
            client_io,
            tokio_tungstenite::tungstenite::protocol::Role::Client,
            None,
        )
        .await;
        client
            .send(Message::Binary(bytes::Bytes::from_static(
                b"\x80\x03\x00\x06",
            )))
            .await
            .unwrap();
        let mut b = [0u8; 4];
        runtime.read_exact(&mut b).await.unwrap();
        assert_eq!(&b, b"\x80\x03\x00\x06");
        runtime.write_all(b"reply").await.unwrap();
        let m = client.next().await.unwrap().unwrap();
        assert_eq!(m, Message::Binary(bytes::Bytes::from_static(b"reply")));
        // The runtime ending closes the WebSocket normally.
        drop(runtime);
        let m = client.next().await.unwrap().unwrap();
        assert!(matches!(m, Message::Close(Some(f)) if f.code == CloseCode::Normal));
        tokio::time::timeout(Duration::from_secs(5), t)
            .await
            .unwrap()
            .unwrap();
    }
}
