//! Starts keelson's node role for tests, in two forms:
//!
//! - [`InProcessNode`]: a [`TestApiServer`], a [`FakeRuntime`] and the node
//!   role running as a task of the test's runtime, with the node's own API
//!   client built the way `keelson run` builds it (rate limit, user agent).
//!   For component tests.
//! - [`BinaryNode`]: the real `keelson` binary started inside a private
//!   containerd's network namespace (`nsenter --net`, so the host's cgroup
//!   mounts stay visible), talking to a test API server through a plain
//!   HTTP listener created in that namespace, with its root dir, pod logs
//!   dir and config in a temp dir and `cgroupRoot` under the containerd
//!   instance's cgroup (removed with it). For system tests.
//!
//! Both take a closure that edits the [`Config`] before start; everything
//! the harness sets (endpoints, directories, node name) is already in it.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use keelson::config::Config;
use keelson::node::{NodeError, NodeOverrides};
use keelson::role::RoleContext;
use keelson_cri::fake::{FakeConfig, FakeRuntime};
use kube::Api;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::containerd::Containerd;
use crate::private_systemd::SystemdEntry;
use crate::support::{WaitTimeout, wait_for};
use crate::testapi::{TestApiOptions, TestApiServer};

/// Keeps the host's disk out of a node that runs on the host's filesystem:
/// only the memory hard-eviction threshold stays (upstream default
/// `memory.available<100Mi`) and image garbage collection never triggers on
/// disk usage. A test machine whose disk is more than 85% full would
/// otherwise evict every pod for `imagefs.available<15%`, as kubelet would.
pub fn ignore_host_disk(config: &mut Config) {
    config.node.eviction_hard =
        std::iter::once(("memory.available".to_string(), "100Mi".to_string())).collect();
    config.node.image_gc_high_threshold_percent = 100;
}

/// Edits the configuration before the node starts.
pub type Configure = Arc<dyn Fn(&mut Config) + Send + Sync>;

/// Prepares the API server before the node starts.
pub type BeforeStart = Arc<dyn Fn(&TestApiServer) + Send + Sync>;

/// What went wrong starting a node.
#[derive(Debug, thiserror::Error)]
pub enum NodeHarnessError {
    /// Setting up a part failed.
    #[error("{context}: {message}")]
    Setup {
        /// What we were doing.
        context: String,
        /// Why it failed.
        message: String,
    },
}

fn setup(context: &str) -> impl FnOnce(String) -> NodeHarnessError + '_ {
    move |message| NodeHarnessError::Setup {
        context: context.to_string(),
        message,
    }
}

fn tempdir(prefix: &str) -> Result<tempfile::TempDir, NodeHarnessError> {
    tempfile::Builder::new()
        .prefix(prefix)
        .tempdir()
        .map_err(|e| setup("creating a temp dir")(e.to_string()))
}

/// A non-loopback IPv4 address of this host, for `nodeIP`.
pub fn host_ipv4() -> Option<IpAddr> {
    let addrs = nix::ifaddrs::getifaddrs().ok()?;
    addrs
        .filter_map(|a| a.address?.as_sockaddr_in().map(|s| IpAddr::V4(s.ip())))
        .find(|ip| !ip.is_loopback())
}

/// Settings of [`InProcessNode::start`].
#[derive(Clone)]
pub struct NodeHarnessOptions {
    /// The node name.
    pub node_name: String,
    /// Edits the configuration.
    pub configure: Option<Configure>,
    /// Fake runtime settings.
    pub fake: FakeConfig,
    /// Test API server settings.
    pub api: TestApiOptions,
    /// Replaced parts of the node role.
    pub overrides: NodeOverrides,
    /// Nodes created in the API server before the node role starts.
    pub existing_nodes: Vec<Node>,
    /// Runs against the API server before the node role starts (e.g. to
    /// set failure knobs).
    pub before_start: Option<BeforeStart>,
}

impl Default for NodeHarnessOptions {
    fn default() -> Self {
        NodeHarnessOptions {
            node_name: format!("node-{}", crate::netns::unique_suffix()),
            configure: None,
            fake: FakeConfig::default(),
            api: TestApiOptions::default(),
            overrides: NodeOverrides::default(),
            existing_nodes: Vec::new(),
            before_start: None,
        }
    }
}

