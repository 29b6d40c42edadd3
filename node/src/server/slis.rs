//! `/metrics/slis`: the health checks as service level indicators, as
//! component-base's `slis` package records them (`ObserveHealthcheck` in
//! `staging/src/k8s.io/component-base/metrics/prometheus/slis/metrics.go`,
//! called by the root `/healthz` handler for every check it runs):
//! `kubernetes_healthcheck{name,type}` (1 passed, 0 failed, last run) and
//! `kubernetes_healthchecks_total{name,status,type}` (`success`/`error`),
//! `type` `healthz`. Its own registry: they are not on `/metrics`.

use keelson_common::observability::CheckFailed;
use prometheus::{GaugeVec, IntCounterVec, Opts, Registry};

/// The SLI metrics; cheap to clone.
#[derive(Clone)]
pub struct Slis {
    registry: Registry,
    last: GaugeVec,
    total: IntCounterVec,
}

impl std::fmt::Debug for Slis {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Slis").finish_non_exhaustive()
    }
}

impl Default for Slis {
    fn default() -> Self {
        let registry = Registry::new();
        let last = GaugeVec::new(
            Opts::new(
                "kubernetes_healthcheck",
                "[STABLE] This metric records the result of a single healthcheck.",
            ),
            &["name", "type"],
        )
        .expect("constant metric name is valid");
        let total = IntCounterVec::new(
            Opts::new(
                "kubernetes_healthchecks_total",
                "[STABLE] This metric records the results of all healthcheck.",
            ),
            &["name", "status", "type"],
        )
        .expect("constant metric name is valid");
        keelson_common::observability::metrics::register(&registry, last.clone());
        keelson_common::observability::metrics::register(&registry, total.clone());
        Slis {
            registry,
            last,
            total,
        }
    }
}

impl Slis {
    /// Records the checks the root `/healthz` ran.
    pub fn observe(&self, results: &[(String, Result<(), CheckFailed>)]) {
        for (name, r) in results {
            let (value, status) = if r.is_ok() {
                (1.0, "success")
            } else {
                (0.0, "error")
            };
            self.last.with_label_values(&[name, "healthz"]).set(value);
            self.total
                .with_label_values(&[name, status, "healthz"])
                .inc();
        }
    }

    /// The exposition text.
    pub fn text(&self) -> String {
        let mut buf = Vec::new();
        let enc = prometheus::TextEncoder::new();
        if let Err(e) = prometheus::Encoder::encode(&enc, &self.registry.gather(), &mut buf) {
            tracing::warn!(error = %e, "encoding /metrics/slis");
        }
        String::from_utf8_lossy(&buf).into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_check_run_is_counted_and_the_last_result_kept() {
        let s = Slis::default();
        s.observe(&[
            ("ping".into(), Ok(())),
            ("syncloop".into(), Err(CheckFailed("stuck".into()))),
        ]);
        s.observe(&[("ping".into(), Ok(())), ("syncloop".into(), Ok(()))]);
        let t = s.text();
        assert!(
            t.contains("kubernetes_healthcheck{name=\"syncloop\",type=\"healthz\"} 1"),
            "{t}"
        );
        assert!(
            t.contains(
                "kubernetes_healthchecks_total{name=\"ping\",status=\"success\",type=\"healthz\"} 2"
            ),
            "{t}"
        );
        assert!(
            t.contains("kubernetes_healthchecks_total{name=\"syncloop\",status=\"error\",type=\"healthz\"} 1"),
            "{t}"
        );
    }
}
