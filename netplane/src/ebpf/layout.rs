//! Byte layouts of the socket-LB maps, mirroring `ebpf/src/sock_lb.h`.
//!
//! Keys and values travel as fixed-size byte arrays (aya's `Pod` covers
//! `[u8; N]`), so no `unsafe` is needed to share structs with the kernel.
//! Addresses are four 32-bit words in network byte order (IPv4 in word 0),
//! ports in network byte order, every other integer in host byte order —
//! exactly what the C structs hold.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// `AF_INET` as the programs store it.
pub const FAMILY_V4: u8 = 2;
/// `AF_INET6` as the programs store it.
pub const FAMILY_V6: u8 = 10;
/// `svc_value.flags`: sessionAffinity ClientIP.
pub const SVC_FLAG_AFFINITY: u8 = 0x01;
/// `affinity_key.kind` of ClientIP affinity entries.
pub const AFFINITY_KIND_CLIENT: u32 = 0;
/// `affinity_key.kind` of unconnected-UDP flow entries.
pub const AFFINITY_KIND_UDP_FLOW: u32 = 1;

/// Encoded `struct kl_svc_key`.
pub type SvcKeyBytes = [u8; 20];
/// Encoded `struct kl_svc_value`.
pub type SvcValueBytes = [u8; 16];
/// Encoded `struct kl_backend_key`.
pub type BackendKeyBytes = [u8; 8];
/// Encoded `struct kl_backend_value`.
pub type BackendValueBytes = [u8; 20];
/// Encoded `struct kl_member_key`.
pub type MemberKeyBytes = [u8; 24];
/// Encoded `struct kl_affinity_key`.
pub type AffinityKeyBytes = [u8; 16];
/// Encoded `struct kl_affinity_value`.
pub type AffinityValueBytes = [u8; 32];
/// Encoded `struct kl_revnat_key`.
pub type RevNatKeyBytes = [u8; 32];
/// Encoded `struct kl_revnat_value`.
pub type RevNatValueBytes = [u8; 20];

/// Layer-4 protocols the socket LB translates. SCTP is not among them: it
/// stays on nftables (see docs/design/ebpf.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum L4Proto {
    /// TCP (`IPPROTO_TCP` = 6).
    Tcp,
    /// UDP (`IPPROTO_UDP` = 17).
    Udp,
}

impl L4Proto {
    /// The IP protocol number.
    pub fn number(self) -> u8 {
        match self {
            L4Proto::Tcp => 6,
            L4Proto::Udp => 17,
        }
    }

    fn from_number(n: u8) -> Option<L4Proto> {
        match n {
            6 => Some(L4Proto::Tcp),
            17 => Some(L4Proto::Udp),
            _ => None,
        }
    }
}

impl std::fmt::Display for L4Proto {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            L4Proto::Tcp => "TCP",
            L4Proto::Udp => "UDP",
        })
    }
}

/// A Service address the socket LB answers for: (VIP, port, protocol).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Frontend {
    /// The Service IP (ClusterIP).
    pub vip: IpAddr,
    /// The Service port.
    pub port: u16,
    /// The protocol of the Service port.
    pub proto: L4Proto,
}

impl std::fmt::Display for Frontend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", SocketAddr::new(self.vip, self.port), self.proto)
    }
}

/// The decoded `struct kl_svc_value`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SvcValue {
    /// Service-port id (key of its slots and members).
    pub id: u32,
    /// Backends in the active generation.
    pub count: u16,
    /// Active generation, 0 or 1.
    pub generation: u8,
    /// `SVC_FLAG_*`.
    pub flags: u8,
    /// ClientIP affinity timeout in seconds.
    pub affinity_timeout: u32,
}

/// The decoded `struct kl_backend_key`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BackendKey {
    /// Service-port id.
    pub svc_id: u32,
    /// Generation of the slot array, 0 or 1.
    pub generation: u8,
    /// Slot index.
    pub slot: u16,
}

/// Family byte of an address.
pub fn family_of(ip: IpAddr) -> u8 {
    match ip {
        IpAddr::V4(_) => FAMILY_V4,
        IpAddr::V6(_) => FAMILY_V6,
    }
}

