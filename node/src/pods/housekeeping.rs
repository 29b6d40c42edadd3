//! Periodic cleanup (kubelet's `HandlePodCleanups`, every 2 s): once every
//! pod source has listed, pods the runtime runs that no source knows (a pod
//! deleted while keelson was down) are stopped with the grace period
//! recorded on their containers; cgroups, statuses, probe workers, pod
//! directories and mirror pods of gone pods are removed; the QoS tiers are
//! refreshed.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use keelson_cri::api;

use super::deps::PodVolumes;
use super::runtime::PodSyncResult;
use super::workers::PodWorkers;
use crate::pod::labels::{POD_NAME, POD_NAMESPACE, POD_UID};
use crate::pod::podutil;

/// Housekeeping period.
pub const PERIOD: std::time::Duration = std::time::Duration::from_secs(2);

/// State kept between housekeeping rounds.
#[derive(Debug, Default)]
pub struct Housekeeping {
    rounds: u64,
    /// The last orphaned-directory failure, logged as a warning once and
    /// then at debug level while it repeats.
    last_orphan_error: Option<String>,
}

impl Housekeeping {
    /// One round. `sources_ready`: every source listed once.
    pub async fn run_once(&mut self, workers: &PodWorkers, sources_ready: bool) {
        self.rounds += 1;
        let lc = workers.lifecycle().clone();
        let desired: Vec<Arc<k8s_openapi::api::core::v1::Pod>> = lc.store.pods();
        let mut known: HashSet<String> = desired
            .iter()
            .map(|p| podutil::uid(p).to_string())
            .collect();
        known.extend(workers.uids());

        // Metrics of the pod manager.
        let statics = desired.iter().filter(|p| podutil::is_static(p)).count() as i64;
        lc.metrics
            .desired_pods
            .with_label_values(&["true"])
            .set(statics);
        lc.metrics
            .desired_pods
            .with_label_values(&["false"])
            .set(desired.len() as i64 - statics);
        let active = workers.syncing_pods();
        let active_static = active.iter().filter(|p| podutil::is_static(p)).count() as i64;
        lc.metrics
            .active_pods
            .with_label_values(&["true"])
            .set(active_static);
        lc.metrics
            .active_pods
            .with_label_values(&["false"])
            .set(active.len() as i64 - active_static);
        lc.metrics.mirror_pods.set(lc.store.mirrors().len() as i64);

        if !sources_ready {
            return;
        }
        lc.status.remove_orphans(&known);
        // `RemoveOrphanedPods` of the allocation and actuated records.
        let keep: std::collections::BTreeSet<String> = known.iter().cloned().collect();
        lc.allocation.retain(&keep);
        lc.runtime.actuated().retain(&keep);
        if let Some(p) = &lc.probes {
            p.cleanup_pods(&known);
        }

        // Runtime pods nobody asked for.
        let runtime_pods = match list_runtime_pods(&lc.runtime).await {
            Ok(p) => p,
            Err(e) => {
                tracing::debug!(error = %e, "housekeeping cannot list runtime pods");
                return;
            }
        };
        for (uid, (name, ns, running)) in &runtime_pods {
            if known.contains(uid) || !running {
                continue;
            }
            tracing::info!(pod = %format!("{ns}/{name}"), uid = %uid, "stopping a pod no source knows (orphaned runtime pod)");
            match lc.runtime.get_pod_status(uid, name, ns).await {
                Ok(status) => {
                    let mut r = PodSyncResult::default();
                    if let Err(e) = lc.runtime.kill_pod(None, &status, None, &mut r).await {
                        tracing::warn!(pod = %uid, error = %e, "failed to stop an orphaned pod");
                    }
                }
                Err(e) => tracing::warn!(pod = %uid, error = %e, "cannot read an orphaned pod"),
            }
        }

        // Cgroups of pods that are gone and stopped.
        if let Ok(existing) = lc.cgroups.existing() {
            for (uid, name) in existing {
                if known.contains(&uid) || runtime_pods.get(&uid).is_some_and(|r| r.2) {
                    continue;
                }
                let cg = lc.cgroups.clone();
                let u = uid.clone();
                match tokio::task::spawn_blocking(move || cg.destroy(&u)).await {
                    Ok(Ok(())) => tracing::debug!(cgroup = %name, "removed orphaned pod cgroup"),
                    Ok(Err(e)) => {
                        tracing::debug!(cgroup = %name, error = %e, "cannot remove orphaned pod cgroup yet")
                    }
                    Err(e) => tracing::warn!(error = %e, "cgroup cleanup task failed"),
                }
            }
        }

        // Mirror pods whose static pod is gone.
        if let Some(mirror) = &lc.mirror {
            for m in lc.store.mirrors() {
                let has_static = desired.iter().any(|p| {
                    podutil::is_static(p) && podutil::full_name(p) == podutil::full_name(&m)
                });
                if !has_static
                    && let Err(e) = mirror
                        .delete(
                            podutil::namespace(&m),
                            podutil::name(&m),
                            Some(podutil::uid(&m)),
                        )
                        .await
                {
                    tracing::warn!(pod = %podutil::key(&m), error = %e, "cannot delete orphaned mirror pod");
                }
            }
        }

        // Pod directories of pods neither known nor running, every round.
        self.cleanup_orphaned_pod_dirs(lc.volumes.as_ref(), &known, &runtime_pods)
            .await;

        // QoS tiers about once a minute.
        if self.rounds.is_multiple_of(30)
            && let Some(q) = lc.cgroups.qos()
        {
            let pods = lc.active_pods();
            let q = q.clone();
            let _ = tokio::task::spawn_blocking(move || {
                if let Err(e) = q.update(&pods) {
                    tracing::warn!(error = %e, "updating QoS cgroups failed");
                }
            })
            .await;
        }
        lc.runtime.crash_backoff().gc();
    }
}

