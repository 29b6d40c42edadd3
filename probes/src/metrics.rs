//! kubelet's prober metrics, with upstream names, help and labels:
//! `prober_probe_total{probe_type, result, container, pod, namespace,
//! pod_uid}` and `prober_probe_duration_seconds{probe_type, container, pod,
//! namespace}` (observed for successful probes, as upstream).

use prometheus::{
    Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, Opts, Registry,
};

use crate::result::ProbeKind;

/// `result` label of a successful probe.
pub const RESULT_SUCCESSFUL: &str = "successful";
/// `result` label of a failed probe.
pub const RESULT_FAILED: &str = "failed";
/// `result` label of an unknown probe result.
pub const RESULT_UNKNOWN: &str = "unknown";

/// The prober's metric families.
#[derive(Clone, Debug)]
pub struct ProberMetrics {
    probe_total: IntCounterVec,
    probe_duration: HistogramVec,
}

impl ProberMetrics {
    /// Creates the families and registers them into `registry`.
    pub fn register(registry: &Registry) -> Result<ProberMetrics, prometheus::Error> {
        let probe_total = IntCounterVec::new(
            Opts::new(
                "probe_total",
                "Cumulative number of a liveness, readiness or startup probe for a container by result.",
            )
            .subsystem("prober"),
            &["probe_type", "result", "container", "pod", "namespace", "pod_uid"],
        )?;
        let probe_duration = HistogramVec::new(
            HistogramOpts::new(
                "probe_duration_seconds",
                "Duration in seconds for a probe response.",
            )
            .subsystem("prober"),
            &["probe_type", "container", "pod", "namespace"],
        )?;
        registry.register(Box::new(probe_total.clone()))?;
        registry.register(Box::new(probe_duration.clone()))?;
        Ok(ProberMetrics {
            probe_total,
            probe_duration,
        })
    }

    /// Handles for one worker; series are created on first use.
    pub(crate) fn for_worker(&self, labels: SeriesLabels) -> WorkerMetrics {
        WorkerMetrics {
            families: self.clone(),
            labels,
            successful: None,
            failed: None,
            duration: None,
        }
    }

    /// Deletes every series of one container's probe (on pod removal).
    pub(crate) fn remove(&self, labels: &SeriesLabels) {
        let kind = labels.kind.as_str();
        for result in [RESULT_SUCCESSFUL, RESULT_FAILED, RESULT_UNKNOWN] {
            let _ = self.probe_total.remove_label_values(&[
                kind,
                result,
                &labels.container,
                &labels.pod,
                &labels.namespace,
                &labels.pod_uid,
            ]);
        }
        let _ = self.probe_duration.remove_label_values(&[
            kind,
            &labels.container,
            &labels.pod,
            &labels.namespace,
        ]);
    }
}

/// The labels of one container probe's series.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct SeriesLabels {
    pub kind: ProbeKind,
    pub container: String,
    pub pod: String,
    pub namespace: String,
    pub pod_uid: String,
}

/// A worker's metric handles, resolved once so a probe run costs no label
/// lookups.
pub(crate) struct WorkerMetrics {
    families: ProberMetrics,
    labels: SeriesLabels,
    successful: Option<IntCounter>,
    failed: Option<IntCounter>,
    duration: Option<Histogram>,
}

impl WorkerMetrics {
    fn counter(&self, result: &str) -> IntCounter {
        let l = &self.labels;
        self.families.probe_total.with_label_values(&[
            l.kind.as_str(),
            result,
            &l.container,
            &l.pod,
            &l.namespace,
            &l.pod_uid,
        ])
    }

    /// Counts a successful run and observes its duration.
    pub fn success(&mut self, seconds: f64) {
        if self.successful.is_none() {
            self.successful = Some(self.counter(RESULT_SUCCESSFUL));
        }
        if let Some(c) = &self.successful {
            c.inc();
        }
        if self.duration.is_none() {
            let l = &self.labels;
            self.duration = Some(self.families.probe_duration.with_label_values(&[
                l.kind.as_str(),
                &l.container,
                &l.pod,
                &l.namespace,
            ]));
        }
        if let Some(h) = &self.duration {
            h.observe(seconds);
        }
    }

    /// Counts a failed run.
    pub fn failure(&mut self) {
        if self.failed.is_none() {
            self.failed = Some(self.counter(RESULT_FAILED));
        }
        if let Some(c) = &self.failed {
            c.inc();
        }
    }
}
