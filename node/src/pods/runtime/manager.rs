//! The runtime manager (kubelet's `kubeGenericRuntimeManager`): reads a
//! pod's state from CRI and drives sandboxes and containers. The sync, start
//! and kill paths live in `sync`, `start` and `kill`.

use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use keelson_cri::{CriError, RuntimeClient, api};

use super::dns::DnsSettings;
use super::hooks::HookRunner;
use super::images::ImageManager;
use super::linux_resources::CpuQuota;
use super::runtime_class::RuntimeClasses;
use super::security::SeccompSettings;
use super::status::{ContainerStatus, RuntimePodStatus, SandboxStatus};
use crate::cgroups::PodCgroups;
use crate::pod::labels::POD_UID;
use crate::pods::allocation::checkpoint::Checkpoint;
use crate::pods::backoff::Backoff;
use crate::pods::clock::SharedClock;
use crate::pods::deps::{EnvSources, PodVolumes};
use crate::pods::events::PodEvents;
use crate::pods::metrics::PodMetrics;

/// Service environment variables per namespace; `None` until Services have
/// been listed once.
pub trait ServiceEnv: Send + Sync {
    /// The variables for a pod in `namespace`.
    fn service_env(
        &self,
        namespace: &str,
        enable_service_links: bool,
    ) -> Option<BTreeMap<String, String>>;
}

/// No Services known, but "synced" (for tests and static-only nodes).
#[derive(Debug, Clone, Copy, Default)]
pub struct NoServices;

impl ServiceEnv for NoServices {
    fn service_env(&self, _: &str, _: bool) -> Option<BTreeMap<String, String>> {
        Some(BTreeMap::new())
    }
}

/// Node allocatable resources (for downward API defaults).
pub use crate::volumes::AllocatableFn;

/// Settings of the runtime manager.
#[derive(Debug, Clone)]
pub struct RuntimeSettings {
    /// The runtime's name (`containerd`), the scheme of container ids.
    pub runtime_name: String,
    /// `podLogsDir`.
    pub pod_logs_root: PathBuf,
    /// Where legacy log symlinks go (`/var/log/containers`); `None` skips them.
    pub legacy_log_dir: Option<PathBuf>,
    /// CFS quota settings.
    pub quota: CpuQuota,
    /// Node memory capacity in bytes (for OOM score adjustments).
    pub memory_capacity: i64,
    /// The host facts container resources depend on (cgroup version,
    /// swap controller, huge page sizes, `singleProcessOOMKill`).
    pub linux_host: super::linux_host::LinuxHost,
    /// Seccomp settings.
    pub seccomp: SeccompSettings,
    /// DNS settings.
    pub dns: DnsSettings,
    /// The node's IPs (downward API `status.hostIP`).
    pub node_ips: Vec<String>,
}

/// Everything the runtime manager uses.
pub struct RuntimeManager {
    pub(super) cri: RuntimeClient,
    pub(super) settings: RuntimeSettings,
    pub(super) images: ImageManager,
    pub(super) crash_backoff: Arc<Backoff>,
    pub(super) events: PodEvents,
    pub(super) metrics: PodMetrics,
    pub(super) cgroups: Arc<PodCgroups>,
    pub(super) volumes: Arc<dyn PodVolumes>,
    pub(super) env: Arc<dyn EnvSources>,
    pub(super) services: Arc<dyn ServiceEnv>,
    pub(super) allocatable: AllocatableFn,
    pub(super) devices: Option<crate::devices::DeviceManager>,
    pub(super) hooks: HookRunner,
    pub(super) clock: SharedClock,
    pub(super) runtime_classes: Arc<dyn RuntimeClasses>,
    pub(super) actuated: Arc<Checkpoint>,
    /// When this manager was made (the process's start): sandboxes
    /// created before were started by an earlier keelson or a kubelet.
    pub(super) started: SystemTime,
    /// Pods whose first sync over such a sandbox was logged.
    pub(super) adoption_logged: Mutex<HashSet<String>>,
}

impl std::fmt::Debug for RuntimeManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RuntimeManager")
            .field("runtime", &self.settings.runtime_name)
            .finish_non_exhaustive()
    }
}

/// The parts a runtime manager is built from.
pub struct RuntimeParts {
    /// CRI client.
    pub cri: RuntimeClient,
    /// Settings.
    pub settings: RuntimeSettings,
    /// Image manager.
    pub images: ImageManager,
    /// CrashLoopBackOff state.
    pub crash_backoff: Arc<Backoff>,
    /// Event recorder.
    pub events: PodEvents,
    /// Metrics.
    pub metrics: PodMetrics,
    /// Pod cgroups (for the sandbox's cgroup parent).
    pub cgroups: Arc<PodCgroups>,
    /// Volumes.
    pub volumes: Arc<dyn PodVolumes>,
    /// ConfigMap/Secret lookups.
    pub env: Arc<dyn EnvSources>,
    /// Service variables.
    pub services: Arc<dyn ServiceEnv>,
    /// Node allocatable.
    pub allocatable: AllocatableFn,
    /// The device manager (`None`: no device plugins).
    pub devices: Option<crate::devices::DeviceManager>,
    /// Hook runner.
    pub hooks: HookRunner,
    /// Clock.
    pub clock: SharedClock,
    /// RuntimeClass → runtime handler.
    pub runtime_classes: Arc<dyn RuntimeClasses>,
    /// What was actuated per container and pod cgroup (in-place resize).
    pub actuated: Arc<Checkpoint>,
}

