//! `/stats/summary` (`pkg/kubelet/server/stats/handler.go`) and the
//! metrics endpoints: `/metrics` (the registry), `/metrics/resource`,
//! `/metrics/cadvisor`, `/metrics/probes` (`prober_probe_total` and
//! `process_start_time_seconds`, as kubelet registers there).

use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use prometheus::Encoder;

use super::NodeApi;
use super::body::{self, Body};
use crate::stats::exposition;

/// `/stats/summary[?only_cpu_and_memory=true]`.
pub async fn summary(api: &NodeApi, req: Request<Incoming>) -> Response<Body> {
    let pairs = req
        .uri()
        .query()
        .map(super::basic::url_pairs)
        .unwrap_or_default();
    let only: Vec<&String> = pairs
        .iter()
        .filter(|(k, _)| k == "only_cpu_and_memory")
        .map(|(_, v)| v)
        .collect();
    let only_cpu_and_memory = only.len() == 1 && only[0] == "true";
    let snapshot = api.stats.current().await;
    match &snapshot.summary {
        Ok(s) if only_cpu_and_memory => body::json(&s.cpu_and_memory()),
        Ok(s) => body::json(s),
        Err(e) => {
            tracing::error!(error = %e, request = "/stats/summary", "HTTP InternalServerError serving");
            body::text(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("Internal Error: {e}"),
            )
        }
    }
}

fn render_families(families: &[prometheus::proto::MetricFamily]) -> String {
    let mut buf = Vec::new();
    if let Err(e) = prometheus::TextEncoder::new().encode(families, &mut buf) {
        return format!("# error encoding metrics: {e}\n");
    }
    String::from_utf8_lossy(&buf).into_owned()
}

/// The metrics endpoints.
pub async fn metrics(api: &NodeApi, path: &str) -> Response<Body> {
    match path {
        "/metrics" => body::prometheus(keelson_common::observability::metrics::render(
            &api.ctx.registry,
        )),
        "/metrics/probes" => {
            let families: Vec<_> = api
                .ctx
                .registry
                .gather()
                .into_iter()
                .filter(|f| {
                    matches!(
                        f.name(),
                        "prober_probe_total"
                            | "prober_probe_duration_seconds"
                            | "process_start_time_seconds"
                    )
                })
                .collect();
            body::prometheus(render_families(&families))
        }
        "/metrics/resource" => {
            let snapshot = api.stats.current().await;
            if let Err(e) = &snapshot.summary {
                tracing::error!(error = %e, "error getting summary for resourceMetric prometheus endpoint");
            }
            body::prometheus(exposition::resource_metrics(snapshot.summary.as_ref().ok()))
        }
        "/metrics/cadvisor" => {
            // Served from the last round; a failed round is answered as
            // cAdvisor's collectors answer a failure under kubelet's
            // `ContinueOnError` handler: 200 with the scrape error gauges
            // at 1.
            let snapshot = api.stats.current().await;
            if let Err(e) = &snapshot.summary {
                tracing::warn!(error = %e, "couldn't get containers for /metrics/cadvisor");
            }
            body::prometheus(crate::stats::cadvisor::cadvisor_metrics(
                snapshot.cadvisor.as_ref(),
                jiff::Timestamp::now().as_millisecond(),
            ))
        }
        _ => body::not_found(),
    }
}
