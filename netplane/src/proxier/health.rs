//! Health of the proxy role, as kube-proxy reports it.
//!
//! - [`ProxyHealth`]: `/healthz` and `/livez` (healthzBindAddress, default
//!   `0.0.0.0:10256`). A family is unhealthy when an update has been queued
//!   for longer than `healthTimeout` (2 × syncPeriod) without a successful
//!   sync; `/healthz` is also 503 while the node is being deleted or carries
//!   the cluster-autoscaler's `ToBeDeletedByClusterAutoscaler` taint.
//! - [`ServiceHealthServer`]: one HTTP listener per LoadBalancer Service with
//!   `externalTrafficPolicy: Local`, on its `healthCheckNodePort`, answering
//!   200 when the node has a local ready endpoint and the proxy is healthy,
//!   503 otherwise, with kube-proxy's JSON body.

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use super::http::{Handler, ServerHandle, json_response, serve};
use super::metrics::ProxyMetrics;
use crate::model::{IpFamily, NamespacedName};

/// Taint the cluster autoscaler puts on nodes it is about to delete.
pub const TO_BE_DELETED_TAINT: &str = "ToBeDeletedByClusterAutoscaler";

#[derive(Debug, Default)]
struct HealthState {
    last_updated: BTreeMap<IpFamily, SystemTime>,
    oldest_pending: BTreeMap<IpFamily, SystemTime>,
    node_eligible: bool,
}

/// The proxier's health (shared, cheap to clone).
#[derive(Debug, Clone)]
pub struct ProxyHealth {
    state: Arc<Mutex<HealthState>>,
    timeout: Duration,
    metrics: Option<ProxyMetrics>,
}

/// Go's `time.Time.String()` for a UTC time (kube-proxy's JSON uses it).
pub fn go_time_string(t: SystemTime) -> String {
    let ts = jiff::Timestamp::try_from(t).unwrap_or(jiff::Timestamp::UNIX_EPOCH);
    let base = ts.strftime("%Y-%m-%d %H:%M:%S").to_string();
    let nanos = ts.subsec_nanosecond();
    let frac = if nanos == 0 {
        String::new()
    } else {
        let s = format!(".{nanos:09}");
        s.trim_end_matches('0').to_string()
    };
    format!("{base}{frac} +0000 UTC")
}