impl Housekeeping {
    /// kubelet's `cleanupOrphanedPodDirs`: removes `<root>/pods/<uid>` of
    /// every pod that is neither known (desired or still handled by a pod
    /// worker, which covers terminated pods not yet deleted) nor running
    /// in the runtime. A stopped sandbox does not keep its directory, so a
    /// pod deleted while keelson was down loses its volumes once its
    /// containers are stopped. A removal that fails (a mount still busy)
    /// is tried again next round.
    async fn cleanup_orphaned_pod_dirs(
        &mut self,
        volumes: &dyn PodVolumes,
        known: &HashSet<String>,
        runtime_pods: &RuntimePods,
    ) {
        let keep = pod_dirs_to_keep(known, runtime_pods);
        match volumes.cleanup_orphans(&keep).await {
            Ok(n) => {
                if n > 0 {
                    tracing::info!(removed = n, "removed orphaned pod directories");
                }
                self.last_orphan_error = None;
            }
            Err(e) => {
                let e = e.to_string();
                if self.last_orphan_error.as_deref() == Some(e.as_str()) {
                    tracing::debug!(error = %e, "orphaned pod directories still not removed");
                } else {
                    tracing::warn!(error = %e, "cleaning orphaned pod directories failed; retrying every housekeeping round");
                    self.last_orphan_error = Some(e);
                }
            }
        }
    }
}

/// The pods whose directories stay: known pods and pods with a ready
/// sandbox or a running container. Sorted.
fn pod_dirs_to_keep(known: &HashSet<String>, runtime_pods: &RuntimePods) -> Vec<String> {
    let mut keep: Vec<String> = known
        .iter()
        .cloned()
        .chain(
            runtime_pods
                .iter()
                .filter(|(_, (_, _, running))| *running)
                .map(|(uid, _)| uid.clone()),
        )
        .collect();
    keep.sort();
    keep.dedup();
    keep
}

/// Runtime pods by UID: (name, namespace, ready sandbox or running container).
type RuntimePods = HashMap<String, (String, String, bool)>;

