//! The shared Service-case table of the proxy role, and the network lab its
//! system tests run in. Every data plane (nftables, eBPF) runs the same
//! cases through [`run_case`] with its own backend.
//!
//! The lab (all namespaces created by the test, removed on drop):
//!
//! ```text
//!  client (192.168.100.2) ── node (192.168.100.1, router + proxy) ── pod-i (10.244.(i+1).2)
//!                                  10.244.(i+1).1 on each pod link
//! ```
//!
//! Each pod runs a TCP server on [`TCP_PORT`] and a UDP server on
//! [`UDP_PORT`] answering `"<pod name> <peer address>"`, so a probe learns
//! which backend served it and which source address the backend saw
//! (masquerade or not). The node forwards, has no other rules than the
//! backend's, and is named [`NODE_NAME`] (endpoints with that `nodeName` are
//! local). Cluster CIDR [`CLUSTER_CIDR`], Service CIDR [`SERVICE_CIDR`].

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream, UdpSocket};
use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use keelson_netplane::fixtures::{EndpointSpec as Ep, ServiceBuilder, SliceBuilder};
use keelson_netplane::model::Protocol;
use keelson_netplane::proxier::{Listen, Proxier, ProxyHandle};
use tokio::io::AsyncWriteExt;
use tokio::task::JoinHandle;

use crate::netns::{NetNs, NetNsError, veth_pair};

/// The node's name.
pub const NODE_NAME: &str = "node-a";
/// Another node's name (remote endpoints).
pub const OTHER_NODE: &str = "node-b";
/// The node's address on the client network.
pub const NODE_IP: &str = "192.168.100.1";
/// The client's address (outside the cluster).
pub const CLIENT_IP: &str = "192.168.100.2";
/// Pod network.
pub const CLUSTER_CIDR: &str = "10.244.0.0/16";
/// Service network.
pub const SERVICE_CIDR: &str = "10.96.0.0/16";
/// The nftables backend's settings for the lab: the pod network is the
/// cluster CIDR, the Service CIDR is [`SERVICE_CIDR`].
pub fn lab_nftables_config() -> keelson_netplane::nftables::NftablesConfig {
    use keelson_netplane::model::IpFamily;
    use keelson_netplane::nftables::{LocalTraffic, NftablesConfig};
    let mut c = NftablesConfig::default();
    let (Ok(cluster), Ok(services)) = (CLUSTER_CIDR.parse(), SERVICE_CIDR.parse()) else {
        unreachable!("the lab's CIDRs are valid")
    };
    c.local_traffic
        .insert(IpFamily::V4, LocalTraffic::Cidr(cluster));
    c.service_cidrs.insert(IpFamily::V4, vec![services]);
    c
}

/// The pods' TCP port.
pub const TCP_PORT: u16 = 8080;
/// The pods' UDP port.
pub const UDP_PORT: u16 = 5353;
/// An externalIP routed to the node.
pub const EXTERNAL_IP: &str = "192.168.200.10";
/// A load-balancer ingress IP routed to the node.
pub const LB_IP: &str = "192.168.200.20";

/// Address of pod `i`.
pub fn pod_ip(i: usize) -> IpAddr {
    IpAddr::from([10, 244, (i + 1) as u8, 2])
}

/// The node's address on pod `i`'s link (what a masqueraded flow to pod i
/// comes from).
pub fn node_ip_towards(i: usize) -> IpAddr {
    IpAddr::from([10, 244, (i + 1) as u8, 1])
}

/// Name of pod `i` (what its servers answer).
pub fn pod_name(i: usize) -> String {
    format!("pod-{i}")
}

fn parse_ip(s: &str) -> IpAddr {
    s.parse().unwrap_or(IpAddr::from([0, 0, 0, 0]))
}

/// What went wrong building or using the lab.
#[derive(Debug, thiserror::Error)]
pub enum LabError {
    /// Namespace / link setup.
    #[error(transparent)]
    NetNs(#[from] NetNsError),
    /// Something else.
    #[error("{0}")]
    Other(String),
}

/// One pod: a namespace with the two servers.
#[derive(Debug)]
pub struct Pod {
    /// Its namespace.
    pub ns: NetNs,
    /// Its index.
    pub index: usize,
}

/// The network lab.
#[derive(Debug)]
pub struct Lab {
    /// The node namespace (router; the backend programs it).
    pub node: NetNs,
    /// The client namespace (outside the cluster).
    pub client: NetNs,
    /// The pods.
    pub pods: Vec<Pod>,
    servers: Vec<JoinHandle<()>>,
}

impl Drop for Lab {
    fn drop(&mut self) {
        for s in &self.servers {
            s.abort();
        }
    }
}

/// Where a probe starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// The client (outside the cluster).
    Client,
    /// Pod `i`.
    Pod(usize),
    /// The node itself.
    Node,
}

