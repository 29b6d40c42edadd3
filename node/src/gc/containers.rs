//! Container garbage collection, as kubelet's `kuberuntime` GC does it
//! (every minute; all at once when the eviction manager reclaims disk):
//! - dead containers (anything not running, created at least `MinAge` ago)
//!   are grouped per pod UID and container name; all of a pod's are removed
//!   once the pod's content may go (it was deleted, or evicted), else the
//!   newest `MaxPerPodContainer` (1) of each group are kept for `kubectl
//!   logs --previous`; a container in unknown state is stopped first;
//! - sandboxes that are not ready and hold no container are removed, except
//!   the newest one of a pod that still exists;
//! - pod log directories of pods whose content may go are removed (once every
//!   pod source has listed), and dangling legacy log symlinks.

use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use super::error::GcError;
use keelson_cri::{RuntimeClient, api};

/// The pod UID label of kubelet's containers and sandboxes.
pub const POD_UID_LABEL: &str = "io.kubernetes.pod.uid";
/// Stop grace of a container in unknown state before its removal.
pub const UNKNOWN_STOP_GRACE: Duration = Duration::from_secs(2);

/// What GC asks the pod lifecycle (kubelet's `podStateProvider`).
pub trait PodState: Send + Sync + 'static {
    /// The pod's containers, volumes and logs may be removed (deleted and
    /// terminated, or evicted; unknown pods once every source listed).
    fn should_pod_content_be_removed(&self, uid: &str) -> bool;
    /// The pod's containers and sandboxes may be removed (terminated;
    /// unknown pods once every source listed).
    fn should_pod_runtime_be_removed(&self, uid: &str) -> bool;
    /// Every pod source has listed once.
    fn all_sources_ready(&self) -> bool;
    /// Brings the answers up to date; called before each collection.
    fn refresh(&self) -> futures::future::BoxFuture<'_, ()> {
        Box::pin(async {})
    }
}

/// kubelet's container GC policy (flags `--minimum-container-ttl-duration`,
/// `--maximum-dead-containers-per-container`, `--maximum-dead-containers`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ContainerGcPolicy {
    /// Dead containers younger than this stay.
    pub min_age: Duration,
    /// Dead containers kept per (pod, container name); negative: no limit.
    pub max_per_pod_container: i32,
    /// Dead containers kept in all; negative: no limit.
    pub max_containers: i32,
}

impl Default for ContainerGcPolicy {
    fn default() -> Self {
        ContainerGcPolicy {
            min_age: Duration::ZERO,
            max_per_pod_container: 1,
            max_containers: -1,
        }
    }
}

#[derive(Debug, Clone)]
struct GcInfo {
    id: String,
    name: String,
    created: i64,
    unknown: bool,
}

type EvictUnits = BTreeMap<(String, String), Vec<GcInfo>>;

/// The container garbage collector.
#[derive(Clone)]
pub struct ContainerGc {
    cri: RuntimeClient,
    pods: Arc<dyn PodState>,
    policy: ContainerGcPolicy,
    pod_logs_dir: PathBuf,
    legacy_log_dir: Option<PathBuf>,
}

impl std::fmt::Debug for ContainerGc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ContainerGc")
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}

fn now_nanos() -> i64 {
    jiff::Timestamp::now()
        .as_nanosecond()
        .try_into()
        .unwrap_or(i64::MAX)
}

impl ContainerGc {
    /// A collector; `legacy_log_dir` is `/var/log/containers` when kept.
    pub fn new(
        cri: RuntimeClient,
        pods: Arc<dyn PodState>,
        policy: ContainerGcPolicy,
        pod_logs_dir: PathBuf,
        legacy_log_dir: Option<PathBuf>,
    ) -> ContainerGc {
        ContainerGc {
            cri,
            pods,
            policy,
            pod_logs_dir,
            legacy_log_dir,
        }
    }

