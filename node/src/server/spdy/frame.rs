//! SPDY/3.1 frames (SPDY Protocol Draft 3.1, section 2), as moby/spdystream's
//! framer reads and writes them (`vendor/github.com/moby/spdystream/spdy/`):
//! the 8-byte frame header, the control frames a Kubernetes stream
//! session uses and DATA frames; header blocks are one zlib stream per
//! direction per connection, primed with the SPDY/3 dictionary and
//! sync-flushed at the end of each block.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress, Status};

/// The protocol version in control frames.
pub const VERSION: u16 = 3;
/// The most bytes one frame carries (24-bit length).
pub const MAX_DATA_LENGTH: usize = (1 << 24) - 1;
/// The most bytes a decompressed header block may take here.
const MAX_HEADER_BLOCK: usize = 1 << 20;
/// FLAG_FIN on SYN_STREAM, SYN_REPLY, HEADERS and DATA.
pub const FLAG_FIN: u8 = 0x01;

const TYPE_SYN_STREAM: u16 = 1;
const TYPE_SYN_REPLY: u16 = 2;
const TYPE_RST_STREAM: u16 = 3;
const TYPE_SETTINGS: u16 = 4;
const TYPE_PING: u16 = 6;
const TYPE_GOAWAY: u16 = 7;
const TYPE_HEADERS: u16 = 8;
const TYPE_WINDOW_UPDATE: u16 = 9;

/// RST_STREAM status CANCEL.
pub const RST_CANCEL: u32 = 5;
/// GOAWAY status OK.
pub const GOAWAY_OK: u32 = 0;

/// Header name/value pairs; names are lower case on the wire, several
/// values of one name are joined by NUL.
pub type Headers = Vec<(String, String)>;

/// One frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// SYN_STREAM: opens a stream.
    SynStream {
        /// The new stream (odd when the client opens it).
        stream_id: u32,
        /// The stream it is associated with (0: none).
        associated_to: u32,
        /// 0 (highest) to 7.
        priority: u8,
        /// FIN / UNIDIRECTIONAL.
        flags: u8,
        /// The headers.
        headers: Headers,
    },
    /// SYN_REPLY: accepts a stream.
    SynReply {
        /// The stream.
        stream_id: u32,
        /// FIN.
        flags: u8,
        /// The headers.
        headers: Headers,
    },
    /// RST_STREAM: ends a stream abnormally.
    RstStream {
        /// The stream.
        stream_id: u32,
        /// Why.
        status: u32,
    },
    /// SETTINGS (read and ignored, as spdystream does).
    Settings,
    /// PING: answered by the peer with the same id.
    Ping {
        /// Odd from the client, even from the server.
        id: u32,
    },
    /// GOAWAY: no new streams.
    GoAway {
        /// The last stream the sender handled.
        last_good_stream_id: u32,
        /// Why.
        status: u32,
    },
    /// HEADERS: more headers on a stream.
    Headers {
        /// The stream.
        stream_id: u32,
        /// FIN.
        flags: u8,
        /// The headers.
        headers: Headers,
    },
    /// WINDOW_UPDATE (read and ignored: spdystream does no flow control).
    WindowUpdate {
        /// The stream (0: the session).
        stream_id: u32,
        /// The window increase.
        delta: u32,
    },
    /// DATA.
    Data {
        /// The stream.
        stream_id: u32,
        /// FIN.
        flags: u8,
        /// The payload.
        data: Bytes,
    },
    /// A control frame type this side does not know (ignored, as the
    /// protocol requires).
    Unknown(u16),
}

/// Why a frame could not be read or written.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FrameError {
    /// A control frame with another protocol version.
    #[error("SPDY: unsupported version {0}")]
    Version(u16),
    /// A frame shorter than its type needs.
    #[error("SPDY: control frame type {kind} too short ({len} bytes)")]
    Short {
        /// The type.
        kind: u16,
        /// Its length.
        len: usize,
    },
    /// The header block did not decompress or parse.
    #[error("SPDY: bad header block: {0}")]
    HeaderBlock(String),
    /// Data too large for one frame.
    #[error("SPDY: frame of {0} bytes is too large")]
    TooLarge(usize),
}

