//! `keelson diagnose service --probe`: real traffic from this node to the
//! ClusterIP of each service port and to each of its endpoints (at most
//! [`MAX_PROBED_ENDPOINTS`]), one attempt each, all of a port at once.
//!
//! - **TCP**: a connection (the handshake is the answer); closed at once.
//! - **UDP**: there is no handshake, and a "connected" UDP socket proves
//!   nothing, so one datagram ([`UDP_PAYLOAD`]) is sent from a connected
//!   socket and a reply is awaited until [`PROBE_TIMEOUT`]. Three outcomes:
//!   a reply (the path works both ways); an ICMP port unreachable, which
//!   the connected socket reports as refused (nothing listens there, or the
//!   data plane rejects a ClusterIP without endpoints); or silence. Silence
//!   is not a verdict on the data plane: many UDP services (DNS, syslog,
//!   metrics sinks) do not answer a datagram they do not understand, so
//!   silence is shown as "no reply" (⚠), unless endpoints answered the same
//!   datagram and the ClusterIP did not, which only the data plane explains
//!   (✘).
//! - **SCTP** is not probed (said so in the report): it would need the
//!   kernel's SCTP module on the node, and a probe must not load modules.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::{Duration, Instant};

use keelson_netplane::model::{Protocol, ServicePortState};

use super::report::{Link, Mark, Part};

/// Endpoints probed at most with `--probe`.
pub const MAX_PROBED_ENDPOINTS: usize = 16;
/// How long a probe waits for its answer.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(3);
/// The datagram a UDP probe sends.
pub const UDP_PAYLOAD: &[u8] = b"keelson diagnose probe\n";

/// What one probe got back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Connected (TCP) or a datagram came back (UDP), after this long.
    Answered(Duration),
    /// Actively refused: TCP reset, or ICMP unreachable for UDP.
    Refused(String),
    /// UDP: nothing came back in time.
    Silent,
    /// Anything else (TCP timeout, no route, ...).
    Failed(String),
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

impl Outcome {
    /// The outcome in words (after "ClusterIP 10.96.0.10:53: ").
    pub fn text(&self, protocol: Protocol) -> String {
        match (self, protocol) {
            (Outcome::Answered(d), Protocol::Udp) => format!("replied in {}", ms(*d)),
            (Outcome::Answered(d), _) => format!("connected in {}", ms(*d)),
            (Outcome::Refused(e), Protocol::Udp) => {
                format!("port unreachable ({e}): nothing listens on it, or it is rejected")
            }
            (Outcome::Refused(e), _) => e.clone(),
            (Outcome::Silent, _) => format!(
                "no reply within {PROBE_TIMEOUT:?} (a UDP service that does not answer this \
                 probe's datagram looks the same: not a verdict on the data plane)"
            ),
            (Outcome::Failed(e), _) => e.clone(),
        }
    }
}

async fn tcp(addr: SocketAddr) -> Outcome {
    let start = Instant::now();
    match tokio::time::timeout(PROBE_TIMEOUT, tokio::net::TcpStream::connect(addr)).await {
        Ok(Ok(_)) => Outcome::Answered(start.elapsed()),
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
            Outcome::Refused(e.to_string())
        }
        Ok(Err(e)) => Outcome::Failed(e.to_string()),
        Err(_) => Outcome::Failed(format!("no answer within {PROBE_TIMEOUT:?}")),
    }
}

async fn udp(addr: SocketAddr) -> Outcome {
    let any: IpAddr = match addr {
        SocketAddr::V4(_) => Ipv4Addr::UNSPECIFIED.into(),
        SocketAddr::V6(_) => Ipv6Addr::UNSPECIFIED.into(),
    };
    let sock = match tokio::net::UdpSocket::bind(SocketAddr::new(any, 0)).await {
        Ok(s) => s,
        Err(e) => return Outcome::Failed(format!("no UDP socket: {e}")),
    };
    // Connected: the kernel hands ICMP errors for this peer to the socket.
    if let Err(e) = sock.connect(addr).await {
        return Outcome::Failed(e.to_string());
    }
    let start = Instant::now();
    let exchange = async {
        sock.send(UDP_PAYLOAD).await?;
        let mut buf = [0u8; 1500];
        sock.recv(&mut buf).await
    };
    match tokio::time::timeout(PROBE_TIMEOUT, exchange).await {
        Ok(Ok(_)) => Outcome::Answered(start.elapsed()),
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
            Outcome::Refused("ICMP port unreachable".into())
        }
        Ok(Err(e)) => Outcome::Failed(e.to_string()),
        Err(_) => Outcome::Silent,
    }
}

/// One probe of `addr` over `protocol` (TCP or UDP).
pub async fn probe(protocol: Protocol, addr: SocketAddr) -> Outcome {
    match protocol {
        Protocol::Udp => udp(addr).await,
        _ => tcp(addr).await,
    }
}

/// The mark of the ClusterIP's outcome, knowing the endpoints' outcomes.
pub fn vip_mark(vip: &Outcome, endpoints: &[Outcome]) -> Mark {
    match vip {
        Outcome::Answered(_) => Mark::Ok,
        Outcome::Silent if endpoints.iter().any(|e| matches!(e, Outcome::Answered(_))) => {
            Mark::Failed
        }
        Outcome::Silent => Mark::Warning,
        Outcome::Refused(_) | Outcome::Failed(_) => Mark::Failed,
    }
}

