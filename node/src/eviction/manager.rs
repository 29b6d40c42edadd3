//! The eviction control loop, kubelet's `synchronize`:
//!
//! 1. measure (summary → observations); thresholds met now, plus those met
//!    before whose minimum reclaim is not yet reached;
//! 2. node conditions: raised by met thresholds, kept for
//!    `evictionPressureTransitionPeriod` after the last observation;
//! 3. thresholds whose grace period has passed (hard: at once);
//! 4. local storage limits (emptyDir `sizeLimit`, ephemeral-storage limits);
//! 5. the most urgent threshold (memory first): an `EvictionThresholdMet`
//!    event, node-level reclaim first (dead containers, unused images, for
//!    disk signals) and done if that was enough;
//! 6. rank the active pods for the signal and evict the first one that may
//!    be evicted (critical pods never are): grace 1 s for hard thresholds,
//!    min(`evictionMaxPodGracePeriod`, pod's) for soft ones; status Failed /
//!    `Evicted` with the message, a `DisruptionTarget` condition, an
//!    `Evicted` event carrying `evictionMessage`'s annotations
//!    (`offending_containers`, `offending_containers_usage`,
//!    `starved_resource`, and `offending_pod`/`offending_pod_usage` with
//!    pod-level resources); at most one pod per round.
//!
//! The loop runs every 10 s, at once again after an eviction (once the pod
//! is cleaned up, up to 30 s), and when a memory threshold notification fires.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, PodCondition};
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::handle::EvictionHandle;
use super::local_storage;
use super::message::eviction_message;
use super::metrics::EvictionMetrics;
use super::pods::{EvictionPods, REASON_EVICTED, is_critical};
use super::rank::rank_for_signal;
use super::signals::{
    self, ConditionsObserved, FirstObserved, Observations, is_hard, merge_thresholds,
    node_conditions, node_conditions_last_observed_at, node_conditions_observed_since,
    observations, signal_resource, sort_by_eviction_priority, thresholds_first_observed_at,
    thresholds_met, thresholds_met_grace_period, thresholds_updated_stats,
};
use super::summary::{Summary, SummaryProvider};
use crate::config::NodeConfig;
use crate::config::eviction::{Signal, Threshold, parse_thresholds};
use keelson_common::events::{EventRecorder, EventType, node_ref, pod_ref};

/// How often the loop runs (kubelet's `evictionMonitoringPeriod`).
pub const MONITORING_INTERVAL: Duration = Duration::from_secs(10);
/// Grace period of evictions for hard thresholds and local storage limits.
pub const IMMEDIATE_EVICTION_GRACE_PERIOD_SECONDS: i64 = 1;
/// Longest wait for an evicted pod's cleanup.
pub const POD_CLEANUP_TIMEOUT: Duration = Duration::from_secs(30);
/// Poll interval of that wait.
pub const POD_CLEANUP_POLL: Duration = Duration::from_secs(1);

pub use crate::gc::NodeReclaim;

/// Settings of the eviction manager.
#[derive(Debug, Clone)]
pub struct EvictionConfig {
    /// Every threshold (hard and soft, allocatable twins included).
    pub thresholds: Vec<Threshold>,
    /// `evictionPressureTransitionPeriod`.
    pub pressure_transition_period: Duration,
    /// `evictionMaxPodGracePeriod` (seconds).
    pub max_pod_grace_period: i64,
    /// Loop period.
    pub monitoring_interval: Duration,
    /// Enforce local ephemeral storage limits.
    pub local_storage_capacity_isolation: bool,
}

impl EvictionConfig {
    /// From the node configuration (already validated at start).
    pub fn from_node_config(n: &NodeConfig) -> EvictionConfig {
        let parsed = parse_thresholds(
            &n.eviction_hard,
            &n.eviction_soft,
            &n.eviction_soft_grace_period,
            &n.eviction_minimum_reclaim,
        )
        .unwrap_or_default();
        EvictionConfig {
            // enforceNodeAllocatable is ["pods"], as kubelet's default.
            thresholds: signals::add_allocatable_thresholds(&parsed),
            pressure_transition_period: n.eviction_pressure_transition_period.get(),
            max_pod_grace_period: i64::from(n.eviction_max_pod_grace_period),
            monitoring_interval: MONITORING_INTERVAL,
            local_storage_capacity_isolation: true,
        }
    }
}

