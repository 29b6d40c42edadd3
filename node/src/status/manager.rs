//! The node status loop, as kubelet runs it:
//! - register the Node (create, or adopt an existing one) with backoff
//!   100 ms doubling to 7 s, until it works;
//! - every `nodeStatusUpdateFrequency` (jitter 4 %): read the Node (first
//!   try from the API server's cache), recompute the status, and patch it
//!   when something changed or `nodeStatusReportFrequency` has passed since
//!   the last write; up to 5 tries per round;
//! - right after start, every 100 ms until the Node is Ready (at most 2 min),
//!   push the status as soon as the runtime makes the node Ready (kubelet's
//!   `fastStatusUpdateOnce`).
//!
//! Every API request is bounded by the heartbeat timeout (the shorter of
//! the update frequency and the lease duration, as kubelet's heartbeat
//! client): an API server that hangs costs one period, not the loop.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use keelson_cri::RuntimeClient;
use kube::api::{Api, GetParams, Patch, PatchParams, PostParams};
use rand::Rng;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::call::{CallError, bounded};
use super::capacity::parse_list;
use super::conditions::NodeEvent;
use super::handle::{NodeStatusHandle, PressureSource};
use super::host::{Host, MachineInfo};
use super::images::sort_by_size;
use super::metrics::StatusMetrics;
use super::patch::{node_status_patch, status_changed};
use super::registration::{
    LABEL_ARCH, LABEL_OS, RegistrationConfig, initial_node, reconcile_existing,
};
use super::runtime::{RuntimeState, update_runtime_up};
use super::setters::{Observed, SetterConfig, apply, now_seconds};
use super::shutting_down::ShuttingDown;
use crate::config::NodeConfig;
use crate::config::eviction::parse_thresholds;
use keelson_common::error_chain::error_chain;
use keelson_common::events::{EventRecorder, EventType, node_ref};

/// Tries per status round (kubelet's `nodeStatusUpdateRetry`).
pub const NODE_STATUS_UPDATE_RETRY: usize = 5;
/// Interval of the fast status update after start.
pub const FAST_UPDATE_INTERVAL: Duration = Duration::from_millis(100);
/// How long the fast status update keeps trying (kubelet's `nodeReadyGracePeriod`).
pub const NODE_READY_GRACE_PERIOD: Duration = Duration::from_secs(120);
/// Jitter of the status period (kubelet's `JitterUntil(..., 0.04, ...)`).
pub const STATUS_JITTER: f64 = 0.04;
/// Registration backoff start and cap.
pub const REGISTRATION_BACKOFF: (Duration, Duration) =
    (Duration::from_millis(100), Duration::from_secs(7));

/// Why one status try failed.
#[derive(Debug, thiserror::Error)]
pub enum StatusError {
    /// Reading the Node failed.
    #[error("error getting node {node:?}: {message}")]
    Get {
        /// The node name.
        node: String,
        /// Why.
        message: CallError,
    },
    /// Writing the status failed.
    #[error("error patching node {node:?} status: {message}")]
    Patch {
        /// The node name.
        node: String,
        /// Why.
        message: CallError,
    },
    /// The patch could not be built.
    #[error("building node status patch: {0}")]
    Encode(serde_json::Error),
    /// Every try of a round failed.
    #[error("update node status exceeds retry count")]
    RetriesExhausted,
}

/// Settings of the status manager.
#[derive(Debug, Clone)]
pub struct StatusConfig {
    /// Node name.
    pub node_name: String,
    /// `registerNode`.
    pub register_node: bool,
    /// What registration sets.
    pub registration: RegistrationConfig,
    /// What the setters need.
    pub setters: SetterConfig,
    /// `nodeStatusUpdateFrequency`.
    pub update_frequency: Duration,
    /// `nodeStatusReportFrequency`.
    pub report_frequency: Duration,
    /// Bound of every API request of the heartbeat.
    pub heartbeat_timeout: Duration,
    /// Bound of the CRI calls made for status (Version, ListImages).
    pub cri_timeout: Duration,
    /// The root dir (its filesystem is `ephemeral-storage`).
    pub root_dir: PathBuf,
    /// `podCIDR` from the configuration (applied at start, standalone style).
    pub pod_cidr: String,
}

