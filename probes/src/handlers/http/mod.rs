//! The `httpGet` probe (upstream `pkg/probe/http`): one GET over a fresh
//! connection (no keep-alive, `Connection: close`), HTTP/1.1, HTTPS without
//! certificate verification, redirects followed only while they stay on the
//! same host name (at most 10), the body read up to 10 KiB, and success for
//! status 200–399 (a 3xx that is not followed is a success with a warning).

mod request;
mod tls;
mod url;

use std::pin::pin;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::HeaderValue;
use http::header::LOCATION;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::rt::{Read, Write};
use hyper_util::rt::TokioIo;
use tokio_rustls::TlsConnector;

pub use request::{HttpRequest, canonical_header_key};
pub use url::ProbeUrl;

use super::dial::{DialError, dial, timeout_text};
use crate::result::ProbeResult;
use keelson_common::gofmt;

/// Redirects followed before the probe fails (Go's default).
pub const MAX_REDIRECTS: usize = 10;
/// Bytes of the response body read (upstream `maxRespBodyLength`).
pub const MAX_BODY_BYTES: usize = 10 * 1024;

/// Runs HTTP probes. One per prober, shared by every worker: it holds only
/// the TLS client configuration (connections are never reused, as upstream).
#[derive(Clone)]
pub struct HttpProber {
    tls: TlsConnector,
}

impl std::fmt::Debug for HttpProber {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpProber").finish_non_exhaustive()
    }
}

/// How far a probe got, for the timeout message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Dial,
    Headers,
    Body,
}

struct Progress {
    url: ProbeUrl,
    phase: Phase,
}

/// Why an HTTP probe or hook got no answer; the texts are Go's HTTP
/// client's (they follow `Get "<url>": ` in the probe's message).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum HttpError {
    /// The connection did not open.
    #[error(transparent)]
    Dial(#[from] DialError),
    /// The host is no TLS server name.
    #[error("tls: invalid server name {host:?}: {reason}")]
    ServerName {
        /// The host.
        host: String,
        /// Why.
        reason: String,
    },
    /// The TLS handshake failed (the text as Go's `crypto/tls` gives it).
    #[error("{0}")]
    Handshake(String),
    /// Sending the request or reading the answer's head failed (hyper's
    /// text with its causes).
    #[error("{0}")]
    Exchange(String),
    /// The body ended early.
    #[error("unexpected EOF")]
    UnexpectedEof,
    /// Reading the body failed.
    #[error("{0}")]
    Body(String),
    /// A header name the transport refuses.
    #[error("net/http: invalid header field name {}", gofmt::quote(.0))]
    HeaderName(String),
    /// A header value the transport refuses.
    #[error("net/http: invalid header field value for {}", gofmt::quote(.0))]
    HeaderValue(String),
    /// The request target does not parse.
    #[error("parse {}: {reason}", gofmt::quote(url))]
    Target {
        /// The URL.
        url: String,
        /// Why.
        reason: String,
    },
    /// The `Host` header is not a header value.
    #[error("http: invalid Host header")]
    Host,
    /// The request could not be built.
    #[error("{0}")]
    Request(String),
    /// A redirect's `Location` does not parse.
    #[error("failed to parse Location header {}", gofmt::quote(.0))]
    Location(String),
}

/// One response, body already read (capped).
struct Response {
    status: u16,
    location: Option<String>,
    body: Result<Bytes, HttpError>,
}

impl HttpProber {
    /// Creates the prober.
    pub fn new() -> Result<HttpProber, rustls::Error> {
        Ok(HttpProber {
            tls: TlsConnector::from(tls::insecure_client_config()?),
        })
    }

    /// Runs `request` once, bounded by `timeout` (redirects included).
    pub async fn probe(&self, request: &HttpRequest, timeout: Duration) -> ProbeResult {
        let mut progress = Progress {
            url: request.url.clone(),
            phase: Phase::Dial,
        };
        match tokio::time::timeout(timeout, self.follow(request, &mut progress)).await {
            Ok(result) => result,
            Err(_) => {
                let url = gofmt::quote(&progress.url.to_string());
                match progress.phase {
                    Phase::Dial => ProbeResult::Failure(format!(
                        "Get {url}: {} (Client.Timeout exceeded while awaiting headers)",
                        timeout_text(&progress.url.host, progress.url.port)
                    )),
                    Phase::Headers => ProbeResult::Failure(format!(
                        "Get {url}: context deadline exceeded (Client.Timeout exceeded while awaiting headers)"
                    )),
                    Phase::Body => ProbeResult::Unknown(
                        "context deadline exceeded (Client.Timeout or context cancellation while reading body)".into(),
                    ),
                }
            }
        }
    }

