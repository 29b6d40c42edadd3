//! The volume manager: every volume kubelet prepares itself — emptyDir
//! (disk, tmpfs, hugetlbfs), configMap, secret (tmpfs), downwardAPI,
//! projected (configMap, secret, downwardAPI and service account token
//! sources) and hostPath — and the PersistentVolumes behind
//! `persistentVolumeClaim` and generic `ephemeral` volumes whose source
//! keelson mounts (hostPath, local, and csi through the node's CSI drivers,
//! attached, staged and published as kubelet does; [`claims`] resolves
//! them), set
//! up before a pod's containers start, kept current while it runs, and
//! cleaned up after.
//!
//! How the pod workers use it (see `/work/notes/NODE.md` for the contract):
//! [`VolumeManager::register_pod`] on every pod add/update,
//! [`VolumeManager::setup_pod`] in every sync before creating containers,
//! [`VolumeManager::container_mounts`] for each container's CRI mounts,
//! [`VolumeManager::teardown_pod`] once the containers are gone and
//! [`VolumeManager::remove_pod_dir`] when the pod is deleted;
//! [`VolumeManager::cleanup_orphans`] in every housekeeping round (2 s).
//!
//! Behind it: a watch per referenced ConfigMap/Secret ([`objects`]),
//! TokenRequest-based tokens ([`tokens`]), kubelet's atomic writer
//! ([`atomic_writer`]), and a reconciler task that rewrites
//! configMap/secret/downwardAPI/projected content every sync period and as
//! soon as a watched object changes.

pub mod atomic_writer;
pub mod claims;
pub mod csi;
mod csi_attach;
mod csi_data;
mod csi_device;
pub mod emptydir;
pub mod env;
pub mod expand;
#[cfg(test)]
mod fakes;
pub mod hostpath;
mod local;
pub mod metrics;
pub mod mounter;
mod mounts;
pub mod nested;
pub mod objects;
pub mod ownership;
pub mod paths;
pub mod payload;
mod plugins;
mod projected;
mod reconciler;
pub mod references;
pub mod removal;
pub mod stats_sources;
pub mod subpath;
mod teardown;
pub mod tokens;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as ApiQuantity;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use keelson_common::events::{EventRecorder, EventType, pod_ref};

pub use env::EnvError;
pub use mounts::MountOptions;
pub use objects::ObjectError;
pub use paths::Layout;

use claims::{ApiClaimReader, ClaimReader};
use keelson_common::clock::{Clock, WallClock};
use mounter::{LinuxMounter, Mounter};
use objects::{Changed, ObjectCache};
use plugins::Plugin;
use tokens::{ApiTokenRequester, TokenManager, TokenRequester};

/// The node's allocatable resources (`status.allocatable`), asked when a
/// downward API value or a memory-backed volume's size needs them.
pub type AllocatableFn = Arc<dyn Fn() -> BTreeMap<String, ApiQuantity> + Send + Sync>;

/// Settings of the volume manager.
#[derive(Debug, Clone)]
pub struct VolumeManagerConfig {
    /// The node's root directory (`node.rootDir`); pods live in `<root>/pods`.
    pub root_dir: PathBuf,
    /// How often mounted configMap/secret/downwardAPI/projected volumes are
    /// rewritten from current data (`node.syncFrequency`).
    pub sync_frequency: Duration,
}

/// Why the volumes of a pod are not ready, or a mount list could not be
/// built. Display texts follow kubelet's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VolumeError {
    /// Some volumes the pod's containers use are not set up (yet).
    #[error("unmounted volumes=[{}], unattached volumes=[], failed to process volumes=[{}]: {message}", unmounted.join(" "), unprocessed.join(" "))]
    NotReady {
        /// Volumes whose setup failed.
        unmounted: Vec<String>,
        /// Volumes keelson cannot set up at all (unsupported type).
        unprocessed: Vec<String>,
        /// The per-volume errors, `; `-joined.
        message: String,
        /// When the first failed volume's retry backoff ends (the pod
        /// worker syncs again then, as kubelet's WaitForAttachAndMount
        /// polls the reconciler's retries); `None` when no retry is due.
        retry_in: Option<Duration>,
    },
    /// A container's mounts could not be built (→ CreateContainerConfigError).
    #[error("{0}")]
    Mount(String),
    /// Volumes or pod directories could not be removed.
    #[error("{0}")]
    Teardown(String),
}

