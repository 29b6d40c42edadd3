//! Metrics of the pod lifecycle, with kubelet's names, labels and buckets
//! so existing dashboards and alerts work (see docs/metrics.md).

use std::future::Future;
use std::time::Duration;

use prometheus::{
    Gauge, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry,
};

use keelson_common::observability::metrics::register;

/// kubelet's `PodStartDuration` buckets.
const POD_START_BUCKETS: &[f64] = &[
    0.5, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 20.0, 30.0, 45.0, 60.0, 120.0, 180.0, 240.0,
    300.0, 360.0, 480.0, 600.0, 900.0, 1200.0, 1800.0, 2700.0, 3600.0,
];
/// kubelet's PLEG relist buckets.
const PLEG_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];
/// kubelet's image pull duration buckets.
const IMAGE_PULL_BUCKETS: &[f64] = &[
    1.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 180.0, 240.0, 300.0, 360.0, 480.0, 600.0, 900.0,
    1200.0, 1800.0, 2700.0, 3600.0,
];
/// prometheus' default buckets (kubelet uses `metrics.DefBuckets`).
const DEF_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Every metric of the pod lifecycle.
#[derive(Debug, Clone)]
pub struct PodMetrics {
    /// Pod first seen → all containers started and observed running.
    pub pod_start_duration: Histogram,
    /// Same, minus image pull time.
    pub pod_start_sli_duration: Histogram,
    /// Duration of one pod worker sync, by operation (create/update/sync/kill).
    pub pod_worker_duration: HistogramVec,
    /// Pod first seen → its worker's first sync.
    pub pod_worker_start_duration: Histogram,
    /// One PLEG relist.
    pub pleg_relist_duration: Histogram,
    /// Time between relists.
    pub pleg_relist_interval: Histogram,
    /// Unix time of the last relist.
    pub pleg_last_seen: Gauge,
    /// Events dropped because the channel was full.
    pub pleg_discard_events: IntCounter,
    /// Times the event stream broke or could not be opened.
    pub evented_pleg_connection_error_count: IntCounter,
    /// Times the event stream was opened.
    pub evented_pleg_connection_success_count: IntCounter,
    /// Pods with a ready sandbox.
    pub running_pods: IntGauge,
    /// Containers by state.
    pub running_containers: IntGaugeVec,
    /// Sandboxes created.
    pub started_pods_total: IntCounter,
    /// Sandbox creations that failed.
    pub started_pods_errors_total: IntCounter,
    /// Containers started, by type.
    pub started_containers_total: IntCounterVec,
    /// Container starts that failed, by type and error code.
    pub started_containers_errors_total: IntCounterVec,
    /// Image pulls, by image size bucket.
    pub image_pull_duration: HistogramVec,
    /// Pods the node should run, by static.
    pub desired_pods: IntGaugeVec,
    /// Pods not yet terminating, by static.
    pub active_pods: IntGaugeVec,
    /// Mirror pods.
    pub mirror_pods: IntGauge,
    /// CRI operations, by type.
    pub runtime_operations_total: IntCounterVec,
    /// CRI operation latency, by type.
    pub runtime_operations_duration: HistogramVec,
    /// CRI operations that failed, by type.
    pub runtime_operations_errors_total: IntCounterVec,
    /// Pod status writes to the API, by result.
    pub status_patches_total: IntCounterVec,
    /// Pods admission refused, by reason.
    pub admission_rejections_total: IntCounterVec,
    /// Checks whether a pod may use an image on the node, by result.
    pub image_mustpull_checks_total: IntCounterVec,
}

// Metric definitions are constants: failing to build one is a programming
// error caught by the unit test below, never a runtime condition.
fn hist(name: &str, help: &str, buckets: &[f64]) -> Histogram {
    Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets.to_vec()))
        .unwrap_or_else(|e| panic!("metric {name}: {e}"))
}

fn hist_vec(name: &str, help: &str, labels: &[&str], buckets: &[f64]) -> HistogramVec {
    HistogramVec::new(
        HistogramOpts::new(name, help).buckets(buckets.to_vec()),
        labels,
    )
    .unwrap_or_else(|e| panic!("metric {name}: {e}"))
}

fn counter(name: &str, help: &str) -> IntCounter {
    IntCounter::new(name, help).unwrap_or_else(|e| panic!("metric {name}: {e}"))
}

fn counter_vec(name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    IntCounterVec::new(Opts::new(name, help), labels)
        .unwrap_or_else(|e| panic!("metric {name}: {e}"))
}

fn gauge_vec(name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    IntGaugeVec::new(Opts::new(name, help), labels).unwrap_or_else(|e| panic!("metric {name}: {e}"))
}

