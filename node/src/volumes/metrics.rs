//! Volume metrics under kubelet's names, so existing dashboards work:
//! `volume_manager_total_volumes{plugin_name,state}` and
//! `storage_operation_duration_seconds{volume_plugin,operation_name,status,migrated}`.

use std::collections::BTreeMap;
use std::time::Duration;

use prometheus::{HistogramOpts, HistogramVec, IntGaugeVec, Opts, Registry};

/// Desired (used by a set-up pod) and actual (set up) volumes per plugin.
pub type Totals = BTreeMap<(&'static str, &'static str), i64>;

/// `state` label of volumes pods need.
pub const DESIRED: &str = "desired_state_of_world";
/// `state` label of volumes set up.
pub const ACTUAL: &str = "actual_state_of_world";

/// The volume manager's metrics; cheap to clone.
#[derive(Clone)]
pub struct VolumeMetrics {
    total: Option<IntGaugeVec>,
    ops: Option<HistogramVec>,
}

impl std::fmt::Debug for VolumeMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VolumeMetrics").finish_non_exhaustive()
    }
}

impl VolumeMetrics {
    /// Metrics registered in `registry` (none recorded without one).
    pub fn new(registry: Option<&Registry>) -> VolumeMetrics {
        let Some(registry) = registry else {
            return VolumeMetrics {
                total: None,
                ops: None,
            };
        };
        let total = IntGaugeVec::new(
            Opts::new(
                "volume_manager_total_volumes",
                "Number of volumes in Volume Manager",
            ),
            &["plugin_name", "state"],
        )
        .ok();
        let ops = HistogramVec::new(
            HistogramOpts::new(
                "storage_operation_duration_seconds",
                "Storage operation duration",
            )
            .buckets(vec![
                0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 25.0, 50.0, 120.0, 300.0, 600.0,
            ]),
            &["volume_plugin", "operation_name", "status", "migrated"],
        )
        .ok();
        if let Some(t) = &total {
            keelson_common::observability::metrics::register(registry, t.clone());
        }
        if let Some(o) = &ops {
            keelson_common::observability::metrics::register(registry, o.clone());
        }
        VolumeMetrics { total, ops }
    }

    /// Records one setup (`volume_mount`) or teardown (`volume_unmount`).
    pub fn operation(&self, plugin: &str, operation: &str, ok: bool, took: Duration) {
        if let Some(o) = &self.ops {
            let status = if ok { "success" } else { "fail-unknown" };
            o.with_label_values(&[plugin, operation, status, "false"])
                .observe(took.as_secs_f64());
        }
    }

    /// Replaces the volume counts.
    pub fn set_totals(&self, totals: &Totals) {
        if let Some(t) = &self.total {
            t.reset();
            for ((plugin, state), n) in totals {
                t.with_label_values(&[plugin, state]).set(*n);
            }
        }
    }
}