impl ProxyHealth {
    /// `timeout` is kube-proxy's healthTimeout (2 × syncPeriod).
    pub fn new(timeout: Duration, metrics: Option<ProxyMetrics>) -> Self {
        ProxyHealth {
            state: Arc::new(Mutex::new(HealthState {
                node_eligible: true,
                ..Default::default()
            })),
            timeout,
            metrics,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HealthState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A successful sync of `family`.
    pub fn updated(&self, family: IpFamily) {
        let mut s = self.lock();
        s.oldest_pending.remove(&family);
        s.last_updated.insert(family, SystemTime::now());
    }

    /// A change for `family` was queued.
    pub fn queued_update(&self, family: IpFamily) {
        let mut s = self.lock();
        s.oldest_pending
            .entry(family)
            .or_insert_with(SystemTime::now);
    }

    /// Records the node's state: ineligible while being deleted or tainted
    /// `ToBeDeletedByClusterAutoscaler`.
    pub fn sync_node(&self, deleting: bool, taints: &[String]) {
        let mut s = self.lock();
        s.node_eligible = !deleting && !taints.iter().any(|t| t == TO_BE_DELETED_TAINT);
    }

    /// The proxier's health ignoring the node's state, and the last update.
    pub fn is_healthy_at(&self, now: SystemTime) -> (bool, Option<SystemTime>) {
        let s = self.lock();
        let mut last: Option<SystemTime> = None;
        for (family, updated) in &s.last_updated {
            if last.is_none_or(|l| *updated > l) {
                last = Some(*updated);
            }
            let Some(pending) = s.oldest_pending.get(family) else {
                continue;
            };
            if now.duration_since(*pending).unwrap_or_default() < self.timeout {
                continue;
            }
            return (false, Some(*updated));
        }
        (true, last)
    }

    /// The proxier's health.
    pub fn is_healthy(&self) -> bool {
        self.is_healthy_at(SystemTime::now()).0
    }

    /// Whether the node is eligible.
    pub fn node_eligible(&self) -> bool {
        self.lock().node_eligible
    }

    /// The `/healthz` response: status and body.
    pub fn healthz(&self) -> (u16, String) {
        let now = SystemTime::now();
        let eligible = self.node_eligible();
        let (healthy, last) = self.is_healthy_at(now);
        let healthy = healthy && eligible;
        let code = if healthy { 200 } else { 503 };
        if let Some(m) = &self.metrics {
            m.healthz_total
                .with_label_values(&[&code.to_string()])
                .inc();
        }
        let last = if healthy {
            now
        } else {
            last.unwrap_or(SystemTime::UNIX_EPOCH)
        };
        let body = format!(
            r#"{{"lastUpdated": "{}","currentTime": "{}", "nodeEligible": {}}}"#,
            go_time_string(last),
            go_time_string(now),
            eligible
        );
        (code, body)
    }

    /// The `/livez` response.
    pub fn livez(&self) -> (u16, String) {
        let now = SystemTime::now();
        let (healthy, last) = self.is_healthy_at(now);
        let code = if healthy { 200 } else { 503 };
        if let Some(m) = &self.metrics {
            m.livez_total.with_label_values(&[&code.to_string()]).inc();
        }
        let last = if healthy {
            now
        } else {
            last.unwrap_or(SystemTime::UNIX_EPOCH)
        };
        let body = format!(
            r#"{{"lastUpdated": "{}","currentTime": "{}"}}"#,
            go_time_string(last),
            go_time_string(now)
        );
        (code, body)
    }

    /// Serves `/healthz` and `/livez` on `listener` (404 elsewhere).
    pub fn serve(&self, listener: tokio::net::TcpListener) -> ServerHandle {
        let me = self.clone();
        let handler: Handler = Arc::new(move |req| {
            let (code, body) = match req.uri().path() {
                "/healthz" => me.healthz(),
                "/livez" => me.livez(),
                _ => (404, "404 page not found\n".to_string()),
            };
            json_response(code, body)
        });
        serve(listener, handler)
    }
}

/// Opens listening sockets for health-check node ports (kube-proxy's
/// `listener`): the default binds in the calling thread's network namespace;
/// tests bind inside the namespace they created.
pub trait Listen: Send + Sync {
    /// Binds a TCP listener.
    fn listen(&self, addr: SocketAddr) -> std::io::Result<std::net::TcpListener>;
}

/// Binds with `std::net::TcpListener::bind`.
#[derive(Debug, Clone, Copy, Default)]
pub struct StdListen;

impl Listen for StdListen {
    fn listen(&self, addr: SocketAddr) -> std::io::Result<std::net::TcpListener> {
        std::net::TcpListener::bind(addr)
    }
}

struct Instance {
    port: u16,
    _servers: Vec<ServerHandle>,
}

/// The body of a health-check node port response, exactly as kube-proxy
/// writes it.
pub fn service_health_body(
    svc: &NamespacedName,
    local_endpoints: usize,
    proxy_healthy: bool,
) -> String {
    format!(
        "{{\n\t\"service\": {{\n\t\t\"namespace\": \"{}\",\n\t\t\"name\": \"{}\"\n\t}},\n\t\"localEndpoints\": {},\n\t\"serviceProxyHealthy\": {}\n}}",
        svc.namespace, svc.name, local_endpoints, proxy_healthy
    )
}

/// Health-check node port servers.
pub struct ServiceHealthServer {
    listen: Box<dyn Listen>,
    addresses: Vec<IpAddr>,
    health: ProxyHealth,
    counts: Arc<Mutex<HashMap<NamespacedName, usize>>>,
    instances: HashMap<NamespacedName, Instance>,
}

impl std::fmt::Debug for ServiceHealthServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceHealthServer")
            .field("addresses", &self.addresses)
            .field("services", &self.instances.len())
            .finish()
    }
}

/// A health-check port that could not be opened.
#[derive(Debug, thiserror::Error)]
#[error("failed to start healthcheck {service} on port {port}: {source}")]
pub struct ListenFailure {
    /// The Service.
    pub service: NamespacedName,
    /// The port.
    pub port: u16,
    /// Why.
    #[source]
    pub source: std::io::Error,
}

impl ServiceHealthServer {
    /// Listens on `addresses` (the NodePort addresses), or on all addresses
    /// when empty.
    pub fn new(listen: Box<dyn Listen>, addresses: Vec<IpAddr>, health: ProxyHealth) -> Self {
        ServiceHealthServer {
            listen,
            addresses,
            health,
            counts: Arc::new(Mutex::new(HashMap::new())),
            instances: HashMap::new(),
        }
    }