/// The SPDY/3 header compression dictionary (SPDY Protocol Draft 3,
/// section 2.6.10.1): length-prefixed words, then a run of status codes,
/// reason phrases, dates and media types.
pub fn dictionary() -> Vec<u8> {
    const WORDS: &[&str] = &[
        "options",
        "head",
        "post",
        "put",
        "delete",
        "trace",
        "accept",
        "accept-charset",
        "accept-encoding",
        "accept-language",
        "accept-ranges",
        "age",
        "allow",
        "authorization",
        "cache-control",
        "connection",
        "content-base",
        "content-encoding",
        "content-language",
        "content-length",
        "content-location",
        "content-md5",
        "content-range",
        "content-type",
        "date",
        "etag",
        "expect",
        "expires",
        "from",
        "host",
        "if-match",
        "if-modified-since",
        "if-none-match",
        "if-range",
        "if-unmodified-since",
        "last-modified",
        "location",
        "max-forwards",
        "pragma",
        "proxy-authenticate",
        "proxy-authorization",
        "range",
        "referer",
        "retry-after",
        "server",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "user-agent",
        "vary",
        "via",
        "warning",
        "www-authenticate",
        "method",
        "get",
        "status",
        "200 OK",
        "version",
        "HTTP/1.1",
        "url",
        "public",
        "set-cookie",
        "keep-alive",
        "origin",
    ];
    const TAIL: &str = concat!(
        "100101201202205206300302303304305306307402405406407408409410411412413414415416417502504505",
        "203 Non-Authoritative Information",
        "204 No Content",
        "301 Moved Permanently",
        "400 Bad Request",
        "401 Unauthorized",
        "403 Forbidden",
        "404 Not Found",
        "500 Internal Server Error",
        "501 Not Implemented",
        "503 Service Unavailable",
        "Jan Feb Mar Apr May Jun Jul Aug Sept Oct Nov Dec 00:00:00 ",
        "Mon, Tue, Wed, Thu, Fri, Sat, Sun, GMT",
        "chunked,text/html,image/png,image/jpg,image/gif,application/xml,application/xhtml+xml,",
        "text/plain,text/javascript,publicprivatemax-age=gzip,deflate,sdch",
        "charset=utf-8charset=iso-8859-1,utf-,*,enq=0.",
    );
    let mut d = Vec::with_capacity(1423);
    for w in WORDS {
        d.put_u32(w.len() as u32);
        d.extend_from_slice(w.as_bytes());
    }
    d.extend_from_slice(TAIL.as_bytes());
    d
}

/// Writes frames; owns the sending side's header compressor.
pub struct Encoder {
    z: Compress,
}

impl std::fmt::Debug for Encoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Encoder").finish_non_exhaustive()
    }
}

impl Encoder {
    /// A new connection's encoder.
    pub fn new() -> Result<Self, FrameError> {
        // spdystream uses zlib.BestCompression; any level decodes the same.
        let mut z = Compress::new(Compression::best(), true);
        z.set_dictionary(&dictionary())
            .map_err(|e| FrameError::HeaderBlock(e.to_string()))?;
        Ok(Encoder { z })
    }

    fn header_block(&mut self, headers: &Headers) -> Result<Vec<u8>, FrameError> {
        let mut raw = Vec::new();
        raw.put_u32(headers.len() as u32);
        for (k, v) in headers {
            let k = k.to_ascii_lowercase();
            raw.put_u32(k.len() as u32);
            raw.extend_from_slice(k.as_bytes());
            raw.put_u32(v.len() as u32);
            raw.extend_from_slice(v.as_bytes());
        }
        let mut out = Vec::with_capacity(raw.len() + 64);
        let mut input: &[u8] = &raw;
        loop {
            out.reserve(256);
            let before_in = self.z.total_in();
            self.z
                .compress_vec(input, &mut out, FlushCompress::Sync)
                .map_err(|e| FrameError::HeaderBlock(e.to_string()))?;
            let used = (self.z.total_in() - before_in) as usize;
            input = &input[used..];
            // Done once all input is in and the flush left spare room.
            if input.is_empty() && out.len() < out.capacity() {
                break;
            }
        }
        Ok(out)
    }

