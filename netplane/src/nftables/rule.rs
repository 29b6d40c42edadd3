//! Rules as lists of [`Expr`]s, built with small helpers named after the
//! nft syntax they produce (so `ip saddr 10.0.0.1 jump mark-for-masquerade`
//! is `r.saddr_eq(ip).verdict(Jump(..))`).

use std::net::IpAddr;

use ipnet::IpNet;

use super::expr::{Expr, FibOn, MetaKey, PayloadBase, REG_1, REG_2, REG32_00, Verdict};
use super::slots::SlotBlock;
use crate::model::{IpFamily, Protocol};

/// One rule: expressions and an optional comment.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Rule {
    /// Expressions, in order.
    pub exprs: Vec<Expr>,
    /// `comment "..."`.
    pub comment: Option<String>,
    /// The block of endpoint slots the rule picks from (kept in the rule's
    /// userdata, so a restarted keelson finds the blocks it used).
    pub slots: Option<SlotBlock>,
}

impl Rule {
    /// A fingerprint of the rule's content (expressions, comment, slots
    /// id), written into the rule's userdata: a restarted keelson compares
    /// it with the rule it would write and leaves equal rules alone.
    pub fn fingerprint(&self) -> u64 {
        use std::hash::{Hash, Hasher};
        let mut h = Fnv64::default();
        self.hash(&mut h);
        h.finish()
    }
}

/// FNV-1a, 64 bits: stable for a given build (std's `DefaultHasher` is
/// seeded per process).
pub(super) struct Fnv64(u64);

impl Default for Fnv64 {
    fn default() -> Self {
        Fnv64(0xcbf2_9ce4_8422_2325)
    }
}

impl std::hash::Hasher for Fnv64 {
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 ^= u64::from(*b);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// `RTN_LOCAL`, the `fib ... type local` result.
const RTN_LOCAL: u32 = 2;
/// `NF_CT_STATE_BIT(IP_CT_NEW)`.
const CT_STATE_NEW: u32 = 8;
/// `IPS_DST_NAT` (`ct status dnat`).
const CT_STATUS_DNAT: u32 = 0x20;

fn ip_bytes(ip: &IpAddr) -> Vec<u8> {
    match ip {
        IpAddr::V4(v4) => v4.octets().to_vec(),
        IpAddr::V6(v6) => v6.octets().to_vec(),
    }
}

fn prefix_mask(len: usize, prefix: u8) -> Vec<u8> {
    let mut mask = vec![0u8; len];
    let mut bits = usize::from(prefix);
    for b in mask.iter_mut() {
        let take = bits.min(8);
        *b = if take == 0 { 0 } else { 0xffu8 << (8 - take) };
        bits -= take;
    }
    mask
}

/// Builds one rule for a family.
#[derive(Debug, Clone)]
pub struct RuleBuilder {
    family: IpFamily,
    exprs: Vec<Expr>,
    comment: Option<String>,
}

impl RuleBuilder {
    /// An empty rule.
    pub fn new(family: IpFamily) -> Self {
        RuleBuilder {
            family,
            exprs: Vec::new(),
            comment: None,
        }
    }

    fn addr_offset(&self, source: bool) -> (u32, u32) {
        match (self.family, source) {
            (IpFamily::V4, true) => (12, 4),
            (IpFamily::V4, false) => (16, 4),
            (IpFamily::V6, true) => (8, 16),
            (IpFamily::V6, false) => (24, 16),
        }
    }

    fn load_addr(self, source: bool) -> Self {
        self.load_addr_into(source, REG_1)
    }

    fn load_addr_into(mut self, source: bool, dreg: u32) -> Self {
        let (offset, len) = self.addr_offset(source);
        self.exprs.push(Expr::Payload {
            dreg,
            base: PayloadBase::Network,
            offset,
            len,
        });
        self
    }

    /// The 32-bit register right after an address loaded into `REG_1`
    /// (`REG32_01` for IPv4, `REG32_04` = `REG_2` for IPv6).
    fn after_addr(&self) -> u32 {
        match self.family {
            IpFamily::V4 => REG32_00 + 1,
            IpFamily::V6 => REG32_00 + 4,
        }
    }