impl StatusConfig {
    /// Builds the settings from the node section of the configuration.
    pub fn from_node_config(node_name: &str, n: &NodeConfig) -> StatusConfig {
        let update = n.node_status_update_frequency.get();
        let lease =
            Duration::from_secs(u64::try_from(n.node_lease_duration_seconds.max(1)).unwrap_or(40));
        let thresholds = parse_thresholds(
            &n.eviction_hard,
            &n.eviction_soft,
            &n.eviction_soft_grace_period,
            &n.eviction_minimum_reclaim,
        )
        .unwrap_or_default();
        StatusConfig {
            node_name: node_name.to_string(),
            register_node: n.register_node,
            registration: RegistrationConfig {
                node_name: node_name.to_string(),
                hostname: node_name.to_string(),
                node_labels: n.node_labels.clone(),
                register_with_taints: n.register_with_taints.clone(),
                provider_id: n.provider_id.clone(),
                external_cloud_provider: n.external_cloud_provider(),
            },
            setters: SetterConfig {
                node_name: node_name.to_string(),
                node_ip: n.node_ip,
                max_pods: n.max_pods,
                max_images: n.node_status_max_images,
                system_reserved: super::capacity::parse_reserved(&n.system_reserved),
                kube_reserved: super::capacity::parse_reserved(&n.kube_reserved),
                thresholds,
                kubelet_version: keelson_common::version::KUBERNETES_VERSION.to_string(),
                kubelet_port: n.port,
                external_cloud_provider: n.external_cloud_provider(),
            },
            update_frequency: update,
            report_frequency: n.node_status_report_frequency.get(),
            heartbeat_timeout: update.min(lease),
            cri_timeout: update.min(n.runtime_request_timeout.get()),
            root_dir: n.root_dir.clone(),
            pod_cidr: n.pod_cidr.clone(),
        }
    }
}

/// What the manager talks to.
pub struct StatusDeps {
    /// The node's API client.
    pub client: kube::Client,
    /// The CRI client.
    pub cri: RuntimeClient,
    /// Host facts.
    pub host: Arc<dyn Host>,
    /// Runtime health.
    pub runtime: RuntimeState,
    /// Pressure from the eviction manager.
    pub pressure: Arc<dyn PressureSource>,
    /// The device manager (`None`: no device plugins).
    pub devices: Option<crate::devices::DeviceManager>,
    /// Event recorder (`None`: no events).
    pub recorder: Option<EventRecorder>,
    /// Metrics.
    pub metrics: StatusMetrics,
    /// Whether the node is shutting down (graceful node shutdown).
    pub shutting_down: ShuttingDown,
}

/// Result of one successful status try.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncOutcome {
    /// The status was patched.
    Written,
    /// Nothing changed and the report interval has not passed.
    Unchanged,
}

/// The node status manager.
pub struct NodeStatusManager {
    cfg: StatusConfig,
    deps: StatusDeps,
    handle: NodeStatusHandle,
    registered: bool,
    last_report: Option<Instant>,
    machine: Option<MachineInfo>,
    ephemeral_storage: Option<u64>,
    runtime_name: Option<String>,
    applied_pod_cidr: String,
    started: Instant,
    first_attempt: Option<Instant>,
    registered_at: Option<Instant>,
    ready_seen: bool,
}

fn api_err(e: &kube::Error) -> String {
    error_chain(e)
}

fn is_already_exists(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409 && (s.reason == "AlreadyExists" || s.reason.is_empty()))
}

fn ready_status(node: &Node) -> Option<String> {
    node.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready")
        .map(|c| c.status.clone())
}

impl NodeStatusManager {
    /// A manager; reads machine facts at once so allocatable is known early.
    pub fn new(cfg: StatusConfig, deps: StatusDeps) -> (NodeStatusManager, NodeStatusHandle) {
        let handle = NodeStatusHandle::default();
        let mut m = NodeStatusManager {
            cfg,
            deps,
            handle: handle.clone(),
            registered: false,
            last_report: None,
            machine: None,
            ephemeral_storage: None,
            runtime_name: None,
            applied_pod_cidr: String::new(),
            started: Instant::now(),
            first_attempt: None,
            registered_at: None,
            ready_seen: false,
        };
        m.refresh_machine();
        // A first computation so allocatable is available before the API answers.
        let mut node = initial_node(&m.cfg.registration);
        let obs = m.offline_observation();
        apply(&mut node, &m.cfg.setters, &obs);
        m.publish(&node);
        (m, handle)
    }

