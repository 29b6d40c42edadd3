//! Static configuration of the nftables backend (KubeProxyConfiguration
//! fields where the meaning is the same).

use std::collections::BTreeMap;
use std::net::IpAddr;

use ipnet::IpNet;

use crate::model::IpFamily;

/// How "traffic from inside the cluster" is recognised (kube-proxy's
/// `detectLocalMode`), per family.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LocalTraffic {
    /// No detection: nothing is treated as pod traffic (no short-circuit for
    /// eTP=Local, no off-cluster masquerade of ClusterIP traffic).
    Unknown,
    /// Source address in the cluster (or node) pod CIDR (`ClusterCIDR`,
    /// `NodeCIDR`).
    Cidr(IpNet),
    /// Arrives on this bridge (`BridgeInterface`).
    Interface(String),
    /// Arrives on an interface with this name prefix (`InterfaceNamePrefix`).
    InterfacePrefix(String),
}

/// Earlier keelson versions could spread Services over up to this many
/// service tables per family (`<table>-services-00..63`); they are deleted
/// at start and by cleanup.
pub const LEGACY_SERVICE_TABLES: u16 = 64;

/// Configuration of the nftables backend.
#[derive(Debug, Clone)]
pub struct NftablesConfig {
    /// Table name in both families (default `keelson`).
    pub table: String,
    /// Families to program (`ip` and/or `ip6` tables).
    pub families: Vec<IpFamily>,
    /// `masqueradeBit` (default 14: mark 0x4000).
    pub masquerade_bit: u32,
    /// `masqueradeAll`.
    pub masquerade_all: bool,
    /// Pod-traffic detection per family.
    pub local_traffic: BTreeMap<IpFamily, LocalTraffic>,
    /// Service CIDRs per family: traffic to unallocated ClusterIPs in them is
    /// dropped (kube-proxy learns them from ServiceCIDR objects).
    pub service_cidrs: BTreeMap<IpFamily, Vec<IpNet>>,
    /// The node's primary IP per family (used to let the node reach its own
    /// load-balancer IPs when they are inside loadBalancerSourceRanges).
    pub node_ips: BTreeMap<IpFamily, IpAddr>,
}

impl Default for NftablesConfig {
    fn default() -> Self {
        NftablesConfig {
            table: "keelson".into(),
            families: vec![IpFamily::V4],
            masquerade_bit: 14,
            masquerade_all: false,
            local_traffic: BTreeMap::new(),
            service_cidrs: BTreeMap::new(),
            node_ips: BTreeMap::new(),
        }
    }
}

impl NftablesConfig {
    /// The masquerade mark bit value.
    pub fn masquerade_mark(&self) -> u32 {
        1u32 << self.masquerade_bit.min(31)
    }

    /// Pod-traffic detection of a family.
    pub fn local(&self, family: IpFamily) -> &LocalTraffic {
        self.local_traffic
            .get(&family)
            .unwrap_or(&LocalTraffic::Unknown)
    }
}
