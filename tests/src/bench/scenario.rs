//! The benchmark's objects: N Services × M endpoints, their API objects
//! and the changes of the churn phase. Pure and deterministic (seeded), so
//! every contestant is fed the same kind of load.
//!
//! Endpoint addresses live in per-backend blocks: backend `b` owns
//! `10.(128+b).0.0/16` and answers on every address of it (an `AnyIP`
//! local route in its namespace), so a handful of backend namespaces
//! serve hundreds of thousands of distinct endpoints.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};

use super::agent::Target;
use super::error::{BenchError, Result};

/// The Services' port.
pub const SERVICE_PORT: u16 = 80;
/// The endpoints' port (where the backends listen).
pub const TARGET_PORT: u16 = 8080;
/// Second octet of backend 0's address block.
pub const FIRST_BLOCK_OCTET: u8 = 128;
/// Most backend namespaces (blocks 10.128/16 … 10.191/16).
pub const MAX_BACKENDS: u8 = 64;
/// Addresses used per /24 of a block (.1 … .254).
const HOSTS_PER_24: u32 = 254;
/// Endpoint addresses per backend block.
pub const ADDRS_PER_BACKEND: u32 = 256 * HOSTS_PER_24;
/// Label put on every object the benchmark creates.
pub const MANAGED_BY: &str = "keelson-bench";
/// The EndpointSlice annotation kube-proxy's programming-latency metric reads.
pub const TRIGGER_TIME_ANNOTATION: &str = "endpoints.kubernetes.io/last-change-trigger-time";

/// The address block of backend `b`.
pub fn backend_block(b: u8) -> ipnet::Ipv4Net {
    // A /16 with a valid prefix length cannot fail.
    ipnet::Ipv4Net::new(Ipv4Addr::new(10, FIRST_BLOCK_OCTET + b, 0, 0), 16)
        .unwrap_or_else(|_| ipnet::Ipv4Net::default())
}

/// Hands out endpoint addresses round-robin over the backends, never twice.
#[derive(Debug, Clone)]
pub struct EndpointAddrs {
    backends: u8,
    next: u64,
}

impl EndpointAddrs {
    /// An allocator over `backends` blocks (1 ..= [`MAX_BACKENDS`]).
    pub fn new(backends: u8) -> Result<EndpointAddrs> {
        if backends == 0 || backends > MAX_BACKENDS {
            return Err(BenchError::Invalid(format!(
                "backends must be 1..={MAX_BACKENDS}, got {backends}"
            )));
        }
        Ok(EndpointAddrs { backends, next: 0 })
    }

    /// How many addresses can be handed out in total.
    pub fn capacity(&self) -> u64 {
        u64::from(self.backends) * u64::from(ADDRS_PER_BACKEND)
    }

    /// How many were handed out.
    pub fn used(&self) -> u64 {
        self.next
    }

    /// The address with global index `k`, if within capacity.
    pub fn addr(&self, k: u64) -> Option<Ipv4Addr> {
        if k >= self.capacity() {
            return None;
        }
        let b = (k % u64::from(self.backends)) as u8;
        let offset = (k / u64::from(self.backends)) as u32;
        let third = (offset / HOSTS_PER_24) as u8;
        let fourth = (offset % HOSTS_PER_24 + 1) as u8;
        Some(Ipv4Addr::new(10, FIRST_BLOCK_OCTET + b, third, fourth))
    }

    /// A fresh address.
    pub fn next_addr(&mut self) -> Result<Ipv4Addr> {
        let a = self.addr(self.next).ok_or_else(|| {
            BenchError::Invalid(format!(
                "out of endpoint addresses ({} used); raise --backends",
                self.next
            ))
        })?;
        self.next += 1;
        Ok(a)
    }

    /// Which backend serves `ip`.
    pub fn backend_of(&self, ip: Ipv4Addr) -> Option<u8> {
        let o = ip.octets();
        (o[0] == 10 && o[1] >= FIRST_BLOCK_OCTET && o[1] - FIRST_BLOCK_OCTET < self.backends)
            .then(|| o[1] - FIRST_BLOCK_OCTET)
    }
}

/// Backends needed for `endpoints` addresses, with headroom for churn.
pub fn backends_needed(endpoints: u64, at_least: u8) -> u8 {
    let with_headroom = endpoints + endpoints / 4 + 1000;
    let needed = with_headroom.div_ceil(u64::from(ADDRS_PER_BACKEND));
    (needed.min(u64::from(MAX_BACKENDS)) as u8)
        .max(at_least)
        .max(1)
}

