//! System tests of the eBPF socket load balancer with real traffic.
//!
//! Each test builds its own world and removes it, also on failure:
//! - a bpffs mounted on a fresh directory under /tmp (the pins live there),
//! - a cgroup v2 child `/sys/fs/cgroup/unified/kt-ebpf-*` — the programs are
//!   attached to it, never to the node's root cgroup,
//! - a client netns with one veth to each backend ("pod") netns,
//! - backends: TCP and UDP servers in the pod namespaces that answer with
//!   their name,
//! - clients: child processes (this test binary re-executed as the ignored
//!   test `ebpf_client_process`) that move themselves into the cgroup, then
//!   join the client netns, and run socket commands read from stdin.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Write};
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::Duration;

use keelson_netplane::ebpf::{
    AFFINITY_KIND_CLIENT, EbpfBackend, EbpfConfig, EbpfError, Frontend, L4Proto, LbService,
    SocketLb, check_support, cleanup, live_link_ids, pinned_links,
};
use keelson_netplane::fixtures::{EndpointSpec, ServiceBuilder, SliceBuilder};
use keelson_netplane::model::{
    ChangeTracker, IpFamily, NodeTopology, Protocol, ProxyDiff, ProxySnapshot,
};
use keelson_netplane::nftables::{NftablesBackend, NftablesConfig};
use keelson_netplane::{Backend, BackendError, SyncOutcome};
use keelson_tests::netns::{NetNs, unique_suffix, veth_pair};
use keelson_tests::support::{require_root, wait_for};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
use tokio::task::JoinHandle;

const CLIENT_CGROUP_ENV: &str = "KEELSON_EBPF_TEST_CGROUP";
const CLIENT_NETNS_ENV: &str = "KEELSON_EBPF_TEST_NETNS";
const RESULT_PREFIX: &str = "KLRESULT ";
const CGROUP2_ROOT: &str = "/sys/fs/cgroup/unified";

// ---------------------------------------------------------------------------
// Resources owned by a test (removed on drop)

/// A bpffs mounted on a fresh directory; pins are removed, the fs unmounted.
struct Bpffs {
    config: EbpfConfig,
}

impl Bpffs {
    fn new(cgroup: &Path) -> Bpffs {
        let dir = PathBuf::from(format!("/tmp/kt-bpffs-{}", unique_suffix()));
        std::fs::create_dir_all(&dir).expect("bpffs dir");
        let config = EbpfConfig {
            cgroup_path: Some(cgroup.to_path_buf()),
            bpffs_path: dir.join("keelson"),
        };
        // SocketLb::start mounts it; mount here already so Drop always has
        // something to undo.
        keelson_netplane::ebpf::ensure_bpffs(&dir).expect("mount bpffs");
        Bpffs { config }
    }
}

impl Drop for Bpffs {
    fn drop(&mut self) {
        if let Err(e) = cleanup(&self.config) {
            eprintln!("warning: eBPF cleanup: {e}");
        }
        let Some(dir) = self.config.bpffs_path.parent() else {
            return;
        };
        if let Err(e) = nix::mount::umount2(dir, nix::mount::MntFlags::MNT_DETACH) {
            eprintln!("warning: umount {}: {e}", dir.display());
        }
        let _ = std::fs::remove_dir(dir);
    }
}

/// A cgroup v2 child created for the test.
struct Cgroup {
    path: PathBuf,
}

impl Cgroup {
    fn new() -> Cgroup {
        let path = PathBuf::from(format!("{CGROUP2_ROOT}/kt-ebpf-{}", unique_suffix()));
        std::fs::create_dir(&path).expect("create test cgroup");
        Cgroup { path }
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir(&self.path) {
            eprintln!("warning: removing cgroup {}: {e}", self.path.display());
        }
    }
}

/// Client netns, backend netns with a veth each, and the servers in them.
struct World {
    client: NetNs,
    /// Held so the namespaces live as long as the world.
    _pods: Vec<NetNs>,
    servers: Vec<JoinHandle<()>>,
}

impl Drop for World {
    fn drop(&mut self) {
        for s in &self.servers {
            s.abort();
        }
    }
}

/// Backend `i` (1-based): IPv4 10.251.i.2 and IPv6 fd00:251:i::2; servers on
/// TCP 8080 and UDP 5353 answering with `b<i>`.
fn backend_v4(i: u8) -> IpAddr {
    IpAddr::from([10, 251, i, 2])
}

fn backend_v6(i: u8) -> IpAddr {
    format!("fd00:251:{i}::2").parse().expect("v6")
}

fn tcp_backend(i: u8) -> SocketAddr {
    SocketAddr::new(backend_v4(i), 8080)
}

fn udp_backend(i: u8) -> SocketAddr {
    SocketAddr::new(backend_v4(i), 5353)
}

async fn world(n: u8) -> World {
    let client = NetNs::create("kt-ebc").expect("client netns");
    let mut pods = Vec::new();
    let mut servers = Vec::new();
    for i in 1..=n {
        let pod = NetNs::create("kt-ebp").expect("pod netns");
        let (c_if, p_if) = (format!("ve{i}"), "eth0".to_string());
        veth_pair(
            &client,
            &c_if,
            Some(&format!("10.251.{i}.1/24")),
            &pod,
            &p_if,
            Some(&format!("10.251.{i}.2/24")),
        )
        .expect("veth");
        client
            .ip(&[
                "-6",
                "addr",
                "add",
                &format!("fd00:251:{i}::1/64"),
                "dev",
                &c_if,
                "nodad",
            ])
            .expect("client v6");
        pod.ip(&[
            "-6",
            "addr",
            "add",
            &format!("fd00:251:{i}::2/64"),
            "dev",
            &p_if,
            "nodad",
        ])
        .expect("pod v6");
        let name = format!("b{i}");
        for ip in [backend_v4(i), backend_v6(i)] {
            let listener = pod
                .tcp_listener(SocketAddr::new(ip, 8080))
                .expect("tcp listener");
            servers.push(tokio::spawn(tcp_server(listener, name.clone())));
            let udp = pod
                .udp_socket(SocketAddr::new(ip, 5353))
                .expect("udp socket");
            servers.push(tokio::spawn(udp_server(udp, name.clone())));
        }
        pods.push(pod);
    }
    World {
        client,
        _pods: pods,
        servers,
    }
}

