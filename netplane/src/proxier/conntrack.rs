//! Conntrack cleanup for UDP Services, through netlink (`NETLINK_NETFILTER`,
//! ctnetlink). UDP has no connection teardown, so a flow keeps its NAT
//! binding after its endpoint is gone, or keeps being rejected after the
//! Service gained endpoints. Like kube-proxy, keelson deletes:
//! - flows to a Service IP:port (ClusterIP, externalIPs, LB IPs) or NodePort
//!   whose reply source is an endpoint that was removed;
//! - all flows to a Service IP:port / NodePort that was deleted;
//! - all flows to a Service IP:port / NodePort that went from 0 to N
//!   endpoints (the earlier flows were rejected, not NATed).

use std::collections::BTreeSet;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::model::{IpFamily, Protocol, ProxyDiff, ServicePortState};
use crate::nftables::netlink::NfSocket;
use crate::nftables::wire::nfproto;

const CTNL_SUBSYS: u16 = 1;
const IPCTNL_MSG_CT_GET: u16 = 1;
const IPCTNL_MSG_CT_DELETE: u16 = 2;
const CTA_TUPLE_ORIG: u16 = 1;
const CTA_TUPLE_REPLY: u16 = 2;
const CTA_TUPLE_IP: u16 = 1;
const CTA_TUPLE_PROTO: u16 = 2;
const CTA_IP_V4_SRC: u16 = 1;
const CTA_IP_V4_DST: u16 = 2;
const CTA_IP_V6_SRC: u16 = 3;
const CTA_IP_V6_DST: u16 = 4;
const CTA_PROTO_NUM: u16 = 1;
const CTA_PROTO_DST_PORT: u16 = 3;
const CTA_ZONE: u16 = 7;

/// Which UDP flows to delete.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum CtFilter {
    /// Original destination is `ip:port`.
    OrigDst {
        /// Service IP.
        ip: IpAddr,
        /// Service port.
        port: u16,
    },
    /// Original destination `ip:port` and reply source `endpoint`.
    OrigDstReplySrc {
        /// Service IP.
        ip: IpAddr,
        /// Service port.
        port: u16,
        /// Endpoint IP.
        endpoint: IpAddr,
    },
    /// Original destination port is the NodePort `port`.
    NodePort {
        /// NodePort.
        port: u16,
    },
    /// NodePort `port` and reply source `endpoint`.
    NodePortReplySrc {
        /// NodePort.
        port: u16,
        /// Endpoint IP.
        endpoint: IpAddr,
    },
}

impl CtFilter {
    fn matches(&self, e: &Entry) -> bool {
        match self {
            CtFilter::OrigDst { ip, port } => e.orig_dst == *ip && e.orig_dport == *port,
            CtFilter::OrigDstReplySrc { ip, port, endpoint } => {
                e.orig_dst == *ip && e.orig_dport == *port && e.reply_src == *endpoint
            }
            CtFilter::NodePort { port } => e.orig_dport == *port,
            CtFilter::NodePortReplySrc { port, endpoint } => {
                e.orig_dport == *port && e.reply_src == *endpoint
            }
        }
    }
}

fn service_ips(s: &ServicePortState) -> BTreeSet<IpAddr> {
    let mut ips: BTreeSet<IpAddr> = s
        .info
        .external_ips
        .iter()
        .chain(s.info.load_balancer_ips.iter())
        .copied()
        .collect();
    ips.insert(s.info.cluster_ip);
    ips
}

fn serving_ips(s: &ServicePortState) -> BTreeSet<IpAddr> {
    s.endpoints
        .iter()
        .filter(|e| e.serving)
        .map(|e| e.ip)
        .collect()
}