/// Per-volume retry backoff after a failed setup (kubelet's operation
/// executor: 500 ms doubling up to 2 m 2 s).
const BACKOFF_INITIAL: Duration = Duration::from_millis(500);
const BACKOFF_MAX: Duration = Duration::from_secs(122);
/// After this long without all volumes, kubelet's "Unable to attach or
/// mount volumes" event (podAttachAndMountTimeout).
const MOUNT_TIMEOUT: Duration = Duration::from_secs(120);

#[derive(Debug, Clone)]
struct Mounted {
    plugin: Plugin,
    path: PathBuf,
    read_only: bool,
    selinux_labeled: bool,
}

#[derive(Debug, Clone)]
struct Failure {
    message: String,
    retry_at: Instant,
    delay: Duration,
}

#[derive(Debug, Default)]
struct PodState {
    mounted: BTreeMap<String, Mounted>,
    failures: BTreeMap<String, Failure>,
    waiting_since: Option<Instant>,
    last_timeout_event: Option<Instant>,
    warned: BTreeSet<String>,
    /// setup_pod ran since the last teardown.
    active: bool,
}

impl PodState {
    /// Records a failed attempt for volume `name`: retried after kubelet's
    /// backoff (0.5 s doubling to 2 m 2 s), `message` kept for the pod.
    fn back_off(&mut self, name: &str, message: String) {
        let delay = self
            .failures
            .get(name)
            .map(|f| (f.delay * 2).min(BACKOFF_MAX))
            .unwrap_or(BACKOFF_INITIAL);
        self.failures.insert(
            name.to_string(),
            Failure {
                message,
                retry_at: Instant::now() + delay,
                delay,
            },
        );
    }
}

struct PodSlot {
    pod: Mutex<Arc<Pod>>,
    registered: Mutex<bool>,
    state: tokio::sync::Mutex<PodState>,
    /// This pod's share of `volume_manager_total_volumes`.
    totals: Mutex<metrics::Totals>,
}

struct Inner {
    layout: Layout,
    mounter: Arc<dyn Mounter>,
    config_maps: ObjectCache<ConfigMap>,
    secrets: ObjectCache<Secret>,
    tokens: TokenManager,
    claims: Arc<dyn ClaimReader>,
    recorder: Option<EventRecorder>,
    allocatable: AllocatableFn,
    sync_frequency: Duration,
    pods: Mutex<HashMap<String, Arc<PodSlot>>>,
    metrics: metrics::VolumeMetrics,
    /// Registered CSI drivers and CSIDrivers (none: csi volumes fail).
    csi: Option<crate::csi::Csi>,
    /// `node.status.volumesInUse` (shared with the node status manager).
    in_use: crate::status::VolumesInUse,
    /// CSI devices: per-device locks, staged by this process.
    devices: csi_device::Devices,
}

/// The volume manager; cheap to clone.
#[derive(Clone)]
pub struct VolumeManager {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for VolumeManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VolumeManager")
            .field("root", &self.inner.layout.root())
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn uid_of(pod: &Pod) -> &str {
    pod.metadata.uid.as_deref().unwrap_or_default()
}

fn ns_of(pod: &Pod) -> &str {
    pod.metadata.namespace.as_deref().unwrap_or("default")
}

/// Builds a [`VolumeManager`] with its parts replaced (tests).
pub struct VolumeManagerBuilder {
    config: VolumeManagerConfig,
    client: kube::Client,
    recorder: Option<EventRecorder>,
    allocatable: AllocatableFn,
    mounter: Arc<dyn Mounter>,
    requester: Arc<dyn TokenRequester>,
    claims: Arc<dyn ClaimReader>,
    clock: Arc<dyn Clock>,
    registry: Option<prometheus::Registry>,
    idle_limit: Option<Duration>,
    csi: Option<crate::csi::Csi>,
    in_use: crate::status::VolumesInUse,
}

impl VolumeManagerBuilder {
    /// How long an object watch may go unread before it pauses (default
    /// five sync periods, at least a minute).
    pub fn watch_idle_limit(mut self, limit: Duration) -> Self {
        self.idle_limit = Some(limit);
        self
    }

    /// Registers the volume metrics in `registry`.
    pub fn registry(mut self, registry: prometheus::Registry) -> Self {
        self.registry = Some(registry);
        self
    }

    /// Sets up CSI volumes through `csi`'s registered drivers.
    pub fn csi(mut self, csi: crate::csi::Csi) -> Self {
        self.csi = Some(csi);
        self
    }

