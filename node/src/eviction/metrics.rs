//! Eviction metrics: kubelet's `kubelet_evictions` and
//! `kubelet_eviction_stats_age_seconds`, and keelson's gauges of the
//! observed signals (kubelet has none).

use prometheus::{GaugeVec, HistogramOpts, HistogramVec, IntCounterVec, Opts, Registry};

use keelson_common::observability::metrics::register;

/// The eviction manager's metrics.
#[derive(Debug, Clone)]
pub struct EvictionMetrics {
    /// `kubelet_evictions{eviction_signal}`.
    pub evictions: IntCounterVec,
    /// `kubelet_eviction_stats_age_seconds{eviction_signal}`.
    pub stats_age: HistogramVec,
    /// `keelson_eviction_signal_available{signal}`.
    pub available: GaugeVec,
    /// `keelson_eviction_signal_capacity{signal}`.
    pub capacity: GaugeVec,
    /// `keelson_eviction_threshold_met{signal}` (1 while met, grace period ignored).
    pub threshold_met: GaugeVec,
}

impl EvictionMetrics {
    /// Registered metrics.
    pub fn new(registry: &Registry) -> EvictionMetrics {
        let m = Self::unregistered();
        register(registry, m.evictions.clone());
        register(registry, m.stats_age.clone());
        register(registry, m.available.clone());
        register(registry, m.capacity.clone());
        register(registry, m.threshold_met.clone());
        m
    }

    /// Metrics without a registry. Names are constants, so creation cannot fail.
    pub fn unregistered() -> EvictionMetrics {
        EvictionMetrics {
            evictions: IntCounterVec::new(
                Opts::new(
                    "kubelet_evictions",
                    "Cumulative number of pod evictions by eviction signal",
                ),
                &["eviction_signal"],
            )
            .expect("constant metric name is valid"),
            stats_age: HistogramVec::new(
                HistogramOpts::new(
                    "kubelet_eviction_stats_age_seconds",
                    "Time between when stats are collected, and when pod is evicted based on those stats by eviction signal",
                )
                .buckets(vec![0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0]),
                &["eviction_signal"],
            )
            .expect("constant metric name is valid"),
            available: GaugeVec::new(
                Opts::new(
                    "keelson_eviction_signal_available",
                    "Last observed available amount of each eviction signal (bytes, inodes or PIDs)",
                ),
                &["signal"],
            )
            .expect("constant metric name is valid"),
            capacity: GaugeVec::new(
                Opts::new(
                    "keelson_eviction_signal_capacity",
                    "Last observed capacity of each eviction signal (bytes, inodes or PIDs)",
                ),
                &["signal"],
            )
            .expect("constant metric name is valid"),
            threshold_met: GaugeVec::new(
                Opts::new(
                    "keelson_eviction_threshold_met",
                    "1 while an eviction threshold of the signal is met (grace periods ignored), else 0",
                ),
                &["signal"],
            )
            .expect("constant metric name is valid"),
        }
    }
}