/// What the manager talks to.
pub struct EvictionDeps {
    /// Measurements.
    pub summary: Arc<dyn SummaryProvider>,
    /// The pods.
    pub pods: Arc<dyn EvictionPods>,
    /// Dead container and unused image removal.
    pub reclaim: Option<Arc<dyn NodeReclaim>>,
    /// Events (`None`: none).
    pub recorder: Option<EventRecorder>,
    /// Metrics.
    pub metrics: EvictionMetrics,
    /// The node name (for node events).
    pub node_name: String,
}

/// The eviction manager.
pub struct EvictionManager {
    cfg: EvictionConfig,
    deps: EvictionDeps,
    handle: EvictionHandle,
    dedicated_image_fs: Option<bool>,
    thresholds: Vec<Threshold>,
    thresholds_met: Vec<Threshold>,
    first_observed: FirstObserved,
    conditions_observed: ConditionsObserved,
    last_observations: Observations,
}

impl EvictionManager {
    /// A manager publishing its conditions through `handle`.
    pub fn new(cfg: EvictionConfig, deps: EvictionDeps, handle: EvictionHandle) -> EvictionManager {
        let thresholds = cfg.thresholds.clone();
        EvictionManager {
            cfg,
            deps,
            handle,
            dedicated_image_fs: None,
            thresholds,
            thresholds_met: Vec::new(),
            first_observed: Vec::new(),
            conditions_observed: ConditionsObserved::new(),
            last_observations: Observations::new(),
        }
    }

    /// The thresholds in force (after the containerfs ones were derived).
    pub fn thresholds(&self) -> &[Threshold] {
        &self.thresholds
    }

    fn record_observations(&self, obs: &Observations, met: &[Threshold]) {
        for s in Signal::ALL {
            let name = s.name();
            match obs.get(&s) {
                Some(o) => {
                    self.deps
                        .metrics
                        .available
                        .with_label_values(&[name])
                        .set(o.available as f64);
                    self.deps
                        .metrics
                        .capacity
                        .with_label_values(&[name])
                        .set(o.capacity as f64);
                }
                None => {
                    let _ = self.deps.metrics.available.remove_label_values(&[name]);
                    let _ = self.deps.metrics.capacity.remove_label_values(&[name]);
                }
            }
            if self.thresholds.iter().any(|t| t.signal == s) {
                let v = if met.iter().any(|t| t.signal == s) {
                    1.0
                } else {
                    0.0
                };
                self.deps
                    .metrics
                    .threshold_met
                    .with_label_values(&[name])
                    .set(v);
            }
        }
    }

    fn node_event(&self, kind: EventType, reason: &str, message: String) {
        if let Some(r) = &self.deps.recorder {
            r.event(&node_ref(&self.deps.node_name), kind, reason, message);
        }
    }

    /// Evicts one pod: never a critical one. True when it was killed.
    /// kubelet's `evictPod` (pkg/kubelet/eviction/eviction_manager.go): the
    /// `Evicted` Warning event goes out through `AnnotatedEventf` with the
    /// annotations `evictionMessage` built (none for local storage limits).
    fn evict_pod(
        &self,
        pod: &Pod,
        grace: i64,
        message: &str,
        annotations: BTreeMap<String, String>,
        condition: Option<PodCondition>,
    ) -> bool {
        let key = format!(
            "{}/{}",
            pod.metadata.namespace.as_deref().unwrap_or_default(),
            pod.metadata.name.as_deref().unwrap_or_default()
        );
        if is_critical(pod) {
            tracing::error!(pod = %key, "eviction manager: cannot evict a critical pod");
            return false;
        }
        if let Some(r) = &self.deps.recorder {
            r.annotated_event(
                &pod_ref(pod, None),
                annotations,
                EventType::Warning,
                REASON_EVICTED,
                message,
            );
        }
        tracing::info!(pod = %key, grace_seconds = grace, %message, "evicting pod");
        if self.deps.pods.kill(pod, grace, message, condition) {
            tracing::info!(pod = %key, "eviction manager: pod is evicted successfully");
        } else {
            tracing::error!(pod = %key, "eviction manager: pod failed to evict");
        }
        true
    }