impl std::fmt::Debug for NodeHarnessOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeHarnessOptions")
            .field("node_name", &self.node_name)
            .finish_non_exhaustive()
    }
}

/// The node role running in-process against a test API server and a fake runtime.
pub struct InProcessNode {
    /// The test API server.
    pub api: TestApiServer,
    /// The fake CRI runtime.
    pub fake: FakeRuntime,
    /// An API client with no particular identity (for the test's own reads).
    pub admin: kube::Client,
    /// The node name.
    pub node_name: String,
    /// The effective configuration.
    pub config: Arc<Config>,
    ctx: RoleContext,
    dir: tempfile::TempDir,
    task: Option<JoinHandle<Result<(), NodeError>>>,
}

impl std::fmt::Debug for InProcessNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InProcessNode")
            .field("node_name", &self.node_name)
            .finish_non_exhaustive()
    }
}

impl InProcessNode {
    /// Starts the API server, the fake runtime and the node role.
    pub async fn start(opts: NodeHarnessOptions) -> Result<InProcessNode, NodeHarnessError> {
        let dir = tempdir("keelson-node-")?;
        let api = TestApiServer::start(opts.api.clone())
            .await
            .map_err(|e| setup("starting the test API server")(e.to_string()))?;
        let fake = FakeRuntime::start_with(dir.path().join("cri.sock"), opts.fake.clone())
            .await
            .map_err(|e| setup("starting the fake runtime")(e.to_string()))?;
        let mut config = Config {
            node_name: Some(opts.node_name.clone()),
            healthz_bind_address: Some(String::new()),
            metrics_bind_address: String::new(),
            ..Config::default()
        };
        config.proxy.enabled = false;
        config.node.container_runtime_endpoint = fake.endpoint();
        config.node.root_dir = dir.path().join("root");
        config.node.pod_logs_dir = dir.path().join("pod-logs");
        config.node.node_ip = host_ipv4();
        config.node.kubeconfig = Some(api.kubeconfig_path().to_path_buf());
        // The node API on the node IP and a free port, trusting the test
        // API server's kubelet client certificate.
        if let Some(ip) = config.node.node_ip {
            config.node.address = ip.to_string();
        }
        config.node.port = i32::from(free_host_port()?);
        config.node.authentication.x509.client_ca_file =
            Some(write_client_ca(dir.path(), api.kubelet_client_ca_pem())?);
        ignore_host_disk(&mut config);
        if let Some(f) = &opts.configure {
            f(&mut config);
        }
        config
            .validate()
            .map_err(|e| setup("validating the configuration")(format!("{e:?}")))?;
        let config = Arc::new(config);
        let admin = api
            .try_client()
            .await
            .map_err(|e| setup("building the admin API client")(e.to_string()))?;
        for n in &opts.existing_nodes {
            Api::<Node>::all(admin.clone())
                .create(&kube::api::PostParams::default(), n)
                .await
                .map_err(|e| setup("creating an existing Node")(e.to_string()))?;
        }
        if let Some(f) = &opts.before_start {
            f(&api);
        }
        let registry = keelson::observability::metrics::new_registry();
        let health = keelson::observability::Health::new();
        let shutdown = CancellationToken::new();
        let introspection = keelson::introspection::Introspection::new(&opts.node_name);
        // The node's client is built as `keelson run` builds it: with
        // certificate bootstrap and rotation when the configuration asks.
        let node_client = keelson::certificates::node::start(
            &config.node,
            &opts.node_name,
            &health,
            &registry,
            shutdown.clone(),
            Some(introspection.api_log()),
        )
        .await
        .map_err(|e| setup("building the node's API client")(e.to_string()))?;
        let client = node_client.client.clone();
        let ctx = RoleContext {
            config: config.clone(),
            node_name: opts.node_name.clone(),
            client,
            registry,
            health,
            introspection,
            shutdown,
        };
        let role_ctx = ctx.clone();
        let mut overrides = opts.overrides.clone();
        if overrides.pods_cgroups.is_none() {
            // Pod cgroups go to a fake cgroup v2 tree, never the host's.
            let tree = dir.path().join("cgroup");
            std::fs::create_dir_all(&tree)
                .map_err(|e| setup("creating a fake cgroup tree")(e.to_string()))?;
            std::fs::write(tree.join("cgroup.controllers"), "cpuset cpu io memory pids")
                .map_err(|e| setup("creating a fake cgroup tree")(e.to_string()))?;
            overrides.pods_cgroups = Some(Arc::new(keelson::node::cgroups::v2::V2::new(tree)));
        }
        if overrides.systemd_bus.is_none() {
            // The systemd cgroup driver never reaches the host's systemd:
            // without a test's own bus it gets one where nobody listens.
            overrides.systemd_bus = Some(format!(
                "unix:path={}",
                dir.path().join("no-systemd-bus").display()
            ));
        }
        if overrides.logind_bus.is_none() {
            // Graceful node shutdown never reaches the host's logind either.
            overrides.logind_bus = Some(format!(
                "unix:path={}",
                dir.path().join("no-logind-bus").display()
            ));
        }
        if overrides.logind_conf_dir.is_none() {
            overrides.logind_conf_dir = Some(dir.path().join("logind.conf.d"));
        }
        let task = tokio::spawn(async move {
            // A bootstrapping node starts once it has its certificate.
            if !node_client.ready(&role_ctx.shutdown).await {
                return Ok(());
            }
            keelson::node::run_with(role_ctx.node_context(), overrides).await
        });
        Ok(InProcessNode {
            api,
            fake,
            admin,
            node_name: opts.node_name,
            config,
            ctx,
            dir,
            task: Some(task),
        })
    }

