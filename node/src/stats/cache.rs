//! The housekeeping cache behind `/stats/summary`, `/metrics/resource` and
//! `/metrics/cadvisor`.
//!
//! kubelet answers these from cAdvisor's in-memory cache, which cAdvisor
//! refreshes on its own housekeeping tick (kubelet sets `housekeeping_interval`
//! to 10 s, `pkg/kubelet/cadvisor/cadvisor_linux.go`); the handlers ask with
//! `updateStats=false` (`pkg/kubelet/server/stats/handler.go`,
//! `pkg/kubelet/server/stats/summary.go`), so a request never reads a cgroup
//! file. keelson does the same: [`StatsCache::run`] takes one sample of
//! everything every housekeeping interval ([`Collect`]) and publishes it as
//! an immutable [`Snapshot`]; a request clones the `Arc` of the latest one.
//!
//! - A pod or container that started after the last round is absent until
//!   the next one, as a container cAdvisor has not yet sampled is absent from
//!   kubelet's summary (`pkg/kubelet/stats/cadvisor_stats_provider.go`
//!   builds it from cAdvisor's cached infos only); one that went away
//!   disappears at the next round.
//! - One round at a time: [`StatsCache::refresh`] called while a round is
//!   running waits for that round and returns its result instead of
//!   starting another, so callers cannot pile rounds up.
//! - A round that fails (the runtime cannot list its pods) is published as
//!   that error, which the handlers answer 500 as kubelet does when its
//!   provider fails, until a round succeeds.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::cadvisor::CadvisorInfo;
use super::error::StatsError;
use super::types::Summary;

/// What one sample read: the summary and, from the same reads, the
/// cgroups and machine of `/metrics/cadvisor`.
#[derive(Debug, Clone, Default)]
pub struct Round {
    /// The Summary API's figures.
    pub summary: Summary,
    /// cAdvisor's view of the same round.
    pub cadvisor: CadvisorInfo,
}

/// Takes one sample of the node's statistics.
pub trait Collect: Send + Sync + 'static {
    /// The whole round, every figure read now.
    fn collect(self: Arc<Self>) -> BoxFuture<'static, Result<Round, StatsError>>;
}

/// The result of one housekeeping round.
#[derive(Debug)]
pub struct Snapshot {
    /// The summary, or why the round failed.
    pub summary: Result<Summary, StatsError>,
    /// The cgroups and machine (`None` when the round failed).
    pub cadvisor: Option<CadvisorInfo>,
    /// When the round ended.
    pub taken: Instant,
}

/// The latest [`Snapshot`], refreshed in the background; shared.
pub struct StatsCache {
    collector: Arc<dyn Collect>,
    latest: watch::Sender<Option<Arc<Snapshot>>>,
    /// Held while a round runs.
    round: tokio::sync::Mutex<()>,
    /// Rounds finished.
    rounds: AtomicU64,
}

