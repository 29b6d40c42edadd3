//! Network namespaces that a test creates, uses and always removes.
//!
//! A [`NetNs`] is a named namespace under `/run/netns` (so `ip netns`, `nsenter`
//! and `nft` can reach it) whose loopback is up. Dropping it deletes the
//! namespace, which also removes every interface inside it (and so the peer end
//! of any veth pair that crosses into another namespace of ours).
//!
//! Two ways to do work inside a namespace:
//! - [`NetNs::command`] builds a `std::process::Command` that runs a program
//!   through `nsenter --net=...`. Unlike `ip netns exec`, `nsenter` does not
//!   create a mount namespace nor remount `/sys`, so programs that need the
//!   host's cgroup mounts (containerd, keelson's node role) work there.
//! - [`NetNs::run`] runs a closure on a fresh thread that has joined the
//!   namespace. Sockets created there stay in that namespace for their whole
//!   life, so a test can create a listener or a connection in the namespace and
//!   hand it to tokio ([`NetNs::tcp_listener`], [`NetNs::tcp_connect`],
//!   [`NetNs::udp_socket`]).

use std::fs::File;
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use nix::sched::{CloneFlags, setns};

/// What went wrong while creating or using a namespace.
#[derive(Debug, thiserror::Error)]
pub enum NetNsError {
    /// A command (`ip ...`) failed; its stderr is included.
    #[error("`{cmd}` failed: {stderr}")]
    Command {
        /// The command line.
        cmd: String,
        /// What it printed on stderr.
        stderr: String,
    },
    /// An I/O error (spawning a command, opening the namespace file, sockets).
    #[error("{context}: {source}")]
    Io {
        /// What we were doing.
        context: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// Joining the namespace with setns(2) failed.
    #[error("setns into {name}: {source}")]
    Setns {
        /// Namespace name.
        name: String,
        /// errno.
        #[source]
        source: nix::Error,
    },
    /// The worker thread running the closure panicked.
    #[error("thread running in netns {0} panicked")]
    Panicked(String),
}

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// A unique short suffix for names of things a test creates (namespaces,
/// links, tables): the test process id plus a counter, so parallel tests and
/// parallel test processes never collide, and leftovers name their owner.
pub fn unique_suffix() -> String {
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("{}{}", std::process::id() % 100_000, n)
}

/// Runs `ip` with the given arguments, returning stdout.
pub fn ip(args: &[&str]) -> Result<String, NetNsError> {
    run_cmd("ip", args)
}

/// Runs a program to completion, mapping a non-zero exit to an error with its stderr.
pub fn run_cmd(program: &str, args: &[&str]) -> Result<String, NetNsError> {
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|source| NetNsError::Io {
            context: format!("spawning {program}"),
            source,
        })?;
    if !out.status.success() {
        return Err(NetNsError::Command {
            cmd: format!("{program} {}", args.join(" ")),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A named network namespace owned by the test; deleted on drop.
#[derive(Debug)]
pub struct NetNs {
    name: String,
}

impl NetNs {
    /// Creates `/run/netns/<prefix><unique>` with loopback up. The name is
    /// kept short enough for interface-name derived uses.
    pub fn create(prefix: &str) -> Result<NetNs, NetNsError> {
        let name = format!("{prefix}{}", unique_suffix());
        ip(&["netns", "add", &name])?;
        let ns = NetNs { name };
        ns.ip(&["link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// The namespace name (as `ip netns list` shows it).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Path of the namespace file, usable with `nsenter --net=`.
    pub fn path(&self) -> PathBuf {
        PathBuf::from(format!("/run/netns/{}", self.name))
    }

    /// Runs `ip -n <ns> args...`.
    pub fn ip(&self, args: &[&str]) -> Result<String, NetNsError> {
        let mut full = vec!["-n", self.name.as_str()];
        full.extend_from_slice(args);
        ip(&full)
    }

    /// A command that runs `program` inside this namespace (through
    /// `nsenter --net`, which keeps the host's mounts, `/sys` included).
    pub fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--net={}", self.path().display()))
            .arg("--")
            .arg(program);
        cmd
    }

    /// Runs a program inside the namespace to completion; returns stdout.
    pub fn exec(&self, program: &str, args: &[&str]) -> Result<String, NetNsError> {
        let out = self
            .command(program)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .map_err(|source| NetNsError::Io {
                context: format!("spawning {program} in netns {}", self.name),
                source,
            })?;
        if !out.status.success() {
            return Err(NetNsError::Command {
                cmd: format!("(netns {}) {program} {}", self.name, args.join(" ")),
                stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            });
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Runs `f` on a new thread that has joined this namespace and returns its
    /// result. Sockets created by `f` belong to this namespace.
    pub fn run<T, F>(&self, f: F) -> Result<T, NetNsError>
    where
        T: Send + 'static,
        F: FnOnce() -> T + Send + 'static,
    {
        let path = self.path();
        let name = self.name.clone();
        let handle = std::thread::spawn(move || -> Result<T, NetNsError> {
            let file = File::open(&path).map_err(|source| NetNsError::Io {
                context: format!("opening {}", path.display()),
                source,
            })?;
            setns(&file, CloneFlags::CLONE_NEWNET).map_err(|source| NetNsError::Setns {
                name: name.clone(),
                source,
            })?;
            Ok(f())
        });
        handle
            .join()
            .map_err(|_| NetNsError::Panicked(self.name.clone()))?
    }

    /// A TCP listener bound inside this namespace, ready for tokio.
    pub fn tcp_listener(&self, addr: SocketAddr) -> Result<tokio::net::TcpListener, NetNsError> {
        let std_listener = self
            .run(move || TcpListener::bind(addr))?
            .map_err(|source| NetNsError::Io {
                context: format!("binding {addr} in netns {}", self.name),
                source,
            })?;
        std_listener
            .set_nonblocking(true)
            .and_then(|()| tokio::net::TcpListener::from_std(std_listener))
            .map_err(|source| NetNsError::Io {
                context: "registering listener with tokio".into(),
                source,
            })
    }

    /// A TCP connection made from inside this namespace (blocking connect with
    /// `timeout`), ready for tokio.
    pub fn tcp_connect(
        &self,
        addr: SocketAddr,
        timeout: Duration,
    ) -> Result<tokio::net::TcpStream, NetNsError> {
        let stream = self
            .run(move || TcpStream::connect_timeout(&addr, timeout))?
            .map_err(|source| NetNsError::Io {
                context: format!("connecting to {addr} from netns {}", self.name),
                source,
            })?;
        stream
            .set_nonblocking(true)
            .and_then(|()| tokio::net::TcpStream::from_std(stream))
            .map_err(|source| NetNsError::Io {
                context: "registering stream with tokio".into(),
                source,
            })
    }

    /// A UDP socket bound inside this namespace, ready for tokio.
    pub fn udp_socket(&self, addr: SocketAddr) -> Result<tokio::net::UdpSocket, NetNsError> {
        let sock = self
            .run(move || UdpSocket::bind(addr))?
            .map_err(|source| NetNsError::Io {
                context: format!("binding udp {addr} in netns {}", self.name),
                source,
            })?;
        sock.set_nonblocking(true)
            .and_then(|()| tokio::net::UdpSocket::from_std(sock))
            .map_err(|source| NetNsError::Io {
                context: "registering udp socket with tokio".into(),
                source,
            })
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        if !self.path().exists() {
            return; // already removed (a forced cleanup got there first)
        }
        if let Err(e) = ip(&["netns", "del", &self.name]) {
            eprintln!("warning: could not delete netns {}: {e}", self.name);
        }
    }
}

/// Connects two namespaces with a veth pair: `a_if` in `a` with `a_addr`
/// (CIDR form, e.g. `10.0.0.1/24`) and `b_if` in `b` with `b_addr`; both up.
/// The pair is created directly inside `a` so it never appears in the host
/// namespace; it disappears when either namespace is deleted.
pub fn veth_pair(
    a: &NetNs,
    a_if: &str,
    a_addr: Option<&str>,
    b: &NetNs,
    b_if: &str,
    b_addr: Option<&str>,
) -> Result<(), NetNsError> {
    a.ip(&[
        "link",
        "add",
        a_if,
        "type",
        "veth",
        "peer",
        "name",
        b_if,
        "netns",
        b.name(),
    ])?;
    if let Some(addr) = a_addr {
        a.ip(&["addr", "add", addr, "dev", a_if])?;
    }
    if let Some(addr) = b_addr {
        b.ip(&["addr", "add", addr, "dev", b_if])?;
    }
    a.ip(&["link", "set", a_if, "up"])?;
    b.ip(&["link", "set", b_if, "up"])?;
    Ok(())
}

/// Connects to `addr` from inside the namespace named `name` (a blocking
/// thread joins it), for code that outlives a borrowed [`NetNs`] (e.g. the
/// test API server's node dialer).
pub fn connect_in(
    name: &str,
    addr: std::net::SocketAddr,
    timeout: Duration,
) -> std::io::Result<tokio::net::TcpStream> {
    let path = PathBuf::from(format!("/run/netns/{name}"));
    let stream = std::thread::spawn(move || -> std::io::Result<TcpStream> {
        let file = File::open(&path)?;
        setns(&file, CloneFlags::CLONE_NEWNET).map_err(std::io::Error::from)?;
        TcpStream::connect_timeout(&addr, timeout)
    })
    .join()
    .map_err(|_| std::io::Error::other("netns connect thread panicked"))??;
    stream.set_nonblocking(true)?;
    tokio::net::TcpStream::from_std(stream)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unique_suffixes_differ() {
        assert_ne!(unique_suffix(), unique_suffix());
    }
}