    async fn follow(&self, request: &HttpRequest, progress: &mut Progress) -> ProbeResult {
        let first_host = request.url.host.clone();
        let mut url = request.url.clone();
        let mut host_override = request.host_override.clone();
        let mut referer: Option<HeaderValue> = None;
        let mut redirects = 0;
        loop {
            progress.url = url.clone();
            progress.phase = Phase::Dial;
            // Error texts name the URL as Go does (`Get "<url>": ...`); built only on error.
            let failed = |url: &ProbeUrl, message: &dyn std::fmt::Display| {
                ProbeResult::Failure(format!("Get {}: {message}", gofmt::quote(&url.to_string())))
            };
            if url.scheme != "http" && url.scheme != "https" {
                return failed(
                    &url,
                    &format!("unsupported protocol scheme {}", gofmt::quote(&url.scheme)),
                );
            }
            let host = host_override.clone().unwrap_or_else(|| url.authority());
            let wire = match request.build(&url, &host, referer.clone()) {
                Ok(wire) => wire,
                Err(e) => return failed(&url, &e),
            };
            let response = match self.round_trip(&url, wire, progress).await {
                Ok(response) => response,
                Err(e) => return failed(&url, &e),
            };
            let location = response.location.as_deref().filter(|l| !l.is_empty());
            let redirect = matches!(response.status, 301 | 302 | 303 | 307 | 308);
            if let (true, Some(location)) = (redirect, location) {
                let (next, absolute) = match url.resolve(location) {
                    Ok(next) => next,
                    Err(e) => return failed(&url, &e),
                };
                if next.host == first_host {
                    if redirects >= MAX_REDIRECTS {
                        return ProbeResult::Failure(format!(
                            "Get {}: stopped after {MAX_REDIRECTS} redirects",
                            gofmt::quote(location)
                        ));
                    }
                    redirects += 1;
                    referer = if url.scheme == "https" && next.scheme == "http" {
                        None
                    } else {
                        request
                            .explicit_referer
                            .clone()
                            .or_else(|| HeaderValue::from_str(&url.to_string()).ok())
                    };
                    // Go keeps a custom Host through a redirect to a relative location only.
                    host_override = if absolute {
                        None
                    } else {
                        request.host_override.clone()
                    };
                    url = next;
                    continue;
                }
                // A redirect to another host is not followed: the 3xx is the answer.
            }
            return classify(response);
        }
    }

    async fn round_trip(
        &self,
        url: &ProbeUrl,
        wire: http::Request<http_body_util::Empty<Bytes>>,
        progress: &mut Progress,
    ) -> Result<Response, HttpError> {
        let tcp = dial(&url.host, url.port).await?;
        progress.phase = Phase::Headers;
        if url.scheme == "https" {
            let name = tls::server_name(&url.host)?;
            let stream = self
                .tls
                .connect(name, tcp)
                .await
                .map_err(|e| HttpError::Handshake(tls_error_text(&e)))?;
            exchange(TokioIo::new(stream), wire, progress).await
        } else {
            exchange(TokioIo::new(tcp), wire, progress).await
        }
    }
}

/// Sends one request over `io` and reads the answer, driving the connection
/// in place (no task per probe).
async fn exchange<T>(
    io: T,
    wire: http::Request<http_body_util::Empty<Bytes>>,
    progress: &mut Progress,
) -> Result<Response, HttpError>
where
    T: Read + Write + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::Builder::new()
        .title_case_headers(true)
        .handshake::<_, http_body_util::Empty<Bytes>>(io)
        .await
        .map_err(|e| HttpError::Exchange(hyper_error_text(&e)))?;
    let mut conn = pin!(conn);
    let talk = async {
        let response = sender
            .send_request(wire)
            .await
            .map_err(|e| HttpError::Exchange(hyper_error_text(&e)))?;
        progress.phase = Phase::Body;
        let status = response.status().as_u16();
        let location = response
            .headers()
            .get(LOCATION)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let body = read_capped(response.into_body(), MAX_BODY_BYTES).await;
        Ok(Response {
            status,
            location,
            body,
        })
    };
    let mut talk = pin!(talk);
    tokio::select! {
        biased;
        done = &mut talk => done,
        _ = &mut conn => talk.await,
    }
}

/// Reads at most `cap` bytes of `body`; the rest is never read (the
/// connection is closed), as upstream.
async fn read_capped(mut body: Incoming, cap: usize) -> Result<Bytes, HttpError> {
    let mut buf = BytesMut::new();
    while buf.len() < cap {
        match body.frame().await {
            None => break,
            Some(Ok(frame)) => {
                if let Ok(data) = frame.into_data() {
                    let take = (cap - buf.len()).min(data.len());
                    buf.extend_from_slice(&data[..take]);
                }
            }
            Some(Err(err)) => {
                return Err(if err.is_incomplete_message() {
                    HttpError::UnexpectedEof
                } else {
                    HttpError::Body(err.to_string())
                });
            }
        }
    }
    Ok(buf.freeze())
}

/// Maps the final response to a result, as upstream `DoHTTPProbe`.
fn classify(response: Response) -> ProbeResult {
    let body = match response.body {
        Ok(body) => body,
        // Upstream: the body could not be read, the probe errored.
        Err(e) => return ProbeResult::Unknown(e.to_string()),
    };
    match response.status {
        200..=299 => ProbeResult::Success,
        300..=399 => ProbeResult::Warning(format!(
            "Probe terminated redirects, Response body: {}",
            String::from_utf8_lossy(&body)
        )),
        code => ProbeResult::Failure(format!("HTTP probe failed with statuscode: {code}")),
    }
}

fn hyper_error_text(err: &hyper::Error) -> String {
    if err.is_incomplete_message() {
        return "EOF".to_string();
    }
    let mut text = err.to_string();
    let mut source = std::error::Error::source(err);
    while let Some(inner) = source {
        text.push_str(": ");
        text.push_str(&inner.to_string());
        source = inner.source();
    }
    text
}

fn tls_error_text(err: &std::io::Error) -> String {
    match err.get_ref() {
        Some(inner) => format!("tls: {inner}"),
        None => gofmt::os_error_text(err),
    }
}