/// The UDP flows a diff makes stale, per family.
pub fn filters_for(diff: &ProxyDiff) -> Vec<(IpFamily, CtFilter)> {
    let mut out = BTreeSet::new();
    for c in &diff.changes {
        let family = c.key.family;
        if c.key.name.protocol != Protocol::Udp {
            continue;
        }
        let prev = c.previous.as_deref();
        let cur = c.current.as_deref();
        let prev_ips = prev.map(service_ips).unwrap_or_default();
        let cur_ips = cur.map(service_ips).unwrap_or_default();
        let prev_port = prev.map(|p| p.info.port);
        let cur_port = cur.map(|p| p.info.port);
        // Deleted service IPs (or a changed port): all their flows.
        for ip in &prev_ips {
            if let Some(port) = prev_port
                && (!cur_ips.contains(ip) || cur_port != prev_port)
            {
                out.insert((family, CtFilter::OrigDst { ip: *ip, port }));
            }
        }
        let prev_np = prev.and_then(|p| p.info.node_port);
        let cur_np = cur.and_then(|p| p.info.node_port);
        if let Some(np) = prev_np
            && cur_np != Some(np)
        {
            out.insert((family, CtFilter::NodePort { port: np }));
        }
        let Some(cur) = cur else { continue };
        // 0 -> N endpoints: flows created while rejecting are stale.
        let had_endpoints = prev.is_some_and(|p| p.has_any_endpoints);
        if cur.has_any_endpoints && !had_endpoints {
            for ip in &cur_ips {
                out.insert((
                    family,
                    CtFilter::OrigDst {
                        ip: *ip,
                        port: cur.info.port,
                    },
                ));
            }
            if let Some(np) = cur_np {
                out.insert((family, CtFilter::NodePort { port: np }));
            }
        }
        // Removed endpoints: flows NATed to them.
        if let Some(prev) = prev {
            let now = serving_ips(cur);
            for gone in serving_ips(prev).difference(&now) {
                for ip in &cur_ips {
                    out.insert((
                        family,
                        CtFilter::OrigDstReplySrc {
                            ip: *ip,
                            port: cur.info.port,
                            endpoint: *gone,
                        },
                    ));
                }
                if let Some(np) = cur_np {
                    out.insert((
                        family,
                        CtFilter::NodePortReplySrc {
                            port: np,
                            endpoint: *gone,
                        },
                    ));
                }
            }
        }
    }
    out.into_iter().collect()
}

#[derive(Debug)]
struct Entry {
    orig_dst: IpAddr,
    orig_dport: u16,
    reply_src: IpAddr,
    /// The raw `CTA_TUPLE_ORIG` attribute (to delete the entry) and zone.
    orig_attr: Vec<u8>,
    zone: Option<Vec<u8>>,
}

fn attrs(buf: &[u8]) -> impl Iterator<Item = (u16, &[u8], &[u8])> {
    let mut pos = 0;
    std::iter::from_fn(move || {
        if pos + 4 > buf.len() {
            return None;
        }
        let len = u16::from_ne_bytes([buf[pos], buf[pos + 1]]) as usize;
        let ty = u16::from_ne_bytes([buf[pos + 2], buf[pos + 3]]) & 0x3fff;
        if len < 4 || pos + len > buf.len() {
            return None;
        }
        let whole = &buf[pos..pos + len];
        let payload = &buf[pos + 4..pos + len];
        pos += (len + 3) & !3;
        Some((ty, payload, whole))
    })
}

fn find(buf: &[u8], ty: u16) -> Option<(&[u8], &[u8])> {
    attrs(buf)
        .find(|(t, _, _)| *t == ty)
        .map(|(_, p, w)| (p, w))
}

fn tuple_addr(tuple: &[u8], want_dst: bool) -> Option<IpAddr> {
    let (ip, _) = find(tuple, CTA_TUPLE_IP)?;
    for (t, p, _) in attrs(ip) {
        match (t, want_dst) {
            (CTA_IP_V4_SRC, false) | (CTA_IP_V4_DST, true) if p.len() == 4 => {
                return Some(IpAddr::V4(Ipv4Addr::new(p[0], p[1], p[2], p[3])));
            }
            (CTA_IP_V6_SRC, false) | (CTA_IP_V6_DST, true) if p.len() == 16 => {
                let mut b = [0u8; 16];
                b.copy_from_slice(p);
                return Some(IpAddr::V6(Ipv6Addr::from(b)));
            }
            _ => {}
        }
    }
    None
}