fn put_addr(buf: &mut [u8], ip: IpAddr) {
    match ip {
        IpAddr::V4(v4) => {
            buf[..4].copy_from_slice(&v4.octets());
            buf[4..16].fill(0);
        }
        IpAddr::V6(v6) => buf[..16].copy_from_slice(&v6.octets()),
    }
}

fn get_addr(buf: &[u8], family: u8) -> Option<IpAddr> {
    match family {
        FAMILY_V4 => {
            let o: [u8; 4] = buf.get(..4)?.try_into().ok()?;
            Some(IpAddr::V4(Ipv4Addr::from(o)))
        }
        FAMILY_V6 => {
            let o: [u8; 16] = buf.get(..16)?.try_into().ok()?;
            Some(IpAddr::V6(Ipv6Addr::from(o)))
        }
        _ => None,
    }
}

fn get_u16_be(buf: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([buf[at], buf[at + 1]])
}

fn get_u16_ne(buf: &[u8], at: usize) -> u16 {
    u16::from_ne_bytes([buf[at], buf[at + 1]])
}

fn get_u32_ne(buf: &[u8], at: usize) -> u32 {
    u32::from_ne_bytes([buf[at], buf[at + 1], buf[at + 2], buf[at + 3]])
}

fn get_u64_ne(buf: &[u8], at: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&buf[at..at + 8]);
    u64::from_ne_bytes(b)
}

/// Encodes a service key.
pub fn svc_key(f: &Frontend) -> SvcKeyBytes {
    let mut b = [0u8; 20];
    put_addr(&mut b[0..16], f.vip);
    b[16..18].copy_from_slice(&f.port.to_be_bytes());
    b[18] = f.proto.number();
    b[19] = family_of(f.vip);
    b
}

/// Decodes a service key; `None` for bytes no keelson version writes.
pub fn decode_svc_key(b: &SvcKeyBytes) -> Option<Frontend> {
    let vip = get_addr(&b[0..16], b[19])?;
    if vip.is_ipv4() && b[4..16].iter().any(|x| *x != 0) {
        return None;
    }
    Some(Frontend {
        vip,
        port: get_u16_be(b, 16),
        proto: L4Proto::from_number(b[18])?,
    })
}

/// Encodes a service value.
pub fn svc_value(v: &SvcValue) -> SvcValueBytes {
    let mut b = [0u8; 16];
    b[0..4].copy_from_slice(&v.id.to_ne_bytes());
    b[4..6].copy_from_slice(&v.count.to_ne_bytes());
    b[6] = v.generation;
    b[7] = v.flags;
    b[8..12].copy_from_slice(&v.affinity_timeout.to_ne_bytes());
    b
}

/// Decodes a service value.
pub fn decode_svc_value(b: &SvcValueBytes) -> Option<SvcValue> {
    if b[6] > 1 {
        return None;
    }
    Some(SvcValue {
        id: get_u32_ne(b, 0),
        count: get_u16_ne(b, 4),
        generation: b[6],
        flags: b[7],
        affinity_timeout: get_u32_ne(b, 8),
    })
}

/// Encodes a backend slot key.
pub fn backend_key(k: &BackendKey) -> BackendKeyBytes {
    let mut b = [0u8; 8];
    b[0..4].copy_from_slice(&k.svc_id.to_ne_bytes());
    b[4..6].copy_from_slice(&k.slot.to_ne_bytes());
    b[6] = k.generation;
    b
}

/// Decodes a backend slot key.
pub fn decode_backend_key(b: &BackendKeyBytes) -> Option<BackendKey> {
    if b[6] > 1 {
        return None;
    }
    Some(BackendKey {
        svc_id: get_u32_ne(b, 0),
        slot: get_u16_ne(b, 4),
        generation: b[6],
    })
}

/// Encodes a backend address (`struct kl_backend_value`, and the same
/// leading layout of `kl_revnat_value`).
pub fn backend_value(addr: SocketAddr) -> BackendValueBytes {
    let mut b = [0u8; 20];
    put_addr(&mut b[0..16], addr.ip());
    b[16..18].copy_from_slice(&addr.port().to_be_bytes());
    b[18] = family_of(addr.ip());
    b
}

