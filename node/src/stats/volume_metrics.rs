//! The `kubelet_volume_stats_*` gauges on `/metrics`, computed when
//! scraped from the latest summary, as kubelet's collector
//! (`pkg/kubelet/metrics/collectors/volume_stats.go`) computes them from
//! `ListPodStats`: one series per claim (`namespace`,
//! `persistentvolumeclaim`), the first pod's figures when several pods
//! use the same claim, volumes without a `pvcRef` left out; all seven
//! ALPHA. `..._health_status_abnormal` only has series for volumes with
//! `volumeHealthStats`, which needs the CSIVolumeHealth gate (off, see
//! [`super::volume_stats`]).

use std::collections::BTreeSet;
use std::sync::Arc;

use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{GaugeVec, Opts};

use super::cache::StatsCache;
use super::types::{PodStats, VolumeStats};

const LABELS: [&str; 2] = ["namespace", "persistentvolumeclaim"];

/// (name, help, figure) of each gauge, kubelet's names and help texts.
type Figure = fn(&VolumeStats) -> Option<f64>;
const GAUGES: [(&str, &str, Figure); 7] = [
    (
        "kubelet_volume_stats_capacity_bytes",
        "[ALPHA] Capacity in bytes of the volume",
        |v| v.fs.capacity_bytes.map(|x| x as f64),
    ),
    (
        "kubelet_volume_stats_available_bytes",
        "[ALPHA] Number of available bytes in the volume",
        |v| v.fs.available_bytes.map(|x| x as f64),
    ),
    (
        "kubelet_volume_stats_used_bytes",
        "[ALPHA] Number of used bytes in the volume",
        |v| v.fs.used_bytes.map(|x| x as f64),
    ),
    (
        "kubelet_volume_stats_inodes",
        "[ALPHA] Maximum number of inodes in the volume",
        |v| v.fs.inodes.map(|x| x as f64),
    ),
    (
        "kubelet_volume_stats_inodes_free",
        "[ALPHA] Number of free inodes in the volume",
        |v| v.fs.inodes_free.map(|x| x as f64),
    ),
    (
        "kubelet_volume_stats_inodes_used",
        "[ALPHA] Number of used inodes in the volume",
        |v| v.fs.inodes_used.map(|x| x as f64),
    ),
    (
        "kubelet_volume_stats_health_status_abnormal",
        "[ALPHA] Abnormal volume health status. The count is either 1 or 0. 1 indicates the volume is unhealthy, 0 indicates volume is healthy",
        |v| {
            v.volume_health_stats
                .map(|h| if h.abnormal { 1.0 } else { 0.0 })
        },
    ),
];

/// The gauges of `pods`' claim-backed volumes, one per claim.
pub fn families(pods: &[PodStats]) -> Vec<MetricFamily> {
    let mut seen = BTreeSet::new();
    let gauges: Vec<Option<GaugeVec>> = GAUGES
        .iter()
        .map(|(name, help, _)| GaugeVec::new(Opts::new(*name, *help), &LABELS).ok())
        .collect();
    for v in pods.iter().flat_map(|p| p.volume_stats.iter()) {
        let Some(r) = &v.pvc_ref else { continue };
        if !seen.insert(r.clone()) {
            continue;
        }
        for ((_, _, figure), g) in GAUGES.iter().zip(&gauges) {
            if let (Some(value), Some(g)) = (figure(v), g) {
                g.with_label_values(&[r.namespace.as_str(), r.name.as_str()])
                    .set(value);
            }
        }
    }
    gauges
        .into_iter()
        .flatten()
        .flat_map(|g| g.collect())
        .filter(|f| !f.get_metric().is_empty())
        .collect()
}

/// The collector registered in the node's registry.
pub struct VolumeStatsCollector {
    stats: Arc<StatsCache>,
    descs: Vec<Desc>,
}

