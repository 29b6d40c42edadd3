//! The pod lifecycle of the node role: kubelet's pod sources, pod manager,
//! pod workers, runtime manager (`kuberuntime`), PLEG, status manager and
//! housekeeping, running Pods on a CRI runtime exactly as kubelet would.
//!
//! [`start`] builds everything from [`PodsDeps`] and returns a
//! [`PodsHandle`] for the rest of the node role (PLEG health for the Ready
//! condition, active pods and pod kills for eviction).

pub(crate) mod active_deadline;
pub mod admission;
pub mod allocation;
pub(crate) mod backoff;
pub(crate) mod cache;
pub mod clock;
pub mod deps;
pub(crate) mod dispatch;
pub mod events;
mod eviction_adapter;
mod gc_pod_state;
mod gc_state;
pub(crate) mod housekeeping;
mod introspect;
pub(crate) mod lifecycle;
pub mod metrics;
pub(crate) mod node_wiring;
pub mod pleg;
pub(crate) mod probes;
mod queries;
pub(crate) mod restart_all;
pub mod runtime;
mod shutdown_adapter;
pub mod source;
pub mod status;
pub(crate) mod store;
mod volumes_adapter;
pub(crate) mod workers;

pub use node_wiring::start_for_node;

pub use gc_pod_state::LifecyclePodState;
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use keelson_cri::RuntimeClient;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::cgroups::{self, CgroupFs, PodCgroups, QosCgroups, ResourceConfig};
use crate::config::NodeConfig;
use crate::pod::podutil;
use crate::pod::qos::{self, QosClass};
use cache::RuntimeCache;
use clock::SharedClock;
use deps::{EnvSources, PodVolumes};
use dispatch::{Rejected, rejected_contains};
use events::PodEvents;
use keelson_common::events::EventRecorder;
use keelson_common::quantity::Quantity;
use lifecycle::{FinalStatus, LifecycleParts, NetworkCheck, PodLifecycle, UpdateKind};
use metrics::PodMetrics;
use pleg::{Pleg, PlegHealth};
use runtime::dns::DnsSettings;
use runtime::hooks::HookRunner;
use runtime::images::ImageManager;
use runtime::linux_resources::CpuQuota;
use runtime::security::SeccompSettings;
use runtime::{AllocatableFn, RuntimeManager, RuntimeParts, RuntimeSettings, ServiceEnv};
use source::SourceEvent;
use source::mirror::MirrorClient;
use source::services::ServiceLister;
use status::{StatusManager, StatusTargets};
use store::PodStore;
use workers::{KillRequest, PodWorkers};

/// Why the pod lifecycle could not start.
#[derive(Debug, thiserror::Error)]
pub enum PodsError {
    /// The cgroup filesystem could not be used.
    #[error("pod cgroups: {0}")]
    Cgroups(cgroups::CgroupError),
    /// The resolver configuration could not be read.
    #[error("node.resolvConf: {0}")]
    ResolvConf(runtime::dns::DnsError),
    /// The probe manager could not start.
    #[error("probes: {0}")]
    Probes(keelson_probes::ProbeManagerError),
    /// Shut down while waiting for the runtime.
    #[error("stopped before the container runtime answered")]
    Stopped,
    /// The credential provider plugins could not be registered (kubelet
    /// exits then).
    #[error("failed to register CRI auth plugins: {0}")]
    CredentialProviders(crate::credentials::RegisterError),
}

/// kubelet's `/healthz` `syncloop` failure: the pod dispatcher has not gone
/// round in time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("sync Loop took longer than expected")]
pub struct SyncLoopStalled;

