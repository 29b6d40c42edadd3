//! The traffic probes the agent runs. Every probe is a real TCP connection
//! through the namespace's data path; the backend answers with the address
//! the connection landed on, and the probe closes with a reset (SO_LINGER
//! 0), so thousands of probes leave no TIME_WAIT sockets behind.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use nix::sys::socket::{setsockopt, sockopt};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

use super::protocol::{LatencyResult, SweepResult, Target};
use crate::bench::clock::mono_ns;

/// A connection attempt of a reach probe counts only if `connect()`
/// finishes within this: a SYN the kernel had to retransmit (first one
/// dropped, the retry routed by newer rules) must not pass for a
/// connection that was routed correctly when it started.
pub const REACH_CONNECT_TIMEOUT: Duration = Duration::from_millis(900);
/// Longest wait for a backend's identity line.
pub const IDENTITY_TIMEOUT: Duration = Duration::from_secs(2);
/// `connect()` timeout of sweeps and latency samples.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Most connections a reach probe keeps in flight.
const MAX_OUTSTANDING: usize = 256;
/// Reach probes wait at most this long between attempts.
const MAX_SPACING: Duration = Duration::from_millis(250);
/// Attempts are spaced by this share of the time waited so far: the
/// measured time is late by at most ~2 % (plus one connection's duration).
const SPACING_SHARE: f64 = 0.02;

/// Parses a backend's identity line (`<landed-address> <backend-name>`).
pub fn parse_identity(line: &str) -> Result<IpAddr, String> {
    let first = line.split_whitespace().next().unwrap_or_default();
    first
        .parse()
        .map_err(|_| format!("unexpected greeting {:?}", line.trim()))
}

/// Closes with RST instead of FIN: no TIME_WAIT on either side.
fn reset_on_close(fd: &impl AsFd) {
    let _ = setsockopt(
        fd,
        sockopt::Linger,
        &libc::linger {
            l_onoff: 1,
            l_linger: 0,
        },
    );
}

/// One connection: connect within `connect_timeout`, read the identity.
pub async fn attempt(addr: SocketAddr, connect_timeout: Duration) -> Result<IpAddr, String> {
    let stream =
        match tokio::time::timeout(connect_timeout, tokio::net::TcpStream::connect(addr)).await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => return Err(format!("connect {addr}: {e}")),
            Err(_) => return Err(format!("connect {addr}: timed out")),
        };
    reset_on_close(&stream);
    let mut line = String::new();
    let mut reader = tokio::io::BufReader::new(stream);
    match tokio::time::timeout(IDENTITY_TIMEOUT, reader.read_line(&mut line)).await {
        Ok(Ok(n)) if n > 0 => parse_identity(&line),
        Ok(Ok(_)) => Err(format!("{addr}: closed without greeting")),
        Ok(Err(e)) => Err(format!("{addr}: reading greeting: {e}")),
        Err(_) => Err(format!("{addr}: no greeting")),
    }
}

/// One blocking connection, timing `connect()` alone.
pub fn timed_attempt(addr: SocketAddr) -> Result<(Duration, IpAddr), String> {
    let start = Instant::now();
    let stream = TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT)
        .map_err(|e| format!("connect {addr}: {e}"))?;
    let took = start.elapsed();
    reset_on_close(&stream);
    stream
        .set_read_timeout(Some(IDENTITY_TIMEOUT))
        .map_err(|e| format!("{addr}: {e}"))?;
    let mut line = String::new();
    match BufReader::new(stream).read_line(&mut line) {
        Ok(n) if n > 0 => parse_identity(&line).map(|ip| (took, ip)),
        Ok(_) => Err(format!("{addr}: closed without greeting")),
        Err(e) => Err(format!("{addr}: reading greeting: {e}")),
    }
}

/// Time between attempts after waiting `elapsed`.
pub fn spacing(elapsed: Duration) -> Duration {
    elapsed.mul_f64(SPACING_SHARE).min(MAX_SPACING)
}

/// Outcome of [`reach`] for one target.
#[derive(Debug, Clone, Default)]
pub struct Reached {
    /// Start (monotonic ns) of the earliest connection that landed right.
    pub at_ns: Option<u64>,
    /// Connections made.
    pub attempts: u64,
    /// The last failure.
    pub last_error: Option<String>,
}