impl RuntimeManager {
    /// Builds one.
    pub fn new(p: RuntimeParts) -> Self {
        RuntimeManager {
            cri: p.cri,
            settings: p.settings,
            images: p.images,
            crash_backoff: p.crash_backoff,
            events: p.events,
            metrics: p.metrics,
            cgroups: p.cgroups,
            volumes: p.volumes,
            env: p.env,
            services: p.services,
            allocatable: p.allocatable,
            devices: p.devices,
            hooks: p.hooks,
            clock: p.clock,
            runtime_classes: p.runtime_classes,
            actuated: p.actuated,
            started: SystemTime::now(),
            adoption_logged: Mutex::new(HashSet::new()),
        }
    }

    /// The CRI client.
    pub fn cri(&self) -> &RuntimeClient {
        &self.cri
    }

    /// The runtime name (container id scheme).
    pub fn runtime_name(&self) -> &str {
        &self.settings.runtime_name
    }

    /// The CrashLoopBackOff state.
    pub fn crash_backoff(&self) -> &Arc<Backoff> {
        &self.crash_backoff
    }

    /// The image manager (read side: pull back-off, for diagnose).
    pub fn images(&self) -> &ImageManager {
        &self.images
    }

    /// What was actuated for each pod's containers and cgroup.
    pub fn actuated(&self) -> &Arc<Checkpoint> {
        &self.actuated
    }

    /// kubelet's `GetPodStatus`: the pod's sandboxes and containers, found
    /// by the pod UID label.
    pub async fn get_pod_status(
        &self,
        uid: &str,
        name: &str,
        namespace: &str,
    ) -> Result<RuntimePodStatus, CriError> {
        // Stamped before the first read, as the generic PLEG stamps its
        // cache entries (pkg/kubelet/pleg/generic.go `updateCache`): a read
        // that began before a sync's kills and starts and ended after them
        // must not pass for newer than that sync (the pod worker's
        // `GetNewerThan(lastSyncTime)`), or the next sync acts on a view
        // without the container it just started and starts another.
        let taken = self.clock.now();
        let labels = std::collections::HashMap::from([(POD_UID.to_string(), uid.to_string())]);
        let sandboxes = self
            .metrics
            .runtime_op(
                "list_podsandbox",
                self.cri.list_pod_sandbox(Some(api::PodSandboxFilter {
                    label_selector: labels.clone(),
                    ..Default::default()
                })),
            )
            .await?;
        let mut sb_statuses = Vec::new();
        for sb in &sandboxes {
            match self
                .metrics
                .runtime_op(
                    "podsandbox_status",
                    self.cri.pod_sandbox_status(&sb.id, false),
                )
                .await
            {
                Ok(resp) => {
                    if let Some(s) = resp.status {
                        sb_statuses.push(SandboxStatus::from_cri(&s));
                    }
                }
                Err(e) if e.is_not_found() => continue,
                Err(e) => return Err(e),
            }
        }
        let containers = self
            .metrics
            .runtime_op(
                "list_containers",
                self.cri.list_containers(Some(api::ContainerFilter {
                    label_selector: labels,
                    ..Default::default()
                })),
            )
            .await?;
        let mut raw = Vec::new();
        for c in &containers {
            match self
                .metrics
                .runtime_op("container_status", self.cri.container_status(&c.id, false))
                .await
            {
                Ok(resp) => {
                    if let Some(s) = resp.status {
                        raw.push((s, c.pod_sandbox_id.clone()));
                    }
                }
                Err(e) if e.is_not_found() => continue,
                Err(e) => return Err(e),
            }
        }
        let convert = move || -> Vec<ContainerStatus> {
            raw.iter()
                .map(|(s, sb)| ContainerStatus::from_cri(s, sb))
                .collect()
        };
        // Termination messages and log tails are file reads: off the
        // async threads.
        let statuses = if containers.is_empty() {
            Vec::new()
        } else {
            tokio::task::spawn_blocking(convert)
                .await
                .map_err(|e| CriError::Other {
                    method: "ContainerStatus",
                    code: keelson_cri::Code::Internal,
                    message: format!("converting container statuses: {e}"),
                })?
        };
        // Runtimes that do not report a container's resources (containerd
        // 1.6), or its memory request, are completed from what was
        // actuated (`toKubeContainerStatus`).
        let mut statuses = statuses;
        for c in &mut statuses {
            let need = c.resources.is_none_or(|r| r.memory_request.is_none());
            if !need {
                continue;
            }
            let Some(a) = self
                .actuated
                .get(uid)
                .and_then(|p| p.containers.get(&c.name).cloned())
            else {
                continue;
            };
            let rl = crate::pod::resources::parse_list;
            let (req, lim) = (rl(a.requests.as_ref()), rl(a.limits.as_ref()));
            let milli = |l: &crate::pod::resources::ResourceList, k: &str| {
                l.get(k)
                    .map(|q| i64::try_from(q.milli_value()).unwrap_or(i64::MAX))
            };
            let bytes = |l: &crate::pod::resources::ResourceList, k: &str| {
                l.get(k)
                    .map(|q| i64::try_from(q.value()).unwrap_or(i64::MAX))
            };
            match &mut c.resources {
                None => {
                    c.resources = Some(super::status::ContainerResources {
                        cpu_request: Some(milli(&req, "cpu").unwrap_or(0)),
                        cpu_limit: Some(milli(&lim, "cpu").unwrap_or(0)),
                        memory_request: Some(bytes(&req, "memory").unwrap_or(0)),
                        memory_limit: Some(bytes(&lim, "memory").unwrap_or(0)),
                    })
                }
                Some(r) => {
                    r.memory_request = bytes(&req, "memory").filter(|m| *m != 0);
                }
            }
        }
        let mut status = RuntimePodStatus::new(uid, name, namespace, sb_statuses, statuses);
        status.timestamp = taken;
        Ok(status)
    }
}
