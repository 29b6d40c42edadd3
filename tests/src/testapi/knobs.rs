//! Test knobs: inject latency, fail the next N requests of a kind, drop all
//! watches, simulate an outage, compact the watch history, read the
//! request log.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use super::store::Store;

/// How the server behaves during a simulated outage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outage {
    /// Normal service.
    None,
    /// Requests are accepted but never answered until [`Knobs::resume`]
    /// (open watches are ended).
    Hang,
    /// Connections are closed at once, as if nothing listened.
    Refuse,
}

/// One logged request.
#[derive(Debug, Clone)]
pub struct RequestRecord {
    /// When it arrived.
    pub at: SystemTime,
    /// HTTP version (`HTTP/1.1`, `HTTP/2.0`).
    pub http_version: String,
    /// HTTP method.
    pub method: String,
    /// Path.
    pub path: String,
    /// Raw query string.
    pub query: String,
    /// Kubernetes verb (`get`, `list`, `watch`, `create`, `update`,
    /// `patch`, `delete`, `deletecollection`), empty for non-resource paths.
    pub verb: String,
    /// Resource plural (empty for non-resource paths).
    pub resource: String,
    /// Subresource, if any.
    pub subresource: String,
    /// Namespace, if any.
    pub namespace: String,
    /// Object name, if any.
    pub name: String,
    /// Authenticated user (`system:anonymous` without a token).
    pub user: String,
    /// `User-Agent` header.
    pub user_agent: String,
    /// `Accept` header.
    pub accept: String,
    /// `Content-Type` header.
    pub content_type: String,
    /// HTTP status answered.
    pub status: u16,
}

/// A rule failing requests.
#[derive(Debug, Clone)]
struct FailRule {
    verb: Option<String>,
    resource: Option<String>,
    code: u16,
    remaining: usize,
}

struct Inner {
    latency: Mutex<Duration>,
    failures: Mutex<Vec<FailRule>>,
    outage: tokio::sync::watch::Sender<Outage>,
    drop_watches: tokio::sync::watch::Sender<u64>,
    log: Mutex<VecDeque<RequestRecord>>,
    log_cap: usize,
    active_watches: AtomicUsize,
    store: Arc<Store>,
}