/// What the pod lifecycle is built from.
pub struct PodsDeps {
    /// The node's API client.
    pub client: kube::Client,
    /// The CRI client.
    pub cri: RuntimeClient,
    /// This node's name.
    pub node_name: String,
    /// The node's settings.
    pub config: NodeConfig,
    /// Metrics registry.
    pub registry: prometheus::Registry,
    /// Event recorder (`None`: no events).
    pub recorder: Option<EventRecorder>,
    /// Volumes.
    pub volumes: Arc<dyn PodVolumes>,
    /// ConfigMap/Secret lookups for env and pull secrets.
    pub env: Arc<dyn EnvSources>,
    /// Node allocatable (downward API defaults).
    pub allocatable: AllocatableFn,
    /// Cgroup filesystem (`None`: the host's); the `systemd` driver
    /// manages it through systemd.
    pub cgroups: Option<Arc<dyn CgroupFs>>,
    /// The D-Bus address of systemd for the `systemd` cgroup driver
    /// (`None`: the system bus).
    pub systemd_bus: Option<String>,
    /// Clock (`None`: the wall clock).
    pub clock: Option<SharedClock>,
    /// The node's IPs (first is primary).
    pub node_ips: Vec<IpAddr>,
    /// Network readiness (from the runtime state); `None`: assume ready.
    pub network: Option<NetworkCheck>,
    /// Service variables (`None`: watch Services with `client`).
    pub services: Option<Arc<dyn ServiceEnv>>,
    /// Run probes (off only in tests of the lifecycle alone).
    pub probes: bool,
    /// Probe manager settings.
    pub probe_config: keelson_probes::ProbeManagerConfig,
    /// The device manager (`None`: no device plugins).
    pub devices: Option<crate::devices::DeviceManager>,
    /// The eviction manager's admit handler (the first of kubelet's;
    /// the others are the pod lifecycle's own, see [`admission`]).
    pub admit: Option<AdmitFn>,
    /// The graceful node shutdown manager's admit handler (kubelet's last).
    pub shutdown_admit: Option<AdmitFn>,
    /// Where admission reads this node's Node (`None`: a watch of it
    /// through `client`).
    pub node: Option<Arc<dyn admission::node::NodeSource>>,
}

pub use admission::{AdmitFn, AdmitRejection};

impl std::fmt::Debug for PodsDeps {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PodsDeps")
            .field("node_name", &self.node_name)
            .finish_non_exhaustive()
    }
}

/// A pod the node runs, for eviction and garbage collection.
#[derive(Debug, Clone)]
pub struct ActivePod {
    /// The pod.
    pub pod: Arc<Pod>,
    /// Its QoS class.
    pub qos: QosClass,
    /// Names of its running containers.
    pub running_containers: Vec<String>,
}

/// The running pod lifecycle; cheap to clone.
#[derive(Clone)]
pub struct PodsHandle {
    workers: PodWorkers,
    pleg: PlegHealth,
    api_synced: Arc<AtomicBool>,
    static_synced: Arc<AtomicBool>,
    /// When the dispatcher loop last went round.
    sync_loop: Arc<std::sync::Mutex<std::time::Instant>>,
}

/// kubelet's `actuatedPodsStateFile` (in the root directory).
pub const ACTUATED_STATE_FILE: &str = "actuated_pods_state";
/// kubelet's `allocatedPodsStateFile` (in the root directory).
pub const ALLOCATED_STATE_FILE: &str = "allocated_pods_state";

/// kubelet's `syncloop` health check: the loop must go round within twice
/// the resync interval, at least 5 minutes.
const SYNC_LOOP_MIN_HEALTHY: Duration = Duration::from_secs(300);

impl std::fmt::Debug for PodsHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PodsHandle").finish_non_exhaustive()
    }
}

impl PodsHandle {
    /// kubelet's `/healthz` `syncloop` check: `Err` when the pod dispatcher
    /// has not gone round for twice `syncFrequency` (at least 5 minutes).
    pub fn sync_loop_check(&self, sync_frequency: Duration) -> Result<(), SyncLoopStalled> {
        let limit = (sync_frequency * 2).max(SYNC_LOOP_MIN_HEALTHY);
        let last = *self
            .sync_loop
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if last.elapsed() > limit {
            return Err(SyncLoopStalled);
        }
        Ok(())
    }

