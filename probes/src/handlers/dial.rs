//! Opening the TCP connection every network probe starts with, with Go's
//! `net.Dial` error texts (`dial tcp 10.0.0.5:8080: connect: connection
//! refused`), which is what upstream puts into probe failure messages.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use tokio::net::TcpStream;

use keelson_common::gofmt;

/// Why a connection did not open, in Go's `net.Dial` words.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DialError {
    /// The host name did not resolve.
    #[error("dial tcp: lookup {host}: {reason}")]
    Lookup {
        /// The name.
        host: String,
        /// The resolver's reason (`no such host`, ...).
        reason: String,
    },
    /// The connection was refused or failed.
    #[error("dial tcp {address}: connect: {reason}")]
    Connect {
        /// `host:port` as dialled.
        address: String,
        /// The system's reason, as Go prints it.
        reason: String,
    },
}

/// Connects to `host:port`. An IP literal is dialled directly, a name is
/// resolved first (every address is tried in turn) and an empty host means
/// the local system, as with Go's dialer. No timeout here: callers bound the
/// whole probe.
pub async fn dial(host: &str, port: u16) -> Result<TcpStream, DialError> {
    let shown = gofmt::join_host_port(host, port);
    if host.is_empty() {
        return connect(
            SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port),
            &shown,
        )
        .await;
    }
    if let Ok(ip) = host.parse::<IpAddr>() {
        return connect(SocketAddr::new(ip, port), &shown).await;
    }
    let addrs: Vec<SocketAddr> = match tokio::net::lookup_host((host, port)).await {
        Ok(addrs) => addrs.collect(),
        Err(err) => {
            return Err(DialError::Lookup {
                host: host.to_string(),
                reason: lookup_error_text(&err),
            });
        }
    };
    let mut last = DialError::Lookup {
        host: host.to_string(),
        reason: "no such host".to_string(),
    };
    for addr in addrs {
        match connect(addr, &addr.to_string()).await {
            Ok(stream) => return Ok(stream),
            Err(err) => last = err,
        }
    }
    Err(last)
}

async fn connect(addr: SocketAddr, shown: &str) -> Result<TcpStream, DialError> {
    match TcpStream::connect(addr).await {
        Ok(stream) => {
            // Probes send one small request and wait for the answer.
            let _ = stream.set_nodelay(true);
            Ok(stream)
        }
        Err(err) => Err(DialError::Connect {
            address: shown.to_string(),
            reason: gofmt::os_error_text(&err),
        }),
    }
}

/// The text of a resolver failure; getaddrinfo's "Name or service not known"
/// reads `no such host` in Go.
fn lookup_error_text(err: &std::io::Error) -> String {
    let text = err.to_string();
    if text.contains("not known")
        || text.contains("No address associated")
        || text.contains("nodename nor servname")
    {
        "no such host".to_string()
    } else {
        text
    }
}

/// The message for a dial that did not finish within the probe's timeout.
pub fn timeout_text(host: &str, port: u16) -> String {
    format!(
        "dial tcp {}: i/o timeout",
        gofmt::join_host_port(host, port)
    )
}
