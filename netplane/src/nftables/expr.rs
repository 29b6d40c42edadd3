//! nf_tables expressions keelson uses, as plain data (comparable, so the
//! backend can tell whether a chain changed) with their netlink encoding.
//! Registers follow what `nft` emits: `NFT_REG_1` (= 32-bit register 8) for
//! single values, consecutive 32-bit registers for concatenations.

use netlink_bindings::nftables::{PushExprAttrs, PushExprListAttrs};
use netlink_bindings::traits::Pusher;
use netlink_bindings::utils::{finalize_nested_header, push_header, push_nested_header};

/// The verdict register.
pub const REG_VERDICT: u32 = 0;
/// `NFT_REG_1` (16 bytes, aliases 32-bit registers 8..11).
pub const REG_1: u32 = 1;
/// `NFT_REG_2`.
pub const REG_2: u32 = 2;
/// `NFT_REG32_00`: 32-bit register `n` is `REG32_00 + n`.
pub const REG32_00: u32 = 8;

/// A verdict (rule action or verdict-map value).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Verdict {
    /// `accept`
    Accept,
    /// `drop`
    Drop,
    /// `return`
    Return,
    /// `jump <chain>`
    Jump(String),
    /// `goto <chain>`
    Goto(String),
}

impl Verdict {
    /// The kernel verdict code (`NF_DROP`, `NFT_JUMP`, ...).
    pub fn code(&self) -> i32 {
        match self {
            Verdict::Drop => 0,
            Verdict::Accept => 1,
            Verdict::Jump(_) => -3,
            Verdict::Goto(_) => -4,
            Verdict::Return => -5,
        }
    }

    /// The chain a jump or goto names.
    pub fn chain(&self) -> Option<&str> {
        match self {
            Verdict::Jump(c) | Verdict::Goto(c) => Some(c),
            _ => None,
        }
    }

    /// Writes `NFTA_DATA_VERDICT { code, chain }` into a data attribute.
    pub fn encode_data<P: Pusher>(&self, data: netlink_bindings::nftables::PushDataAttrs<P>) -> P {
        let mut v = data.nested_verdict().push_code(self.code() as u32);
        if let Some(chain) = self.chain() {
            v = v.push_chain_bytes(chain.as_bytes());
        }
        v.end_nested().end_nested()
    }
}

/// Where a payload load reads from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PayloadBase {
    /// Network header (IP).
    Network = 1,
    /// Transport header (TCP/UDP/SCTP).
    Transport = 2,
}

/// Meta keys used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MetaKey {
    /// `meta mark`
    Mark = 3,
    /// `meta iifname`
    IifName = 6,
    /// `meta l4proto`
    L4Proto = 16,
}

/// `fib` lookups used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FibOn {
    /// `fib saddr type`
    Saddr = 1,
    /// `fib daddr type`
    Daddr = 2,
}

/// One expression.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Expr {
    /// Load `len` bytes at `offset` of a header into `dreg`.
    Payload {
        /// Destination register.
        dreg: u32,
        /// Header.
        base: PayloadBase,
        /// Offset in the header.
        offset: u32,
        /// Length.
        len: u32,
    },
    /// Load a meta key.
    Meta {
        /// Destination register.
        dreg: u32,
        /// Key.
        key: MetaKey,
    },
    /// Set a meta key from a register.
    MetaSet {
        /// Key.
        key: MetaKey,
        /// Source register.
        sreg: u32,
    },
    /// Compare a register with data.
    Cmp {
        /// Source register.
        sreg: u32,
        /// `!=` instead of `==`.
        neq: bool,
        /// Data (exact bytes).
        data: Vec<u8>,
    },
    /// `dreg = (sreg & mask) ^ xor`.
    Bitwise {
        /// Source register.
        sreg: u32,
        /// Destination register.
        dreg: u32,
        /// Mask.
        mask: Vec<u8>,
        /// Xor.
        xor: Vec<u8>,
    },
    /// Set/map lookup.
    Lookup {
        /// Source register (start of the key).
        sreg: u32,
        /// Set name.
        set: String,
        /// Destination register (verdict maps: 0).
        dreg: Option<u32>,
        /// Match when absent.
        invert: bool,
    },
    /// Load an immediate verdict (the rule's action).
    Verdict(Verdict),
    /// Load immediate data into a register.
    Immediate {
        /// Destination register.
        dreg: u32,
        /// Data.
        data: Vec<u8>,
    },
    /// `numgen random mod <modulus> [offset <offset>]` into `dreg`.
    NumgenRandom {
        /// Destination register.
        dreg: u32,
        /// Modulus.
        modulus: u32,
        /// Added to the result (0: none).
        offset: u32,
    },
    /// `dnat to <addr reg>:<port reg>`.
    Dnat {
        /// `NFPROTO_*`.
        nfproto: u8,
        /// Register holding the address.
        addr_reg: u32,
        /// Register holding the port.
        port_reg: u32,
    },
    /// `masquerade fully-random`.
    MasqueradeFullyRandom,
    /// `reject` (ICMP/ICMPv6 port unreachable).
    Reject {
        /// ICMP code (3 for IPv4, 4 for IPv6: port unreachable).
        icmp_code: u8,
    },
    /// `fib <saddr|daddr> type` into `dreg`.
    FibAddrType {
        /// Destination register.
        dreg: u32,
        /// Which address.
        on: FibOn,
    },
    /// `ct state` into `dreg`.
    CtState {
        /// Destination register.
        dreg: u32,
    },
    /// `ct status` into `dreg`.
    CtStatus {
        /// Destination register.
        dreg: u32,
    },
    /// `update @set { <key reg> }`.
    DynsetUpdate {
        /// Set name.
        set: String,
        /// Key register.
        sreg: u32,
    },
}

