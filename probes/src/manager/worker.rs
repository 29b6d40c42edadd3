//! One probe worker: a task that probes one container instance with one of
//! its probes until stopped, applies the thresholds and publishes results.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::{Instant, MissedTickBehavior, interval_at, sleep_until};
use tokio_util::sync::CancellationToken;

use super::{Inner, PodMeta, RunRecord, WorkerKey};
use crate::events::{
    EVENT_TYPE_WARNING, ProbeEvent, REASON_PROBE_WARNING, REASON_UNHEALTHY, errored_message,
    failed_message, warning_message,
};
use crate::metrics::WorkerMetrics;
use crate::prober::Action;
use crate::result::{ProbeKind, ProbeResult, ProbeState};
use crate::spec::ProbeSpec;

pub(crate) struct Worker {
    inner: Arc<Inner>,
    key: WorkerKey,
    generation: u64,
    token: CancellationToken,
    spec: ProbeSpec,
    action: Action,
    meta: Arc<PodMeta>,
    container_id: String,
    first_at: Instant,
    metrics: WorkerMetrics,
    /// The last run's result and how many runs in a row gave it.
    last: Option<ProbeState>,
    run: u32,
}

impl Worker {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        inner: Arc<Inner>,
        key: WorkerKey,
        generation: u64,
        token: CancellationToken,
        spec: ProbeSpec,
        action: Action,
        meta: Arc<PodMeta>,
        container_id: String,
        first_at: Instant,
        metrics: WorkerMetrics,
    ) -> Worker {
        Worker {
            inner,
            key,
            generation,
            token,
            spec,
            action,
            meta,
            container_id,
            first_at,
            metrics,
            last: None,
            run: 0,
        }
    }

    /// Probes until stopped or a terminal result, then frees the slot.
    pub(crate) async fn run(mut self) {
        self.probe_loop().await;
        self.inner.worker_exited(&self.key, self.generation);
    }

    async fn probe_loop(&mut self) {
        tokio::select! {
            biased;
            _ = self.token.cancelled() => return,
            _ = sleep_until(self.first_at) => {}
        }
        let mut ticker = interval_at(self.first_at + self.spec.period, self.spec.period);
        ticker.set_missed_tick_behavior(MissedTickBehavior::Skip);
        loop {
            let started = Instant::now();
            let result = tokio::select! {
                biased;
                _ = self.token.cancelled() => return,
                result = self.inner.prober.run_with_retries(&self.action, self.spec.timeout) => result,
            };
            if !self.record(result, started.elapsed()) {
                return;
            }
            tokio::select! {
                biased;
                _ = self.token.cancelled() => return,
                _ = ticker.tick() => {}
            }
        }
    }

    /// Applies one run's result. Returns whether to keep probing.
    fn record(&mut self, result: ProbeResult, took: Duration) -> bool {
        if self.token.is_cancelled() {
            return false;
        }
        let kind = self.key.kind;
        let value = match result {
            ProbeResult::Unknown(error) => {
                tracing::debug!(
                    pod = %self.pod_name(), container = %self.key.container, probe = %kind, error = %error,
                    "probe errored"
                );
                self.event(REASON_UNHEALTHY, errored_message(kind, &error));
                return true;
            }
            ProbeResult::Warning(output) => {
                self.event(REASON_PROBE_WARNING, warning_message(kind, &output));
                ProbeState::Success
            }
            ProbeResult::Failure(output) => {
                tracing::debug!(
                    pod = %self.pod_name(), container = %self.key.container, probe = %kind, output = %output,
                    "probe failed"
                );
                self.event(REASON_UNHEALTHY, failed_message(kind, &output));
                ProbeState::Failure
            }
            ProbeResult::Success => ProbeState::Success,
        };
        if self.last == Some(value) {
            self.run = self.run.saturating_add(1);
        } else {
            self.last = Some(value);
            self.run = 1;
        }
        let threshold = match value {
            ProbeState::Failure => self.spec.failure_threshold,
            _ => self.spec.success_threshold,
        };
        let run = RunRecord {
            value,
            took,
            reached_threshold: self.run >= threshold,
        };
        if !self.inner.record_run(
            &self.key,
            self.generation,
            &self.container_id,
            run,
            &mut self.metrics,
        ) {
            // Stopped or replaced meanwhile: the result is dropped.
            return false;
        }
        if !run.reached_threshold {
            return true;
        }
        match (kind, value) {
            (ProbeKind::Startup, _) => false,
            (ProbeKind::Liveness, ProbeState::Failure) => {
                tracing::info!(
                    pod = %self.pod_name(), container = %self.key.container, container_id = %self.container_id,
                    "liveness probe failed past its threshold; container will be restarted"
                );
                false
            }
            _ => true,
        }
    }

    fn pod_name(&self) -> String {
        format!("{}/{}", self.meta.namespace, self.meta.name)
    }

    fn event(&self, reason: &'static str, message: String) {
        self.inner.emit(ProbeEvent {
            pod_uid: self.meta.uid.clone(),
            namespace: self.meta.namespace.clone(),
            pod_name: self.meta.name.clone(),
            container_name: self.key.container.clone(),
            container_id: self.container_id.clone(),
            probe: self.key.kind,
            event_type: EVENT_TYPE_WARNING,
            reason,
            message,
        });
    }
}
