//! kubelet's WebSocket/SPDY stream translator for exec and attach
//! (`ExtendWebSocketsToKubelet`; `translator.NewStreamTranslatorHandler`
//! in `k8s.io/apiserver/pkg/util/proxy/streamtranslator.go` and
//! `websocket.go`): toward the client a WebSocket server speaking
//! remotecommand v5 (`v5.channel.k8s.io`: one channel byte before each
//! binary message, 0 stdin, 1 stdout, 2 stderr, 3 error, 4 resize; 255
//! then a channel number half-closes that channel); toward the runtime's
//! streaming URL a SPDY/3.1 client speaking remotecommand v4 (one SPDY
//! stream per channel, named by its `streamType` header).
//!
//! The session ends when stdout, stderr and the error stream have ended;
//! the runtime's v4 status (exit code) is then re-encoded as client-go's
//! translator does and written on channel 3, and the WebSocket closed
//! normally. A client that goes away ends the SPDY connection (upstream
//! waits for the command to end with nobody reading its output).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use futures::stream::{SplitSink, SplitStream};
use futures::{SinkExt, StreamExt};
use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode, header};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use serde::Serialize;
use serde_json::Value;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::time::Instant;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;

use super::body::Body;
use super::spdy::session::{Connection, Stream};
use super::streaming::StreamOptions;
use super::wsstream;

/// The WebSocket's idle timeout (`defaultIdleConnectionTimeout`, the
/// kubelet WebSocket server's).
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(4 * 3600);
/// The SPDY client's ping period (`RoundTripperConfig.PingPeriod`).
pub const PING_PERIOD: Duration = Duration::from_secs(5);

const STDIN: u8 = 0;
const STDOUT: u8 = 1;
const STDERR: u8 = 2;
const ERROR: u8 = 3;
const RESIZE: u8 = 4;
const CHANNELS: u8 = 5;
const STREAM_CLOSE: u8 = 255;

/// The SPDY protocols offered to the runtime, best first (client-go's
/// `SupportedStreamingProtocols` without the v1 protocol).
const SPDY_PROTOCOLS: &[&str] = &[
    "v4.channel.k8s.io",
    "v3.channel.k8s.io",
    "v2.channel.k8s.io",
];

/// Answers a v5 WebSocket exec/attach request and translates it to SPDY
/// toward `location` once upgraded.
pub fn serve(mut req: Request<Incoming>, location: String, opts: StreamOptions) -> Response<Body> {
    let answer = match wsstream::accept(&req, Some(wsstream::STREAM_PROTOCOL_V5)) {
        Ok(r) => r,
        Err(r) => return *r,
    };
    let upgrade = hyper::upgrade::on(&mut req);
    tokio::spawn(async move {
        match upgrade.await {
            Ok(up) => translate(wsstream::socket(up).await, &location, opts, IDLE_TIMEOUT).await,
            Err(e) => tracing::debug!(error = %e, "WebSocket upgrade failed"),
        }
    });
    answer
}

// ---- metav1.Status, as the translator writes it on channel 3 ----

#[derive(Serialize, Default)]
struct Meta {}

#[derive(Serialize, Debug, Clone, PartialEq, Eq)]
struct Cause {
    #[serde(rename = "reason", skip_serializing_if = "Option::is_none")]
    kind: Option<&'static str>,
    message: String,
}

#[derive(Serialize, Debug, Clone, PartialEq, Eq)]
struct Details {
    causes: Vec<Cause>,
}

/// What ended the session.
#[derive(Serialize, Debug, Clone, PartialEq, Eq)]
pub struct Status {
    #[serde(serialize_with = "empty_meta")]
    metadata: (),
    status: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    message: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    details: Option<Details>,
    #[serde(skip_serializing_if = "is_zero")]
    code: i32,
}

fn empty_meta<S: serde::Serializer>(_: &(), s: S) -> Result<S::Ok, S::Error> {
    Meta {}.serialize(s)
}

fn is_zero(c: &i32) -> bool {
    *c == 0
}

impl Status {
    /// `metav1.StatusSuccess`.
    pub fn success() -> Self {
        Status {
            metadata: (),
            status: "Success",
            message: None,
            reason: None,
            details: None,
            code: 0,
        }
    }