    async fn reclaim_node_level_resources(&self, signal: Signal, resource: &str) -> bool {
        let Some(reclaim) = &self.deps.reclaim else {
            return false;
        };
        let disk = !matches!(
            signal,
            Signal::MemoryAvailable | Signal::AllocatableMemoryAvailable | Signal::PidAvailable
        );
        // With a dedicated image filesystem, nodefs pressure has nothing to reclaim.
        let dedicated = self.dedicated_image_fs.unwrap_or(false);
        if !disk
            || (dedicated && matches!(signal, Signal::NodeFsAvailable | Signal::NodeFsInodesFree))
        {
            return false;
        }
        if let Err(e) = reclaim.delete_all_unused_containers().await {
            tracing::info!(%resource, error = %e, "eviction manager: unexpected error when attempting to reduce resource pressure");
        }
        if let Err(e) = reclaim.delete_unused_images().await {
            tracing::info!(%resource, error = %e, "eviction manager: unexpected error when attempting to reduce resource pressure");
        }
        let summary = match self.deps.summary.summary(&[]).await {
            Ok(s) => s,
            Err(e) => {
                tracing::error!(error = %e, "eviction manager: failed to get summary stats after resource reclaim");
                return false;
            }
        };
        let obs = observations(&summary);
        thresholds_met(&self.thresholds, &obs, true).is_empty()
    }

    /// One round at `now`; returns the pods evicted.
    pub async fn synchronize(&mut self, now: Instant) -> Vec<Arc<Pod>> {
        if self.thresholds.is_empty() && !self.cfg.local_storage_capacity_isolation {
            return Vec::new();
        }
        if self.dedicated_image_fs.is_none() {
            match self.deps.summary.has_dedicated_image_fs().await {
                Ok(d) => {
                    self.dedicated_image_fs = Some(d);
                    self.thresholds =
                        signals::with_container_fs_thresholds(&self.cfg.thresholds, d);
                }
                Err(e) => {
                    tracing::error!(error = %e, "eviction manager: failed to get HasDedicatedImageFs");
                    return Vec::new();
                }
            }
        }
        let dedicated = self.dedicated_image_fs.unwrap_or(false);
        let active = self.deps.pods.active_pods();
        let summary: Summary = match self.deps.summary.summary(&active).await {
            Ok(s) => s,
            Err(e) => {
                tracing::error!(error = %e, "eviction manager: failed to get summary stats");
                return Vec::new();
            }
        };
        let obs = observations(&summary);

        // Met now, ignoring grace; plus previously met ones not yet reclaimed enough.
        let mut met = thresholds_met(&self.thresholds, &obs, false);
        if !self.thresholds_met.is_empty() {
            let unresolved = thresholds_met(&self.thresholds_met, &obs, true);
            met = merge_thresholds(met, &unresolved);
        }
        self.record_observations(&obs, &met);
        let first_observed = thresholds_first_observed_at(&met, &self.first_observed, now);
        let conditions = node_conditions(&met);
        let conditions_observed =
            node_conditions_last_observed_at(&conditions, &self.conditions_observed, now);
        let conditions = node_conditions_observed_since(
            &conditions_observed,
            self.cfg.pressure_transition_period,
            now,
        );
        let mut to_act = thresholds_met_grace_period(&first_observed, now);

        self.handle.set_node_conditions(conditions);
        self.first_observed = first_observed;
        self.conditions_observed = conditions_observed;
        self.thresholds_met = to_act.clone();
        to_act = thresholds_updated_stats(&to_act, &obs, &self.last_observations);
        self.last_observations = obs.clone();

        // Local ephemeral storage limits.
        if self.cfg.local_storage_capacity_isolation {
            let mut evicted = Vec::new();
            for pod in &active {
                let uid = pod.metadata.uid.as_deref().unwrap_or_default();
                let Some(stats) = summary.pods.get(uid) else {
                    continue;
                };
                if let Some(v) = local_storage::violation(pod, stats, dedicated)
                    && self.evict_pod(
                        pod,
                        IMMEDIATE_EVICTION_GRACE_PERIOD_SECONDS,
                        &v.message,
                        BTreeMap::new(),
                        None,
                    )
                {
                    self.deps
                        .metrics
                        .evictions
                        .with_label_values(&[v.signal])
                        .inc();
                    evicted.push(pod.clone());
                }
            }
            if !evicted.is_empty() {
                return evicted;
            }
        }

        if to_act.is_empty() {
            return Vec::new();
        }
        sort_by_eviction_priority(&mut to_act);
        let threshold = to_act[0].clone();
        let resource = signal_resource(threshold.signal);
        tracing::info!(resource, signal = %threshold.signal, "eviction manager: attempting to reclaim");
        self.node_event(
            EventType::Warning,
            "EvictionThresholdMet",
            format!("Attempting to reclaim {resource}"),
        );
        if self
            .reclaim_node_level_resources(threshold.signal, resource)
            .await
        {
            tracing::info!(
                resource,
                "eviction manager: able to reduce resource pressure without evicting pods"
            );
            return Vec::new();
        }
        tracing::info!(resource, "eviction manager: must evict pod(s) to reclaim");
        if active.is_empty() {
            tracing::error!(
                "eviction manager: eviction thresholds have been met, but no pods are active to evict"
            );
            return Vec::new();
        }
        let mut ranked = active;
        rank_for_signal(threshold.signal, dedicated, &mut ranked, &summary.pods);
        tracing::info!(
            pods = ?ranked.iter().map(|p| p.metadata.name.clone().unwrap_or_default()).collect::<Vec<_>>(),
            "eviction manager: pods ranked for eviction"
        );
        for t in &to_act {
            if let Some(time) = obs.get(&t.signal).and_then(|o| o.time) {
                self.deps
                    .metrics
                    .stats_age
                    .with_label_values(&[t.signal.name()])
                    .observe(Instant::now().saturating_duration_since(time).as_secs_f64());
            }
        }
        for pod in ranked {
            let grace = if is_hard(&threshold) {
                IMMEDIATE_EVICTION_GRACE_PERIOD_SECONDS
            } else {
                let own = pod
                    .spec
                    .as_ref()
                    .and_then(|s| s.termination_grace_period_seconds);
                match own {
                    Some(g) => self.cfg.max_pod_grace_period.min(g),
                    None => self.cfg.max_pod_grace_period,
                }
            };
            let uid = pod.metadata.uid.as_deref().unwrap_or_default();
            let (message, annotations) =
                eviction_message(resource, &pod, summary.pods.get(uid), &to_act, &obs);
            let condition = PodCondition {
                type_: "DisruptionTarget".to_string(),
                status: "True".to_string(),
                reason: Some("TerminationByKubelet".to_string()),
                message: Some(message.clone()),
                ..PodCondition::default()
            };
            if self.evict_pod(&pod, grace, &message, annotations, Some(condition)) {
                self.deps
                    .metrics
                    .evictions
                    .with_label_values(&[threshold.signal.name()])
                    .inc();
                return vec![pod];
            }
        }
        tracing::info!("eviction manager: unable to evict any pods from the node");
        Vec::new()
    }

