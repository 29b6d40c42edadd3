//! Metrics of node registration and status (names in docs/metrics.md):
//! kubelet's `kubelet_node_name` and `kubelet_node_startup_*` gauges, and
//! keelson's own `keelson_node_status_*` (kubelet has no metric for its
//! status writes).

use prometheus::{Gauge, Histogram, HistogramOpts, IntCounterVec, IntGaugeVec, Opts, Registry};

use keelson_common::observability::metrics::register;

/// Node status metrics.
#[derive(Clone, Debug)]
pub struct StatusMetrics {
    /// `keelson_node_status_updates_total{result}`: `written`, `unchanged`, `error`.
    pub updates: IntCounterVec,
    /// `keelson_node_status_update_duration_seconds`: one status sync (read, compute, write).
    pub update_duration: Histogram,
    /// `kubelet_node_name{node}`: always 1.
    pub node_name: IntGaugeVec,
    /// `kubelet_node_startup_pre_registration_duration_seconds`.
    pub pre_registration: Gauge,
    /// `kubelet_node_startup_registration_duration_seconds`.
    pub registration: Gauge,
    /// `kubelet_node_startup_post_registration_duration_seconds`.
    pub post_registration: Gauge,
    /// `kubelet_node_startup_duration_seconds`.
    pub startup: Gauge,
}

/// A gauge with a constant, valid name (creation cannot fail).
fn gauge(name: &str, help: &str) -> Gauge {
    Gauge::new(name, help).expect("constant metric name is valid")
}

impl StatusMetrics {
    /// Creates and registers the metrics.
    pub fn new(registry: &Registry, node_name: &str) -> StatusMetrics {
        let m = Self::unregistered();
        m.node_name.with_label_values(&[node_name]).set(1);
        register(registry, m.updates.clone());
        register(registry, m.update_duration.clone());
        register(registry, m.node_name.clone());
        register(registry, m.pre_registration.clone());
        register(registry, m.registration.clone());
        register(registry, m.post_registration.clone());
        register(registry, m.startup.clone());
        m
    }

    /// The metrics without a registry (tests). Names are constants, so
    /// creation cannot fail.
    pub fn unregistered() -> StatusMetrics {
        StatusMetrics {
            updates: IntCounterVec::new(
                Opts::new(
                    "keelson_node_status_updates_total",
                    "Node status syncs by result: written (patched), unchanged (nothing to write), error",
                ),
                &["result"],
            )
            .expect("valid metric"),
            update_duration: Histogram::with_opts(
                HistogramOpts::new(
                    "keelson_node_status_update_duration_seconds",
                    "Duration of one node status sync: read the Node, compute, patch when needed",
                )
                .buckets(vec![0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0]),
            )
            .expect("valid metric"),
            node_name: IntGaugeVec::new(
                Opts::new("kubelet_node_name", "The node's name. The count is always 1."),
                &["node"],
            )
            .expect("valid metric"),
            pre_registration: gauge(
                "kubelet_node_startup_pre_registration_duration_seconds",
                "Seconds from start to the first attempt to register the node",
            ),
            registration: gauge(
                "kubelet_node_startup_registration_duration_seconds",
                "Seconds from the first registration attempt to a registered node",
            ),
            post_registration: gauge(
                "kubelet_node_startup_post_registration_duration_seconds",
                "Seconds from registration to the node first reported Ready",
            ),
            startup: gauge(
                "kubelet_node_startup_duration_seconds",
                "Seconds from start to the node first reported Ready",
            ),
        }
    }
}