    /// `codeExitToStatusError`.
    pub fn exit_code(rc: u8) -> Self {
        Status {
            metadata: (),
            status: "Failure",
            message: Some(format!(
                "command terminated with non-zero exit code: command terminated with exit code {rc}"
            )),
            reason: Some("NonZeroExitCode"),
            details: Some(Details {
                causes: vec![Cause {
                    kind: Some("ExitCode"),
                    message: rc.to_string(),
                }],
            }),
            code: 0,
        }
    }

    /// `apierrors.NewInternalError(err)`.
    pub fn internal(err: impl std::fmt::Display) -> Self {
        let err = err.to_string();
        Status {
            metadata: (),
            status: "Failure",
            message: Some(format!("Internal error occurred: {err}")),
            reason: Some("InternalError"),
            details: Some(Details {
                causes: vec![Cause {
                    kind: None,
                    message: err,
                }],
            }),
            code: 500,
        }
    }

    /// The JSON written on the error channel.
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }
}

/// The runtime's error stream, as the SPDY executor reads it
/// (`errorDecoderV4` for v4, plain text before), then as the translator
/// reports it.
pub fn decode_error_stream(protocol: &str, message: &[u8]) -> Status {
    if message.is_empty() {
        return Status::success();
    }
    if protocol != "v4.channel.k8s.io" {
        return Status::internal(format!(
            "error executing remote command: {}",
            String::from_utf8_lossy(message)
        ));
    }
    let v: Value = match serde_json::from_slice(message) {
        Ok(v) => v,
        Err(e) => {
            return Status::internal(format!(
                "error stream protocol error: {e} in {:?}",
                String::from_utf8_lossy(message)
            ));
        }
    };
    let field = |k: &str| v.get(k).and_then(Value::as_str).unwrap_or_default();
    match field("status") {
        "Success" => Status::success(),
        "Failure" if field("reason") == "NonZeroExitCode" => {
            let Some(details) = v.get("details").filter(|d| !d.is_null()) else {
                return Status::internal("error stream protocol error: details must be set");
            };
            let causes = details
                .get("causes")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            for c in causes {
                if c.get("reason").and_then(Value::as_str) != Some("ExitCode") {
                    continue;
                }
                let m = c.get("message").and_then(Value::as_str).unwrap_or_default();
                return match m.parse::<u8>() {
                    Ok(rc) => Status::exit_code(rc),
                    Err(_) => Status::internal(format!(
                        "error stream protocol error: invalid exit code value {m:?}"
                    )),
                };
            }
            Status::internal("error stream protocol error: no ExitCode cause given")
        }
        "Failure" => Status::internal(field("message")),
        _ => Status::internal("error stream protocol error: unknown error"),
    }
}

/// The SPDY connection to the runtime and the negotiated protocol.
type Spdy = Connection<TokioIo<hyper::upgrade::Upgraded>>;

/// Upgrades to SPDY at the runtime's streaming URL (`spdy.NegotiateStreaming`).
async fn connect(location: &str) -> Result<(Spdy, String), String> {
    let mut h = HeaderMap::new();
    h.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    h.insert(header::UPGRADE, HeaderValue::from_static("SPDY/3.1"));
    for p in SPDY_PROTOCOLS {
        h.append("x-stream-protocol-version", HeaderValue::from_static(p));
    }
    let mut resp = super::upgrade_proxy::request_upgrade(location, Method::POST, &h).await?;
    let get = |n: &str| {
        resp.headers()
            .get(n)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_ascii_lowercase()
    };
    let upgraded = resp.status() == StatusCode::SWITCHING_PROTOCOLS
        && get("connection").contains("upgrade")
        && get("upgrade").contains("spdy/3.1");
    if !upgraded {
        let body = http_body_util::Limited::new(resp.into_body(), 1 << 20)
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        return Err(format!(
            "unable to upgrade connection: {}",
            upgrade_error_message(&body)
        ));
    }
    let protocol = resp
        .headers()
        .get("x-stream-protocol-version")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .trim()
        .to_string();
    let up = hyper::upgrade::on(&mut resp)
        .await
        .map_err(|e| format!("unable to upgrade connection: {e}"))?;
    let conn = Connection::start(TokioIo::new(up), Some(PING_PERIOD)).map_err(|e| e.to_string())?;
    Ok((conn, protocol))
}

