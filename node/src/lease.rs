//! The node's heartbeat Lease `kube-node-lease/<node>`, renewed as
//! kubelet's lease controller renews it:
//! - every `nodeLeaseDurationSeconds × 0.25` (10 s by default), with 4 %
//!   jitter, counted from the end of the previous renewal;
//! - the last Lease written is updated directly (no read), up to 5 tries;
//!   a conflict (409) re-reads the Lease and tries again with it;
//! - a Lease that does not exist is created; creating or reading it is
//!   retried with backoff from 200 ms doubling to 7 s;
//! - the Lease is owned by the Node (owner reference with the Node's UID),
//!   so it goes away with it; while the Node does not exist yet the Lease is
//!   not created, and an existing Lease without owner gets one as soon as
//!   the Node can be read.
//!
//! Every request is bounded by the heartbeat timeout, so an API server
//! that hangs costs one renewal, not the controller.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference};
use kube::api::{Api, PostParams};
use prometheus::{Gauge, Histogram, HistogramOpts, IntCounterVec, Opts, Registry};
use rand::Rng;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use keelson_common::error_chain::error_chain;
use keelson_common::observability::metrics::register;

/// Namespace of node leases.
pub const NODE_LEASE_NAMESPACE: &str = "kube-node-lease";
/// Share of the lease duration between renewals.
pub const RENEW_INTERVAL_FRACTION: f64 = 0.25;
/// Tries of one update (kubelet's `maxUpdateRetries`).
pub const MAX_UPDATE_RETRIES: usize = 5;
/// Longest wait between tries to read or create the Lease.
pub const MAX_BACKOFF: Duration = Duration::from_secs(7);
/// Renewal jitter.
pub const RENEW_JITTER: f64 = 0.04;

/// Settings of the lease controller.
#[derive(Debug, Clone)]
pub struct LeaseConfig {
    /// The node name: Lease name and holder identity.
    pub node_name: String,
    /// `nodeLeaseDurationSeconds`.
    pub duration_seconds: i32,
    /// Time between renewals.
    pub renew_interval: Duration,
    /// Bound of every request.
    pub request_timeout: Duration,
}

impl LeaseConfig {
    /// kubelet's settings for a lease of `duration_seconds`, each request
    /// bounded by `request_timeout`.
    pub fn new(node_name: &str, duration_seconds: i32, request_timeout: Duration) -> LeaseConfig {
        let duration = Duration::from_secs(u64::try_from(duration_seconds.max(1)).unwrap_or(40));
        LeaseConfig {
            node_name: node_name.to_string(),
            duration_seconds,
            renew_interval: duration.mul_f64(RENEW_INTERVAL_FRACTION),
            request_timeout,
        }
    }
}

/// Lease metrics.
#[derive(Debug, Clone)]
pub struct LeaseMetrics {
    /// `keelson_node_lease_renewals_total{result}`: `success`, `conflict`, `error`.
    pub renewals: IntCounterVec,
    /// `keelson_node_lease_renew_duration_seconds`: one successful write.
    pub renew_duration: Histogram,
    /// `keelson_node_lease_last_renew_timestamp_seconds`: renewTime last written.
    pub last_renew: Gauge,
}

impl LeaseMetrics {
    /// The metrics, registered in `registry`.
    pub fn new(registry: &Registry) -> LeaseMetrics {
        let m = Self::unregistered();
        register(registry, m.renewals.clone());
        register(registry, m.renew_duration.clone());
        register(registry, m.last_renew.clone());
        m
    }

    /// The metrics without a registry. Names are constants, so creation
    /// cannot fail.
    pub fn unregistered() -> LeaseMetrics {
        LeaseMetrics {
            renewals: IntCounterVec::new(
                Opts::new(
                    "keelson_node_lease_renewals_total",
                    "Node Lease writes by result: success, conflict (409, re-read), error",
                ),
                &["result"],
            )
            .expect("constant metric name is valid"),
            renew_duration: Histogram::with_opts(
                HistogramOpts::new(
                    "keelson_node_lease_renew_duration_seconds",
                    "Latency of a successful node Lease write",
                )
                .buckets(vec![
                    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
                ]),
            )
            .expect("constant metric name is valid"),
            last_renew: Gauge::new(
                "keelson_node_lease_last_renew_timestamp_seconds",
                "renewTime of the node Lease last written, in seconds since the epoch",
            )
            .expect("constant metric name is valid"),
        }
    }
}