    /// Reports volumes in use through `in_use` (the node status
    /// manager's; a private one by default).
    pub fn volumes_in_use(mut self, in_use: crate::status::VolumesInUse) -> Self {
        self.in_use = in_use;
        self
    }

    /// Records events through `recorder` (none by default).
    pub fn recorder(mut self, recorder: EventRecorder) -> Self {
        self.recorder = Some(recorder);
        self
    }

    /// The node's allocatable resources.
    pub fn allocatable(mut self, allocatable: AllocatableFn) -> Self {
        self.allocatable = allocatable;
        self
    }

    /// Another mounter.
    pub fn mounter(mut self, mounter: Arc<dyn Mounter>) -> Self {
        self.mounter = mounter;
        self
    }

    /// Another token issuer.
    pub fn token_requester(mut self, requester: Arc<dyn TokenRequester>) -> Self {
        self.requester = requester;
        self
    }

    /// Another reader of PersistentVolumeClaims and PersistentVolumes.
    pub fn claim_reader(mut self, claims: Arc<dyn ClaimReader>) -> Self {
        self.claims = claims;
        self
    }

    /// Another clock for token ages.
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Starts the manager and its reconciler; both stop with `shutdown`.
    pub fn start(self, shutdown: CancellationToken) -> VolumeManager {
        let (tx, rx) = mpsc::unbounded_channel::<Changed>();
        let sync = self.config.sync_frequency.max(Duration::from_secs(1));
        let mut config_maps =
            ObjectCache::new(self.client.clone(), tx.clone(), sync, shutdown.clone());
        let mut secrets = ObjectCache::new(self.client.clone(), tx, sync, shutdown.clone());
        if let Some(limit) = self.idle_limit {
            config_maps.set_idle_limit(limit);
            secrets.set_idle_limit(limit);
        }
        let inner = Inner {
            layout: Layout::new(self.config.root_dir.clone()),
            mounter: self.mounter,
            config_maps,
            secrets,
            tokens: TokenManager::new(self.requester, self.clock),
            claims: self.claims,
            recorder: self.recorder,
            allocatable: self.allocatable,
            sync_frequency: sync,
            pods: Mutex::new(HashMap::new()),
            metrics: metrics::VolumeMetrics::new(self.registry.as_ref()),
            csi: self.csi,
            in_use: self.in_use,
            devices: csi_device::Devices::default(),
        };
        let vm = VolumeManager {
            inner: Arc::new(inner),
        };
        {
            let vm = vm.clone();
            tokio::spawn(async move { vm.reconstruct_csi().await });
        }
        tokio::spawn(reconciler::run(vm.clone(), rx, shutdown));
        vm
    }
}

impl VolumeManager {
    /// Starts a manager for the node role: real mounts, tokens from the API
    /// server, the system clock.
    pub fn start(
        config: VolumeManagerConfig,
        client: kube::Client,
        recorder: EventRecorder,
        allocatable: AllocatableFn,
        shutdown: CancellationToken,
    ) -> VolumeManager {
        VolumeManager::builder(config, client)
            .recorder(recorder)
            .allocatable(allocatable)
            .start(shutdown)
    }

    /// The node role's manager, from what every node part shares:
    /// `node.rootDir`, `node.syncFrequency`, the node's API client, the
    /// event recorder and the status manager's allocatable resources.
    pub fn for_node(services: &crate::NodeServices) -> VolumeManager {
        let n = &services.ctx.config;
        let status = services.status.clone();
        let allocatable: AllocatableFn = Arc::new(move || {
            status
                .allocatable()
                .into_iter()
                .map(|(k, q)| (k, ApiQuantity(q.to_string())))
                .collect()
        });
        VolumeManager::builder(
            VolumeManagerConfig {
                root_dir: n.root_dir.clone(),
                sync_frequency: n.sync_frequency.into(),
            },
            services.ctx.client.clone(),
        )
        .recorder(services.recorder.clone())
        .allocatable(allocatable)
        .registry(services.ctx.registry.clone())
        .csi(services.csi.clone())
        .volumes_in_use(services.status.volumes_in_use().clone())
        .start(services.ctx.shutdown.clone())
    }