/// One Service of the scenario and its endpoints as last written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceEntry {
    /// Service name (its EndpointSlice is `<name>-kb`).
    pub name: String,
    /// ClusterIP allocated by the API server, once created.
    pub cluster_ip: Option<Ipv4Addr>,
    /// Current endpoint addresses (all ready).
    pub endpoints: Vec<Ipv4Addr>,
}

impl ServiceEntry {
    /// The EndpointSlice's name.
    pub fn slice_name(&self) -> String {
        format!("{}-kb", self.name)
    }

    /// A probe target: the VIP, expecting one of the current endpoints.
    pub fn target(&self) -> Option<Target> {
        Some(Target {
            addr: SocketAddr::new(IpAddr::V4(self.cluster_ip?), SERVICE_PORT),
            expect: self.endpoints.iter().map(|ip| IpAddr::V4(*ip)).collect(),
        })
    }

    /// Direct targets: each endpoint address (for the no-proxy baseline).
    pub fn direct_targets(&self) -> Vec<Target> {
        self.endpoints
            .iter()
            .map(|ip| Target {
                addr: SocketAddr::new(IpAddr::V4(*ip), TARGET_PORT),
                expect: vec![IpAddr::V4(*ip)],
            })
            .collect()
    }
}

fn labels() -> Value {
    json!({"app.kubernetes.io/managed-by": MANAGED_BY})
}

/// The Service object (ClusterIP, TCP port 80 → 8080, no selector: its
/// EndpointSlice is written by the benchmark, as for any selector-less
/// Service, so a real cluster's controllers leave it alone).
pub fn service_object(svc: &ServiceEntry, namespace: &str) -> Result<Service> {
    serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": svc.name, "namespace": namespace, "labels": labels()},
        "spec": {
            "type": "ClusterIP",
            "ports": [{"port": SERVICE_PORT, "targetPort": TARGET_PORT, "protocol": "TCP"}]
        }
    }))
    .map_err(|e| BenchError::Invalid(format!("building Service {}: {e}", svc.name)))
}

fn endpoints_json(endpoints: &[Ipv4Addr]) -> Value {
    Value::Array(
        endpoints
            .iter()
            .map(|ip| {
                json!({
                    "addresses": [ip.to_string()],
                    "conditions": {"ready": true, "serving": true, "terminating": false}
                })
            })
            .collect(),
    )
}

/// The Service's EndpointSlice with its current endpoints.
pub fn slice_object(
    svc: &ServiceEntry,
    namespace: &str,
    trigger_time: &str,
) -> Result<EndpointSlice> {
    serde_json::from_value(json!({
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": svc.slice_name(),
            "namespace": namespace,
            "labels": {
                "kubernetes.io/service-name": svc.name,
                "endpointslice.kubernetes.io/managed-by": "keelson-bench.keelson.dev",
                "app.kubernetes.io/managed-by": MANAGED_BY,
            },
            "annotations": {TRIGGER_TIME_ANNOTATION: trigger_time}
        },
        "addressType": "IPv4",
        "endpoints": endpoints_json(&svc.endpoints),
        "ports": [{"port": TARGET_PORT, "protocol": "TCP"}]
    }))
    .map_err(|e| BenchError::Invalid(format!("building EndpointSlice {}: {e}", svc.slice_name())))
}

/// JSON merge patch replacing a slice's endpoints (and its trigger time).
pub fn endpoints_patch(endpoints: &[Ipv4Addr], trigger_time: &str) -> Value {
    json!({
        "metadata": {"annotations": {TRIGGER_TIME_ANNOTATION: trigger_time}},
        "endpoints": endpoints_json(endpoints)
    })
}

/// Settings of a [`Scenario`].
#[derive(Debug, Clone)]
pub struct ScenarioConfig {
    /// Namespace of every object.
    pub namespace: String,
    /// Endpoints per Service (M).
    pub endpoints_per_service: usize,
    /// Backend namespaces.
    pub backends: u8,
    /// Seed of the change generator.
    pub seed: u64,
}

/// The Services and their endpoints, plus the change generator.
#[derive(Debug, Clone)]
pub struct Scenario {
    config: ScenarioConfig,
    services: Vec<ServiceEntry>,
    addrs: EndpointAddrs,
    rng: StdRng,
    extra: u64,
}

impl Scenario {
    /// An empty scenario.
    pub fn new(config: ScenarioConfig) -> Result<Scenario> {
        if config.endpoints_per_service == 0 {
            return Err(BenchError::Invalid(
                "endpoints per Service must be ≥ 1".into(),
            ));
        }
        Ok(Scenario {
            addrs: EndpointAddrs::new(config.backends)?,
            rng: StdRng::seed_from_u64(config.seed),
            config,
            services: Vec::new(),
            extra: 0,
        })
    }

