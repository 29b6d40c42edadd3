//! The desired and actual state of registered plugins and the reconciler
//! between them (`pluginmanager/cache/*.go`, `reconciler/reconciler.go`).
//! A socket re-created at the same path gets a new generation (kubelet's
//! timestamp/UUID), so the old registration is undone before the new one.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::Handlers;
use super::registration::{Registered, register};

/// The reconciler's period (`loopSleepDuration`).
pub(crate) const RECONCILE_PERIOD: Duration = Duration::from_secs(1);
/// `exponentialbackoff.initialDurationBeforeRetry`.
const INITIAL_BACKOFF: Duration = Duration::from_millis(500);
/// `exponentialbackoff.maxDurationBeforeRetry`.
const MAX_BACKOFF: Duration = Duration::from_secs(2 * 60 + 2);

/// Sockets found in the directory, with their generation.
#[derive(Debug, Clone, Default)]
pub(crate) struct DesiredState {
    inner: Arc<Mutex<(u64, BTreeMap<PathBuf, u64>)>>,
}

impl DesiredState {
    /// `AddOrUpdatePlugin`.
    pub(crate) fn add_or_update(&self, path: &Path) {
        let mut g = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        g.0 += 1;
        let generation = g.0;
        g.1.insert(path.to_path_buf(), generation);
    }

    /// `RemovePlugin`.
    pub(crate) fn remove(&self, path: &Path) {
        let mut g = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        g.1.remove(path);
    }

    fn snapshot(&self) -> BTreeMap<PathBuf, u64> {
        self.inner
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .1
            .clone()
    }
}

#[derive(Default)]
struct Actual {
    registered: BTreeMap<PathBuf, Registered>,
    /// Operations running, per socket (`goroutinemap`).
    running: BTreeSet<PathBuf>,
    /// Failed registrations: (generation, next try, last backoff).
    backoff: BTreeMap<PathBuf, (u64, Instant, Duration)>,
}

/// Runs the reconciler until `stop`.
pub(crate) fn start(desired: DesiredState, handlers: Arc<Handlers>, stop: CancellationToken) {
    let actual = Arc::new(Mutex::new(Actual::default()));
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(RECONCILE_PERIOD);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                _ = tick.tick() => {}
            }
            reconcile(&desired, &actual, &handlers);
        }
    });
}

fn reconcile(desired: &DesiredState, actual: &Arc<Mutex<Actual>>, handlers: &Arc<Handlers>) {
    let want = desired.snapshot();
    let mut a = actual.lock().unwrap_or_else(PoisonError::into_inner);
    // Deregister plugins whose socket is gone or was re-created.
    let stale: Vec<PathBuf> = a
        .registered
        .iter()
        .filter(|(p, r)| want.get(*p) != Some(&r.generation))
        .map(|(p, _)| p.clone())
        .collect();
    for p in stale {
        if a.running.contains(&p) {
            continue;
        }
        if let Some(r) = a.registered.remove(&p) {
            tracing::info!(path = %p.display(), plugin = %r.name, "deregistering plugin");
            r.handler.deregister(&r.name, &r.endpoint);
        }
    }
    a.backoff.retain(|p, v| want.get(p) == Some(&v.0));
    let now = Instant::now();
    for (path, generation) in want {
        if a.registered.contains_key(&path) || a.running.contains(&path) {
            continue;
        }
        if let Some((g, next, _)) = a.backoff.get(&path)
            && *g == generation
            && now < *next
        {
            continue;
        }
        a.running.insert(path.clone());
        let actual = Arc::clone(actual);
        let handlers = Arc::clone(handlers);
        tokio::spawn(async move {
            let outcome = register(&path, generation, &handlers).await;
            let mut a = actual.lock().unwrap_or_else(PoisonError::into_inner);
            a.running.remove(&path);
            match outcome {
                Ok(r) => {
                    a.backoff.remove(&path);
                    a.registered.insert(path, r);
                }
                Err(e) => {
                    tracing::error!(path = %path.display(), error = %e, "OperationExecutor.RegisterPlugin failed");
                    let wait = match a.backoff.get(&path) {
                        Some((g, _, last)) if *g == generation => (*last * 2).min(MAX_BACKOFF),
                        _ => INITIAL_BACKOFF,
                    };
                    a.backoff
                        .insert(path, (generation, Instant::now() + wait, wait));
                }
            }
        });
    }
}
