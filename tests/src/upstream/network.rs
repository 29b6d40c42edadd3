//! The upstream tier's network: the control plane lives in a network
//! namespace of its own, every node in its containerd's namespace, joined
//! by one veth pair per node. Nothing is added to the host's network: the
//! test process reaches the API server through a relay that listens on the
//! host's loopback and connects from inside the control plane's namespace.
//!
//! ```text
//!  host loopback 127.0.0.1:R ──relay──► cp netns 127.0.0.1:6443 (kube-apiserver)
//!  cp netns: lo 10.99.0.1/32 (API server address), nd<N> 10.99.<N>.1/30
//!  node N netns: up0 10.99.<N>.2/30 (the node IP), default via 10.99.<N>.1,
//!                kbr0 = the pods' bridge 10.244.<N>.0/24 (routed back from cp)
//! ```

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Mutex;

use nix::sched::{CloneFlags, setns};

use super::UpstreamError;
use crate::netns::NetNs;

/// The API server's address, on the control plane namespace's loopback
/// (its `--advertise-address`, so the `kubernetes` Service points there).
pub const API_IP: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 1);
/// The API server's secure port.
pub const API_PORT: u16 = 6443;
/// The Service CIDR (`--service-cluster-ip-range`).
pub const SERVICE_CIDR: &str = "10.96.0.0/16";
/// The `kubernetes` Service's ClusterIP (first address of [`SERVICE_CIDR`]).
pub const KUBERNETES_SERVICE_IP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 1);

/// The control plane's namespace and the links to its nodes.
#[derive(Debug)]
pub struct ControlPlaneNet {
    ns: NetNs,
    links: Mutex<Links>,
}

/// The link indexes in use, and the last one handed out.
#[derive(Debug, Default)]
struct Links {
    used: Vec<u8>,
    last: u8,
}

/// One node's link to the control plane (removed with the node's namespace).
#[derive(Debug, Clone)]
pub struct NodeLink {
    /// The link's index (the `<N>` of the addresses).
    pub index: u8,
    /// The node's IP (its InternalIP).
    pub node_ip: Ipv4Addr,
    /// The control plane's end.
    pub gateway: Ipv4Addr,
    /// The pod CIDR routed to this node.
    pub pod_cidr: String,
}

impl ControlPlaneNet {
    /// Creates the namespace with [`API_IP`] on its loopback and forwarding on.
    pub fn create() -> Result<ControlPlaneNet, UpstreamError> {
        let ns = NetNs::create("kcp")?;
        ns.ip(&["addr", "add", &format!("{API_IP}/32"), "dev", "lo"])?;
        write_sysctl(&ns, "net/ipv4/ip_forward", "1")?;
        Ok(ControlPlaneNet {
            ns,
            links: Mutex::new(Links::default()),
        })
    }

    /// The namespace.
    pub fn netns(&self) -> &NetNs {
        &self.ns
    }

    /// The pod CIDR the next [`ControlPlaneNet::attach`] would route, for
    /// starting the node's containerd with it.
    ///
    /// Indexes are handed out in turn, not lowest first: the kernel removes
    /// a gone node's veth (and so the control plane's `nd<N>` end and its
    /// routes) asynchronously after its namespace is deleted, so an index
    /// just released may still name a link for a moment.
    pub fn reserve(&self) -> Result<(u8, String), UpstreamError> {
        let mut links = self.links.lock().unwrap_or_else(|p| p.into_inner());
        let index = next_index(&links.used, links.last).ok_or_else(|| UpstreamError::Setup {
            context: "attaching a node".into(),
            message: "250 nodes already".into(),
        })?;
        links.used.push(index);
        links.last = index;
        Ok((index, format!("10.244.{index}.0/24")))
    }

    /// Joins a node namespace to the control plane: a veth pair, the
    /// node's address and default route, the route back to its pods.
    pub fn attach(
        &self,
        node: &NetNs,
        index: u8,
        pod_cidr: &str,
    ) -> Result<NodeLink, UpstreamError> {
        let node_ip = Ipv4Addr::new(10, 99, index, 2);
        let gateway = Ipv4Addr::new(10, 99, index, 1);
        let cp_end = format!("nd{index}");
        self.ns.ip(&[
            "link",
            "add",
            &cp_end,
            "type",
            "veth",
            "peer",
            "name",
            "up0",
            "netns",
            node.name(),
        ])?;
        self.ns
            .ip(&["addr", "add", &format!("{gateway}/30"), "dev", &cp_end])?;
        self.ns.ip(&["link", "set", &cp_end, "up"])?;
        node.ip(&["addr", "add", &format!("{node_ip}/30"), "dev", "up0"])?;
        node.ip(&["link", "set", "up0", "up"])?;
        node.ip(&["route", "replace", "default", "via", &gateway.to_string()])?;
        write_sysctl(node, "net/ipv4/ip_forward", "1")?;
        self.ns
            .ip(&["route", "add", pod_cidr, "via", &node_ip.to_string()])?;
        Ok(NodeLink {
            index,
            node_ip,
            gateway,
            pod_cidr: pod_cidr.to_string(),
        })
    }

