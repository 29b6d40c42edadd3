//! The proxy role's sync loop: watchers feed a [`ProxyHandle`]; the
//! [`Proxier`] turns pending changes into backend syncs, rate-limited by
//! `minSyncPeriod` (burst of 2, like kube-proxy's BoundedFrequencyRunner; 0
//! means sync on every change), with a verified full sync every
//! `syncPeriod`, then records metrics, health, health-check node ports and
//! cleans stale UDP conntrack entries.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::conntrack::{ConntrackCleaner, filters_for};
use super::health::{ListenFailure, ProxyHealth, ServiceHealthServer};
use super::metrics::ProxyMetrics;
use crate::backend::{Backend, BackendError, SyncOutcome};
use crate::model::{
    ChangeTracker, IpFamily, NamespacedName, NoEndpointVerdict, NodePortAddresses, NodeTopology,
    ProxyDiff, ServicePortState,
};

/// Timing and identity of the proxy role (KubeProxyConfiguration names).
#[derive(Debug, Clone)]
pub struct ProxierConfig {
    /// This node's name (`hostnameOverride` / node name).
    pub node_name: String,
    /// Families served (one for single-stack, both for dual-stack).
    pub families: Vec<IpFamily>,
    /// `minSyncPeriod` (default 1 s; 0 = sync on every change).
    pub min_sync_period: Duration,
    /// `syncPeriod` (default 30 s): verified full sync interval, retry
    /// delay after a refused sync, and half the health timeout.
    pub sync_period: Duration,
}

impl Default for ProxierConfig {
    fn default() -> Self {
        ProxierConfig {
            node_name: String::new(),
            families: vec![IpFamily::V4],
            min_sync_period: Duration::from_secs(1),
            sync_period: Duration::from_secs(30),
        }
    }
}

/// Where the proxier reports problems users must see (the wiring turns them
/// into Kubernetes Events).
pub trait ProxyEvents: Send + Sync {
    /// The data plane refused a sync; the previous rules stay in place.
    fn sync_failed(&self, backend: &str, error: &BackendError);
    /// A health-check node port could not be opened.
    fn healthcheck_failed(&self, failure: &ListenFailure);
}

/// Logs only.
#[derive(Debug, Default, Clone, Copy)]
pub struct LogEvents;

impl ProxyEvents for LogEvents {
    fn sync_failed(&self, backend: &str, error: &BackendError) {
        tracing::error!(backend, %error, "sync failed");
    }
    fn healthcheck_failed(&self, failure: &ListenFailure) {
        tracing::error!(%failure, "health check port failed");
    }
}

#[derive(Debug)]
struct Shared {
    tracker: Mutex<ChangeTracker>,
    notify: Notify,
    metrics: ProxyMetrics,
    health: ProxyHealth,
    synced: Mutex<(bool, bool)>,
    families: Vec<IpFamily>,
    programmed: tokio::sync::watch::Sender<bool>,
}

impl Shared {
    fn tracker(&self) -> MutexGuard<'_, ChangeTracker> {
        self.tracker.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn changed(&self, changed: bool) {
        {
            let t = self.tracker();
            self.metrics
                .service_changes_pending
                .set(t.pending_service_changes() as f64);
            self.metrics
                .endpoint_changes_pending
                .set(t.pending_endpoint_changes() as f64);
        }
        if changed {
            let now = unix_seconds(SystemTime::now());
            for f in &self.families {
                self.health.queued_update(*f);
                self.metrics
                    .last_queued_timestamp
                    .with_label_values(&[f.as_k8s()])
                    .set(now);
            }
            self.notify.notify_one();
        }
    }
}

/// Milliseconds, for log fields.
pub(crate) fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e4).round() / 10.0
}

fn unix_seconds(t: SystemTime) -> f64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// The input side of the proxier, for watchers (cheap to clone).
#[derive(Debug, Clone)]
pub struct ProxyHandle {
    shared: Arc<Shared>,
}

impl ProxyHandle {
    /// A Service was added or updated.
    pub fn update_service(&self, svc: &Service) {
        self.shared.metrics.service_changes_total.inc();
        let changed = self.shared.tracker().update_service(svc);
        self.shared.changed(changed);
    }

