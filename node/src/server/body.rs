//! Response bodies and the plain answers kubelet's server gives.

use bytes::Bytes;
use http::{Response, StatusCode, header};
use http_body_util::{BodyExt, Full, StreamBody, combinators::BoxBody};
use hyper::body::Frame;

/// The body of every response.
pub type Body = BoxBody<Bytes, std::io::Error>;

/// A whole body.
pub fn full(b: impl Into<Bytes>) -> Body {
    Full::new(b.into()).map_err(|never| match never {}).boxed()
}

/// An empty body.
pub fn empty() -> Body {
    full(Bytes::new())
}

/// A body fed by a channel of chunks (streamed logs); ends when the sender
/// is dropped.
pub fn channel(rx: tokio::sync::mpsc::Receiver<Result<Bytes, std::io::Error>>) -> Body {
    let stream = tokio_stream::wrappers::ReceiverStream::new(rx);
    let frames = futures::StreamExt::map(stream, |r| r.map(Frame::data));
    BodyExt::boxed(StreamBody::new(frames))
}

fn build(code: StatusCode, content_type: Option<&str>, body: Body) -> Response<Body> {
    let mut r = Response::new(body);
    *r.status_mut() = code;
    if let Some(ct) = content_type
        && let Ok(v) = ct.parse()
    {
        r.headers_mut().insert(header::CONTENT_TYPE, v);
    }
    r
}

/// go-restful's `WriteErrorString` / `WriteError`: the text as is
/// (Go sniffs it as plain text).
pub fn text(code: StatusCode, msg: impl Into<String>) -> Response<Body> {
    build(code, Some("text/plain; charset=utf-8"), full(msg.into()))
}

/// Go's `http.Error`: the text and a newline, `nosniff`.
pub fn http_error(code: StatusCode, msg: &str) -> Response<Body> {
    let mut r = text(code, format!("{msg}\n"));
    r.headers_mut().insert(
        header::HeaderName::from_static("x-content-type-options"),
        header::HeaderValue::from_static("nosniff"),
    );
    r
}

/// A JSON answer (200).
pub fn json(value: &impl serde::Serialize) -> Response<Body> {
    match serde_json::to_vec(value) {
        Ok(v) => build(StatusCode::OK, Some("application/json"), full(v)),
        Err(e) => text(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("Internal Error: {e}"),
        ),
    }
}

/// Prometheus text exposition.
pub fn prometheus(text_body: String) -> Response<Body> {
    build(
        StatusCode::OK,
        Some("text/plain; version=0.0.4; charset=utf-8"),
        full(text_body),
    )
}

/// Go's `http.NotFound`: a path no handler is registered for.
pub fn not_found() -> Response<Body> {
    text(StatusCode::NOT_FOUND, "404 page not found")
}

/// go-restful's answer to a path below a web service's root that no route
/// of it matches.
pub fn restful_not_found() -> Response<Body> {
    text(StatusCode::NOT_FOUND, "404: Page Not Found")
}

/// go-restful's answer to a known path with another method.
pub fn method_not_allowed() -> Response<Body> {
    text(StatusCode::METHOD_NOT_ALLOWED, "405: Method Not Allowed")
}