    /// PLEG health (`Err` text: `pleg was last seen active ...`).
    pub fn pleg_health(&self) -> PlegHealth {
        self.pleg.clone()
    }

    /// Pods still meant to run (not terminating), with QoS and running containers.
    pub fn active_pods(&self) -> Vec<ActivePod> {
        let lc = self.workers.lifecycle();
        self.workers
            .syncing_pods()
            .into_iter()
            .filter(|p| !podutil::is_terminal_phase(podutil::phase(p)))
            .map(|pod| {
                let running = lc
                    .cache
                    .get(podutil::uid(&pod))
                    .map(|s| s.running().map(|c| c.name.clone()).collect())
                    .unwrap_or_default();
                ActivePod {
                    qos: qos::pod_qos(&pod),
                    pod,
                    running_containers: running,
                }
            })
            .collect()
    }

    /// Kills a pod for the node's own reasons (eviction): its containers
    /// stop within `grace` (or its own), then it ends with `status`.
    pub fn kill_pod(&self, uid: &str, grace: Option<i64>, status: FinalStatus) -> bool {
        let Some(pod) = self.workers.lifecycle().store.get(uid) else {
            return false;
        };
        self.workers.update_pod(
            pod,
            UpdateKind::Kill,
            Some(KillRequest {
                grace,
                final_status: Some(status),
                removed: false,
            }),
        );
        true
    }

    /// Whether the pod's containers are all stopped (its worker reached
    /// terminated or finished, or it has none).
    pub fn is_terminated(&self, uid: &str) -> bool {
        !self.workers.could_have_running_containers(uid) || self.workers.phase(uid).is_none()
    }

    /// kubelet's `IsCriticalPod`.
    pub fn is_critical(pod: &Pod) -> bool {
        podutil::is_critical(pod)
    }

    /// Every pod source listed once (kubelet's `podsSynced`).
    pub fn all_sources_ready(&self) -> bool {
        self.api_synced.load(Ordering::SeqCst) && self.static_synced.load(Ordering::SeqCst)
    }

    /// Whether a pod worker still tracks the pod (running, terminating, or
    /// terminated and not yet removed from the pod sources).
    pub fn has_worker(&self, uid: &str) -> bool {
        self.workers.phase(uid).is_some()
    }

    /// `ShouldPodContentBeRemoved`: volumes, logs and dead containers of
    /// the pod may go (evicted, or deleted and terminated; a pod no worker
    /// knows once every source listed).
    pub fn should_pod_content_be_removed(&self, uid: &str) -> bool {
        match self.workers.pod_state(uid) {
            Some((terminated, deleted, evicted)) => evicted || (deleted && terminated),
            None => self.all_sources_ready(),
        }
    }

    /// `ShouldPodRuntimeBeRemoved`: the pod's containers and sandboxes may
    /// be removed (terminated; unknown once every source listed).
    pub fn should_pod_runtime_be_removed(&self, uid: &str) -> bool {
        match self.workers.pod_state(uid) {
            Some((terminated, _, _)) => terminated,
            None => self.all_sources_ready(),
        }
    }

    /// The status the node last generated for a pod.
    pub fn pod_status(&self, uid: &str) -> Option<k8s_openapi::api::core::v1::PodStatus> {
        self.workers.lifecycle().status.get(uid)
    }
}

struct Targets {
    store: PodStore,
    workers: std::sync::OnceLock<PodWorkers>,
    /// Pods admission rejected: they never ran.
    rejected: Rejected,
}

impl StatusTargets for Targets {
    fn api_pod(&self, uid: &str) -> Option<Pod> {
        self.store.api_object(uid).map(|p| (*p).clone())
    }
    fn could_have_running_containers(&self, uid: &str) -> bool {
        if rejected_contains(&self.rejected, uid) {
            return false;
        }
        self.workers
            .get()
            .is_none_or(|w| w.could_have_running_containers(uid))
    }
}

fn parse_reserved(map: &BTreeMap<String, String>, key: &str) -> Quantity {
    map.get(key)
        .and_then(|v| Quantity::parse(v).ok())
        .unwrap_or_default()
}

