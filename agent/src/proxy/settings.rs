//! Turns the `proxy:` configuration and the Node object into the data
//! plane's settings: IP families, pod-traffic detection (`clusterCIDR`),
//! NodePort addresses (`nodePortAddresses`, default `primary`).

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use ipnet::IpNet;
use k8s_openapi::api::core::v1::Node;
use keelson_netplane::model::{IpFamily, NodePortAddresses};
use keelson_netplane::nftables::LocalTraffic;

/// `nodePortAddresses: [primary]`.
pub const PRIMARY: &str = "primary";

/// A configuration value that cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("proxy.{field}: {message}")]
pub struct SettingError {
    /// The field (KubeProxyConfiguration spelling).
    pub field: &'static str,
    /// What is wrong.
    pub message: String,
}

/// The node's primary IP per family: the first InternalIP of each family,
/// else the first ExternalIP (kubelet's and kube-proxy's order).
pub fn node_ips(node: &Node) -> BTreeMap<IpFamily, IpAddr> {
    let mut out = BTreeMap::new();
    let addrs = node.status.as_ref().and_then(|s| s.addresses.as_ref());
    for kind in ["InternalIP", "ExternalIP"] {
        for a in addrs.into_iter().flatten().filter(|a| a.type_ == kind) {
            if let Ok(ip) = a.address.parse::<IpAddr>() {
                out.entry(IpFamily::of(&ip)).or_insert(ip);
            }
        }
    }
    out
}

/// The families to serve: those the node has an address of (IPv4 when it
/// has none yet).
pub fn families(node_ips: &BTreeMap<IpFamily, IpAddr>) -> Vec<IpFamily> {
    if node_ips.is_empty() {
        vec![IpFamily::V4]
    } else {
        node_ips.keys().copied().collect()
    }
}

/// `clusterCIDR` (comma separated, at most one per family) as pod-traffic
/// detection per family.
pub fn local_traffic(cluster_cidr: &str) -> Result<BTreeMap<IpFamily, LocalTraffic>, SettingError> {
    let mut out = BTreeMap::new();
    for part in cluster_cidr
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
    {
        let net: IpNet = part.parse().map_err(|e| SettingError {
            field: "clusterCIDR",
            message: format!("{part:?} is not a CIDR: {e}"),
        })?;
        let family = IpFamily::of(&net.addr());
        if out
            .insert(family, LocalTraffic::Cidr(net.trunc()))
            .is_some()
        {
            return Err(SettingError {
                field: "clusterCIDR",
                message: format!("more than one {family} CIDR"),
            });
        }
    }
    Ok(out)
}

/// The parsed `nodePortAddresses`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodePortSpec {
    primary: bool,
    cidrs: Vec<IpNet>,
}

/// Parses `nodePortAddresses` (empty = `primary`).
pub fn node_port_spec(values: &[String]) -> Result<NodePortSpec, SettingError> {
    let mut spec = NodePortSpec {
        primary: values.is_empty(),
        cidrs: Vec::new(),
    };
    for v in values {
        if v == PRIMARY {
            spec.primary = true;
            continue;
        }
        let net: IpNet = v.parse().map_err(|e| SettingError {
            field: "nodePortAddresses",
            message: format!("{v:?} is neither \"primary\" nor a CIDR: {e}"),
        })?;
        spec.cidrs.push(net);
    }
    Ok(spec)
}

/// The NodePort addresses of `family`: everything local (a `/0`), the
/// node's primary IP, and/or the local addresses inside the CIDRs.
pub fn node_port_addresses(
    spec: &NodePortSpec,
    family: IpFamily,
    node_ips: &BTreeMap<IpFamily, IpAddr>,
    local_addrs: &[IpAddr],
) -> NodePortAddresses {
    let fam_cidrs: Vec<&IpNet> = spec
        .cidrs
        .iter()
        .filter(|n| IpFamily::of(&n.addr()) == family)
        .collect();
    if fam_cidrs.iter().any(|n| n.prefix_len() == 0) {
        return NodePortAddresses::AllLocal;
    }
    let mut ips: BTreeSet<IpAddr> = BTreeSet::new();
    if spec.primary
        && let Some(ip) = node_ips.get(&family)
    {
        ips.insert(*ip);
    }
    for a in local_addrs.iter().filter(|a| IpFamily::of(a) == family) {
        if fam_cidrs.iter().any(|n| n.contains(a)) {
            ips.insert(*a);
        }
    }
    NodePortAddresses::Ips(ips)
}

/// The addresses of the host's interfaces.
pub fn local_addresses() -> Vec<IpAddr> {
    let Ok(addrs) = nix::ifaddrs::getifaddrs() else {
        return Vec::new();
    };
    addrs
        .filter_map(|a| a.address)
        .filter_map(|sa| {
            if let Some(v4) = sa.as_sockaddr_in() {
                Some(IpAddr::V4(v4.ip()))
            } else {
                sa.as_sockaddr_in6().map(|v6| IpAddr::V6(v6.ip()))
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{NodeAddress, NodeStatus};

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap_or_else(|_| unreachable!())
    }

    #[test]
    fn node_ips_prefer_internal() {
        let node = Node {
            status: Some(NodeStatus {
                addresses: Some(vec![
                    NodeAddress {
                        type_: "ExternalIP".into(),
                        address: "203.0.113.5".into(),
                    },
                    NodeAddress {
                        type_: "InternalIP".into(),
                        address: "10.0.0.5".into(),
                    },
                    NodeAddress {
                        type_: "InternalIP".into(),
                        address: "fd00::5".into(),
                    },
                    NodeAddress {
                        type_: "Hostname".into(),
                        address: "n1".into(),
                    },
                ]),
                ..Default::default()
            }),
            ..Default::default()
        };
        let ips = node_ips(&node);
        assert_eq!(ips.get(&IpFamily::V4), Some(&ip("10.0.0.5")));
        assert_eq!(ips.get(&IpFamily::V6), Some(&ip("fd00::5")));
        assert_eq!(families(&ips), vec![IpFamily::V4, IpFamily::V6]);
    }

    #[test]
    fn cluster_cidr_per_family() {
        let m = local_traffic("10.244.0.0/16, fd00:10:244::/56").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(m.len(), 2);
        assert!(local_traffic("10.0.0.0/8,10.1.0.0/16").is_err());
        assert!(local_traffic("bogus").is_err());
        assert!(local_traffic("").unwrap_or_default().is_empty());
    }

    #[test]
    fn node_port_addresses_follow_kube_proxy() {
        let node_ips = BTreeMap::from([(IpFamily::V4, ip("10.0.0.5"))]);
        let local = vec![ip("10.0.0.5"), ip("192.168.1.7"), ip("127.0.0.1")];
        let primary = node_port_spec(&[]).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            node_port_addresses(&primary, IpFamily::V4, &node_ips, &local),
            NodePortAddresses::Ips(BTreeSet::from([ip("10.0.0.5")]))
        );
        let cidr = node_port_spec(&["192.168.0.0/16".into()]).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            node_port_addresses(&cidr, IpFamily::V4, &node_ips, &local),
            NodePortAddresses::Ips(BTreeSet::from([ip("192.168.1.7")]))
        );
        let all = node_port_spec(&["0.0.0.0/0".into()]).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            node_port_addresses(&all, IpFamily::V4, &node_ips, &local),
            NodePortAddresses::AllLocal
        );
        assert!(node_port_spec(&["nonsense".into()]).is_err());
    }
}