    /// Appends `frame` to `out`.
    pub fn encode(&mut self, frame: &Frame, out: &mut BytesMut) -> Result<(), FrameError> {
        let control = |out: &mut BytesMut, kind: u16, flags: u8, body: &[u8]| {
            out.put_u16(0x8000 | VERSION);
            out.put_u16(kind);
            out.put_u32((u32::from(flags) << 24) | body.len() as u32);
            out.extend_from_slice(body);
        };
        match frame {
            Frame::SynStream {
                stream_id,
                associated_to,
                priority,
                flags,
                headers,
            } => {
                let block = self.header_block(headers)?;
                let mut b = Vec::with_capacity(10 + block.len());
                b.put_u32(stream_id & 0x7fff_ffff);
                b.put_u32(associated_to & 0x7fff_ffff);
                b.put_u8((priority & 0x07) << 5);
                b.put_u8(0); // slot
                b.extend_from_slice(&block);
                check_len(b.len())?;
                control(out, TYPE_SYN_STREAM, *flags, &b);
            }
            Frame::SynReply {
                stream_id,
                flags,
                headers,
            }
            | Frame::Headers {
                stream_id,
                flags,
                headers,
            } => {
                let kind = if matches!(frame, Frame::SynReply { .. }) {
                    TYPE_SYN_REPLY
                } else {
                    TYPE_HEADERS
                };
                let block = self.header_block(headers)?;
                let mut b = Vec::with_capacity(4 + block.len());
                b.put_u32(stream_id & 0x7fff_ffff);
                b.extend_from_slice(&block);
                check_len(b.len())?;
                control(out, kind, *flags, &b);
            }
            Frame::RstStream { stream_id, status } => {
                let mut b = Vec::with_capacity(8);
                b.put_u32(stream_id & 0x7fff_ffff);
                b.put_u32(*status);
                control(out, TYPE_RST_STREAM, 0, &b);
            }
            Frame::Settings => control(out, TYPE_SETTINGS, 0, &0u32.to_be_bytes()),
            Frame::Ping { id } => control(out, TYPE_PING, 0, &id.to_be_bytes()),
            Frame::GoAway {
                last_good_stream_id,
                status,
            } => {
                let mut b = Vec::with_capacity(8);
                b.put_u32(last_good_stream_id & 0x7fff_ffff);
                b.put_u32(*status);
                control(out, TYPE_GOAWAY, 0, &b);
            }
            Frame::WindowUpdate { stream_id, delta } => {
                let mut b = Vec::with_capacity(8);
                b.put_u32(stream_id & 0x7fff_ffff);
                b.put_u32(delta & 0x7fff_ffff);
                control(out, TYPE_WINDOW_UPDATE, 0, &b);
            }
            Frame::Data {
                stream_id,
                flags,
                data,
            } => {
                check_len(data.len())?;
                out.put_u32(stream_id & 0x7fff_ffff);
                out.put_u32((u32::from(*flags) << 24) | data.len() as u32);
                out.extend_from_slice(data);
            }
            Frame::Unknown(_) => {}
        }
        Ok(())
    }
}

fn check_len(n: usize) -> Result<(), FrameError> {
    if n > MAX_DATA_LENGTH {
        return Err(FrameError::TooLarge(n));
    }
    Ok(())
}

/// Reads frames; owns the receiving side's header decompressor.
pub struct Decoder {
    z: Decompress,
    dict: Vec<u8>,
}

impl std::fmt::Debug for Decoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Decoder").finish_non_exhaustive()
    }
}

impl Default for Decoder {
    fn default() -> Self {
        Self::new()
    }
}

impl Decoder {
    /// A new connection's decoder.
    pub fn new() -> Self {
        Decoder {
            z: Decompress::new(true),
            dict: dictionary(),
        }
    }

