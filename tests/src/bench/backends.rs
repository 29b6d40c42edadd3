//! The endpoints' servers: one TCP server per backend namespace, listening
//! on the wildcard address so it answers on every address of the
//! namespace's block, greeting each connection with the address it landed
//! on and the backend's name.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::os::fd::OwnedFd;
use std::time::Duration;

use nix::sys::socket::{
    AddressFamily, Backlog, SockFlag, SockType, SockaddrIn, bind, listen, setsockopt, socket,
    sockopt,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::error::{BenchError, Result};
use crate::netns::NetNs;

/// Pending connections a backend's listener queues.
const BACKLOG: i32 = 4096;
/// A probe closes right after the greeting; this bounds a stuck one.
const HOLD_LIMIT: Duration = Duration::from_secs(30);

fn listener_fd(port: u16) -> std::result::Result<OwnedFd, String> {
    let fd = socket(
        AddressFamily::Inet,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
        None,
    )
    .map_err(|e| format!("socket: {e}"))?;
    setsockopt(&fd, sockopt::ReuseAddr, &true).map_err(|e| format!("SO_REUSEADDR: {e}"))?;
    let addr = SockaddrIn::from(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, port));
    bind(std::os::fd::AsRawFd::as_raw_fd(&fd), &addr).map_err(|e| format!("bind: {e}"))?;
    let backlog = Backlog::new(BACKLOG).map_err(|e| format!("backlog: {e}"))?;
    listen(&fd, backlog).map_err(|e| format!("listen: {e}"))?;
    Ok(fd)
}

/// Binds `0.0.0.0:port` inside `ns` (with a deep accept queue).
pub fn bind_in(ns: &NetNs, port: u16) -> Result<tokio::net::TcpListener> {
    let fd = ns
        .run(move || listener_fd(port))?
        .map_err(|e| BenchError::Invalid(format!("listening on :{port} in {}: {e}", ns.name())))?;
    tokio::net::TcpListener::from_std(std::net::TcpListener::from(fd))
        .map_err(|e| BenchError::io("registering a backend listener", e))
}

/// Serves greetings on `listener` until the task is aborted.
pub async fn serve(listener: tokio::net::TcpListener, name: String) {
    loop {
        let (mut stream, _) = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                // Out of descriptors and the like: back off, keep serving.
                tracing::warn!(backend = %name, error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let name = name.clone();
        tokio::spawn(async move {
            let landed = match stream.local_addr() {
                Ok(SocketAddr::V4(a)) => a.ip().to_string(),
                Ok(SocketAddr::V6(a)) => a.ip().to_string(),
                Err(_) => return,
            };
            if stream
                .write_all(format!("{landed} {name}\n").as_bytes())
                .await
                .is_err()
            {
                return;
            }
            // Wait for the client to close (it resets), so the server side
            // never holds TIME_WAIT.
            let mut sink = [0u8; 64];
            let _ = tokio::time::timeout(HOLD_LIMIT, async {
                while let Ok(n) = stream.read(&mut sink).await {
                    if n == 0 {
                        break;
                    }
                }
            })
            .await;
        });
    }
}
