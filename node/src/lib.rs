//! The node role: kubelet's replacement. Registers and heartbeats the Node,
//! runs the Pods bound to it on the CRI runtime, reports their status.
//!
//! [`run`] composes the parts; each is started from [`NodeServices`], the
//! things every part shares (API client with the node's identity, CRI
//! client, event recorder, runtime health, node status handle, shutdown):
//! - runtime health monitor (`status::runtime`): CRI Status every 5 s;
//! - node status manager (`status`): registration + status every
//!   `nodeStatusUpdateFrequency`;
//! - lease controller (`lease`): `kube-node-lease/<node>` every
//!   `nodeLeaseDurationSeconds / 4`;
//! - pods, volumes, eviction and garbage collection (their own modules).

pub mod certificates;
pub mod cgroups;
pub mod config;
pub mod credentials;
pub mod csi;
pub mod devices;
pub(crate) mod downward;
pub mod eviction;
pub mod gc;
pub(crate) mod introspect;
pub(crate) mod lease;
pub mod logs;
pub(crate) mod node_ip;
pub mod plugins;
pub mod pod;
pub mod podresources;
pub mod pods;
pub mod preflight;
pub mod server;
pub mod shutdown;
pub(crate) mod stats;
pub mod status;
pub mod volumes;

/// The node API's parsers of untrusted bytes, for the fuzz targets
/// (`fuzz/`, built with `--cfg fuzzing`): the real functions, re-exported
/// from their private modules; nothing here is fuzz-only code.
#[cfg(fuzzing)]
pub mod fuzzing {
    pub use crate::server::basic::url_pairs;
    pub use crate::server::remotecommand::stream_options;
    pub use crate::server::routes::params as route_params;
    pub use crate::server::spdy::frame::{Decoder, Encoder, Frame, FrameError};
    pub use crate::server::ws_translator::{Status, decode_error_stream};
    pub use crate::server::wsstream::{
        is_websocket_request, requested_protocols, with_stream_close_protocol,
        with_tunneling_protocol,
    };
}

use std::sync::Arc;

use keelson_cri::{ClientConfig, CriError, RuntimeClient};
use tokio::task::JoinSet;

use config::NodeConfig;
use keelson_common::events::{EventRecorder, EventType, node_ref};
use keelson_common::introspection::Introspection;
use keelson_common::observability::Health;
use status::{Host, NodeStatusHandle, PressureSource, RealHost, RuntimeState};