/// The lease controller.
pub struct LeaseController {
    cfg: LeaseConfig,
    leases: Api<Lease>,
    nodes: Api<Node>,
    latest: Option<Lease>,
    metrics: LeaseMetrics,
}

async fn bounded<T, F>(limit: Duration, fut: F) -> Result<T, RequestError>
where
    F: std::future::Future<Output = Result<T, kube::Error>>,
{
    match tokio::time::timeout(limit, fut).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(kube::Error::Api(s))) if s.code == 404 => Err(RequestError::NotFound),
        Ok(Err(kube::Error::Api(s))) if s.code == 409 => {
            Err(RequestError::Conflict(s.message.clone()))
        }
        Ok(Err(e)) => Err(RequestError::Other(error_chain(&e))),
        Err(_) => Err(RequestError::Other(format!(
            "request timed out after {limit:?}"
        ))),
    }
}

/// How a lease request failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    /// 404.
    #[error("not found")]
    NotFound,
    /// 409: the Lease changed since it was read (or already exists).
    #[error("conflict: {0}")]
    Conflict(String),
    /// Anything else.
    #[error("{0}")]
    Other(String),
}

/// Why a renewal gave up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RenewError {
    /// Shutdown began.
    #[error("shut down")]
    ShutDown,
    /// Every attempt failed.
    #[error("failed {MAX_UPDATE_RETRIES} attempts to update lease")]
    Exhausted,
}

impl LeaseController {
    /// A controller writing with `client` (the node's identity).
    pub fn new(client: kube::Client, cfg: LeaseConfig, metrics: LeaseMetrics) -> LeaseController {
        LeaseController {
            leases: Api::namespaced(client.clone(), NODE_LEASE_NAMESPACE),
            nodes: Api::all(client),
            cfg,
            latest: None,
            metrics,
        }
    }