/// The `kubepods` limits: capacity minus kube and system reservations.
fn kubepods_allocatable(cfg: &NodeConfig) -> (ResourceConfig, i64) {
    let mem_capacity = procfs::Current::current()
        .map(|m: procfs::Meminfo| m.mem_total as i64)
        .unwrap_or(0);
    let cpus = std::thread::available_parallelism()
        .map(|n| n.get() as i64)
        .unwrap_or(1);
    let reserved_cpu = parse_reserved(&cfg.kube_reserved, "cpu")
        .saturating_add(parse_reserved(&cfg.system_reserved, "cpu"))
        .milli_value() as i64;
    let reserved_mem = parse_reserved(&cfg.kube_reserved, "memory")
        .saturating_add(parse_reserved(&cfg.system_reserved, "memory"))
        .value() as i64;
    let cpu_milli = (cpus * 1000 - reserved_cpu).max(0);
    let mem = (mem_capacity - reserved_mem).max(0);
    let pids = if cfg.pod_pids_limit > 0 {
        None
    } else {
        Some(-1)
    };
    (
        ResourceConfig {
            cpu_shares: Some(cgroups::shares::milli_cpu_to_shares(cpu_milli)),
            memory: (mem > 0).then_some(mem),
            pids_limit: pids,
            ..Default::default()
        },
        mem_capacity,
    )
}

async fn runtime_name(cri: &RuntimeClient, stop: &CancellationToken) -> Result<String, PodsError> {
    let mut logged = false;
    loop {
        match cri.version().await {
            Ok(v) => {
                tracing::info!(runtime = %v.runtime_name, version = %v.runtime_version, api = %v.runtime_api_version, "container runtime initialized");
                return Ok(if v.runtime_name.is_empty() {
                    "containerd".into()
                } else {
                    v.runtime_name
                });
            }
            Err(e) => {
                if !logged {
                    tracing::warn!(error = %e, "waiting for the container runtime");
                    logged = true;
                }
                tokio::select! {
                    _ = stop.cancelled() => return Err(PodsError::Stopped),
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                }
            }
        }
    }
}

/// kubelet's `RegisterCredentialProviderPlugins` when either credential
/// provider setting is given (`kuberuntime_manager.go`); token mode reads
/// ServiceAccounts and requests tokens with the node's client.
fn credential_providers(
    deps: &PodsDeps,
    clock: SharedClock,
    stop: &CancellationToken,
) -> Result<crate::credentials::CredentialProviders, PodsError> {
    use crate::credentials::CredentialProviders;
    use crate::credentials::provider::{ApiServiceAccounts, TokenSources};
    use crate::volumes::tokens::{ApiTokenRequester, GC_PERIOD, TokenManager};
    let cfg = &deps.config;
    if cfg.image_credential_provider_config.is_none()
        && cfg.image_credential_provider_bin_dir.is_none()
    {
        return Ok(CredentialProviders::none());
    }
    let tokens = TokenManager::new(Arc::new(ApiTokenRequester::new(deps.client.clone())), clock);
    let providers = CredentialProviders::register(
        cfg.image_credential_provider_config
            .as_deref()
            .unwrap_or(std::path::Path::new("")),
        cfg.image_credential_provider_bin_dir
            .as_deref()
            .unwrap_or(std::path::Path::new("")),
        &deps.registry,
        Some(TokenSources {
            accounts: Arc::new(ApiServiceAccounts(deps.client.clone())),
            tokens: tokens.clone(),
        }),
    )
    .map_err(PodsError::CredentialProviders)?;
    // Expired plugin tokens are dropped as the token manager drops them.
    let stop = stop.clone();
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(GC_PERIOD) => tokens.cleanup(),
            }
        }
    });
    Ok(providers)
}

