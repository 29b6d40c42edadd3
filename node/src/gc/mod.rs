//! Garbage collection of dead containers, sandboxes, pod logs and unused
//! images, as kubelet runs it: container GC every minute, image GC every
//! five minutes (off when `imageGCHighThresholdPercent` is 100), image
//! detection every five minutes; both also serve the eviction manager's
//! disk reclaim ([`Collectors`] implement [`NodeReclaim`]).

pub mod containers;
pub mod error;
pub mod images;

use std::time::Duration;

use futures::future::BoxFuture;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

pub use containers::{ContainerGc, ContainerGcPolicy, PodState};
pub use error::GcError;
pub use images::{ImageGc, ImageGcMetrics, ImageGcPolicy};

use keelson_common::events::{EventRecorder, EventType, node_ref};

/// Period of container GC (kubelet's `ContainerGCPeriod`).
pub const CONTAINER_GC_PERIOD: Duration = Duration::from_secs(60);

/// Node-level reclaim as the eviction manager asks for it: kubelet's
/// container and image garbage collectors (`ContainerGC`, `ImageGC` in
/// `pkg/kubelet/eviction/types.go`).
pub trait NodeReclaim: Send + Sync + 'static {
    /// Removes every dead container and sandbox that may go.
    fn delete_all_unused_containers(&self) -> BoxFuture<'_, Result<(), GcError>>;
    /// Removes every image no container uses.
    fn delete_unused_images(&self) -> BoxFuture<'_, Result<(), GcError>>;
}

/// Both collectors.
#[derive(Clone, Debug)]
pub struct Collectors {
    /// Containers, sandboxes, pod logs.
    pub containers: ContainerGc,
    /// Images.
    pub images: ImageGc,
}

impl NodeReclaim for Collectors {
    fn delete_all_unused_containers(&self) -> BoxFuture<'_, Result<(), GcError>> {
        Box::pin(self.containers.garbage_collect(true))
    }

    fn delete_unused_images(&self) -> BoxFuture<'_, Result<(), GcError>> {
        Box::pin(self.images.delete_unused_images())
    }
}

/// Runs the periodic collections until `shutdown`.
pub async fn run(
    collectors: Collectors,
    image_gc_enabled: bool,
    recorder: Option<EventRecorder>,
    node_name: String,
    shutdown: CancellationToken,
) {
    let began = Instant::now();
    let mut container_tick = tokio::time::interval(CONTAINER_GC_PERIOD);
    let mut image_tick = tokio::time::interval(images::IMAGE_GC_PERIOD);
    let mut detect_tick = tokio::time::interval(images::DETECT_PERIOD);
    for t in [&mut container_tick, &mut image_tick, &mut detect_tick] {
        t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    }
    let warn = |reason: &str, message: String| {
        if let Some(r) = &recorder {
            r.event(&node_ref(&node_name), EventType::Warning, reason, message);
        }
    };
    if !image_gc_enabled {
        tracing::info!("imageGCHighThresholdPercent is 100: image garbage collection is disabled");
    }
    let mut image_failed_before = false;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = container_tick.tick() => {
                if let Err(e) = collectors.containers.garbage_collect(false).await {
                    tracing::error!(error = %e, "container garbage collection failed");
                    warn("ContainerGCFailed", e.to_string());
                }
            }
            _ = detect_tick.tick() => {
                if let Err(e) = collectors.images.detect_images(Instant::now()).await {
                    tracing::warn!(error = %e, "image detection failed");
                }
            }
            _ = image_tick.tick(), if image_gc_enabled => {
                match collectors.images.garbage_collect(began).await {
                    Ok(()) => {
                        if image_failed_before {
                            tracing::info!("image garbage collection succeeded");
                        }
                        image_failed_before = false;
                    }
                    Err(e) => {
                        if image_failed_before {
                            tracing::error!(error = %e, "image garbage collection failed multiple times in a row");
                            warn("ImageGCFailed", e.to_string());
                        } else {
                            tracing::error!(error = %e, "image garbage collection failed once; stats initialization may not have completed yet");
                        }
                        image_failed_before = true;
                    }
                }
            }
        }
    }
}
