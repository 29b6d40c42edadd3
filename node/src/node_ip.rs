//! The node's own IP (kubelet `--node-ip`): configured, or the source
//! address the kernel picks for the default route. Finding it sends no
//! packet: a UDP socket is `connect`ed to a public address and asked for its
//! local address.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};

/// Why no node IP could be found.
#[derive(Debug, thiserror::Error)]
#[error(
    "cannot determine the node IP (no default route with a usable source address); set node.nodeIP"
)]
pub struct NoNodeIp;

/// The configured IP, else the default-route source address (IPv4 first,
/// then IPv6). Never a loopback or unspecified address.
pub fn resolve(configured: Option<IpAddr>) -> Result<IpAddr, NoNodeIp> {
    if let Some(ip) = configured {
        return Ok(ip);
    }
    let probes = [
        SocketAddr::new(IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1)), 9),
        SocketAddr::new(
            IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1)),
            9,
        ),
    ];
    // Documentation prefixes (TEST-NET-1, 2001:db8::/32) are routed by the
    // default route on any normal host, and nothing is ever sent.
    for target in probes {
        if let Some(ip) = route_source(target)
            && crate::config::usable_node_ip(ip)
        {
            return Ok(ip);
        }
    }
    Err(NoNodeIp)
}

fn route_source(target: SocketAddr) -> Option<IpAddr> {
    let bind: SocketAddr = match target {
        SocketAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
        SocketAddr::V6(_) => (Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    let sock = UdpSocket::bind(bind).ok()?;
    sock.connect(target).ok()?;
    sock.local_addr().ok().map(|a| a.ip())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn configured_wins() {
        let ip: IpAddr = "10.1.2.3".parse().expect("ip");
        assert_eq!(resolve(Some(ip)).ok(), Some(ip));
    }

    /// Whether this host has a default route (IPv4 in /proc/net/route,
    /// IPv6 ::/0 in /proc/net/ipv6_route).
    fn host_has_default_route() -> bool {
        let v4 = std::fs::read_to_string("/proc/net/route").unwrap_or_default();
        let v6 = std::fs::read_to_string("/proc/net/ipv6_route").unwrap_or_default();
        v4.lines()
            .skip(1)
            .any(|l| l.split_whitespace().nth(1) == Some("00000000"))
            || v6.lines().any(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                f.len() > 9 && f[0] == "0".repeat(32) && f[1] == "00" && f[9] != "lo"
            })
    }

    #[test]
    fn detected_follows_the_default_route_and_is_never_loopback() {
        match resolve(None) {
            Ok(ip) => assert!(!ip.is_loopback() && !ip.is_unspecified(), "{ip}"),
            Err(e) => assert!(
                !host_has_default_route(),
                "the host has a default route, yet: {e}"
            ),
        }
    }
}