    /// One collection (kubelet's `GarbageCollect`); `evict_non_deleted_pods`
    /// also removes everything of terminated pods (eviction reclaim).
    pub async fn garbage_collect(&self, evict_non_deleted_pods: bool) -> Result<(), GcError> {
        self.pods.refresh().await;
        let ready = self.pods.all_sources_ready();
        let mut errors = Vec::new();
        if let Err(e) = self.evict_containers(ready, evict_non_deleted_pods).await {
            errors.push(e);
        }
        if let Err(e) = self.evict_sandboxes(evict_non_deleted_pods).await {
            errors.push(e);
        }
        if let Err(e) = self.evict_pod_logs_directories(ready).await {
            errors.push(e);
        }
        GcError::aggregate(errors)
    }

    async fn evictable_containers(&self) -> Result<EvictUnits, GcError> {
        let containers = self.cri.list_containers(None).await?;
        let newest = now_nanos()
            .saturating_sub(i64::try_from(self.policy.min_age.as_nanos()).unwrap_or(i64::MAX));
        let mut units = EvictUnits::new();
        for c in containers {
            if c.state == api::ContainerState::ContainerRunning as i32 {
                continue;
            }
            if c.created_at > newest {
                continue;
            }
            let uid = c.labels.get(POD_UID_LABEL).cloned().unwrap_or_default();
            let name = c
                .metadata
                .as_ref()
                .map(|m| m.name.clone())
                .unwrap_or_default();
            units.entry((uid, name.clone())).or_default().push(GcInfo {
                id: c.id,
                name,
                created: c.created_at,
                unknown: c.state == api::ContainerState::ContainerUnknown as i32,
            });
        }
        Ok(units)
    }

    /// Removes the oldest `to_remove` of `containers`; returns what is kept.
    async fn remove_oldest(&self, mut containers: Vec<GcInfo>, to_remove: usize) -> Vec<GcInfo> {
        let keep = containers.len().saturating_sub(to_remove);
        containers.sort_by_key(|c| std::cmp::Reverse(c.created));
        for c in containers[keep..].iter().rev() {
            if c.unknown
                && let Err(e) = self.cri.stop_container(&c.id, UNKNOWN_STOP_GRACE).await
            {
                tracing::error!(container_id = %c.id, error = %e, "failed to stop container in unknown state before removal");
                continue;
            }
            tracing::debug!(container_id = %c.id, container = %c.name, "removing dead container");
            if let Err(e) = self.cri.remove_container(&c.id).await {
                tracing::error!(container_id = %c.id, error = %e, "failed to remove container");
            } else if let Some(dir) = &self.legacy_log_dir {
                remove_legacy_links_of(dir, &c.id);
            }
        }
        containers.truncate(keep);
        containers
    }

    async fn enforce_max_per_unit(&self, units: &mut EvictUnits, max: usize) {
        for unit in units.values_mut() {
            let to_remove = unit.len().saturating_sub(max);
            if to_remove > 0 {
                *unit = self.remove_oldest(std::mem::take(unit), to_remove).await;
            }
        }
    }

    async fn evict_containers(
        &self,
        all_sources_ready: bool,
        evict_non_deleted: bool,
    ) -> Result<(), GcError> {
        let mut units = self.evictable_containers().await?;
        if all_sources_ready {
            let gone: Vec<(String, String)> = units
                .keys()
                .filter(|(uid, _)| {
                    self.pods.should_pod_content_be_removed(uid)
                        || (evict_non_deleted && self.pods.should_pod_runtime_be_removed(uid))
                })
                .cloned()
                .collect();
            for key in gone {
                if let Some(unit) = units.remove(&key) {
                    let n = unit.len();
                    self.remove_oldest(unit, n).await;
                }
            }
        }
        if self.policy.max_per_pod_container >= 0 {
            let max = usize::try_from(self.policy.max_per_pod_container).unwrap_or(0);
            self.enforce_max_per_unit(&mut units, max).await;
        }
        if self.policy.max_containers >= 0 {
            let max = usize::try_from(self.policy.max_containers).unwrap_or(0);
            let total: usize = units.values().map(Vec::len).sum();
            if total > max && !units.is_empty() {
                let per_unit = (max / units.len()).max(1);
                self.enforce_max_per_unit(&mut units, per_unit).await;
                let all: Vec<GcInfo> = units.values().flatten().cloned().collect();
                if all.len() > max {
                    let n = all.len() - max;
                    self.remove_oldest(all, n).await;
                }
            }
        }
        Ok(())
    }