    /// A Service was deleted.
    pub fn delete_service(&self, namespace: &str, name: &str) {
        self.shared.metrics.service_changes_total.inc();
        let changed = self.shared.tracker().delete_service(namespace, name);
        self.shared.changed(changed);
    }

    /// The full Service list after a (re)list.
    pub fn replace_services<S: std::borrow::Borrow<Service>>(
        &self,
        all: impl IntoIterator<Item = S>,
    ) {
        let mut n = 0usize;
        let changed = self
            .shared
            .tracker()
            .replace_services(all.into_iter().inspect(|_| n += 1));
        self.shared
            .metrics
            .service_changes_total
            .inc_by(n.max(1) as f64);
        self.shared.changed(changed);
    }

    /// An EndpointSlice was added or updated.
    pub fn update_endpoint_slice(&self, slice: &EndpointSlice) {
        self.shared.metrics.endpoint_changes_total.inc();
        let changed = self.shared.tracker().update_endpoint_slice(slice);
        self.shared.changed(changed);
    }

    /// An EndpointSlice was deleted.
    pub fn delete_endpoint_slice(&self, slice: &EndpointSlice) {
        self.shared.metrics.endpoint_changes_total.inc();
        let changed = self.shared.tracker().delete_endpoint_slice(slice);
        self.shared.changed(changed);
    }

    /// The full EndpointSlice list after a (re)list.
    pub fn replace_endpoint_slices<S: std::borrow::Borrow<EndpointSlice>>(
        &self,
        all: impl IntoIterator<Item = S>,
    ) {
        let mut n = 0usize;
        let changed = self
            .shared
            .tracker()
            .replace_endpoint_slices(all.into_iter().inspect(|_| n += 1));
        self.shared
            .metrics
            .endpoint_changes_total
            .inc_by(n.max(1) as f64);
        self.shared.changed(changed);
    }

    /// The node's zone label changed.
    pub fn set_node_zone(&self, zone: Option<String>) {
        let changed = self.shared.tracker().set_node_zone(zone);
        self.shared.changed(changed);
    }

    /// The node is being deleted / tainted for deletion (healthz).
    pub fn sync_node(&self, deleting: bool, taints: &[String]) {
        self.shared.health.sync_node(deleting, taints);
    }

    /// Which addresses accept NodePorts.
    pub fn set_node_port_addresses(&self, family: IpFamily, addrs: NodePortAddresses) {
        let changed = self.shared.tracker().set_node_port_addresses(family, addrs);
        self.shared.changed(changed);
    }

    /// The Service CIDRs of a family (from ServiceCIDR objects).
    pub fn set_service_cidrs(&self, family: IpFamily, cidrs: Vec<ipnet::IpNet>) {
        let changed = self.shared.tracker().set_service_cidrs(family, cidrs);
        self.shared.changed(changed);
    }

    /// The initial Service list has been delivered.
    pub fn services_synced(&self) {
        self.shared
            .synced
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .0 = true;
        self.shared.notify.notify_one();
    }

    /// The initial EndpointSlice list has been delivered.
    pub fn endpoint_slices_synced(&self) {
        self.shared
            .synced
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .1 = true;
        self.shared.notify.notify_one();
    }

    /// Health state (for `/healthz`, `/livez`).
    pub fn health(&self) -> ProxyHealth {
        self.shared.health.clone()
    }

    /// The metrics.
    pub fn metrics(&self) -> &ProxyMetrics {
        &self.shared.metrics
    }

    /// Waits until the first sync programmed the data plane.
    pub async fn programmed(&self) {
        let mut rx = self.shared.programmed.subscribe();
        let _ = rx.wait_for(|p| *p).await;
    }

    /// What the data plane was last told for a Service's ports, and whether
    /// newer changes of it wait for a sync (read-only, for diagnose).
    pub fn programmed_service(
        &self,
        namespace: &str,
        name: &str,
    ) -> (Vec<Arc<crate::model::ServicePortState>>, bool) {
        let svc = crate::model::NamespacedName::new(namespace, name);
        let t = self.shared.tracker();
        let ports = t.applied_service(&svc).into_iter().cloned().collect();
        (ports, t.is_pending(&svc))
    }