impl Expr {
    /// Appends this expression to a rule's expression list.
    pub fn encode<P: Pusher>(&self, list: PushExprListAttrs<P>) -> PushExprListAttrs<P> {
        let elem: PushExprAttrs<PushExprListAttrs<P>> = list.nested_elem();
        match self {
            Expr::Payload {
                dreg,
                base,
                offset,
                len,
            } => elem
                .nested_data_payload()
                .push_dreg(*dreg)
                .push_base(*base as u32)
                .push_offset(*offset)
                .push_len(*len)
                .end_nested()
                .end_nested(),
            Expr::Meta { dreg, key } => elem
                .nested_data_meta()
                .push_key(*key as u32)
                .push_dreg(*dreg)
                .end_nested()
                .end_nested(),
            Expr::MetaSet { key, sreg } => elem
                .nested_data_meta()
                .push_key(*key as u32)
                .push_sreg(*sreg)
                .end_nested()
                .end_nested(),
            Expr::Cmp { sreg, neq, data } => elem
                .nested_data_cmp()
                .push_sreg(*sreg)
                .push_op(u32::from(*neq))
                .nested_data()
                .push_value(data)
                .end_nested()
                .end_nested()
                .end_nested(),
            Expr::Bitwise {
                sreg,
                dreg,
                mask,
                xor,
            } => elem
                .nested_data_bitwise()
                .push_sreg(*sreg)
                .push_dreg(*dreg)
                .push_len(mask.len() as u32)
                .nested_mask()
                .push_value(mask)
                .end_nested()
                .nested_xor()
                .push_value(xor)
                .end_nested()
                .end_nested()
                .end_nested(),
            Expr::Lookup {
                sreg,
                set,
                dreg,
                invert,
            } => encode_lookup(elem, set, *sreg, *dreg, *invert),
            Expr::Verdict(v) => {
                let data = elem
                    .nested_data_immediate()
                    .push_dreg(REG_VERDICT)
                    .nested_data();
                v.encode_data(data).end_nested().end_nested()
            }
            Expr::Immediate { dreg, data } => elem
                .nested_data_immediate()
                .push_dreg(*dreg)
                .nested_data()
                .push_value(data)
                .end_nested()
                .end_nested()
                .end_nested(),
            Expr::NumgenRandom {
                dreg,
                modulus,
                offset,
            } => encode_numgen_random(elem, *dreg, *modulus, *offset),
            Expr::Dnat {
                nfproto,
                addr_reg,
                port_reg,
            } => elem
                .nested_data_nat()
                .push_type(1)
                .push_family(u32::from(*nfproto))
                .push_reg_addr_min(*addr_reg)
                .push_reg_proto_min(*port_reg)
                // NF_NAT_RANGE_PROTO_SPECIFIED (the address flag is implied by the register).
                .push_flags(0x2)
                .end_nested()
                .end_nested(),
            Expr::MasqueradeFullyRandom => encode_masquerade_fully_random(elem),
            Expr::Reject { icmp_code } => elem
                .nested_data_reject()
                .push_type(0)
                .push_icmp_code(*icmp_code)
                .end_nested()
                .end_nested(),
            Expr::FibAddrType { dreg, on } => elem
                .nested_data_fib()
                .push_flags(*on as u32)
                .push_result(3)
                .push_dreg(*dreg)
                .end_nested()
                .end_nested(),
            Expr::CtState { dreg } => elem
                .nested_data_ct()
                .push_key(0)
                .push_dreg(*dreg)
                .end_nested()
                .end_nested(),
            // NFT_CT_STATUS
            Expr::CtStatus { dreg } => elem
                .nested_data_ct()
                .push_key(2)
                .push_dreg(*dreg)
                .end_nested()
                .end_nested(),
            Expr::DynsetUpdate { set, sreg } => encode_dynset_update(elem, set, *sreg),
        }
    }
}

