//! Graceful node shutdown, as kubelet v1.36 does it
//! (pkg/kubelet/nodeshutdown/nodeshutdown_manager_linux.go and
//! nodeshutdown_manager.go): with `shutdownGracePeriod` (and
//! `shutdownGracePeriodCriticalPods`) or `shutdownGracePeriodByPodPriority`
//! set, the node holds a systemd-logind `delay` inhibitor lock; when logind
//! announces the shutdown (`PrepareForShutdown(true)`) the node
//!
//! 1. records a `NodeShutdown` event on the Node, reports itself NotReady
//!    (`node is shutting down`) at once and refuses new pods
//!    (`NodeShutdown`, see `pods::admission::shutdown`);
//! 2. kills its pods group by group, lowest priority first, each pod with
//!    the group's grace period or its own when shorter, its status
//!    `Failed` (a `Succeeded` pod stays so) with reason `Terminated`, the
//!    message `Pod was terminated in response to imminent node shutdown.`
//!    and a `DisruptionTarget` condition (`TerminationByKubelet`); the next
//!    group starts when every pod of this one is gone or its period is over;
//! 3. releases the lock, so the shutdown goes on.
//!
//! A cancelled shutdown (`PrepareForShutdown(false)`) takes the lock again
//! and the node becomes Ready. When logind's `InhibitDelayMaxUSec` is below
//! the sum of the periods, the node writes `99-kubelet.conf` in
//! `/etc/systemd/logind.conf.d` and has systemd reload logind first. The
//! connection is retried every second when it fails or ends. The start and
//! end of the last shutdown are kept in [`state_file`].

pub mod groups;
pub mod logind;
pub mod state_file;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use keelson_common::events::{EventRecorder, EventType, node_ref};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::status::ShuttingDown;

use self::groups::Periods;
use self::logind::{Logind, LogindError};
use self::state_file::ShutdownRecord;

/// The pods' status reason (`nodeShutdownReason`).
pub const REASON: &str = "Terminated";
/// The pods' status message and condition message (`nodeShutdownMessage`).
pub const MESSAGE: &str = "Pod was terminated in response to imminent node shutdown.";
/// The Node event's reason (`kubeletevents.NodeShutdown`).
pub const EVENT_REASON: &str = "NodeShutdown";

/// How long before a failed or ended D-Bus connection is tried again
/// (`dbusReconnectPeriod`).
const RECONNECT_PERIOD: Duration = Duration::from_secs(1);
/// How often the pods of a group are checked while they stop.
const POD_POLL: Duration = Duration::from_millis(100);
/// The waits for logind to take a raised maximum delay (100 ms doubling,
/// 5 tries).
const RELOAD_WAITS: [Duration; 5] = [
    Duration::from_millis(100),
    Duration::from_millis(200),
    Duration::from_millis(400),
    Duration::from_millis(800),
    Duration::from_millis(1600),
];

/// What the shutdown manager needs of the pod lifecycle (implemented by
/// the pod lifecycle's handle).
pub trait ShutdownPods: Send + Sync + 'static {
    /// The pods that are not terminal.
    fn active_pods(&self) -> Vec<Arc<Pod>>;
    /// Kills a pod with `grace` seconds, its final status as in
    /// [`MESSAGE`]; false when the pod is gone.
    fn kill_for_shutdown(&self, pod: &Pod, grace: i64) -> bool;
    /// Whether the pod's containers are all stopped.
    fn is_cleaned_up(&self, uid: &str) -> bool;
}

/// The manager's settings.
#[derive(Debug, Clone)]
pub struct ShutdownConfig {
    /// The node's name (events).
    pub node_name: String,
    /// The grace periods by priority (empty: off).
    pub periods: Periods,
    /// The node's root dir (the state file).
    pub root_dir: PathBuf,
    /// The D-Bus address of logind (`None`: the system bus).
    pub bus: Option<String>,
    /// Where logind's drop-in goes ([`logind::CONF_DIR`]).
    pub conf_dir: PathBuf,
}

/// The graceful node shutdown manager.
pub struct ShutdownManager {
    cfg: ShutdownConfig,
    pods: Arc<dyn ShutdownPods>,
    flag: ShuttingDown,
    recorder: Option<EventRecorder>,
    record: ShutdownRecord,
}

impl std::fmt::Debug for ShutdownManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShutdownManager")
            .field("periods", &self.cfg.periods)
            .finish_non_exhaustive()
    }
}

impl ShutdownManager {
    /// The manager; `None` when no grace period is configured (kubelet's
    /// `managerStub`).
    pub fn new(
        cfg: ShutdownConfig,
        pods: Arc<dyn ShutdownPods>,
        flag: ShuttingDown,
        recorder: Option<EventRecorder>,
        registry: &prometheus::Registry,
    ) -> Option<ShutdownManager> {
        if cfg.periods.is_empty() {
            return None;
        }
        tracing::info!(periods = ?cfg.periods, "Creating node shutdown manager");
        let record = ShutdownRecord::open(&cfg.root_dir, registry);
        Some(ShutdownManager {
            cfg,
            pods,
            flag,
            recorder,
            record,
        })
    }

