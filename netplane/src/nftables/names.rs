//! Names of the per-service-port objects, derived from the service port like
//! kube-proxy's nftables mode (`service-HASH-ns/name/tcp/port`,
//! `endpoint-HASH-ns/name/tcp/port__10.0.0.1/80`), so a listing reads the
//! same and names never collide across service ports.

use std::net::SocketAddr;

use sha2::{Digest, Sha256};

use crate::model::ServicePortName;

/// nftables' maximum object name length (`NFT_NAME_MAXLEN` - 1).
const NAME_LENGTH_MAX: usize = 256 - 1;
/// Longest prefix we use ("endpoint-", "affinity-", ...) plus margin.
const PREFIX_LENGTH_MAX: usize = 16;
const BASE_LENGTH_MAX: usize = NAME_LENGTH_MAX - PREFIX_LENGTH_MAX;

/// Prefix of the Cluster-policy chain.
pub const SERVICE_PREFIX: &str = "service-";
/// Prefix of the Local-policy chain.
pub const LOCAL_PREFIX: &str = "local-";
/// Prefix of the external-traffic chain.
pub const EXTERNAL_PREFIX: &str = "external-";
/// Prefix of the loadBalancerSourceRanges chain.
pub const FIREWALL_PREFIX: &str = "firewall-";
/// Prefix of endpoint chains.
pub const ENDPOINT_PREFIX: &str = "endpoint-";
/// Prefix of ClientIP affinity sets.
pub const AFFINITY_PREFIX: &str = "affinity-";

fn base32_8(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 32] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
    // 5 bytes = 40 bits = 8 base32 characters.
    let mut acc: u64 = 0;
    for b in bytes.iter().take(5) {
        acc = (acc << 8) | u64::from(*b);
    }
    (0..8)
        .rev()
        .map(|i| ALPHABET[((acc >> (i * 5)) & 0x1f) as usize] as char)
        .collect()
}

/// `HASH-name`, truncated (with "...") to fit nftables' name limit.
fn hash_and_truncate(name: &str) -> String {
    let hash = Sha256::digest(name.as_bytes());
    let mut out = format!("{}-{name}", base32_8(&hash));
    if out.len() > BASE_LENGTH_MAX {
        let mut cut = BASE_LENGTH_MAX - 3;
        while !out.is_char_boundary(cut) {
            cut -= 1;
        }
        out.truncate(cut);
        out.push_str("...");
    }
    out
}

/// `HASH-ns/name/proto/port` of a service port.
pub fn service_port_base(name: &ServicePortName) -> String {
    hash_and_truncate(&format!(
        "{}/{}/{}/{}",
        name.service.namespace,
        name.service.name,
        name.protocol.as_nft(),
        name.port
    ))
}

/// `HASH-ns/name/proto/port__ip/port` of an endpoint of a service port
/// (IPv6 colons become dots: chain names cannot contain ':').
pub fn endpoint_base(name: &ServicePortName, endpoint: SocketAddr) -> String {
    let ip = endpoint.ip().to_string().replace(':', ".");
    hash_and_truncate(&format!(
        "{}/{}/{}/{}__{}/{}",
        name.service.namespace,
        name.service.name,
        name.protocol.as_nft(),
        name.port,
        ip,
        endpoint.port()
    ))
}

/// The names of one service port's objects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortChains {
    /// Cluster-policy chain.
    pub service: String,
    /// Local-policy chain.
    pub local: String,
    /// External-traffic chain.
    pub external: String,
    /// Source-range firewall chain.
    pub firewall: String,
}

impl PortChains {
    /// Names for a service port.
    pub fn new(name: &ServicePortName) -> Self {
        let base = service_port_base(name);
        PortChains {
            service: format!("{SERVICE_PREFIX}{base}"),
            local: format!("{LOCAL_PREFIX}{base}"),
            external: format!("{EXTERNAL_PREFIX}{base}"),
            firewall: format!("{FIREWALL_PREFIX}{base}"),
        }
    }
}

/// Endpoint chain and affinity set names of an endpoint.
pub fn endpoint_names(name: &ServicePortName, endpoint: SocketAddr) -> (String, String) {
    let base = endpoint_base(name, endpoint);
    (
        format!("{ENDPOINT_PREFIX}{base}"),
        format!("{AFFINITY_PREFIX}{base}"),
    )
}

/// Whether a chain name is a per-service-port chain (they all contain '/';
/// the fixed chains never do).
pub fn is_service_chain(name: &str) -> bool {
    name.contains('/')
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Protocol;

    #[test]
    fn names_match_kube_proxy_scheme() {
        let spn = ServicePortName::new("ns1", "svc1", "p80", Protocol::Tcp);
        let chains = PortChains::new(&spn);
        // kube-proxy's own test data: "service-ULMVA6XW-ns1/svc1/tcp/p80".
        assert_eq!(chains.service, "service-ULMVA6XW-ns1/svc1/tcp/p80");
        assert_eq!(chains.external, "external-ULMVA6XW-ns1/svc1/tcp/p80");
        let (ep, aff) = endpoint_names(
            &spn,
            "10.180.0.1:80".parse().unwrap_or_else(|_| unreachable!()),
        );
        assert_eq!(ep, "endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80");
        assert_eq!(aff, "affinity-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80");
        let (ep6, _) = endpoint_names(
            &spn,
            "[fd00:10:180::1]:80"
                .parse()
                .unwrap_or_else(|_| unreachable!()),
        );
        assert!(
            ep6.ends_with("ns1/svc1/tcp/p80__fd00.10.180..1/80"),
            "{ep6}"
        );
        assert!(is_service_chain(&ep));
        assert!(!is_service_chain("services"));
    }
}