/// `lookup` is written by hand: the bindings' lookup attribute numbers do
/// not match the kernel's (`NFTA_LOOKUP_SET` 1, `SREG` 2, `DREG` 3,
/// `SET_ID` 4, `FLAGS` 5).
fn encode_lookup<P: Pusher>(
    elem: PushExprAttrs<PushExprListAttrs<P>>,
    set: &str,
    sreg: u32,
    dreg: Option<u32>,
    invert: bool,
) -> PushExprListAttrs<P> {
    const NFTA_EXPR_DATA: u16 = 2;
    const NFTA_LOOKUP_SET: u16 = 1;
    const NFTA_LOOKUP_SREG: u16 = 2;
    const NFTA_LOOKUP_DREG: u16 = 3;
    const NFTA_LOOKUP_FLAGS: u16 = 5;
    const NFT_LOOKUP_F_INV: u32 = 1;
    let mut elem = elem.push_name(c"lookup");
    let buf = elem.as_vec_mut();
    let data = push_nested_header(buf, NFTA_EXPR_DATA);
    push_header(buf, NFTA_LOOKUP_SREG, 4);
    buf.extend(sreg.to_be_bytes());
    if let Some(d) = dreg {
        push_header(buf, NFTA_LOOKUP_DREG, 4);
        buf.extend(d.to_be_bytes());
    }
    let name = set.as_bytes();
    push_header(buf, NFTA_LOOKUP_SET, (name.len() + 1) as u16);
    buf.extend_from_slice(name);
    buf.push(0);
    if invert {
        push_header(buf, NFTA_LOOKUP_FLAGS, 4);
        buf.extend(NFT_LOOKUP_F_INV.to_be_bytes());
    }
    finalize_nested_header(buf, data);
    elem.end_nested()
}

/// `numgen` is written by hand: the bindings encode its register in host
/// byte order (`NFTA_NG_DREG` 1, `MODULUS` 2, `TYPE` 3 = `NFT_NG_RANDOM`,
/// `OFFSET` 4).
fn encode_numgen_random<P: Pusher>(
    elem: PushExprAttrs<PushExprListAttrs<P>>,
    dreg: u32,
    modulus: u32,
    offset: u32,
) -> PushExprListAttrs<P> {
    const NFTA_EXPR_DATA: u16 = 2;
    let mut elem = elem.push_name(c"numgen");
    let buf = elem.as_vec_mut();
    let data = push_nested_header(buf, NFTA_EXPR_DATA);
    for (ty, value) in [(1u16, dreg), (2, modulus), (3, 1)] {
        push_header(buf, ty, 4);
        buf.extend(value.to_be_bytes());
    }
    if offset != 0 {
        push_header(buf, 4, 4);
        buf.extend(offset.to_be_bytes());
    }
    finalize_nested_header(buf, data);
    elem.end_nested()
}

/// The bindings have no typed encoder for `masq`: `NFTA_MASQ_FLAGS` =
/// `NF_NAT_RANGE_PROTO_RANDOM_FULLY`.
fn encode_masquerade_fully_random<P: Pusher>(
    elem: PushExprAttrs<PushExprListAttrs<P>>,
) -> PushExprListAttrs<P> {
    const NFTA_EXPR_DATA: u16 = 2;
    const NFTA_MASQ_FLAGS: u16 = 1;
    const NF_NAT_RANGE_PROTO_RANDOM_FULLY: u32 = 0x10;
    let mut elem = elem.push_name(c"masq");
    let buf = elem.as_vec_mut();
    let data = push_nested_header(buf, NFTA_EXPR_DATA);
    push_header(buf, NFTA_MASQ_FLAGS, 4);
    buf.extend(NF_NAT_RANGE_PROTO_RANDOM_FULLY.to_be_bytes());
    finalize_nested_header(buf, data);
    elem.end_nested()
}

/// The bindings have no typed encoder for `dynset`; its attributes
/// (`NFTA_DYNSET_*`, include/uapi/linux/netfilter/nf_tables.h) are written
/// with the crate's raw attribute helpers.
fn encode_dynset_update<P: Pusher>(
    elem: PushExprAttrs<PushExprListAttrs<P>>,
    set: &str,
    sreg: u32,
) -> PushExprListAttrs<P> {
    const NFTA_EXPR_DATA: u16 = 2;
    const NFTA_DYNSET_SET_NAME: u16 = 1;
    const NFTA_DYNSET_OP: u16 = 3;
    const NFTA_DYNSET_SREG_KEY: u16 = 4;
    const NFT_DYNSET_OP_UPDATE: u32 = 1;
    let mut elem = elem.push_name(c"dynset");
    let buf = elem.as_vec_mut();
    let data = push_nested_header(buf, NFTA_EXPR_DATA);
    push_header(buf, NFTA_DYNSET_SREG_KEY, 4);
    buf.extend(sreg.to_be_bytes());
    push_header(buf, NFTA_DYNSET_OP, 4);
    buf.extend(NFT_DYNSET_OP_UPDATE.to_be_bytes());
    let name = set.as_bytes();
    push_header(buf, NFTA_DYNSET_SET_NAME, (name.len() + 1) as u16);
    buf.extend_from_slice(name);
    buf.push(0);
    finalize_nested_header(buf, data);
    elem.end_nested()
}
