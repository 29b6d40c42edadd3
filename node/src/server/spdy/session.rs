//! The client end of a SPDY/3.1 connection, as much of it as Kubernetes
//! streaming uses (`k8s.io/streaming/pkg/httpstream/spdy` over
//! moby/spdystream): the client opens every stream (odd ids, SYN_STREAM,
//! waits for SYN_REPLY), writes DATA, half-closes with an empty FIN DATA
//! frame, answers the server's PINGs, pings every `ping_period` itself
//! (`RoundTripperConfig.PingPeriod`), and ends with GOAWAY. Streams the
//! server opens are refused (RST_STREAM), as the client connection's
//! `rejectStreams` handler does.
//!
//! No flow control: spdystream neither sends WINDOW_UPDATE nor honours
//! it, so a peer that did would stall after 64 KiB; WINDOW_UPDATE and
//! SETTINGS are read and ignored, as spdystream does.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadHalf, WriteHalf};
use tokio::sync::{Mutex, mpsc, oneshot};

use super::frame::{self, Decoder, Encoder, Frame, FrameError, Headers};

/// How long the server has to accept a stream
/// (`createStreamResponseTimeout` in client-go's remotecommand).
pub const STREAM_REPLY_TIMEOUT: Duration = Duration::from_secs(30);

/// Why a session operation failed.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// The connection failed or ended.
    #[error("SPDY connection: {0}")]
    Io(std::io::Error),
    /// A frame was malformed.
    #[error(transparent)]
    Frame(#[from] FrameError),
    /// The connection is closed.
    #[error("SPDY connection closed")]
    Closed,
    /// The server reset the stream instead of accepting it.
    #[error("SPDY stream {0} was reset by the server")]
    Reset(u32),
    /// The server did not answer a new stream in time.
    #[error("timed out waiting for the server to accept SPDY stream {0}")]
    Timeout(u32),
}

/// The I/O error stays in the text and is not a source, so a printed
/// chain says it once.
impl From<std::io::Error> for SessionError {
    fn from(e: std::io::Error) -> Self {
        SessionError::Io(e)
    }
}

struct StreamSlot {
    /// Sends the SYN_REPLY (or a reset) to `open`.
    reply: Option<oneshot::Sender<Result<(), SessionError>>>,
    /// Where the stream's DATA goes; dropped at FIN or reset.
    data: Option<mpsc::Sender<Bytes>>,
}

struct Writer<W> {
    io: WriteHalf<W>,
    enc: Encoder,
    buf: BytesMut,
}

struct Shared<W> {
    writer: Mutex<Option<Writer<W>>>,
    streams: std::sync::Mutex<HashMap<u32, StreamSlot>>,
    next_id: Mutex<u32>,
    ping_id: AtomicU32,
}

/// A client SPDY connection; cheap to clone.
pub struct Connection<W> {
    shared: Arc<Shared<W>>,
}

impl<W> Clone for Connection<W> {
    fn clone(&self) -> Self {
        Connection {
            shared: self.shared.clone(),
        }
    }
}

impl<W> std::fmt::Debug for Connection<W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("spdy::Connection").finish_non_exhaustive()
    }
}

/// One stream the client opened.
#[derive(Debug)]
pub struct Stream<W> {
    /// Its id.
    pub id: u32,
    conn: Connection<W>,
    /// DATA from the server; `None` once it half-closed or reset.
    pub rx: mpsc::Receiver<Bytes>,
}

impl<W> Stream<W>
where
    W: AsyncRead + AsyncWrite + Send + 'static,
{
    /// Sends `data` (split into frames as needed).
    pub async fn write(&self, data: &[u8]) -> Result<(), SessionError> {
        for chunk in data.chunks(frame::MAX_DATA_LENGTH) {
            self.conn
                .send(&Frame::Data {
                    stream_id: self.id,
                    flags: 0,
                    data: Bytes::copy_from_slice(chunk),
                })
                .await?;
        }
        Ok(())
    }

    /// Half-closes this side (an empty DATA frame with FIN).
    pub async fn close_write(&self) -> Result<(), SessionError> {
        self.conn
            .send(&Frame::Data {
                stream_id: self.id,
                flags: frame::FLAG_FIN,
                data: Bytes::new(),
            })
            .await
    }
}