    /// `ip saddr <ip>` / `ip saddr != <ip>`.
    pub fn saddr_eq(self, ip: IpAddr, neq: bool) -> Self {
        self.addr_cmp(true, ip, neq)
    }

    /// `ip daddr <ip>`.
    pub fn daddr_eq(self, ip: IpAddr) -> Self {
        self.addr_cmp(false, ip, false)
    }

    fn addr_cmp(mut self, source: bool, ip: IpAddr, neq: bool) -> Self {
        self = self.load_addr(source);
        self.exprs.push(Expr::Cmp {
            sreg: REG_1,
            neq,
            data: ip_bytes(&ip),
        });
        self
    }

    /// `ip saddr <cidr>` / `ip saddr != <cidr>`.
    pub fn saddr_in(self, net: IpNet, neq: bool) -> Self {
        self.addr_in(true, net, neq)
    }

    /// `ip daddr <cidr>` / `ip daddr != <cidr>`.
    pub fn daddr_in(self, net: IpNet, neq: bool) -> Self {
        self.addr_in(false, net, neq)
    }

    fn addr_in(mut self, source: bool, net: IpNet, neq: bool) -> Self {
        let full = match net {
            IpNet::V4(_) => 32,
            IpNet::V6(_) => 128,
        };
        if net.prefix_len() == full {
            return self.addr_cmp(source, net.addr(), neq);
        }
        self = self.load_addr(source);
        let addr = ip_bytes(&net.network());
        let mask = prefix_mask(addr.len(), net.prefix_len());
        self.exprs.push(Expr::Bitwise {
            sreg: REG_1,
            dreg: REG_1,
            xor: vec![0; addr.len()],
            mask,
        });
        self.exprs.push(Expr::Cmp {
            sreg: REG_1,
            neq,
            data: addr,
        });
        self
    }

    /// `ip saddr @set` (`!= @set` when `invert`).
    pub fn saddr_in_set(mut self, set: &str, invert: bool) -> Self {
        self = self.load_addr(true);
        self.exprs.push(Expr::Lookup {
            sreg: REG_1,
            set: set.into(),
            dreg: None,
            invert,
        });
        self
    }

    /// `ip daddr @set`.
    pub fn daddr_in_set(mut self, set: &str) -> Self {
        self = self.load_addr(false);
        self.exprs.push(Expr::Lookup {
            sreg: REG_1,
            set: set.into(),
            dreg: None,
            invert: false,
        });
        self
    }

    /// `ip daddr != 127.0.0.0/8` (IPv4) / `ip6 daddr != ::1` (IPv6).
    pub fn daddr_not_loopback(self) -> Self {
        match self.family {
            IpFamily::V4 => {
                let mut s = self;
                s.exprs.push(Expr::Payload {
                    dreg: REG_1,
                    base: PayloadBase::Network,
                    offset: 16,
                    len: 1,
                });
                s.exprs.push(Expr::Cmp {
                    sreg: REG_1,
                    neq: true,
                    data: vec![127],
                });
                s
            }
            IpFamily::V6 => self.addr_cmp(false, IpAddr::V6(std::net::Ipv6Addr::LOCALHOST), true),
        }
    }

    /// `iifname "<name>"` (`!=` when `neq`).
    pub fn iifname_eq(mut self, name: &str, neq: bool) -> Self {
        let mut data = name.as_bytes().to_vec();
        data.resize(16, 0);
        self.exprs.push(Expr::Meta {
            dreg: REG_1,
            key: MetaKey::IifName,
        });
        self.exprs.push(Expr::Cmp {
            sreg: REG_1,
            neq,
            data,
        });
        self
    }

    /// `iifname "<prefix>*"` (`!=` when `neq`).
    pub fn iifname_prefix(mut self, prefix: &str, neq: bool) -> Self {
        self.exprs.push(Expr::Meta {
            dreg: REG_1,
            key: MetaKey::IifName,
        });
        self.exprs.push(Expr::Cmp {
            sreg: REG_1,
            neq,
            data: prefix.as_bytes().to_vec(),
        });
        self
    }