/// A reply: which pod answered and the peer it saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    /// Pod name.
    pub pod: String,
    /// Source address the pod saw.
    pub peer: SocketAddr,
}

/// Why a probe got no reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NoReply {
    /// Actively refused (TCP RST / ICMP unreachable).
    Refused,
    /// Nothing came back in time (dropped).
    Timeout,
    /// Another error.
    Other(String),
}

fn parse_reply(s: &str) -> Result<Reply, NoReply> {
    let mut it = s.trim().splitn(2, ' ');
    let pod = it.next().unwrap_or_default().to_string();
    let peer = it
        .next()
        .and_then(|p| p.parse().ok())
        .ok_or_else(|| NoReply::Other(format!("bad reply {s:?}")))?;
    Ok(Reply { pod, peer })
}

fn classify(e: &std::io::Error) -> NoReply {
    match e.kind() {
        std::io::ErrorKind::ConnectionRefused => NoReply::Refused,
        std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock => NoReply::Timeout,
        _ => match e.raw_os_error() {
            Some(libc::EHOSTUNREACH) | Some(libc::ENETUNREACH) => NoReply::Refused,
            _ => NoReply::Other(e.to_string()),
        },
    }
}

impl Lab {
    /// Builds the lab with `pods` pods.
    pub async fn new(pods: usize) -> Result<Lab, LabError> {
        let node = NetNs::create("kpn")?;
        let client = NetNs::create("kpc")?;
        // Routing, no reverse-path filter; no ICMP redirects (a hairpinned
        // flow leaves through the interface it came in on) and no ICMP rate
        // limit, so every rejected probe gets its ICMP error in time.
        for (k, v) in [
            ("net.ipv4.ip_forward", "1"),
            ("net.ipv4.conf.all.rp_filter", "0"),
            ("net.ipv4.conf.default.rp_filter", "0"),
            ("net.ipv4.conf.all.send_redirects", "0"),
            ("net.ipv4.conf.default.send_redirects", "0"),
            ("net.ipv4.icmp_ratelimit", "0"),
        ] {
            node.exec("sysctl", &["-qw", &format!("{k}={v}")])?;
        }
        veth_pair(
            &node,
            "n-cl",
            Some(&format!("{NODE_IP}/24")),
            &client,
            "c-n",
            Some(&format!("{CLIENT_IP}/24")),
        )?;
        client.ip(&["route", "add", "default", "via", NODE_IP])?;
        // Like a real node, the node has a default route (upstream): traffic
        // the proxy does not DNAT is routed, not refused for lack of a route.
        node.ip(&["route", "add", "default", "via", CLIENT_IP])?;
        let mut lab = Lab {
            node,
            client,
            pods: Vec::new(),
            servers: Vec::new(),
        };
        for i in 0..pods {
            let ns = NetNs::create("kpp")?;
            veth_pair(
                &lab.node,
                &format!("n-p{i}"),
                Some(&format!("{}/24", node_ip_towards(i))),
                &ns,
                "eth0",
                Some(&format!("{}/24", pod_ip(i))),
            )?;
            ns.ip(&[
                "route",
                "add",
                "default",
                "via",
                &node_ip_towards(i).to_string(),
            ])?;
            let name = pod_name(i);
            let tcp = ns.tcp_listener(SocketAddr::new(IpAddr::from([0, 0, 0, 0]), TCP_PORT))?;
            let udp = ns.udp_socket(SocketAddr::new(IpAddr::from([0, 0, 0, 0]), UDP_PORT))?;
            let n = name.clone();
            lab.servers.push(tokio::spawn(async move {
                loop {
                    let Ok((mut s, peer)) = tcp.accept().await else {
                        continue;
                    };
                    let msg = format!("{n} {peer}\n");
                    tokio::spawn(async move {
                        let _ = s.write_all(msg.as_bytes()).await;
                        let _ = s.shutdown().await;
                    });
                }
            }));
            lab.servers.push(tokio::spawn(async move {
                let mut buf = [0u8; 512];
                loop {
                    let Ok((_, peer)) = udp.recv_from(&mut buf).await else {
                        continue;
                    };
                    let msg = format!("{name} {peer}\n");
                    let _ = udp.send_to(msg.as_bytes(), peer).await;
                }
            }));
            lab.pods.push(Pod { ns, index: i });
        }
        Ok(lab)
    }