    /// Makes `services` (Service → health-check port) the open set: closes
    /// what is gone or moved, opens what is new. Returns the ports that
    /// could not be opened (kube-proxy emits a `FailedToStartServiceHealthcheck`
    /// event for each and retries on the next sync).
    pub fn sync_services(
        &mut self,
        services: &BTreeMap<NamespacedName, u16>,
    ) -> Vec<ListenFailure> {
        self.instances
            .retain(|nsn, inst| services.get(nsn) == Some(&inst.port));
        let mut failures = Vec::new();
        for (nsn, port) in services {
            if self.instances.contains_key(nsn) {
                continue;
            }
            let addrs: Vec<IpAddr> = if self.addresses.is_empty() {
                vec![IpAddr::V4(Ipv4Addr::UNSPECIFIED)]
            } else {
                self.addresses.clone()
            };
            let mut servers = Vec::new();
            let mut failed = None;
            for ip in addrs {
                let addr = SocketAddr::new(ip, *port);
                let listener = self.listen.listen(addr).and_then(|l| {
                    l.set_nonblocking(true)?;
                    tokio::net::TcpListener::from_std(l)
                });
                match listener {
                    Ok(l) => servers.push(serve(l, self.handler(nsn.clone()))),
                    Err(e) => {
                        failed = Some(e);
                        break;
                    }
                }
            }
            match failed {
                None => {
                    tracing::info!(service = %nsn, port, "opened healthcheck");
                    self.instances.insert(
                        nsn.clone(),
                        Instance {
                            port: *port,
                            _servers: servers,
                        },
                    );
                }
                Some(source) => {
                    tracing::error!(service = %nsn, port, error = %source, "failed to start healthcheck");
                    failures.push(ListenFailure {
                        service: nsn.clone(),
                        port: *port,
                        source,
                    });
                }
            }
        }
        failures
    }

    /// Sets the number of local ready endpoints per Service (absent = 0).
    pub fn sync_endpoints(&self, counts: HashMap<NamespacedName, usize>) {
        let mut c = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        *c = counts;
    }

    /// Services with an open health-check port.
    pub fn open_ports(&self) -> BTreeMap<NamespacedName, u16> {
        self.instances
            .iter()
            .map(|(k, v)| (k.clone(), v.port))
            .collect()
    }

    fn handler(&self, nsn: NamespacedName) -> Handler {
        let counts = self.counts.clone();
        let health = self.health.clone();
        Arc::new(move |_req| {
            let count = counts
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(&nsn)
                .copied()
                .unwrap_or(0);
            let healthy = health.is_healthy();
            let code = if count != 0 && healthy { 200 } else { 503 };
            json_response(code, service_health_body(&nsn, count, healthy))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_time_format() {
        let t = SystemTime::UNIX_EPOCH + Duration::new(1_709_294_400, 500_000_000);
        assert_eq!(go_time_string(t), "2024-03-01 12:00:00.5 +0000 UTC");
        let t = SystemTime::UNIX_EPOCH + Duration::new(1_709_294_400, 0);
        assert_eq!(go_time_string(t), "2024-03-01 12:00:00 +0000 UTC");
    }

    #[test]
    fn health_follows_queued_updates() {
        let h = ProxyHealth::new(Duration::from_secs(60), None);
        let t0 = SystemTime::now();
        assert!(h.is_healthy_at(t0).0, "healthy while starting up");
        h.updated(IpFamily::V4);
        h.queued_update(IpFamily::V4);
        assert!(
            h.is_healthy_at(t0 + Duration::from_secs(30)).0,
            "queued but not late"
        );
        assert!(
            !h.is_healthy_at(t0 + Duration::from_secs(61)).0,
            "queued and late"
        );
        h.updated(IpFamily::V4);
        assert!(h.is_healthy_at(t0 + Duration::from_secs(61)).0);
        h.sync_node(false, &[TO_BE_DELETED_TAINT.to_string()]);
        assert_eq!(h.healthz().0, 503);
        assert_eq!(h.livez().0, 200, "livez ignores the node");
        h.sync_node(false, &[]);
        assert_eq!(h.healthz().0, 200);
    }

    #[test]
    fn service_body_matches_kube_proxy() {
        let body = service_health_body(&NamespacedName::new("ns", "web"), 2, true);
        assert_eq!(
            body,
            "{\n\t\"service\": {\n\t\t\"namespace\": \"ns\",\n\t\t\"name\": \"web\"\n\t},\n\t\"localEndpoints\": 2,\n\t\"serviceProxyHealthy\": true\n}"
        );
    }
}