    /// `meta l4proto <proto>`.
    pub fn l4proto_eq(mut self, proto: Protocol) -> Self {
        self.exprs.push(Expr::Meta {
            dreg: REG_1,
            key: MetaKey::L4Proto,
        });
        self.exprs.push(Expr::Cmp {
            sreg: REG_1,
            neq: false,
            data: vec![proto.number()],
        });
        self
    }

    /// `<proto> dport <port>` (as `meta l4proto <proto> th dport <port>`).
    pub fn dport_eq(mut self, proto: Protocol, port: u16) -> Self {
        self = self.l4proto_eq(proto);
        self.exprs.push(Expr::Payload {
            dreg: REG_1,
            base: PayloadBase::Transport,
            offset: 2,
            len: 2,
        });
        self.exprs.push(Expr::Cmp {
            sreg: REG_1,
            neq: false,
            data: port.to_be_bytes().to_vec(),
        });
        self
    }

    /// `fib <saddr|daddr> type local`.
    pub fn fib_type_local(mut self, on: FibOn) -> Self {
        self.exprs.push(Expr::FibAddrType { dreg: REG_1, on });
        self.exprs.push(Expr::Cmp {
            sreg: REG_1,
            neq: false,
            data: RTN_LOCAL.to_ne_bytes().to_vec(),
        });
        self
    }

    /// `ct state new`.
    pub fn ct_state_new(self) -> Self {
        self.masked_test(Expr::CtState { dreg: REG_1 }, CT_STATE_NEW, true)
    }

    /// `meta mark set meta mark | <bits>`.
    pub fn mark_or(self, bits: u32) -> Self {
        self.mark_rewrite(!bits, bits)
    }

    /// `meta mark set meta mark ^ <bits>`.
    pub fn mark_xor(self, bits: u32) -> Self {
        self.mark_rewrite(u32::MAX, bits)
    }

    /// `meta mark set meta mark & <mask> ^ <xor>`.
    fn mark_rewrite(mut self, mask: u32, xor: u32) -> Self {
        self.exprs.push(Expr::Meta {
            dreg: REG_1,
            key: MetaKey::Mark,
        });
        self.exprs.push(Expr::Bitwise {
            sreg: REG_1,
            dreg: REG_1,
            mask: mask.to_ne_bytes().to_vec(),
            xor: xor.to_ne_bytes().to_vec(),
        });
        self.exprs.push(Expr::MetaSet {
            key: MetaKey::Mark,
            sreg: REG_1,
        });
        self
    }

    /// `meta mark & <bits> != 0`.
    pub fn mark_bits_set(self, bits: u32) -> Self {
        self.masked_test(
            Expr::Meta {
                dreg: REG_1,
                key: MetaKey::Mark,
            },
            bits,
            true,
        )
    }

    /// `ct status dnat`.
    pub fn ct_status_dnat(self) -> Self {
        self.masked_test(Expr::CtStatus { dreg: REG_1 }, CT_STATUS_DNAT, true)
    }

    /// `<load> & <mask> != 0` (`nonzero`) or `== 0`, in register 1.
    fn masked_test(mut self, load: Expr, mask: u32, nonzero: bool) -> Self {
        self.exprs.push(load);
        self.exprs.push(Expr::Bitwise {
            sreg: REG_1,
            dreg: REG_1,
            mask: mask.to_ne_bytes().to_vec(),
            xor: vec![0; 4],
        });
        self.exprs.push(Expr::Cmp {
            sreg: REG_1,
            neq: nonzero,
            data: vec![0; 4],
        });
        self
    }

    /// `ip saddr . ip daddr . meta l4proto . th dport @set`.
    pub fn saddr_daddr_proto_port_in_set(mut self, set: &str) -> Self {
        self = self.load_addr_into(true, REG_1);
        let daddr = self.after_addr();
        self = self.load_addr_into(false, daddr);
        let (proto_reg, port_reg) = match self.family {
            IpFamily::V4 => (REG32_00 + 2, REG32_00 + 3),
            IpFamily::V6 => (REG32_00 + 8, REG32_00 + 9),
        };
        self.exprs.push(Expr::Meta {
            dreg: proto_reg,
            key: MetaKey::L4Proto,
        });
        self.exprs.push(Expr::Payload {
            dreg: port_reg,
            base: PayloadBase::Transport,
            offset: 2,
            len: 2,
        });
        self.exprs.push(Expr::Lookup {
            sreg: REG_1,
            set: set.into(),
            dreg: None,
            invert: false,
        });
        self
    }

