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
//! normally. A client that goes away (or breaks the protocol, or idles
//! for `streamingConnectionIdleTimeout`) loses only the WebSocket: the
//! runtime sees stdin end, and the command's output is read and dropped
//! until it ends, as upstream does (see [`translate`]).

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
use tokio_util::sync::CancellationToken;

use super::body::Body;
use super::remotecommand::StreamOptions;
use super::spdy::session::{Connection, Stream};
use super::wsstream;

/// The WebSocket's idle timeout (`defaultIdleConnectionTimeout`, the
/// kubelet WebSocket server's).
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(4 * 3600);
/// The SPDY client's ping period (`RoundTripperConfig.PingPeriod`).
pub const PING_PERIOD: Duration = Duration::from_secs(5);
/// How long writing the status or the close may take
/// (`writeErrorDeadline` in upstream's `websocket.go`).
const WRITE_DEADLINE: Duration = Duration::from_secs(10);

const STDIN: u8 = 0;
const STDOUT: u8 = 1;
const STDERR: u8 = 2;
const ERROR: u8 = 3;
const RESIZE: u8 = 4;
const CHANNELS: u8 = 5;
const STREAM_CLOSE: u8 = 255;

/// The SPDY protocols offered to the runtime, best first (client-go's
/// `NewSPDYExecutorForTransports` list without the v1 protocol; v5 is
/// handled as v4, as `streamProtocolV5` is).
const SPDY_PROTOCOLS: &[&str] = &[
    "v5.channel.k8s.io",
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
    if !speaks_v4(protocol) {
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
                // `strconv.ParseUint(m, 10, 8)`: digits only (Rust's
                // parser would also take a leading `+`).
                let digits = !m.is_empty() && m.bytes().all(|b| b.is_ascii_digit());
                return match m.parse::<u8>().ok().filter(|_| digits) {
                    Some(rc) => Status::exit_code(rc),
                    None => Status::internal(format!(
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

/// Whether the negotiated SPDY protocol reports exit codes as a
/// `metav1.Status` (v4, and v5 which is v4 over SPDY).
fn speaks_v4(protocol: &str) -> bool {
    matches!(protocol, "v4.channel.k8s.io" | "v5.channel.k8s.io")
}

/// The SPDY connection to the runtime and the negotiated protocol.
type Spdy = Connection<TokioIo<hyper::upgrade::Upgraded>>;

/// Why the translator has no SPDY streams to the runtime (client-go's
/// `spdy.Negotiate` texts, sent to the client as an internal Status).
#[derive(Debug, thiserror::Error)]
pub(crate) enum TranslateError {
    /// The upgrade request failed.
    #[error("error sending request: Post {location:?}: {error}")]
    Request {
        /// The runtime's streaming URL.
        location: String,
        /// Why.
        error: super::upgrade_proxy::UpgradeError,
    },
    /// The runtime answered without upgrading (its message).
    #[error("unable to upgrade connection: {0}")]
    Refused(String),
    /// The upgraded connection could not be taken over.
    #[error("unable to upgrade connection: {0}")]
    Upgrade(hyper::Error),
    /// The SPDY session failed.
    #[error(transparent)]
    Session(#[from] super::spdy::session::SessionError),
}

/// Upgrades to SPDY at the runtime's streaming URL (`spdy.NegotiateStreaming`).
async fn connect(location: &str) -> Result<(Spdy, String), TranslateError> {
    let mut h = HeaderMap::new();
    h.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    h.insert(header::UPGRADE, HeaderValue::from_static("SPDY/3.1"));
    for p in SPDY_PROTOCOLS {
        h.append("x-stream-protocol-version", HeaderValue::from_static(p));
    }
    // `spdy.Negotiate`: the request failing is "error sending request"
    // with Go's `url.Error` text (method and quoted URL) before the cause.
    let mut resp = super::upgrade_proxy::request_upgrade(location, Method::POST, &h)
        .await
        .map_err(|error| TranslateError::Request {
            location: location.to_string(),
            error,
        })?;
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
        return Err(TranslateError::Refused(upgrade_error_message(&body)));
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
        .map_err(TranslateError::Upgrade)?;
    let conn = Connection::start(TokioIo::new(up), Some(PING_PERIOD))?;
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

async fn open_streams(
    conn: &Spdy,
    opts: StreamOptions,
    protocol: &str,
) -> Result<Streams, TranslateError> {
    let open = |t: &'static str| async move {
        conn.open(vec![("streamType".into(), t.into())], false)
            .await
            .map_err(TranslateError::Session)
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
///
/// A client that goes away (or breaks the protocol, or is idle for
/// `idle`) ends only the WebSocket side, as upstream's
/// `wsstream.Conn.handle` does when its read loop fails
/// (`k8s.io/streaming/pkg/httpstream/wsstream/conn.go`): every channel is
/// closed, so the runtime sees stdin end (`copyStdin` closes the remote
/// stdin at EOF, `client-go/tools/remotecommand/v2.go`), and the
/// WebSocket is closed. The SPDY session goes on: stdout and stderr are
/// read and dropped until the runtime ends them (`copyStdout`'s deferred
/// `io.Copy(io.Discard, ...)`), then the error stream is read, and only
/// then is the SPDY connection closed (`StreamWithContext` returns; its
/// context is the hijacked request's, which a client leaving does not
/// cancel — `streamtranslator.go`).
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
    // Cancelled once the client is gone: its read side ended, or the
    // WebSocket was idle too long (upstream's read deadline).
    let gone = CancellationToken::new();

    // Client → runtime: stdin, its close signal, resizes.
    let input = {
        let touch = touch.clone();
        let gone = gone.clone();
        async move {
            let mut stdin = stdin;
            loop {
                let m = tokio::select! {
                    m = source.next() => m,
                    _ = gone.cancelled() => break,
                    // The runtime ended stdin: close our side too, and
                    // drop what the client still sends on it (the second
                    // goroutine of `copyStdin` in client-go's `v2.go`).
                    d = async {
                        match stdin.as_mut() {
                            Some(s) => s.rx.recv().await,
                            None => std::future::pending().await,
                        }
                    } => {
                        if d.is_none()
                            && let Some(s) = stdin.take()
                        {
                            let _ = s.close_write().await;
                        }
                        continue;
                    }
                };
                let data: Bytes = match m {
                    Some(Ok(Message::Binary(b))) => b,
                    Some(Ok(Message::Text(t))) => Bytes::copy_from_slice(t.as_bytes()),
                    Some(Ok(Message::Close(_)) | Err(_)) | None => break,
                    Some(Ok(_)) => continue,
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
            // The client is gone (or broke the protocol): its channels
            // close, so the runtime sees stdin end. The resize stream
            // stays open, as upstream's `handleResizes` leaves it.
            if let Some(s) = stdin.take() {
                let _ = s.close_write().await;
            }
            // With the sink dropped too, the connection closes.
            drop(source);
            gone.cancel();
        }
    };

    // Runtime → client: stdout, stderr, then the status. Once the client
    // is gone the output is read and dropped.
    let output = {
        let gone = gone.clone();
        async move {
            let mut sink = Some(sink);
            let mut out_rx = stdout.map(|s| s.rx);
            let mut err_rx = stderr.map(|s| s.rx);
            let mut status_rx = Some(&mut error.rx);
            let mut status = Vec::new();
            while out_rx.is_some() || err_rx.is_some() || status_rx.is_some() {
                let (channel, data) = tokio::select! {
                    d = next(&mut out_rx) => match d {
                        Some(d) => (STDOUT, d),
                        None => {
                            out_rx = None;
                            continue;
                        }
                    },
                    d = next(&mut err_rx) => match d {
                        Some(d) => (STDERR, d),
                        None => {
                            err_rx = None;
                            continue;
                        }
                    },
                    d = async {
                        match status_rx.as_mut() {
                            Some(r) => r.recv().await,
                            None => std::future::pending().await,
                        }
                    } => {
                        match d {
                            Some(d) if status.len() < (1 << 20) => status.extend_from_slice(&d),
                            Some(_) => {}
                            None => status_rx = None,
                        }
                        continue;
                    }
                    _ = gone.cancelled(), if sink.is_some() => {
                        if let Some(mut s) = sink.take() {
                            close_socket(&mut s).await;
                        }
                        continue;
                    }
                };
                let Some(s) = sink.as_mut() else {
                    // Nobody reads it any more: dropped.
                    continue;
                };
                touch();
                let sent = tokio::select! {
                    r = s.send(frame(channel, &data)) => r.is_ok(),
                    _ = gone.cancelled() => false,
                };
                if !sent {
                    // `copyStdout`: a failed write ends the copy, and
                    // the rest is drained.
                    gone.cancel();
                    sink = None;
                }
            }
            (sink, decode_error_stream(&protocol, &status))
        }
    };

    let watchdog = super::upgrade_proxy::idle_watchdog(start, &last, idle);
    tokio::pin!(input, output, watchdog);
    let mut input_done = false;
    let mut idle_seen = false;
    let (sink, status) = loop {
        tokio::select! {
            r = &mut output => break r,
            () = &mut input, if !input_done => input_done = true,
            () = &mut watchdog, if !idle_seen => {
                idle_seen = true;
                if !gone.is_cancelled() {
                    tracing::debug!(?idle, "WebSocket idle too long; closed");
                    gone.cancel();
                }
            }
        }
    };
    conn.close().await;
    let Some(mut sink) = sink else {
        // The client left: nobody to tell the status to (upstream's
        // `writeStatus` fails on the closed WebSocket).
        return;
    };
    write_status(&mut sink, status).await;
    // Let the reader see the client's close reply (briefly).
    if !input_done {
        let _ = tokio::time::timeout(Duration::from_secs(5), input).await;
    }
}

/// Closes the WebSocket as `wsstream.Conn.Close` does (a normal close
/// frame), within upstream's `writeErrorDeadline`.
async fn close_socket<S>(sink: &mut SplitSink<WebSocketStream<S>, Message>)
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let close = Message::Close(Some(CloseFrame {
        code: CloseCode::Normal,
        reason: "".into(),
    }));
    let _ = tokio::time::timeout(WRITE_DEADLINE, async {
        // Refused once the client closed first; `close` then flushes
        // tungstenite's queued reply to the client's close.
        let _ = sink.send(close).await;
        let _ = sink.close().await;
    })
    .await;
}

/// Writes the status on the error channel and closes the WebSocket.
async fn write_status<S>(sink: &mut SplitSink<WebSocketStream<S>, Message>, status: Status)
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let _ = tokio::time::timeout(WRITE_DEADLINE, sink.send(frame(ERROR, &status.to_json()))).await;
    close_socket(sink).await;
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
        // v5 over SPDY is v4; a signed exit code is not one (ParseUint).
        assert_eq!(
            decode_error_stream("v5.channel.k8s.io", exit),
            Status::exit_code(3)
        );
        let signed = String::from_utf8_lossy(exit).replace(r#""message":"3""#, r#""message":"+3""#);
        assert_eq!(
            decode_error_stream(v4, signed.as_bytes()),
            Status::internal(r#"error stream protocol error: invalid exit code value "+3""#)
        );
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

    use crate::server::spdy::frame::{self, Decoder, Encoder, Frame};
    use bytes::BytesMut;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio_tungstenite::tungstenite::protocol::Role;

    /// What the fake runtime saw of the session.
    #[derive(Debug)]
    struct Seen {
        /// The streams opened, by `streamType`.
        streams: Vec<String>,
        /// What came on stdin.
        stdin: Vec<u8>,
        /// Stdin was half-closed (FIN).
        stdin_fin: bool,
        /// The connection was closed (GOAWAY or EOF) only after the
        /// runtime had written all its output and the status.
        closed_after_output: bool,
    }

    /// A runtime streaming server for one exec: accepts the SPDY upgrade
    /// (v4), the streams the client opens, upper-cases stdin onto stdout
    /// until stdin's FIN, then writes `extra` more bytes on stdout, `err`
    /// on stderr, and exits 3; then waits for the client to close. With
    /// `end_stdin_first` it half-closes stdin at the first data on it.
    async fn fake_runtime(
        extra: usize,
        end_stdin_first: bool,
    ) -> (String, tokio::task::JoinHandle<Seen>) {
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
            let mut seen = Seen {
                streams: Vec::new(),
                stdin: Vec::new(),
                stdin_fin: false,
                closed_after_output: false,
            };
            let mut output_written = false;
            loop {
                // The next frame; EOF or GOAWAY is the client closing.
                let f = loop {
                    match dec.decode(&mut buf).unwrap() {
                        Some(f) => break Some(f),
                        None => match io.read_buf(&mut buf).await {
                            Ok(n) if n > 0 => {}
                            _ => break None,
                        },
                    }
                };
                let f = match f {
                    None | Some(Frame::GoAway { .. }) => {
                        seen.closed_after_output = output_written;
                        return seen;
                    }
                    Some(f) => f,
                };
                let mut out = BytesMut::new();
                match f {
                    Frame::SynStream {
                        stream_id, headers, ..
                    } => {
                        let t = headers[0].1.clone();
                        seen.streams.push(t.clone());
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
                        seen.stdin.extend_from_slice(&data);
                        if end_stdin_first && !data.is_empty() {
                            // The runtime half-closes stdin first.
                            enc.encode(
                                &Frame::Data {
                                    stream_id,
                                    flags: frame::FLAG_FIN,
                                    data: Bytes::new(),
                                },
                                &mut out,
                            )
                            .unwrap();
                        }
                        if flags & frame::FLAG_FIN != 0 {
                            seen.stdin_fin = true;
                            let data = |t: &str, d: &[u8], fin: bool| Frame::Data {
                                stream_id: types[t],
                                flags: if fin { frame::FLAG_FIN } else { 0 },
                                data: Bytes::copy_from_slice(d),
                            };
                            let mut frames =
                                vec![data("stdout", &seen.stdin.to_ascii_uppercase(), false)];
                            let chunk = vec![b'x'; 16 * 1024];
                            let mut left = extra;
                            while left > 0 {
                                let n = left.min(chunk.len());
                                frames.push(data("stdout", &chunk[..n], false));
                                left -= n;
                            }
                            frames.extend([
                                data("stdout", b"", true),
                                data("stderr", b"err", true),
                                data("error", br#"{"metadata":{},"status":"Failure","message":"command terminated with non-zero exit code: exit status 3","reason":"NonZeroExitCode","details":{"causes":[{"reason":"ExitCode","message":"3"}]}}"#, true),
                            ]);
                            for f in frames {
                                enc.encode(&f, &mut out).unwrap();
                            }
                            if io.write_all(&out).await.is_err() {
                                return seen;
                            }
                            output_written = true;
                            continue;
                        }
                    }
                    _ => {}
                }
                if io.write_all(&out).await.is_err() {
                    return seen;
                }
            }
        });
        (url, task)
    }

    type Client = WebSocketStream<tokio::io::DuplexStream>;

    /// A stdin/stdout/stderr session against [`fake_runtime`]: the
    /// runtime's task, the translator's task, and the client, which has
    /// read the connection-established message.
    async fn session(
        extra: usize,
        end_stdin_first: bool,
    ) -> (
        tokio::task::JoinHandle<Seen>,
        tokio::task::JoinHandle<()>,
        Client,
    ) {
        let (url, runtime) = fake_runtime(extra, end_stdin_first).await;
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
        (runtime, t, client)
    }

    #[tokio::test]
    async fn v5_session_translated_to_spdy() {
        let (runtime, t, mut client) = session(0, false).await;
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
        let seen = runtime.await.unwrap();
        assert_eq!(seen.streams, ["error", "stdin", "stdout", "stderr"]);
        assert!(seen.closed_after_output);
        tokio::time::timeout(Duration::from_secs(10), t)
            .await
            .unwrap()
            .unwrap();
    }

    /// A client that goes away (dropping the connection, or sending a
    /// close) loses only the WebSocket: the runtime sees stdin end, its
    /// output (more than any buffer holds) is read to the end, and only
    /// then is the SPDY connection closed, as upstream's translator does
    /// (`wsstream.Conn.handle` closing the channels; `copyStdout`
    /// draining; `StreamWithContext` running on).
    #[tokio::test]
    async fn a_client_that_leaves_ends_stdin_and_the_command_runs_to_its_end() {
        for polite in [false, true] {
            let (runtime, t, mut client) = session(4 << 20, false).await;
            client.send(frame(STDIN, b"bye")).await.unwrap();
            if polite {
                // A close: answered by a close, and nothing else comes.
                client.send(Message::Close(None)).await.unwrap();
                let mut got_close = false;
                while let Some(Ok(m)) = client.next().await {
                    match m {
                        Message::Close(_) => got_close = true,
                        Message::Binary(b) => assert_ne!(b[0], ERROR, "status after close"),
                        _ => {}
                    }
                }
                assert!(got_close, "polite={polite}");
            } else {
                drop(client);
            }
            let seen = tokio::time::timeout(Duration::from_secs(20), runtime)
                .await
                .unwrap()
                .unwrap();
            assert_eq!(seen.stdin, b"bye", "polite={polite}");
            assert!(seen.stdin_fin, "stdin not closed: {seen:?}");
            assert!(seen.closed_after_output, "closed early: {seen:?}");
            tokio::time::timeout(Duration::from_secs(10), t)
                .await
                .unwrap()
                .unwrap();
        }
    }

    /// The runtime ending stdin ends the client's side of it too (as
    /// client-go's `copyStdin` does), so a command that waits for its
    /// stdin to close finishes though the client never closed it.
    #[tokio::test]
    async fn the_runtime_ending_stdin_closes_it() {
        let (runtime, t, mut client) = session(0, true).await;
        client.send(frame(STDIN, b"x")).await.unwrap();
        let mut got: std::collections::BTreeMap<u8, Vec<u8>> = Default::default();
        tokio::time::timeout(Duration::from_secs(10), async {
            while let Some(Ok(m)) = client.next().await {
                if let Message::Binary(b) = m {
                    got.entry(b[0]).or_default().extend_from_slice(&b[1..]);
                }
            }
        })
        .await
        .expect("the session ends");
        assert_eq!(got[&STDOUT], b"X");
        assert_eq!(got[&ERROR], Status::exit_code(3).to_json());
        let seen = runtime.await.unwrap();
        assert!(seen.stdin_fin && seen.closed_after_output, "{seen:?}");
        tokio::time::timeout(Duration::from_secs(10), t)
            .await
            .unwrap()
            .unwrap();
    }

    #[tokio::test]
    async fn a_runtime_that_cannot_be_reached_is_an_internal_error() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/exec/x", l.local_addr().unwrap());
        let target = url.clone();
        drop(l);
        let (client_io, server_io) = tokio::io::duplex(1 << 16);
        let server = WebSocketStream::from_raw_socket(server_io, Role::Server, None).await;
        let opts = StreamOptions {
            stdin: false,
            stdout: false,
            stderr: true,
            tty: false,
        };
        tokio::spawn(async move { translate(server, &target, opts, IDLE_TIMEOUT).await });
        let mut client = WebSocketStream::from_raw_socket(client_io, Role::Client, None).await;
        assert_eq!(client.next().await.unwrap().unwrap(), frame(STDERR, &[]));
        let Message::Binary(b) = client.next().await.unwrap().unwrap() else {
            panic!("expected the status")
        };
        assert_eq!(b[0], ERROR);
        let v: Value = serde_json::from_slice(&b[1..]).unwrap();
        assert_eq!(v["reason"], "InternalError");
        assert_eq!(v["code"], 500);
        let m = v["message"].as_str().unwrap();
        assert!(
            m.starts_with(&format!(
                "Internal error occurred: error sending request: Post {url:?}: error dialing backend: "
            )),
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