    fn refresh_machine(&mut self) {
        if self.machine.is_none() {
            match self.deps.host.machine_info() {
                Ok(info) => self.machine = Some(info),
                Err(e) => tracing::error!(error = %e, "error getting machine info"),
            }
        }
        if self.ephemeral_storage.is_none() {
            match self.deps.host.fs_stats(&self.cfg.root_dir) {
                Ok(fs) => self.ephemeral_storage = Some(fs.capacity),
                Err(e) => {
                    tracing::warn!(error = %e, root_dir = %self.cfg.root_dir.display(), "cannot read the root dir's filesystem size")
                }
            }
        }
    }

    /// An observation without calling the runtime or the network.
    fn offline_observation(&self) -> Observed {
        Observed {
            now: now_seconds(),
            machine: self.machine.clone(),
            version: self.deps.host.version_info().ok(),
            ephemeral_storage: self.ephemeral_storage,
            runtime_name: self.runtime_name.clone(),
            runtime_version: None,
            images: Ok(Vec::new()),
            interface_addresses: None,
            default_route_ip: None,
            runtime_errors: self.deps.runtime.runtime_errors(),
            network_errors: self.deps.runtime.network_errors(),
            storage_errors: self.deps.runtime.storage_errors(),
            shutdown_error: self.deps.shutting_down.error(),
            runtime_handlers: Vec::new(),
            supplemental_groups_policy: None,
            pressure: self.deps.pressure.pressure(),
            devices: self.deps.devices.as_ref().map(|d| d.capacity()),
            volumes_in_use: self.handle.volumes_in_use().to_report(),
        }
    }

    async fn observe(&mut self) -> Observed {
        self.refresh_machine();
        let limit = self.cfg.cri_timeout;
        let runtime_version = match bounded(limit, self.deps.cri.version()).await {
            Ok(v) => {
                self.runtime_name = Some(v.runtime_name.clone());
                Some(v.runtime_version)
            }
            Err(e) => {
                tracing::debug!(error = %e, "CRI Version failed");
                None
            }
        };
        let images = bounded(limit, self.deps.cri.list_images(None))
            .await
            .map(|mut images| {
                sort_by_size(&mut images);
                images
            });
        let version = match self.deps.host.version_info() {
            Ok(v) => Some(v),
            Err(e) => {
                tracing::error!(error = %e, "error getting version info");
                None
            }
        };
        let interface_addresses = match self.deps.host.interface_addresses() {
            Ok(a) => Some(a),
            Err(e) => {
                tracing::warn!(error = %e, "cannot list interface addresses");
                None
            }
        };
        let default_route_ip = if self.cfg.setters.node_ip.is_none() {
            crate::node_ip::resolve(None).ok()
        } else {
            None
        };
        Observed {
            now: now_seconds(),
            machine: self.machine.clone(),
            version,
            ephemeral_storage: self.ephemeral_storage,
            runtime_name: self.runtime_name.clone(),
            runtime_version,
            images,
            interface_addresses,
            default_route_ip,
            runtime_errors: self.deps.runtime.runtime_errors(),
            network_errors: self.deps.runtime.network_errors(),
            storage_errors: self.deps.runtime.storage_errors(),
            shutdown_error: self.deps.shutting_down.error(),
            runtime_handlers: self.deps.runtime.runtime_handlers(),
            supplemental_groups_policy: self.deps.runtime.supplemental_groups_policy(),
            pressure: self.deps.pressure.pressure(),
            devices: self.deps.devices.as_ref().map(|d| d.capacity()),
            volumes_in_use: self.handle.volumes_in_use().to_report(),
        }
    }

    fn publish(&self, node: &Node) {
        let status = node.status.clone().unwrap_or_default();
        self.handle.set_resources(
            parse_list(&status.capacity.unwrap_or_default()),
            parse_list(&status.allocatable.unwrap_or_default()),
        );
        self.handle.set_node(node.clone());
    }

