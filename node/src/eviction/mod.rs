//! Node-pressure eviction, as kubelet's eviction manager does it: signals
//! (`memory.available`, `allocatableMemory.available`, `nodefs.*`,
//! `imagefs.*`, `containerfs.*`, `pid.available`) against `evictionHard` /
//! `evictionSoft` thresholds, node conditions with a transition period,
//! node-level reclaim (dead containers, unused images) before evicting, a
//! ranking of pods per signal, at most one eviction per round, local
//! ephemeral storage limits, admission of new pods under pressure, and
//! memory threshold notifications from the kernel.
//!
//! One concept per file: [`summary`] (what is measured), [`stats_summary`]
//! (the figures, from the node's statistics sampler), [`signals`] (threshold arithmetic),
//! [`rank`], [`message`], [`local_storage`], [`pods`] (the pod lifecycle's
//! side), [`handle`] (conditions and admission), [`manager`] (the loop),
//! [`notifier`] (memcg notifications), [`metrics`].

pub mod handle;
pub mod local_storage;
pub mod manager;
pub mod message;
pub mod metrics;
pub mod notifier;
pub mod pods;
pub mod rank;
pub mod signals;
pub mod stats_summary;
pub mod summary;

use std::sync::Arc;

use tokio::sync::Notify;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

pub use handle::{AdmitRejection, EvictionHandle};
pub use manager::{EvictionConfig, EvictionDeps, EvictionManager, NodeReclaim};
pub use metrics::EvictionMetrics;
pub use pods::{EvictionPods, REASON_EVICTED};
pub use summary::{SummaryError, SummaryProvider};

use crate::NodeServices;
use crate::cgroups::CgroupName;
use crate::config::eviction::Signal;

/// Starts the eviction manager (once the runtime is up, as kubelet starts
/// its runtime-dependent modules) and, with `kernelMemcgNotification` on a
/// cgroup v1 host, the memory threshold notifiers.
pub fn start(
    services: &NodeServices,
    pods: Arc<dyn EvictionPods>,
    reclaim: Option<Arc<dyn NodeReclaim>>,
    summary: Option<Arc<dyn SummaryProvider>>,
    tasks: &mut JoinSet<&'static str>,
) {
    let ctx = &services.ctx;
    let n = &ctx.config;
    let summary: Arc<dyn SummaryProvider> = summary.unwrap_or_else(|| {
        Arc::new(stats_summary::StatsSummary::new(
            services.stats.clone(),
            services.cri.clone(),
            n.root_dir.clone(),
        ))
    });
    let cfg = EvictionConfig::from_node_config(n);
    let wake = Arc::new(Notify::new());
    let shutdown: CancellationToken = ctx.shutdown.clone();
    if n.kernel_memcg_notification {
        start_notifiers(
            &cfg,
            n,
            summary.clone(),
            wake.clone(),
            shutdown.clone(),
            tasks,
        );
    }
    let manager = EvictionManager::new(
        cfg,
        EvictionDeps {
            summary,
            pods,
            reclaim,
            recorder: Some(services.recorder.clone()),
            metrics: EvictionMetrics::new(&ctx.registry),
            node_name: ctx.node_name.clone(),
        },
        services.eviction.clone(),
    );
    let runtime = services.runtime.clone();
    tasks.spawn(async move {
        tokio::select! {
            _ = shutdown.cancelled() => return "eviction",
            _ = runtime.wait_runtime_up() => {}
        }
        manager.run(wake, shutdown).await;
        "eviction"
    });
}

fn start_notifiers(
    cfg: &EvictionConfig,
    n: &crate::config::NodeConfig,
    summary: Arc<dyn SummaryProvider>,
    wake: Arc<Notify>,
    shutdown: CancellationToken,
    tasks: &mut JoinSet<&'static str>,
) {
    let mode = match crate::cgroups::detect_mode(std::path::Path::new("/proc/self/mountinfo")) {
        Ok(m) => m,
        Err(e) => {
            tracing::info!(error = %e, "eviction manager: failed to create memory threshold notifier");
            return;
        }
    };
    let crate::cgroups::CgroupMode::V1 { mounts } = mode else {
        tracing::info!(
            "eviction manager: memory threshold notifications need cgroup v1; using the periodic loop only"
        );
        return;
    };
    let Some(memory) = mounts.get("memory").cloned() else {
        tracing::info!("eviction manager: memory cgroup mount point not found");
        return;
    };
    let kubepods = CgroupName::from_cgroupfs(&crate::cgroups::literal_name(
        n.cgroup_driver,
        &CgroupName::from_cgroupfs(&n.cgroup_root).child("kubepods"),
    ));
    for t in cfg.thresholds.iter().filter(|t| {
        matches!(
            t.signal,
            Signal::MemoryAvailable | Signal::AllocatableMemoryAvailable
        )
    }) {
        let dir = if t.signal == Signal::AllocatableMemoryAvailable {
            memory.join(kubepods.relative())
        } else {
            memory.clone()
        };
        let fut = notifier::run(
            t.clone(),
            dir,
            summary.clone(),
            wake.clone(),
            shutdown.clone(),
        );
        tasks.spawn(async move {
            fut.await;
            "memory-threshold-notifier"
        });
    }
}