    /// Watches for shutdowns until `stop`. As kubelet (`Start`): when the
    /// first connection fails the manager gives up, logging why; once it
    /// has watched, a connection that fails or ends is tried again every
    /// second.
    pub async fn run(self, stop: CancellationToken) {
        if let Err(e) = self.watch(&stop).await {
            tracing::error!(error = %e, "Failed to start node shutdown manager: pods will not be stopped gracefully when the node shuts down (is systemd-logind running and the system D-Bus reachable?)");
            return;
        }
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(RECONNECT_PERIOD) => {}
            }
            tracing::debug!("Restarting watch for node shutdown events");
            if let Err(e) = self.watch(&stop).await {
                tracing::error!(error = %e, "Unable to watch the node for shutdown events");
            }
        }
    }

    /// One connection: raise logind's delay if needed, take the lock and
    /// handle `PrepareForShutdown` until the connection ends.
    async fn watch(&self, stop: &CancellationToken) -> Result<(), LogindError> {
        let logind = Logind::connect(self.cfg.bus.as_deref(), &self.cfg.conf_dir).await?;
        self.ensure_inhibit_delay(&logind).await?;
        let mut lock = Some(logind.inhibit_shutdown().await?);
        let mut events = logind.shutdown_events().await?;
        tracing::info!("watching for node shutdown");
        loop {
            let shutting_down = tokio::select! {
                _ = stop.cancelled() => return Ok(()),
                ev = events.next() => match ev {
                    Some(v) => v,
                    None => return Ok(()),
                },
            };
            self.event(if shutting_down {
                "Shutdown manager detected shutdown event"
            } else {
                "Shutdown manager detected shutdown cancellation"
            });
            self.flag.set(shutting_down);
            if shutting_down {
                self.process_shutdown(stop).await;
                // The lock goes: the shutdown may proceed.
                drop(lock.take());
                tracing::info!(
                    "Shutdown manager completed processing shutdown event, node will shutdown shortly"
                );
            } else {
                // A new lock first, then the old one (if still held) goes.
                match logind.inhibit_shutdown().await {
                    Ok(l) => lock = Some(l),
                    Err(e) => tracing::error!(error = %e, "cannot take the inhibitor lock again"),
                }
            }
        }
    }

    async fn ensure_inhibit_delay(&self, logind: &Logind) -> Result<(), LogindError> {
        let requested = self.cfg.periods.requested();
        let current = logind.inhibit_delay().await?;
        if requested <= current {
            return Ok(());
        }
        let path = logind.override_inhibit_delay(requested)?;
        tracing::info!(path = %path.display(), ?requested, ?current, "raising logind's InhibitDelayMaxSec");
        logind.reload_logind_conf().await?;
        let mut updated = current;
        for (attempt, wait) in RELOAD_WAITS.iter().enumerate() {
            tokio::time::sleep(*wait).await;
            updated = logind.inhibit_delay().await?;
            if requested <= updated {
                return Ok(());
            }
            tracing::debug!(
                attempt = attempt + 1,
                ?updated,
                ?requested,
                "InhibitDelayMaxSec still less than requested, retrying"
            );
        }
        Err(LogindError::Call {
            what: "node shutdown manager timed out waiting for logind to take the new InhibitDelayMaxSec",
            message: format!(
                "after {} attempts it is {} and shutdownGracePeriod needs {}: check {} and logind's own configuration",
                RELOAD_WAITS.len(),
                keelson_common::gofmt::duration(updated),
                keelson_common::gofmt::duration(requested),
                path.display()
            ),
        })
    }

    fn event(&self, message: &str) {
        if let Some(r) = &self.recorder {
            r.event(
                &node_ref(&self.cfg.node_name),
                EventType::Normal,
                EVENT_REASON,
                message,
            );
        }
    }

    /// Kills the pods group by group (`processShutdownEvent`, `killPods`).
    async fn process_shutdown(&self, stop: &CancellationToken) {
        let start = jiff::Timestamp::now();
        self.record.started(start);
        let pods = self.pods.active_pods();
        for group in self.cfg.periods.group(&pods) {
            if group.pods.is_empty() {
                continue;
            }
            for pod in &group.pods {
                let grace = group.grace_for(pod);
                tracing::info!(pod = %crate::pod::podutil::key(pod), grace, "Shutdown manager killing pod with gracePeriod");
                if !self.pods.kill_for_shutdown(pod, grace) {
                    tracing::info!(pod = %crate::pod::podutil::key(pod), "Shutdown manager failed killing pod: it is gone");
                }
            }
            let deadline =
                Instant::now() + Duration::from_secs(u64::try_from(group.seconds).unwrap_or(0));
            loop {
                let left = group
                    .pods
                    .iter()
                    .filter(|p| !self.pods.is_cleaned_up(crate::pod::podutil::uid(p)))
                    .count();
                if left == 0 {
                    tracing::info!(
                        priority = group.priority,
                        "Done waiting for all pods in group to terminate"
                    );
                    break;
                }
                if Instant::now() >= deadline {
                    tracing::info!(
                        priority = group.priority,
                        left,
                        "Shutdown manager pod killing time out"
                    );
                    break;
                }
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(POD_POLL) => {}
                }
            }
        }
        self.record.ended(start, jiff::Timestamp::now());
    }
}