    fn inflate(&mut self, mut input: &[u8]) -> Result<Vec<u8>, FrameError> {
        let mut out: Vec<u8> = Vec::with_capacity(input.len() * 4 + 64);
        let bad = |e: String| FrameError::HeaderBlock(e);
        loop {
            if out.len() == out.capacity() {
                if out.len() >= MAX_HEADER_BLOCK {
                    return Err(bad("header block too large".into()));
                }
                out.reserve(out.len().max(256));
            }
            let before_in = self.z.total_in();
            let before_out = out.len();
            let r = self
                .z
                .decompress_vec(input, &mut out, FlushDecompress::Sync);
            let used = (self.z.total_in() - before_in) as usize;
            input = &input[used.min(input.len())..];
            match r {
                Ok(Status::StreamEnd) => break,
                Ok(_) => {
                    if input.is_empty() && out.len() < out.capacity() {
                        break;
                    }
                    if used == 0 && out.len() == before_out && out.len() < out.capacity() {
                        return Err(bad("no progress".into()));
                    }
                }
                Err(e) if e.needs_dictionary().is_some() => {
                    self.z
                        .set_dictionary(&self.dict)
                        .map_err(|e| bad(e.to_string()))?;
                }
                Err(e) => return Err(bad(e.to_string())),
            }
        }
        Ok(out)
    }

    fn header_block(&mut self, compressed: &[u8]) -> Result<Headers, FrameError> {
        let raw = self.inflate(compressed)?;
        let mut b: &[u8] = &raw;
        let bad = || FrameError::HeaderBlock("truncated header block".into());
        let take = |b: &mut &[u8]| -> Result<String, FrameError> {
            if b.remaining() < 4 {
                return Err(bad());
            }
            let n = b.get_u32() as usize;
            if b.remaining() < n {
                return Err(bad());
            }
            let s = String::from_utf8_lossy(&b[..n]).into_owned();
            b.advance(n);
            Ok(s)
        };
        if b.remaining() < 4 {
            return Err(bad());
        }
        let count = b.get_u32() as usize;
        let mut out: Headers = Vec::with_capacity(count.min(64));
        for _ in 0..count {
            let k = take(&mut b)?;
            // spdystream's parseHeaderValueBlock: a name that is not its own
            // strings.ToLower (which also rewrites invalid UTF-8) is
            // UnlowercasedHeaderName, a name seen twice DuplicateHeaders.
            if k.contains(char::REPLACEMENT_CHARACTER) || k.to_lowercase() != k {
                return Err(FrameError::HeaderBlock(format!(
                    "header name {k:?} is not lower case"
                )));
            }
            if out.iter().any(|(n, _)| *n == k) {
                return Err(FrameError::HeaderBlock(format!("duplicate header {k:?}")));
            }
            let v = take(&mut b)?;
            out.push((k, v));
        }
        Ok(out)
    }

    /// Takes one whole frame off the front of `buf`, if there is one.
    pub fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Frame>, FrameError> {
        if buf.len() < 8 {
            return Ok(None);
        }
        let len = (u32::from_be_bytes([0, buf[5], buf[6], buf[7]])) as usize;
        if buf.len() < 8 + len {
            buf.reserve(8 + len - buf.len());
            return Ok(None);
        }
        let mut head = buf.split_to(8);
        let mut body = buf.split_to(len).freeze();
        let first = head.get_u32();
        let flags = head.get_u8();
        if first & 0x8000_0000 == 0 {
            return Ok(Some(Frame::Data {
                stream_id: first & 0x7fff_ffff,
                flags,
                data: body,
            }));
        }
        let version = ((first >> 16) & 0x7fff) as u16;
        let kind = (first & 0xffff) as u16;
        if version != VERSION {
            return Err(FrameError::Version(version));
        }
        let need = |n: usize| {
            if len < n {
                Err(FrameError::Short { kind, len })
            } else {
                Ok(())
            }
        };
        let frame = match kind {
            TYPE_SYN_STREAM => {
                need(10)?;
                let stream_id = body.get_u32() & 0x7fff_ffff;
                let associated_to = body.get_u32() & 0x7fff_ffff;
                let priority = body.get_u8() >> 5;
                let _slot = body.get_u8();
                Frame::SynStream {
                    stream_id,
                    associated_to,
                    priority,
                    flags,
                    headers: self.header_block(&body)?,
                }
            }
            TYPE_SYN_REPLY | TYPE_HEADERS => {
                need(4)?;
                let stream_id = body.get_u32() & 0x7fff_ffff;
                let headers = self.header_block(&body)?;
                if kind == TYPE_SYN_REPLY {
                    Frame::SynReply {
                        stream_id,
                        flags,
                        headers,
                    }
                } else {
                    Frame::Headers {
                        stream_id,
                        flags,
                        headers,
                    }
                }
            }
            TYPE_RST_STREAM => {
                need(8)?;
                Frame::RstStream {
                    stream_id: body.get_u32() & 0x7fff_ffff,
                    status: body.get_u32(),
                }
            }
            TYPE_SETTINGS => Frame::Settings,
            TYPE_PING => {
                need(4)?;
                Frame::Ping { id: body.get_u32() }
            }
            TYPE_GOAWAY => {
                need(8)?;
                Frame::GoAway {
                    last_good_stream_id: body.get_u32() & 0x7fff_ffff,
                    status: body.get_u32(),
                }
            }
            TYPE_WINDOW_UPDATE => {
                need(8)?;
                Frame::WindowUpdate {
                    stream_id: body.get_u32() & 0x7fff_ffff,
                    delta: body.get_u32() & 0x7fff_ffff,
                }
            }
            other => Frame::Unknown(other),
        };
        Ok(Some(frame))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::panic)]