    /// `numgen random mod <n> offset <block base>`: one of the block's
    /// first `n` slots, uniformly.
    fn pick_slot(mut self, block: SlotBlock, n: u32) -> Self {
        self.exprs.push(Expr::NumgenRandom {
            dreg: REG_1,
            modulus: n.max(1),
            offset: block.base,
        });
        self
    }

    /// `meta l4proto <proto> dnat ipX addr . port to numgen random mod <n>
    /// offset <base> map @<map>` (ends the rule): one uniformly chosen
    /// endpoint among the `n` first slots of `block`.
    pub fn dnat_slots(self, proto: Protocol, map: &str, block: SlotBlock, n: u32) -> Rule {
        let mut rule = self
            .l4proto_eq(proto)
            .pick_slot(block, n)
            .dnat_from_lookup(map);
        rule.slots = Some(block);
        rule
    }

    /// `numgen random mod <n> offset <base> vmap @<map>` (ends the rule):
    /// goto one uniformly chosen endpoint chain.
    pub fn vmap_slots(mut self, map: &str, block: SlotBlock, n: u32) -> Rule {
        self = self.pick_slot(block, n);
        self.exprs.push(Expr::Lookup {
            sreg: REG_1,
            set: map.into(),
            dreg: Some(0),
            invert: false,
        });
        let mut rule = self.build();
        rule.slots = Some(block);
        rule
    }

    /// `ip daddr . meta l4proto . th dport` into the registers from `REG_1`;
    /// returns the next free 32-bit register.
    fn load_daddr_proto_port(mut self) -> (Self, u32) {
        self = self.load_addr(false);
        let proto_reg = self.after_addr();
        self.exprs.push(Expr::Meta {
            dreg: proto_reg,
            key: MetaKey::L4Proto,
        });
        self.exprs.push(Expr::Payload {
            dreg: proto_reg + 1,
            base: PayloadBase::Transport,
            offset: 2,
            len: 2,
        });
        (self, proto_reg + 2)
    }

    /// `meta l4proto . th dport` into `REG32_00 .. 01`.
    fn load_proto_port(mut self) -> Self {
        self.exprs.push(Expr::Meta {
            dreg: REG_1,
            key: MetaKey::L4Proto,
        });
        self.exprs.push(Expr::Payload {
            dreg: REG32_00 + 1,
            base: PayloadBase::Transport,
            offset: 2,
            len: 2,
        });
        self
    }

    fn dnat_from_lookup(mut self, map: &str) -> Rule {
        self.exprs.push(Expr::Lookup {
            sreg: REG_1,
            set: map.into(),
            dreg: Some(REG_1),
            invert: false,
        });
        let port_reg = self.after_addr();
        self.exprs.push(Expr::Dnat {
            nfproto: super::wire::nfproto(self.family),
            addr_reg: REG_1,
            port_reg,
        });
        self.build()
    }

    /// `dnat ipX addr . port to ip daddr . meta l4proto . th dport . numgen
    /// random mod <n> map @<map>` (ends the rule).
    pub fn dnat_address_list(self, map: &str, n: u32) -> Rule {
        let (mut s, slot_reg) = self.load_daddr_proto_port();
        s.exprs.push(Expr::NumgenRandom {
            dreg: slot_reg,
            modulus: n.max(1),
            offset: 0,
        });
        s.dnat_from_lookup(map)
    }

    /// `dnat ipX addr . port to meta l4proto . th dport . numgen random mod
    /// <n> map @<map>` (ends the rule).
    pub fn dnat_nodeport_list(self, map: &str, n: u32) -> Rule {
        let mut s = self.load_proto_port();
        s.exprs.push(Expr::NumgenRandom {
            dreg: REG32_00 + 2,
            modulus: n.max(1),
            offset: 0,
        });
        s.dnat_from_lookup(map)
    }

    /// `meta mark & <bits> == 0`.
    pub fn mark_bits_clear(self, bits: u32) -> Self {
        self.masked_test(
            Expr::Meta {
                dreg: REG_1,
                key: MetaKey::Mark,
            },
            bits,
            false,
        )
    }

