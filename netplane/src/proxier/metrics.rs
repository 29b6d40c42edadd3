//! The proxy role's metrics, with kube-proxy's names, types, buckets and
//! labels, registered into a registry the caller passes in.

use prometheus::{
    Counter, CounterVec, Gauge, GaugeVec, HistogramOpts, HistogramVec, Opts, Registry,
    exponential_buckets,
};

use crate::model::IpFamily;

/// All proxy metrics.
#[derive(Debug, Clone)]
pub struct ProxyMetrics {
    /// `kubeproxy_sync_proxy_rules_duration_seconds{ip_family}`.
    pub sync_duration: HistogramVec,
    /// `kubeproxy_sync_full_proxy_rules_duration_seconds{ip_family}`.
    pub sync_full_duration: HistogramVec,
    /// `kubeproxy_sync_partial_proxy_rules_duration_seconds{ip_family}`.
    pub sync_partial_duration: HistogramVec,
    /// `kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family}`.
    pub last_timestamp: GaugeVec,
    /// `kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds{ip_family}`.
    pub last_queued_timestamp: GaugeVec,
    /// `kubeproxy_network_programming_duration_seconds{ip_family}`.
    pub network_programming: HistogramVec,
    /// `kubeproxy_sync_proxy_rules_endpoint_changes_pending`.
    pub endpoint_changes_pending: Gauge,
    /// `kubeproxy_sync_proxy_rules_endpoint_changes_total`.
    pub endpoint_changes_total: Counter,
    /// `kubeproxy_sync_proxy_rules_service_changes_pending`.
    pub service_changes_pending: Gauge,
    /// `kubeproxy_sync_proxy_rules_service_changes_total`.
    pub service_changes_total: Counter,
    /// `kubeproxy_sync_proxy_rules_nftables_sync_failures_total{ip_family}`.
    pub nftables_sync_failures: CounterVec,
    /// `kubeproxy_sync_proxy_rules_nftables_cleanup_failures_total{ip_family}`.
    pub nftables_cleanup_failures: CounterVec,
    /// `kubeproxy_sync_proxy_rules_no_local_endpoints_total{ip_family,traffic_policy}`.
    pub no_local_endpoints: GaugeVec,
    /// `kubeproxy_proxy_healthz_total{code}`.
    pub healthz_total: CounterVec,
    /// `kubeproxy_proxy_livez_total{code}`.
    pub livez_total: CounterVec,
    /// `kubeproxy_conntrack_reconciler_deleted_entries_total{ip_family}`.
    pub conntrack_deleted: CounterVec,
    /// `kubeproxy_conntrack_reconciler_sync_duration_seconds{ip_family}`.
    pub conntrack_duration: HistogramVec,
    /// `keelson_proxy_sync_objects_total{ip_family,kind}`: kernel objects
    /// written by syncs (keelson's own; kube-proxy has no equivalent).
    pub objects_written: CounterVec,
}

fn opts(name: &str, help: &str) -> Opts {
    Opts::new(name, help).subsystem("kubeproxy")
}

fn hopts(name: &str, help: &str, buckets: Vec<f64>) -> HistogramOpts {
    HistogramOpts::new(name, help)
        .subsystem("kubeproxy")
        .buckets(buckets)
}

/// kube-proxy's network-programming buckets: 0.25 s, 0.5 s, 1..59 s,
/// 60..115 s by 5, 120..300 s by 30 (and a leading 0).
fn network_programming_buckets() -> Vec<f64> {
    let mut b = vec![0.0, 0.25, 0.5];
    b.extend((1..=59).map(f64::from));
    b.extend((0..12).map(|i| 60.0 + 5.0 * f64::from(i)));
    b.extend((0..7).map(|i| 120.0 + 30.0 * f64::from(i)));
    b
}

