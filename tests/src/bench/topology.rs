//! The benchmark's network: every namespace it creates, removed on drop.
//!
//! ```text
//!                       fabric netns: bridge br0 10.250.0.1/16
//!                       (Service CIDR routed `local` → stray VIP traffic gets a RST)
//!        ┌───────────────┬──────────┴─────┬────────────────┐
//!   backend b0       backend b1  …   node (contestant)   node (baseline)
//!   10.250.1.1       10.250.1.2      10.250.2.x          10.250.2.y
//!   local 10.128/16  local 10.129/16 default via 10.250.0.1
//!   server :8080     server :8080    10.(128+b)/16 via 10.250.1.(b+1)
//! ```
//!
//! A node namespace reaches every endpoint address through the backend
//! that owns its block; a Service address goes to the fabric, which
//! refuses it, unless the contestant translated it first.

use std::net::Ipv4Addr;

use tokio::task::JoinHandle;

use super::backends;
use super::error::{BenchError, Result};
use super::scenario::{TARGET_PORT, backend_block};
use crate::netns::{NetNs, veth_pair};

/// The fabric's bridge address (the nodes' default gateway).
pub const GATEWAY: Ipv4Addr = Ipv4Addr::new(10, 250, 0, 1);
/// Prefix length of the fabric's subnet.
const FABRIC_PREFIX: u8 = 16;

/// Address of backend `b` on the fabric.
pub fn backend_addr(b: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 250, 1, b.saturating_add(1))
}

/// Address of the `i`-th node namespace on the fabric.
pub fn node_addr(i: u32) -> Option<Ipv4Addr> {
    let third = 2 + i / 250;
    (third <= 254).then(|| Ipv4Addr::new(10, 250, third as u8, (i % 250 + 1) as u8))
}

/// A backend namespace and its server.
#[derive(Debug)]
struct Backend {
    _ns: NetNs,
    server: JoinHandle<()>,
}

/// The fabric, the backends and their servers.
#[derive(Debug)]
pub struct Topology {
    fabric: NetNs,
    backends: Vec<Backend>,
    next_node: u32,
}

impl Drop for Topology {
    fn drop(&mut self) {
        for b in &self.backends {
            b.server.abort();
        }
    }
}

/// A node namespace on the fabric (one per contestant, plus the baseline).
#[derive(Debug)]
pub struct NodeNs {
    /// The namespace.
    pub ns: NetNs,
    /// Its address on the fabric (the node's InternalIP).
    pub addr: Ipv4Addr,
}

impl Topology {
    /// Creates the fabric and `backends` backend namespaces with their
    /// servers (call inside a tokio runtime). `service_cidr` is routed to
    /// the fabric's loopback so traffic to an untranslated VIP is refused
    /// at once instead of being dropped.
    pub fn create(backends: u8, service_cidr: ipnet::Ipv4Net) -> Result<Topology> {
        let fabric = NetNs::create("kbf")?;
        fabric.ip(&["link", "add", "br0", "type", "bridge"])?;
        fabric.ip(&[
            "addr",
            "add",
            &format!("{GATEWAY}/{FABRIC_PREFIX}"),
            "dev",
            "br0",
        ])?;
        fabric.ip(&["link", "set", "br0", "up"])?;
        fabric.ip(&[
            "route",
            "add",
            "local",
            &service_cidr.to_string(),
            "dev",
            "lo",
        ])?;
        let mut topo = Topology {
            fabric,
            backends: Vec::new(),
            next_node: 0,
        };
        for b in 0..backends {
            let ns = NetNs::create("kbb")?;
            let port = format!("b{b}");
            topo.attach(&ns, &port, backend_addr(b))?;
            ns.ip(&[
                "route",
                "add",
                "local",
                &backend_block(b).to_string(),
                "dev",
                "lo",
            ])?;
            let listener = backends::bind_in(&ns, TARGET_PORT)?;
            let server = tokio::spawn(backends::serve(listener, format!("b{b}")));
            topo.backends.push(Backend { _ns: ns, server });
        }
        Ok(topo)
    }

    /// Number of backends.
    pub fn backends(&self) -> u8 {
        self.backends.len() as u8
    }

    fn attach(&self, ns: &NetNs, port: &str, addr: Ipv4Addr) -> Result<()> {
        veth_pair(
            &self.fabric,
            port,
            None,
            ns,
            "eth0",
            Some(&format!("{addr}/{FABRIC_PREFIX}")),
        )?;
        self.fabric.ip(&["link", "set", port, "master", "br0"])?;
        Ok(())
    }

    /// A new node namespace: on the fabric, default route to the gateway,
    /// a route to each backend's block.
    pub fn add_node(&mut self, prefix: &str) -> Result<NodeNs> {
        let i = self.next_node;
        let addr =
            node_addr(i).ok_or_else(|| BenchError::Invalid("too many node namespaces".into()))?;
        self.next_node += 1;
        let ns = NetNs::create(prefix)?;
        self.attach(&ns, &format!("n{i}"), addr)?;
        ns.ip(&["route", "add", "default", "via", &GATEWAY.to_string()])?;
        for b in 0..self.backends() {
            ns.ip(&[
                "route",
                "add",
                &backend_block(b).to_string(),
                "via",
                &backend_addr(b).to_string(),
            ])?;
        }
        Ok(NodeNs { ns, addr })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses() {
        assert_eq!(backend_addr(0), Ipv4Addr::new(10, 250, 1, 1));
        assert_eq!(node_addr(0), Some(Ipv4Addr::new(10, 250, 2, 1)));
        assert_eq!(node_addr(249), Some(Ipv4Addr::new(10, 250, 2, 250)));
        assert_eq!(node_addr(250), Some(Ipv4Addr::new(10, 250, 3, 1)));
        assert_eq!(node_addr(100_000), None);
    }
}