    /// `ip daddr . meta l4proto . th dport vmap @map`.
    pub fn vmap_daddr_proto_port(mut self, map: &str) -> Self {
        self = self.load_addr(false);
        let (proto_reg, port_reg) = match self.family {
            IpFamily::V4 => (REG32_00 + 1, REG32_00 + 2),
            IpFamily::V6 => (REG_2, REG32_00 + 5),
        };
        self.exprs.push(Expr::Meta {
            dreg: proto_reg,
            key: MetaKey::L4Proto,
        });
        self.exprs.push(Expr::Payload {
            dreg: port_reg,
            base: PayloadBase::Transport,
            offset: 2,
            len: 2,
        });
        self.exprs.push(Expr::Lookup {
            sreg: REG_1,
            set: map.into(),
            dreg: Some(0),
            invert: false,
        });
        self
    }

    /// `meta l4proto . th dport vmap @map`.
    pub fn vmap_proto_port(mut self, map: &str) -> Self {
        self.exprs.push(Expr::Meta {
            dreg: REG_1,
            key: MetaKey::L4Proto,
        });
        self.exprs.push(Expr::Payload {
            dreg: REG32_00 + 1,
            base: PayloadBase::Transport,
            offset: 2,
            len: 2,
        });
        self.exprs.push(Expr::Lookup {
            sreg: REG_1,
            set: map.into(),
            dreg: Some(0),
            invert: false,
        });
        self
    }

    /// `numgen random mod <modulus> == 0`.
    pub fn numgen_zero(mut self, modulus: u32) -> Self {
        self.exprs.push(Expr::NumgenRandom {
            dreg: REG_1,
            modulus,
            offset: 0,
        });
        self.exprs.push(Expr::Cmp {
            sreg: REG_1,
            neq: false,
            data: 0u32.to_ne_bytes().to_vec(),
        });
        self
    }

    /// `update @set { ip saddr }`.
    pub fn update_saddr(mut self, set: &str) -> Self {
        self = self.load_addr(true);
        self.exprs.push(Expr::DynsetUpdate {
            set: set.into(),
            sreg: REG_1,
        });
        self
    }

    /// `meta l4proto <proto> dnat to <ip>:<port>` (ends the rule).
    pub fn dnat(mut self, proto: Protocol, ip: IpAddr, port: u16) -> Rule {
        self = self.l4proto_eq(proto);
        self.exprs.push(Expr::Immediate {
            dreg: REG_1,
            data: ip_bytes(&ip),
        });
        self.exprs.push(Expr::Immediate {
            dreg: REG_2,
            data: port.to_be_bytes().to_vec(),
        });
        self.exprs.push(Expr::Dnat {
            nfproto: super::wire::nfproto(self.family),
            addr_reg: REG_1,
            port_reg: REG_2,
        });
        self.build()
    }

    /// `masquerade fully-random` (ends the rule).
    pub fn masquerade(mut self) -> Rule {
        self.exprs.push(Expr::MasqueradeFullyRandom);
        self.build()
    }

    /// `reject` (ends the rule).
    pub fn reject(mut self) -> Rule {
        let icmp_code = match self.family {
            IpFamily::V4 => 3,
            IpFamily::V6 => 4,
        };
        self.exprs.push(Expr::Reject { icmp_code });
        self.build()
    }

    /// Sets the comment.
    pub fn comment(mut self, comment: impl Into<String>) -> Self {
        self.comment = Some(comment.into());
        self
    }

    /// Ends the rule with a verdict.
    pub fn verdict(mut self, v: Verdict) -> Rule {
        self.exprs.push(Expr::Verdict(v));
        self.build()
    }

    /// Ends the rule without a verdict (e.g. a statement like `update`).
    pub fn build(self) -> Rule {
        Rule {
            exprs: self.exprs,
            comment: self.comment,
            slots: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_masks() {
        assert_eq!(prefix_mask(4, 12), vec![0xff, 0xf0, 0, 0]);
        assert_eq!(prefix_mask(4, 0), vec![0, 0, 0, 0]);
        assert_eq!(prefix_mask(16, 64)[7..9], [0xff, 0]);
    }
}
