//! Whether the node is shutting down, as kubelet's node shutdown manager
//! reports it (`ShutdownStatus`, pkg/kubelet/nodeshutdown/
//! nodeshutdown_manager_linux.go): set by the graceful node shutdown
//! manager, read by the Ready condition (`node is shutting down` among its
//! errors, pkg/kubelet/nodestatus/setters.go `ReadyCondition`) and by pod
//! admission. Setting it wakes the node status manager at once (kubelet
//! calls `syncNodeStatus` when the shutdown event arrives).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::Notify;

/// The Ready condition's error while the node shuts down.
pub const SHUTTING_DOWN: &str = "node is shutting down";

#[derive(Debug, Default)]
struct Inner {
    now: AtomicBool,
    changed: Notify,
}

/// The flag; cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct ShuttingDown {
    inner: Arc<Inner>,
}

impl ShuttingDown {
    /// Records whether a shutdown is under way and wakes the status manager.
    pub fn set(&self, now: bool) {
        self.inner.now.store(now, Ordering::SeqCst);
        self.inner.changed.notify_one();
    }

    /// Whether a shutdown is under way.
    pub fn is_shutting_down(&self) -> bool {
        self.inner.now.load(Ordering::SeqCst)
    }

    /// The Ready condition's error, if any.
    pub fn error(&self) -> Option<String> {
        self.is_shutting_down().then(|| SHUTTING_DOWN.to_string())
    }

    /// Resolves at the next [`ShuttingDown::set`] (or at once if one
    /// happened since the last wait).
    pub async fn changed(&self) {
        self.inner.changed.notified().await;
    }
}