    fn ns(&self, origin: Origin) -> &NetNs {
        match origin {
            Origin::Client => &self.client,
            Origin::Node => &self.node,
            Origin::Pod(i) => &self.pods[i.min(self.pods.len().saturating_sub(1))].ns,
        }
    }

    /// The path of the node namespace (for [`NsListen`] and backends).
    pub fn node_path(&self) -> PathBuf {
        self.node.path()
    }

    /// One TCP request from `origin` to `addr`.
    pub async fn tcp(
        &self,
        origin: Origin,
        addr: SocketAddr,
        timeout: Duration,
    ) -> Result<Reply, NoReply> {
        let ns_result = self
            .ns(origin)
            .run(move || -> Result<String, std::io::Error> {
                let mut s = TcpStream::connect_timeout(&addr, timeout)?;
                s.set_read_timeout(Some(timeout))?;
                let mut out = String::new();
                s.read_to_string(&mut out)?;
                Ok(out)
            });
        match ns_result {
            Err(e) => Err(NoReply::Other(e.to_string())),
            Ok(Err(e)) => Err(classify(&e)),
            Ok(Ok(s)) => parse_reply(&s),
        }
    }

    /// One UDP request from `origin` to `addr`; `source_port` pins the
    /// client port (0 = any).
    pub async fn udp(
        &self,
        origin: Origin,
        addr: SocketAddr,
        source_port: u16,
        timeout: Duration,
    ) -> Result<Reply, NoReply> {
        let ns_result = self
            .ns(origin)
            .run(move || -> Result<String, std::io::Error> {
                let s = udp_bind(source_port)?;
                s.connect(addr)?;
                s.set_read_timeout(Some(timeout))?;
                s.send(b"hello")?;
                let mut buf = [0u8; 512];
                let n = s.recv(&mut buf)?;
                Ok(String::from_utf8_lossy(&buf[..n]).into_owned())
            });
        match ns_result {
            Err(e) => Err(NoReply::Other(e.to_string())),
            Ok(Err(e)) => Err(classify(&e)),
            Ok(Ok(s)) => parse_reply(&s),
        }
    }

    /// An HTTP GET from `origin`; returns (status, body).
    pub async fn http_get(
        &self,
        origin: Origin,
        addr: SocketAddr,
        path: &str,
        timeout: Duration,
    ) -> Result<(u16, String), NoReply> {
        let path = path.to_string();
        let ns_result = self
            .ns(origin)
            .run(move || -> Result<String, std::io::Error> {
                let mut s = TcpStream::connect_timeout(&addr, timeout)?;
                s.set_read_timeout(Some(timeout))?;
                write!(
                    s,
                    "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
                )?;
                let mut out = String::new();
                s.read_to_string(&mut out)?;
                Ok(out)
            });
        let raw = match ns_result {
            Err(e) => return Err(NoReply::Other(e.to_string())),
            Ok(Err(e)) => return Err(classify(&e)),
            Ok(Ok(s)) => s,
        };
        let status = raw
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| NoReply::Other(format!("bad HTTP response {raw:?}")))?;
        let body = raw
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.to_string())
            .unwrap_or_default();
        Ok((status, body))
    }
}

/// A UDP socket bound to `port` (0: ephemeral); a fixed port lets a test
/// reuse the same flow (5-tuple) across probes.
/// Binds a UDP client socket. A fixed source port can be briefly "in use"
/// after the previous socket on it closed: a process forked by a concurrent
/// test at that moment holds a copy of the descriptor until its exec. Such
/// a bind is retried for up to a second.
fn udp_bind(port: u16) -> std::io::Result<UdpSocket> {
    let addr = SocketAddr::new(IpAddr::from([0, 0, 0, 0]), port);
    let deadline = std::time::Instant::now() + Duration::from_secs(1);
    loop {
        match UdpSocket::bind(addr) {
            Err(e)
                if port != 0
                    && e.kind() == std::io::ErrorKind::AddrInUse
                    && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(Duration::from_millis(10));
            }
            other => return other,
        }
    }
}