/// Connects to `target` again and again until a connection lands on an
/// expected endpoint or `timeout` passes. A new attempt starts as soon as
/// the previous one failed (or after [`spacing`], whichever is later),
/// and also beside one still in flight once the spacing passed (at most
/// once per millisecond), so a dropped SYN never delays detection.
pub async fn reach(target: &Target, timeout: Duration) -> Reached {
    let started = Instant::now();
    let deadline = started + timeout;
    let expect: BTreeSet<IpAddr> = target.expect.iter().copied().collect();
    let (tx, mut rx) = mpsc::unbounded_channel::<(u64, u64, Result<IpAddr, String>)>();
    let mut outstanding: BTreeMap<u64, u64> = BTreeMap::new(); // seq -> start ns
    let mut out = Reached::default();
    let mut best: Option<u64> = None;
    let mut seq = 0u64;
    loop {
        let now = Instant::now();
        if best.is_none() && now < deadline && outstanding.len() < MAX_OUTSTANDING {
            seq += 1;
            let start_ns = mono_ns();
            outstanding.insert(seq, start_ns);
            out.attempts += 1;
            let tx = tx.clone();
            let addr = target.addr;
            let id = seq;
            tokio::spawn(async move {
                let r = attempt(addr, REACH_CONNECT_TIMEOUT).await;
                let _ = tx.send((id, start_ns, r));
            });
        }
        let next_launch = Instant::now() + spacing(started.elapsed());
        // Wait for results until it is time for another attempt.
        loop {
            if let Some(b) = best {
                if !outstanding.values().any(|s| *s < b) {
                    out.at_ns = best;
                    return out;
                }
            } else if Instant::now() >= deadline && outstanding.is_empty() {
                return out;
            }
            let launch_due = best.is_none() && Instant::now() < deadline;
            let in_flight_floor = if outstanding.is_empty() {
                next_launch
            } else {
                next_launch.max(Instant::now() + Duration::from_millis(1))
            };
            if launch_due && outstanding.is_empty() && Instant::now() >= next_launch {
                break;
            }
            let wake = if launch_due {
                in_flight_floor.min(deadline)
            } else {
                // Only waiting for earlier attempts still in flight.
                Instant::now() + REACH_CONNECT_TIMEOUT + IDENTITY_TIMEOUT
            };
            tokio::select! {
                msg = rx.recv() => {
                    let Some((id, start_ns, result)) = msg else { return out };
                    outstanding.remove(&id);
                    match result {
                        Ok(ip) if expect.contains(&ip) => {
                            best = Some(best.map_or(start_ns, |b| b.min(start_ns)));
                        }
                        Ok(ip) => out.last_error = Some(format!("landed on {ip} (not yet the expected endpoints)")),
                        Err(e) => out.last_error = Some(e),
                    }
                    // A quick failure and the next attempt is (nearly) due:
                    // go at once rather than on the millisecond timer.
                    if best.is_none() && outstanding.is_empty()
                        && next_launch.saturating_duration_since(Instant::now()) < Duration::from_millis(1)
                    {
                        break;
                    }
                }
                _ = tokio::time::sleep_until(tokio::time::Instant::from_std(wake)) => {
                    if launch_due {
                        break;
                    }
                    // Stragglers never answered: report what we have.
                    out.at_ns = best;
                    return out;
                }
            }
        }
    }
}

/// Correctness check of one target.
pub async fn sweep(target: &Target, all_endpoints: bool, max_attempts: u32) -> SweepResult {
    let expect: BTreeSet<IpAddr> = target.expect.iter().copied().collect();
    let mut seen = BTreeSet::new();
    let mut wrong = BTreeSet::new();
    let mut out = SweepResult::default();
    let mut tries = 0;
    while tries < max_attempts.max(1) {
        tries += 1;
        match attempt(target.addr, CONNECT_TIMEOUT).await {
            Ok(ip) if expect.contains(&ip) => {
                seen.insert(ip);
            }
            Ok(ip) => {
                wrong.insert(ip);
            }
            Err(e) => {
                out.failures += 1;
                out.last_error = Some(e);
                if out.failures >= 3 {
                    break;
                }
                continue;
            }
        }
        if !all_endpoints || seen.len() == expect.len() {
            break;
        }
    }
    out.seen = seen.into_iter().collect();
    out.wrong = wrong.into_iter().collect();
    out
}

/// Sequential timed connections over `targets` (round robin).
pub fn latency(targets: &[Target], samples: u32) -> LatencyResult {
    let mut out = LatencyResult::default();
    if targets.is_empty() {
        return out;
    }
    for i in 0..samples as usize {
        let t = &targets[i % targets.len()];
        match timed_attempt(t.addr) {
            Ok((took, ip)) if t.expect.contains(&ip) => {
                out.connect_ns.push(took.as_nanos() as u64);
            }
            Ok((_, ip)) => {
                out.wrong += 1;
                out.last_error = Some(format!("{} landed on unexpected {ip}", t.addr));
            }
            Err(e) => {
                out.failed += 1;
                out.last_error = Some(e);
            }
        }
    }
    out
}

