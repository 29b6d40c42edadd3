//! The `NETLINK_NETFILTER` socket: sends one batch per transaction and
//! collects the kernel's verdict, plus small get/dump requests used to adopt
//! and verify the table. The socket belongs to the network namespace of the
//! thread that opened it.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};

use nix::sys::socket::{
    AddressFamily, MsgFlags, NetlinkAddr, SockFlag, SockProtocol, SockType, bind, getsockopt, recv,
    send, setsockopt, sockopt,
};

use super::encode::{EncodedBatch, encode_batch};
use super::objects::Op;
use super::wire::{
    self, MsgKind, NLM_F_ACK, NLM_F_DUMP, NLMSG_DONE, NLMSG_ERROR, begin_message, end_message,
};
use crate::model::IpFamily;

/// `NFT_MSG_GETGEN`, used as a fence after a batch.
const MSG_GETGEN: u16 = (10 << 8) | 16;
const RECV_BUF: usize = 1 << 20;

/// A batch the kernel refused.
#[derive(Debug, thiserror::Error)]
#[error("{op}: {source}")]
pub struct Refusal {
    /// The first failing operation.
    pub op: String,
    /// The kernel's error.
    #[source]
    pub source: io::Error,
    /// How many messages failed.
    pub failures: usize,
}

/// Why a batch did not apply.
#[derive(Debug, thiserror::Error)]
pub enum BatchError {
    /// The kernel refused it (nothing changed).
    #[error("kernel refused the transaction at {0}")]
    Refused(Refusal),
    /// The socket failed.
    #[error("netlink: {0}")]
    Io(#[from] io::Error),
}

/// What a batch cost.
#[derive(Debug, Clone, Copy, Default)]
pub struct BatchStats {
    /// Netlink messages sent (without begin/end).
    pub messages: usize,
    /// Bytes sent.
    pub bytes: usize,
}

/// A netfilter netlink socket.
#[derive(Debug)]
pub struct NfSocket {
    fd: OwnedFd,
    seq: u32,
    sndbuf: usize,
    rbuf: Vec<u8>,
}

fn nix_io(e: nix::Error) -> io::Error {
    io::Error::from_raw_os_error(e as i32)
}

impl NfSocket {
    /// Opens a socket in the calling thread's network namespace.
    pub fn open() -> io::Result<NfSocket> {
        let fd = nix::sys::socket::socket(
            AddressFamily::Netlink,
            SockType::Raw,
            SockFlag::SOCK_CLOEXEC,
            SockProtocol::NetlinkNetFilter,
        )
        .map_err(nix_io)?;
        bind(fd.as_raw_fd(), &NetlinkAddr::new(0, 0)).map_err(nix_io)?;
        // Room for the kernel's replies (errors of a large batch, dumps).
        if setsockopt(&fd, sockopt::RcvBufForce, &(8 << 20)).is_err() {
            let _ = setsockopt(&fd, sockopt::RcvBuf, &(8 << 20));
        }
        let sndbuf = getsockopt(&fd, sockopt::SndBuf).map_err(nix_io)?;
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(1);
        Ok(NfSocket {
            fd,
            seq: seed,
            sndbuf,
            rbuf: vec![0; RECV_BUF],
        })
    }

    fn ensure_sndbuf(&mut self, len: usize) -> io::Result<()> {
        // The kernel needs the whole batch in one datagram (one skb).
        if len + 4096 <= self.sndbuf / 2 {
            return Ok(());
        }
        let want = (len + 65_536).next_power_of_two();
        setsockopt(&self.fd, sockopt::SndBufForce, &want)
            .or_else(|_| setsockopt(&self.fd, sockopt::SndBuf, &want))
            .map_err(nix_io)?;
        self.sndbuf = getsockopt(&self.fd, sockopt::SndBuf).map_err(nix_io)?;
        Ok(())
    }

    fn next_seq(&mut self, n: usize) -> u32 {
        let first = self.seq;
        self.seq = self.seq.wrapping_add(n as u32 + 4);
        first
    }

    /// Sends `ops` on table `table` as one atomic transaction. On `Err`
    /// nothing was applied.
    pub fn run_batch(&mut self, table: &str, ops: &[Op]) -> Result<BatchStats, BatchError> {
        if ops.is_empty() {
            return Ok(BatchStats::default());
        }
        let first = self.next_seq(0);
        let batch = encode_batch(table, ops, first);
        self.seq = first.wrapping_add(batch.messages() as u32 + 4);
        self.ensure_sndbuf(batch.bytes.len())?;
        send(self.fd.as_raw_fd(), &batch.bytes, MsgFlags::empty()).map_err(nix_io)?;
        // The kernel processes the batch inside send(); its errors are queued
        // already. A GETGEN request with an ack fences them.
        let fence = self.next_seq(0);
        let mut req = Vec::with_capacity(32);
        let off = begin_message(&mut req, MSG_GETGEN, NLM_F_ACK, fence, 0, 0);
        end_message(&mut req, off);
        send(self.fd.as_raw_fd(), &req, MsgFlags::empty()).map_err(nix_io)?;
        let failures = self.collect_errors(&batch, ops, fence)?;
        match failures {
            None => Ok(BatchStats {
                messages: batch.messages(),
                bytes: batch.bytes.len(),
            }),
            Some(refusal) => Err(BatchError::Refused(refusal)),
        }
    }