impl std::fmt::Debug for StatsCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StatsCache")
            .field("rounds", &self.rounds.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl StatsCache {
    /// An empty cache over `collector`; nothing is sampled until
    /// [`Self::run`] or [`Self::refresh`].
    pub fn new(collector: Arc<dyn Collect>) -> Arc<Self> {
        Arc::new(StatsCache {
            collector,
            latest: watch::channel(None).0,
            round: tokio::sync::Mutex::new(()),
            rounds: AtomicU64::new(0),
        })
    }

    /// The latest snapshot, if a round has finished.
    pub fn latest(&self) -> Option<Arc<Snapshot>> {
        self.latest.borrow().clone()
    }

    /// Rounds finished so far.
    pub fn rounds(&self) -> u64 {
        self.rounds.load(Ordering::Acquire)
    }

    /// The latest snapshot; before the first round has finished (right
    /// after start), waits for it.
    pub async fn current(&self) -> Arc<Snapshot> {
        let mut rx = self.latest.subscribe();
        loop {
            if let Some(s) = rx.borrow_and_update().clone() {
                return s;
            }
            if rx.changed().await.is_err() {
                // The sender lives as long as `self`: not reached.
                return Arc::new(Snapshot {
                    summary: Err(StatsError::NotCollected),
                    cadvisor: None,
                    taken: Instant::now(),
                });
            }
        }
    }

    /// Runs a round now and publishes it; when a round is already running,
    /// waits for it and returns its snapshot instead.
    pub async fn refresh(&self) -> Arc<Snapshot> {
        let seen = self.rounds();
        let _round = self.round.lock().await;
        if self.rounds() != seen
            && let Some(s) = self.latest()
        {
            return s;
        }
        let started = Instant::now();
        let (summary, cadvisor) = match self.collector.clone().collect().await {
            Ok(r) => (Ok(r.summary), Some(r.cadvisor)),
            Err(e) => (Err(e), None),
        };
        let snapshot = Arc::new(Snapshot {
            summary,
            cadvisor,
            taken: Instant::now(),
        });
        match &snapshot.summary {
            Ok(s) => tracing::debug!(
                pods = s.pods.len(),
                took_ms = started.elapsed().as_millis() as u64,
                "statistics collected"
            ),
            Err(e) => tracing::warn!(error = %e, "statistics collection failed"),
        }
        self.latest.send_replace(Some(snapshot.clone()));
        self.rounds.fetch_add(1, Ordering::AcqRel);
        snapshot
    }

    /// Housekeeping: a round at once, then one `interval` after each
    /// round ends, until `stop`.
    pub async fn run(self: Arc<Self>, interval: Duration, stop: CancellationToken) {
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = self.refresh() => {}
            }
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(interval) => {}
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::panic)]
mod tests {
    use std::sync::Mutex;
    use std::sync::atomic::AtomicUsize;

    use super::*;
    use crate::stats::types::{PodReference, PodStats};

    /// Reports the pods it is told, counts its rounds, and can be held
    /// mid-round.
    #[derive(Default)]
    struct Fake {
        pods: Mutex<Vec<String>>,
        calls: AtomicUsize,
        fail: Mutex<Option<StatsError>>,
        gate: Option<Arc<tokio::sync::Semaphore>>,
    }

    impl Fake {
        fn set_pods(&self, pods: &[&str]) {
            *self.pods.lock().unwrap() = pods.iter().map(|p| p.to_string()).collect();
        }
    }