    /// A builder with the production parts, to replace some.
    pub fn builder(config: VolumeManagerConfig, client: kube::Client) -> VolumeManagerBuilder {
        VolumeManagerBuilder {
            requester: Arc::new(ApiTokenRequester::new(client.clone())),
            claims: Arc::new(ApiClaimReader::new(client.clone())),
            config,
            client,
            recorder: None,
            allocatable: Arc::new(BTreeMap::new),
            mounter: Arc::new(LinuxMounter),
            clock: Arc::new(WallClock),
            registry: None,
            idle_limit: None,
            csi: None,
            in_use: crate::status::VolumesInUse::default(),
        }
    }

    /// `<root>/pods/<uid>`.
    pub fn pod_dir(&self, uid: &str) -> PathBuf {
        self.inner.layout.pod_dir(uid)
    }

    /// The on-disk layout.
    pub fn layout(&self) -> &Layout {
        &self.inner.layout
    }

    /// Records the pod (latest spec and metadata) and its ConfigMap/Secret
    /// references; starts watches for new references and drops old ones.
    /// Call on every pod add and update.
    pub fn register_pod(&self, pod: &Pod) {
        let uid = uid_of(pod);
        if uid.is_empty() {
            tracing::warn!(pod = ?pod.metadata.name, "pod without UID; volumes ignored");
            return;
        }
        let ns = ns_of(pod);
        self.inner
            .config_maps
            .register_pod(uid, ns, references::config_maps(pod));
        self.inner
            .secrets
            .register_pod(uid, ns, references::secrets(pod));
        let slot = self.slot(pod);
        *lock(&slot.pod) = Arc::new(pod.clone());
        *lock(&slot.registered) = true;
    }

    /// Drops the pod's references (pod removed from the node's pods).
    /// Mounted volumes stay until [`VolumeManager::teardown_pod`].
    pub fn unregister_pod(&self, uid: &str) {
        self.inner.config_maps.unregister_pod(uid);
        self.inner.secrets.unregister_pod(uid);
        let mut pods = lock(&self.inner.pods);
        if let Some(slot) = pods.get(uid) {
            *lock(&slot.registered) = false;
            // Nothing set up: nothing to remember.
            let idle = slot
                .state
                .try_lock()
                .map(|st| !st.active && st.mounted.is_empty())
                .unwrap_or(false);
            if idle {
                pods.remove(uid);
            }
        }
    }

    fn slot(&self, pod: &Pod) -> Arc<PodSlot> {
        let uid = uid_of(pod).to_string();
        lock(&self.inner.pods)
            .entry(uid)
            .or_insert_with(|| {
                Arc::new(PodSlot {
                    pod: Mutex::new(Arc::new(pod.clone())),
                    registered: Mutex::new(false),
                    state: tokio::sync::Mutex::new(PodState::default()),
                    totals: Mutex::new(metrics::Totals::new()),
                })
            })
            .clone()
    }

    fn existing_slot(&self, uid: &str) -> Option<Arc<PodSlot>> {
        lock(&self.inner.pods).get(uid).cloned()
    }

    /// Sets up every volume the pod's containers use and rewrites changed
    /// content of the mounted ones. `Ok` means every container can be
    /// created. Idempotent; call in every pod sync.
    pub async fn setup_pod(&self, pod: &Pod) -> Result<(), VolumeError> {
        if uid_of(pod).is_empty() {
            return Err(VolumeError::Mount("pod has no UID".to_string()));
        }
        self.register_pod(pod);
        let slot = self.slot(pod);
        self.sync_slot(&slot, false, false).await
    }

