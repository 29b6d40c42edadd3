//! The volume manager's own loop: every sync period it rewrites the
//! configMap/secret/downwardAPI/projected volumes of running pods from
//! current data (kubelet gets the same from its periodic pod sync), and
//! when a watched ConfigMap or Secret changes it does so at once for the
//! pods that reference it, ignoring retry backoff. Every minute it drops
//! expired tokens and pauses idle object watches.

use std::collections::BTreeSet;

use tokio::sync::mpsc;
use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;

use super::objects::Changed;
use super::tokens::GC_PERIOD;
use super::{VolumeManager, lock};

pub(super) async fn run(
    vm: VolumeManager,
    mut changes: mpsc::UnboundedReceiver<Changed>,
    shutdown: CancellationToken,
) {
    let mut resync = tokio::time::interval(vm.inner.sync_frequency);
    resync.set_missed_tick_behavior(MissedTickBehavior::Delay);
    resync.tick().await;
    let mut gc = tokio::time::interval(GC_PERIOD);
    gc.set_missed_tick_behavior(MissedTickBehavior::Delay);
    gc.tick().await;
    loop {
        tokio::select! {
            () = shutdown.cancelled() => {
                vm.inner.config_maps.stop_all();
                vm.inner.secrets.stop_all();
                return;
            }
            _ = resync.tick() => {
                let all: Vec<String> = lock(&vm.inner.pods).keys().cloned().collect();
                vm.resync(all, false).await;
            }
            Some(first) = changes.recv() => {
                let mut pods = BTreeSet::new();
                let mut next = Some(first);
                while let Some(ch) = next {
                    let cache_pods = match ch.resource {
                        "secret" => vm.inner.secrets.referencing_pods(&ch.namespace, &ch.name),
                        _ => vm.inner.config_maps.referencing_pods(&ch.namespace, &ch.name),
                    };
                    tracing::debug!(resource = ch.resource, namespace = %ch.namespace, name = %ch.name, pods = cache_pods.len(), "referenced object changed");
                    pods.extend(cache_pods);
                    next = changes.try_recv().ok();
                }
                vm.resync(pods.into_iter().collect(), true).await;
            }
            _ = gc.tick() => {
                vm.inner.tokens.cleanup();
                vm.recycle_idle_watches();
            }
        }
    }
}

impl VolumeManager {
    /// Re-syncs the volumes of the given pods that are set up and still
    /// registered.
    async fn resync(&self, uids: Vec<String>, force: bool) {
        let slots: Vec<_> = {
            let pods = lock(&self.inner.pods);
            uids.iter()
                .filter_map(|u| pods.get(u).cloned())
                .filter(|s| *lock(&s.registered))
                .collect()
        };
        let work = slots.iter().map(|slot| self.sync_slot(slot, force, true));
        // Errors were logged and recorded as events already.
        let _ = futures::future::join_all(work).await;
    }
}