/// Greets with its name, then answers every `ping` line with `pong <name>`.
async fn tcp_server(listener: tokio::net::TcpListener, name: String) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            return;
        };
        let name = name.clone();
        tokio::spawn(async move {
            let (r, mut w) = stream.into_split();
            if w.write_all(format!("{name}\n").as_bytes()).await.is_err() {
                return;
            }
            let mut lines = tokio::io::BufReader::new(r).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                if line == "ping"
                    && w.write_all(format!("pong {name}\n").as_bytes())
                        .await
                        .is_err()
                {
                    return;
                }
            }
        });
    }
}

/// Answers every datagram with its name.
async fn udp_server(sock: tokio::net::UdpSocket, name: String) {
    let mut buf = [0u8; 512];
    loop {
        let Ok((_, from)) = sock.recv_from(&mut buf).await else {
            return;
        };
        let _ = sock.send_to(name.as_bytes(), from).await;
    }
}

// ---------------------------------------------------------------------------
// Client processes

/// A client process in the test cgroup and client netns.
struct Client {
    child: Child,
    stdin: ChildStdin,
    /// Lines of the child's stdout, read by a thread (so a stuck client
    /// fails the test after a deadline instead of hanging it).
    lines: std::sync::mpsc::Receiver<String>,
}

/// Longest a single client command may take (each socket operation in the
/// client has a 3 s timeout; `tcploop` runs until told to stop).
const COMMAND_DEADLINE: Duration = Duration::from_secs(60);

impl Client {
    fn spawn(cgroup: &Cgroup, netns: &NetNs) -> Client {
        let exe = std::env::current_exe().expect("test binary");
        let client_test =
            keelson_tests::support::libtest_name(module_path!(), "ebpf_client_process");
        let mut child = Command::new(exe)
            .args([
                client_test.as_str(),
                "--exact",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CLIENT_CGROUP_ENV, &cgroup.path)
            .env(CLIENT_NETNS_ENV, netns.path())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn client");
        let stdin = child.stdin.take().expect("stdin");
        let stdout = BufReader::new(child.stdout.take().expect("stdout"));
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in stdout.lines() {
                let Ok(line) = line else { return };
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        let mut c = Client {
            child,
            stdin,
            lines,
        };
        let ready = c.cmd("ready");
        assert_eq!(ready["ok"], true, "client ready: {ready}");
        c
    }

    /// Sends one command, returns its JSON result.
    fn cmd(&mut self, line: &str) -> Value {
        writeln!(self.stdin, "{line}").expect("write command");
        self.stdin.flush().expect("flush");
        let deadline = std::time::Instant::now() + COMMAND_DEADLINE;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let buf = match self.lines.recv_timeout(left) {
                Ok(buf) => buf,
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                    panic!("client gave no answer to `{line}` within {COMMAND_DEADLINE:?}")
                }
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                    panic!("client exited while running `{line}`")
                }
            };
            // libtest may have printed "test ebpf_client_process ... " first.
            if let Some(at) = buf.find(RESULT_PREFIX) {
                return serde_json::from_str(buf[at + RESULT_PREFIX.len()..].trim_end())
                    .expect("client json");
            }
        }
    }

    /// `n` new TCP connections: (backend name, peer address) each.
    fn tcp(&mut self, addr: SocketAddr, n: usize) -> Vec<(String, String)> {
        (0..n)
            .map(|_| {
                let r = self.cmd(&format!("tcp {addr}"));
                assert_eq!(r["ok"], true, "tcp {addr}: {r}");
                (str_of(&r["backend"]), str_of(&r["peer"]))
            })
            .collect()
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn str_of(v: &Value) -> String {
    v.as_str().unwrap_or_default().to_string()
}

fn counts(names: impl IntoIterator<Item = String>) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for n in names {
        *m.entry(n).or_insert(0) += 1;
    }
    m
}

/// The ignored test that is the client process. It is only started by the
/// tests below, with the cgroup and netns in its environment.
#[test]
#[ignore = "client process of the eBPF system tests; they start it themselves"]
fn ebpf_client_process() {
    let (Ok(cgroup), Ok(netns)) = (
        std::env::var(CLIENT_CGROUP_ENV),
        std::env::var(CLIENT_NETNS_ENV),
    ) else {
        panic!("ebpf_client_process is started by the eBPF system tests only");
    };
    client::run(Path::new(&cgroup), Path::new(&netns));
}

mod client {
    //! The client side: joins the cgroup (before any socket exists, and
    //! before the netns: `ip netns exec` style remounts are not involved),
    //! then the netns, then serves commands.

    use std::collections::BTreeMap;
    use std::io::{BufRead, BufReader, Write};
    use std::net::{SocketAddr, TcpStream, UdpSocket};
    use std::path::Path;
    use std::time::{Duration, Instant};

    use nix::sched::{CloneFlags, setns};
    use serde_json::{Value, json};

    use super::RESULT_PREFIX;

    const TIMEOUT: Duration = Duration::from_secs(3);