    /// Settings.
    pub fn config(&self) -> &ScenarioConfig {
        &self.config
    }

    /// The address allocator (which backend owns which address).
    pub fn addrs(&self) -> &EndpointAddrs {
        &self.addrs
    }

    /// Services so far.
    pub fn services(&self) -> &[ServiceEntry] {
        &self.services
    }

    /// Service `i`.
    pub fn service(&self, i: usize) -> Option<&ServiceEntry> {
        self.services.get(i)
    }

    /// Adds Services up to `n` in total, each with M fresh endpoints;
    /// returns the indices added.
    pub fn grow_to(&mut self, n: usize) -> Result<std::ops::Range<usize>> {
        let start = self.services.len();
        for i in start..n {
            let endpoints = self.fresh(self.config.endpoints_per_service)?;
            self.services.push(ServiceEntry {
                name: format!("svc-{i:05}"),
                cluster_ip: None,
                endpoints,
            });
        }
        Ok(start..self.services.len().max(start))
    }

    /// A Service outside the N (for the "one new Service" measurement),
    /// with M fresh endpoints.
    pub fn extra_service(&mut self, prefix: &str) -> Result<ServiceEntry> {
        self.extra += 1;
        Ok(ServiceEntry {
            name: format!("{prefix}-{}", self.extra),
            cluster_ip: None,
            endpoints: self.fresh(self.config.endpoints_per_service)?,
        })
    }

    fn fresh(&mut self, n: usize) -> Result<Vec<Ipv4Addr>> {
        (0..n).map(|_| self.addrs.next_addr()).collect()
    }

    /// Records the ClusterIP the API server gave Service `i`.
    pub fn set_cluster_ip(&mut self, i: usize, ip: Ipv4Addr) {
        if let Some(s) = self.services.get_mut(i) {
            s.cluster_ip = Some(ip);
        }
    }

    /// A churn change: one endpoint of Service `i`, chosen at random, is
    /// replaced by a fresh address. Returns the new endpoint list.
    pub fn replace_one(&mut self, i: usize) -> Result<Vec<Ipv4Addr>> {
        let fresh = self.addrs.next_addr()?;
        let svc = self
            .services
            .get_mut(i)
            .ok_or_else(|| BenchError::Invalid(format!("no Service {i}")))?;
        let slot = self.rng.random_range(0..svc.endpoints.len());
        svc.endpoints[slot] = fresh;
        Ok(svc.endpoints.clone())
    }

    /// A probed change: every endpoint of Service `i` is replaced by a fresh
    /// address (one slice write, like after a rollout), so the first new
    /// connection routed by the new state lands on a new endpoint whatever
    /// backend the proxy picks. Returns the new endpoint list.
    pub fn replace_all(&mut self, i: usize) -> Result<Vec<Ipv4Addr>> {
        let m = self.config.endpoints_per_service;
        let fresh = self.fresh(m)?;
        let svc = self
            .services
            .get_mut(i)
            .ok_or_else(|| BenchError::Invalid(format!("no Service {i}")))?;
        svc.endpoints = fresh;
        Ok(svc.endpoints.clone())
    }

    /// A random index in `range` (empty range: its start).
    pub fn pick(&mut self, range: std::ops::Range<usize>) -> usize {
        if range.is_empty() {
            return range.start;
        }
        self.rng.random_range(range)
    }

    /// `k` distinct random indices below `n`, always including the first
    /// and the last (a sample of VIPs to check).
    pub fn sample(&mut self, n: usize, k: usize) -> Vec<usize> {
        if k >= n {
            return (0..n).collect();
        }
        let mut chosen = std::collections::BTreeSet::new();
        chosen.insert(0);
        chosen.insert(n - 1);
        while chosen.len() < k.max(2).min(n) {
            chosen.insert(self.rng.random_range(0..n));
        }
        chosen.into_iter().collect()
    }