    async fn evict_sandboxes(&self, evict_non_deleted: bool) -> Result<(), GcError> {
        let containers = self.cri.list_containers(None).await?;
        let sandboxes = self.cri.list_pod_sandbox(None).await?;
        let with_containers: HashSet<&str> = containers
            .iter()
            .map(|c| c.pod_sandbox_id.as_str())
            .collect();
        // (id, created, active) per pod UID.
        let mut by_pod: BTreeMap<String, Vec<(String, i64, bool)>> = BTreeMap::new();
        for s in &sandboxes {
            let uid = s
                .metadata
                .as_ref()
                .map(|m| m.uid.clone())
                .unwrap_or_default();
            let active = s.state == api::PodSandboxState::SandboxReady as i32
                || with_containers.contains(s.id.as_str());
            by_pod
                .entry(uid)
                .or_default()
                .push((s.id.clone(), s.created_at, active));
        }
        for (uid, mut list) in by_pod {
            let remove_all = self.pods.should_pod_content_be_removed(&uid)
                || (evict_non_deleted && self.pods.should_pod_runtime_be_removed(&uid));
            let keep = if remove_all { 0 } else { 1.min(list.len()) };
            list.sort_by_key(|s| std::cmp::Reverse(s.1));
            for (id, _, active) in list[keep..].iter().rev() {
                if *active {
                    continue;
                }
                tracing::debug!(sandbox_id = %id, pod_uid = %uid, "removing sandbox");
                if let Err(e) = self.cri.stop_pod_sandbox(id).await {
                    tracing::error!(sandbox_id = %id, error = %e, "failed to stop sandbox before removing");
                    continue;
                }
                if let Err(e) = self.cri.remove_pod_sandbox(id).await {
                    tracing::error!(sandbox_id = %id, error = %e, "failed to remove sandbox");
                }
            }
        }
        Ok(())
    }

    async fn evict_pod_logs_directories(&self, all_sources_ready: bool) -> Result<(), GcError> {
        if all_sources_ready {
            let entries = match std::fs::read_dir(&self.pod_logs_dir) {
                Ok(e) => e,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
                Err(e) => {
                    return Err(GcError::PodLogsDirectory {
                        path: self.pod_logs_dir.display().to_string(),
                        error: e,
                    });
                }
            };
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                let uid = name.rsplit('_').next().unwrap_or_default().to_string();
                if !self.pods.should_pod_content_be_removed(&uid) {
                    continue;
                }
                tracing::debug!(pod_uid = %uid, "removing pod logs");
                let path = entry.path();
                if let Err(e) = tokio::task::spawn_blocking(move || std::fs::remove_dir_all(path))
                    .await
                    .unwrap_or_else(|e| Err(std::io::Error::other(e.to_string())))
                {
                    tracing::error!(path = %name, error = %e, "failed to remove pod logs directory");
                }
            }
        }
        if let Some(dir) = &self.legacy_log_dir {
            self.remove_dead_legacy_links(dir).await;
        }
        Ok(())
    }

    async fn remove_dead_legacy_links(&self, dir: &std::path::Path) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.extension().and_then(|e| e.to_str()) != Some("log") || path.exists() {
                continue;
            }
            // `<pod>_<ns>_<container>-<64 hex id>.log`; keep it while the container runs.
            let stem = path
                .file_stem()
                .and_then(|s| s.to_str())
                .unwrap_or_default();
            if let Some(id) = stem.rsplit('-').next().filter(|id| id.len() == 64)
                && let Ok(resp) = self.cri.container_status(id, false).await
                && resp
                    .status
                    .is_some_and(|s| s.state != api::ContainerState::ContainerExited as i32)
            {
                continue;
            }
            if let Err(e) = std::fs::remove_file(&path) {
                tracing::error!(path = %path.display(), error = %e, "failed to remove container log dead symlink");
            }
        }
    }
}

fn remove_legacy_links_of(dir: &std::path::Path, id: &str) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let suffix = format!("-{id}.log");
    for e in entries.flatten() {
        if e.file_name().to_string_lossy().ends_with(&suffix) {
            let _ = std::fs::remove_file(e.path());
        }
    }
}