/// Decodes a backend address.
pub fn decode_backend_value(b: &BackendValueBytes) -> Option<SocketAddr> {
    Some(SocketAddr::new(
        get_addr(&b[0..16], b[18])?,
        get_u16_be(b, 16),
    ))
}

/// Encodes a membership key (service id, backend).
pub fn member_key(svc_id: u32, addr: SocketAddr) -> MemberKeyBytes {
    let mut b = [0u8; 24];
    b[0..4].copy_from_slice(&svc_id.to_ne_bytes());
    put_addr(&mut b[4..20], addr.ip());
    b[20..22].copy_from_slice(&addr.port().to_be_bytes());
    b[22] = family_of(addr.ip());
    b
}

/// Decodes a membership key.
pub fn decode_member_key(b: &MemberKeyBytes) -> Option<(u32, SocketAddr)> {
    let ip = get_addr(&b[4..20], b[22])?;
    Some((get_u32_ne(b, 0), SocketAddr::new(ip, get_u16_be(b, 20))))
}

/// A decoded affinity entry (for diagnosis and tests).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AffinityEntry {
    /// netns cookie (ClientIP) or socket cookie (UDP flow).
    pub cookie: u64,
    /// Service-port id.
    pub svc_id: u32,
    /// `AFFINITY_KIND_*`.
    pub kind: u32,
    /// The remembered backend.
    pub backend: SocketAddr,
    /// `bpf_ktime_get_ns()` of the last use.
    pub last_used_ns: u64,
}

/// Decodes an affinity entry.
pub fn decode_affinity(k: &AffinityKeyBytes, v: &AffinityValueBytes) -> Option<AffinityEntry> {
    let ip = get_addr(&v[0..16], v[18])?;
    Some(AffinityEntry {
        cookie: get_u64_ne(k, 0),
        svc_id: get_u32_ne(k, 8),
        kind: get_u32_ne(k, 12),
        backend: SocketAddr::new(ip, get_u16_be(v, 16)),
        last_used_ns: get_u64_ne(v, 24),
    })
}

/// Encodes an affinity key.
#[cfg(test)]
pub fn affinity_key(cookie: u64, svc_id: u32, kind: u32) -> AffinityKeyBytes {
    let mut b = [0u8; 16];
    b[0..8].copy_from_slice(&cookie.to_ne_bytes());
    b[8..12].copy_from_slice(&svc_id.to_ne_bytes());
    b[12..16].copy_from_slice(&kind.to_ne_bytes());
    b
}

/// A decoded reverse-translation entry: socket `cookie` talking to
/// `backend` was asked to reach `service`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RevNatEntry {
    /// Socket cookie.
    pub cookie: u64,
    /// The backend the socket really talks to.
    pub backend: SocketAddr,
    /// The Service address the application sees.
    pub service: SocketAddr,
}

/// Decodes a reverse-translation entry.
pub fn decode_revnat(k: &RevNatKeyBytes, v: &RevNatValueBytes) -> Option<RevNatEntry> {
    let backend = SocketAddr::new(get_addr(&k[8..24], k[26])?, get_u16_be(k, 24));
    Some(RevNatEntry {
        cookie: get_u64_ne(k, 0),
        backend,
        service: decode_backend_value(v)?,
    })
}

