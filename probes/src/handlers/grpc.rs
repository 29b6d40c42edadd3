//! The `grpc` probe (upstream `pkg/probe/grpc`): a plaintext HTTP/2
//! connection to the pod IP and one `grpc.health.v1.Health/Check` with the
//! probe's service name; `SERVING` is success, any other answer or error a
//! failure, with upstream's messages.

use std::time::Duration;

use tokio::time::{Instant, sleep_until, timeout_at};
use tonic::Code;
use tonic::transport::{Channel, Endpoint};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};

use crate::result::ProbeResult;
use keelson_common::gofmt;

/// gRPC's first reconnect backoff and its growth (grpc-go defaults).
const BASE_BACKOFF: Duration = Duration::from_secs(1);
const BACKOFF_MULTIPLIER: f64 = 1.6;

/// Checks `service` at `host:port` within `timeout`.
///
/// Like upstream (which dials with `WithBlock`), a connection that cannot be
/// made is retried with gRPC's backoff until the deadline, and then reported
/// as `timeout: failed to connect service "<addr>" within <timeout>: context
/// deadline exceeded`.
pub async fn probe_grpc(
    host: &str,
    port: i32,
    service: &str,
    timeout: Duration,
    user_agent: &str,
) -> ProbeResult {
    let deadline = Instant::now() + timeout;
    let port = match u16::try_from(port) {
        Ok(port) if port > 0 => port,
        _ => {
            let addr = format!(
                "{}:{port}",
                if host.contains(':') {
                    format!("[{host}]")
                } else {
                    host.to_string()
                }
            );
            return ProbeResult::Failure(format!(
                "error: failed to connect service at {}: invalid port {port}",
                gofmt::quote(&addr)
            ));
        }
    };
    let addr = gofmt::join_host_port(host, port);
    let endpoint = match Endpoint::from_shared(format!("http://{addr}"))
        .and_then(|e| e.user_agent(user_agent))
    {
        Ok(endpoint) => endpoint,
        Err(err) => {
            return ProbeResult::Failure(format!(
                "error: failed to connect service at {}: {err}",
                gofmt::quote(&addr)
            ));
        }
    };
    let channel = match connect(&endpoint, deadline).await {
        Some(channel) => channel,
        None => {
            return ProbeResult::Failure(format!(
                "timeout: failed to connect service {} within {}: context deadline exceeded",
                gofmt::quote(&addr),
                gofmt::duration(timeout)
            ));
        }
    };
    let mut client = HealthClient::new(channel);
    let mut request = tonic::Request::new(HealthCheckRequest {
        service: service.to_string(),
    });
    request.set_timeout(deadline.saturating_duration_since(Instant::now()));
    let rpc_timeout = || {
        format!(
            "timeout: health rpc did not complete within {}",
            gofmt::duration(timeout)
        )
    };
    match timeout_at(deadline, client.check(request)).await {
        Err(_) => ProbeResult::Failure(rpc_timeout()),
        Ok(Err(status)) => match status.code() {
            Code::Unimplemented => ProbeResult::Failure(format!(
                "error: this server does not implement the grpc health protocol (grpc.health.v1.Health): {}",
                status.message()
            )),
            Code::DeadlineExceeded => ProbeResult::Failure(rpc_timeout()),
            // tonic's own enforcement of the request deadline.
            Code::Cancelled if status.message() == tonic::TimeoutExpired(()).to_string() => {
                ProbeResult::Failure(rpc_timeout())
            }
            code => ProbeResult::Failure(format!(
                "error: health rpc probe failed: rpc error: code = {code:?} desc = {}",
                status.message()
            )),
        },
        Ok(Ok(response)) => {
            let status = response.into_inner().status;
            match ServingStatus::try_from(status) {
                Ok(ServingStatus::Serving) => ProbeResult::Success,
                Ok(other) => ProbeResult::Failure(format!(
                    "service unhealthy (responded with {})",
                    gofmt::quote(other.as_str_name())
                )),
                Err(_) => {
                    ProbeResult::Failure(format!("service unhealthy (responded with \"{status}\")"))
                }
            }
        }
    }
}

/// Connects, retrying with backoff until `deadline`.
async fn connect(endpoint: &Endpoint, deadline: Instant) -> Option<Channel> {
    let mut backoff = BASE_BACKOFF;
    loop {
        let attempt_started = Instant::now();
        match timeout_at(deadline, endpoint.connect()).await {
            Ok(Ok(channel)) => return Some(channel),
            Ok(Err(err)) => tracing::trace!(error = %err, "grpc probe connect attempt failed"),
            Err(_) => return None,
        }
        let retry_at = attempt_started + backoff;
        if retry_at >= deadline {
            sleep_until(deadline).await;
            return None;
        }
        sleep_until(retry_at).await;
        backoff = backoff.mul_f64(BACKOFF_MULTIPLIER);
    }
}
