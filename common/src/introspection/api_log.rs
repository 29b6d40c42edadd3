//! The daemon's own log of its API requests: a tower layer on each role's
//! client counts every request with its outcome and latency, per kind
//! (Lease renewals, node status writes, everything), and puts each write
//! (POST, PUT, PATCH, DELETE) on the timeline. `keelson diagnose node`
//! reads from it when the last Lease renewal succeeded, how many failed
//! since and why, and how long the API server takes to answer. Watches are
//! counted when their response starts.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::{Duration, Instant, SystemTime};

use http::{Method, Request, Response};
use tower::{Layer, Service};

use super::timeline::{ObjectKey, Timeline, rfc3339};
use super::types::{ApiCallStats, RecordSource};

/// Latencies kept per kind of request for the recent maximum.
const RECENT: usize = 32;

/// What a request is, for the statistics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CallKind {
    /// Any request of the role.
    All,
    /// The node Lease (`kube-node-lease`).
    Lease,
    /// `nodes/<name>/status`.
    NodeStatus,
}

#[derive(Debug, Default)]
struct Stats {
    requests: u64,
    failures: u64,
    consecutive_failures: u64,
    last_success: Option<SystemTime>,
    last_attempt: Option<SystemTime>,
    last_failure: Option<SystemTime>,
    last_error: Option<String>,
    last_latency: Option<Duration>,
    recent: VecDeque<Duration>,
}

impl Stats {
    fn add(&mut self, at: SystemTime, latency: Duration, error: Option<&str>) {
        self.requests += 1;
        self.last_attempt = Some(at);
        match error {
            None => {
                self.last_success = Some(at);
                self.consecutive_failures = 0;
                self.last_latency = Some(latency);
                if self.recent.len() >= RECENT {
                    self.recent.pop_front();
                }
                self.recent.push_back(latency);
            }
            Some(e) => {
                self.failures += 1;
                self.consecutive_failures += 1;
                self.last_failure = Some(at);
                self.last_error = Some(e.to_string());
            }
        }
    }

    fn view(&self) -> ApiCallStats {
        let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        ApiCallStats {
            requests: self.requests,
            failures: self.failures,
            last_success: self.last_success.map(rfc3339),
            last_attempt: self.last_attempt.map(rfc3339),
            last_failure: self.last_failure.map(rfc3339),
            last_error: self.last_error.clone(),
            consecutive_failures: self.consecutive_failures,
            last_latency_ms: self.last_latency.map(ms),
            max_recent_latency_ms: self.recent.iter().max().copied().map(ms),
        }
    }
}

/// The log; cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct ApiLog {
    stats: Arc<Mutex<HashMap<(String, CallKind), Stats>>>,
    timeline: Option<Timeline>,
}

/// A request's path, split into what the API conventions put there.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResourcePath {
    /// Namespace (empty for cluster-scoped objects).
    pub namespace: String,
    /// Resource plural (`pods`).
    pub resource: String,
    /// Object name (empty for collections).
    pub name: String,
    /// Subresource (`status`).
    pub subresource: String,
}

/// Splits `/api/v1/namespaces/ns/pods/x/status` and
/// `/apis/group/version/...` paths.
pub fn parse_path(path: &str) -> ResourcePath {
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let rest: &[&str] = match parts.first() {
        Some(&"api") => parts.get(2..).unwrap_or_default(),
        Some(&"apis") => parts.get(3..).unwrap_or_default(),
        _ => return ResourcePath::default(),
    };
    let (namespace, rest) = match rest {
        ["namespaces", ns, tail @ ..] if !tail.is_empty() => (ns.to_string(), tail),
        other => (String::new(), other),
    };
    ResourcePath {
        namespace,
        resource: rest.first().map(|s| s.to_string()).unwrap_or_default(),
        name: rest.get(1).map(|s| s.to_string()).unwrap_or_default(),
        subresource: rest.get(2).map(|s| s.to_string()).unwrap_or_default(),
    }
}