/// What the socket LB should do for one frontend. The model has already
/// chosen the eligible endpoints (ready ones, else serving-terminating ones;
/// topology and internalTrafficPolicy applied for this node).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LbService {
    /// `namespace/name:port` for logs and errors.
    pub name: String,
    /// `sessionAffinity: ClientIP` timeout in seconds; `None` without affinity.
    pub affinity_timeout: Option<u32>,
    /// The endpoints (IP, target port) new connections may go to.
    pub backends: Vec<SocketAddr>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fe(vip: &str, port: u16, proto: L4Proto) -> Frontend {
        Frontend {
            vip: vip.parse().unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED)),
            port,
            proto,
        }
    }

    #[test]
    fn svc_key_matches_c_layout() {
        let k = svc_key(&fe("10.96.0.10", 53, L4Proto::Udp));
        assert_eq!(&k[0..4], &[10, 96, 0, 10]);
        assert!(k[4..16].iter().all(|b| *b == 0));
        assert_eq!(&k[16..18], &[0, 53], "port in network order");
        assert_eq!(k[18], 17);
        assert_eq!(k[19], FAMILY_V4);
        assert_eq!(decode_svc_key(&k), Some(fe("10.96.0.10", 53, L4Proto::Udp)));
    }

    #[test]
    fn svc_key_v6_round_trips() {
        let f = fe("fd00:96::a", 443, L4Proto::Tcp);
        let k = svc_key(&f);
        assert_eq!(k[19], FAMILY_V6);
        assert_eq!(decode_svc_key(&k), Some(f));
    }

    #[test]
    fn garbage_keys_are_rejected() {
        let mut k = svc_key(&fe("10.0.0.1", 80, L4Proto::Tcp));
        k[18] = 132; // SCTP is never written
        assert_eq!(decode_svc_key(&k), None);
        let mut k = svc_key(&fe("10.0.0.1", 80, L4Proto::Tcp));
        k[19] = 7;
        assert_eq!(decode_svc_key(&k), None);
        let mut v = svc_value(&SvcValue {
            id: 1,
            count: 1,
            generation: 0,
            flags: 0,
            affinity_timeout: 0,
        });
        v[6] = 2;
        assert_eq!(decode_svc_value(&v), None);
    }

    #[test]
    fn svc_value_round_trips() {
        let v = SvcValue {
            id: 77,
            count: 3,
            generation: 1,
            flags: SVC_FLAG_AFFINITY,
            affinity_timeout: 10800,
        };
        let b = svc_value(&v);
        assert_eq!(&b[0..4], &77u32.to_ne_bytes());
        assert_eq!(b[6], 1);
        assert_eq!(b[7], SVC_FLAG_AFFINITY);
        assert_eq!(&b[12..16], &[0, 0, 0, 0], "reserved bytes stay zero");
        assert_eq!(decode_svc_value(&b), Some(v));
    }

    #[test]
    fn backend_and_member_round_trip() {
        let k = BackendKey {
            svc_id: 9,
            generation: 1,
            slot: 300,
        };
        assert_eq!(decode_backend_key(&backend_key(&k)), Some(k));
        let a: SocketAddr = "10.1.2.3:8080"
            .parse()
            .unwrap_or(SocketAddr::from(([0; 4], 0)));
        let v = backend_value(a);
        assert_eq!(&v[16..18], &8080u16.to_be_bytes());
        assert_eq!(decode_backend_value(&v), Some(a));
        assert_eq!(decode_member_key(&member_key(9, a)), Some((9, a)));
        let a6: SocketAddr = "[fd00::5]:53"
            .parse()
            .unwrap_or(SocketAddr::from(([0; 4], 0)));
        assert_eq!(decode_member_key(&member_key(1, a6)), Some((1, a6)));
    }

    #[test]
    fn affinity_and_revnat_decode() {
        let mut v = [0u8; 32];
        v[0..4].copy_from_slice(&[10, 0, 0, 2]);
        v[16..18].copy_from_slice(&80u16.to_be_bytes());
        v[18] = FAMILY_V4;
        v[24..32].copy_from_slice(&5u64.to_ne_bytes());
        let e = decode_affinity(&affinity_key(42, 3, AFFINITY_KIND_CLIENT), &v);
        assert_eq!(
            e,
            Some(AffinityEntry {
                cookie: 42,
                svc_id: 3,
                kind: AFFINITY_KIND_CLIENT,
                backend: SocketAddr::from(([10, 0, 0, 2], 80)),
                last_used_ns: 5
            })
        );
        let mut k = [0u8; 32];
        k[0..8].copy_from_slice(&7u64.to_ne_bytes());
        k[8..12].copy_from_slice(&[10, 0, 0, 2]);
        k[24..26].copy_from_slice(&80u16.to_be_bytes());
        k[26] = FAMILY_V4;
        let svc = backend_value(SocketAddr::from(([10, 96, 0, 1], 8080)));
        let r = decode_revnat(&k, &svc);
        assert_eq!(
            r.map(|r| (r.cookie, r.backend, r.service)),
            Some((
                7,
                SocketAddr::from(([10, 0, 0, 2], 80)),
                SocketAddr::from(([10, 96, 0, 1], 8080))
            ))
        );
    }
}