fn parse_entry(payload: &[u8]) -> Option<Entry> {
    let (orig, orig_whole) = find(payload, CTA_TUPLE_ORIG)?;
    let (reply, _) = find(payload, CTA_TUPLE_REPLY)?;
    let (proto, _) = find(orig, CTA_TUPLE_PROTO)?;
    let (num, _) = find(proto, CTA_PROTO_NUM)?;
    if num.first() != Some(&Protocol::Udp.number()) {
        return None;
    }
    let (dport, _) = find(proto, CTA_PROTO_DST_PORT)?;
    Some(Entry {
        orig_dst: tuple_addr(orig, true)?,
        orig_dport: u16::from_be_bytes([*dport.first()?, *dport.get(1)?]),
        reply_src: tuple_addr(reply, false)?,
        orig_attr: orig_whole.to_vec(),
        zone: find(payload, CTA_ZONE).map(|(_, w)| w.to_vec()),
    })
}

/// One conntrack entry, as diagnose shows it (any protocol).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Flow {
    /// IP protocol number.
    pub protocol: u8,
    /// Original source address.
    pub orig_src: IpAddr,
    /// Original destination address (the Service IP).
    pub orig_dst: IpAddr,
    /// Original destination port.
    pub orig_dport: u16,
    /// Reply source address (the endpoint after DNAT).
    pub reply_src: IpAddr,
    /// Reply source port (the endpoint's port).
    pub reply_sport: u16,
}

const CTA_PROTO_SRC_PORT: u16 = 2;

fn parse_flow(payload: &[u8]) -> Option<Flow> {
    let (orig, _) = find(payload, CTA_TUPLE_ORIG)?;
    let (reply, _) = find(payload, CTA_TUPLE_REPLY)?;
    let (proto, _) = find(orig, CTA_TUPLE_PROTO)?;
    let (num, _) = find(proto, CTA_PROTO_NUM)?;
    let port = |tuple: &[u8], ty: u16| -> Option<u16> {
        let (p, _) = find(tuple, CTA_TUPLE_PROTO)?;
        let (v, _) = find(p, ty)?;
        Some(u16::from_be_bytes([*v.first()?, *v.get(1)?]))
    };
    Some(Flow {
        protocol: *num.first()?,
        orig_src: tuple_addr(orig, false)?,
        orig_dst: tuple_addr(orig, true)?,
        orig_dport: port(orig, CTA_PROTO_DST_PORT).unwrap_or(0),
        reply_src: tuple_addr(reply, false)?,
        reply_sport: port(reply, CTA_PROTO_SRC_PORT).unwrap_or(0),
    })
}

/// Reads conntrack entries (read-only; for diagnose).
pub fn flows(family: IpFamily) -> io::Result<Vec<Flow>> {
    let mut socket = NfSocket::open()?;
    let entries = socket.request_raw(
        (CTNL_SUBSYS << 8) | IPCTNL_MSG_CT_GET,
        true,
        nfproto(family),
        |_| {},
    )?;
    Ok(entries.iter().filter_map(|e| parse_flow(e)).collect())
}

/// Deletes conntrack entries in the network namespace it was opened in.
#[derive(Debug)]
pub struct ConntrackCleaner {
    socket: NfSocket,
}

impl ConntrackCleaner {
    /// Opens a ctnetlink socket in the calling thread's network namespace.
    pub fn open() -> io::Result<ConntrackCleaner> {
        Ok(ConntrackCleaner {
            socket: NfSocket::open()?,
        })
    }

