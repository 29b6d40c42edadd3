//! The `grpc` handler against tonic-health's server and a bare HTTP/2
//! server on loopback.

mod support;

use std::convert::Infallible;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Empty;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use keelson_probes::ProbeResult;
use keelson_probes::handlers::grpc::probe_grpc;
use tokio::net::TcpListener;
use tonic_health::ServingStatus;

const UA: &str = "kube-probe/1.36";

/// tonic-health's server, with "" and "shop.Cart" SERVING and
/// "shop.Payments" NOT_SERVING.
async fn health_server() -> (u16, tokio::task::JoinHandle<()>) {
    let (reporter, service) = tonic_health::server::health_reporter();
    reporter
        .set_service_status("", ServingStatus::Serving)
        .await;
    reporter
        .set_service_status("shop.Cart", ServingStatus::Serving)
        .await;
    reporter
        .set_service_status("shop.Payments", ServingStatus::NotServing)
        .await;
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap_or_else(|e| panic!("bind: {e}"));
    let port = listener.local_addr().map(|a| a.port()).unwrap_or(0);
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
    let task = tokio::spawn(async move {
        let _reporter = reporter;
        let _ = tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(incoming)
            .await;
    });
    (port, task)
}

#[tokio::test]
async fn serving_not_serving_and_unknown_services() {
    let (port, server) = health_server().await;
    let t = Duration::from_secs(5);
    assert_eq!(
        probe_grpc("127.0.0.1", i32::from(port), "", t, UA).await,
        ProbeResult::Success
    );
    assert_eq!(
        probe_grpc("127.0.0.1", i32::from(port), "shop.Cart", t, UA).await,
        ProbeResult::Success
    );
    assert_eq!(
        probe_grpc("127.0.0.1", i32::from(port), "shop.Payments", t, UA).await,
        ProbeResult::Failure("service unhealthy (responded with \"NOT_SERVING\")".into())
    );
    assert_eq!(
        probe_grpc("127.0.0.1", i32::from(port), "shop.Unknown", t, UA).await,
        ProbeResult::Failure(
            "error: health rpc probe failed: rpc error: code = NotFound desc = service not registered".into()
        )
    );
    server.abort();
}

#[tokio::test]
async fn nothing_listening_times_out_connecting() {
    let port = support::closed_port().await;
    let started = Instant::now();
    assert_eq!(
        probe_grpc("127.0.0.1", i32::from(port), "", Duration::from_secs(1), UA).await,
        ProbeResult::Failure(format!(
            "timeout: failed to connect service \"127.0.0.1:{port}\" within 1s: context deadline exceeded"
        ))
    );
    let took = started.elapsed();
    assert!(
        took >= Duration::from_secs(1) && took < Duration::from_secs(2),
        "took {took:?}"
    );
}

#[tokio::test]
async fn invalid_port_fails() {
    assert_eq!(
        probe_grpc("127.0.0.1", 70000, "", Duration::from_secs(1), UA).await,
        ProbeResult::Failure(
            "error: failed to connect service at \"127.0.0.1:70000\": invalid port 70000".into()
        )
    );
}

/// What the bare HTTP/2 server does with every call.
#[derive(Clone, Copy)]
enum Bare {
    /// Answers `grpc-status: 12` (no health service).
    Unimplemented,
    /// Never answers.
    Hang,
}

/// A bare HTTP/2 server; returns its port and the user agents it saw.
async fn bare_server(
    mode: Bare,
) -> (
    u16,
    tokio::sync::mpsc::UnboundedReceiver<String>,
    tokio::task::JoinHandle<()>,
) {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap_or_else(|e| panic!("bind: {e}"));
    let port = listener.local_addr().map(|a| a.port()).unwrap_or(0);
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let task = tokio::spawn(async move {
        while let Ok((sock, _)) = listener.accept().await {
            let tx = tx.clone();
            tokio::spawn(async move {
                let service = service_fn(move |req: http::Request<hyper::body::Incoming>| {
                    let tx = tx.clone();
                    async move {
                        let ua = req
                            .headers()
                            .get("user-agent")
                            .and_then(|v| v.to_str().ok())
                            .unwrap_or("");
                        let _ = tx.send(format!("{} {ua}", req.uri().path()));
                        if let Bare::Hang = mode {
                            tokio::time::sleep(Duration::from_secs(3600)).await;
                        }
                        let response = http::Response::builder()
                            .status(200)
                            .header("content-type", "application/grpc")
                            .header("grpc-status", "12")
                            .header("grpc-message", "unknown service grpc.health.v1.Health")
                            .body(Empty::<Bytes>::new());
                        Ok::<_, Infallible>(response.unwrap_or_default())
                    }
                });
                let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(sock), service)
                    .await;
            });
        }
    });
    (port, rx, task)
}

#[tokio::test]
async fn a_server_without_the_health_service_is_reported() {
    let (port, mut seen, server) = bare_server(Bare::Unimplemented).await;
    assert_eq!(
        probe_grpc("127.0.0.1", i32::from(port), "", Duration::from_secs(5), UA).await,
        ProbeResult::Failure(
            "error: this server does not implement the grpc health protocol (grpc.health.v1.Health): unknown service grpc.health.v1.Health".into()
        )
    );
    let call = seen.recv().await.unwrap_or_default();
    assert!(
        call.starts_with("/grpc.health.v1.Health/Check kube-probe/1.36"),
        "{call}"
    );
    server.abort();
}

#[tokio::test]
async fn a_check_that_does_not_answer_times_out() {
    let (port, _seen, server) = bare_server(Bare::Hang).await;
    let started = Instant::now();
    assert_eq!(
        probe_grpc("127.0.0.1", i32::from(port), "", Duration::from_secs(1), UA).await,
        ProbeResult::Failure("timeout: health rpc did not complete within 1s".into())
    );
    assert!(started.elapsed() < Duration::from_secs(2));
    server.abort();
}
