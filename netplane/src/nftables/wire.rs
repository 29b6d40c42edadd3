//! Framing of nf_tables netlink messages: netlink header, `nfgenmsg`, batch
//! begin/end, and the message types and flags keelson uses. Attribute
//! payloads are written with the `netlink-bindings` pushers (see
//! [`super::encode`]).

use crate::model::IpFamily;

/// `NETLINK_NETFILTER` message types are `subsystem << 8 | message`.
const NFNL_SUBSYS_NFTABLES: u16 = 10;
/// `NFNL_MSG_BATCH_BEGIN`.
pub const MSG_BATCH_BEGIN: u16 = 0x10;
/// `NFNL_MSG_BATCH_END`.
pub const MSG_BATCH_END: u16 = 0x11;

/// nf_tables message kinds (`NFT_MSG_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u16)]
pub enum MsgKind {
    /// NFT_MSG_NEWTABLE
    NewTable = 0,
    /// NFT_MSG_GETTABLE
    GetTable = 1,
    /// NFT_MSG_DELTABLE
    DelTable = 2,
    /// NFT_MSG_NEWCHAIN
    NewChain = 3,
    /// NFT_MSG_GETCHAIN
    GetChain = 4,
    /// NFT_MSG_DELCHAIN
    DelChain = 5,
    /// NFT_MSG_NEWRULE
    NewRule = 6,
    /// NFT_MSG_GETRULE
    GetRule = 7,
    /// NFT_MSG_DELRULE
    DelRule = 8,
    /// NFT_MSG_NEWSET
    NewSet = 9,
    /// NFT_MSG_GETSET
    GetSet = 10,
    /// NFT_MSG_DELSET
    DelSet = 11,
    /// NFT_MSG_NEWSETELEM
    NewSetElem = 12,
    /// NFT_MSG_GETSETELEM
    GetSetElem = 13,
    /// NFT_MSG_DELSETELEM
    DelSetElem = 14,
}

impl MsgKind {
    /// The netlink message type.
    pub fn msg_type(self) -> u16 {
        (NFNL_SUBSYS_NFTABLES << 8) | self as u16
    }
}

/// `NLM_F_REQUEST`.
pub const NLM_F_REQUEST: u16 = 0x1;
/// `NLM_F_ACK`.
pub const NLM_F_ACK: u16 = 0x4;
/// `NLM_F_DUMP` (ROOT | MATCH).
pub const NLM_F_DUMP: u16 = 0x300;
/// `NLM_F_CREATE`.
pub const NLM_F_CREATE: u16 = 0x400;
/// `NLM_F_APPEND`.
pub const NLM_F_APPEND: u16 = 0x800;
/// `NLMSG_ERROR`.
pub const NLMSG_ERROR: u16 = 2;
/// `NLMSG_DONE`.
pub const NLMSG_DONE: u16 = 3;
/// Size of `struct nlmsghdr`.
pub const NLMSG_HDRLEN: usize = 16;

/// `NFPROTO_*` of a family.
pub fn nfproto(family: IpFamily) -> u8 {
    match family {
        IpFamily::V4 => 2,
        IpFamily::V6 => 10,
    }
}

/// Rounds up to the netlink alignment (4).
pub fn align4(len: usize) -> usize {
    (len + 3) & !3
}

/// Starts a message in `buf`: netlink header (length patched by
/// [`end_message`]) and `nfgenmsg`. Returns the header offset.
pub fn begin_message(
    buf: &mut Vec<u8>,
    msg_type: u16,
    flags: u16,
    seq: u32,
    nfproto: u8,
    res_id: u16,
) -> usize {
    let pad = align4(buf.len()) - buf.len();
    buf.extend(std::iter::repeat_n(0u8, pad));
    let offset = buf.len();
    buf.extend_from_slice(&0u32.to_ne_bytes());
    buf.extend_from_slice(&msg_type.to_ne_bytes());
    buf.extend_from_slice(&(flags | NLM_F_REQUEST).to_ne_bytes());
    buf.extend_from_slice(&seq.to_ne_bytes());
    buf.extend_from_slice(&0u32.to_ne_bytes());
    // struct nfgenmsg { u8 family; u8 version; __be16 res_id; }
    buf.push(nfproto);
    buf.push(0);
    buf.extend_from_slice(&res_id.to_be_bytes());
    offset
}