    /// The temp dir holding the root dir, pod logs and the runtime socket.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The node's health checks (what `/healthz` answers).
    pub fn health(&self) -> &keelson::observability::Health {
        &self.ctx.health
    }

    /// The Prometheus text of the node's metrics registry.
    pub fn metrics_text(&self) -> String {
        keelson::observability::metrics::render(&self.ctx.registry)
    }

    /// The Node as the API server has it.
    pub async fn node(&self) -> Result<Option<Node>, String> {
        Api::<Node>::all(self.admin.clone())
            .get_opt(&self.node_name)
            .await
            .map_err(|e| e.to_string())
    }

    /// The node's Lease as the API server has it.
    pub async fn lease(&self) -> Result<Option<Lease>, String> {
        Api::<Lease>::namespaced(self.admin.clone(), "kube-node-lease")
            .get_opt(&self.node_name)
            .await
            .map_err(|e| e.to_string())
    }

    /// Waits until `check` accepts the Node (polling every 50 ms).
    pub async fn wait_node<T, F>(
        &self,
        what: &str,
        timeout: Duration,
        check: F,
    ) -> Result<T, WaitTimeout>
    where
        F: Fn(&Node) -> Result<T, String>,
    {
        wait_for(what, timeout, Duration::from_millis(50), || async {
            match self.node().await? {
                Some(n) => check(&n),
                None => Err("no Node yet".to_string()),
            }
        })
        .await
    }

    /// Waits until the node role ends on its own and returns how it ended
    /// (`Ok` when it was already stopped).
    pub async fn wait_stopped(&mut self) -> Result<(), String> {
        let Some(task) = self.task.take() else {
            return Ok(());
        };
        match task.await {
            Ok(r) => r.map_err(|e| e.to_string()),
            Err(e) => Err(format!("node task failed: {e}")),
        }
    }

    /// Stops the node role and returns how it ended.
    pub async fn stop(&mut self) -> Result<(), String> {
        self.ctx.shutdown.cancel();
        let Some(task) = self.task.take() else {
            return Ok(());
        };
        match tokio::time::timeout(Duration::from_secs(30), task).await {
            Ok(Ok(r)) => r.map_err(|e| e.to_string()),
            Ok(Err(e)) => Err(format!("node task failed: {e}")),
            Err(_) => Err("node role did not stop within 30s".to_string()),
        }
    }
}