    pub fn run(cgroup: &Path, netns: &Path) {
        std::fs::write(cgroup.join("cgroup.procs"), std::process::id().to_string())
            .expect("join cgroup");
        let ns = std::fs::File::open(netns).expect("open netns");
        setns(&ns, CloneFlags::CLONE_NEWNET).expect("setns");
        let mut held: Vec<BufReader<TcpStream>> = Vec::new();
        let mut udp_held: Vec<(UdpSocket, SocketAddr)> = Vec::new();
        let stdin = std::io::stdin();
        for line in stdin.lock().lines() {
            let Ok(line) = line else { return };
            let words: Vec<&str> = line.split_whitespace().collect();
            let result = match words.as_slice() {
                ["ready"] => Ok(json!({})),
                ["tcp", addr] => tcp(addr).map(|(_, v)| v),
                ["hold", addr] => tcp(addr).map(|(s, mut v)| {
                    v["id"] = json!(held.len());
                    held.push(s);
                    v
                }),
                ["ping", id] => ping(&mut held, id),
                ["tcploop", addr, started, stop] => {
                    tcp_loop(addr, Path::new(started), Path::new(stop))
                }
                ["udpc", addr] => udp_connected(addr),
                ["udpu", addr] => udp_unconnected_new(addr),
                ["uhold", addr] => addr
                    .parse::<SocketAddr>()
                    .map_err(|e| e.to_string())
                    .and_then(|a| {
                        let s = UdpSocket::bind(if a.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" })
                            .map_err(|e| e.to_string())?;
                        s.set_read_timeout(Some(TIMEOUT))
                            .map_err(|e| e.to_string())?;
                        udp_held.push((s, a));
                        Ok(json!({ "id": udp_held.len() - 1 }))
                    }),
                ["usend", id] => id
                    .parse::<usize>()
                    .ok()
                    .and_then(|i| udp_held.get(i))
                    .ok_or_else(|| format!("no udp socket {id}"))
                    .and_then(|(s, a)| udp_exchange(s, *a)),
                _ => Err(format!("unknown command {line}")),
            };
            let out = match result {
                Ok(mut v) => {
                    v["ok"] = json!(true);
                    v
                }
                Err(e) => json!({ "ok": false, "error": e }),
            };
            println!("{RESULT_PREFIX}{out}");
            let _ = std::io::stdout().flush();
        }
    }

    fn tcp(addr: &str) -> Result<(BufReader<TcpStream>, Value), String> {
        let a: SocketAddr = addr.parse().map_err(|e| format!("{addr}: {e}"))?;
        let s = TcpStream::connect_timeout(&a, TIMEOUT).map_err(|e| format!("connect {a}: {e}"))?;
        s.set_read_timeout(Some(TIMEOUT))
            .map_err(|e| e.to_string())?;
        let peer = s.peer_addr().map_err(|e| format!("getpeername: {e}"))?;
        let mut r = BufReader::new(s);
        let mut name = String::new();
        r.read_line(&mut name)
            .map_err(|e| format!("read greeting: {e}"))?;
        Ok((
            r,
            json!({ "backend": name.trim(), "peer": peer.to_string() }),
        ))
    }

    fn ping(held: &mut [BufReader<TcpStream>], id: &str) -> Result<Value, String> {
        let r = id
            .parse::<usize>()
            .ok()
            .and_then(|i| held.get_mut(i))
            .ok_or_else(|| format!("no connection {id}"))?;
        r.get_mut()
            .write_all(b"ping\n")
            .map_err(|e| format!("write: {e}"))?;
        let mut line = String::new();
        r.read_line(&mut line).map_err(|e| format!("read: {e}"))?;
        Ok(json!({ "reply": line.trim() }))
    }

    /// Connects again and again until `stop_file` exists; counts results.
    /// Creates `started_file` after the first attempt.
    fn tcp_loop(addr: &str, started_file: &Path, stop_file: &Path) -> Result<Value, String> {
        let deadline = Instant::now() + Duration::from_secs(60);
        let (mut ok, mut failures) = (0u64, Vec::new());
        let mut backends: BTreeMap<String, u64> = BTreeMap::new();
        while !stop_file.exists() && Instant::now() < deadline {
            match tcp(addr) {
                Ok((_, v)) => {
                    ok += 1;
                    *backends
                        .entry(v["backend"].as_str().unwrap_or("").to_string())
                        .or_default() += 1;
                }
                Err(e) => failures.push(e),
            }
            if ok + failures.len() as u64 == 1 {
                std::fs::write(started_file, b"").map_err(|e| e.to_string())?;
            }
        }
        Ok(json!({ "connections": ok, "failures": failures, "backends": backends }))
    }

    fn udp_exchange(s: &UdpSocket, to: SocketAddr) -> Result<Value, String> {
        s.send_to(b"hi", to)
            .map_err(|e| format!("sendto {to}: {e}"))?;
        let mut buf = [0u8; 512];
        let (n, from) = s
            .recv_from(&mut buf)
            .map_err(|e| format!("recvfrom: {e}"))?;
        Ok(json!({
            "backend": String::from_utf8_lossy(&buf[..n]),
            "source": from.to_string(),
        }))
    }

    fn udp_unconnected_new(addr: &str) -> Result<Value, String> {
        let a: SocketAddr = addr.parse().map_err(|e| format!("{addr}: {e}"))?;
        let s = UdpSocket::bind(if a.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" })
            .map_err(|e| e.to_string())?;
        s.set_read_timeout(Some(TIMEOUT))
            .map_err(|e| e.to_string())?;
        udp_exchange(&s, a)
    }

    fn udp_connected(addr: &str) -> Result<Value, String> {
        let a: SocketAddr = addr.parse().map_err(|e| format!("{addr}: {e}"))?;
        let s = UdpSocket::bind(if a.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" })
            .map_err(|e| e.to_string())?;
        s.set_read_timeout(Some(TIMEOUT))
            .map_err(|e| e.to_string())?;
        s.connect(a).map_err(|e| format!("connect {a}: {e}"))?;
        let peer = s.peer_addr().map_err(|e| format!("getpeername: {e}"))?;
        s.send(b"hi").map_err(|e| format!("send: {e}"))?;
        let mut buf = [0u8; 512];
        let n = s.recv(&mut buf).map_err(|e| format!("recv: {e}"))?;
        Ok(json!({
            "backend": String::from_utf8_lossy(&buf[..n]),
            "peer": peer.to_string(),
        }))
    }
}

// ---------------------------------------------------------------------------
// Helpers for the tests

fn frontend(vip: &str, port: u16, proto: L4Proto) -> Frontend {
    Frontend {
        vip: vip.parse().expect("vip"),
        port,
        proto,
    }
}

fn lb_service(name: &str, backends: Vec<SocketAddr>, affinity: Option<u32>) -> LbService {
    LbService {
        name: name.to_string(),
        affinity_timeout: affinity,
        backends,
    }
}

/// Link ids of the programs keelson has pinned (one per hook).
fn pinned_link_ids(config: &EbpfConfig) -> BTreeSet<u32> {
    let links = pinned_links(config).expect("pinned links");
    links.iter().map(|l| l.link_id).collect()
}

/// Waits until none of `ids` exists in the kernel any more.
async fn links_gone(ids: &BTreeSet<u32>, what: &str) {
    wait_for(
        what,
        Duration::from_secs(5),
        Duration::from_millis(10),
        || {
            let live: BTreeSet<u32> = live_link_ids().intersection(ids).copied().collect();
            async move {
                if live.is_empty() {
                    Ok(())
                } else {
                    Err(format!("still live: {live:?}"))
                }
            }
        },
    )
    .await
    .expect("links released");
}

const VIP: &str = "10.96.7.10";
const VIP6: &str = "fd00:96::7:10";

// ---------------------------------------------------------------------------
// Tests

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_and_udp_to_a_cluster_ip_reach_every_backend_and_see_the_service_address() {
    if !require_root("tcp_and_udp_to_a_cluster_ip_reach_every_backend_and_see_the_service_address")
    {
        return;
    }
    let cgroup = Cgroup::new();
    let bpffs = Bpffs::new(&cgroup.path);
    let w = world(3).await;
    let (mut lb, _) = SocketLb::start(&bpffs.config).expect("start socket LB");
    assert_eq!(
        pinned_link_ids(&bpffs.config).len(),
        8,
        "eight hooks attached"
    );
    let all = [1u8, 2, 3];
    lb.apply([
        (
            frontend(VIP, 80, L4Proto::Tcp),
            Some(lb_service(
                "ns/web:http",
                all.iter().map(|i| tcp_backend(*i)).collect(),
                None,
            )),
        ),
        (
            frontend(VIP, 53, L4Proto::Udp),
            Some(lb_service(
                "ns/dns:dns",
                all.iter().map(|i| udp_backend(*i)).collect(),
                None,
            )),
        ),
        (
            frontend(VIP6, 80, L4Proto::Tcp),
            Some(lb_service(
                "ns/web6:http",
                all.iter()
                    .map(|i| SocketAddr::new(backend_v6(*i), 8080))
                    .collect(),
                None,
            )),
        ),
    ])
    .expect("apply");
    let mut c = Client::spawn(&cgroup, &w.client);

    // TCP: balanced, and getpeername shows the Service address.
    let tcp_vip: SocketAddr = format!("{VIP}:80").parse().expect("addr");
    let got = c.tcp(tcp_vip, 60);
    assert!(
        got.iter().all(|(_, peer)| *peer == tcp_vip.to_string()),
        "{got:?}"
    );
    let per = counts(got.into_iter().map(|(b, _)| b));
    assert_eq!(
        per.keys().cloned().collect::<Vec<_>>(),
        ["b1", "b2", "b3"],
        "{per:?}"
    );

    // IPv6 ClusterIP through connect6/getpeername6.
    let tcp_vip6: SocketAddr = format!("[{VIP6}]:80").parse().expect("addr");
    let got = c.tcp(tcp_vip6, 30);
    assert!(
        got.iter().all(|(_, peer)| *peer == tcp_vip6.to_string()),
        "{got:?}"
    );
    assert!(counts(got.into_iter().map(|(b, _)| b)).len() >= 2);

    // Connected UDP: balanced, peer is the Service.
    let udp_vip: SocketAddr = format!("{VIP}:53").parse().expect("addr");
    let mut seen = BTreeSet::new();
    for _ in 0..60 {
        let r = c.cmd(&format!("udpc {udp_vip}"));
        assert_eq!(r["ok"], true, "{r}");
        assert_eq!(str_of(&r["peer"]), udp_vip.to_string());
        seen.insert(str_of(&r["backend"]));
    }
    assert_eq!(seen.len(), 3, "connected UDP reached {seen:?}");

    // Unconnected UDP: replies come from the Service address (recvmsg).
    let mut seen = BTreeSet::new();
    for _ in 0..60 {
        let r = c.cmd(&format!("udpu {udp_vip}"));
        assert_eq!(r["ok"], true, "{r}");
        assert_eq!(str_of(&r["source"]), udp_vip.to_string(), "reply source");
        seen.insert(str_of(&r["backend"]));
    }
    assert_eq!(seen.len(), 3, "unconnected UDP reached {seen:?}");

    // One unconnected socket keeps its backend while the flow is active.
    let id = c.cmd(&format!("uhold {udp_vip}"))["id"].clone();
    let flow: BTreeSet<String> = (0..10)
        .map(|_| {
            let r = c.cmd(&format!("usend {id}"));
            assert_eq!(str_of(&r["source"]), udp_vip.to_string(), "{r}");
            str_of(&r["backend"])
        })
        .collect();
    assert_eq!(flow.len(), 1, "one flow, one backend: {flow:?}");

    // A port that is not a Service is left alone: direct traffic works.
    let r = c.cmd(&format!("tcp {}", tcp_backend(2)));
    assert_eq!(
        (str_of(&r["backend"]), str_of(&r["peer"])),
        ("b2".into(), tcp_backend(2).to_string())
    );

    drop(c);
    drop(lb);
    drop(w);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removed_backend_gets_no_new_connections_and_affinity_sticks() {
    if !require_root("removed_backend_gets_no_new_connections_and_affinity_sticks") {
        return;
    }
    let cgroup = Cgroup::new();
    let bpffs = Bpffs::new(&cgroup.path);
    let w = world(3).await;
    let (mut lb, _) = SocketLb::start(&bpffs.config).expect("start socket LB");
    let web = frontend(VIP, 80, L4Proto::Tcp);
    let dns = frontend(VIP, 53, L4Proto::Udp);
    lb.apply([
        (
            web,
            Some(lb_service(
                "ns/web:http",
                vec![tcp_backend(1), tcp_backend(2), tcp_backend(3)],
                None,
            )),
        ),
        (
            dns,
            Some(lb_service(
                "ns/dns:dns",
                vec![udp_backend(1), udp_backend(2), udp_backend(3)],
                None,
            )),
        ),
    ])
    .expect("apply");
    let mut c = Client::spawn(&cgroup, &w.client);
    let tcp_vip = SocketAddr::new(web.vip, 80);
    let udp_vip = SocketAddr::new(dns.vip, 53);

    // An established connection to the backend that goes away, and a UDP
    // flow stuck on it.
    // (Each attempt picks b2 with probability 1/3: 100 attempts all missing
    // it has probability 2.5e-18.)
    let held = (0..100)
        .map(|_| c.cmd(&format!("hold {tcp_vip}")))
        .find(|r| str_of(&r["backend"]) == "b2")
        .map(|r| r["id"].clone())
        .expect("a connection to b2");
    let flow = (0..100)
        .find_map(|_| {
            let id = c.cmd(&format!("uhold {udp_vip}"))["id"].clone();
            (str_of(&c.cmd(&format!("usend {id}"))["backend"]) == "b2").then_some(id)
        })
        .expect("a UDP flow on b2");

    lb.apply([
        (
            web,
            Some(lb_service(
                "ns/web:http",
                vec![tcp_backend(1), tcp_backend(3)],
                None,
            )),
        ),
        (
            dns,
            Some(lb_service(
                "ns/dns:dns",
                vec![udp_backend(1), udp_backend(3)],
                None,
            )),
        ),
    ])
    .expect("remove b2");
    let per = counts(c.tcp(tcp_vip, 40).into_iter().map(|(b, _)| b));
    assert_eq!(
        per.keys().cloned().collect::<Vec<_>>(),
        ["b1", "b3"],
        "{per:?}"
    );
    let moved = str_of(&c.cmd(&format!("usend {flow}"))["backend"]);
    assert!(
        moved == "b1" || moved == "b3",
        "the UDP flow left b2: {moved}"
    );
    // Socket LB does not cut established connections (kube-proxy doesn't either).
    assert_eq!(str_of(&c.cmd(&format!("ping {held}"))["reply"]), "pong b2");

    // ClientIP affinity: every new connection of this client goes to one backend.
    lb.apply([(
        web,
        Some(lb_service(
            "ns/web:http",
            vec![tcp_backend(1), tcp_backend(2), tcp_backend(3)],
            Some(60),
        )),
    )])
    .expect("affinity on");
    let per = counts(c.tcp(tcp_vip, 20).into_iter().map(|(b, _)| b));
    assert_eq!(per.len(), 1, "affinity sticks: {per:?}");
    let (sticky, _) = per.into_iter().next().expect("one backend");
    let id = lb.service_id(&web).expect("service id");
    let entries = lb.affinity_entries();
    assert!(
        entries
            .iter()
            .any(|e| e.svc_id == id && e.kind == AFFINITY_KIND_CLIENT),
        "affinity entry recorded: {entries:?}"
    );
    // The affine backend leaves: the client moves once, then sticks again.
    let sticky_i: u8 = sticky.trim_start_matches('b').parse().expect("index");
    let rest: Vec<SocketAddr> = [1u8, 2, 3]
        .into_iter()
        .filter(|i| *i != sticky_i)
        .map(tcp_backend)
        .collect();
    lb.apply([(web, Some(lb_service("ns/web:http", rest, Some(60))))])
        .expect("affine backend removed");
    let per = counts(c.tcp(tcp_vip, 20).into_iter().map(|(b, _)| b));
    assert_eq!(per.len(), 1, "sticks to the new choice: {per:?}");
    assert!(!per.contains_key(&sticky), "{per:?}");

    // A Service without endpoints is passed through untranslated (nftables
    // rejects it in ebpf mode; here nothing routes the VIP).
    lb.apply([(web, Some(lb_service("ns/web:http", vec![], None)))])
        .expect("no endpoints");
    let r = c.cmd(&format!("tcp {tcp_vip}"));
    assert_eq!(r["ok"], false, "no translation without endpoints: {r}");

    // Removing the Service removes its translation the same way.
    lb.apply([(web, None), (dns, None)]).expect("delete");
    let r = c.cmd(&format!("udpu {udp_vip}"));
    assert_eq!(r["ok"], false, "{r}");
    drop(c);
    drop(lb);
    drop(w);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_keeps_established_and_new_connections_working() {
    if !require_root("restart_keeps_established_and_new_connections_working") {
        return;
    }
    let cgroup = Cgroup::new();
    let bpffs = Bpffs::new(&cgroup.path);
    let w = world(3).await;
    let web = frontend(VIP, 80, L4Proto::Tcp);
    let tcp_vip = SocketAddr::new(web.vip, 80);
    let desired: BTreeMap<Frontend, LbService> = [(
        web,
        lb_service(
            "ns/web:http",
            vec![tcp_backend(1), tcp_backend(2), tcp_backend(3)],
            None,
        ),
    )]
    .into();

    let (mut first, _) = SocketLb::start(&bpffs.config).expect("first start");
    first.replace_all(desired.clone()).expect("first sync");
    let mut c = Client::spawn(&cgroup, &w.client);
    let held = c.cmd(&format!("hold {tcp_vip}"));
    assert_eq!(held["ok"], true, "{held}");
    let held_name = str_of(&held["backend"]);

    let first_links = pinned_link_ids(&bpffs.config);
    assert_eq!(first_links.len(), 8);

    // keelson stops: its process state is gone, the pins are not.
    drop(first);
    assert!(
        first_links.is_subset(&live_link_ids()),
        "links outlive keelson"
    );
    let per = counts(c.tcp(tcp_vip, 30).into_iter().map(|(b, _)| b));
    assert_eq!(
        per.len(),
        3,
        "new connections while keelson is down: {per:?}"
    );

    // keelson starts again while another client connects in a loop.
    let stop = tempfile::tempdir().expect("tempdir");
    let stop_file = stop.path().join("stop");
    let started_file = stop.path().join("started");
    let mut looper = Client::spawn(&cgroup, &w.client);
    let loop_cmd = format!(
        "tcploop {tcp_vip} {} {}",
        started_file.display(),
        stop_file.display()
    );
    let looping = std::thread::spawn(move || {
        let r = looper.cmd(&loop_cmd);
        drop(looper);
        r
    });
    // The loop is going before the restart begins.
    wait_for(
        "the connect loop to start",
        Duration::from_secs(10),
        Duration::from_millis(10),
        || {
            let started = started_file.exists();
            async move {
                if started {
                    Ok(())
                } else {
                    Err("not yet".to_string())
                }
            }
        },
    )
    .await
    .expect("loop started");
    let (mut second, stats) = SocketLb::start(&bpffs.config).expect("second start");
    assert_eq!(stats.deletes, 0, "adopted maps were clean");
    let stats = second.replace_all(desired.clone()).expect("second sync");
    assert_eq!(
        (stats.puts, stats.deletes),
        (0, 0),
        "adopted state equals desired"
    );
    let second_links = pinned_link_ids(&bpffs.config);
    assert_eq!(second_links.len(), 8);
    // The kernel frees a released link from a work queue: wait for it.
    links_gone(
        &first_links,
        "the previous keelson's links released (programs detached)",
    )
    .await;
    let per = counts(c.tcp(tcp_vip, 30).into_iter().map(|(b, _)| b));
    assert_eq!(per.len(), 3, "new connections after the restart: {per:?}");
    std::fs::write(&stop_file, b"").expect("stop loop");
    let r = looping.join().expect("loop thread");
    assert_eq!(r["ok"], true, "{r}");
    assert!(r["connections"].as_u64().unwrap_or(0) > 0, "{r}");
    assert_eq!(
        r["failures"],
        Value::Array(Vec::new()),
        "no failed connection during the restart: {r}"
    );

    // The connection established before the restart still works.
    assert_eq!(
        str_of(&c.cmd(&format!("ping {}", held["id"]))["reply"]),
        format!("pong {held_name}")
    );

    // And the restarted instance changes the adopted service correctly.
    second
        .apply([(
            web,
            Some(lb_service("ns/web:http", vec![tcp_backend(3)], None)),
        )])
        .expect("change after restart");
    let per = counts(c.tcp(tcp_vip, 10).into_iter().map(|(b, _)| b));
    assert_eq!(per.keys().cloned().collect::<Vec<_>>(), ["b3"]);

    // Cleanup detaches everything.
    drop(second);
    cleanup(&bpffs.config).expect("cleanup");
    links_gone(&second_links, "links released on cleanup").await;
    assert!(!bpffs.config.pin_dir().exists(), "pins removed");
    // The kernel detaches a released link's program right after freeing its
    // id; from then on the VIP is not translated (and nothing routes it).
    wait_for(
        "connections to the VIP to stop being translated",
        Duration::from_secs(5),
        Duration::from_millis(10),
        || {
            let r = c.cmd(&format!("tcp {tcp_vip}"));
            async move {
                if r["ok"] == false {
                    Ok(())
                } else {
                    Err(format!("still translated: {r}"))
                }
            }
        },
    )
    .await
    .expect("no translation after cleanup");
    drop(c);
    drop(w);
}

// ---------------------------------------------------------------------------
// The backend of `proxy.mode: ebpf`, driven by the model

/// Stands in for the nftables half in these tests: records what it is given.
struct Recorder(std::sync::Arc<std::sync::Mutex<Vec<String>>>);

impl Backend for Recorder {
    fn name(&self) -> &'static str {
        "recorder"
    }

    fn sync(&mut self, diff: &ProxyDiff) -> Result<SyncOutcome, BackendError> {
        self.0
            .lock()
            .expect("log")
            .push(format!("sync {}", diff.changes.len()));
        Ok(SyncOutcome::default())
    }

    fn full_sync(&mut self, snapshot: &ProxySnapshot) -> Result<SyncOutcome, BackendError> {
        self.0
            .lock()
            .expect("log")
            .push(format!("full_sync {}", snapshot.services.len()));
        Ok(SyncOutcome::default())
    }

    fn cleanup(&mut self) -> Result<(), BackendError> {
        self.0.lock().expect("log").push("cleanup".into());
        Ok(())
    }
}

/// Programs what the tracker has pending and commits it.
fn sync(tracker: &mut ChangeTracker, backend: &mut dyn Backend) -> SyncOutcome {
    let diff = tracker.diff();
    let out = backend.sync(&diff).expect("backend sync");
    tracker.commit(&diff);
    out
}

fn web_slice(endpoints: &[EndpointSpec]) -> k8s_openapi::api::discovery::v1::EndpointSlice {
    let mut b = SliceBuilder::new("shop", "web", "web-1", "IPv4").port("http", Protocol::Tcp, 8080);
    for e in endpoints {
        b = b.endpoint(e.clone());
    }
    b.build()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ebpf_backend_programs_the_models_endpoint_choice() {
    if !require_root("ebpf_backend_programs_the_models_endpoint_choice") {
        return;
    }
    let cgroup = Cgroup::new();
    let bpffs = Bpffs::new(&cgroup.path);
    let w = world(3).await;
    check_support(&bpffs.config).expect("this kernel supports the socket LB");

    let log = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut backend =
        EbpfBackend::new(&bpffs.config, Box::new(Recorder(log.clone()))).expect("ebpf backend");
    let mut tracker = ChangeTracker::new(
        [IpFamily::V4],
        NodeTopology {
            name: "node-a".into(),
            zone: None,
        },
    );
    let vip = "10.96.7.20";
    let svc = ServiceBuilder::new("shop", "web")
        .cluster_ip(vip)
        .port("http", Protocol::Tcp, 80)
        .port("sctp", Protocol::Sctp, 80)
        .build();
    tracker.update_service(&svc);
    let eps = |b1: EndpointSpec, b2: EndpointSpec, b3: EndpointSpec| {
        [b1.node("node-a"), b2.node("node-b"), b3.node("node-c")]
    };
    tracker.update_endpoint_slice(&web_slice(&eps(
        EndpointSpec::ready("10.251.1.2"),
        EndpointSpec::ready("10.251.2.2"),
        EndpointSpec::ready("10.251.3.2"),
    )));
    // Start: a full sync of the snapshot, as the sync loop does.
    let diff = tracker.diff();
    backend
        .full_sync(&tracker.snapshot(&diff))
        .expect("full sync");
    tracker.commit(&diff);

    let mut c = Client::spawn(&cgroup, &w.client);
    let tcp_vip: SocketAddr = format!("{vip}:80").parse().expect("addr");
    let backends_of = |c: &mut Client, n| -> BTreeSet<String> {
        c.tcp(tcp_vip, n).into_iter().map(|(b, _)| b).collect()
    };
    assert_eq!(
        backends_of(&mut c, 45),
        ["b1", "b2", "b3"].map(String::from).into()
    );

    // b2 starts terminating: new connections avoid it.
    tracker.update_endpoint_slice(&web_slice(&eps(
        EndpointSpec::ready("10.251.1.2"),
        EndpointSpec::terminating("10.251.2.2", true),
        EndpointSpec::ready("10.251.3.2"),
    )));
    let out = sync(&mut tracker, &mut backend);
    assert!(out.objects_changed > 0);
    assert_eq!(
        backends_of(&mut c, 30),
        ["b1", "b3"].map(String::from).into()
    );

    // Every endpoint terminating but serving: KEP-1669 fallback to them.
    tracker.update_endpoint_slice(&web_slice(&eps(
        EndpointSpec::terminating("10.251.1.2", true),
        EndpointSpec::terminating("10.251.2.2", false),
        EndpointSpec::terminating("10.251.3.2", true),
    )));
    sync(&mut tracker, &mut backend);
    assert_eq!(
        backends_of(&mut c, 30),
        ["b1", "b3"].map(String::from).into()
    );

    // internalTrafficPolicy: Local — only this node's (node-a) endpoint.
    tracker.update_endpoint_slice(&web_slice(&eps(
        EndpointSpec::ready("10.251.1.2"),
        EndpointSpec::ready("10.251.2.2"),
        EndpointSpec::ready("10.251.3.2"),
    )));
    let local = ServiceBuilder::new("shop", "web")
        .cluster_ip(vip)
        .port("http", Protocol::Tcp, 80)
        .port("sctp", Protocol::Sctp, 80)
        .internal_traffic_local()
        .build();
    tracker.update_service(&local);
    sync(&mut tracker, &mut backend);
    assert_eq!(backends_of(&mut c, 20), ["b1"].map(String::from).into());

    // A periodic full sync of an unchanged model writes nothing.
    let diff = tracker.diff();
    let out = backend.full_sync(&tracker.snapshot(&diff)).expect("resync");
    assert_eq!((out.objects_changed, out.repaired), (0, false));

    // The Service goes away: no more translation.
    tracker.delete_service("shop", "web");
    sync(&mut tracker, &mut backend);
    let r = c.cmd(&format!("tcp {tcp_vip}"));
    assert_eq!(r["ok"], false, "{r}");

    // The nftables half saw every diff and snapshot (SCTP included).
    let seen = log.lock().expect("log").clone();
    assert_eq!(
        seen,
        [
            "full_sync 2",
            "sync 1",
            "sync 1",
            "sync 2",
            "full_sync 2",
            "sync 2"
        ],
        "start, b2 terminating, all terminating, iTP Local (both ports), resync, delete"
    );

    backend.cleanup().expect("cleanup");
    assert!(!bpffs.config.pin_dir().exists(), "pins removed");
    assert_eq!(
        log.lock().expect("log").last().map(String::as_str),
        Some("cleanup")
    );
    drop(c);
    drop(backend);
    drop(w);
}

#[test]
fn check_support_names_a_directory_that_is_not_cgroup_v2() {
    if !require_root("check_support_names_a_directory_that_is_not_cgroup_v2") {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let config = EbpfConfig {
        cgroup_path: Some(dir.path().to_path_buf()),
        ..EbpfConfig::default()
    };
    match check_support(&config) {
        Err(EbpfError::Unsupported { reason }) => {
            assert!(
                reason.contains(&dir.path().display().to_string()),
                "{reason}"
            );
            assert!(reason.contains("cgroup v2"), "{reason}");
        }
        other => panic!("expected Unsupported, got {other:?}"),
    }
}

/// The whole ebpf mode: socket LB plus the real nftables backend, in the
/// client netns acting as the node. ClusterIP traffic is translated at
/// connect; a Service without endpoints is rejected by nftables (the
/// programs pass it through); an externalIP is DNATed by nftables.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ebpf_mode_leaves_what_socket_lb_does_not_serve_to_nftables() {
    if !require_root("ebpf_mode_leaves_what_socket_lb_does_not_serve_to_nftables") {
        return;
    }
    let cgroup = Cgroup::new();
    let bpffs = Bpffs::new(&cgroup.path);
    let w = world(2).await;
    // The "node" routes Service and external ranges like a real one would.
    for net in ["10.96.0.0/16", "192.0.2.0/24"] {
        w.client
            .ip(&["route", "add", net, "dev", "ve1"])
            .expect("route");
    }
    let nft = w
        .client
        .run(|| NftablesBackend::new(NftablesConfig::default()))
        .expect("netns thread")
        .expect("nftables backend in the node netns");
    let mut backend = EbpfBackend::new(&bpffs.config, Box::new(nft)).expect("ebpf backend");
    let mut tracker = ChangeTracker::new(
        [IpFamily::V4],
        NodeTopology {
            name: "node-a".into(),
            zone: None,
        },
    );
    let web = ServiceBuilder::new("shop", "web")
        .cluster_ip("10.96.7.30")
        .port("http", Protocol::Tcp, 80)
        .external_ips(&["192.0.2.10"])
        .build();
    let empty = ServiceBuilder::new("shop", "empty")
        .cluster_ip("10.96.7.31")
        .port("http", Protocol::Tcp, 80)
        .build();
    tracker.update_service(&web);
    tracker.update_service(&empty);
    tracker.update_endpoint_slice(&web_slice(&[
        EndpointSpec::ready("10.251.1.2").node("node-b"),
        EndpointSpec::ready("10.251.2.2").node("node-c"),
    ]));
    let diff = tracker.diff();
    backend
        .full_sync(&tracker.snapshot(&diff))
        .expect("full sync");
    tracker.commit(&diff);

    let mut c = Client::spawn(&cgroup, &w.client);
    // ClusterIP: socket LB (the peer is the Service, both backends reached).
    let vip: SocketAddr = "10.96.7.30:80".parse().expect("addr");
    let got = c.tcp(vip, 30);
    assert!(got.iter().all(|(_, p)| *p == vip.to_string()), "{got:?}");
    assert_eq!(counts(got.into_iter().map(|(b, _)| b)).len(), 2);
    let lb = backend.socket_lb();
    assert!(
        lb.service_id(&frontend("10.96.7.30", 80, L4Proto::Tcp))
            .is_some()
    );
    assert!(
        lb.service_id(&frontend("192.0.2.10", 80, L4Proto::Tcp))
            .is_none(),
        "externalIPs are not socket-LB frontends"
    );

    // No endpoints: untranslated, and nftables rejects it like kube-proxy.
    let r = c.cmd("tcp 10.96.7.31:80");
    assert_eq!(r["ok"], false, "{r}");
    assert!(str_of(&r["error"]).contains("refused"), "rejected: {r}");

    // externalIP from inside the node: nftables DNAT (conntrack reverses it).
    let ext: SocketAddr = "192.0.2.10:80".parse().expect("addr");
    let got = c.tcp(ext, 10);
    assert!(
        got.iter()
            .all(|(b, p)| (b == "b1" || b == "b2") && *p == ext.to_string()),
        "{got:?}"
    );

    backend.cleanup().expect("cleanup both halves");
    assert!(!bpffs.config.pin_dir().exists());
    drop(c);
    drop(backend);
    drop(w);
}

/// A second socket LB given the same pins (an overlapping restart, two
/// instances on one host) would write the same maps with its own service
/// ids and slot generations, each corrupting the other's: it waits until
/// the running one has released them, and `keelson cleanup` refuses to
/// pull the pins from under a running instance.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_instance_waits_for_the_pins() {
    if !require_root("a_second_instance_waits_for_the_pins") {
        return;
    }
    let cgroup = Cgroup::new();
    let bpffs = Bpffs::new(&cgroup.path);
    let (first, _) = SocketLb::start(&bpffs.config).expect("first start");
    assert!(
        keelson_netplane::ebpf::pins_in_use(&bpffs.config).expect("lock state"),
        "the running instance holds its pins"
    );
    let refused = keelson_netplane::ebpf::cleanup(&bpffs.config).expect_err("cleanup refuses");
    assert!(refused.to_string().contains("stop it first"), "{refused}");

    let config = bpffs.config.clone();
    let second = std::thread::spawn(move || SocketLb::start(&config).map(|(lb, _)| lb));
    // It does not start while the first runs...
    let early = wait_for(
        "the second instance to start",
        Duration::from_millis(700),
        Duration::from_millis(20),
        || {
            let done = second.is_finished();
            async move {
                if done {
                    Ok(())
                } else {
                    Err("waiting".to_string())
                }
            }
        },
    )
    .await;
    assert!(
        early.is_err(),
        "the second instance started beside the first"
    );
    // ...and does once the first has stopped.
    drop(first);
    let second = second
        .join()
        .expect("second start thread")
        .expect("second start");
    assert!(
        keelson_netplane::ebpf::pins_in_use(&bpffs.config).expect("lock state"),
        "the second instance holds the pins now"
    );
    drop(second);
    assert!(!keelson_netplane::ebpf::pins_in_use(&bpffs.config).expect("lock state"));
}

/// The Service maps are sized to the cluster: a socket LB starts with
/// small maps, rebuilds them larger when the Services outgrow them (filled
/// before the new programs attach, so traffic keeps flowing), and smaller
/// again at a full sync when most Services are gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn service_maps_grow_with_the_cluster_and_shrink_back() {
    if !require_root("service_maps_grow_with_the_cluster_and_shrink_back") {
        return;
    }
    let cgroup = Cgroup::new();
    let bpffs = Bpffs::new(&cgroup.path);
    let w = world(3).await;
    let (mut lb, _) = SocketLb::start(&bpffs.config).expect("start socket LB");
    let small = lb.sizes();
    assert_eq!(small, keelson_netplane::ebpf::MIN_SIZES);
    let web = frontend(VIP, 80, L4Proto::Tcp);
    let web_service = lb_service(
        "ns/web:http",
        [1u8, 2, 3].iter().map(|i| tcp_backend(*i)).collect(),
        None,
    );
    lb.apply([(web, Some(web_service.clone()))]).expect("apply");
    let mut c = Client::spawn(&cgroup, &w.client);
    let vip: SocketAddr = format!("{VIP}:80").parse().expect("addr");
    let reached = |got: Vec<(String, String)>| counts(got.into_iter().map(|(b, _)| b)).len();
    assert_eq!(reached(c.tcp(vip, 30)), 3);

    // 1,000 more Services × 10 endpoints: 20,000 slots in two generations.
    let many = |n: u32| {
        (0..n).map(|i| {
            let f = Frontend {
                vip: IpAddr::from([10, 97, (i >> 8) as u8, i as u8]),
                port: 80,
                proto: L4Proto::Tcp,
            };
            let backends = (0..10u8)
                .map(|e| SocketAddr::from(([10, 98, (i >> 8) as u8, i as u8], 8000 + u16::from(e))))
                .collect();
            (
                f,
                Some(lb_service(&format!("ns/s{i}:http"), backends, None)),
            )
        })
    };
    let links_before = pinned_link_ids(&bpffs.config);
    let web_id = lb.service_id(&web);
    lb.apply(many(1000)).expect("apply 1,000 Services");
    assert_eq!(lb.service_id(&web), web_id, "a rebuild keeps the ids");
    let grown = lb.sizes();
    assert!(
        grown.backends >= 20_006 && grown.services >= 1001 && grown.members >= 20_006,
        "{grown:?}"
    );
    let links_after = pinned_link_ids(&bpffs.config);
    assert!(
        links_after.is_disjoint(&links_before),
        "new programs run on the new maps"
    );
    links_gone(&links_before, "the old programs detached").await;
    assert_eq!(reached(c.tcp(vip, 30)), 3, "the Service still answers");
    let maps = bpffs.config.bpffs_path.join("maps");
    let mut pins: Vec<String> = std::fs::read_dir(&maps)
        .expect("maps dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    pins.sort();
    assert_eq!(
        pins,
        [
            "kl_affinity",
            "kl_backends",
            "kl_members",
            "kl_revnat",
            "kl_services"
        ],
        "the rebuilt maps took the pins"
    );

    // A full sync with the 1,000 gone: far more room than needed.
    lb.replace_all([(web, web_service)].into())
        .expect("replace all");
    assert_eq!(lb.sizes(), small, "{:?}", lb.sizes());
    assert_eq!(reached(c.tcp(vip, 30)), 3);

    // A restart adopts the pinned maps as they are.
    drop(lb);
    let (lb, _) = SocketLb::start(&bpffs.config).expect("restart");
    assert_eq!(lb.sizes(), small);
    assert_eq!(reached(c.tcp(vip, 30)), 3);
    drop(c);
    drop(lb);
    drop(w);
}