    fn record(&self, events: &[NodeEvent]) {
        let Some(rec) = &self.deps.recorder else {
            return;
        };
        for ev in events {
            let message = ev.message.clone().unwrap_or_else(|| {
                format!("Node {} status is now: {}", self.cfg.node_name, ev.reason)
            });
            let kind = if ev.warning {
                EventType::Warning
            } else {
                EventType::Normal
            };
            rec.event(&node_ref(&self.cfg.node_name), kind, ev.reason, message);
        }
    }

    fn api(&self) -> Api<Node> {
        Api::all(self.deps.client.clone())
    }

    /// kubelet's `updatePodCIDR`: hands a new pod CIDR to the runtime.
    async fn update_pod_cidr(&mut self, cidr: &str) -> bool {
        if cidr == self.applied_pod_cidr {
            return false;
        }
        match self.deps.cri.update_runtime_config(cidr).await {
            Ok(()) => {
                tracing::info!(original = %self.applied_pod_cidr, new = %cidr, "updating pod CIDR");
                self.applied_pod_cidr = cidr.to_string();
                true
            }
            Err(e) => {
                tracing::error!(error = %e, cidr, "failed to update pod CIDR");
                false
            }
        }
    }

    /// kubelet's `updateNode`: the Node as it should be, whether it changed, events.
    async fn update_node(&mut self, original: &Node) -> (Node, bool, Vec<NodeEvent>) {
        let mut node = original.clone();
        let mut pod_cidr_changed = false;
        if let Some(cidrs) = node.spec.as_ref().and_then(|s| s.pod_cidrs.clone())
            && !cidrs.is_empty()
        {
            pod_cidr_changed = self.update_pod_cidr(&cidrs.join(",")).await;
        }
        let mut labels_missing = false;
        let labels = node.metadata.labels.get_or_insert_with(Default::default);
        for (key, value) in [
            (LABEL_OS, std::env::consts::OS),
            (LABEL_ARCH, keelson_common::version::go_arch()),
        ] {
            if labels.get(key).map(String::as_str) != Some(value) {
                labels.insert(key.to_string(), value.to_string());
                labels_missing = true;
            }
        }
        let obs = self.observe().await;
        let outcome = apply(&mut node, &self.cfg.setters, &obs);
        for e in &outcome.errors {
            tracing::warn!(error = %e, "node status setter failed");
        }
        let changed = pod_cidr_changed
            || labels_missing
            || status_changed(original.status.as_ref(), node.status.as_ref());
        (node, changed, outcome.events)
    }

    async fn patch_node_status(
        &mut self,
        original: &Node,
        node: &Node,
    ) -> Result<Node, StatusError> {
        let patch = node_status_patch(original, node).map_err(StatusError::Encode)?;
        let api = self.api();
        let name = self.cfg.node_name.clone();
        let pp = PatchParams::default();
        let body = Patch::Strategic(patch);
        let updated = bounded(
            self.cfg.heartbeat_timeout,
            api.patch_status(&name, &pp, &body),
        )
        .await
        .map_err(|message| StatusError::Patch {
            node: name.clone(),
            message,
        })?;
        self.last_report = Some(Instant::now());
        if !self.ready_seen && ready_status(&updated).as_deref() == Some("True") {
            self.ready_seen = true;
            let now = Instant::now();
            self.deps
                .metrics
                .startup
                .set((now - self.started).as_secs_f64());
            if let Some(r) = self.registered_at {
                self.deps
                    .metrics
                    .post_registration
                    .set((now - r).as_secs_f64());
            }
        }
        Ok(updated)
    }

