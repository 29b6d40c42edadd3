//! Memory threshold notifications (`kernelMemcgNotification`), as kubelet's
//! memory threshold notifier does on cgroup v1: for each memory eviction
//! threshold, the kernel is asked (`cgroup.event_control` with an eventfd)
//! to signal when the cgroup's `memory.usage_in_bytes` crosses
//! capacity − threshold + inactive file pages, so the eviction loop runs at
//! once instead of at its next 10 s tick. The level is refreshed from fresh
//! figures every 10 s. cgroup v2 has no such interface; there the loop's
//! period is all there is, as upstream.

use std::io::Write;
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use std::sync::atomic::{AtomicBool, Ordering};

use nix::sys::eventfd::{EfdFlags, EventFd};
use tokio::sync::{Notify, mpsc};
use tokio_util::sync::CancellationToken;

use super::signals::quantity;
use super::summary::{MemoryStats, SummaryProvider};
use crate::config::eviction::{Signal, Threshold};

/// How often the notification level is recomputed (kubelet's `notifierRefreshInterval`).
pub const NOTIFIER_REFRESH_INTERVAL: Duration = Duration::from_secs(10);

/// The usage level at which the kernel should notify: capacity − threshold + inactive.
pub fn memcg_threshold(t: &Threshold, m: &MemoryStats) -> u64 {
    let capacity = m.available.saturating_add(m.working_set);
    let inactive = m.usage.saturating_sub(m.working_set);
    let q = u64::try_from(quantity(t.value, capacity)).unwrap_or(0);
    capacity.saturating_sub(q).saturating_add(inactive)
}

/// One registration with the kernel. A thread blocks reading the eventfd
/// and forwards crossings; dropping the registration wakes that thread
/// (by writing to the eventfd itself), which then exits and closes the fd,
/// which unregisters the event.
struct Registration {
    efd: Arc<EventFd>,
    stop: Arc<AtomicBool>,
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = self.efd.write(1);
    }
}

fn register(
    cgroup_dir: &std::path::Path,
    level: u64,
    crossed: mpsc::UnboundedSender<()>,
) -> std::io::Result<Registration> {
    let efd = Arc::new(EventFd::from_flags(EfdFlags::EFD_CLOEXEC).map_err(std::io::Error::from)?);
    let usage = std::fs::File::open(cgroup_dir.join("memory.usage_in_bytes"))?;
    let mut control = std::fs::OpenOptions::new()
        .write(true)
        .open(cgroup_dir.join("cgroup.event_control"))?;
    control.write_all(format!("{} {} {level}", efd.as_raw_fd(), usage.as_raw_fd()).as_bytes())?;
    let stop = Arc::new(AtomicBool::new(false));
    let (fd, flag) = (efd.clone(), stop.clone());
    std::thread::Builder::new()
        .name("memcg-notifier".to_string())
        .spawn(move || {
            loop {
                let read = fd.read();
                if flag.load(Ordering::SeqCst) {
                    return;
                }
                match read {
                    Ok(_) => {
                        if crossed.send(()).is_err() {
                            return;
                        }
                    }
                    Err(nix::errno::Errno::EINTR) => {}
                    Err(e) => {
                        tracing::info!(error = %e, "eviction manager: error reading memcg events");
                        return;
                    }
                }
            }
        })?;
    Ok(Registration { efd, stop })
}

/// Keeps one threshold's notification registered; wakes `wake` on crossings.
pub async fn run(
    threshold: Threshold,
    cgroup_dir: PathBuf,
    summary: Arc<dyn SummaryProvider>,
    wake: Arc<Notify>,
    shutdown: CancellationToken,
) {
    let kind = if threshold.signal == Signal::AllocatableMemoryAvailable {
        "allocatable "
    } else {
        ""
    };
    let hard = if threshold.grace_period.is_zero() {
        "hard"
    } else {
        "soft"
    };
    let description = format!("{hard} {kind}memory eviction threshold");
    tracing::info!(notifier = %description, cgroup = %cgroup_dir.display(), "eviction manager: created memoryThresholdNotifier");
    loop {
        let figures = match summary.summary(&[]).await {
            Ok(s) if threshold.signal == Signal::AllocatableMemoryAvailable => s.pods_memory,
            Ok(s) => s.node_memory,
            Err(e) => {
                tracing::info!(notifier = %description, error = %e, "eviction manager: failed to update notifier");
                None
            }
        };
        let (tx, mut crossed) = mpsc::unbounded_channel();
        let registration = figures.and_then(|m| {
            let level = memcg_threshold(&threshold, &m);
            tracing::debug!(notifier = %description, level, "eviction manager: setting notifier to capacity");
            match register(&cgroup_dir, level, tx) {
                Ok(r) => Some(r),
                Err(e) => {
                    tracing::info!(notifier = %description, error = %e, "eviction manager: failed to update notifier");
                    None
                }
            }
        });
        let refresh = tokio::time::sleep(NOTIFIER_REFRESH_INTERVAL);
        tokio::pin!(refresh);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = &mut refresh => break,
                got = crossed.recv(), if registration.is_some() => {
                    if got.is_none() {
                        break;
                    }
                    tracing::info!(notifier = %description, "eviction manager: memory threshold crossed");
                    wake.notify_one();
                }
            }
        }
        drop(registration);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::eviction::ThresholdValue;
    use tokio::time::Instant;

    #[test]
    fn level_is_capacity_minus_threshold_plus_inactive() {
        let t = Threshold {
            signal: Signal::AllocatableMemoryAvailable,
            value: ThresholdValue::parse("100Mi").expect("v"),
            grace_period: Duration::ZERO,
            min_reclaim: None,
            hard: true,
        };
        let mi = 1024 * 1024;
        let m = MemoryStats {
            available: 300 * mi,
            working_set: 100 * mi,
            usage: 150 * mi,
            time: Instant::now(),
        };
        // capacity 400Mi − 100Mi + 50Mi inactive.
        assert_eq!(memcg_threshold(&t, &m), 350 * mi);
    }
}