mod tests {
    use super::*;

    fn adler32(d: &[u8]) -> u32 {
        let (mut a, mut b) = (1u32, 0u32);
        for &x in d {
            a = (a + u32::from(x)) % 65521;
            b = (b + a) % 65521;
        }
        (b << 16) | a
    }

    #[test]
    fn dictionary_is_the_spdy3_one() {
        let d = dictionary();
        assert_eq!(d.len(), 1423);
        // The checksum a zlib stream primed with it names (FDICT).
        assert_eq!(adler32(&d), 3_821_447_106);
    }

    fn roundtrip(frames: &[Frame]) -> Vec<Frame> {
        let mut enc = Encoder::new().unwrap();
        let mut dec = Decoder::new();
        let mut wire = BytesMut::new();
        for f in frames {
            enc.encode(f, &mut wire).unwrap();
        }
        let mut out = Vec::new();
        // Fed a byte at a time: frames come out only when whole.
        let mut buf = BytesMut::new();
        for b in wire.iter() {
            buf.put_u8(*b);
            while let Some(f) = dec.decode(&mut buf).unwrap() {
                out.push(f);
            }
        }
        assert!(buf.is_empty());
        out
    }

    #[test]
    fn frames_roundtrip_with_one_zlib_stream_per_direction() {
        let h = |t: &str| vec![("streamtype".to_string(), t.to_string())];
        let frames = vec![
            Frame::SynStream {
                stream_id: 1,
                associated_to: 0,
                priority: 0,
                flags: 0,
                headers: h("error"),
            },
            Frame::SynStream {
                stream_id: 3,
                associated_to: 0,
                priority: 0,
                flags: 0,
                headers: h("stdout"),
            },
            Frame::SynReply {
                stream_id: 3,
                flags: 0,
                headers: vec![],
            },
            Frame::Headers {
                stream_id: 3,
                flags: FLAG_FIN,
                headers: h("x"),
            },
            Frame::Data {
                stream_id: 3,
                flags: 0,
                data: Bytes::from_static(b"hello"),
            },
            Frame::Data {
                stream_id: 3,
                flags: FLAG_FIN,
                data: Bytes::new(),
            },
            Frame::RstStream {
                stream_id: 5,
                status: RST_CANCEL,
            },
            Frame::Ping { id: 7 },
            Frame::WindowUpdate {
                stream_id: 1,
                delta: 65536,
            },
            Frame::GoAway {
                last_good_stream_id: 3,
                status: GOAWAY_OK,
            },
            Frame::Settings,
        ];
        assert_eq!(roundtrip(&frames), frames);
    }