/// The kind of a resource plural, for the timeline.
fn kind_of(resource: &str) -> String {
    match resource {
        "pods" => "Pod".into(),
        "nodes" => "Node".into(),
        "leases" => "Lease".into(),
        "services" => "Service".into(),
        "events" => "Event".into(),
        "serviceaccounts" => "ServiceAccount".into(),
        "certificatesigningrequests" => "CertificateSigningRequest".into(),
        other => other.to_string(),
    }
}

fn classify(p: &ResourcePath) -> Option<CallKind> {
    match (p.resource.as_str(), p.subresource.as_str()) {
        ("leases", _) if p.namespace == "kube-node-lease" => Some(CallKind::Lease),
        ("nodes", "status") => Some(CallKind::NodeStatus),
        _ => None,
    }
}

/// Whether an answer counts as a failure: no answer, a server error, or a
/// refusal (401, 403, 429). Not-found and conflicts are ordinary answers.
fn failure_of(status: u16) -> Option<String> {
    match status {
        401 | 403 | 429 | 500..=599 => Some(format!(
            "HTTP {status} {}",
            http::StatusCode::from_u16(status)
                .ok()
                .and_then(|s| s.canonical_reason())
                .unwrap_or_default()
        )),
        _ => None,
    }
}

impl ApiLog {
    /// A log that also puts writes on `timeline`.
    pub fn new(timeline: Option<Timeline>) -> ApiLog {
        ApiLog {
            stats: Arc::default(),
            timeline,
        }
    }

    /// The layer for one role's client (`node`, `proxy`).
    pub fn layer(&self, role: &str) -> ApiLogLayer {
        ApiLogLayer {
            log: self.clone(),
            role: role.to_string(),
        }
    }

    /// Records one request's outcome (`status` 0: no answer, see `error`).
    pub fn observe(
        &self,
        role: &str,
        method: &Method,
        path: &str,
        status: u16,
        error: Option<&str>,
        latency: Duration,
    ) {
        let at = SystemTime::now();
        let p = parse_path(path);
        let failure = match error {
            Some(e) => Some(e.to_string()),
            None => failure_of(status),
        };
        {
            let mut stats = self.stats.lock().unwrap_or_else(PoisonError::into_inner);
            stats
                .entry((role.to_string(), CallKind::All))
                .or_default()
                .add(at, latency, failure.as_deref());
            if let Some(kind) = classify(&p) {
                stats.entry((role.to_string(), kind)).or_default().add(
                    at,
                    latency,
                    failure.as_deref(),
                );
            }
        }
        let write = matches!(
            *method,
            Method::POST | Method::PUT | Method::PATCH | Method::DELETE
        );
        // Events are on the timeline as recorded; a renewed Lease every 10 s
        // would drown everything else (its failures are kept).
        let routine =
            p.resource == "events" || (classify(&p) == Some(CallKind::Lease) && failure.is_none());
        if let Some(t) = &self.timeline
            && write
            && !routine
        {
            let what = if p.subresource.is_empty() {
                p.resource.clone()
            } else {
                format!("{}/{}", p.resource, p.subresource)
            };
            let outcome = match (&failure, status) {
                (Some(e), _) => format!("failed: {e}"),
                (None, s) => format!("HTTP {s}"),
            };
            t.record_at(
                at,
                RecordSource::ApiWrite,
                ObjectKey {
                    kind: kind_of(&p.resource),
                    namespace: p.namespace.clone(),
                    name: p.name.clone(),
                    uid: String::new(),
                    field_path: String::new(),
                },
                if failure.is_some() { "failed" } else { "ok" },
                method.as_str(),
                &format!(
                    "{method} {what} by the {role} role: {outcome} in {} ms",
                    latency.as_millis()
                ),
            );
        }
    }

    /// The statistics of one kind of request of a role.
    pub fn stats(&self, role: &str, kind: CallKind) -> ApiCallStats {
        self.stats
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&(role.to_string(), kind))
            .map(Stats::view)
            .unwrap_or_default()
    }
}

/// Tower layer recording into an [`ApiLog`].
#[derive(Debug, Clone)]
pub struct ApiLogLayer {
    log: ApiLog,
    role: String,
}

impl<S> Layer<S> for ApiLogLayer {
    type Service = Logged<S>;
    fn layer(&self, inner: S) -> Self::Service {
        Logged {
            inner,
            log: self.log.clone(),
            role: self.role.clone(),
        }
    }
}