    /// Whether changes are waiting for a sync.
    pub fn has_pending(&self) -> bool {
        self.shared.tracker().has_pending()
    }
}

/// The sync loop. Owns the backend.
pub struct Proxier {
    shared: Arc<Shared>,
    config: ProxierConfig,
    backend: Option<Box<dyn Backend>>,
    conntrack: Option<ConntrackCleaner>,
    health_checks: Option<ServiceHealthServer>,
    events: Arc<dyn ProxyEvents>,
    no_local: BTreeMap<(IpFamily, &'static str), i64>,
    initialized: bool,
}

impl std::fmt::Debug for Proxier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Proxier")
            .field("config", &self.config)
            .field("backend", &self.backend.as_ref().map(|b| b.name()))
            .finish()
    }
}

/// What one sync did.
#[derive(Debug, Clone, Default)]
pub struct SyncReport {
    /// Full (verified) or incremental.
    pub full: bool,
    /// Service ports changed.
    pub service_ports: usize,
    /// Backend outcome.
    pub outcome: SyncOutcome,
    /// Time spent.
    pub duration: Duration,
    /// UDP conntrack entries deleted.
    pub conntrack_deleted: usize,
}

impl Proxier {
    /// A proxier for `backend`, registering metrics into `registry`.
    pub fn new(
        config: ProxierConfig,
        backend: Box<dyn Backend>,
        registry: &prometheus::Registry,
    ) -> prometheus::Result<(Proxier, ProxyHandle)> {
        let (mut proxier, handle) = Proxier::pending(config, registry)?;
        proxier.backend = Some(backend);
        Ok((proxier, handle))
    }

    /// A proxier whose backend is given later ([`Proxier::set_backend`],
    /// before [`Proxier::run`]): its handle takes changes at once, so the
    /// initial lists can load while the data plane opens.
    pub fn pending(
        config: ProxierConfig,
        registry: &prometheus::Registry,
    ) -> prometheus::Result<(Proxier, ProxyHandle)> {
        let metrics = ProxyMetrics::register(registry)?;
        let health = ProxyHealth::new(config.sync_period * 2, Some(metrics.clone()));
        let tracker = ChangeTracker::new(
            config.families.iter().copied(),
            NodeTopology {
                name: config.node_name.clone(),
                zone: None,
            },
        );
        let shared = Arc::new(Shared {
            tracker: Mutex::new(tracker),
            notify: Notify::new(),
            metrics,
            health,
            synced: Mutex::new((false, false)),
            families: config.families.clone(),
            programmed: tokio::sync::watch::channel(false).0,
        });
        let handle = ProxyHandle {
            shared: shared.clone(),
        };
        Ok((
            Proxier {
                shared,
                config,
                backend: None,
                conntrack: None,
                health_checks: None,
                events: Arc::new(LogEvents),
                no_local: BTreeMap::new(),
                initialized: false,
            },
            handle,
        ))
    }

    /// Gives the proxier its backend (see [`Proxier::pending`]).
    pub fn set_backend(&mut self, backend: Box<dyn Backend>) {
        self.backend = Some(backend);
    }

    /// Cleans stale UDP conntrack entries with `cleaner` after each sync.
    pub fn with_conntrack(mut self, cleaner: ConntrackCleaner) -> Self {
        self.conntrack = Some(cleaner);
        self
    }

    /// Serves health-check node ports with `server`.
    pub fn with_health_checks(mut self, server: ServiceHealthServer) -> Self {
        self.health_checks = Some(server);
        self
    }

    /// Reports problems to `events`.
    pub fn with_events(mut self, events: Arc<dyn ProxyEvents>) -> Self {
        self.events = events;
        self
    }

    fn synced(&self) -> bool {
        let s = self.shared.synced.lock().unwrap_or_else(|p| p.into_inner());
        s.0 && s.1
    }