fn port_part(
    name: String,
    s: &ServicePortState,
    vip: &Outcome,
    eps: &[(SocketAddr, Outcome)],
) -> Part {
    let proto = s.info.protocol;
    let outcomes: Vec<Outcome> = eps.iter().map(|(_, o)| o.clone()).collect();
    let status = vip_mark(vip, &outcomes);
    let vip_addr = SocketAddr::new(s.info.cluster_ip, s.info.port);
    let mut summary = format!("ClusterIP {vip_addr}: {}", vip.text(proto));
    if status == Mark::Failed && matches!(vip, Outcome::Silent) {
        summary = format!(
            "ClusterIP {vip_addr}: no reply within {PROBE_TIMEOUT:?}, while endpoints answered the same datagram: the data plane does not deliver it"
        );
    }
    let mut evidence: Vec<String> = eps
        .iter()
        .map(|(a, o)| format!("endpoint {a}: {}", o.text(proto)))
        .collect();
    if s.endpoints.len() > MAX_PROBED_ENDPOINTS {
        evidence.push(format!(
            "{} more endpoint(s) not probed (at most {MAX_PROBED_ENDPOINTS})",
            s.endpoints.len() - MAX_PROBED_ENDPOINTS
        ));
    }
    Part {
        name,
        status,
        summary,
        evidence,
    }
}

/// The `probe` link: each port's ClusterIP and endpoints, labelled by
/// `ports`' names.
pub async fn link(ports: &[(String, &ServicePortState)]) -> Link {
    const T: &str = "Connections";
    let mut parts = Vec::new();
    for (name, s) in ports {
        let proto = s.info.protocol;
        if !matches!(proto, Protocol::Tcp | Protocol::Udp) {
            parts.push(Part {
                name: name.clone(),
                status: Mark::NotReached,
                summary: format!(
                    "{} is not probed: diagnose sends TCP connections and UDP datagrams only (an SCTP probe needs the kernel's sctp module)",
                    proto.as_k8s()
                ),
                evidence: Vec::new(),
            });
            continue;
        }
        let vip = SocketAddr::new(s.info.cluster_ip, s.info.port);
        let targets: Vec<SocketAddr> = s
            .endpoints
            .iter()
            .take(MAX_PROBED_ENDPOINTS)
            .map(|e| e.addr())
            .collect();
        let (vip_outcome, eps) = tokio::join!(
            probe(proto, vip),
            futures::future::join_all(targets.iter().map(|a| probe(proto, *a)))
        );
        let eps: Vec<(SocketAddr, Outcome)> = targets.into_iter().zip(eps).collect();
        parts.push(port_part(name.clone(), s, &vip_outcome, &eps));
    }
    let worst = Link::worst_part(&parts);
    let mut link = Link::new(
        "probe",
        T,
        worst,
        match parts
            .iter()
            .find(|p| p.status == Mark::Failed)
            .or_else(|| parts.iter().find(|p| p.status == Mark::Warning))
        {
            Some(p) => p.summary.clone(),
            None => "the ClusterIP answers from this node".to_string(),
        },
    );
    link.parts = parts;
    link
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn udp_silence_is_a_warning_unless_endpoints_answered() {
        let ok = Outcome::Answered(Duration::from_millis(1));
        assert_eq!(vip_mark(&Outcome::Silent, &[]), Mark::Warning);
        assert_eq!(
            vip_mark(&Outcome::Silent, &[Outcome::Silent, Outcome::Silent]),
            Mark::Warning
        );
        assert_eq!(
            vip_mark(&Outcome::Silent, &[Outcome::Silent, ok.clone()]),
            Mark::Failed
        );
        assert_eq!(vip_mark(&ok, &[Outcome::Silent]), Mark::Ok);
        assert_eq!(
            vip_mark(&Outcome::Refused("ICMP port unreachable".into()), &[]),
            Mark::Failed
        );
    }

    #[test]
    fn outcomes_read_as_the_protocol_does() {
        let d = Duration::from_micros(1500);
        assert_eq!(
            Outcome::Answered(d).text(Protocol::Udp),
            "replied in 1.5 ms"
        );
        assert_eq!(
            Outcome::Answered(d).text(Protocol::Tcp),
            "connected in 1.5 ms"
        );
        assert!(
            Outcome::Silent
                .text(Protocol::Udp)
                .contains("not a verdict on the data plane")
        );
        assert!(
            Outcome::Refused("ICMP port unreachable".into())
                .text(Protocol::Udp)
                .starts_with("port unreachable (ICMP port unreachable)")
        );
    }

    #[tokio::test]
    async fn udp_probes_get_a_reply_a_refusal_or_silence() {
        // An echo server on loopback.
        let echo = tokio::net::UdpSocket::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let echo_addr = echo.local_addr().expect("addr");
        let server = tokio::spawn(async move {
            let mut buf = [0u8; 1500];
            while let Ok((n, peer)) = echo.recv_from(&mut buf).await {
                let _ = echo.send_to(&buf[..n], peer).await;
            }
        });
        assert!(matches!(
            probe(Protocol::Udp, echo_addr).await,
            Outcome::Answered(_)
        ));
        server.abort();
        // A socket that reads nothing and answers nothing: silence.
        let mute = tokio::net::UdpSocket::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let mute_addr = mute.local_addr().expect("addr");
        let started = Instant::now();
        assert_eq!(probe(Protocol::Udp, mute_addr).await, Outcome::Silent);
        assert!(started.elapsed() >= PROBE_TIMEOUT);
        drop(mute);
        // Nobody on the port: loopback answers with ICMP port unreachable.
        assert!(matches!(
            probe(Protocol::Udp, mute_addr).await,
            Outcome::Refused(_)
        ));
    }
}