/// `upgradeErrorMessage`: a Status-like body's message, else the text.
fn upgrade_error_message(body: &[u8]) -> String {
    if let Ok(v) = serde_json::from_slice::<Value>(body) {
        for k in ["message", "error"] {
            let m = v.get(k).and_then(Value::as_str).unwrap_or_default().trim();
            if !m.is_empty() {
                return m.to_string();
            }
        }
    }
    let m = String::from_utf8_lossy(body).trim().to_string();
    if m.is_empty() {
        "empty server response".into()
    } else {
        m
    }
}

type SpdyStream = Stream<TokioIo<hyper::upgrade::Upgraded>>;

/// The remotecommand streams (`streamProtocolV2/V3.createStreams`).
struct Streams {
    error: SpdyStream,
    stdin: Option<SpdyStream>,
    stdout: Option<SpdyStream>,
    stderr: Option<SpdyStream>,
    resize: Option<SpdyStream>,
}

async fn open_streams(conn: &Spdy, opts: StreamOptions, protocol: &str) -> Result<Streams, String> {
    let open = |t: &'static str| async move {
        conn.open(vec![("streamType".into(), t.into())], false)
            .await
            .map_err(|e| e.to_string())
    };
    let error = open("error").await?;
    let stdin = if opts.stdin {
        Some(open("stdin").await?)
    } else {
        None
    };
    let stdout = if opts.stdout {
        Some(open("stdout").await?)
    } else {
        None
    };
    let stderr = if opts.stderr && !opts.tty {
        Some(open("stderr").await?)
    } else {
        None
    };
    let resize = if opts.tty && protocol != "v2.channel.k8s.io" {
        Some(open("resize").await?)
    } else {
        None
    };
    Ok(Streams {
        error,
        stdin,
        stdout,
        stderr,
        resize,
    })
}

fn frame(channel: u8, data: &[u8]) -> Message {
    let mut v = Vec::with_capacity(data.len() + 1);
    v.push(channel);
    v.extend_from_slice(data);
    Message::Binary(v.into())
}

async fn next(rx: &mut Option<tokio::sync::mpsc::Receiver<Bytes>>) -> Option<Bytes> {
    match rx {
        Some(r) => r.recv().await,
        None => std::future::pending().await,
    }
}

/// Runs one translated session on an upgraded WebSocket.
pub async fn translate<S>(
    ws: WebSocketStream<S>,
    location: &str,
    opts: StreamOptions,
    idle: Duration,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (mut sink, mut source) = ws.split();
    // An empty message on the lowest writable channel tells the client
    // the connection is up.
    let first = if opts.stdout {
        STDOUT
    } else if opts.stderr {
        STDERR
    } else {
        ERROR
    };
    if sink.send(frame(first, &[])).await.is_err() {
        return;
    }
    let (conn, protocol) = match connect(location).await {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(error = %e, "stream translator: SPDY connection to the runtime failed");
            finish(&mut sink, &mut source, Status::internal(e)).await;
            return;
        }
    };
    let streams = match open_streams(&conn, opts, &protocol).await {
        Ok(s) => s,
        Err(e) => {
            conn.close().await;
            finish(&mut sink, &mut source, Status::internal(e)).await;
            return;
        }
    };
    let Streams {
        mut error,
        stdin,
        stdout,
        stderr,
        resize,
    } = streams;
    let start = Instant::now();
    let last = Arc::new(AtomicU64::new(0));
    let touch = {
        let last = last.clone();
        move || {
            let ms = u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX);
            last.store(ms, Ordering::Relaxed);
        }
    };

    // Client → runtime: stdin, its close signal, resizes.
    let input = {
        let touch = touch.clone();
        async move {
            let mut stdin = stdin;
            while let Some(m) = source.next().await {
                let data: Bytes = match m {
                    Ok(Message::Binary(b)) => b,
                    Ok(Message::Text(t)) => Bytes::copy_from_slice(t.as_bytes()),
                    Ok(Message::Close(_)) | Err(_) => break,
                    Ok(_) => continue,
                };
                touch();
                let Some((&channel, rest)) = data.split_first() else {
                    continue;
                };
                if channel == STREAM_CLOSE {
                    let [target] = rest else {
                        tracing::debug!("single channel byte should follow stream close signal");
                        break;
                    };
                    if *target >= CHANNELS {
                        tracing::debug!(channel = target, "close targeted at an invalid channel");
                        break;
                    }
                    if *target == STDIN
                        && let Some(s) = stdin.take()
                    {
                        let _ = s.close_write().await;
                    }
                    continue;
                }
                let target = match channel {
                    STDIN => stdin.as_ref(),
                    RESIZE => resize.as_ref(),
                    _ => None,
                };
                if let Some(s) = target
                    && !rest.is_empty()
                    && s.write(rest).await.is_err()
                {
                    tracing::debug!(channel, "write to the runtime failed");
                }
            }
            // The client is gone (or broke the protocol).
        }
    };

    // Runtime → client: stdout, stderr, then the status.
    let output = async move {
        let mut out_rx = stdout.map(|s| s.rx);
        let mut err_rx = stderr.map(|s| s.rx);
        let mut status_rx = Some(&mut error.rx);
        let mut status = Vec::new();
        while out_rx.is_some() || err_rx.is_some() || status_rx.is_some() {
            tokio::select! {
                d = next(&mut out_rx) => match d {
                    Some(d) => {
                        touch();
                        if sink.send(frame(STDOUT, &d)).await.is_err() {
                            return None;
                        }
                    }
                    None => out_rx = None,
                },
                d = next(&mut err_rx) => match d {
                    Some(d) => {
                        touch();
                        if sink.send(frame(STDERR, &d)).await.is_err() {
                            return None;
                        }
                    }
                    None => err_rx = None,
                },
                d = async {
                    match status_rx.as_mut() {
                        Some(r) => r.recv().await,
                        None => std::future::pending().await,
                    }
                } => match d {
                    Some(d) => {
                        if status.len() < (1 << 20) {
                            status.extend_from_slice(&d);
                        }
                    }
                    None => status_rx = None,
                },
            }
        }
        Some((sink, decode_error_stream(&protocol, &status)))
    };

    let watchdog = super::upgrade_proxy::idle_watchdog(start, &last, idle);

    tokio::pin!(input);
    let done = tokio::select! {
        r = output => r,
        _ = &mut input => None,
        _ = watchdog => {
            tracing::debug!(?idle, "stream idle too long; closed");
            None
        }
    };
    conn.close().await;
    let Some((mut sink, status)) = done else {
        return;
    };
    write_status(&mut sink, status).await;
    // Let the reader see the client's close reply (briefly).
    let _ = tokio::time::timeout(Duration::from_secs(5), input).await;
}