impl Drop for InProcessNode {
    fn drop(&mut self) {
        self.ctx.shutdown.cancel();
        if let Some(t) = self.task.take() {
            t.abort();
        }
    }
}

/// The condition of `type_` in a Node.
pub fn condition<'a>(
    node: &'a Node,
    type_: &str,
) -> Option<&'a k8s_openapi::api::core::v1::NodeCondition> {
    node.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_)
}

/// Path of the `keelson` binary: `$KEELSON_BIN`, else next to the test
/// binary's `deps/` directory (where `cargo build --workspace` puts it).
pub fn keelson_bin() -> Result<PathBuf, NodeHarnessError> {
    if let Ok(p) = std::env::var("KEELSON_BIN") {
        return Ok(PathBuf::from(p));
    }
    let exe =
        std::env::current_exe().map_err(|e| setup("locating the test binary")(e.to_string()))?;
    let candidates = exe
        .ancestors()
        .skip(1)
        .take(3)
        .map(|d| d.join("keelson"))
        .collect::<Vec<_>>();
    candidates
        .iter()
        .find(|p| p.is_file())
        .cloned()
        .ok_or_else(|| {
            setup("locating the keelson binary")(format!(
                "not found in {candidates:?}; build it with `cargo build -p keelson` or set KEELSON_BIN"
            ))
        })
}

/// Settings of [`BinaryNode::start`].
#[derive(Clone)]
pub struct BinaryNodeOptions {
    /// The node name.
    pub node_name: String,
    /// Edits the configuration.
    pub configure: Option<Configure>,
    /// `RUST_LOG` for the binary.
    pub log_filter: String,
    /// Run keelson inside a private systemd's namespaces with the
    /// `systemd` cgroup driver and cgroup root `/` (the containerd harness
    /// must run there too); see [`crate::private_systemd`].
    pub systemd: Option<SystemdEntry>,
    /// Give the kubeconfig on the command line (`--kubeconfig`) instead of
    /// in the configuration file, as a kubeadm node's unit does.
    pub kubeconfig_flag: bool,
}

impl Default for BinaryNodeOptions {
    fn default() -> Self {
        BinaryNodeOptions {
            node_name: format!("sysnode-{}", crate::netns::unique_suffix()),
            configure: None,
            log_filter: "info,keelson=debug".to_string(),
            systemd: None,
            kubeconfig_flag: false,
        }
    }
}

impl std::fmt::Debug for BinaryNodeOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BinaryNodeOptions")
            .field("node_name", &self.node_name)
            .finish_non_exhaustive()
    }
}

/// A free TCP port on the host (bound and released).
pub fn free_host_port() -> Result<u16, NodeHarnessError> {
    std::net::TcpListener::bind("0.0.0.0:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| setup("finding a free port")(e.to_string()))
}

/// Writes the test API server's kubelet client CA for `clientCAFile`.
pub fn write_client_ca(dir: &Path, pem: &str) -> Result<PathBuf, NodeHarnessError> {
    let p = dir.join("kubelet-client-ca.crt");
    std::fs::write(&p, pem).map_err(|e| setup("writing the client CA")(e.to_string()))?;
    Ok(p)
}

/// The address keelson's node IP gets inside the containerd namespace
/// (TEST-NET-1, on the namespace's loopback device).
pub const SYSTEM_NODE_IP: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 10);

/// The real `keelson` binary running the node role inside a containerd
/// harness's network namespace. Stopped (SIGTERM, then SIGKILL) on drop.
pub struct BinaryNode {
    /// The node name.
    pub node_name: String,
    /// The effective configuration.
    pub config: Config,
    /// Where `/metrics` is served, inside the namespace.
    pub metrics_addr: SocketAddr,
    /// Where `/healthz` is served, inside the namespace.
    pub healthz_addr: SocketAddr,
    child: Option<Child>,
    /// The child is `nsenter`, which forked keelson into a PID namespace.
    forked: bool,
    log_path: PathBuf,
    netns_name: String,
    dir: tempfile::TempDir,
    /// How keelson was started, for [`BinaryNode::restart`] (`None` when
    /// it runs under a private systemd).
    relaunch: Option<(PathBuf, String)>,
}

