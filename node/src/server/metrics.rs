//! kubelet's server metrics (`pkg/kubelet/server/metrics/metrics.go`):
//! requests, in-flight requests and durations, by method bucket, path
//! bucket, server type (`readwrite`/`readonly`) and whether the request is
//! long-running (exec, attach, portforward); and the WebSocket streaming
//! requests kubelet handles itself.

use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry};

use keelson_common::observability::metrics::register;

/// The request metrics (shared by the secure and read-only servers).
#[derive(Clone)]
pub struct ServerMetrics {
    /// `kubelet_http_requests_total`.
    pub requests: IntCounterVec,
    /// `kubelet_http_inflight_requests`.
    pub inflight: IntGaugeVec,
    /// `kubelet_http_requests_duration_seconds`.
    pub duration: HistogramVec,
    /// `kubelet_websocket_streaming_requests_total{subresource}`: the
    /// WebSocket exec/attach/portforward requests kubelet itself
    /// translated or tunneled (`ExtendWebSocketsToKubelet`).
    pub websocket_streaming: IntCounterVec,
}

const LABELS: &[&str] = &["method", "path", "server_type", "long_running"];

impl ServerMetrics {
    /// Creates and registers them.
    pub fn new(registry: &Registry) -> Self {
        let requests = IntCounterVec::new(
            Opts::new(
                "kubelet_http_requests_total",
                "Number of the http requests received since the server started",
            ),
            LABELS,
        )
        .expect("constant metric options are valid");
        let inflight = IntGaugeVec::new(
            Opts::new(
                "kubelet_http_inflight_requests",
                "Number of the inflight http requests",
            ),
            LABELS,
        )
        .expect("constant metric options are valid");
        let duration = HistogramVec::new(
            HistogramOpts::new(
                "kubelet_http_requests_duration_seconds",
                "Duration in seconds to serve http requests",
            ),
            LABELS,
        )
        .expect("constant metric options are valid");
        let websocket_streaming = IntCounterVec::new(
            Opts::new(
                "kubelet_websocket_streaming_requests_total",
                "Total number of WebSocket streaming requests (exec/attach/portforward) received by the kubelet.",
            ),
            &["subresource"],
        )
        .expect("constant metric options are valid");
        register(registry, requests.clone());
        register(registry, inflight.clone());
        register(registry, duration.clone());
        register(registry, websocket_streaming.clone());
        ServerMetrics {
            requests,
            inflight,
            duration,
            websocket_streaming,
        }
    }
}

/// The path bucket: the first path segment (`metrics/<x>` for metrics
/// paths) when it is one the server serves, else `other`.
pub fn path_bucket(path: &str) -> &'static str {
    let mut parts = path.trim_start_matches('/').splitn(3, '/');
    let first = parts.next().unwrap_or_default();
    if first == "metrics"
        && let Some(second) = parts.next()
    {
        return match second {
            "cadvisor" => "metrics/cadvisor",
            "probes" => "metrics/probes",
            "resource" => "metrics/resource",
            _ => "other",
        };
    }
    match first {
        "healthz" => "healthz",
        "pods" => "pods",
        "stats" => "stats",
        "metrics" => "metrics",
        "run" => "run",
        "exec" => "exec",
        "attach" => "attach",
        "portForward" => "portForward",
        "containerLogs" => "containerLogs",
        "configz" => "configz",
        "runningpods" => "runningpods",
        _ => "other",
    }
}

/// The method bucket.
pub fn method_bucket(method: &str) -> &'static str {
    match method {
        "OPTIONS" => "OPTIONS",
        "GET" => "GET",
        "HEAD" => "HEAD",
        "POST" => "POST",
        "PUT" => "PUT",
        "DELETE" => "DELETE",
        "TRACE" => "TRACE",
        "CONNECT" => "CONNECT",
        _ => "other",
    }
}

/// kubelet's `isLongRunningRequest` on the path bucket (its map has
/// `portforward` in lower case, so a `portForward` bucket is not counted
/// as long-running there either).
pub fn long_running(bucket: &str) -> bool {
    matches!(bucket, "exec" | "attach" | "portforward" | "debug")
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn buckets() {
        assert_eq!(path_bucket("/metrics/resource"), "metrics/resource");
        assert_eq!(path_bucket("/metrics"), "metrics");
        assert_eq!(path_bucket("/metrics/nope"), "other");
        assert_eq!(path_bucket("/containerLogs/a/b/c"), "containerLogs");
        assert_eq!(path_bucket("/nope"), "other");
        assert_eq!(method_bucket("PATCH"), "other");
        assert!(long_running("exec"));
        assert!(!long_running("portForward"));
    }
}