    /// Gives a link's index back once its node is gone.
    pub fn release(&self, index: u8) {
        let mut links = self.links.lock().unwrap_or_else(|p| p.into_inner());
        links.used.retain(|i| *i != index);
        // The veth went with the node's namespace, and its routes with it.
    }
}

/// The first index in 1..=250 after `last` (wrapping) not in `used`.
fn next_index(used: &[u8], last: u8) -> Option<u8> {
    (1..=250u16)
        .map(|k| ((u16::from(last) + k - 1) % 250 + 1) as u8)
        .find(|i| !used.contains(i))
}

/// Writes `/proc/sys/<key>` from inside `ns` (net.* keys are per namespace).
pub fn write_sysctl(ns: &NetNs, key: &str, value: &str) -> Result<(), UpstreamError> {
    let path = format!("/proc/sys/{key}");
    let value = value.to_string();
    let p2 = path.clone();
    ns.run(move || std::fs::write(&p2, value))?
        .map_err(UpstreamError::io(format!(
            "writing {path} in {}",
            ns.name()
        )))
}

/// A TCP relay from the host's loopback into a namespace: accepted
/// connections are forwarded to `target` as seen from inside the
/// namespace. It runs on a thread of its own (joined to the namespace,
/// with its own runtime), so it outlives any one test's runtime; dropping
/// it stops the thread.
#[derive(Debug)]
pub struct HostRelay {
    addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl HostRelay {
    /// Listens on `127.0.0.1:0` of the host and forwards into `ns`.
    pub fn start(ns: &NetNs, target: SocketAddr) -> Result<HostRelay, UpstreamError> {
        let listener = std::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0))).map_err(
            UpstreamError::io("binding the relay on the host's loopback"),
        )?;
        let addr = listener
            .local_addr()
            .map_err(UpstreamError::io("relay address"))?;
        listener
            .set_nonblocking(true)
            .map_err(UpstreamError::io("relay listener"))?;
        let ns_file = std::fs::File::open(ns.path()).map_err(UpstreamError::io(format!(
            "opening {}",
            ns.path().display()
        )))?;
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<(), String>>();
        let thread = std::thread::Builder::new()
            .name("upstream-relay".into())
            .spawn(move || {
                // The listener was created in the host namespace and stays
                // there; connections this thread opens are in `ns`.
                if let Err(e) = setns(&ns_file, CloneFlags::CLONE_NEWNET) {
                    let _ = ready_tx.send(Err(format!("setns: {e}")));
                    return;
                }
                let rt = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = ready_tx.send(Err(format!("runtime: {e}")));
                        return;
                    }
                };
                rt.block_on(async move {
                    let listener = match tokio::net::TcpListener::from_std(listener) {
                        Ok(l) => l,
                        Err(e) => {
                            let _ = ready_tx.send(Err(format!("listener: {e}")));
                            return;
                        }
                    };
                    let _ = ready_tx.send(Ok(()));
                    let accept = async {
                        loop {
                            let Ok((mut inbound, _)) = listener.accept().await else {
                                continue;
                            };
                            tokio::spawn(async move {
                                if let Ok(mut outbound) =
                                    tokio::net::TcpStream::connect(target).await
                                {
                                    let _ =
                                        tokio::io::copy_bidirectional(&mut inbound, &mut outbound)
                                            .await;
                                }
                            });
                        }
                    };
                    tokio::select! {
                        _ = stop_rx => {}
                        () = accept => {}
                    }
                });
            })
            .map_err(UpstreamError::io("starting the relay thread"))?;
        match ready_rx.recv() {
            Ok(Ok(())) => {}
            Ok(Err(message)) => {
                return Err(UpstreamError::Setup {
                    context: "starting the API relay".into(),
                    message,
                });
            }
            Err(_) => {
                return Err(UpstreamError::Setup {
                    context: "starting the API relay".into(),
                    message: "relay thread ended".into(),
                });
            }
        }
        Ok(HostRelay {
            addr,
            stop: Some(stop_tx),
            thread: Some(thread),
        })
    }

    /// Where it listens on the host.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for HostRelay {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::next_index;

    #[test]
    fn indexes_go_round_and_skip_those_in_use() {
        assert_eq!(next_index(&[], 0), Some(1));
        // 3 was just released: 4 comes next, not 3.
        assert_eq!(next_index(&[1, 2], 3), Some(4));
        assert_eq!(next_index(&[1], 250), Some(2));
        let all: Vec<u8> = (1..=250).collect();
        assert_eq!(next_index(&all, 7), None);
        let but_five: Vec<u8> = (1..=250).filter(|i| *i != 5).collect();
        assert_eq!(next_index(&but_five, 5), Some(5));
    }
}