    async fn wait_for_pods_cleanup(&self, pods: &[Arc<Pod>], shutdown: &CancellationToken) {
        let deadline = Instant::now() + POD_CLEANUP_TIMEOUT;
        let mut tick = tokio::time::interval(POD_CLEANUP_POLL);
        tick.tick().await;
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep_until(deadline) => {
                    tracing::info!("eviction manager: pod cleanup timed out");
                    return;
                }
                _ = tick.tick() => {
                    let remaining = pods
                        .iter()
                        .filter(|p| !self.deps.pods.is_cleaned_up(p.metadata.uid.as_deref().unwrap_or_default()))
                        .count();
                    if remaining == 0 {
                        tracing::info!("eviction manager: pods successfully cleaned up");
                        return;
                    }
                }
            }
        }
    }

    /// Runs until `shutdown`; `wake` is notified by memory threshold notifiers.
    pub async fn run(mut self, wake: Arc<Notify>, shutdown: CancellationToken) {
        tracing::info!("eviction manager: starting control loop");
        loop {
            if shutdown.is_cancelled() {
                return;
            }
            let evicted = self.synchronize(Instant::now()).await;
            if !evicted.is_empty() {
                tracing::info!(
                    pods = ?evicted.iter().map(|p| p.metadata.name.clone().unwrap_or_default()).collect::<Vec<_>>(),
                    "eviction manager: pods evicted, waiting for pod to be cleaned up"
                );
                self.wait_for_pods_cleanup(&evicted, &shutdown).await;
                continue;
            }
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(self.cfg.monitoring_interval) => {}
                _ = wake.notified() => tracing::info!("eviction manager: memory threshold crossed"),
            }
        }
    }
}

#[cfg(test)]
mod tests;