/// Binds health-check listeners inside a namespace (the node's).
#[derive(Debug, Clone)]
pub struct NsListen {
    path: PathBuf,
}

impl NsListen {
    /// Listener factory for the namespace at `path`.
    pub fn new(path: PathBuf) -> Self {
        NsListen { path }
    }
}

impl Listen for NsListen {
    fn listen(&self, addr: SocketAddr) -> std::io::Result<std::net::TcpListener> {
        let path = self.path.clone();
        std::thread::spawn(move || -> std::io::Result<std::net::TcpListener> {
            let f = std::fs::File::open(&path)?;
            nix::sched::setns(&f, nix::sched::CloneFlags::CLONE_NEWNET)
                .map_err(|e| std::io::Error::from_raw_os_error(e as i32))?;
            std::net::TcpListener::bind(addr)
        })
        .join()
        .map_err(|_| std::io::Error::other("listener thread panicked"))?
    }
}

/// What a case is about (lets a data plane run only the cases it serves).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// ClusterIP traffic from pods or the node (socket-LB's domain).
    ClusterIp,
    /// ClusterIP from outside the cluster.
    ClusterIpExternal,
    /// NodePort / externalIP / LB IP traffic (north-south).
    External,
    /// Health-check node ports.
    HealthCheck,
}

/// Where a probe goes.
#[derive(Debug, Clone)]
pub enum Target {
    /// An address (ClusterIP, externalIP, LB IP).
    Addr(SocketAddr),
    /// The node's NodePort.
    NodePort(u16),
    /// The node's health-check node port (HTTP GET /).
    HealthCheck(u16),
}

/// What a probe must observe.
#[derive(Debug, Clone)]
pub enum Expect {
    /// Over the attempts, exactly these pods answer (each at least once).
    Balanced(Vec<usize>),
    /// Every attempt is answered by one of these pods.
    Within(Vec<usize>),
    /// Every attempt is answered by the same pod, one of these.
    Sticky(Vec<usize>),
    /// Answered, and the pod saw the client's own address.
    SourcePreserved,
    /// Answered, and the pod saw the node's address (masquerade).
    Masqueraded,
    /// Refused (reject).
    Rejected,
    /// No answer (drop).
    Dropped,
    /// Health-check port answers this status with this `localEndpoints`.
    Health(u16, usize),
}

/// One probe of a case.
#[derive(Debug, Clone)]
pub struct Probe {
    /// From where.
    pub from: Origin,
    /// TCP or UDP.
    pub proto: Protocol,
    /// To where.
    pub target: Target,
    /// How many attempts.
    pub attempts: usize,
    /// Expected.
    pub expect: Expect,
}

/// A Service case: API objects and what traffic must do.
#[derive(Debug, Clone)]
pub struct Case {
    /// Name.
    pub name: &'static str,
    /// What it exercises.
    pub kind: Kind,
    /// Node zone label.
    pub node_zone: Option<&'static str>,
    /// Services.
    pub services: Vec<Service>,
    /// EndpointSlices.
    pub slices: Vec<EndpointSlice>,
    /// Probes.
    pub probes: Vec<Probe>,
}

fn vip(last: u8) -> String {
    format!("10.96.0.{last}")
}

fn sa(ip: &str, port: u16) -> SocketAddr {
    SocketAddr::new(parse_ip(ip), port)
}

fn probe(from: Origin, proto: Protocol, target: Target, attempts: usize, expect: Expect) -> Probe {
    Probe {
        from,
        proto,
        target,
        attempts,
        expect,
    }
}

/// A slice of `service` with port `name`/`proto` → the pods' server port.
fn slice(service: &str, name: &str, proto: Protocol, eps: Vec<Ep>) -> EndpointSlice {
    let port = if proto == Protocol::Udp {
        UDP_PORT
    } else {
        TCP_PORT
    };
    let mut s = SliceBuilder::new("default", service, &format!("{service}-1"), "IPv4")
        .port(name, proto, port);
    for e in eps {
        s = s.endpoint(e);
    }
    s.build()
}

fn ready(i: usize, node: &str) -> Ep {
    Ep::ready(&pod_ip(i).to_string()).node(node)
}