    /// The ConfigMap `namespace/name` from the watch cache (a registered
    /// pod must reference it).
    pub async fn config_map(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Arc<ConfigMap>, ObjectError> {
        self.inner.config_maps.get(namespace, name).await
    }

    /// The Secret `namespace/name` from the watch cache (a registered pod
    /// must reference it; `imagePullSecrets` are included).
    pub async fn secret(&self, namespace: &str, name: &str) -> Result<Arc<Secret>, ObjectError> {
        self.inner.secrets.get(namespace, name).await
    }

    /// Pauses object watches not read for the idle limit (the manager does
    /// this every minute on its own).
    pub fn recycle_idle_watches(&self) {
        self.inner.config_maps.recycle_idle();
        self.inner.secrets.recycle_idle();
    }

    /// Watches currently open (ConfigMaps, Secrets).
    pub fn open_watches(&self) -> (usize, usize) {
        (
            self.inner.config_maps.running_watches(),
            self.inner.secrets.running_watches(),
        )
    }

    fn event(&self, pod: &Pod, kind: EventType, reason: &str, message: String) {
        if let Some(r) = &self.inner.recorder {
            r.event(&pod_ref(pod, None), kind, reason, message);
        }
    }

    /// One pass over a pod's volumes. `force` ignores retry backoff (a
    /// referenced object just changed); `background` passes skip pods whose
    /// volumes are not set up (never, or torn down).
    async fn sync_slot(
        &self,
        slot: &PodSlot,
        force: bool,
        background: bool,
    ) -> Result<(), VolumeError> {
        let mut st = slot.state.lock().await;
        if background && !st.active {
            return Ok(());
        }
        let pod = lock(&slot.pod).clone();
        st.active = true;
        let used = plugins::used_volumes(&pod);
        let mut unmounted = Vec::new();
        let mut unprocessed = Vec::new();
        let mut messages = Vec::new();
        // Claims that did not resolve (kubelet's populator errors).
        let mut unresolved = Vec::new();
        let now = Instant::now();
        for vol in pod.spec.iter().flat_map(|s| s.volumes.iter().flatten()) {
            let name = vol.name.clone();
            if !used.contains(&name) {
                continue;
            }
            let mut bound = None;
            if claims::claim_of(&pod, vol).is_some() {
                // A mounted claim keeps its volume; background passes do
                // not read the API (kubelet resolves in pod syncs only).
                if st.mounted.contains_key(&name) || background {
                    continue;
                }
                match claims::resolve(self.inner.claims.as_ref(), &pod, vol).await {
                    Ok(b) => bound = b,
                    Err(e) => {
                        tracing::info!(pod = %pod_name(&pod), volume = %name, error = %e, "volume claim not usable yet");
                        unmounted.push(name.clone());
                        unprocessed.push(name);
                        unresolved.push(e.to_string());
                        continue;
                    }
                }
            }
            // kubelet names a PV-backed volume by its PV in mount events.
            let spec_name = bound.as_ref().map_or(name.clone(), |b| b.pv_name.clone());
            let plugin = match bound
                .as_ref()
                .map_or_else(|| Plugin::of(vol), Plugin::of_pv)
            {
                Ok(p) => p,
                Err(e) => {
                    let msg = format!("MountVolume.SetUp failed for volume {spec_name:?} : {e}");
                    if st.warned.insert(format!("unsupported/{name}")) {
                        self.event(&pod, EventType::Warning, "FailedMount", msg.clone());
                    }
                    unprocessed.push(name);
                    messages.push(msg);
                    continue;
                }
            };
            let was_mounted = st.mounted.contains_key(&name);
            if was_mounted && !plugin.requires_remount() {
                continue;
            }
            if !force
                && let Some(f) = st.failures.get(&name)
                && now < f.retry_at
            {
                if !was_mounted {
                    unmounted.push(name);
                    messages.push(f.message.clone());
                }
                continue;
            }
            // A CSI PersistentVolume is attached first (kubelet's
            // VerifyControllerAttachedVolume and WaitForAttach): retried
            // with the same backoff, without an event (kubelet logs these).
            let mut publish_context = None;
            if plugin == Plugin::Csi
                && let Some(claims::PvSource::Csi(src)) = bound.as_ref().map(|b| &b.source)
            {
                match self.wait_for_csi_attach(uid_of(&pod), src).await {
                    Ok(ctx) => publish_context = Some(ctx),
                    Err(e) => {
                        tracing::info!(pod = %pod_name(&pod), volume = %name, reason = %e, "waiting for the volume to be attached");
                        let msg =
                            format!("MountVolume.WaitForAttach for volume {spec_name:?} : {e}");
                        st.back_off(&name, msg.clone());
                        unmounted.push(name);
                        messages.push(msg);
                        continue;
                    }
                }
            }
            let started = Instant::now();
            let mut prefix = "MountVolume.SetUp failed";
            let result = match (plugin, bound.as_ref()) {
                (Plugin::LocalVolume, Some(b)) => {
                    let b2 = b.clone();
                    match plugins::blocking(move || local::check_path(&b2)).await {
                        Ok(_) => Ok(()),
                        Err(e) => {
                            prefix = "MountVolume.NewMounter initialization failed";
                            Err(e)
                        }
                    }
                }
                _ => Ok(()),
            };
            let result = match result {
                Ok(()) => {
                    self.setup_volume(
                        &pod,
                        vol,
                        plugin,
                        bound.as_ref().map(|b| plugins::Claimed {
                            bound: b,
                            publish_context: publish_context.unwrap_or_default(),
                        }),
                        was_mounted,
                        &mut st.warned,
                    )
                    .await
                }
                Err(e) => Err(e),
            };
            self.inner.metrics.operation(
                plugin.full_name(),
                "volume_mount",
                result.is_ok(),
                started.elapsed(),
            );
            match result {
                Ok(m) => {
                    let labeled = st.mounted.get(&name).is_some_and(|m| m.selinux_labeled);
                    st.mounted.insert(
                        name.clone(),
                        Mounted {
                            selinux_labeled: labeled,
                            ..m
                        },
                    );
                    st.failures.remove(&name);
                }
                Err(e) => {
                    let msg = format!("{prefix} for volume {spec_name:?} : {e}");
                    tracing::warn!(pod = %pod_name(&pod), volume = %name, error = %e, "volume setup failed");
                    self.event(&pod, EventType::Warning, "FailedMount", msg.clone());
                    st.back_off(&name, msg.clone());
                    if !was_mounted {
                        unmounted.push(name);
                        messages.push(msg);
                    }
                }
            }
        }
        self.record_totals(slot, &pod, &st);
        if unmounted.is_empty() && unprocessed.is_empty() {
            st.waiting_since = None;
            return Ok(());
        }
        let since = *st.waiting_since.get_or_insert(now);
        let after = Instant::now();
        let retry_in = unmounted
            .iter()
            .filter_map(|n| st.failures.get(n))
            .map(|f| f.retry_at.saturating_duration_since(after))
            .min();
        // Unresolved claims fail the wait at once with the populator's
        // errors only (volume_manager.go, verifyVolumesMountedFunc), and
        // every pod sync reports it (kubelet.go, SyncPod).
        let resolution_failed = !unresolved.is_empty();
        let message = if resolution_failed {
            unresolved.join("; ")
        } else {
            messages.join("; ")
        };
        let err = VolumeError::NotReady {
            unmounted,
            unprocessed,
            message,
            retry_in,
        };
        if resolution_failed {
            self.event(
                &pod,
                EventType::Warning,
                "FailedMount",
                format!("Unable to attach or mount volumes: {err}"),
            );
            return Err(err);
        }
        if now.duration_since(since) >= MOUNT_TIMEOUT
            && st
                .last_timeout_event
                .is_none_or(|t| now.duration_since(t) >= MOUNT_TIMEOUT)
        {
            st.last_timeout_event = Some(now);
            if let VolumeError::NotReady {
                unmounted,
                unprocessed,
                ..
            } = &err
            {
                self.event(
                    &pod,
                    EventType::Warning,
                    "FailedMount",
                    format!(
                        "Unable to attach or mount volumes: unmounted volumes=[{}], unattached volumes=[], failed to process volumes=[{}]: timed out waiting for the condition",
                        unmounted.join(" "),
                        unprocessed.join(" ")
                    ),
                );
            }
        }
        Err(err)
    }
}

impl VolumeManager {
    /// Updates this pod's share of `volume_manager_total_volumes` and
    /// publishes the sum over all pods.
    fn record_totals(&self, slot: &PodSlot, pod: &Pod, st: &PodState) {
        let mut mine = metrics::Totals::new();
        if st.active {
            let used = plugins::used_volumes(pod);
            for vol in pod.spec.iter().flat_map(|s| s.volumes.iter().flatten()) {
                if !used.contains(&vol.name) {
                    continue;
                }
                // A claim's plugin is known once its PV was resolved.
                let plugin = match claims::claim_of(pod, vol) {
                    Some(_) => st.mounted.get(&vol.name).map(|m| m.plugin).ok_or(()),
                    None => Plugin::of(vol).map_err(|_| ()),
                };
                if let Ok(p) = plugin {
                    *mine.entry((p.full_name(), metrics::DESIRED)).or_insert(0) += 1;
                }
            }
        }
        for m in st.mounted.values() {
            *mine
                .entry((m.plugin.full_name(), metrics::ACTUAL))
                .or_insert(0) += 1;
        }
        *lock(&slot.totals) = mine;
        self.publish_totals();
    }

    fn publish_totals(&self) {
        let mut sum = metrics::Totals::new();
        for slot in lock(&self.inner.pods).values() {
            for (k, n) in lock(&slot.totals).iter() {
                *sum.entry(*k).or_insert(0) += n;
            }
        }
        self.inner.metrics.set_totals(&sum);
    }
}

fn pod_name(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.metadata.name.as_deref().unwrap_or_default()
    )
}