fn int_gauge(name: &str, help: &str) -> IntGauge {
    IntGauge::new(name, help).unwrap_or_else(|e| panic!("metric {name}: {e}"))
}

impl PodMetrics {
    /// Creates the metrics and registers them (a name already taken is
    /// logged, not fatal).
    pub fn register(registry: &Registry) -> Self {
        let m = PodMetrics {
            pod_start_duration: hist(
                "kubelet_pod_start_duration_seconds",
                "Duration in seconds from kubelet seeing a pod for the first time to the pod starting to run",
                POD_START_BUCKETS,
            ),
            pod_start_sli_duration: hist(
                "kubelet_pod_start_sli_duration_seconds",
                "Duration in seconds to start a pod, excluding time to pull images and run init containers, measured from pod creation timestamp to when all its containers are reported as started and observed via watch",
                POD_START_BUCKETS,
            ),
            pod_worker_duration: hist_vec(
                "kubelet_pod_worker_duration_seconds",
                "Duration in seconds to sync a single pod. Broken down by operation type: create, update, or sync",
                &["operation_type"],
                DEF_BUCKETS,
            ),
            pod_worker_start_duration: hist(
                "kubelet_pod_worker_start_duration_seconds",
                "Duration in seconds from kubelet seeing a pod to starting a worker.",
                DEF_BUCKETS,
            ),
            pleg_relist_duration: hist(
                "kubelet_pleg_relist_duration_seconds",
                "Duration in seconds for relisting pods in PLEG.",
                PLEG_BUCKETS,
            ),
            pleg_relist_interval: hist(
                "kubelet_pleg_relist_interval_seconds",
                "Interval in seconds between relisting in PLEG.",
                PLEG_BUCKETS,
            ),
            pleg_last_seen: Gauge::new(
                "kubelet_pleg_last_seen_seconds",
                "Timestamp in seconds when PLEG was last seen active.",
            )
            .unwrap_or_else(|e| panic!("metric: {e}")),
            pleg_discard_events: counter(
                "kubelet_pleg_discard_events",
                "The number of discard events in PLEG.",
            ),
            evented_pleg_connection_error_count: counter(
                "kubelet_evented_pleg_connection_error_count",
                "The number of errors encountered during the establishment of streaming connection with the CRI runtime.",
            ),
            evented_pleg_connection_success_count: counter(
                "kubelet_evented_pleg_connection_success_count",
                "The number of times a streaming client was obtained to receive CRI Events.",
            ),
            running_pods: int_gauge(
                "kubelet_running_pods",
                "Number of pods that have a running pod sandbox",
            ),
            running_containers: gauge_vec(
                "kubelet_running_containers",
                "Number of containers currently running",
                &["container_state"],
            ),
            started_pods_total: counter(
                "kubelet_started_pods_total",
                "Cumulative number of pods started",
            ),
            started_pods_errors_total: counter(
                "kubelet_started_pods_errors_total",
                "Cumulative number of errors when starting pods",
            ),
            started_containers_total: counter_vec(
                "kubelet_started_containers_total",
                "Cumulative number of containers started",
                &["container_type"],
            ),
            started_containers_errors_total: counter_vec(
                "kubelet_started_containers_errors_total",
                "Cumulative number of errors when starting containers",
                &["container_type", "code"],
            ),
            image_pull_duration: hist_vec(
                "kubelet_image_pull_duration_seconds",
                "Duration in seconds to pull an image.",
                &["image_size_in_bytes"],
                IMAGE_PULL_BUCKETS,
            ),
            desired_pods: gauge_vec(
                "kubelet_desired_pods",
                "The number of pods the kubelet is being instructed to run. static is true if the pod is not from the apiserver.",
                &["static"],
            ),
            active_pods: gauge_vec(
                "kubelet_active_pods",
                "The number of pods the kubelet considers active and which are being considered when admitting new pods. static is true if the pod is not from the apiserver.",
                &["static"],
            ),
            mirror_pods: int_gauge(
                "kubelet_mirror_pods",
                "The number of mirror pods the kubelet will try to create (one per admitted static pod)",
            ),
            runtime_operations_total: counter_vec(
                "kubelet_runtime_operations_total",
                "Cumulative number of runtime operations by operation type.",
                &["operation_type"],
            ),
            runtime_operations_duration: hist_vec(
                "kubelet_runtime_operations_duration_seconds",
                "Duration in seconds of runtime operations. Broken down by operation type.",
                &["operation_type"],
                &[
                    0.005,
                    0.0125,
                    0.03125,
                    0.078125,
                    0.1953125,
                    0.48828125,
                    1.220703125,
                    3.0517578125,
                    7.62939453125,
                    19.073486328125,
                    47.6837158203125,
                    119.20928955078125,
                    298.0232238769531,
                    745.0580596923828,
                ],
            ),
            runtime_operations_errors_total: counter_vec(
                "kubelet_runtime_operations_errors_total",
                "Cumulative number of runtime operation errors by operation type.",
                &["operation_type"],
            ),
            status_patches_total: counter_vec(
                "keelson_pod_status_patches_total",
                "Pod status writes to the API server, by result (success, error, skipped_unchanged).",
                &["result"],
            ),
            admission_rejections_total: counter_vec(
                "kubelet_admission_rejections_total",
                "Cumulative number pod admission rejections by the Kubelet.",
                &["reason"],
            ),
            image_mustpull_checks_total: counter_vec(
                "kubelet_imagemanager_image_mustpull_checks_total",
                "Counter for how many times kubelet checked whether credentials need to be re-verified to access an image",
                &["result"],
            ),
        };
        register(registry, m.pod_start_duration.clone());
        register(registry, m.pod_start_sli_duration.clone());
        register(registry, m.pod_worker_duration.clone());
        register(registry, m.pod_worker_start_duration.clone());
        register(registry, m.pleg_relist_duration.clone());
        register(registry, m.pleg_relist_interval.clone());
        register(registry, m.pleg_last_seen.clone());
        register(registry, m.pleg_discard_events.clone());
        register(registry, m.evented_pleg_connection_error_count.clone());
        register(registry, m.evented_pleg_connection_success_count.clone());
        register(registry, m.running_pods.clone());
        register(registry, m.running_containers.clone());
        register(registry, m.started_pods_total.clone());
        register(registry, m.started_pods_errors_total.clone());
        register(registry, m.started_containers_total.clone());
        register(registry, m.started_containers_errors_total.clone());
        register(registry, m.image_pull_duration.clone());
        register(registry, m.desired_pods.clone());
        register(registry, m.active_pods.clone());
        register(registry, m.mirror_pods.clone());
        register(registry, m.runtime_operations_total.clone());
        register(registry, m.runtime_operations_duration.clone());
        register(registry, m.runtime_operations_errors_total.clone());
        register(registry, m.status_patches_total.clone());
        register(registry, m.admission_rejections_total.clone());
        register(registry, m.image_mustpull_checks_total.clone());
        m
    }