    /// kubelet's `tryUpdateNodeStatus`.
    pub async fn try_update_node_status(
        &mut self,
        attempt: usize,
    ) -> Result<SyncOutcome, StatusError> {
        let gp = if attempt == 0 {
            GetParams::any()
        } else {
            GetParams::default()
        };
        let api = self.api();
        let name = self.cfg.node_name.clone();
        let original = bounded(self.cfg.heartbeat_timeout, api.get_with(&name, &gp))
            .await
            .map_err(|message| StatusError::Get {
                node: name.clone(),
                message,
            })?;
        if !self.handle.is_registered() {
            self.handle.set_registered();
        }
        let (node, changed, events) = self.update_node(&original).await;
        self.publish(&node);
        let due = self
            .last_report
            .is_none_or(|t| t.elapsed() >= self.cfg.report_frequency);
        if !changed && !due {
            return Ok(SyncOutcome::Unchanged);
        }
        let updated = self.patch_node_status(&original, &node).await?;
        // kubelet_node_status.go: the volume manager learns which volumes
        // the API server now lists as in use.
        self.handle.volumes_in_use().mark_reported(
            &updated
                .status
                .as_ref()
                .and_then(|s| s.volumes_in_use.clone())
                .unwrap_or_default(),
        );
        self.record(&events);
        self.publish(&updated);
        Ok(SyncOutcome::Written)
    }

    /// kubelet's `updateNodeStatus`: up to 5 tries.
    pub async fn update_node_status(&mut self) -> Result<SyncOutcome, StatusError> {
        for attempt in 0..NODE_STATUS_UPDATE_RETRY {
            match self.try_update_node_status(attempt).await {
                Ok(o) => return Ok(o),
                Err(e) => {
                    tracing::warn!(error = %e, attempt, "error updating node status, will retry")
                }
            }
        }
        Err(StatusError::RetriesExhausted)
    }

    /// kubelet's `syncNodeStatus`: register if needed, then update.
    pub async fn sync_node_status(&mut self, shutdown: &CancellationToken) {
        if self.cfg.register_node
            && !self.registered
            && !self.register_with_api_server(shutdown).await
        {
            return;
        }
        let timer = self.deps.metrics.update_duration.start_timer();
        let result = self.update_node_status().await;
        timer.observe_duration();
        let label = match &result {
            Ok(SyncOutcome::Written) => "written",
            Ok(SyncOutcome::Unchanged) => "unchanged",
            Err(e) => {
                tracing::error!(error = %e, node = %self.cfg.node_name, "unable to update node status");
                "error"
            }
        };
        self.deps.metrics.updates.with_label_values(&[label]).inc();
    }

    /// The Node to create: initial labels and spec plus a full status, and
    /// the events the status setters raised while computing it.
    async fn registration_node(&mut self) -> (Node, Vec<NodeEvent>) {
        let mut node = initial_node(&self.cfg.registration);
        let obs = self.observe().await;
        let outcome = apply(&mut node, &self.cfg.setters, &obs);
        for e in &outcome.errors {
            tracing::warn!(error = %e, "node status setter failed");
        }
        (node, outcome.events)
    }

    /// kubelet's `tryRegisterWithAPIServer`.
    async fn try_register(&mut self, node: &Node) -> bool {
        let api = self.api();
        let limit = self.cfg.heartbeat_timeout;
        let created = tokio::time::timeout(limit, api.create(&PostParams::default(), node)).await;
        match created {
            Ok(Ok(n)) => {
                tracing::info!(node = %self.cfg.node_name, "successfully registered node");
                self.publish(&n);
                return true;
            }
            Ok(Err(e)) if is_already_exists(&e) => {}
            Ok(Err(e)) => {
                tracing::error!(error = %api_err(&e), node = %self.cfg.node_name, "unable to register node with API server");
                return false;
            }
            Err(_) => {
                tracing::error!(timeout = ?limit, node = %self.cfg.node_name, "unable to register node with API server: request timed out");
                return false;
            }
        }
        let name = self.cfg.node_name.clone();
        let mut existing = match bounded(limit, api.get(&name)).await {
            Ok(n) => n,
            Err(e) => {
                tracing::error!(error = %e, node = %name, "unable to register node with API server, error getting existing node");
                return false;
            }
        };
        let original = existing.clone();
        tracing::info!(node = %name, "node was previously registered");
        if reconcile_existing(node, &mut existing)
            && let Err(e) = self.patch_node_status(&original, &existing).await
        {
            tracing::error!(error = %e, node = %name, "unable to reconcile node with API server");
            return false;
        }
        self.publish(&existing);
        true
    }