    fn collect_errors(
        &mut self,
        batch: &EncodedBatch,
        ops: &[Op],
        fence: u32,
    ) -> io::Result<Option<Refusal>> {
        let mut first: Option<(String, io::Error)> = None;
        let mut failures = 0usize;
        loop {
            let n = recv(self.fd.as_raw_fd(), &mut self.rbuf, MsgFlags::empty()).map_err(nix_io)?;
            let mut done = false;
            for reply in wire::parse_replies(&self.rbuf[..n]) {
                if reply.seq == fence {
                    if reply.msg_type == NLMSG_ERROR {
                        done = true;
                    }
                    continue;
                }
                if reply.msg_type != NLMSG_ERROR {
                    continue;
                }
                let code = wire::error_code(reply.payload);
                if code == 0 {
                    continue;
                }
                failures += 1;
                if first.is_none() {
                    let what = batch
                        .op_of_seq(reply.seq)
                        .and_then(|i| ops.get(i))
                        .map(|op| op.describe())
                        .unwrap_or_else(|| format!("message seq {}", reply.seq));
                    first = Some((what, io::Error::from_raw_os_error(-code)));
                }
            }
            if done {
                break;
            }
        }
        Ok(first.map(|(op, source)| Refusal {
            op,
            source,
            failures,
        }))
    }

    /// Sends a get/dump request and returns the payloads (after `nfgenmsg`)
    /// of the replies. `attrs` writes the request attributes.
    pub fn request(
        &mut self,
        kind: MsgKind,
        family: IpFamily,
        dump: bool,
        attrs: impl FnOnce(&mut Vec<u8>),
    ) -> io::Result<Vec<Vec<u8>>> {
        self.request_raw(kind.msg_type(), dump, wire::nfproto(family), attrs)
    }

    /// A "get" request answered by one message per item (e.g. several set
    /// elements by key): the replies, and the errno that stopped the
    /// kernel (0: it answered every item; the kernel stops at the first
    /// item it cannot answer).
    pub fn request_items(
        &mut self,
        kind: MsgKind,
        family: IpFamily,
        attrs: impl FnOnce(&mut Vec<u8>),
    ) -> io::Result<(Vec<Vec<u8>>, i32)> {
        let mut out = Vec::new();
        let (_, errno) = self.request_items_with(kind, family, attrs, |r| out.push(r.to_vec()))?;
        Ok((out, errno))
    }

    /// Like [`NfSocket::request_items`], handing each reply's payload to
    /// `on_reply` as it is received instead of copying it (reading the
    /// endpoint maps back is one reply per element); returns the number of
    /// replies and the errno.
    pub fn request_items_with(
        &mut self,
        kind: MsgKind,
        family: IpFamily,
        attrs: impl FnOnce(&mut Vec<u8>),
        mut on_reply: impl FnMut(&[u8]),
    ) -> io::Result<(usize, i32)> {
        let seq = self.next_seq(0);
        let mut req = Vec::with_capacity(4096);
        let off = begin_message(
            &mut req,
            kind.msg_type(),
            NLM_F_ACK,
            seq,
            wire::nfproto(family),
            0,
        );
        attrs(&mut req);
        end_message(&mut req, off);
        self.ensure_sndbuf(req.len())?;
        send(self.fd.as_raw_fd(), &req, MsgFlags::empty()).map_err(nix_io)?;
        let mut count = 0;
        loop {
            let n = recv(self.fd.as_raw_fd(), &mut self.rbuf, MsgFlags::empty()).map_err(nix_io)?;
            for reply in wire::parse_replies(&self.rbuf[..n]) {
                if reply.seq != seq {
                    continue;
                }
                if reply.msg_type == NLMSG_ERROR {
                    return Ok((count, -wire::error_code(reply.payload)));
                }
                count += 1;
                on_reply(reply.payload.get(4..).unwrap_or_default());
            }
        }
    }

    /// Like [`NfSocket::request`] for any netfilter subsystem message type
    /// (e.g. conntrack's `(1 << 8) | IPCTNL_MSG_CT_*`).
    pub fn request_raw(
        &mut self,
        msg_type: u16,
        dump: bool,
        nfproto: u8,
        attrs: impl FnOnce(&mut Vec<u8>),
    ) -> io::Result<Vec<Vec<u8>>> {
        let seq = self.next_seq(0);
        let mut req = Vec::with_capacity(256);
        let flags = if dump { NLM_F_DUMP } else { NLM_F_ACK };
        let off = begin_message(&mut req, msg_type, flags, seq, nfproto, 0);
        attrs(&mut req);
        end_message(&mut req, off);
        send(self.fd.as_raw_fd(), &req, MsgFlags::empty()).map_err(nix_io)?;
        let mut out = Vec::new();
        loop {
            let n = recv(self.fd.as_raw_fd(), &mut self.rbuf, MsgFlags::empty()).map_err(nix_io)?;
            let mut done = false;
            for reply in wire::parse_replies(&self.rbuf[..n]) {
                if reply.seq != seq {
                    continue;
                }
                match reply.msg_type {
                    NLMSG_DONE => done = true,
                    NLMSG_ERROR => {
                        let code = wire::error_code(reply.payload);
                        if code != 0 {
                            return Err(io::Error::from_raw_os_error(-code));
                        }
                        done = true;
                    }
                    _ => {
                        out.push(reply.payload.get(4..).unwrap_or_default().to_vec());
                        if !dump {
                            // A "do" request is answered by one message, then an ack.
                        }
                    }
                }
            }
            if done {
                break;
            }
        }
        Ok(out)
    }
}