/// The case table. Pods 0..=3 exist in the lab.
pub fn cases() -> Vec<Case> {
    use Expect::*;
    use Origin::*;
    use Protocol::{Tcp, Udp};
    let clusterip = |name: &str, last: u8| {
        ServiceBuilder::new("default", name)
            .cluster_ip(&vip(last))
            .port("http", Tcp, 80)
            .port("dns", Udp, 53)
    };
    let both = |service: &str, eps: Vec<Ep>| {
        vec![
            slice(service, "http", Tcp, eps.clone()),
            slice(service, "dns", Udp, eps).tap_name(&format!("{service}-2")),
        ]
    };
    vec![
        Case {
            name: "clusterip-balances-tcp-and-udp",
            kind: Kind::ClusterIp,
            node_zone: None,
            services: vec![clusterip("web", 10).build()],
            slices: both(
                "web",
                vec![
                    ready(0, NODE_NAME),
                    ready(1, OTHER_NODE),
                    ready(2, OTHER_NODE),
                ],
            ),
            probes: vec![
                probe(
                    Pod(3),
                    Tcp,
                    Target::Addr(sa(&vip(10), 80)),
                    40,
                    Balanced(vec![0, 1, 2]),
                ),
                probe(
                    Pod(3),
                    Udp,
                    Target::Addr(sa(&vip(10), 53)),
                    40,
                    Balanced(vec![0, 1, 2]),
                ),
                probe(
                    Node,
                    Tcp,
                    Target::Addr(sa(&vip(10), 80)),
                    6,
                    Within(vec![0, 1, 2]),
                ),
            ],
        },
        Case {
            name: "clusterip-from-outside-is-masqueraded",
            kind: Kind::ClusterIpExternal,
            node_zone: None,
            services: vec![clusterip("web", 11).build()],
            slices: both("web", vec![ready(0, NODE_NAME)]),
            probes: vec![probe(
                Client,
                Tcp,
                Target::Addr(sa(&vip(11), 80)),
                3,
                Masqueraded,
            )],
        },
        Case {
            name: "pod-traffic-keeps-its-source",
            kind: Kind::ClusterIp,
            node_zone: None,
            services: vec![clusterip("web", 12).build()],
            slices: both("web", vec![ready(1, OTHER_NODE)]),
            probes: vec![probe(
                Pod(0),
                Tcp,
                Target::Addr(sa(&vip(12), 80)),
                3,
                SourcePreserved,
            )],
        },
        Case {
            name: "hairpin-is-masqueraded",
            kind: Kind::ClusterIp,
            node_zone: None,
            services: vec![clusterip("web", 13).build()],
            slices: both("web", vec![ready(0, NODE_NAME)]),
            probes: vec![probe(
                Pod(0),
                Tcp,
                Target::Addr(sa(&vip(13), 80)),
                3,
                Masqueraded,
            )],
        },
        Case {
            name: "no-endpoints-rejected",
            kind: Kind::ClusterIp,
            node_zone: None,
            services: vec![clusterip("empty", 14).build()],
            slices: vec![],
            probes: vec![
                probe(Pod(0), Tcp, Target::Addr(sa(&vip(14), 80)), 2, Rejected),
                probe(Pod(0), Udp, Target::Addr(sa(&vip(14), 53)), 2, Rejected),
            ],
        },
        Case {
            name: "unknown-port-rejected-unallocated-ip-dropped",
            kind: Kind::ClusterIp,
            node_zone: None,
            services: vec![clusterip("web", 15).build()],
            slices: both("web", vec![ready(0, NODE_NAME)]),
            probes: vec![
                probe(Pod(1), Tcp, Target::Addr(sa(&vip(15), 81)), 1, Rejected),
                probe(Pod(1), Tcp, Target::Addr(sa(&vip(250), 80)), 1, Dropped),
            ],
        },
        Case {
            name: "terminating-fallback",
            kind: Kind::ClusterIp,
            node_zone: None,
            services: vec![clusterip("web", 16).build(), clusterip("gone", 17).build()],
            slices: [
                both(
                    "web",
                    vec![
                        Ep::terminating(&pod_ip(0).to_string(), true).node(NODE_NAME),
                        Ep::terminating(&pod_ip(1).to_string(), false).node(OTHER_NODE),
                        Ep::not_ready(&pod_ip(2).to_string()).node(OTHER_NODE),
                    ],
                ),
                both(
                    "gone",
                    vec![Ep::terminating(&pod_ip(1).to_string(), false).node(OTHER_NODE)],
                ),
            ]
            .concat(),
            probes: vec![
                probe(
                    Pod(3),
                    Tcp,
                    Target::Addr(sa(&vip(16), 80)),
                    10,
                    Balanced(vec![0]),
                ),
                probe(Pod(3), Tcp, Target::Addr(sa(&vip(17), 80)), 1, Rejected),
            ],
        },
        Case {
            name: "session-affinity-sticks",
            kind: Kind::ClusterIp,
            node_zone: None,
            services: vec![clusterip("sticky", 18).client_ip_affinity(300).build()],
            slices: both(
                "sticky",
                vec![
                    ready(0, NODE_NAME),
                    ready(1, OTHER_NODE),
                    ready(2, OTHER_NODE),
                ],
            ),
            probes: vec![
                probe(
                    Pod(3),
                    Tcp,
                    Target::Addr(sa(&vip(18), 80)),
                    15,
                    Sticky(vec![0, 1, 2]),
                ),
                probe(
                    Client,
                    Tcp,
                    Target::Addr(sa(&vip(18), 80)),
                    15,
                    Sticky(vec![0, 1, 2]),
                ),
            ],
        },
        Case {
            name: "internal-traffic-policy-local",
            kind: Kind::ClusterIp,
            node_zone: None,
            services: vec![
                clusterip("local", 19).internal_traffic_local().build(),
                clusterip("nolocal", 20).internal_traffic_local().build(),
            ],
            slices: [
                both("local", vec![ready(0, NODE_NAME), ready(1, OTHER_NODE)]),
                both("nolocal", vec![ready(1, OTHER_NODE)]),
            ]
            .concat(),
            probes: vec![
                probe(
                    Pod(3),
                    Tcp,
                    Target::Addr(sa(&vip(19), 80)),
                    10,
                    Balanced(vec![0]),
                ),
                probe(Pod(3), Tcp, Target::Addr(sa(&vip(20), 80)), 1, Dropped),
            ],
        },
        Case {
            name: "topology-hints-same-zone",
            kind: Kind::ClusterIp,
            node_zone: Some("zone-a"),
            services: vec![
                clusterip("zonal", 21)
                    .traffic_distribution("PreferClose")
                    .build(),
            ],
            slices: both(
                "zonal",
                vec![
                    ready(0, NODE_NAME).zone("zone-a").zone_hints(&["zone-a"]),
                    ready(1, OTHER_NODE).zone("zone-b").zone_hints(&["zone-b"]),
                    ready(2, OTHER_NODE).zone("zone-a").zone_hints(&["zone-a"]),
                ],
            ),
            probes: vec![probe(
                Pod(3),
                Tcp,
                Target::Addr(sa(&vip(21), 80)),
                20,
                Balanced(vec![0, 2]),
            )],
        },
        Case {
            name: "nodeport-cluster-policy-masquerades",
            kind: Kind::External,
            node_zone: None,
            services: vec![
                ServiceBuilder::new("default", "np")
                    .cluster_ip(&vip(22))
                    .type_("NodePort")
                    .node_port("http", Tcp, 80, 30080)
                    .node_port("dns", Udp, 53, 30053)
                    .build(),
            ],
            slices: both("np", vec![ready(0, NODE_NAME), ready(1, OTHER_NODE)]),
            probes: vec![
                probe(
                    Client,
                    Tcp,
                    Target::NodePort(30080),
                    10,
                    Balanced(vec![0, 1]),
                ),
                probe(Client, Tcp, Target::NodePort(30080), 3, Masqueraded),
                probe(
                    Client,
                    Udp,
                    Target::NodePort(30053),
                    10,
                    Balanced(vec![0, 1]),
                ),
                probe(Client, Tcp, Target::NodePort(30081), 1, Rejected),
            ],
        },
        Case {
            name: "external-traffic-policy-local",
            kind: Kind::External,
            node_zone: None,
            services: vec![
                ServiceBuilder::new("default", "lb-local")
                    .cluster_ip(&vip(23))
                    .type_("LoadBalancer")
                    .node_port("http", Tcp, 80, 30090)
                    .lb_ingress(LB_IP)
                    .external_traffic_local(Some(32090))
                    .build(),
                ServiceBuilder::new("default", "lb-remote")
                    .cluster_ip(&vip(24))
                    .type_("LoadBalancer")
                    .node_port("http", Tcp, 80, 30091)
                    .external_traffic_local(Some(32091))
                    .build(),
            ],
            slices: vec![
                slice(
                    "lb-local",
                    "http",
                    Tcp,
                    vec![ready(0, NODE_NAME), ready(1, OTHER_NODE)],
                ),
                slice("lb-remote", "http", Tcp, vec![ready(1, OTHER_NODE)]),
            ],
            probes: vec![
                probe(Client, Tcp, Target::NodePort(30090), 10, Balanced(vec![0])),
                probe(Client, Tcp, Target::NodePort(30090), 2, SourcePreserved),
                probe(
                    Client,
                    Tcp,
                    Target::Addr(sa(LB_IP, 80)),
                    5,
                    Balanced(vec![0]),
                ),
                probe(Client, Tcp, Target::NodePort(30091), 1, Dropped),
                // Pod traffic to an eTP=Local NodePort is short-circuited to all endpoints.
                probe(
                    Pod(3),
                    Tcp,
                    Target::Addr(sa(NODE_IP, 30091)),
                    3,
                    Within(vec![1]),
                ),
                probe(Client, Tcp, Target::HealthCheck(32090), 1, Health(200, 1)),
                probe(Client, Tcp, Target::HealthCheck(32091), 1, Health(503, 0)),
            ],
        },
        Case {
            name: "external-ips",
            kind: Kind::External,
            node_zone: None,
            services: vec![
                ServiceBuilder::new("default", "ext")
                    .cluster_ip(&vip(25))
                    .port("http", Tcp, 80)
                    .external_ips(&[EXTERNAL_IP])
                    .build(),
            ],
            slices: vec![slice("ext", "http", Tcp, vec![ready(2, OTHER_NODE)])],
            probes: vec![probe(
                Client,
                Tcp,
                Target::Addr(sa(EXTERNAL_IP, 80)),
                3,
                Balanced(vec![2]),
            )],
        },
        // kubernetes#131765, fixed by kubernetes#132456 (v1.34): the node's
        // own traffic to the load-balancer IP or an externalIP of an
        // eTP=Local Service is short-circuited to the Service's endpoints,
        // even on a node with no local endpoint; only traffic from outside
        // is dropped there. (kube-proxy checked for endpoints before DNAT
        // and dropped it.)
        Case {
            name: "node-to-local-policy-external-addresses-without-local-endpoint",
            kind: Kind::External,
            node_zone: None,
            services: vec![
                ServiceBuilder::new("default", "lb-nolocal")
                    .cluster_ip(&vip(26))
                    .type_("LoadBalancer")
                    .node_port("http", Tcp, 80, 30092)
                    .lb_ingress(LB_IP)
                    .external_ips(&[EXTERNAL_IP])
                    .external_traffic_local(Some(32092))
                    .build(),
            ],
            slices: vec![slice(
                "lb-nolocal",
                "http",
                Tcp,
                vec![ready(1, OTHER_NODE), ready(2, OTHER_NODE)],
            )],
            probes: vec![
                probe(
                    Node,
                    Tcp,
                    Target::Addr(sa(LB_IP, 80)),
                    6,
                    Within(vec![1, 2]),
                ),
                probe(
                    Node,
                    Tcp,
                    Target::Addr(sa(EXTERNAL_IP, 80)),
                    6,
                    Within(vec![1, 2]),
                ),
                probe(Client, Tcp, Target::Addr(sa(LB_IP, 80)), 1, Dropped),
                probe(Client, Tcp, Target::Addr(sa(EXTERNAL_IP, 80)), 1, Dropped),
            ],
        },
    ]
}