/// `GET path` with HTTP/1.0; returns the body of a 200 answer.
pub async fn scrape(addr: SocketAddr, path: &str) -> Result<String, String> {
    let fetch = async {
        let mut s = tokio::net::TcpStream::connect(addr)
            .await
            .map_err(|e| format!("connect {addr}: {e}"))?;
        let req = format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\nAccept: text/plain\r\n\r\n");
        s.write_all(req.as_bytes())
            .await
            .map_err(|e| format!("write: {e}"))?;
        let mut buf = Vec::new();
        s.read_to_end(&mut buf)
            .await
            .map_err(|e| format!("read: {e}"))?;
        Ok::<_, String>(String::from_utf8_lossy(&buf).into_owned())
    };
    let text = tokio::time::timeout(Duration::from_secs(10), fetch)
        .await
        .map_err(|_| format!("GET http://{addr}{path}: timed out"))??;
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("GET http://{addr}{path}: malformed answer"))?;
    let status = head.lines().next().unwrap_or_default();
    if status.split_whitespace().nth(1) != Some("200") {
        return Err(format!("GET http://{addr}{path}: {status}"));
    }
    Ok(body.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_lines() {
        assert_eq!(
            parse_identity("10.128.0.1 b0\n"),
            Ok("10.128.0.1".parse().expect("ip"))
        );
        assert!(parse_identity("hello\n").is_err());
        assert!(parse_identity("").is_err());
    }

    #[test]
    fn spacing_grows_with_waiting_and_is_capped() {
        assert_eq!(spacing(Duration::ZERO), Duration::ZERO);
        assert_eq!(spacing(Duration::from_secs(1)), Duration::from_millis(20));
        assert_eq!(spacing(Duration::from_secs(600)), MAX_SPACING);
    }

    /// A loopback server that greets with a fixed address.
    async fn greeter(greeting: &'static str) -> SocketAddr {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = l.local_addr().expect("addr");
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                let _ = s.write_all(greeting.as_bytes()).await;
                let mut sink = Vec::new();
                let _ = s.read_to_end(&mut sink).await;
            }
        });
        addr
    }

    #[tokio::test]
    async fn reach_sweep_and_latency_against_loopback() {
        let addr = greeter("127.0.0.9 b\n").await;
        let right = Target {
            addr,
            expect: vec!["127.0.0.9".parse().expect("ip")],
        };
        let before = mono_ns();
        let r = reach(&right, Duration::from_secs(5)).await;
        let at = r.at_ns.expect("reached");
        assert!(at >= before);
        assert!(r.attempts >= 1);

        let wrong = Target {
            addr,
            expect: vec!["127.0.0.8".parse().expect("ip")],
        };
        let r = reach(&wrong, Duration::from_millis(50)).await;
        assert_eq!(r.at_ns, None);
        assert!(r.attempts > 1, "kept trying: {}", r.attempts);
        assert!(r.last_error.expect("error").contains("127.0.0.9"));

        let s = sweep(&right, true, 5).await;
        assert_eq!(s.seen.len(), 1);
        assert!(s.wrong.is_empty());
        let s = sweep(&wrong, false, 5).await;
        assert_eq!(s.wrong, vec!["127.0.0.9".parse::<IpAddr>().expect("ip")]);

        let targets = vec![right.clone()];
        let l = tokio::task::spawn_blocking(move || latency(&targets, 5))
            .await
            .expect("join");
        assert_eq!(l.connect_ns.len(), 5);
        assert_eq!(l.failed, 0);
    }

    #[tokio::test]
    async fn reach_gives_up_on_refused_connections() {
        // A port nobody listens on: refused at once, again and again.
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = l.local_addr().expect("addr");
        drop(l);
        let t = Target {
            addr,
            expect: vec![addr.ip()],
        };
        let r = reach(&t, Duration::from_millis(100)).await;
        assert_eq!(r.at_ns, None);
        assert!(r.last_error.expect("error").contains("refused"));
        let s = sweep(&t, false, 5).await;
        assert_eq!(s.failures, 3);
    }

    /// A server answering every request with `answer`, then closing.
    async fn http_once(answer: &'static str) -> SocketAddr {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = l.local_addr().expect("addr");
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                let mut buf = [0u8; 256];
                let _ = s.read(&mut buf).await;
                let _ = s.write_all(answer.as_bytes()).await;
            }
        });
        addr
    }

    #[tokio::test]
    async fn scrape_reads_a_200_body_and_rejects_others() {
        let ok = http_once("HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\nm 1\n").await;
        assert_eq!(scrape(ok, "/metrics").await, Ok("m 1\n".to_string()));
        let missing = http_once("HTTP/1.0 404 Not Found\r\n\r\nno").await;
        let err = scrape(missing, "/metrics").await.expect_err("404");
        assert!(err.contains("404"), "{err}");
    }
}