/// Why the node role stopped.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// The credential provider plugins cannot be registered.
    #[error("failed to register CRI auth plugins: {0}")]
    CredentialProviders(credentials::RegisterError),
    /// The CRI endpoint is malformed.
    #[error("node.containerRuntimeEndpoint: {0}")]
    Runtime(CriError),
    /// The node API could not start (kubelet exits in this case too).
    #[error(transparent)]
    Server(#[from] server::ServerError),
    /// keelson's cgroup driver is not the container runtime's.
    #[error(transparent)]
    CgroupDriver(#[from] cgroups::driver::DriverError),
    /// The host fails a check the configuration asks for (swap, cgroup v1).
    #[error(transparent)]
    Preflight(#[from] preflight::PreflightError),
    /// The device plugin Registration service could not start.
    #[error(transparent)]
    Devices(#[from] devices::RegistrationError),
    /// A gRPC socket under the root dir (plugin registry, pod resources)
    /// could not be served.
    #[error("serving {path}: {error}")]
    Socket {
        /// The directory or socket.
        path: String,
        /// The I/O error (in the text, not a source: said once).
        error: std::io::Error,
    },
    /// The root dir could not be created.
    #[error("creating node.rootDir {path}: {error}")]
    RootDir {
        /// The directory.
        path: String,
        /// The I/O error (in the text, not a source: said once).
        error: std::io::Error,
    },
}

/// What the node role gets from the process: the `node:` section of the
/// configuration, its own API client (the node's identity), the shared
/// metrics and health registries, and the shutdown signal.
#[derive(Clone)]
pub struct NodeContext {
    /// The effective `node:` section.
    pub config: Arc<NodeConfig>,
    /// This node's name.
    pub node_name: String,
    /// The API client with the node's identity.
    pub client: kube::Client,
    /// Metrics registry shared with the proxy role.
    pub registry: prometheus::Registry,
    /// Health registry shared with the proxy role.
    pub health: Health,
    /// What `keelson diagnose` may read: the node registers its provider.
    pub introspection: Introspection,
    /// Cancelled when the process shuts down; the role stops and returns.
    pub shutdown: tokio_util::sync::CancellationToken,
}

impl std::fmt::Debug for NodeContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeContext")
            .field("node_name", &self.node_name)
            .finish_non_exhaustive()
    }
}

/// What every part of the node role shares.
#[derive(Clone)]
pub struct NodeServices {
    /// Configuration, node name, API client (node identity), registry,
    /// health, shutdown.
    pub ctx: NodeContext,
    /// The CRI client (lazy: the runtime may come up later).
    pub cri: RuntimeClient,
    /// Events as kubelet writes them (`source.component: kubelet`).
    pub recorder: EventRecorder,
    /// Runtime health; add health checks (e.g. the PLEG's) here.
    pub runtime: RuntimeState,
    /// The node status manager's read side (allocatable, the Node).
    pub status: NodeStatusHandle,
    /// The eviction manager's read side: pressure conditions and the
    /// admission check for new pods (`eviction.admit(&pod)`).
    pub eviction: eviction::EvictionHandle,
    /// The node's statistics (the node API's and the eviction manager's).
    pub stats: Arc<stats::StatsCache>,
    /// The device manager (device plugins' extended resources).
    pub devices: devices::DeviceManager,
    /// Whether the node is shutting down (graceful node shutdown).
    pub shutting_down: status::ShuttingDown,
    /// Registered CSI drivers, CSIDrivers, the CSINode.
    pub csi: csi::Csi,
}

impl std::fmt::Debug for NodeServices {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeServices")
            .field("node", &self.ctx.node_name)
            .finish_non_exhaustive()
    }
}

/// Replaceable parts, for tests (production uses the defaults).
#[derive(Clone, Default)]
pub struct NodeOverrides {
    /// Machine facts (default: the real machine).
    pub host: Option<Arc<dyn Host>>,
    /// Pressure reported in node conditions (default: the eviction manager's).
    pub pressure: Option<Arc<dyn PressureSource>>,
    /// How long without a successful CRI Status before the runtime counts
    /// as down (default kubelet's 30 s).
    pub runtime_down_after: Option<std::time::Duration>,
    /// How often CRI Status is asked (default kubelet's 5 s).
    pub runtime_status_period: Option<std::time::Duration>,
    /// The cgroup filesystem pods use (default: the host's); tests give a
    /// fake tree so nothing is created on the host.
    pub pods_cgroups: Option<Arc<dyn cgroups::CgroupFs>>,
    /// The D-Bus address where the `systemd` cgroup driver finds systemd
    /// (default: the system bus); tests give a private bus with a double
    /// of systemd.
    pub systemd_bus: Option<String>,
    /// The D-Bus address where graceful node shutdown finds logind and
    /// systemd (default: the system bus); tests give a private bus with a
    /// double of logind.
    pub logind_bus: Option<String>,
    /// Where graceful node shutdown writes logind's drop-in (default
    /// `/etc/systemd/logind.conf.d`).
    pub logind_conf_dir: Option<std::path::PathBuf>,
}

impl std::fmt::Debug for NodeOverrides {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeOverrides").finish_non_exhaustive()
    }
}

/// Runs the node role until `ctx.shutdown` is cancelled.
pub async fn run(ctx: NodeContext) -> Result<(), NodeError> {
    run_with(ctx, NodeOverrides::default()).await
}