trait TapName {
    fn tap_name(self, name: &str) -> Self;
}

impl TapName for EndpointSlice {
    fn tap_name(mut self, name: &str) -> Self {
        self.metadata.name = Some(name.into());
        self
    }
}

/// Extra lab routing the cases need (externalIP and LB IP reach the node).
pub fn route_external_ips(lab: &Lab) -> Result<(), LabError> {
    for ip in [EXTERNAL_IP, LB_IP] {
        lab.client
            .ip(&["route", "add", &format!("{ip}/32"), "via", NODE_IP])?;
    }
    lab.client
        .ip(&["route", "add", SERVICE_CIDR, "via", NODE_IP])?;
    Ok(())
}

/// Loads a case's objects into the proxier (replacing the previous case's).
pub fn load_case(handle: &ProxyHandle, case: &Case) {
    handle.set_node_zone(case.node_zone.map(Into::into));
    handle.replace_services(&case.services);
    handle.replace_endpoint_slices(&case.slices);
}

fn target_addr(t: &Target) -> SocketAddr {
    match t {
        Target::Addr(a) => *a,
        Target::NodePort(p) | Target::HealthCheck(p) => sa(NODE_IP, *p),
    }
}

fn source_of(origin: Origin) -> IpAddr {
    match origin {
        Origin::Client => parse_ip(CLIENT_IP),
        Origin::Pod(i) => pod_ip(i),
        Origin::Node => parse_ip(NODE_IP),
    }
}