    /// Deletes the UDP entries of `family` matching any of `filters`.
    /// Returns how many were deleted (entries that vanished meanwhile are
    /// not errors).
    pub fn clean(&mut self, family: IpFamily, filters: &[CtFilter]) -> io::Result<usize> {
        if filters.is_empty() {
            return Ok(0);
        }
        let entries = self.socket.request_raw(
            (CTNL_SUBSYS << 8) | IPCTNL_MSG_CT_GET,
            true,
            nfproto(family),
            |_| {},
        )?;
        let mut deleted = 0;
        for raw in entries {
            let Some(e) = parse_entry(&raw) else { continue };
            if !filters.iter().any(|f| f.matches(&e)) {
                continue;
            }
            let result = self.socket.request_raw(
                (CTNL_SUBSYS << 8) | IPCTNL_MSG_CT_DELETE,
                false,
                nfproto(family),
                |b| {
                    b.extend_from_slice(&e.orig_attr);
                    if let Some(z) = &e.zone {
                        b.extend_from_slice(z);
                    }
                },
            );
            match result {
                Ok(_) => deleted += 1,
                Err(err) if err.raw_os_error() == Some(libc::ENOENT) => {}
                Err(err) => return Err(err),
            }
        }
        Ok(deleted)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{EndpointSpec as Ep, ServiceBuilder, SliceBuilder};
    use crate::model::{ChangeTracker, NodeTopology};

    fn tracker() -> ChangeTracker {
        ChangeTracker::new(
            [IpFamily::V4],
            NodeTopology {
                name: "n".into(),
                zone: None,
            },
        )
    }

    fn dns() -> ServiceBuilder {
        ServiceBuilder::new("ns", "dns")
            .cluster_ip("10.96.0.10")
            .type_("NodePort")
            .node_port("dns", Protocol::Udp, 53, 30053)
    }

    fn slice(ips: &[&str]) -> k8s_openapi::api::discovery::v1::EndpointSlice {
        let mut s =
            SliceBuilder::new("ns", "dns", "dns-1", "IPv4").port("dns", Protocol::Udp, 5353);
        for ip in ips {
            s = s.endpoint(Ep::ready(ip));
        }
        s.build()
    }

    #[test]
    fn filters_follow_kube_proxy_triggers() {
        let mut t = tracker();
        t.update_service(&dns().build());
        let d = t.diff();
        assert!(
            filters_for(&d).is_empty(),
            "new service without endpoints: nothing"
        );
        t.commit(&d);

        // 0 -> N endpoints.
        t.update_endpoint_slice(&slice(&["10.0.0.1", "10.0.0.2"]));
        let d = t.diff();
        let f: Vec<CtFilter> = filters_for(&d).into_iter().map(|(_, f)| f).collect();
        assert_eq!(
            f,
            vec![
                CtFilter::OrigDst {
                    ip: "10.96.0.10".parse().unwrap_or_else(|_| unreachable!()),
                    port: 53
                },
                CtFilter::NodePort { port: 30053 },
            ]
        );
        t.commit(&d);

        // An endpoint goes.
        t.update_endpoint_slice(&slice(&["10.0.0.2"]));
        let d = t.diff();
        let f: Vec<CtFilter> = filters_for(&d).into_iter().map(|(_, f)| f).collect();
        let gone: IpAddr = "10.0.0.1".parse().unwrap_or_else(|_| unreachable!());
        assert_eq!(
            f,
            vec![
                CtFilter::OrigDstReplySrc {
                    ip: "10.96.0.10".parse().unwrap_or_else(|_| unreachable!()),
                    port: 53,
                    endpoint: gone
                },
                CtFilter::NodePortReplySrc {
                    port: 30053,
                    endpoint: gone
                },
            ]
        );
        t.commit(&d);

        // The Service goes.
        t.delete_service("ns", "dns");
        let d = t.diff();
        let f: Vec<CtFilter> = filters_for(&d).into_iter().map(|(_, f)| f).collect();
        assert_eq!(
            f,
            vec![
                CtFilter::OrigDst {
                    ip: "10.96.0.10".parse().unwrap_or_else(|_| unreachable!()),
                    port: 53
                },
                CtFilter::NodePort { port: 30053 },
            ]
        );
    }

    #[test]
    fn tcp_services_need_no_cleanup() {
        let mut t = tracker();
        t.update_service(
            &ServiceBuilder::new("ns", "web")
                .cluster_ip("10.96.0.1")
                .port("", Protocol::Tcp, 80)
                .build(),
        );
        t.update_endpoint_slice(
            &SliceBuilder::new("ns", "web", "w", "IPv4")
                .port("", Protocol::Tcp, 80)
                .endpoint(Ep::ready("10.0.0.1"))
                .build(),
        );
        assert!(filters_for(&t.diff()).is_empty());
    }
}
