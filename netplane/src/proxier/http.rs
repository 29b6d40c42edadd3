//! A minimal HTTP/1 server for the health endpoints (hyper), serving a
//! listener until the returned handle is dropped.

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::task::JoinHandle;

/// A request handler.
pub type Handler = Arc<dyn Fn(&Request<Incoming>) -> Response<Full<Bytes>> + Send + Sync>;

/// A running server; stops serving (closes the listener) when dropped.
#[derive(Debug)]
pub struct ServerHandle {
    task: JoinHandle<()>,
}

impl Drop for ServerHandle {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Serves `listener` with `handler` on the current tokio runtime.
pub fn serve(listener: tokio::net::TcpListener, handler: Handler) -> ServerHandle {
    let task = tokio::spawn(async move {
        loop {
            let (stream, _) = match listener.accept().await {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(error = %e, "health server accept failed");
                    continue;
                }
            };
            let handler = handler.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |req: Request<Incoming>| {
                    let resp = handler(&req);
                    async move { Ok::<_, Infallible>(resp) }
                });
                if let Err(e) = http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await
                {
                    tracing::debug!(error = %e, "health connection ended");
                }
            });
        }
    });
    ServerHandle { task }
}

/// A JSON response with kube-proxy's headers.
pub fn json_response(status: u16, body: String) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(Bytes::from(body)));
    *resp.status_mut() =
        hyper::StatusCode::from_u16(status).unwrap_or(hyper::StatusCode::INTERNAL_SERVER_ERROR);
    let h = resp.headers_mut();
    h.insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    h.insert(
        "X-Content-Type-Options",
        hyper::header::HeaderValue::from_static("nosniff"),
    );
    resp
}