/// Runs one probe; returns a description of the mismatch, if any.
pub async fn run_probe(lab: &Lab, p: &Probe) -> Result<(), String> {
    let addr = target_addr(&p.target);
    let timeout = match p.expect {
        Expect::Dropped => Duration::from_millis(700),
        _ => Duration::from_secs(3),
    };
    if let (Target::HealthCheck(_), Expect::Health(status, count)) = (&p.target, &p.expect) {
        let (got, body) = lab
            .http_get(p.from, addr, "/", timeout)
            .await
            .map_err(|e| format!("{e:?}"))?;
        let want_count = format!("\"localEndpoints\": {count},");
        if got != *status || !body.contains(&want_count) {
            return Err(format!(
                "health check {addr}: got {got} {body:?}, want {status} with {want_count}"
            ));
        }
        return Ok(());
    }
    let mut seen: Vec<Reply> = Vec::new();
    for _ in 0..p.attempts.max(1) {
        let r = match p.proto {
            Protocol::Udp => lab.udp(p.from, addr, 0, timeout).await,
            _ => lab.tcp(p.from, addr, timeout).await,
        };
        match (&p.expect, r) {
            (Expect::Rejected, Err(NoReply::Refused))
            | (Expect::Dropped, Err(NoReply::Timeout)) => {}
            (Expect::Rejected | Expect::Dropped, other) => {
                return Err(format!(
                    "{:?} {addr} from {:?}: want {:?}, got {other:?}",
                    p.proto, p.from, p.expect
                ));
            }
            (_, Ok(reply)) => seen.push(reply),
            (_, Err(e)) => {
                return Err(format!(
                    "{:?} {addr} from {:?}: no reply: {e:?}",
                    p.proto, p.from
                ));
            }
        }
    }
    let pods: BTreeSet<String> = seen.iter().map(|r| r.pod.clone()).collect();
    let names = |v: &[usize]| -> BTreeSet<String> { v.iter().map(|i| pod_name(*i)).collect() };
    let ok = match &p.expect {
        Expect::Balanced(v) => pods == names(v),
        Expect::Within(v) => pods.is_subset(&names(v)) && !pods.is_empty(),
        Expect::Sticky(v) => pods.len() == 1 && pods.is_subset(&names(v)),
        Expect::SourcePreserved => seen.iter().all(|r| r.peer.ip() == source_of(p.from)),
        Expect::Masqueraded => seen.iter().all(|r| {
            let pod_index = r
                .pod
                .trim_start_matches("pod-")
                .parse::<usize>()
                .unwrap_or(usize::MAX);
            r.peer.ip() == node_ip_towards(pod_index)
        }),
        Expect::Rejected | Expect::Dropped | Expect::Health(..) => true,
    };
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{:?} {addr} from {:?}: want {:?}, saw pods {pods:?} peers {:?}",
            p.proto,
            p.from,
            p.expect,
            seen.iter().map(|r| r.peer).collect::<Vec<_>>()
        ))
    }
}

/// Loads `case`, syncs the proxier and runs every probe. Returns the
/// failures (empty = pass).
pub async fn run_case(
    lab: &Lab,
    proxier: &mut Proxier,
    handle: &ProxyHandle,
    case: &Case,
) -> Vec<String> {
    load_case(handle, case);
    if let Err(e) = tokio::task::block_in_place(|| proxier.sync_now(false)) {
        return vec![format!("{}: sync failed: {e}", case.name)];
    }
    let mut failures = Vec::new();
    for p in &case.probes {
        if let Err(e) = run_probe(lab, p).await {
            failures.push(format!("{}: {e}", case.name));
        }
    }
    failures
}