    /// Runs until `shutdown`: a renewal, then a jittered interval after it ends.
    pub async fn run(mut self, shutdown: CancellationToken) {
        loop {
            self.sync(&shutdown).await;
            let wait = self
                .cfg
                .renew_interval
                .mul_f64(1.0 + rand::rng().random_range(0.0..RENEW_JITTER));
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// One renewal (kubelet's `sync`).
    pub async fn sync(&mut self, shutdown: &CancellationToken) {
        if let Some(latest) = self.latest.clone() {
            // Optimistic: nobody else writes this Lease, so the last version
            // written is current and no read is needed.
            match self.retry_update_lease(latest, shutdown).await {
                Ok(()) => return,
                Err(e) => {
                    tracing::info!(error = %e, "failed to update lease using latest lease, fallback to ensure lease")
                }
            }
        }
        let Some((lease, created)) = self.backoff_ensure_lease(shutdown).await else {
            return;
        };
        self.latest = lease.clone();
        if !created
            && let Some(lease) = lease
            && let Err(e) = self.retry_update_lease(lease, shutdown).await
        {
            tracing::error!(error = %e, interval = ?self.cfg.renew_interval, "will retry updating lease");
        }
    }

    /// Reads (or creates) the Lease, retrying with backoff 200 ms → 7 s.
    /// `None` on shutdown; `Some((None, false))` when the Lease cannot be
    /// created yet (the Node is not readable for the owner reference).
    async fn backoff_ensure_lease(
        &mut self,
        shutdown: &CancellationToken,
    ) -> Option<(Option<Lease>, bool)> {
        let mut sleep = Duration::from_millis(100);
        loop {
            match self.ensure_lease().await {
                Ok(v) => return Some(v),
                Err(e) => {
                    sleep = (sleep * 2).min(MAX_BACKOFF);
                    self.metrics.renewals.with_label_values(&["error"]).inc();
                    tracing::error!(error = %e, retry_in = ?sleep, "failed to ensure lease exists, will retry");
                    tokio::select! {
                        _ = shutdown.cancelled() => return None,
                        _ = tokio::time::sleep(sleep) => {}
                    }
                }
            }
        }
    }

    async fn ensure_lease(&self) -> Result<(Option<Lease>, bool), RequestError> {
        let limit = self.cfg.request_timeout;
        match bounded(limit, self.leases.get(&self.cfg.node_name)).await {
            Ok(lease) => Ok((Some(lease), false)),
            Err(RequestError::NotFound) => {
                let Ok(lease) = self.new_lease(None).await else {
                    // Not created this time (no owner yet); the next round retries.
                    return Ok((None, false));
                };
                let created =
                    bounded(limit, self.leases.create(&PostParams::default(), &lease)).await?;
                self.written(&created);
                Ok((Some(created), true))
            }
            Err(e) => Err(e),
        }
    }

    /// Tries an update up to 5 times; a conflict re-reads the Lease first.
    async fn retry_update_lease(
        &mut self,
        mut base: Lease,
        shutdown: &CancellationToken,
    ) -> Result<(), RenewError> {
        for attempt in 0..MAX_UPDATE_RETRIES {
            let lease = match self.new_lease(Some(&base)).await {
                Ok(l) | Err(l) => l,
            };
            let started = Instant::now();
            let name = self.cfg.node_name.clone();
            match bounded(
                self.cfg.request_timeout,
                self.leases.replace(&name, &PostParams::default(), &lease),
            )
            .await
            {
                Ok(updated) => {
                    self.metrics
                        .renew_duration
                        .observe(started.elapsed().as_secs_f64());
                    self.written(&updated);
                    self.latest = Some(updated);
                    return Ok(());
                }
                Err(RequestError::Conflict(message)) => {
                    self.metrics.renewals.with_label_values(&["conflict"]).inc();
                    tracing::info!(%message, "lease changed since it was read; reading it again");
                    match self.backoff_ensure_lease(shutdown).await {
                        Some((Some(l), _)) => base = l,
                        Some((None, _)) => {}
                        None => return Err(RenewError::ShutDown),
                    }
                }
                Err(e) => {
                    self.metrics.renewals.with_label_values(&["error"]).inc();
                    tracing::warn!(error = %e, attempt, "failed to update lease");
                }
            }
        }
        Err(RenewError::Exhausted)
    }

    fn written(&self, lease: &Lease) {
        self.metrics.renewals.with_label_values(&["success"]).inc();
        if let Some(t) = lease.spec.as_ref().and_then(|s| s.renew_time.as_ref()) {
            self.metrics
                .last_renew
                .set(t.0.as_microsecond() as f64 / 1_000_000.0);
        }
    }

    /// kubelet's `newLease` with its owner-reference post-processing:
    /// `Ok` when the lease is complete, `Err(lease)` when the owner
    /// reference could not be set (fine for an update, not for a create).
    async fn new_lease(&self, base: Option<&Lease>) -> Result<Lease, Lease> {
        let mut lease = match base {
            Some(b) => b.clone(),
            None => Lease {
                metadata: ObjectMeta {
                    name: Some(self.cfg.node_name.clone()),
                    namespace: Some(NODE_LEASE_NAMESPACE.to_string()),
                    ..ObjectMeta::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(self.cfg.node_name.clone()),
                    lease_duration_seconds: Some(self.cfg.duration_seconds),
                    ..LeaseSpec::default()
                }),
            },
        };
        let now = jiff::Timestamp::now();
        let micros = jiff::Timestamp::from_microsecond(now.as_microsecond()).unwrap_or(now);
        lease.spec.get_or_insert_with(LeaseSpec::default).renew_time = Some(MicroTime(micros));
        if lease
            .metadata
            .owner_references
            .as_ref()
            .is_none_or(|o| o.is_empty())
        {
            match bounded(
                self.cfg.request_timeout,
                self.nodes.get(&self.cfg.node_name),
            )
            .await
            {
                Ok(node) => {
                    lease.metadata.owner_references = Some(vec![OwnerReference {
                        api_version: "v1".to_string(),
                        kind: "Node".to_string(),
                        name: self.cfg.node_name.clone(),
                        uid: node.metadata.uid.unwrap_or_default(),
                        ..OwnerReference::default()
                    }]);
                }
                Err(e) => {
                    tracing::warn!(error = %e, node = %self.cfg.node_name, "failed to get node when trying to set owner ref to the node lease");
                    return Err(lease);
                }
            }
        }
        Ok(lease)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renew_interval_is_a_quarter_of_the_duration() {
        let c = LeaseConfig::new("n1", 40, Duration::from_secs(10));
        assert_eq!(c.renew_interval, Duration::from_secs(10));
        let c = LeaseConfig::new("n1", 4, Duration::from_secs(1));
        assert_eq!(c.renew_interval, Duration::from_secs(1));
    }
}