/// Starts the pod lifecycle; everything stops with `stop`.
pub async fn start(deps: PodsDeps, stop: CancellationToken) -> Result<PodsHandle, PodsError> {
    let cfg = &deps.config;
    let clock: SharedClock = deps
        .clock
        .clone()
        .unwrap_or_else(|| Arc::new(clock::WallClock));
    let process_start = clock.now();
    let metrics = PodMetrics::register(&deps.registry);
    let events = deps
        .recorder
        .clone()
        .map(PodEvents::new)
        .unwrap_or_else(PodEvents::none);
    let runtime_name = runtime_name(&deps.cri, &stop).await?;

    // Cgroups: QoS tiers and pod cgroups.
    let fs = match deps.cgroups.clone() {
        Some(fs) => fs,
        None => cgroups::open_host().map_err(PodsError::Cgroups)?,
    };
    let fs = cgroups::for_driver(cfg.cgroup_driver, fs, deps.systemd_bus.as_deref())
        .map_err(PodsError::Cgroups)?;
    let linux_host =
        runtime::linux_host::LinuxHost::detect(fs.version() == "v2", cfg.single_process_oom_kill);
    tracing::debug!(?linux_host, "container resources follow the host");
    let (allocatable_cg, memory_capacity) = kubepods_allocatable(cfg);
    let qos_cgroups = cfg
        .cgroups_per_qos
        .then(|| QosCgroups::new(fs.clone(), &cfg.cgroup_root));
    if let Some(q) = &qos_cgroups {
        let q = q.clone();
        tokio::task::spawn_blocking(move || q.setup(&allocatable_cg, &[]))
            .await
            .map_err(|e| cgroups::CgroupError::Layout(e.to_string()))
            .and_then(|r| r)
            .map_err(PodsError::Cgroups)?;
    }
    let period_us = u64::try_from(cfg.cpu_cfs_quota_period.get().as_micros()).unwrap_or(100_000);
    let pod_cgroups = Arc::new(PodCgroups::new(
        qos_cgroups,
        &cfg.cgroup_root,
        cfg.cpu_cfs_quota,
        period_us,
        cfg.pod_pids_limit,
    ));

    let dns = DnsSettings::load(
        cfg.cluster_dns.clone(),
        &cfg.cluster_domain,
        &cfg.resolv_conf,
        deps.node_ips.clone(),
    )
    .map_err(PodsError::ResolvConf)?;
    let services: Arc<dyn ServiceEnv> = match deps.services.clone() {
        Some(s) => s,
        None => Arc::new(ServiceLister::start(deps.client.clone(), stop.clone())),
    };
    let image_backoff = Arc::new(backoff::Backoff::new(
        backoff::INITIAL,
        backoff::MAX,
        clock.clone(),
    ));
    let crash_backoff = Arc::new(backoff::Backoff::new(
        backoff::INITIAL,
        backoff::MAX,
        clock.clone(),
    ));
    let pull_records = Arc::new(runtime::pull_records::PullManager::new(
        &cfg.root_dir,
        // Validated with the configuration.
        runtime::pull_records::VerificationPolicy::parse(
            &cfg.image_pull_credentials_verification_policy,
            &cfg.preloaded_images_verification_allowlist,
        )
        .unwrap_or(runtime::pull_records::VerificationPolicy::NeverVerifyPreloadedImages),
        Some(metrics.image_mustpull_checks_total.clone()),
    ));
    if !pull_records.leftover_intents().is_empty() {
        // Pulls an earlier run left unfinished: an image now on the node
        // is recorded as pulled by it (without credentials).
        match deps.cri.list_images(None).await {
            Ok(list) => {
                let images: Vec<(String, Vec<String>)> = list
                    .into_iter()
                    .map(|i| {
                        let names = i.repo_tags.into_iter().chain(i.repo_digests).collect();
                        (i.id, names)
                    })
                    .collect();
                pull_records.initialize(&images);
            }
            Err(e) => tracing::warn!(error = %e, "failed to list images"),
        }
    }
    let providers = credential_providers(&deps, clock.clone(), &stop)?;
    let images = ImageManager::new(
        deps.cri.clone(),
        image_backoff,
        events.clone(),
        metrics.clone(),
        cfg.serialize_image_pulls,
        cfg.max_parallel_image_pulls,
        pull_records,
    )
    .with_credential_providers(providers);
    let legacy_log_dir = cfg.pod_logs_dir.parent().map(|p| p.join("containers"));
    let runtime = Arc::new(RuntimeManager::new(RuntimeParts {
        cri: deps.cri.clone(),
        settings: RuntimeSettings {
            runtime_name: runtime_name.clone(),
            pod_logs_root: cfg.pod_logs_dir.clone(),
            legacy_log_dir,
            quota: CpuQuota {
                enforce: cfg.cpu_cfs_quota,
                period_us: i64::try_from(period_us).unwrap_or(100_000),
            },
            memory_capacity,
            linux_host,
            seccomp: SeccompSettings {
                profile_root: cfg.root_dir.join("seccomp").display().to_string(),
                default_runtime: false,
            },
            dns,
            node_ips: deps.node_ips.iter().map(IpAddr::to_string).collect(),
        },
        images,
        crash_backoff,
        events: events.clone(),
        metrics: metrics.clone(),
        cgroups: pod_cgroups.clone(),
        volumes: deps.volumes.clone(),
        env: deps.env.clone(),
        services,
        allocatable: deps.allocatable.clone(),
        devices: deps.devices.clone(),
        hooks: HookRunner::new(deps.cri.clone(), keelson_common::version::KUBERNETES_MINOR),
        clock: clock.clone(),
        runtime_classes: Arc::new(runtime::runtime_class::ApiRuntimeClasses::start(
            deps.client.clone(),
            stop.clone(),
        )),
        actuated: Arc::new(allocation::checkpoint::Checkpoint::open(Some(
            cfg.root_dir.join(ACTUATED_STATE_FILE),
        ))),
    }));

    let store = PodStore::new();
    let cache = RuntimeCache::new();
    let rejected: Rejected = Arc::default();
    let targets = Arc::new(Targets {
        store: store.clone(),
        workers: std::sync::OnceLock::new(),
        rejected: rejected.clone(),
    });
    let status = StatusManager::new(
        deps.client.clone(),
        metrics.clone(),
        clock.clone(),
        targets.clone(),
    );
    let (wake_tx, mut wake_rx) = mpsc::unbounded_channel::<String>();
    let probes = if deps.probes {
        let (p, outputs) = probes::PodProbes::new(
            deps.cri.clone(),
            &deps.registry,
            deps.probe_config.clone(),
            process_start,
        )
        .map_err(PodsError::Probes)?;
        tokio::spawn(probes::forward_outputs(
            outputs,
            wake_tx.clone(),
            store.clone(),
            events.clone(),
        ));
        Some(p)
    } else {
        None
    };
    let allocation = Arc::new(allocation::AllocationManager::new(
        Some(cfg.root_dir.join(ALLOCATED_STATE_FILE)),
        allocation::conditions::ResizeConditions::new(clock.clone()),
    ));
    let (pleg_requests, pleg_requests_rx) = pleg::requests();
    let lifecycle = Arc::new(PodLifecycle::new(LifecycleParts {
        runtime: runtime.clone(),
        status: status.clone(),
        cache: cache.clone(),
        store: store.clone(),
        cgroups: pod_cgroups,
        volumes: deps.volumes.clone(),
        env: deps.env.clone(),
        probes: probes.clone(),
        mirror: Some(MirrorClient::new(deps.client.clone(), &deps.node_name)),
        events: events.clone(),
        metrics: metrics.clone(),
        clock: clock.clone(),
        host_ips: deps.node_ips.iter().map(IpAddr::to_string).collect(),
        network: deps.network.clone(),
        allocation: allocation.clone(),
        pleg: pleg_requests.clone(),
    }));
    let workers = PodWorkers::new(lifecycle.clone(), cfg.sync_frequency.get(), stop.clone());
    let _ = targets.workers.set(workers.clone());

    // Status writer.
    tokio::spawn(status.clone().run(stop.clone()));

    // PLEG.
    let pleg = Arc::new(Pleg::new(
        runtime.clone(),
        cache,
        metrics.clone(),
        wake_tx.clone(),
        pleg_requests_rx,
    ));
    let pleg_health = pleg.health();
    tokio::spawn(pleg.run(stop.clone()));

    // Sources: API pods once the Node was listed.
    let node_source: Arc<dyn admission::node::NodeSource> = match deps.node.clone() {
        Some(n) => n,
        None => admission::node::ApiNodeSource::start(
            deps.client.clone(),
            &deps.node_name,
            stop.clone(),
        ),
    };
    let (src_tx, mut src_rx) = mpsc::unbounded_channel::<SourceEvent>();
    {
        let node_source = node_source.clone();
        let (client, name, store, tx, stop) = (
            deps.client.clone(),
            deps.node_name.clone(),
            store.clone(),
            src_tx.clone(),
            stop.clone(),
        );
        tokio::spawn(async move {
            source::api::run(client, name, store, tx, stop, node_source.synced()).await
        });
    }
    tokio::spawn(source::file::run(
        cfg.static_pod_path
            .clone()
            .filter(|p| !p.as_os_str().is_empty()),
        deps.node_name.clone(),
        cfg.file_check_frequency.get(),
        store.clone(),
        src_tx,
        stop.clone(),
    ));

    // Dispatcher: sources and wake-ups to workers; housekeeping.
    let api_synced = Arc::new(AtomicBool::new(false));
    let static_synced = Arc::new(AtomicBool::new(false));
    let handle_flags = (api_synced.clone(), static_synced.clone());
    let sync_loop = Arc::new(std::sync::Mutex::new(std::time::Instant::now()));
    {
        let workers = workers.clone();
        let store = store.clone();
        let stop = stop.clone();
        let sync_loop = sync_loop.clone();
        let mut dispatcher = dispatch::Dispatcher::new(
            workers.clone(),
            store.clone(),
            admission::Admitter::new(admission::AdmitterParts {
                node_name: deps.node_name.clone(),
                node: node_source,
                allocatable: deps.allocatable.clone(),
                max_pods: cfg.max_pods,
                eviction: deps.admit.clone(),
                sysctls: admission::sysctl::SysctlAllowlist::new(
                    admission::sysctl::kernel_version(),
                    &cfg.allowed_unsafe_sysctls,
                ),
                apparmor: admission::apparmor::AppArmorAdmission::new(
                    admission::apparmor::validate_host(std::path::Path::new("/")),
                ),
                rejections: metrics.admission_rejections_total.clone(),
                devices: deps.devices.clone(),
                shutdown: deps.shutdown_admit.clone(),
            }),
            allocation,
            rejected,
            (api_synced.clone(), static_synced.clone()),
        );
        tokio::spawn(async move {
            let mut hk = housekeeping::Housekeeping::default();
            let mut tick = tokio::time::interval(housekeeping::PERIOD);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                *sync_loop
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) = std::time::Instant::now();
                tokio::select! {
                    _ = stop.cancelled() => return,
                    ev = src_rx.recv() => match ev {
                        Some(ev) => dispatcher.handle(ev).await,
                        None => return,
                    },
                    _ = tokio::time::sleep_until(dispatcher.next_retry()) => {
                        dispatcher.retry_pending("periodic_retry").await;
                    }
                    uid = wake_rx.recv() => match uid {
                        Some(uid) => workers.wake(&uid),
                        None => return,
                    },
                    _ = tick.tick() => {
                        let ready = api_synced.load(Ordering::SeqCst) && static_synced.load(Ordering::SeqCst);
                        hk.run_once(&workers, ready).await;
                    }
                }
            }
        });
    }
    Ok(PodsHandle {
        workers,
        pleg: pleg_health,
        api_synced: handle_flags.0,
        static_synced: handle_flags.1,
        sync_loop,
    })
}