/// Finishes the message started at `offset` (pads and writes its length).
pub fn end_message(buf: &mut Vec<u8>, offset: usize) {
    let pad = align4(buf.len()) - buf.len();
    buf.extend(std::iter::repeat_n(0u8, pad));
    let len = u32::try_from(buf.len() - offset).unwrap_or(u32::MAX);
    buf[offset..offset + 4].copy_from_slice(&len.to_ne_bytes());
}

/// One message parsed from a netlink reply stream.
#[derive(Debug)]
pub struct Reply<'a> {
    /// Message type.
    pub msg_type: u16,
    /// Sequence number.
    pub seq: u32,
    /// Payload after the netlink header.
    pub payload: &'a [u8],
}

/// Splits a received datagram into messages (stops at a malformed header).
pub fn parse_replies(buf: &[u8]) -> Vec<Reply<'_>> {
    let mut out = Vec::new();
    let mut pos = 0;
    while pos + NLMSG_HDRLEN <= buf.len() {
        let len = u32::from_ne_bytes([buf[pos], buf[pos + 1], buf[pos + 2], buf[pos + 3]]) as usize;
        if len < NLMSG_HDRLEN || pos + len > buf.len() {
            break;
        }
        let msg_type = u16::from_ne_bytes([buf[pos + 4], buf[pos + 5]]);
        let seq = u32::from_ne_bytes([buf[pos + 8], buf[pos + 9], buf[pos + 10], buf[pos + 11]]);
        out.push(Reply {
            msg_type,
            seq,
            payload: &buf[pos + NLMSG_HDRLEN..pos + len],
        });
        pos += align4(len);
    }
    out
}

/// The errno of an `NLMSG_ERROR` payload (0 = ack).
pub fn error_code(payload: &[u8]) -> i32 {
    payload
        .get(0..4)
        .map(|b| i32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
        .unwrap_or(-libc::EBADMSG)
}

/// Renders netlink attributes as `type:hex` / `typeN: ...` (nested), the
/// format `nft -d mnl` dumps reduce to; for diagnostics and tests.
pub fn describe_attrs(buf: &[u8]) -> String {
    let mut out = Vec::new();
    let mut pos = 0;
    while pos + 4 <= buf.len() {
        let len = u16::from_ne_bytes([buf[pos], buf[pos + 1]]) as usize;
        let ty = u16::from_ne_bytes([buf[pos + 2], buf[pos + 3]]);
        if len < 4 || pos + len > buf.len() {
            break;
        }
        let payload = &buf[pos + 4..pos + len];
        if ty & 0x8000 != 0 {
            out.push(format!("{}N: {}", ty & 0x3fff, describe_attrs(payload)));
        } else {
            let hex: String = payload.iter().map(|b| format!("{b:02x}")).collect();
            out.push(format!("{}:{hex}", ty & 0x3fff));
        }
        pos += align4(len);
    }
    out.join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_framing_round_trips() {
        let mut buf = Vec::new();
        let off = begin_message(
            &mut buf,
            MsgKind::NewTable.msg_type(),
            NLM_F_CREATE,
            7,
            2,
            0,
        );
        buf.extend_from_slice(&[1, 2, 3]);
        end_message(&mut buf, off);
        assert_eq!(buf.len(), 24);
        let replies = parse_replies(&buf);
        assert_eq!(replies.len(), 1);
        assert_eq!(replies[0].msg_type, 0x0a00);
        assert_eq!(replies[0].seq, 7);
        assert_eq!(&replies[0].payload[..4], &[2, 0, 0, 0]);
    }
}