impl std::fmt::Debug for BinaryNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BinaryNode")
            .field("node_name", &self.node_name)
            .field("log", &self.log_path)
            .finish_non_exhaustive()
    }
}

fn free_port(ctrd: &Containerd) -> Result<u16, NodeHarnessError> {
    let l = ctrd
        .netns()
        .tcp_listener(SocketAddr::from(([127, 0, 0, 1], 0)))
        .map_err(|e| setup("finding a free port in the namespace")(e.to_string()))?;
    let port = l
        .local_addr()
        .map_err(|e| setup("finding a free port in the namespace")(e.to_string()))?
        .port();
    Ok(port)
}

impl BinaryNode {
    /// Serves `api` inside `ctrd`'s namespace and starts `keelson run` there.
    pub fn start(
        ctrd: &Containerd,
        api: &TestApiServer,
        opts: BinaryNodeOptions,
    ) -> Result<BinaryNode, NodeHarnessError> {
        let dir = tempdir("keelson-sysnode-")?;
        let listener = ctrd
            .netns()
            .tcp_listener(SocketAddr::from(([127, 0, 0, 1], 0)))
            .map_err(|e| setup("listening in the namespace")(e.to_string()))?;
        let api_addr = listener
            .local_addr()
            .map_err(|e| setup("listening in the namespace")(e.to_string()))?;
        api.serve_listener(listener);
        // The node IP lives on the namespace's loopback device.
        let cidr = format!("{SYSTEM_NODE_IP}/32");
        let have = ctrd
            .netns()
            .ip(&["-4", "addr", "show", "dev", "lo"])
            .map_err(|e| setup("reading the namespace's addresses")(e.to_string()))?;
        if !have.contains(&cidr) {
            ctrd.netns()
                .ip(&["addr", "add", &cidr, "dev", "lo"])
                .map_err(|e| setup("adding the node IP in the namespace")(e.to_string()))?;
        }
        let kubeconfig = dir.path().join("kubeconfig");
        std::fs::write(
            &kubeconfig,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster:\n    server: http://{api_addr}\ncontexts:\n- name: test\n  context:\n    cluster: test\n    user: node\ncurrent-context: test\nusers:\n- name: node\n  user:\n    token: {}\n",
                crate::testapi::UNAUTHENTICATED_TOKEN
            ),
        )
        .map_err(|e| setup("writing the kubeconfig")(e.to_string()))?;
        let metrics_port = free_port(ctrd)?;
        let healthz_port = free_port(ctrd)?;
        let mut config = Config {
            node_name: Some(opts.node_name.clone()),
            healthz_bind_address: Some(format!("127.0.0.1:{healthz_port}")),
            metrics_bind_address: format!("127.0.0.1:{metrics_port}"),
            ..Config::default()
        };
        config.proxy.enabled = false;
        config.node.kubeconfig = Some(kubeconfig);
        config.node.container_runtime_endpoint = ctrd.endpoint();
        config.node.root_dir = dir.path().join("root");
        config.node.pod_logs_dir = dir.path().join("pod-logs");
        config.node.cgroup_root = ctrd.cgroup_parent();
        config.node.node_ip = Some(IpAddr::V4(SYSTEM_NODE_IP));
        config.node.pod_cidr = ctrd.pod_cidr().to_string();
        config.node.authentication.x509.client_ca_file =
            Some(write_client_ca(dir.path(), api.kubelet_client_ca_pem())?);
        // The API server reaches the node API inside the namespace.
        let ns_name = ctrd.netns().name().to_string();
        api.set_node_dialer(std::sync::Arc::new(move |addr| {
            let ns = ns_name.clone();
            Box::pin(async move {
                tokio::task::spawn_blocking(move || {
                    crate::netns::connect_in(&ns, addr, Duration::from_secs(5))
                })
                .await
                .map_err(std::io::Error::other)?
            })
        }));
        ignore_host_disk(&mut config);
        if opts.systemd.is_some() {
            config.node.cgroup_driver = keelson::config::CgroupDriver::Systemd;
            config.node.cgroup_root = "/".to_string();
        }
        if let Some(f) = &opts.configure {
            f(&mut config);
        }
        config
            .validate()
            .map_err(|e| setup("validating the configuration")(format!("{e:?}")))?;
        let config_path = dir.path().join("config.yaml");
        let mut file = config.clone();
        let kubeconfig_flag = if opts.kubeconfig_flag {
            file.node.kubeconfig.take()
        } else {
            None
        };
        std::fs::write(&config_path, file.to_yaml())
            .map_err(|e| setup("writing the configuration")(e.to_string()))?;
        let log_path = dir.path().join("keelson.log");
        let log = std::fs::File::create(&log_path)
            .map_err(|e| setup("creating the log file")(e.to_string()))?;
        let log2 = log
            .try_clone()
            .map_err(|e| setup("creating the log file")(e.to_string()))?;
        let bin = keelson_bin()?;
        let mut command = match &opts.systemd {
            Some(entry) => entry.command(&ctrd.netns().path(), &bin.display().to_string()),
            None => ctrd.netns().command(&bin.display().to_string()),
        };
        let child = command
            .arg("run")
            .arg("--config")
            .arg(&config_path)
            .args(
                kubeconfig_flag
                    .iter()
                    .flat_map(|k| [std::ffi::OsStr::new("--kubeconfig"), k.as_os_str()]),
            )
            .env("RUST_LOG", &opts.log_filter)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log2)
            .spawn()
            .map_err(|e| setup("starting keelson")(e.to_string()))?;
        Ok(BinaryNode {
            node_name: opts.node_name,
            config,
            metrics_addr: SocketAddr::from(([127, 0, 0, 1], metrics_port)),
            healthz_addr: SocketAddr::from(([127, 0, 0, 1], healthz_port)),
            child: Some(child),
            forked: opts.systemd.is_some(),
            log_path,
            netns_name: ctrd.netns().name().to_string(),
            dir,
            relaunch: opts
                .systemd
                .is_none()
                .then(|| (config_path.clone(), opts.log_filter.clone())),
        })
    }

    /// Stops keelson (SIGTERM, up to `grace`) and starts it again on the
    /// same configuration and root dir, in the same namespace; the log
    /// goes on in the same file. Not for nodes under a private systemd.
    pub fn restart(&mut self, grace: Duration) -> Result<(), NodeHarnessError> {
        let Some((config_path, filter)) = self.relaunch.clone() else {
            return Err(setup("restarting keelson")(
                "not supported under a private systemd".to_string(),
            ));
        };
        self.stop(grace);
        let log = std::fs::OpenOptions::new()
            .append(true)
            .open(&self.log_path)
            .map_err(|e| setup("opening the log file")(e.to_string()))?;
        let log2 = log
            .try_clone()
            .map_err(|e| setup("opening the log file")(e.to_string()))?;
        let bin = keelson_bin()?;
        // As `NetNs::command` (the namespace is the containerd harness's).
        let child = std::process::Command::new("nsenter")
            .arg(format!("--net=/run/netns/{}", self.netns_name))
            .arg("--")
            .arg(&bin)
            .arg("run")
            .arg("--config")
            .arg(&config_path)
            .env("RUST_LOG", &filter)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log2)
            .spawn()
            .map_err(|e| setup("starting keelson")(e.to_string()))?;
        self.child = Some(child);
        Ok(())
    }

    /// The temp dir (config, kubeconfig, log, root dir).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The last `lines` lines of keelson's log.
    pub fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.log_path).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// The keelson process's pid (`nsenter --net` execs keelson in place,
    /// so the child's pid is keelson's; `nsenter --pid` forks it, so it is
    /// the child's child); `None` once it was stopped.
    pub fn pid(&self) -> Option<i32> {
        let child = self.child.as_ref()?;
        if self.forked {
            crate::private_systemd::child_pid(child.id())
        } else {
            i32::try_from(child.id()).ok()
        }
    }

    /// The pid of the running keelson process, or why there is none
    /// (with the end of its log).
    pub fn live_pid(&mut self) -> Result<i32, String> {
        match (self.running(), self.pid()) {
            (true, Some(pid)) => Ok(pid),
            _ => Err(format!(
                "keelson is not running; its log ends with:\n{}",
                self.log_tail(30)
            )),
        }
    }

    /// Whether the process is still running.
    pub fn running(&mut self) -> bool {
        match self.child.as_mut() {
            Some(c) => matches!(c.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// GET `/metrics` (from inside the namespace).
    pub async fn metrics(&self, ctrd: &Containerd) -> Result<String, String> {
        self.http_get(ctrd, self.metrics_addr, "/metrics").await
    }

    /// The health server's answer to `path` (e.g. `/healthz?verbose`),
    /// status line and headers included.
    pub async fn health(&self, ctrd: &Containerd, path: &str) -> Result<String, String> {
        self.http_get(ctrd, self.healthz_addr, path).await
    }

    /// Waits until `/healthz` answers 200 and returns keelson's pid; fails
    /// with the end of keelson's log when it exits or stays unhealthy.
    pub async fn wait_healthy(
        &mut self,
        ctrd: &Containerd,
        timeout: Duration,
    ) -> Result<i32, String> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            if !self.running() {
                return Err(format!(
                    "keelson is not running; its log ends with:\n{}",
                    self.log_tail(30)
                ));
            }
            // `None` for a moment after an `nsenter --pid` start, before
            // it forked keelson.
            if let Some(pid) = self.pid()
                && let Ok(answer) = self.health(ctrd, "/healthz").await
                && answer.split_whitespace().nth(1) == Some("200")
            {
                return Ok(pid);
            }
            if std::time::Instant::now() > deadline {
                return Err(format!(
                    "keelson not healthy after {timeout:?}; its log ends with:\n{}",
                    self.log_tail(30)
                ));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    async fn http_get(
        &self,
        ctrd: &Containerd,
        addr: SocketAddr,
        path: &str,
    ) -> Result<String, String> {
        let mut conn = ctrd
            .netns()
            .tcp_connect(addr, Duration::from_secs(2))
            .map_err(|e| e.to_string())?;
        conn.write_all(format!("GET {path} HTTP/1.0\r\nHost: keelson\r\n\r\n").as_bytes())
            .await
            .map_err(|e| e.to_string())?;
        let mut body = String::new();
        tokio::time::timeout(Duration::from_secs(5), conn.read_to_string(&mut body))
            .await
            .map_err(|_| "read timed out".to_string())?
            .map_err(|e| e.to_string())?;
        Ok(body)
    }

    /// SIGTERM, wait up to `grace`, then SIGKILL. Returns the exit status text.
    pub fn stop(&mut self, grace: Duration) -> String {
        let target = self.pid();
        let Some(mut child) = self.child.take() else {
            return "not running".to_string();
        };
        // `nsenter` exits with keelson (it waits for its child).
        if let Some(pid) = target {
            let pid = nix::unistd::Pid::from_raw(pid);
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        }
        let deadline = std::time::Instant::now() + grace;
        loop {
            match child.try_wait() {
                Ok(Some(status)) => return status.to_string(),
                Ok(None) if std::time::Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(50))
                }
                _ => {
                    if self.forked
                        && let Some(pid) = crate::private_systemd::child_pid(child.id())
                    {
                        let _ = nix::sys::signal::kill(
                            nix::unistd::Pid::from_raw(pid),
                            nix::sys::signal::Signal::SIGKILL,
                        );
                    }
                    let _ = child.kill();
                    return child
                        .wait()
                        .map(|s| format!("killed: {s}"))
                        .unwrap_or_else(|e| e.to_string());
                }
            }
        }
    }
}

impl Drop for BinaryNode {
    fn drop(&mut self) {
        let status = self.stop(Duration::from_secs(10));
        tracing::debug!(node = %self.node_name, netns = %self.netns_name, %status, "keelson stopped");
        // Volumes of pods still set up when keelson stopped (a root dir
        // given by the test is the test's to clean).
        if let Err(e) = keelson::node::volumes::mounter::detach_all_below(self.dir.path()) {
            tracing::warn!(error = %e, "cannot detach the node's volume mounts");
        }
    }
}