/// Runtime pods by UID: (name, namespace, anything running).
async fn list_runtime_pods(
    rt: &super::runtime::RuntimeManager,
) -> Result<RuntimePods, keelson_cri::CriError> {
    let mut out: RuntimePods = HashMap::new();
    for sb in rt.cri().list_pod_sandbox(None).await? {
        let Some(md) = sb.metadata.as_ref() else {
            continue;
        };
        let ready = sb.state == api::PodSandboxState::SandboxReady as i32;
        let e = out
            .entry(md.uid.clone())
            .or_insert((md.name.clone(), md.namespace.clone(), false));
        e.2 |= ready;
    }
    for c in rt.cri().list_containers(None).await? {
        let Some(uid) = c.labels.get(POD_UID) else {
            continue;
        };
        let running = c.state == api::ContainerState::ContainerRunning as i32;
        let e = out.entry(uid.clone()).or_insert((
            c.labels.get(POD_NAME).cloned().unwrap_or_default(),
            c.labels.get(POD_NAMESPACE).cloned().unwrap_or_default(),
            false,
        ));
        e.2 |= running;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;
    use std::sync::Mutex;

    use futures::future::BoxFuture;
    use k8s_openapi::api::core::v1::{Container, Pod};

    use super::*;
    use crate::pods::deps::{PodVolumesError, VolumesNotReady};

    /// Records what each round asked to keep; fails while `fail` is set.
    #[derive(Default)]
    struct RecordingVolumes {
        calls: Mutex<Vec<Vec<String>>>,
        fail: Mutex<Option<String>>,
    }

    impl PodVolumes for RecordingVolumes {
        fn register_pod(&self, _: &Pod) {}
        fn unregister_pod(&self, _: &str) {}
        fn setup_pod<'a>(&'a self, _: &'a Pod) -> BoxFuture<'a, Result<(), VolumesNotReady>> {
            Box::pin(async { Ok(()) })
        }
        fn container_mounts<'a>(
            &'a self,
            _: &'a Pod,
            _: &'a Container,
            _: &'a [(String, String)],
        ) -> BoxFuture<'a, Result<Vec<api::Mount>, PodVolumesError>> {
            Box::pin(async { Ok(Vec::new()) })
        }
        fn teardown_pod<'a>(&'a self, _: &'a str) -> BoxFuture<'a, Result<(), PodVolumesError>> {
            Box::pin(async { Ok(()) })
        }
        fn remove_pod_dir<'a>(&'a self, _: &'a str) -> BoxFuture<'a, Result<(), PodVolumesError>> {
            Box::pin(async { Ok(()) })
        }
        fn cleanup_orphans<'a>(
            &'a self,
            active: &'a [String],
        ) -> BoxFuture<'a, Result<usize, PodVolumesError>> {
            Box::pin(async move {
                self.calls
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(active.to_vec());
                match self.fail.lock().unwrap_or_else(|p| p.into_inner()).clone() {
                    Some(e) => Err(PodVolumesError::Manager(e.into())),
                    None => Ok(0),
                }
            })
        }
        fn pod_dir(&self, uid: &str) -> PathBuf {
            PathBuf::from("/nonexistent/pods").join(uid)
        }
    }

    fn runtime(pods: &[(&str, bool)]) -> RuntimePods {
        pods.iter()
            .map(|(uid, running)| {
                (
                    uid.to_string(),
                    (format!("pod-{uid}"), "default".to_string(), *running),
                )
            })
            .collect()
    }

    #[test]
    fn known_and_running_pods_keep_their_directories_stopped_ones_do_not() {
        let known: HashSet<String> = ["desired".to_string(), "terminating".to_string()].into();
        let rt = runtime(&[
            ("desired", false),
            ("running-orphan", true),
            ("stopped-orphan", false),
        ]);
        assert_eq!(
            pod_dirs_to_keep(&known, &rt),
            vec!["desired", "running-orphan", "terminating"]
        );
    }

    #[tokio::test]
    async fn every_round_cleans_and_failures_are_retried() {
        let volumes = RecordingVolumes::default();
        let mut hk = Housekeeping::default();
        let known: HashSet<String> = ["a".to_string()].into();

        // Round 1: the orphan's containers still run (being stopped).
        let rt = runtime(&[("orphan", true)]);
        hk.cleanup_orphaned_pod_dirs(&volumes, &known, &rt).await;
        // Round 2: stopped; removal fails (a busy mount).
        *volumes.fail.lock().unwrap_or_else(|p| p.into_inner()) = Some("busy".to_string());
        let rt = runtime(&[("orphan", false)]);
        hk.cleanup_orphaned_pod_dirs(&volumes, &known, &rt).await;
        assert_eq!(hk.last_orphan_error.as_deref(), Some("busy"));
        // Round 3: tried again, succeeds.
        *volumes.fail.lock().unwrap_or_else(|p| p.into_inner()) = None;
        hk.cleanup_orphaned_pod_dirs(&volumes, &known, &rt).await;
        assert_eq!(hk.last_orphan_error, None);

        let calls = volumes
            .calls
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        assert_eq!(
            calls,
            vec![
                vec!["a".to_string(), "orphan".to_string()],
                vec!["a".to_string()],
                vec!["a".to_string()],
            ]
        );
    }
}
