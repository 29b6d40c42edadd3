//! Loopback servers for the handler tests: a raw HTTP/1.1 server whose
//! answers a test scripts byte for byte (so odd status codes, hangs and
//! endless bodies are possible) and that records each request head.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// What the server does with one request.
pub enum Reply {
    /// Write these bytes and close.
    Raw(Vec<u8>),
    /// Never answer (hold the connection).
    Hang,
    /// Write these header bytes, then body bytes forever.
    Endless(Vec<u8>),
    /// Write these bytes, then hold the connection without closing.
    PartialThenHang(Vec<u8>),
}

/// A complete response with `Content-Length`.
pub fn response(status: u16, extra_headers: &str, body: &[u8]) -> Reply {
    let mut out = format!(
        "HTTP/1.1 {status} Status\r\nContent-Length: {}\r\n{extra_headers}\r\n",
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(body);
    Reply::Raw(out)
}

/// A request as received: its head, split into lines.
#[derive(Clone, Debug)]
pub struct Seen {
    pub lines: Vec<String>,
}

impl Seen {
    /// The request line, e.g. `GET / HTTP/1.1`.
    pub fn request_line(&self) -> &str {
        self.lines.first().map(String::as_str).unwrap_or("")
    }

    /// The path of the request line.
    pub fn path(&self) -> String {
        self.request_line()
            .split(' ')
            .nth(1)
            .unwrap_or("")
            .to_string()
    }

    /// Values of a header, matched case-insensitively.
    pub fn header(&self, name: &str) -> Vec<String> {
        self.lines
            .iter()
            .skip(1)
            .filter_map(|l| l.split_once(':'))
            .filter(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.trim().to_string())
            .collect()
    }

    /// Header names as written on the wire.
    pub fn header_names(&self) -> Vec<String> {
        self.lines
            .iter()
            .skip(1)
            .filter_map(|l| l.split_once(':'))
            .map(|(n, _)| n.to_string())
            .collect()
    }
}

type Handler = Arc<dyn Fn(&Seen) -> Reply + Send + Sync>;

/// A scripted HTTP server on 127.0.0.1; stops when dropped.
pub struct HttpServer {
    pub addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl HttpServer {
    pub async fn start(handler: impl Fn(&Seen) -> Reply + Send + Sync + 'static) -> HttpServer {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap_or_else(|e| panic!("bind: {e}"));
        let addr = listener
            .local_addr()
            .unwrap_or_else(|e| panic!("addr: {e}"));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let handler: Handler = Arc::new(handler);
        let task = {
            let seen = seen.clone();
            tokio::spawn(async move {
                while let Ok((sock, _)) = listener.accept().await {
                    let handler = handler.clone();
                    let seen = seen.clone();
                    tokio::spawn(async move { serve(sock, handler, seen).await });
                }
            })
        };
        HttpServer { addr, seen, task }
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// Requests received so far.
    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().map(|s| s.clone()).unwrap_or_default()
    }
}

async fn serve(mut sock: TcpStream, handler: Handler, seen: Arc<Mutex<Vec<Seen>>>) {
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match sock.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    let text = String::from_utf8_lossy(&head).to_string();
    let request = Seen {
        lines: text
            .split("\r\n")
            .take_while(|l| !l.is_empty())
            .map(str::to_string)
            .collect(),
    };
    if let Ok(mut s) = seen.lock() {
        s.push(request.clone());
    }
    match handler(&request) {
        Reply::Raw(bytes) => {
            let _ = sock.write_all(&bytes).await;
            let _ = sock.shutdown().await;
        }
        Reply::Hang => {
            tokio::time::sleep(Duration::from_secs(3600)).await;
        }
        Reply::Endless(header) => {
            let _ = sock.write_all(&header).await;
            let chunk = vec![b'x'; 8192];
            while sock.write_all(&chunk).await.is_ok() {}
        }
        Reply::PartialThenHang(bytes) => {
            let _ = sock.write_all(&bytes).await;
            tokio::time::sleep(Duration::from_secs(3600)).await;
        }
    }
}

/// A port on 127.0.0.1 with nothing listening (bound, then released).
pub async fn closed_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap_or_else(|e| panic!("bind: {e}"));
    let port = listener.local_addr().map(|a| a.port()).unwrap_or(0);
    drop(listener);
    port
}
