//! What a contestant says about itself on `/metrics` (keelson and
//! kube-proxy export the same names): how long its syncs took, and its own
//! view of network programming latency. Shown beside the traffic-measured
//! figures, it tells where the time goes.

use serde::{Deserialize, Serialize};

/// `kubeproxy_sync_proxy_rules_duration_seconds`.
pub const SYNC_DURATION: &str = "kubeproxy_sync_proxy_rules_duration_seconds";
/// `kubeproxy_network_programming_duration_seconds`.
pub const PROGRAMMING_DURATION: &str = "kubeproxy_network_programming_duration_seconds";

/// `kubeproxy_sync_proxy_rules_last_timestamp_seconds`: the end of the
/// last successful sync, Unix seconds.
pub const LAST_SYNC: &str = "kubeproxy_sync_proxy_rules_last_timestamp_seconds";

/// The latest value of a gauge over its label sets (e.g. the last sync of
/// either family), if any is set (non-zero).
pub fn gauge_max(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.strip_prefix(name))
        .filter(|rest| rest.starts_with('{') || rest.starts_with(' '))
        .filter_map(|rest| {
            let value = rest.rsplit_once('}').map_or(rest, |(_, v)| v);
            value.split_whitespace().next()?.parse::<f64>().ok()
        })
        .filter(|v| *v > 0.0)
        .reduce(f64::max)
}

/// Totals of a histogram over all its label sets: (sum, count).
pub fn histogram_totals(text: &str, name: &str) -> Option<(f64, f64)> {
    let value_of = |suffix: &str| -> Option<f64> {
        let metric = format!("{name}{suffix}");
        let mut total = None;
        for line in text.lines() {
            if line.starts_with('#') {
                continue;
            }
            let Some(rest) = line.strip_prefix(&metric) else {
                continue;
            };
            // Exactly this metric: followed by labels or a space.
            if !(rest.starts_with('{') || rest.starts_with(' ')) {
                continue;
            }
            let value = rest.rsplit_once('}').map_or(rest, |(_, v)| v);
            if let Some(v) = value
                .split_whitespace()
                .next()
                .and_then(|v| v.parse::<f64>().ok())
            {
                total = Some(total.unwrap_or(0.0) + v);
            }
        }
        total
    };
    Some((value_of("_sum")?, value_of("_count")?))
}

/// Self-reported figures of one run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SelfReported {
    /// Syncs done.
    pub syncs: Option<f64>,
    /// Mean sync duration, ms.
    pub sync_mean_ms: Option<f64>,
    /// Programming-latency observations.
    pub programming_observations: Option<f64>,
    /// Mean self-reported network programming latency, ms.
    pub programming_mean_ms: Option<f64>,
}

impl SelfReported {
    /// Reads the figures from a `/metrics` body.
    pub fn parse(text: &str) -> SelfReported {
        let mean = |(sum, count): (f64, f64)| (count > 0.0).then(|| sum / count * 1000.0);
        let sync = histogram_totals(text, SYNC_DURATION);
        let prog = histogram_totals(text, PROGRAMMING_DURATION);
        SelfReported {
            syncs: sync.map(|s| s.1),
            sync_mean_ms: sync.and_then(mean),
            programming_observations: prog.map(|p| p.1),
            programming_mean_ms: prog.and_then(mean),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn totals_over_label_sets() {
        let text = "\
# HELP kubeproxy_sync_proxy_rules_duration_seconds SyncProxyRules latency in seconds
# TYPE kubeproxy_sync_proxy_rules_duration_seconds histogram
kubeproxy_sync_proxy_rules_duration_seconds_bucket{ip_family=\"IPv4\",le=\"0.001\"} 3
kubeproxy_sync_proxy_rules_duration_seconds_sum{ip_family=\"IPv4\"} 0.5
kubeproxy_sync_proxy_rules_duration_seconds_count{ip_family=\"IPv4\"} 4
kubeproxy_sync_proxy_rules_duration_seconds_sum{ip_family=\"IPv6\"} 0.5
kubeproxy_sync_proxy_rules_duration_seconds_count{ip_family=\"IPv6\"} 6
kubeproxy_sync_proxy_rules_duration_seconds_sum_extra 99
kubeproxy_network_programming_duration_seconds_sum 2
kubeproxy_network_programming_duration_seconds_count 0
";
        assert_eq!(histogram_totals(text, SYNC_DURATION), Some((1.0, 10.0)));
        let s = SelfReported::parse(text);
        assert_eq!(s.syncs, Some(10.0));
        assert_eq!(s.sync_mean_ms, Some(100.0));
        assert_eq!(s.programming_observations, Some(0.0));
        assert_eq!(s.programming_mean_ms, None);
        assert_eq!(SelfReported::parse(""), SelfReported::default());
    }

    #[test]
    fn last_sync_is_the_latest_family() {
        let text = "\
# TYPE kubeproxy_sync_proxy_rules_last_timestamp_seconds gauge
kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family=\"IPv4\"} 1.7648e+09
kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family=\"IPv6\"} 0
";
        assert_eq!(gauge_max(text, LAST_SYNC), Some(1.7648e9));
        assert_eq!(gauge_max("", LAST_SYNC), None);
    }
}