    /// kubelet's `registerWithAPIServer`: retries until registered (or shutdown).
    pub async fn register_with_api_server(&mut self, shutdown: &CancellationToken) -> bool {
        if self.registered {
            return true;
        }
        if self.first_attempt.is_none() {
            let now = Instant::now();
            self.first_attempt = Some(now);
            self.deps
                .metrics
                .pre_registration
                .set((now - self.started).as_secs_f64());
        }
        let (mut step, cap) = REGISTRATION_BACKOFF;
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return false,
                _ = tokio::time::sleep(step) => {}
            }
            step = (step * 2).min(cap);
            let (node, events) = self.registration_node().await;
            tracing::info!(node = %self.cfg.node_name, "attempting to register node");
            if self.try_register(&node).await {
                // kubelet records the setters' events (NodeHasSufficientMemory, ...)
                // while building the Node it registers.
                self.record(&events);
                self.registered = true;
                let now = Instant::now();
                self.registered_at = Some(now);
                if let Some(first) = self.first_attempt {
                    self.deps
                        .metrics
                        .registration
                        .set((now - first).as_secs_f64());
                }
                self.handle.set_registered();
                return true;
            }
        }
    }

    /// kubelet's `fastNodeStatusUpdate`; true when the fast phase is over.
    async fn fast_status_update(&mut self, timed_out: bool) -> bool {
        if timed_out {
            tracing::error!("node not becoming ready in time after startup");
            return true;
        }
        if self.ready_seen {
            return true;
        }
        if self.cfg.register_node && !self.registered {
            return false;
        }
        update_runtime_up(&self.deps.cri, &self.deps.runtime).await;
        let local_errors = self.deps.runtime.runtime_errors().len()
            + self.deps.runtime.network_errors().len()
            + self.deps.runtime.storage_errors().len();
        if local_errors > 0 {
            return false;
        }
        let api = self.api();
        let name = self.cfg.node_name.clone();
        let Ok(original) = bounded(
            self.cfg.heartbeat_timeout,
            api.get_with(&name, &GetParams::any()),
        )
        .await
        else {
            return false;
        };
        match ready_status(&original).as_deref() {
            None => return false,
            Some("True") => {
                self.ready_seen = true;
                return true;
            }
            Some(_) => {}
        }
        let (node, changed, events) = self.update_node(&original).await;
        if !changed || ready_status(&node).as_deref() != Some("True") {
            return false;
        }
        tracing::info!("fast updating node status as it just became ready");
        match self.patch_node_status(&original, &node).await {
            Ok(updated) => {
                self.record(&events);
                self.publish(&updated);
            }
            Err(e) => {
                tracing::warn!(error = %e, "error updating node status, will retry with a full sync");
                if let Err(e) = self.update_node_status().await {
                    tracing::error!(error = %e, "unable to update node status");
                }
            }
        }
        true
    }

    fn jittered(&self) -> Duration {
        let f = rand::rng().random_range(0.0..STATUS_JITTER);
        self.cfg.update_frequency.mul_f64(1.0 + f)
    }

    /// Runs until `shutdown`.
    pub async fn run(mut self, shutdown: CancellationToken) {
        if !self.cfg.pod_cidr.is_empty() {
            let cidr = self.cfg.pod_cidr.clone();
            self.update_pod_cidr(&cidr).await;
        }
        let start = Instant::now();
        let mut fast_active = true;
        let mut fast_tick = tokio::time::interval(FAST_UPDATE_INTERVAL);
        fast_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut next_status = Instant::now();
        let shutting_down = self.deps.shutting_down.clone();
        loop {
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => return,
                // kubelet syncs the node status as soon as a shutdown
                // starts (nodeshutdown_manager_linux.go `syncNodeStatus`).
                _ = shutting_down.changed() => {
                    self.sync_node_status(&shutdown).await;
                }
                _ = tokio::time::sleep_until(next_status) => {
                    let round = Instant::now();
                    self.sync_node_status(&shutdown).await;
                    // Not sliding: the period counts from the round's start.
                    next_status = round + self.jittered();
                }
                _ = fast_tick.tick(), if fast_active => {
                    if self.fast_status_update(start.elapsed() >= NODE_READY_GRACE_PERIOD).await {
                        fast_active = false;
                    }
                }
            }
        }
    }
}