/// [`run`] with replaced parts.
pub async fn run_with(ctx: NodeContext, overrides: NodeOverrides) -> Result<(), NodeError> {
    let cfg = ctx.config.clone();
    let n = &*cfg;
    preflight::check(n.fail_swap_on, n.fail_cgroup_v1)?;
    // kubelet exits when the credential provider plugins cannot be
    // registered (`kuberuntime_manager.go`); the same checks, first.
    if n.image_credential_provider_config.is_some() || n.image_credential_provider_bin_dir.is_some()
    {
        credentials::CredentialProviders::check(
            n.image_credential_provider_config
                .as_deref()
                .unwrap_or(std::path::Path::new("")),
            n.image_credential_provider_bin_dir
                .as_deref()
                .unwrap_or(std::path::Path::new("")),
        )
        .map_err(NodeError::CredentialProviders)?;
    }
    std::fs::create_dir_all(&n.root_dir).map_err(|error| NodeError::RootDir {
        path: n.root_dir.display().to_string(),
        error,
    })?;
    let cri = RuntimeClient::new_lazy(
        &n.container_runtime_endpoint,
        ClientConfig::with_request_timeout(n.runtime_request_timeout.get()),
    )
    .map_err(NodeError::Runtime)?;
    // The runtime's cgroup driver must be keelson's (kubelet follows CRI
    // RuntimeConfig; a mismatch is an error here, not at the first sandbox).
    let driver =
        cgroups::driver::decide(n.cgroup_driver, cgroups::driver::runtime_driver(&cri).await)?;
    let (ctx, cfg) = if driver == n.cgroup_driver {
        (ctx, cfg)
    } else {
        let mut followed = (*cfg).clone();
        followed.cgroup_driver = driver;
        let followed = Arc::new(followed);
        (
            NodeContext {
                config: followed.clone(),
                ..ctx
            },
            followed,
        )
    };
    let n = &*cfg;
    // A separate imageServiceEndpoint is refused by configuration
    // validation: one CRI connection serves both services.
    let recorder =
        EventRecorder::start(ctx.client.clone(), "kubelet", &ctx.node_name, &ctx.registry)
            .with_timeline(ctx.introspection.timeline().clone());
    recorder.event(
        &node_ref(&ctx.node_name),
        EventType::Normal,
        "Starting",
        "Starting kubelet.",
    );
    let runtime = RuntimeState::new(
        overrides
            .runtime_down_after
            .unwrap_or(status::runtime::MAX_WAIT_FOR_CONTAINER_RUNTIME),
    );
    // kubelet registers the PLEG check when it is built, before the runtime
    // is up (pkg/kubelet/kubelet.go `addHealthCheck("PLEG", ...)`): the node
    // is not Ready until the PLEG has relisted once. The pod lifecycle
    // replaces this with its PLEG's own check when it starts.
    runtime.add_health_check("PLEG", || Err(pods::pleg::PlegUnhealthy::NotYetRelisted));
    let host: Arc<dyn Host> = overrides
        .host
        .clone()
        .unwrap_or_else(|| Arc::new(RealHost::default()));
    let eviction_handle = eviction::EvictionHandle::default();
    let pressure: Arc<dyn PressureSource> = overrides
        .pressure
        .clone()
        .unwrap_or_else(|| Arc::new(eviction_handle.clone()));

    let mut tasks: JoinSet<&'static str> = JoinSet::new();
    let shutdown = ctx.shutdown.clone();

    // Device plugins (kubelet's device manager), CSI (the CSINode, the
    // CSIDriver watch) and the plugin manager on `plugins_registry` with
    // the device plugin and CSI handlers; DRA drivers are told no handler
    // serves their type.
    let device_manager = devices::DeviceManager::new(devices::dir(&n.root_dir));
    let csi = csi::Csi::start(
        ctx.client.clone(),
        &ctx.node_name,
        runtime.clone(),
        shutdown.clone(),
    );
    {
        let handler = devices::start(&device_manager, &cri, shutdown.clone()).await?;
        let mut handlers = plugins::Handlers::new();
        handlers.insert(
            keelson_cri::kubelet_api::pluginregistration::DEVICE_PLUGIN.to_string(),
            handler,
        );
        handlers.insert(
            keelson_cri::kubelet_api::pluginregistration::CSI_PLUGIN.to_string(),
            std::sync::Arc::new(csi::handler::CsiPluginHandler::new(csi.clone())),
        );
        plugins::start(&n.root_dir, handlers, shutdown.clone()).map_err(|error| {
            NodeError::Socket {
                path: n
                    .root_dir
                    .join(plugins::REGISTRY_DIR_NAME)
                    .display()
                    .to_string(),
                error,
            }
        })?;
    }

    // Runtime health (kubelet's updateRuntimeUp every 5 s).
    {
        let (cri, runtime, stop) = (cri.clone(), runtime.clone(), shutdown.clone());
        let period = overrides
            .runtime_status_period
            .unwrap_or(status::runtime::RUNTIME_STATUS_PERIOD);
        tasks.spawn(async move {
            status::runtime::run_monitor(cri, runtime, period, stop).await;
            "runtime-health"
        });
    }

    // Node registration and status.
    let shutting_down = status::ShuttingDown::default();
    let status_cfg = status::StatusConfig::from_node_config(&ctx.node_name, n);
    let heartbeat_timeout = status_cfg.heartbeat_timeout;
    let (status_manager, status_handle) = status::NodeStatusManager::new(
        status_cfg,
        status::StatusDeps {
            client: ctx.client.clone(),
            cri: cri.clone(),
            host,
            runtime: runtime.clone(),
            pressure,
            devices: Some(device_manager.clone()),
            recorder: Some(recorder.clone()),
            metrics: status::StatusMetrics::new(&ctx.registry, &ctx.node_name),
            shutting_down: shutting_down.clone(),
        },
    );
    {
        let stop = shutdown.clone();
        tasks.spawn(async move {
            status_manager.run(stop).await;
            "node-status"
        });
    }

    // Node lease.
    {
        let controller = lease::LeaseController::new(
            ctx.client.clone(),
            lease::LeaseConfig::new(
                &ctx.node_name,
                n.node_lease_duration_seconds,
                heartbeat_timeout,
            ),
            lease::LeaseMetrics::new(&ctx.registry),
        );
        let stop = shutdown.clone();
        tasks.spawn(async move {
            controller.run(stop).await;
            "node-lease"
        });
    }

    let introspector =
        introspect::NodeIntrospector::new(runtime.clone(), ctx.introspection.api_log().clone());
    ctx.introspection.set_node(introspector.clone());
    // The node API (kubelet's :10250), its statistics and log rotation.
    let pods_slot: server::PodsSlot = Default::default();
    // One sampler of the node's statistics: the node API's handlers read
    // its housekeeping snapshot, the eviction manager asks it for a fresh
    // round (kubelet's `updateStats=true`).
    // The pods' volume figures, measured in the background every
    // `volumeStatsAggPeriod` once the volume manager runs (kubelet's
    // fsResourceAnalyzer), read by the summary and its metrics.
    let volume_stats = stats::VolumeStatsCalculator::new(
        n.volume_stats_agg_period.get(),
        Some(csi.clone()),
        Some(&ctx.registry),
    );
    let stats = stats::StatsCache::new(stats::StatsProvider::with_volumes(
        stats::StatsConfig::for_node(&ctx.node_name, n),
        cri.clone(),
        Some(volume_stats.clone()),
    ));
    keelson_common::observability::metrics::register(
        &ctx.registry,
        stats::volume_metrics::VolumeStatsCollector::new(stats.clone()),
    );
    {
        let stats = stats.clone();
        let node_ips: Vec<std::net::IpAddr> =
            crate::node_ip::resolve(n.node_ip).into_iter().collect();
        server::start(
            server::ServerDeps {
                ctx: ctx.clone(),
                cri: cri.clone(),
                pods: pods_slot.clone(),
                stats: stats.clone(),
                node_ips,
                status: status_handle.clone(),
            },
            &mut tasks,
        )
        .await?;
        let stop = shutdown.clone();
        let housekeeping = n.housekeeping_interval.get();
        tasks.spawn(async move {
            stats.run(housekeeping, stop).await;
            "stats-housekeeping"
        });
        let rotation = logs::rotation::LogRotation::new(
            cri.clone(),
            logs::rotation::RotationPolicy {
                max_size: crate::config::kubelet_api::container_log_max_size_bytes(
                    &n.container_log_max_size,
                ),
                max_files: usize::try_from(n.container_log_max_files).unwrap_or(5),
                max_workers: usize::try_from(n.container_log_max_workers).unwrap_or(1),
                interval: n.container_log_monitor_interval.get(),
            },
        );
        let stop = shutdown.clone();
        tasks.spawn(async move {
            rotation.run(stop).await;
            "container-log-rotation"
        });
    }

    let services = NodeServices {
        ctx: ctx.clone(),
        cri,
        recorder,
        runtime,
        status: status_handle,
        eviction: eviction_handle,
        stats,
        devices: device_manager.clone(),
        shutting_down,
        csi,
    };
    // The pod-resources API (kubelet's `ListenAndServePodResources`).
    podresources::start(
        &n.root_dir,
        pods_slot.clone(),
        device_manager,
        shutdown.clone(),
    )
    .map_err(|error| NodeError::Socket {
        path: n
            .root_dir
            .join(podresources::DIR_NAME)
            .display()
            .to_string(),
        error,
    })?;
    // Pods (and their volumes): started as a task so a runtime that is not
    // up yet does not hold the rest of the node role.
    {
        let services = services.clone();
        let cgroups = overrides.pods_cgroups.clone();
        let systemd_bus = overrides.systemd_bus.clone();
        let shutdown_cfg = shutdown::ShutdownConfig {
            node_name: ctx.node_name.clone(),
            periods: shutdown::groups::Periods::from_config(
                n.shutdown_grace_period.get(),
                n.shutdown_grace_period_critical_pods.get(),
                &n.shutdown_grace_period_by_pod_priority,
            ),
            root_dir: n.root_dir.clone(),
            bus: overrides.logind_bus.clone(),
            conf_dir: overrides
                .logind_conf_dir
                .clone()
                .unwrap_or_else(|| shutdown::logind::CONF_DIR.into()),
        };
        let slot = pods_slot.clone();
        tasks.spawn(async move {
            let volumes = volumes::VolumeManager::for_node(&services);
            tokio::spawn(
                volume_stats.run(Arc::new(volumes.clone()), services.ctx.shutdown.clone()),
            );
            match pods::start_for_node(&services, volumes, cgroups, systemd_bus).await {
                Ok(pods) => {
                    introspector.set_pods(pods.clone());
                    let _ = slot.set(pods.clone());
                    // Graceful node shutdown (kubelet starts it once the
                    // runtime-dependent parts run).
                    if let Some(m) = shutdown::ShutdownManager::new(
                        shutdown_cfg,
                        Arc::new(pods.clone()),
                        services.shutting_down.clone(),
                        Some(services.recorder.clone()),
                        &services.ctx.registry,
                    ) {
                        tokio::spawn(m.run(services.ctx.shutdown.clone()));
                    }
                    // kubelet's /healthz `syncloop` check.
                    let check = pods.clone();
                    let every = services.ctx.config.sync_frequency.get();
                    services.ctx.health.register_fn(
                        "syncloop",
                        keelson_common::observability::ProbeKind::Liveness,
                        move || check.sync_loop_check(every),
                    );
                    run_pod_consumers(&services, pods).await
                }
                Err(e) => {
                    // kubelet would exit here; keelson keeps the Node
                    // (and its Lease) alive but NotReady, saying why.
                    tracing::error!(error = %e, "the pod lifecycle could not start");
                    let message = e.to_string();
                    services
                        .runtime
                        .add_health_check("pod lifecycle", move || Err(message.clone()));
                }
            }
            "pods"
        });
    }

    tracing::info!(node = %ctx.node_name, "node role started");
    shutdown.cancelled().await;
    drain(&mut tasks).await;
    tracing::info!(node = %ctx.node_name, "node role stopped");
    Ok(())
}

