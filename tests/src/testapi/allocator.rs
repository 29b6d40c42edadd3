//! ClusterIP and NodePort allocation for Services, as kube-apiserver's
//! allocators do: random free addresses from the service CIDR and random
//! free ports from 30000-32767, with conflicts reported as 422.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;

use ipnet::IpNet;
use rand::Rng;
use serde_json::Value;

/// Default service CIDR (kube-apiserver `--service-cluster-ip-range` default).
pub const DEFAULT_SERVICE_CIDR: &str = "10.96.0.0/12";
/// Default NodePort range (`--service-node-port-range`).
pub const NODE_PORT_RANGE: std::ops::RangeInclusive<u16> = 30000..=32767;

/// What one Service holds: cluster IPs and (port, protocol) node ports.
type Held = (Vec<IpAddr>, Vec<(u16, String)>);

/// Allocated cluster IPs and node ports, tracked per Service.
#[derive(Debug)]
pub struct Allocator {
    cidr: IpNet,
    ips: HashSet<IpAddr>,
    ports: HashSet<(u16, String)>,
    by_service: HashMap<(String, String), Held>,
}

impl Default for Allocator {
    fn default() -> Self {
        Allocator {
            cidr: DEFAULT_SERVICE_CIDR
                .parse()
                .unwrap_or_else(|_| IpNet::default()),
            ips: HashSet::new(),
            ports: HashSet::new(),
            by_service: HashMap::new(),
        }
    }
}

fn service_allocations(svc: &Value) -> Held {
    let ips = svc
        .pointer("/spec/clusterIPs")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str()?.parse::<IpAddr>().ok())
                .collect()
        })
        .unwrap_or_default();
    let mut ports: Vec<(u16, String)> = Vec::new();
    if let Some(list) = svc.pointer("/spec/ports").and_then(Value::as_array) {
        for p in list {
            if let Some(np) = p.get("nodePort").and_then(Value::as_u64) {
                let proto = p
                    .get("protocol")
                    .and_then(Value::as_str)
                    .unwrap_or("TCP")
                    .to_string();
                ports.push((np as u16, proto));
            }
        }
    }
    if let Some(hc) = svc
        .pointer("/spec/healthCheckNodePort")
        .and_then(Value::as_u64)
    {
        ports.push((hc as u16, "TCP".into()));
    }
    (ips, ports)
}

impl Allocator {
    /// Sets the service CIDR.
    pub fn set_cidr(&mut self, cidr: IpNet) {
        self.cidr = cidr;
    }

    /// The service CIDR.
    pub fn cidr(&self) -> IpNet {
        self.cidr
    }

    /// The first usable address (reserved for the `kubernetes` Service).
    pub fn first_ip(&self) -> Option<IpAddr> {
        self.cidr.hosts().next()
    }

    /// Records what a stored Service holds.
    pub fn set_service(&mut self, key: (String, String), svc: &Value) {
        self.release_service(&key);
        let (ips, ports) = service_allocations(svc);
        for ip in &ips {
            self.ips.insert(*ip);
        }
        for p in &ports {
            self.ports.insert(p.clone());
        }
        self.by_service.insert(key, (ips, ports));
    }

    /// Forgets a Service's allocations.
    pub fn release_service(&mut self, key: &(String, String)) {
        if let Some((ips, ports)) = self.by_service.remove(key) {
            for ip in ips {
                self.ips.remove(&ip);
            }
            for p in ports {
                self.ports.remove(&p);
            }
        }
    }

    /// Whether `ip` is free for the Service `key` (its own IPs count as free).
    pub fn ip_free(&self, key: &(String, String), ip: IpAddr) -> bool {
        !self.ips.contains(&ip)
            || self
                .by_service
                .get(key)
                .is_some_and(|(i, _)| i.contains(&ip))
    }

    /// Whether `ip` is inside the service CIDR.
    pub fn in_range(&self, ip: IpAddr) -> bool {
        self.cidr.contains(&ip)
    }

    /// Picks a random free address in the CIDR (never network, broadcast
    /// or the first host).
    pub fn pick_ip(&self, taken_now: &[IpAddr]) -> Option<IpAddr> {
        let IpNet::V4(net) = self.cidr else {
            return self
                .cidr
                .hosts()
                .skip(1)
                .find(|ip| !self.ips.contains(ip) && !taken_now.contains(ip));
        };
        let base = u32::from(net.network());
        let size = 1u64 << (32 - net.prefix_len());
        if size < 4 {
            return None;
        }
        let mut rng = rand::rng();
        for _ in 0..256 {
            let off = rng.random_range(2..size - 1) as u32;
            let ip = IpAddr::V4(std::net::Ipv4Addr::from(base + off));
            if !self.ips.contains(&ip) && !taken_now.contains(&ip) {
                return Some(ip);
            }
        }
        (2..size - 1)
            .map(|off| IpAddr::V4(std::net::Ipv4Addr::from(base + off as u32)))
            .find(|ip| !self.ips.contains(ip) && !taken_now.contains(ip))
    }

    /// Whether a node port is free for `key`.
    pub fn port_free(&self, key: &(String, String), port: u16, proto: &str) -> bool {
        let p = (port, proto.to_string());
        !self.ports.contains(&p)
            || self
                .by_service
                .get(key)
                .is_some_and(|(_, ps)| ps.contains(&p))
    }

    /// Picks a random free node port (free for every protocol in `protos`).
    pub fn pick_port(&self, protos: &[&str], taken_now: &[u16]) -> Option<u16> {
        let mut rng = rand::rng();
        let ok = |p: u16| {
            !taken_now.contains(&p)
                && protos
                    .iter()
                    .all(|pr| !self.ports.contains(&(p, pr.to_string())))
        };
        for _ in 0..256 {
            let p = rng.random_range(NODE_PORT_RANGE);
            if ok(p) {
                return Some(p);
            }
        }
        NODE_PORT_RANGE.into_iter().find(|p| ok(*p))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn picks_unique_ips_and_ports() {
        let mut a = Allocator::default();
        a.set_cidr("10.0.0.0/29".parse().expect("cidr"));
        let mut got = Vec::new();
        while let Some(ip) = a.pick_ip(&got) {
            got.push(ip);
        }
        // /29: 8 addresses minus network, first host and broadcast
        assert_eq!(got.len(), 5);
        let key = ("default".to_string(), "s".to_string());
        a.set_service(key.clone(), &json!({"spec": {"clusterIPs": ["10.0.0.3"], "ports": [{"nodePort": 30001, "protocol": "TCP"}]}}));
        let other = ("default".to_string(), "t".to_string());
        assert!(!a.ip_free(&other, "10.0.0.3".parse().expect("ip")));
        assert!(a.ip_free(&key, "10.0.0.3".parse().expect("ip")));
        assert!(!a.port_free(&other, 30001, "TCP"));
        assert!(a.port_free(&other, 30001, "UDP"));
        a.release_service(&key);
        assert!(a.port_free(&other, 30001, "TCP"));
    }
}