    /// Endpoint count per backend (how many addresses each one serves).
    pub fn endpoints_per_backend(&self) -> BTreeMap<u8, usize> {
        let mut m = BTreeMap::new();
        for s in &self.services {
            for ip in &s.endpoints {
                if let Some(b) = self.addrs.backend_of(*ip) {
                    *m.entry(b).or_insert(0) += 1;
                }
            }
        }
        m
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scenario(m: usize, backends: u8) -> Scenario {
        Scenario::new(ScenarioConfig {
            namespace: "ns".into(),
            endpoints_per_service: m,
            backends,
            seed: 7,
        })
        .expect("scenario")
    }

    #[test]
    fn addresses_are_unique_valid_hosts_spread_over_backends() {
        let mut a = EndpointAddrs::new(3).expect("alloc");
        let mut seen = std::collections::HashSet::new();
        for k in 0..3000 {
            let ip = a.next_addr().expect("addr");
            let o = ip.octets();
            assert!(o[3] >= 1 && o[3] <= 254, "{ip}");
            assert_eq!(a.backend_of(ip), Some((k % 3) as u8));
            assert!(backend_block((k % 3) as u8).contains(&ip));
            assert!(seen.insert(ip), "{ip} handed out twice");
        }
        assert_eq!(a.used(), 3000);
        assert_eq!(a.addr(a.capacity()), None);
        let last = a.addr(a.capacity() - 1).expect("last");
        assert_eq!(last, Ipv4Addr::new(10, 130, 255, 254));
        assert!(EndpointAddrs::new(0).is_err());
        assert!(EndpointAddrs::new(MAX_BACKENDS + 1).is_err());
    }

    #[test]
    fn allocator_reports_exhaustion() {
        let mut a = EndpointAddrs::new(1).expect("alloc");
        a.next = a.capacity();
        assert!(a.next_addr().is_err());
    }

    #[test]
    fn backends_needed_covers_endpoints_with_headroom() {
        assert_eq!(backends_needed(100, 2), 2);
        assert_eq!(backends_needed(100_000, 1), 2);
        assert_eq!(backends_needed(300_000, 4), 6);
        assert_eq!(backends_needed(u64::MAX / 2, 1), MAX_BACKENDS);
    }

    #[test]
    fn grow_and_changes() {
        let mut s = scenario(3, 2);
        assert_eq!(s.grow_to(5).expect("grow"), 0..5);
        assert_eq!(s.grow_to(4).expect("no shrink"), 5..5);
        assert_eq!(s.grow_to(7).expect("grow"), 5..7);
        assert_eq!(s.services()[6].name, "svc-00006");
        assert_eq!(s.services()[6].slice_name(), "svc-00006-kb");
        let before = s.services()[2].endpoints.clone();
        let after = s.replace_one(2).expect("one");
        let changed = before.iter().zip(&after).filter(|(a, b)| a != b).count();
        assert_eq!(changed, 1);
        let all = s.replace_all(2).expect("all");
        assert!(all.iter().all(|ip| !after.contains(ip)));
        assert_eq!(all.len(), 3);
        let per_backend: usize = s.endpoints_per_backend().values().sum();
        assert_eq!(per_backend, 21);
        assert!(s.replace_one(99).is_err());
    }

    #[test]
    fn same_seed_same_changes() {
        let run = || {
            let mut s = scenario(4, 2);
            s.grow_to(50).expect("grow");
            (0..20)
                .map(|_| {
                    let i = s.pick(0..50);
                    s.replace_one(i).expect("change")
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(run(), run());
    }

    #[test]
    fn samples_include_first_and_last() {
        let mut s = scenario(1, 1);
        let k = s.sample(1000, 10);
        assert_eq!(k.len(), 10);
        assert_eq!(k[0], 0);
        assert_eq!(k[9], 999);
        assert_eq!(s.sample(5, 10), vec![0, 1, 2, 3, 4]);
    }

    #[test]
    fn objects_and_targets() {
        let mut s = scenario(2, 1);
        s.grow_to(1).expect("grow");
        assert!(s.services()[0].target().is_none(), "no ClusterIP yet");
        s.set_cluster_ip(0, Ipv4Addr::new(10, 96, 0, 10));
        let svc = &s.services()[0];
        let t = svc.target().expect("target");
        assert_eq!(t.addr, "10.96.0.10:80".parse().expect("addr"));
        assert_eq!(t.expect.len(), 2);
        let o = service_object(svc, "ns").expect("service");
        let spec = o.spec.expect("spec");
        assert_eq!(spec.selector, None);
        assert_eq!(spec.ports.expect("ports")[0].port, 80);
        let sl = slice_object(svc, "ns", "2025-01-01T00:00:00Z").expect("slice");
        assert_eq!(sl.endpoints.as_ref().map(Vec::len), Some(2));
        assert_eq!(
            sl.metadata.labels.expect("labels")["kubernetes.io/service-name"],
            "svc-00000"
        );
        assert_eq!(sl.ports.expect("ports")[0].port, Some(8080));
        let p = endpoints_patch(&svc.endpoints, "t");
        assert_eq!(p["endpoints"].as_array().map(Vec::len), Some(2));
        assert_eq!(p["metadata"]["annotations"][TRIGGER_TIME_ANNOTATION], "t");
        let d = svc.direct_targets();
        assert_eq!(d[0].addr.port(), TARGET_PORT);
        let extra = s.extra_service("add").expect("extra");
        assert_eq!(extra.name, "add-1");
        assert_eq!(s.services().len(), 1);
    }
}
