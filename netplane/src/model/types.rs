//! Small value types shared by the whole model: IP family, L4 protocol and
//! the names that identify a Service and one of its ports.

use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;

/// An IP family. kube-proxy runs one proxier per family; keelson keeps one
/// model for both and keys every service port by its family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum IpFamily {
    /// IPv4 (`ip` nftables family, EndpointSlice `addressType: IPv4`).
    V4,
    /// IPv6 (`ip6` nftables family, EndpointSlice `addressType: IPv6`).
    V6,
}

impl IpFamily {
    /// Both families, IPv4 first.
    pub const ALL: [IpFamily; 2] = [IpFamily::V4, IpFamily::V6];

    /// The family of an address.
    pub fn of(ip: &IpAddr) -> IpFamily {
        match ip {
            IpAddr::V4(_) => IpFamily::V4,
            IpAddr::V6(_) => IpFamily::V6,
        }
    }

    /// The Kubernetes spelling (`IPv4` / `IPv6`), as in `spec.ipFamilies`,
    /// EndpointSlice `addressType` and kube-proxy's `ip_family` metric label.
    pub fn as_k8s(self) -> &'static str {
        match self {
            IpFamily::V4 => "IPv4",
            IpFamily::V6 => "IPv6",
        }
    }

    /// Parses the Kubernetes spelling.
    pub fn from_k8s(s: &str) -> Option<IpFamily> {
        match s {
            "IPv4" => Some(IpFamily::V4),
            "IPv6" => Some(IpFamily::V6),
            _ => None,
        }
    }
}

impl fmt::Display for IpFamily {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_k8s())
    }
}

/// A Service port protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Protocol {
    /// TCP (IP protocol 6).
    Tcp,
    /// UDP (IP protocol 17).
    Udp,
    /// SCTP (IP protocol 132).
    Sctp,
}

impl Protocol {
    /// Parses the API spelling (`TCP`, `UDP`, `SCTP`).
    pub fn from_k8s(s: &str) -> Option<Protocol> {
        match s {
            "TCP" => Some(Protocol::Tcp),
            "UDP" => Some(Protocol::Udp),
            "SCTP" => Some(Protocol::Sctp),
            _ => None,
        }
    }

    /// The API spelling.
    pub fn as_k8s(self) -> &'static str {
        match self {
            Protocol::Tcp => "TCP",
            Protocol::Udp => "UDP",
            Protocol::Sctp => "SCTP",
        }
    }

    /// The lower-case spelling nftables uses (`tcp`, `udp`, `sctp`).
    pub fn as_nft(self) -> &'static str {
        match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
            Protocol::Sctp => "sctp",
        }
    }

    /// The IP protocol number (`meta l4proto`, conntrack, BPF maps).
    pub fn number(self) -> u8 {
        match self {
            Protocol::Tcp => 6,
            Protocol::Udp => 17,
            Protocol::Sctp => 132,
        }
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_k8s())
    }
}

/// `namespace/name` of a namespaced object. Shared strings: a name is
/// cloned into several maps of the model and the backends' records.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NamespacedName {
    /// Namespace.
    pub namespace: Arc<str>,
    /// Name.
    pub name: Arc<str>,
}

impl NamespacedName {
    /// Builds a name.
    pub fn new(namespace: impl Into<Arc<str>>, name: impl Into<Arc<str>>) -> Self {
        NamespacedName {
            namespace: namespace.into(),
            name: name.into(),
        }
    }
}

impl fmt::Display for NamespacedName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// One port of one Service, as kube-proxy names it: the Service, the port's
/// name (empty for a single unnamed port) and its protocol. EndpointSlice
/// ports are matched to Service ports by (name, protocol).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ServicePortName {
    /// The Service.
    pub service: NamespacedName,
    /// `spec.ports[].name` (may be empty).
    pub port: Arc<str>,
    /// `spec.ports[].protocol`.
    pub protocol: Protocol,
}

impl ServicePortName {
    /// Builds a name.
    pub fn new(
        namespace: impl Into<Arc<str>>,
        name: impl Into<Arc<str>>,
        port: impl Into<Arc<str>>,
        protocol: Protocol,
    ) -> Self {
        ServicePortName {
            service: NamespacedName::new(namespace, name),
            port: port.into(),
            protocol,
        }
    }
}

/// Formats like kube-proxy's `ServicePortName.String()`: `ns/name:port`, or
/// `ns/name` for an unnamed port.
impl fmt::Display for ServicePortName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.port.is_empty() {
            write!(f, "{}", self.service)
        } else {
            write!(f, "{}:{}", self.service, self.port)
        }
    }
}

/// The key of one service port in the model: its name and the IP family it
/// is rendered for (a dual-stack Service has one entry per family).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ServicePortKey {
    /// IP family of the ClusterIP/endpoints of this entry.
    pub family: IpFamily,
    /// The service port.
    pub name: ServicePortName,
}

impl fmt::Display for ServicePortKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.name, self.family)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_port_name_formats_like_kube_proxy() {
        let named = ServicePortName::new("ns", "web", "http", Protocol::Tcp);
        assert_eq!(named.to_string(), "ns/web:http");
        let unnamed = ServicePortName::new("ns", "web", "", Protocol::Udp);
        assert_eq!(unnamed.to_string(), "ns/web");
    }

    #[test]
    fn protocol_round_trip_and_numbers() {
        for p in [Protocol::Tcp, Protocol::Udp, Protocol::Sctp] {
            assert_eq!(Protocol::from_k8s(p.as_k8s()), Some(p));
        }
        assert_eq!(Protocol::Tcp.number(), 6);
        assert_eq!(Protocol::Udp.number(), 17);
        assert_eq!(Protocol::Sctp.number(), 132);
        assert_eq!(Protocol::from_k8s("tcp"), None);
    }
}