/// Writes the status on the error channel and closes the WebSocket.
async fn write_status<S>(sink: &mut SplitSink<WebSocketStream<S>, Message>, status: Status)
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let _ = sink.send(frame(ERROR, &status.to_json())).await;
    let _ = sink
        .send(Message::Close(Some(CloseFrame {
            code: CloseCode::Normal,
            reason: "".into(),
        })))
        .await;
}

/// [`write_status`], then waits (briefly) for the client's close reply.
async fn finish<S>(
    sink: &mut SplitSink<WebSocketStream<S>, Message>,
    source: &mut SplitStream<WebSocketStream<S>>,
    status: Status,
) where
    S: AsyncRead + AsyncWrite + Unpin,
{
    write_status(sink, status).await;
    let _ = tokio::time::timeout(Duration::from_secs(5), async {
        while let Some(Ok(_)) = source.next().await {}
    })
    .await;
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn statuses_as_the_translator_writes_them() {
        assert_eq!(
            String::from_utf8(Status::success().to_json()).unwrap(),
            r#"{"metadata":{},"status":"Success"}"#
        );
        assert_eq!(
            String::from_utf8(Status::exit_code(7).to_json()).unwrap(),
            r#"{"metadata":{},"status":"Failure","message":"command terminated with non-zero exit code: command terminated with exit code 7","reason":"NonZeroExitCode","details":{"causes":[{"reason":"ExitCode","message":"7"}]}}"#
        );
        assert_eq!(
            String::from_utf8(Status::internal("boom").to_json()).unwrap(),
            r#"{"metadata":{},"status":"Failure","message":"Internal error occurred: boom","reason":"InternalError","details":{"causes":[{"message":"boom"}]},"code":500}"#
        );
    }

    #[test]
    fn error_stream_decoding() {
        let v4 = "v4.channel.k8s.io";
        assert_eq!(decode_error_stream(v4, b""), Status::success());
        assert_eq!(
            decode_error_stream(v4, br#"{"metadata":{},"status":"Success"}"#),
            Status::success()
        );
        let exit = br#"{"metadata":{},"status":"Failure","message":"command terminated with non-zero exit code: error executing command [sh -c exit 3], exit code 3","reason":"NonZeroExitCode","details":{"causes":[{"reason":"ExitCode","message":"3"}]}}"#;
        assert_eq!(decode_error_stream(v4, exit), Status::exit_code(3));
        assert_eq!(
            decode_error_stream(v4, br#"{"status":"Failure","message":"no such file"}"#),
            Status::internal("no such file")
        );
        assert_eq!(
            decode_error_stream(v4, br#"{"status":"Failure","reason":"NonZeroExitCode"}"#),
            Status::internal("error stream protocol error: details must be set")
        );
        assert_eq!(
            decode_error_stream("v2.channel.k8s.io", b"oops"),
            Status::internal("error executing remote command: oops")
        );
        assert!(matches!(
            decode_error_stream(v4, b"not json").message.as_deref(),
            Some(m) if m.starts_with("Internal error occurred: error stream protocol error: ")
        ));
    }

    use crate::node::server::spdy::frame::{self, Decoder, Encoder, Frame};
    use bytes::BytesMut;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio_tungstenite::tungstenite::protocol::Role;

    /// A runtime streaming server for one exec: accepts the SPDY upgrade
    /// (v4), the streams the client opens, upper-cases stdin onto stdout
    /// until stdin's FIN, writes `err` on stderr, then exits 3.
    async fn fake_runtime() -> (String, tokio::task::JoinHandle<Vec<String>>) {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/exec/abc", l.local_addr().unwrap());
        let task = tokio::spawn(async move {
            let (tcp, _) = l.accept().await.unwrap();
            let (tx, rx) = tokio::sync::oneshot::channel();
            let tx = std::sync::Mutex::new(Some(tx));
            let svc = hyper::service::service_fn(move |mut req: Request<Incoming>| {
                let ok = req.method() == Method::POST
                    && req
                        .headers()
                        .get("upgrade")
                        .is_some_and(|v| v == "SPDY/3.1")
                    && req
                        .headers()
                        .get_all("x-stream-protocol-version")
                        .iter()
                        .any(|v| v == "v4.channel.k8s.io");
                assert!(ok, "{req:?}");
                let up = hyper::upgrade::on(&mut req);
                if let Some(tx) = tx.lock().unwrap().take() {
                    let _ = tx.send(up);
                }
                async move {
                    let mut r = Response::new(http_body_util::Empty::<Bytes>::new());
                    *r.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
                    r.headers_mut()
                        .insert("connection", HeaderValue::from_static("Upgrade"));
                    r.headers_mut()
                        .insert("upgrade", HeaderValue::from_static("SPDY/3.1"));
                    r.headers_mut().insert(
                        "x-stream-protocol-version",
                        HeaderValue::from_static("v4.channel.k8s.io"),
                    );
                    Ok::<_, std::convert::Infallible>(r)
                }
            });
            tokio::spawn(
                hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tcp), svc)
                    .with_upgrades(),
            );
            let mut io = TokioIo::new(rx.await.unwrap().await.unwrap());
            let (mut enc, mut dec, mut buf) =
                (Encoder::new().unwrap(), Decoder::new(), BytesMut::new());
            let mut types = std::collections::HashMap::new();
            let mut seen = Vec::new();
            let mut stdin = Vec::new();
            loop {
                let f = loop {
                    if let Some(f) = dec.decode(&mut buf).unwrap() {
                        break f;
                    }
                    assert!(io.read_buf(&mut buf).await.unwrap() > 0);
                };
                let mut out = BytesMut::new();
                match f {
                    Frame::SynStream {
                        stream_id, headers, ..
                    } => {
                        let t = headers[0].1.clone();
                        seen.push(t.clone());
                        types.insert(t, stream_id);
                        enc.encode(
                            &Frame::SynReply {
                                stream_id,
                                flags: 0,
                                headers: vec![],
                            },
                            &mut out,
                        )
                        .unwrap();
                    }
                    Frame::Data {
                        stream_id,
                        flags,
                        data,
                    } if Some(&stream_id) == types.get("stdin") => {
                        stdin.extend_from_slice(&data);
                        if flags & frame::FLAG_FIN != 0 {
                            let data = |t: &str, d: &[u8], fin: bool| Frame::Data {
                                stream_id: types[t],
                                flags: if fin { frame::FLAG_FIN } else { 0 },
                                data: Bytes::copy_from_slice(d),
                            };
                            for f in [
                                data("stdout", &stdin.to_ascii_uppercase(), true),
                                data("stderr", b"err", true),
                                data("error", br#"{"metadata":{},"status":"Failure","message":"command terminated with non-zero exit code: exit status 3","reason":"NonZeroExitCode","details":{"causes":[{"reason":"ExitCode","message":"3"}]}}"#, true),
                            ] {
                                enc.encode(&f, &mut out).unwrap();
                            }
                            io.write_all(&out).await.unwrap();
                            return seen;
                        }
                    }
                    _ => {}
                }
                io.write_all(&out).await.unwrap();
            }
        });
        (url, task)
    }

    #[tokio::test]
    async fn v5_session_translated_to_spdy() {
        let (url, runtime) = fake_runtime().await;
        let (client_io, server_io) = tokio::io::duplex(1 << 16);
        let server = WebSocketStream::from_raw_socket(server_io, Role::Server, None).await;
        let opts = StreamOptions {
            stdin: true,
            stdout: true,
            stderr: true,
            tty: false,
        };
        let t = tokio::spawn(async move { translate(server, &url, opts, IDLE_TIMEOUT).await });
        let mut client = WebSocketStream::from_raw_socket(client_io, Role::Client, None).await;
        // The connection-established message on stdout.
        assert_eq!(client.next().await.unwrap().unwrap(), frame(STDOUT, &[]));
        // kubectl's heartbeat pings are answered while the session idles.
        client
            .send(Message::Ping(Bytes::from_static(b"hb")))
            .await
            .unwrap();
        assert_eq!(
            tokio::time::timeout(Duration::from_secs(5), client.next())
                .await
                .unwrap()
                .unwrap()
                .unwrap(),
            Message::Pong(Bytes::from_static(b"hb"))
        );
        client.send(frame(STDIN, b"hello ")).await.unwrap();
        client.send(frame(STDIN, b"world")).await.unwrap();
        // Data for a channel the client cannot write is ignored.
        client.send(frame(STDOUT, b"ignored")).await.unwrap();
        client
            .send(Message::Binary(vec![STREAM_CLOSE, STDIN].into()))
            .await
            .unwrap();
        let mut got: std::collections::BTreeMap<u8, Vec<u8>> = Default::default();
        let mut closed = false;
        while let Some(m) = client.next().await {
            match m.unwrap() {
                Message::Binary(b) => got.entry(b[0]).or_default().extend_from_slice(&b[1..]),
                Message::Close(Some(f)) => {
                    assert_eq!(f.code, CloseCode::Normal);
                    closed = true;
                }
                other => panic!("{other:?}"),
            }
        }
        assert!(closed);
        assert_eq!(got[&STDOUT], b"HELLO WORLD");
        assert_eq!(got[&STDERR], b"err");
        assert_eq!(got[&ERROR], Status::exit_code(3).to_json());
        assert_eq!(
            runtime.await.unwrap(),
            ["error", "stdin", "stdout", "stderr"]
        );
        tokio::time::timeout(Duration::from_secs(10), t)
            .await
            .unwrap()
            .unwrap();
    }

    #[tokio::test]
    async fn a_runtime_that_cannot_be_reached_is_an_internal_error() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/exec/x", l.local_addr().unwrap());
        drop(l);
        let (client_io, server_io) = tokio::io::duplex(1 << 16);
        let server = WebSocketStream::from_raw_socket(server_io, Role::Server, None).await;
        let opts = StreamOptions {
            stdin: false,
            stdout: false,
            stderr: true,
            tty: false,
        };
        tokio::spawn(async move { translate(server, &url, opts, IDLE_TIMEOUT).await });
        let mut client = WebSocketStream::from_raw_socket(client_io, Role::Client, None).await;
        assert_eq!(client.next().await.unwrap().unwrap(), frame(STDERR, &[]));
        let Message::Binary(b) = client.next().await.unwrap().unwrap() else {
            panic!("expected the status")
        };
        assert_eq!(b[0], ERROR);
        let v: Value = serde_json::from_slice(&b[1..]).unwrap();
        assert_eq!(v["reason"], "InternalError");
        assert_eq!(v["code"], 500);
        assert!(
            v["message"]
                .as_str()
                .unwrap()
                .contains("error dialing backend"),
            "{v}"
        );
    }

    #[test]
    fn upgrade_errors_read_like_client_go() {
        assert_eq!(upgrade_error_message(br#"{"message":" nope "}"#), "nope");
        assert_eq!(upgrade_error_message(b" text\n"), "text");
        assert_eq!(upgrade_error_message(b""), "empty server response");
    }
}