    /// Runs one sync now: a full (verified) sync the first time and when
    /// `full`, otherwise only the pending changes. Blocks on the backend
    /// (call it from a blocking context).
    pub fn sync_now(&mut self, full: bool) -> Result<SyncReport, BackendError> {
        let first = !self.initialized;
        let full = full || first;
        let start = Instant::now();
        let (diff, snapshot) = {
            let t = self.shared.tracker();
            let diff = t.diff();
            let snapshot = full.then(|| t.snapshot(&diff));
            (diff, snapshot)
        };
        let modelled = start.elapsed();
        if !full && diff.is_empty() {
            return Ok(SyncReport::default());
        }
        let Some(backend) = self.backend.as_mut() else {
            return Err(BackendError::Invalid("proxier has no backend".into()));
        };
        let result = match &snapshot {
            Some(s) => backend.full_sync(s),
            None => backend.sync(&diff),
        };
        let elapsed = start.elapsed();
        let name = backend.name();
        let outcome = match result {
            Ok(o) => o,
            Err(e) => {
                if name == "nftables" {
                    for f in &self.config.families {
                        self.shared
                            .metrics
                            .nftables_sync_failures
                            .with_label_values(&[f.as_k8s()])
                            .inc();
                    }
                }
                self.events.sync_failed(name, &e);
                return Err(e);
            }
        };
        self.initialized = true;
        self.shared.tracker().commit(&diff);
        self.shared.programmed.send_replace(true);
        self.after_sync(&diff, full, elapsed, &outcome);
        let conntrack_deleted = self.clean_conntrack(&diff);
        self.sync_health_checks(&diff, full);
        if first {
            tracing::info!(
                backend = name,
                service_ports = diff.changes.len(),
                objects_changed = outcome.objects_changed,
                model_ms = ms(modelled),
                backend_ms = ms(elapsed - modelled),
                after_ms = ms(start.elapsed() - elapsed),
                "first sync"
            );
        }
        Ok(SyncReport {
            full,
            service_ports: diff.changes.len(),
            outcome,
            duration: elapsed,
            conntrack_deleted,
        })
    }