impl<W> Connection<W>
where
    W: AsyncRead + AsyncWrite + Send + 'static,
{
    /// Starts the client end on an upgraded connection: a reader task,
    /// and a pinger when `ping_period` is set. Both end with the
    /// connection.
    pub fn start(io: W, ping_period: Option<Duration>) -> Result<Self, SessionError> {
        let (r, w) = tokio::io::split(io);
        let shared = Arc::new(Shared {
            writer: Mutex::new(Some(Writer {
                io: w,
                enc: Encoder::new()?,
                buf: BytesMut::new(),
            })),
            streams: std::sync::Mutex::new(HashMap::new()),
            next_id: Mutex::new(1),
            ping_id: AtomicU32::new(1),
        });
        let conn = Connection { shared };
        tokio::spawn(conn.clone().read_loop(r));
        if let Some(period) = ping_period {
            let weak = Arc::downgrade(&conn.shared);
            tokio::spawn(async move {
                let mut t = tokio::time::interval(period);
                t.tick().await;
                loop {
                    t.tick().await;
                    let Some(shared) = weak.upgrade() else { return };
                    let c = Connection { shared };
                    let id = c.shared.ping_id.fetch_add(2, Ordering::Relaxed);
                    if c.send(&Frame::Ping { id }).await.is_err() {
                        return;
                    }
                }
            });
        }
        Ok(conn)
    }

    /// Writes one frame.
    pub async fn send(&self, f: &Frame) -> Result<(), SessionError> {
        let mut g = self.shared.writer.lock().await;
        let Some(w) = g.as_mut() else {
            return Err(SessionError::Closed);
        };
        w.buf.clear();
        w.enc.encode(f, &mut w.buf)?;
        let r = async {
            w.io.write_all(&w.buf).await?;
            w.io.flush().await
        }
        .await;
        if let Err(e) = r {
            *g = None;
            return Err(e.into());
        }
        Ok(())
    }

    /// Opens a stream with `headers` and waits for the server to accept
    /// it. `fin`: nothing will be written on it (the error stream).
    pub async fn open(&self, headers: Headers, fin: bool) -> Result<Stream<W>, SessionError> {
        let (reply_tx, reply_rx) = oneshot::channel();
        let (data_tx, data_rx) = mpsc::channel(16);
        let id = {
            // Ids must rise in the order the frames go out.
            let mut next = self.shared.next_id.lock().await;
            let id = *next;
            *next += 2;
            if let Ok(mut s) = self.shared.streams.lock() {
                s.insert(
                    id,
                    StreamSlot {
                        reply: Some(reply_tx),
                        data: Some(data_tx),
                    },
                );
            }
            self.send(&Frame::SynStream {
                stream_id: id,
                associated_to: 0,
                priority: 0,
                flags: if fin { frame::FLAG_FIN } else { 0 },
                headers,
            })
            .await?;
            id
        };
        match tokio::time::timeout(STREAM_REPLY_TIMEOUT, reply_rx).await {
            Ok(Ok(Ok(()))) => Ok(Stream {
                id,
                conn: self.clone(),
                rx: data_rx,
            }),
            Ok(Ok(Err(e))) => Err(e),
            Ok(Err(_)) => Err(SessionError::Closed),
            Err(_) => Err(SessionError::Timeout(id)),
        }
    }

    /// GOAWAY, then closes the connection.
    pub async fn close(&self) {
        let _ = self
            .send(&Frame::GoAway {
                last_good_stream_id: 0,
                status: frame::GOAWAY_OK,
            })
            .await;
        let mut g = self.shared.writer.lock().await;
        if let Some(mut w) = g.take() {
            let _ = w.io.shutdown().await;
        }
        self.end_streams();
    }

    fn end_streams(&self) {
        if let Ok(mut s) = self.shared.streams.lock() {
            for (_, mut slot) in s.drain() {
                if let Some(r) = slot.reply.take() {
                    let _ = r.send(Err(SessionError::Closed));
                }
            }
        }
    }

    async fn read_loop(self, mut r: ReadHalf<W>) {
        let mut dec = Decoder::new();
        let mut buf = BytesMut::with_capacity(32 * 1024);
        'read: loop {
            loop {
                let f = match dec.decode(&mut buf) {
                    Ok(Some(f)) => f,
                    Ok(None) => break,
                    Err(e) => {
                        tracing::debug!(error = %e, "SPDY frame error");
                        break 'read;
                    }
                };
                if !self.handle(f).await {
                    break 'read;
                }
            }
            match r.read_buf(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
        // The connection is gone: every stream ends.
        self.end_streams();
        let mut g = self.shared.writer.lock().await;
        if let Some(mut w) = g.take() {
            let _ = w.io.shutdown().await;
        }
    }

    /// Handles one frame; false ends the connection.
    async fn handle(&self, f: Frame) -> bool {
        match f {
            Frame::SynReply {
                stream_id, flags, ..
            } => {
                let reply = self.slot(stream_id, |s| s.reply.take()).flatten();
                if let Some(r) = reply {
                    let _ = r.send(Ok(()));
                }
                if flags & frame::FLAG_FIN != 0 {
                    self.remote_fin(stream_id);
                }
            }
            Frame::Headers {
                stream_id, flags, ..
            } => {
                if flags & frame::FLAG_FIN != 0 {
                    self.remote_fin(stream_id);
                }
            }
            Frame::Data {
                stream_id,
                flags,
                data,
            } => {
                let tx = self.slot(stream_id, |s| s.data.clone()).flatten();
                if let Some(tx) = tx
                    && !data.is_empty()
                {
                    // Waits while the stream's reader is behind (as
                    // spdystream's unbuffered data channel does).
                    let _ = tx.send(data).await;
                }
                if flags & frame::FLAG_FIN != 0 {
                    self.remote_fin(stream_id);
                }
            }
            Frame::RstStream { stream_id, .. } => {
                let slot = self
                    .shared
                    .streams
                    .lock()
                    .ok()
                    .and_then(|mut s| s.remove(&stream_id));
                if let Some(mut slot) = slot
                    && let Some(r) = slot.reply.take()
                {
                    let _ = r.send(Err(SessionError::Reset(stream_id)));
                }
            }
            Frame::SynStream { stream_id, .. } => {
                // Clients accept no streams.
                let _ = self
                    .send(&Frame::RstStream {
                        stream_id,
                        status: frame::RST_CANCEL,
                    })
                    .await;
            }
            Frame::Ping { id } => {
                // Echo the server's (even) pings; ours come back odd.
                if id & 1 == 0 && self.send(&Frame::Ping { id }).await.is_err() {
                    return false;
                }
            }
            Frame::GoAway { .. } => return false,
            Frame::Settings | Frame::WindowUpdate { .. } | Frame::Unknown(_) => {}
        }
        true
    }

    fn slot<T>(&self, id: u32, f: impl FnOnce(&mut StreamSlot) -> T) -> Option<T> {
        self.shared
            .streams
            .lock()
            .ok()
            .and_then(|mut s| s.get_mut(&id).map(f))
    }

    /// The server half-closed `id`: its reader sees the end.
    fn remote_fin(&self, id: u32) {
        if let Ok(mut s) = self.shared.streams.lock()
            && let Some(slot) = s.get_mut(&id)
        {
            slot.data = None;
            if slot.reply.is_none() {
                s.remove(&id);
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn an_io_error_is_said_once_in_the_printed_chain() {
        let e = SessionError::from(std::io::Error::other("broken pipe"));
        let mut chain = e.to_string();
        let mut cur = std::error::Error::source(&e);
        while let Some(s) = cur {
            chain.push_str(&format!(": {s}"));
            cur = s.source();
        }
        assert_eq!(chain, "SPDY connection: broken pipe");
    }

    /// A minimal server end on the other side of a duplex pipe: frames
    /// in, frames out.
    struct Peer {
        io: tokio::io::DuplexStream,
        enc: Encoder,
        dec: Decoder,
        buf: BytesMut,
    }

    impl Peer {
        async fn recv(&mut self) -> Frame {
            loop {
                if let Some(f) = self.dec.decode(&mut self.buf).unwrap() {
                    return f;
                }
                let n = self.io.read_buf(&mut self.buf).await.unwrap();
                assert!(n > 0, "client closed");
            }
        }
        async fn send(&mut self, f: Frame) {
            let mut b = BytesMut::new();
            self.enc.encode(&f, &mut b).unwrap();
            self.io.write_all(&b).await.unwrap();
        }
    }

    fn pair() -> (Connection<tokio::io::DuplexStream>, Peer) {
        let (a, b) = tokio::io::duplex(1 << 16);
        let c = Connection::start(a, None).unwrap();
        let p = Peer {
            io: b,
            enc: Encoder::new().unwrap(),
            dec: Decoder::new(),
            buf: BytesMut::new(),
        };
        (c, p)
    }

    #[tokio::test]
    async fn streams_open_carry_data_and_half_close() {
        let (c, mut p) = pair();
        let opener = {
            let c = c.clone();
            tokio::spawn(async move {
                c.open(vec![("streamType".into(), "stdout".into())], false)
                    .await
            })
        };
        let Frame::SynStream {
            stream_id, headers, ..
        } = p.recv().await
        else {
            panic!("expected SYN_STREAM")
        };
        assert_eq!(stream_id, 1);
        assert_eq!(headers, vec![("streamtype".into(), "stdout".into())]);
        p.send(Frame::SynReply {
            stream_id: 1,
            flags: 0,
            headers: vec![],
        })
        .await;
        let mut s = opener.await.unwrap().unwrap();
        p.send(Frame::Data {
            stream_id: 1,
            flags: 0,
            data: Bytes::from_static(b"out"),
        })
        .await;
        p.send(Frame::Ping { id: 2 }).await;
        p.send(Frame::Data {
            stream_id: 1,
            flags: frame::FLAG_FIN,
            data: Bytes::new(),
        })
        .await;
        assert_eq!(s.rx.recv().await.unwrap(), Bytes::from_static(b"out"));
        assert_eq!(s.rx.recv().await, None);
        // The server's ping is echoed.
        assert_eq!(p.recv().await, Frame::Ping { id: 2 });
        s.write(b"in").await.unwrap();
        s.close_write().await.unwrap();
        assert_eq!(
            p.recv().await,
            Frame::Data {
                stream_id: 1,
                flags: 0,
                data: Bytes::from_static(b"in")
            }
        );
        assert_eq!(
            p.recv().await,
            Frame::Data {
                stream_id: 1,
                flags: frame::FLAG_FIN,
                data: Bytes::new()
            }
        );
        // A second stream takes the next odd id; a reset refuses it.
        let opener = {
            let c = c.clone();
            tokio::spawn(async move { c.open(vec![], true).await })
        };
        let Frame::SynStream {
            stream_id, flags, ..
        } = p.recv().await
        else {
            panic!("expected SYN_STREAM")
        };
        assert_eq!((stream_id, flags), (3, frame::FLAG_FIN));
        p.send(Frame::RstStream {
            stream_id: 3,
            status: frame::RST_CANCEL,
        })
        .await;
        assert!(matches!(opener.await.unwrap(), Err(SessionError::Reset(3))));
        c.close().await;
        assert!(matches!(p.recv().await, Frame::GoAway { .. }));
    }

    #[tokio::test]
    async fn a_lost_connection_ends_every_stream() {
        let (c, mut p) = pair();
        let opener = {
            let c = c.clone();
            tokio::spawn(async move { c.open(vec![], false).await })
        };
        let _ = p.recv().await;
        p.send(Frame::SynReply {
            stream_id: 1,
            flags: 0,
            headers: vec![],
        })
        .await;
        let mut s = opener.await.unwrap().unwrap();
        let pending = {
            let c = c.clone();
            tokio::spawn(async move { c.open(vec![], false).await })
        };
        let _ = p.recv().await;
        drop(p);
        assert_eq!(s.rx.recv().await, None);
        assert!(pending.await.unwrap().is_err());
    }
}