/// A service whose requests are logged.
#[derive(Debug, Clone)]
pub struct Logged<S> {
    inner: S,
    log: ApiLog,
    role: String,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;
type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl<S, B, RB> Service<Request<B>> for Logged<S>
where
    S: Service<Request<B>, Response = Response<RB>>,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
{
    type Response = Response<RB>;
    type Error = BoxError;
    type Future = BoxFuture<Result<Response<RB>, BoxError>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let method = req.method().clone();
        let path = req.uri().path().to_string();
        let log = self.log.clone();
        let role = self.role.clone();
        let start = Instant::now();
        let fut = self.inner.call(req);
        Box::pin(async move {
            let res = fut.await.map_err(Into::into);
            let latency = start.elapsed();
            match &res {
                Ok(r) => log.observe(&role, &method, &path, r.status().as_u16(), None, latency),
                Err(e) => {
                    // The whole chain: "connection refused" is at the bottom.
                    let text = crate::error_chain::error_chain(e.as_ref());
                    log.observe(&role, &method, &path, 0, Some(&text), latency)
                }
            }
            res
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::introspection::timeline::Filter;

    #[test]
    fn paths_split_as_the_api_lays_them_out() {
        assert_eq!(
            parse_path("/api/v1/namespaces/default/pods/web/status"),
            ResourcePath {
                namespace: "default".into(),
                resource: "pods".into(),
                name: "web".into(),
                subresource: "status".into(),
            }
        );
        assert_eq!(
            parse_path("/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/n1"),
            ResourcePath {
                namespace: "kube-node-lease".into(),
                resource: "leases".into(),
                name: "n1".into(),
                subresource: String::new(),
            }
        );
        assert_eq!(parse_path("/api/v1/nodes/n1/status").resource, "nodes");
        assert_eq!(parse_path("/api/v1/namespaces").resource, "namespaces");
        assert_eq!(parse_path("/version"), ResourcePath::default());
    }

    #[test]
    fn lease_failures_count_until_a_success_and_writes_reach_the_timeline() {
        let timeline = Timeline::default();
        let log = ApiLog::new(Some(timeline.clone()));
        let lease = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/n1";
        let ms = Duration::from_millis;
        log.observe("node", &Method::PUT, lease, 200, None, ms(5));
        log.observe(
            "node",
            &Method::PUT,
            lease,
            0,
            Some("connection refused"),
            ms(1),
        );
        log.observe("node", &Method::PUT, lease, 503, None, ms(7));
        let s = log.stats("node", CallKind::Lease);
        assert_eq!((s.requests, s.failures, s.consecutive_failures), (3, 2, 2));
        assert_eq!(
            s.last_error.as_deref(),
            Some("HTTP 503 Service Unavailable")
        );
        assert_eq!(s.last_latency_ms, Some(5));
        assert!(s.last_success.is_some());
        log.observe("node", &Method::GET, lease, 404, None, ms(2));
        let s = log.stats("node", CallKind::Lease);
        assert_eq!(s.consecutive_failures, 0, "a 404 is an answer");
        assert_eq!(log.stats("node", CallKind::All).requests, 4);
        assert_eq!(log.stats("proxy", CallKind::All).requests, 0);
        // Failed renewals are on the timeline, the successful one is not.
        let leases = timeline.query(&Filter {
            kind: Some("Lease".into()),
            ..Filter::default()
        });
        assert_eq!(leases.len(), 2, "{leases:?}");
        assert!(
            leases[0].message.contains("connection refused"),
            "{leases:?}"
        );
        log.observe(
            "node",
            &Method::PATCH,
            "/api/v1/namespaces/default/pods/web/status",
            200,
            None,
            ms(3),
        );
        let pod = timeline.query(&Filter {
            name: Some("web".into()),
            ..Filter::default()
        });
        assert_eq!(pod.len(), 1);
        assert_eq!(pod[0].kind, "Pod");
        assert_eq!(pod[0].reason, "PATCH");
        assert_eq!(
            pod[0].message,
            "PATCH pods/status by the node role: HTTP 200 in 3 ms"
        );
    }
}