/// The knobs of one server; cheap to clone.
#[derive(Clone)]
pub struct Knobs {
    inner: Arc<Inner>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Knobs {
    pub(crate) fn new(store: Arc<Store>, log_cap: usize) -> Knobs {
        Knobs {
            inner: Arc::new(Inner {
                latency: Mutex::new(Duration::ZERO),
                failures: Mutex::new(Vec::new()),
                outage: tokio::sync::watch::channel(Outage::None).0,
                drop_watches: tokio::sync::watch::channel(0).0,
                log: Mutex::new(VecDeque::new()),
                log_cap,
                active_watches: AtomicUsize::new(0),
                store,
            }),
        }
    }

    /// Adds `latency` before every answer (watch events are not delayed).
    pub fn set_latency(&self, latency: Duration) {
        *lock(&self.inner.latency) = latency;
    }

    /// The injected latency.
    pub fn latency(&self) -> Duration {
        *lock(&self.inner.latency)
    }

    /// Fails the next `n` requests matching `verb` (e.g. `"update"`,
    /// `None` = any) on `resource` (`"pods"`, `"pods/status"`,
    /// `"leases"`; `None` = any) with HTTP `code` and a Status body.
    pub fn fail_next(&self, n: usize, verb: Option<&str>, resource: Option<&str>, code: u16) {
        lock(&self.inner.failures).push(FailRule {
            verb: verb.map(String::from),
            resource: resource.map(String::from),
            code,
            remaining: n,
        });
    }

    /// Removes all pending failure rules.
    pub fn clear_failures(&self) {
        lock(&self.inner.failures).clear();
    }

    /// Consumes one matching failure, returning its code.
    pub(crate) fn take_failure(&self, verb: &str, resource: &str, sub: &str) -> Option<u16> {
        let mut rules = lock(&self.inner.failures);
        let full = if sub.is_empty() {
            resource.to_string()
        } else {
            format!("{resource}/{sub}")
        };
        let idx = rules.iter().position(|r| {
            r.remaining > 0
                && r.verb.as_deref().is_none_or(|v| v == "*" || v == verb)
                && r.resource.as_deref().is_none_or(|x| x == "*" || x == full)
        })?;
        let rule = &mut rules[idx];
        rule.remaining -= 1;
        let code = rule.code;
        if rule.remaining == 0 {
            rules.remove(idx);
        }
        Some(code)
    }

    /// Ends every open watch (clients see the stream close and re-watch).
    pub fn drop_watches(&self) {
        self.inner.drop_watches.send_modify(|g| *g += 1);
    }

    /// Stops answering: requests hang until [`Knobs::resume`]; open watches end.
    pub fn stop_answering(&self) {
        self.inner.outage.send_replace(Outage::Hang);
        self.drop_watches();
    }

    /// Refuses service: connections are closed at once until [`Knobs::resume`].
    pub fn refuse_connections(&self) {
        self.inner.outage.send_replace(Outage::Refuse);
        self.drop_watches();
    }

    /// Ends an outage.
    pub fn resume(&self) {
        self.inner.outage.send_replace(Outage::None);
    }

    /// The current outage mode.
    pub fn outage(&self) -> Outage {
        *self.inner.outage.borrow()
    }

    pub(crate) fn outage_rx(&self) -> tokio::sync::watch::Receiver<Outage> {
        self.inner.outage.subscribe()
    }

    pub(crate) fn drop_rx(&self) -> tokio::sync::watch::Receiver<u64> {
        self.inner.drop_watches.subscribe()
    }

    /// Compacts the watch history: every resourceVersion handed out so far
    /// (including the latest) now answers 410 Gone to watches, continue
    /// tokens and exact lists. Returns the new (compacted) RV.
    pub fn compact(&self) -> u64 {
        self.inner.store.compact()
    }

    /// The current global resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.inner.store.rv()
    }

    /// The request log (oldest first).
    pub fn requests(&self) -> Vec<RequestRecord> {
        lock(&self.inner.log).iter().cloned().collect()
    }

    /// Clears the request log.
    pub fn clear_requests(&self) {
        lock(&self.inner.log).clear();
    }

    pub(crate) fn log(&self, r: RequestRecord) {
        let mut log = lock(&self.inner.log);
        if log.len() >= self.inner.log_cap {
            log.pop_front();
        }
        log.push_back(r);
    }

    /// Number of watch streams open now.
    pub fn active_watches(&self) -> usize {
        self.inner.active_watches.load(Ordering::SeqCst)
    }

    pub(crate) fn watch_guard(&self) -> WatchGuard {
        self.inner.active_watches.fetch_add(1, Ordering::SeqCst);
        WatchGuard {
            knobs: self.clone(),
        }
    }
}

/// Counts an open watch while alive.
pub(crate) struct WatchGuard {
    knobs: Knobs,
}

impl Drop for WatchGuard {
    fn drop(&mut self) {
        self.knobs
            .inner
            .active_watches
            .fetch_sub(1, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_are_consumed_in_order() {
        let k = Knobs::new(Arc::new(Store::new(10, 16)), 10);
        k.fail_next(2, Some("update"), Some("pods/status"), 500);
        assert_eq!(k.take_failure("get", "pods", "status"), None);
        assert_eq!(k.take_failure("update", "pods", ""), None);
        assert_eq!(k.take_failure("update", "pods", "status"), Some(500));
        assert_eq!(k.take_failure("update", "pods", "status"), Some(500));
        assert_eq!(k.take_failure("update", "pods", "status"), None);
    }
}