    #[test]
    fn wire_layout() {
        let mut enc = Encoder::new().unwrap();
        let mut w = BytesMut::new();
        enc.encode(&Frame::Ping { id: 1 }, &mut w).unwrap();
        assert_eq!(&w[..], &[0x80, 3, 0, 6, 0, 0, 0, 4, 0, 0, 0, 1]);
        w.clear();
        enc.encode(
            &Frame::Data {
                stream_id: 5,
                flags: FLAG_FIN,
                data: Bytes::from_static(b"ab"),
            },
            &mut w,
        )
        .unwrap();
        assert_eq!(&w[..], &[0, 0, 0, 5, 1, 0, 0, 2, b'a', b'b']);
        // A SYN_STREAM's header block starts a zlib stream that names
        // the dictionary (FDICT) by its checksum.
        w.clear();
        enc.encode(
            &Frame::SynStream {
                stream_id: 1,
                associated_to: 0,
                priority: 0,
                flags: 0,
                headers: vec![],
            },
            &mut w,
        )
        .unwrap();
        assert_eq!(&w[..4], &[0x80, 3, 0, 1]);
        let block = &w[18..];
        assert_eq!(block[0] & 0x0f, 8, "deflate");
        assert_ne!(block[1] & 0x20, 0, "FDICT");
        assert_eq!(&block[2..6], &3_821_447_106u32.to_be_bytes());
    }

    #[test]
    fn bad_input_is_an_error_not_a_panic() {
        let mut dec = Decoder::new();
        let mut b = BytesMut::from(&[0x80, 2, 0, 1, 0, 0, 0, 0][..]);
        assert_eq!(dec.decode(&mut b), Err(FrameError::Version(2)));
        let mut b = BytesMut::from(&[0x80, 3, 0, 3, 0, 0, 0, 2, 0, 0][..]);
        assert!(matches!(dec.decode(&mut b), Err(FrameError::Short { .. })));
        let mut b = BytesMut::from(&[0x80, 3, 0, 2, 0, 0, 0, 6, 0, 0, 0, 1, 0xff, 0xff][..]);
        assert!(matches!(
            dec.decode(&mut b),
            Err(FrameError::HeaderBlock(_))
        ));
    }

    /// A SYN_REPLY for stream 1 carrying `headers` as written (no
    /// lower-casing), compressed as a peer's first header block.
    fn raw_syn_reply(headers: &[(&str, &str)]) -> BytesMut {
        let mut raw = Vec::new();
        raw.put_u32(headers.len() as u32);
        for (k, v) in headers {
            raw.put_u32(k.len() as u32);
            raw.extend_from_slice(k.as_bytes());
            raw.put_u32(v.len() as u32);
            raw.extend_from_slice(v.as_bytes());
        }
        let mut z = Compress::new(Compression::default(), true);
        z.set_dictionary(&dictionary()).unwrap();
        let mut block = Vec::with_capacity(raw.len() + 1024);
        z.compress_vec(&raw, &mut block, FlushCompress::Sync)
            .unwrap();
        let mut w = BytesMut::new();
        w.put_slice(&[0x80, 3, 0, 2]);
        w.put_u32(4 + block.len() as u32);
        w.put_u32(1);
        w.put_slice(&block);
        w
    }

    #[test]
    fn header_names_are_checked_as_spdystream_checks_them() {
        // Found by the spdy_frame fuzz target: an upper-case name was kept
        // (and then not found by its lower-case spelling), where
        // spdystream refuses the frame (UnlowercasedHeaderName).
        let ok = raw_syn_reply(&[("streamtype", "error"), ("port", "80")]);
        let f = Decoder::new().decode(&mut ok.clone()).unwrap();
        assert!(matches!(f, Some(Frame::SynReply { headers, .. }) if headers.len() == 2));
        for bad in [
            raw_syn_reply(&[("streamType", "error")]),
            raw_syn_reply(&[("STREAMTYPE", "error")]),
            raw_syn_reply(&[("\u{c9}t\u{e9}", "x")]),
            // DuplicateHeaders.
            raw_syn_reply(&[("port", "80"), ("port", "81")]),
        ] {
            let mut b = bad;
            assert!(
                matches!(
                    Decoder::new().decode(&mut b),
                    Err(FrameError::HeaderBlock(_))
                ),
                "{b:?}"
            );
        }
    }
}