    /// Times a CRI operation into the runtime operation metrics.
    pub async fn runtime_op<T, E, F>(&self, op: &str, fut: F) -> Result<T, E>
    where
        F: Future<Output = Result<T, E>>,
    {
        let start = tokio::time::Instant::now();
        let r = fut.await;
        self.runtime_operations_total.with_label_values(&[op]).inc();
        self.runtime_operations_duration
            .with_label_values(&[op])
            .observe(start.elapsed().as_secs_f64());
        if r.is_err() {
            self.runtime_operations_errors_total
                .with_label_values(&[op])
                .inc();
        }
        r
    }
}

/// kubelet's `GetImageSizeBucket` label.
pub fn image_size_bucket(bytes: u64) -> &'static str {
    const MB: u64 = 1024 * 1024;
    const GB: u64 = 1024 * MB;
    match bytes {
        b if b < 10 * MB => "0-10MB",
        b if b < 100 * MB => "10MB-100MB",
        b if b < 500 * MB => "100MB-500MB",
        b if b < GB => "500MB-1GB",
        b if b < 5 * GB => "1GB-5GB",
        b if b < 10 * GB => "5GB-10GB",
        b if b < 20 * GB => "10GB-20GB",
        b if b < 30 * GB => "20GB-30GB",
        b if b < 40 * GB => "30GB-40GB",
        b if b < 60 * GB => "40GB-60GB",
        b if b < 100 * GB => "60GB-100GB",
        _ => "GT100GB",
    }
}

/// Seconds as f64 of a duration (for observations).
pub fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registers_with_upstream_names() {
        let r = Registry::new();
        let m = PodMetrics::register(&r);
        m.running_pods.set(3);
        m.started_containers_total
            .with_label_values(&["container"])
            .inc();
        let text = keelson_common::observability::metrics::render(&r);
        assert!(text.contains("kubelet_running_pods 3"), "{text}");
        assert!(text.contains("kubelet_started_containers_total{container_type=\"container\"} 1"));
        assert_eq!(image_size_bucket(5 << 20), "0-10MB");
        assert_eq!(image_size_bucket(200 << 20), "100MB-500MB");
    }
}
