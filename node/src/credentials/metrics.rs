//! kubelet's credential provider metrics
//! (`pkg/credentialprovider/plugin/metrics.go`), registered only when
//! plugins are configured, as kubelet registers them:
//! `kubelet_credential_provider_plugin_errors_total{plugin_name}`,
//! `kubelet_credential_provider_plugin_duration{plugin_name}` (seconds,
//! Prometheus' default buckets) and
//! `kubelet_credential_provider_config_info{hash}` (1).

use std::time::Duration;

use keelson_common::observability::metrics::register;
use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry};

/// The plugin metrics.
#[derive(Debug, Clone)]
pub struct CredentialProviderMetrics {
    errors: IntCounterVec,
    duration: HistogramVec,
    config_info: IntGaugeVec,
}

impl CredentialProviderMetrics {
    /// Metrics not exposed anywhere (tests).
    pub fn unregistered() -> Self {
        // Constant definitions: a failure is a programming error caught by
        // the unit tests.
        #[allow(clippy::expect_used)]
        CredentialProviderMetrics {
            errors: IntCounterVec::new(
                Opts::new(
                    "kubelet_credential_provider_plugin_errors_total",
                    "Number of errors from credential provider plugin",
                ),
                &["plugin_name"],
            )
            .expect("metric definition"),
            duration: HistogramVec::new(
                HistogramOpts::new(
                    "kubelet_credential_provider_plugin_duration",
                    "Duration of execution in seconds for credential provider plugin",
                ),
                &["plugin_name"],
            )
            .expect("metric definition"),
            config_info: IntGaugeVec::new(
                Opts::new(
                    "kubelet_credential_provider_config_info",
                    "Information about the last applied credential provider configuration with hash as label",
                ),
                &["hash"],
            )
            .expect("metric definition"),
        }
    }

    /// Registers the metrics in `registry` and records the configuration
    /// hash.
    pub fn register(registry: &Registry, config_hash: &str) -> Self {
        let m = Self::unregistered();
        register(registry, m.errors.clone());
        register(registry, m.duration.clone());
        register(registry, m.config_info.clone());
        m.config_info.with_label_values(&[config_hash]).set(1);
        m
    }

    /// One plugin run: its duration, and an error when it failed.
    pub fn observe(&self, plugin: &str, took: Duration, failed: bool) {
        self.duration
            .with_label_values(&[plugin])
            .observe(took.as_secs_f64());
        if failed {
            self.errors.with_label_values(&[plugin]).inc();
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn names_as_kubelet() {
        let r = Registry::new();
        let m = CredentialProviderMetrics::register(&r, "sha256:ab");
        m.observe("ecr", Duration::from_millis(20), true);
        let names: Vec<String> = r.gather().iter().map(|f| f.name().to_string()).collect();
        assert_eq!(
            names,
            [
                "kubelet_credential_provider_config_info",
                "kubelet_credential_provider_plugin_duration",
                "kubelet_credential_provider_plugin_errors_total"
            ]
        );
    }
}