/// Waits for every task to end (they watch the shutdown token).
async fn drain(tasks: &mut JoinSet<&'static str>) {
    while let Some(done) = tasks.join_next().await {
        match done {
            Ok(name) => tracing::debug!(task = name, "node task stopped"),
            Err(e) => tracing::error!(error = %e, "node task ended abnormally"),
        }
    }
}

/// Runs what needs the pod lifecycle until shutdown: the eviction manager
/// (kubelet starts it once the runtime is up) and garbage collection of
/// dead containers, sandboxes, pod logs and unused images (which also
/// serves the eviction manager's disk reclaim).
pub async fn run_pod_consumers(services: &NodeServices, pods: pods::PodsHandle) {
    let ctx = &services.ctx;
    let n = &ctx.config;
    let pod_state = Arc::new(pods::LifecyclePodState::new(
        pods.clone(),
        ctx.client.clone(),
        &ctx.node_name,
    ));
    let pods = Arc::new(pods);
    let collectors = gc::Collectors {
        containers: gc::ContainerGc::new(
            services.cri.clone(),
            pod_state,
            gc::ContainerGcPolicy::default(),
            n.pod_logs_dir.clone(),
            n.pod_logs_dir.parent().map(|p| p.join("containers")),
        ),
        images: gc::ImageGc::new(
            services.cri.clone(),
            gc::ImageGcPolicy {
                high_threshold_percent: n.image_gc_high_threshold_percent,
                low_threshold_percent: n.image_gc_low_threshold_percent,
                min_age: n.image_minimum_gc_age.get(),
                max_age: n.image_maximum_gc_age.get(),
            },
            Some(services.recorder.clone()),
            &ctx.node_name,
            gc::ImageGcMetrics::new(&ctx.registry),
        ),
    };
    let mut tasks: JoinSet<&'static str> = JoinSet::new();
    eviction::start(
        services,
        pods.clone(),
        Some(Arc::new(collectors.clone())),
        None,
        &mut tasks,
    );
    {
        let (recorder, name, stop) = (
            Some(services.recorder.clone()),
            ctx.node_name.clone(),
            ctx.shutdown.clone(),
        );
        let enabled = n.image_gc_high_threshold_percent < 100;
        tasks.spawn(async move {
            gc::run(collectors, enabled, recorder, name, stop).await;
            "garbage-collection"
        });
    }
    ctx.shutdown.cancelled().await;
    drain(&mut tasks).await;
}

#[cfg(test)]
mod tests {
    use super::NodeError;

    /// The error and every source, as `anyhow`'s `{:#}` prints them.
    fn printed(e: &(dyn std::error::Error + 'static)) -> String {
        let mut out = e.to_string();
        let mut cur = e.source();
        while let Some(s) = cur {
            out.push_str(&format!(": {s}"));
            cur = s.source();
        }
        out
    }

    #[test]
    fn io_causes_are_said_once() {
        let e = NodeError::RootDir {
            path: "/var/lib/kubelet".into(),
            error: std::io::Error::from(std::io::ErrorKind::PermissionDenied),
        };
        assert_eq!(
            printed(&e),
            "creating node.rootDir /var/lib/kubelet: permission denied"
        );
        let e = NodeError::Socket {
            path: "/var/lib/kubelet/plugins_registry".into(),
            error: std::io::Error::other("address in use"),
        };
        assert_eq!(
            printed(&e),
            "serving /var/lib/kubelet/plugins_registry: address in use"
        );
    }
}