    fn after_sync(
        &mut self,
        diff: &ProxyDiff,
        full: bool,
        elapsed: Duration,
        outcome: &SyncOutcome,
    ) {
        let m = &self.shared.metrics;
        let now = SystemTime::now();
        for f in &self.config.families {
            let l = [f.as_k8s()];
            m.sync_duration
                .with_label_values(&l)
                .observe(elapsed.as_secs_f64());
            if full {
                m.sync_full_duration
                    .with_label_values(&l)
                    .observe(elapsed.as_secs_f64());
            } else {
                m.sync_partial_duration
                    .with_label_values(&l)
                    .observe(elapsed.as_secs_f64());
            }
            m.last_timestamp
                .with_label_values(&l)
                .set(unix_seconds(now));
            self.shared.health.updated(*f);
        }
        m.objects_written
            .with_label_values(&["all", "changed"])
            .inc_by(outcome.objects_changed as f64);
        // Network programming latency, per family the Service was programmed in.
        for (svc, t) in &diff.trigger_times {
            let latency = now.duration_since(*t).unwrap_or_default().as_secs_f64();
            let families: BTreeSet<IpFamily> = diff
                .changes
                .iter()
                .filter(|c| &c.key.name.service == svc)
                .map(|c| c.key.family)
                .collect();
            for f in families {
                m.network_programming
                    .with_label_values(&[f.as_k8s()])
                    .observe(latency);
            }
        }
        // Services with a Local policy and no local endpoint.
        let contribution = |s: &ServicePortState| -> [(&'static str, i64); 2] {
            [
                (
                    "internal",
                    i64::from(s.internal_no_endpoint_verdict() == Some(NoEndpointVerdict::Drop)),
                ),
                (
                    "external",
                    i64::from(
                        s.external_no_endpoint_verdict() == Some(NoEndpointVerdict::Drop)
                            && s.info.externally_accessible(),
                    ),
                ),
            ]
        };
        for c in &diff.changes {
            let f = c.key.family;
            if let Some(p) = c.previous.as_deref() {
                for (policy, n) in contribution(p) {
                    *self.no_local.entry((f, policy)).or_default() -= n;
                }
            }
            if let Some(s) = c.current.as_deref() {
                for (policy, n) in contribution(s) {
                    *self.no_local.entry((f, policy)).or_default() += n;
                }
            }
        }
        for f in &self.config.families {
            for policy in ["internal", "external"] {
                let v = self.no_local.get(&(*f, policy)).copied().unwrap_or(0);
                m.no_local_endpoints
                    .with_label_values(&[f.as_k8s(), policy])
                    .set(v as f64);
            }
        }
        let t = self.shared.tracker();
        m.service_changes_pending
            .set(t.pending_service_changes() as f64);
        m.endpoint_changes_pending
            .set(t.pending_endpoint_changes() as f64);
        tracing::debug!(
            full,
            service_ports = diff.changes.len(),
            objects = outcome.objects_changed,
            elapsed_ms = elapsed.as_secs_f64() * 1000.0,
            "synced proxy rules"
        );
    }

    fn clean_conntrack(&mut self, diff: &ProxyDiff) -> usize {
        let Some(ct) = self.conntrack.as_mut() else {
            return 0;
        };
        let filters = filters_for(diff);
        let mut total = 0;
        for family in &self.config.families {
            let fs: Vec<_> = filters
                .iter()
                .filter(|(f, _)| f == family)
                .map(|(_, f)| f.clone())
                .collect();
            if fs.is_empty() {
                continue;
            }
            let start = Instant::now();
            match ct.clean(*family, &fs) {
                Ok(n) => {
                    total += n;
                    self.shared
                        .metrics
                        .conntrack_deleted
                        .with_label_values(&[family.as_k8s()])
                        .inc_by(n as f64);
                }
                Err(e) => {
                    tracing::error!(error = %e, family = %family, "failed to clear conntrack entries")
                }
            }
            self.shared
                .metrics
                .conntrack_duration
                .with_label_values(&[family.as_k8s()])
                .observe(start.elapsed().as_secs_f64());
        }
        total
    }

    fn sync_health_checks(&mut self, diff: &ProxyDiff, full: bool) {
        let Some(hc) = self.health_checks.as_mut() else {
            return;
        };
        // Recompute for the Services in the diff (everything on a full sync).
        let t = self.shared.tracker();
        let services: BTreeSet<NamespacedName> = if full {
            t.applied().keys().map(|k| k.name.service.clone()).collect()
        } else {
            diff.changes
                .iter()
                .map(|c| c.key.name.service.clone())
                .collect()
        };
        let mut wanted = hc.open_ports();
        let mut counts: HashMap<NamespacedName, usize> = HashMap::new();
        for svc in &services {
            let ports = t.applied_service(svc);
            match ports.iter().find_map(|p| p.info.health_check_node_port) {
                Some(port) => {
                    wanted.insert(svc.clone(), port);
                }
                None => {
                    wanted.remove(svc);
                }
            }
            let ips: BTreeSet<IpAddr> = ports.iter().flat_map(|p| p.local_ready_ips()).collect();
            counts.insert(svc.clone(), ips.len());
        }
        // Keep the counts of Services not in this diff.
        for svc in wanted.keys() {
            if !counts.contains_key(svc) {
                let ips: BTreeSet<IpAddr> = t
                    .applied_service(svc)
                    .iter()
                    .flat_map(|p| p.local_ready_ips())
                    .collect();
                counts.insert(svc.clone(), ips.len());
            }
        }
        drop(t);
        for failure in hc.sync_services(&wanted) {
            self.events.healthcheck_failed(&failure);
        }
        hc.sync_endpoints(counts);
    }

    /// Runs until `shutdown`: waits for the initial lists, then syncs on
    /// changes (rate-limited) and every `syncPeriod`.
    pub async fn run(mut self, shutdown: CancellationToken) {
        for f in &self.config.families {
            self.shared.health.updated(*f);
        }
        let shared = self.shared.clone();
        // Wait for the initial Service and EndpointSlice lists.
        while !self.synced() {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = shared.notify.notified() => {}
            }
        }
        let min = self.config.min_sync_period;
        let period = self.config.sync_period.max(Duration::from_millis(100));
        let mut tokens: f64 = 2.0;
        let mut last_refill = Instant::now();
        let mut next_full = Instant::now();
        let mut retry_at: Option<Instant> = None;
        let mut pending = true;
        loop {
            let now = Instant::now();
            if !min.is_zero() {
                tokens = (tokens
                    + now.duration_since(last_refill).as_secs_f64() / min.as_secs_f64())
                .min(2.0);
            }
            last_refill = now;
            let full_due = now >= next_full;
            let retry_due = retry_at.is_some_and(|r| now >= r);
            let may_run = min.is_zero() || tokens >= 1.0;
            if (full_due || retry_due || (pending && retry_at.is_none())) && may_run {
                if !min.is_zero() {
                    tokens -= 1.0;
                }
                pending = false;
                let full = full_due || !self.initialized;
                let result = tokio::task::block_in_place(|| self.sync_now(full));
                match result {
                    Ok(_) => {
                        retry_at = None;
                        if full {
                            next_full = Instant::now() + period;
                        }
                    }
                    Err(e) => {
                        tracing::error!(error = %e, retry_in = ?period, "proxy sync failed; previous rules stay in place");
                        retry_at = Some(Instant::now() + period);
                        if full {
                            next_full = Instant::now() + period;
                        }
                    }
                }
                if self.shared.tracker().has_pending() {
                    pending = true;
                }
                continue;
            }
            // Sleep until the next event that could make us run.
            let mut wake = next_full;
            if let Some(r) = retry_at {
                wake = wake.min(r);
            }
            if pending && !may_run {
                let need = (1.0 - tokens).max(0.0) * min.as_secs_f64();
                wake = wake.min(now + Duration::from_secs_f64(need));
            }
            tokio::select! {
                _ = shutdown.cancelled() => return,
                // A change after a failed sync is tried at once (minSyncPeriod
                // still applies), like kube-proxy's runner; without changes
                // the retry waits for syncPeriod.
                _ = shared.notify.notified() => { pending = true; retry_at = None; }
                _ = tokio::time::sleep_until(tokio::time::Instant::from_std(wake)) => {}
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::fixtures::ServiceBuilder;
    use crate::model::{ProxyDiff, ProxySnapshot};

    /// Refuses its first `refuse` syncs, then succeeds; counts attempts.
    struct Refusing {
        attempts: Arc<AtomicUsize>,
        refuse: usize,
    }

    impl Refusing {
        fn attempt(&mut self) -> Result<SyncOutcome, BackendError> {
            let n = self.attempts.fetch_add(1, Ordering::SeqCst) + 1;
            if n <= self.refuse {
                Err(BackendError::Invalid("refused for the test".into()))
            } else {
                Ok(SyncOutcome::default())
            }
        }
    }

    impl Backend for Refusing {
        fn name(&self) -> &'static str {
            "refusing"
        }
        fn sync(&mut self, _: &ProxyDiff) -> Result<SyncOutcome, BackendError> {
            self.attempt()
        }
        fn full_sync(&mut self, _: &ProxySnapshot) -> Result<SyncOutcome, BackendError> {
            self.attempt()
        }
        fn cleanup(&mut self) -> Result<(), BackendError> {
            Ok(())
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_change_after_a_refused_sync_is_tried_at_once() {
        let attempts = Arc::new(AtomicUsize::new(0));
        let (proxier, handle) = Proxier::new(
            ProxierConfig {
                node_name: "n".into(),
                families: vec![IpFamily::V4],
                min_sync_period: Duration::ZERO,
                // Far away: only a change can cause the second attempt.
                sync_period: Duration::from_secs(3600),
            },
            Box::new(Refusing {
                attempts: attempts.clone(),
                refuse: 1,
            }),
            &prometheus::Registry::new(),
        )
        .unwrap();
        let stop = CancellationToken::new();
        let task = tokio::spawn(proxier.run(stop.clone()));
        handle.services_synced();
        handle.endpoint_slices_synced();
        let deadline = Instant::now() + Duration::from_secs(10);
        while attempts.load(Ordering::SeqCst) < 1 {
            assert!(Instant::now() < deadline, "no first sync");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        handle.update_service(
            &ServiceBuilder::new("default", "web")
                .cluster_ip("10.96.0.10")
                .port("http", crate::model::Protocol::Tcp, 80)
                .build(),
        );
        while attempts.load(Ordering::SeqCst) < 2 {
            assert!(
                Instant::now() < deadline,
                "the change waited for syncPeriod after the refused sync"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        stop.cancel();
        task.await.unwrap();
    }
}