impl ProxyMetrics {
    /// Creates the metrics and registers them.
    pub fn register(registry: &Registry) -> prometheus::Result<ProxyMetrics> {
        let exp = exponential_buckets(0.001, 2.0, 15)?;
        let fam = &["ip_family"];
        let m = ProxyMetrics {
            sync_duration: HistogramVec::new(
                hopts(
                    "sync_proxy_rules_duration_seconds",
                    "SyncProxyRules latency in seconds",
                    exp.clone(),
                ),
                fam,
            )?,
            sync_full_duration: HistogramVec::new(
                hopts(
                    "sync_full_proxy_rules_duration_seconds",
                    "SyncProxyRules latency in seconds for full resyncs",
                    exp.clone(),
                ),
                fam,
            )?,
            sync_partial_duration: HistogramVec::new(
                hopts(
                    "sync_partial_proxy_rules_duration_seconds",
                    "SyncProxyRules latency in seconds for partial resyncs",
                    exp.clone(),
                ),
                fam,
            )?,
            last_timestamp: GaugeVec::new(
                opts(
                    "sync_proxy_rules_last_timestamp_seconds",
                    "The last time proxy rules were successfully synced",
                ),
                fam,
            )?,
            last_queued_timestamp: GaugeVec::new(
                opts(
                    "sync_proxy_rules_last_queued_timestamp_seconds",
                    "The last time a sync of proxy rules was queued",
                ),
                fam,
            )?,
            network_programming: HistogramVec::new(
                hopts(
                    "network_programming_duration_seconds",
                    "In Cluster Network Programming Latency in seconds",
                    network_programming_buckets(),
                ),
                fam,
            )?,
            endpoint_changes_pending: Gauge::with_opts(opts(
                "sync_proxy_rules_endpoint_changes_pending",
                "Pending proxy rules Endpoint changes",
            ))?,
            endpoint_changes_total: Counter::with_opts(opts(
                "sync_proxy_rules_endpoint_changes_total",
                "Cumulative proxy rules Endpoint changes",
            ))?,
            service_changes_pending: Gauge::with_opts(opts(
                "sync_proxy_rules_service_changes_pending",
                "Pending proxy rules Service changes",
            ))?,
            service_changes_total: Counter::with_opts(opts(
                "sync_proxy_rules_service_changes_total",
                "Cumulative proxy rules Service changes",
            ))?,
            nftables_sync_failures: CounterVec::new(
                opts(
                    "sync_proxy_rules_nftables_sync_failures_total",
                    "Cumulative proxy nftables sync failures",
                ),
                fam,
            )?,
            nftables_cleanup_failures: CounterVec::new(
                opts(
                    "sync_proxy_rules_nftables_cleanup_failures_total",
                    "Cumulative proxy nftables cleanup failures",
                ),
                fam,
            )?,
            no_local_endpoints: GaugeVec::new(
                opts(
                    "sync_proxy_rules_no_local_endpoints_total",
                    "Number of services with a Local traffic policy and no endpoints",
                ),
                &["ip_family", "traffic_policy"],
            )?,
            healthz_total: CounterVec::new(
                opts(
                    "proxy_healthz_total",
                    "Cumulative proxy healthz HTTP status",
                ),
                &["code"],
            )?,
            livez_total: CounterVec::new(
                opts("proxy_livez_total", "Cumulative proxy livez HTTP status"),
                &["code"],
            )?,
            conntrack_deleted: CounterVec::new(
                opts(
                    "conntrack_reconciler_deleted_entries_total",
                    "Cumulative conntrack flows deleted by conntrack reconciler",
                ),
                fam,
            )?,
            conntrack_duration: HistogramVec::new(
                hopts(
                    "conntrack_reconciler_sync_duration_seconds",
                    "ReconcileConntrackFlowsLatency latency in seconds",
                    exp,
                ),
                fam,
            )?,
            objects_written: CounterVec::new(
                Opts::new(
                    "keelson_proxy_sync_objects_total",
                    "Kernel objects (rules, chains, set elements) written by proxy syncs",
                ),
                &["ip_family", "kind"],
            )?,
        };
        registry.register(Box::new(m.sync_duration.clone()))?;
        registry.register(Box::new(m.sync_full_duration.clone()))?;
        registry.register(Box::new(m.sync_partial_duration.clone()))?;
        registry.register(Box::new(m.last_timestamp.clone()))?;
        registry.register(Box::new(m.last_queued_timestamp.clone()))?;
        registry.register(Box::new(m.network_programming.clone()))?;
        registry.register(Box::new(m.endpoint_changes_pending.clone()))?;
        registry.register(Box::new(m.endpoint_changes_total.clone()))?;
        registry.register(Box::new(m.service_changes_pending.clone()))?;
        registry.register(Box::new(m.service_changes_total.clone()))?;
        registry.register(Box::new(m.nftables_sync_failures.clone()))?;
        registry.register(Box::new(m.nftables_cleanup_failures.clone()))?;
        registry.register(Box::new(m.no_local_endpoints.clone()))?;
        registry.register(Box::new(m.healthz_total.clone()))?;
        registry.register(Box::new(m.livez_total.clone()))?;
        registry.register(Box::new(m.conntrack_deleted.clone()))?;
        registry.register(Box::new(m.conntrack_duration.clone()))?;
        registry.register(Box::new(m.objects_written.clone()))?;
        Ok(m)
    }

    /// The `ip_family` label value.
    pub fn family(f: IpFamily) -> &'static str {
        f.as_k8s()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registers_kube_proxy_names() {
        let r = Registry::new();
        let m = ProxyMetrics::register(&r).unwrap_or_else(|e| panic!("{e}"));
        m.sync_duration.with_label_values(&["IPv4"]).observe(0.01);
        m.network_programming
            .with_label_values(&["IPv4"])
            .observe(1.5);
        m.service_changes_total.inc();
        m.no_local_endpoints
            .with_label_values(&["IPv4", "internal"])
            .set(0.0);
        let names: Vec<String> = r.gather().iter().map(|f| f.name().to_string()).collect();
        for want in [
            "kubeproxy_sync_proxy_rules_duration_seconds",
            "kubeproxy_network_programming_duration_seconds",
            "kubeproxy_sync_proxy_rules_service_changes_total",
            "kubeproxy_sync_proxy_rules_no_local_endpoints_total",
        ] {
            assert!(names.iter().any(|n| n == want), "{want} in {names:?}");
        }
        assert_eq!(network_programming_buckets().len(), 3 + 59 + 12 + 7);
        // A second registration into the same registry is refused, not silently duplicated.
        assert!(ProxyMetrics::register(&r).is_err());
    }
}