impl VolumeStatsCollector {
    /// Reads `stats`' latest summary at each scrape.
    pub fn new(stats: Arc<StatsCache>) -> VolumeStatsCollector {
        let descs = GAUGES
            .iter()
            .filter_map(|(name, help, _)| {
                Desc::new(
                    name.to_string(),
                    help.to_string(),
                    LABELS.iter().map(|l| l.to_string()).collect(),
                    Default::default(),
                )
                .ok()
            })
            .collect();
        VolumeStatsCollector { stats, descs }
    }
}

impl Collector for VolumeStatsCollector {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        // kubelet reports nothing when listing the pods' stats fails.
        match self.stats.latest() {
            Some(s) => match &s.summary {
                Ok(summary) => families(&summary.pods),
                Err(_) => Vec::new(),
            },
            None => Vec::new(),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::panic)]
mod tests {
    use super::*;
    use crate::stats::types::{FsStats, PodReference, PvcReference, VolumeHealthStats};

    fn volume(name: &str, claim: Option<&str>, used: u64) -> VolumeStats {
        VolumeStats {
            fs: FsStats {
                time: "t".into(),
                available_bytes: Some(10),
                capacity_bytes: Some(100),
                used_bytes: Some(used),
                inodes_free: Some(5),
                inodes: Some(9),
                inodes_used: Some(4),
            },
            name: name.into(),
            pvc_ref: claim.map(|c| PvcReference {
                name: c.into(),
                namespace: "ns".into(),
            }),
            volume_health_stats: None,
        }
    }

    fn pod(name: &str, volumes: Vec<VolumeStats>) -> PodStats {
        PodStats {
            pod_ref: PodReference {
                name: name.into(),
                namespace: "ns".into(),
                uid: name.into(),
            },
            volume_stats: volumes,
            ..Default::default()
        }
    }

    fn render(families: &[MetricFamily]) -> String {
        use prometheus::Encoder;
        let mut buf = Vec::new();
        prometheus::TextEncoder::new()
            .encode(families, &mut buf)
            .unwrap();
        String::from_utf8(buf).unwrap()
    }

    #[test]
    fn one_series_per_claim_with_kubelets_names_and_help() {
        let pods = [
            pod(
                "a",
                vec![volume("scratch", None, 1), volume("data", Some("db"), 30)],
            ),
            // The same claim in a second pod: the first pod's figures.
            pod("b", vec![volume("data", Some("db"), 99)]),
        ];
        let text = render(&families(&pods));
        assert!(
            text.contains("# HELP kubelet_volume_stats_used_bytes [ALPHA] Number of used bytes in the volume\n# TYPE kubelet_volume_stats_used_bytes gauge\nkubelet_volume_stats_used_bytes{namespace=\"ns\",persistentvolumeclaim=\"db\"} 30\n"),
            "{text}"
        );
        for (name, value) in [
            ("capacity_bytes", 100),
            ("available_bytes", 10),
            ("inodes", 9),
            ("inodes_free", 5),
            ("inodes_used", 4),
        ] {
            let line = format!(
                "kubelet_volume_stats_{name}{{namespace=\"ns\",persistentvolumeclaim=\"db\"}} {value}\n"
            );
            assert!(text.contains(&line), "{line} not in {text}");
        }
        assert_eq!(text.matches("persistentvolumeclaim=").count(), 6, "{text}");
        assert!(!text.contains("health_status_abnormal"), "{text}");
        assert!(!text.contains("scratch"), "{text}");
    }

    #[test]
    fn health_is_reported_only_with_a_condition() {
        let mut v = volume("data", Some("db"), 1);
        v.volume_health_stats = Some(VolumeHealthStats { abnormal: true });
        let text = render(&families(&[pod("a", vec![v])]));
        assert!(
            text.contains("kubelet_volume_stats_health_status_abnormal{namespace=\"ns\",persistentvolumeclaim=\"db\"} 1\n"),
            "{text}"
        );
        assert!(render(&families(&[pod("a", vec![])])).is_empty());
    }
}
