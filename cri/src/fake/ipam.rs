//! Sandbox IP assignment from an IPv4 CIDR, like CNI's host-local IPAM:
//! the network address, the gateway (`.1`) and the broadcast address are
//! never handed out; released addresses are reused after the rest.

use std::collections::BTreeSet;
use std::net::Ipv4Addr;

/// Why a CIDR was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid IPv4 CIDR {0:?}")]
pub struct BadCidr(pub String);

/// A pool of IPv4 addresses from one subnet.
#[derive(Debug, Clone)]
pub(crate) struct IpPool {
    cidr: String,
    first: u32,
    last: u32,
    next: u32,
    used: BTreeSet<u32>,
}

impl IpPool {
    pub(crate) fn new(cidr: &str) -> Result<Self, BadCidr> {
        let bad = || BadCidr(cidr.to_string());
        let (addr, len) = cidr.split_once('/').ok_or_else(bad)?;
        let addr: Ipv4Addr = addr.parse().map_err(|_| bad())?;
        let len: u32 = len.parse().map_err(|_| bad())?;
        if !(8..=30).contains(&len) {
            return Err(bad());
        }
        let mask = u32::MAX << (32 - len);
        let network = u32::from(addr) & mask;
        let broadcast = network | !mask;
        // .0 = network, .1 = gateway on the bridge, last = broadcast.
        let first = network + 2;
        let last = broadcast - 1;
        Ok(IpPool {
            cidr: cidr.to_string(),
            first,
            last,
            next: first,
            used: BTreeSet::new(),
        })
    }

    pub(crate) fn cidr(&self) -> &str {
        &self.cidr
    }

    /// The next free address, or `None` when the pool is exhausted.
    pub(crate) fn allocate(&mut self) -> Option<Ipv4Addr> {
        let size = self.last - self.first + 1;
        for _ in 0..size {
            let candidate = self.next;
            self.next = if self.next >= self.last {
                self.first
            } else {
                self.next + 1
            };
            if self.used.insert(candidate) {
                return Some(Ipv4Addr::from(candidate));
            }
        }
        None
    }

    pub(crate) fn release(&mut self, ip: &str) {
        if let Ok(addr) = ip.parse::<Ipv4Addr>() {
            self.used.remove(&u32::from(addr));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocates_after_gateway_and_wraps_around() {
        let mut p = IpPool::new("10.1.2.0/30").expect("cidr");
        // /30: .0 network, .1 gateway, .2 only host, .3 broadcast
        assert_eq!(p.allocate(), Some(Ipv4Addr::new(10, 1, 2, 2)));
        assert_eq!(p.allocate(), None);
        p.release("10.1.2.2");
        assert_eq!(p.allocate(), Some(Ipv4Addr::new(10, 1, 2, 2)));
    }

    #[test]
    fn normalizes_host_bits_and_rejects_garbage() {
        let mut p = IpPool::new("10.88.7.9/16").expect("cidr");
        assert_eq!(p.allocate(), Some(Ipv4Addr::new(10, 88, 0, 2)));
        assert_eq!(p.allocate(), Some(Ipv4Addr::new(10, 88, 0, 3)));
        for bad in ["10.0.0.0", "10.0.0.0/33", "x/8", "10.0.0.0/31"] {
            assert!(IpPool::new(bad).is_err(), "{bad}");
        }
    }
}