    impl Collect for Fake {
        fn collect(self: Arc<Self>) -> BoxFuture<'static, Result<Round, StatsError>> {
            Box::pin(async move {
                self.calls.fetch_add(1, Ordering::SeqCst);
                if let Some(g) = &self.gate {
                    let _permit = g.acquire().await.unwrap();
                }
                if let Some(e) = self.fail.lock().unwrap().clone() {
                    return Err(e);
                }
                let pods = self.pods.lock().unwrap().clone();
                let summary = Summary {
                    pods: pods
                        .into_iter()
                        .map(|name| PodStats {
                            pod_ref: PodReference {
                                name,
                                ..Default::default()
                            },
                            ..Default::default()
                        })
                        .collect(),
                    ..Default::default()
                };
                Ok(Round {
                    summary,
                    ..Default::default()
                })
            })
        }
    }

    fn names(s: &Arc<Snapshot>) -> Vec<String> {
        s.summary
            .as_ref()
            .unwrap()
            .pods
            .iter()
            .map(|p| p.pod_ref.name.clone())
            .collect()
    }

    #[tokio::test]
    async fn requests_read_the_snapshot_and_never_collect() {
        let fake = Arc::new(Fake::default());
        fake.set_pods(&["a"]);
        let cache = StatsCache::new(fake.clone());
        cache.refresh().await;
        for _ in 0..100 {
            assert_eq!(names(&cache.current().await), ["a"]);
        }
        assert_eq!(fake.calls.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn pods_appear_and_disappear_at_the_next_round() {
        let fake = Arc::new(Fake::default());
        fake.set_pods(&["a", "b"]);
        let cache = StatsCache::new(fake.clone());
        cache.refresh().await;
        // "c" started, "a" went away: the snapshot is the last round's.
        fake.set_pods(&["b", "c"]);
        assert_eq!(names(&cache.current().await), ["a", "b"]);
        cache.refresh().await;
        assert_eq!(names(&cache.current().await), ["b", "c"]);
    }

    #[tokio::test]
    async fn the_first_request_waits_for_the_first_round() {
        let gate = Arc::new(tokio::sync::Semaphore::new(0));
        let fake = Arc::new(Fake {
            gate: Some(gate.clone()),
            ..Default::default()
        });
        fake.set_pods(&["a"]);
        let cache = StatsCache::new(fake.clone());
        let stop = CancellationToken::new();
        let runner = tokio::spawn(cache.clone().run(Duration::from_secs(10), stop.clone()));
        let reader = tokio::spawn({
            let cache = cache.clone();
            async move { names(&cache.current().await) }
        });
        // The round is held: the reader has nothing to read yet.
        while fake.calls.load(Ordering::SeqCst) == 0 {
            tokio::task::yield_now().await;
        }
        assert!(cache.latest().is_none());
        assert!(!reader.is_finished());
        gate.add_permits(1);
        assert_eq!(reader.await.unwrap(), ["a"]);
        stop.cancel();
        runner.await.unwrap();
    }

    #[tokio::test]
    async fn concurrent_refreshes_share_one_round() {
        let gate = Arc::new(tokio::sync::Semaphore::new(0));
        let fake = Arc::new(Fake {
            gate: Some(gate.clone()),
            ..Default::default()
        });
        let cache = StatsCache::new(fake.clone());
        let waiters: Vec<_> = (0..20)
            .map(|_| {
                let cache = cache.clone();
                tokio::spawn(async move { cache.refresh().await })
            })
            .collect();
        while fake.calls.load(Ordering::SeqCst) == 0 {
            tokio::task::yield_now().await;
        }
        gate.add_permits(1);
        let latest = {
            let mut snaps = Vec::new();
            for w in waiters {
                snaps.push(w.await.unwrap());
            }
            snaps
        };
        // Every caller was queued behind the one held round and got it.
        assert_eq!(fake.calls.load(Ordering::SeqCst), 1);
        assert_eq!(cache.rounds(), 1);
        let one = cache.latest().unwrap();
        assert!(latest.iter().all(|s| Arc::ptr_eq(s, &one)));
    }

    #[tokio::test(start_paused = true)]
    async fn housekeeping_runs_every_interval() {
        let fake = Arc::new(Fake::default());
        let cache = StatsCache::new(fake.clone());
        let stop = CancellationToken::new();
        let start = Instant::now();
        let runner = tokio::spawn(cache.clone().run(Duration::from_secs(10), stop.clone()));
        let mut rx = cache.latest.subscribe();
        let mut taken = Vec::new();
        while taken.len() < 3 {
            rx.changed().await.unwrap();
            let s = rx.borrow_and_update().clone().unwrap();
            taken.push(s.taken.duration_since(start));
        }
        assert_eq!(
            taken,
            [
                Duration::ZERO,
                Duration::from_secs(10),
                Duration::from_secs(20)
            ]
        );
        stop.cancel();
        runner.await.unwrap();
    }

    #[tokio::test]
    async fn a_failed_round_is_served_until_one_succeeds() {
        let fake = Arc::new(Fake::default());
        fake.set_pods(&["a"]);
        let cache = StatsCache::new(fake.clone());
        *fake.fail.lock().unwrap() = Some(StatsError::Interrupted("down".to_string()));
        cache.refresh().await;
        assert_eq!(
            cache
                .current()
                .await
                .summary
                .as_ref()
                .unwrap_err()
                .to_string(),
            "stats collection failed: down"
        );
        *fake.fail.lock().unwrap() = None;
        cache.refresh().await;
        assert_eq!(names(&cache.current().await), ["a"]);
    }
}
