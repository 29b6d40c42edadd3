//! A node of the upstream cluster: a private containerd (its namespace is
//! the node's), linked to the control plane's namespace, with a node agent
//! and a proxy agent of the test's choosing, keelson or the real
//! kubelet/kube-proxy. Everything the agents write (root dirs, logs,
//! configs, kubeconfigs) lives under the containerd instance's directory,
//! so the containerd harness's cleanup (also of a killed run) covers it.

use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use keelson::config::{Config, ProxyMode};
use kube::Api;

use super::UpstreamError;
use super::control_plane::ControlPlane;
use super::daemon::Daemon;
use super::kubelet;
use super::network::NodeLink;
use crate::containerd::{Containerd, ContainerdOptions};
use crate::node_harness::{ignore_host_disk, keelson_bin};
use crate::support::wait_for;

/// The Service CIDR's DNS address pods are given (no DNS server runs).
pub const CLUSTER_DNS: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);
/// The cluster's DNS domain (`clusterDomain`), the same for every agent.
pub const CLUSTER_DOMAIN: &str = "cluster.local";
/// Every node's pod CIDR lies in this (kube-proxy's `clusterCIDR`).
pub const CLUSTER_CIDR: &str = "10.244.0.0/16";

/// Who runs the node role.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeAgent {
    /// keelson's node role.
    Keelson,
    /// The real kubelet.
    Kubelet,
}

/// Who runs the proxy role.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProxyAgent {
    /// No proxy on this node.
    None,
    /// keelson's proxy role: in the same process as a keelson node role,
    /// or alone (`--proxy-only`) beside a kubelet.
    Keelson,
    /// The real kube-proxy.
    KubeProxy,
}

/// The agents of a whole node: all keelson or all upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Agents {
    /// keelson in both roles, one process, each role with its own identity.
    Keelson,
    /// The real kubelet and kube-proxy.
    Upstream,
}

impl Agents {
    /// Both kinds, keelson first.
    pub const ALL: [Agents; 2] = [Agents::Keelson, Agents::Upstream];

    /// The name used in test names: `keelson` or `kube`.
    pub fn name(self) -> &'static str {
        match self {
            Agents::Keelson => "keelson",
            Agents::Upstream => "kube",
        }
    }

    /// The node and proxy agents.
    pub fn roles(self) -> (NodeAgent, ProxyAgent) {
        match self {
            Agents::Keelson => (NodeAgent::Keelson, ProxyAgent::Keelson),
            Agents::Upstream => (NodeAgent::Kubelet, ProxyAgent::KubeProxy),
        }
    }
}

/// Which files keelson is started with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KeelsonFiles {
    /// A KeelsonConfiguration (`--config`) as a user writes it.
    #[default]
    Keelson,
    /// The very files the real agents get: the node's KubeletConfiguration
    /// (`--kubelet-config`, the same file [`ClusterNode::kubelet_config_path`]
    /// the kubelet of an upstream node reads) and kube-proxy's
    /// KubeProxyConfiguration (`--proxy-config`), with kubelet's
    /// command-line flags (`--kubeconfig`, `--root-dir`, `--node-ip`,
    /// `--hostname-override`).
    Upstream,
}

/// Edits keelson's configuration before start.
pub type EditKeelson = Arc<dyn Fn(&mut Config) + Send + Sync>;
/// Edits a YAML configuration file (KubeletConfiguration, KubeProxyConfiguration).
pub type EditYaml = Arc<dyn Fn(&mut serde_yaml::Mapping) + Send + Sync>;

/// What a node runs.
#[derive(Clone)]
pub struct NodeSpec {
    /// The node role's agent.
    pub node: NodeAgent,
    /// The proxy role's agent.
    pub proxy: ProxyAgent,
    /// The data plane: `nftables` (default) or `iptables` (kube-proxy),
    /// `ebpf` (keelson).
    pub proxy_mode: String,
    /// Which files keelson reads.
    pub keelson_files: KeelsonFiles,
    /// Edits keelson's configuration.
    pub keelson: Option<EditKeelson>,
    /// Edits the KubeletConfiguration.
    pub kubelet: Option<EditYaml>,
    /// Edits the KubeProxyConfiguration.
    pub kube_proxy: Option<EditYaml>,
    /// More kubelet flags (`--cloud-provider=external`), given to kubelet
    /// and, under the same names, to keelson started from the upstream
    /// files ([`KeelsonFiles::Upstream`]).
    pub kubelet_flags: Vec<String>,
    /// Production log levels (keelson `warn`, kubelet and kube-proxy
    /// `--v=0`) instead of the tests' verbose ones: for benchmarks.
    pub quiet: bool,
    /// The node's containerd (its `pod_cidr` is the one the control plane
    /// routes to the node, whatever is set here).
    pub runtime: ContainerdOptions,
    /// Environment of the node agent, keelson or kubelet (e.g.
    /// `DBUS_SYSTEM_BUS_ADDRESS` of a test's private bus).
    pub agent_env: Vec<(String, String)>,
}

impl NodeSpec {
    /// Both roles by `agents`, nftables.
    pub fn of(agents: Agents) -> NodeSpec {
        let (node, proxy) = agents.roles();
        NodeSpec {
            node,
            proxy,
            proxy_mode: "nftables".to_string(),
            keelson_files: KeelsonFiles::Keelson,
            keelson: None,
            kubelet: None,
            kube_proxy: None,
            kubelet_flags: Vec::new(),
            quiet: false,
            runtime: ContainerdOptions::default(),
            agent_env: Vec::new(),
        }
    }
}

impl std::fmt::Debug for NodeSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeSpec")
            .field("node", &self.node)
            .field("proxy", &self.proxy)
            .field("proxy_mode", &self.proxy_mode)
            .finish_non_exhaustive()
    }
}

/// A running node.
pub struct ClusterNode {
    /// The node's name.
    pub name: String,
    /// Its IP (InternalIP), on the link to the control plane.
    pub ip: Ipv4Addr,
    /// What it runs.
    pub spec: NodeSpec,
    dir: PathBuf,
    node_agent: Mutex<Option<Daemon>>,
    proxy_agent: Mutex<Option<Daemon>>,
    link: NodeLink,
    cp: Arc<ControlPlane>,
    // Dropped last: stops containerd and removes its namespace, cgroups,
    // mounts and directory (the agents' files included).
    ctrd: Containerd,
}

impl std::fmt::Debug for ClusterNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterNode")
            .field("name", &self.name)
            .field("ip", &self.ip)
            .field("spec", &self.spec)
            .finish_non_exhaustive()
    }
}

impl ClusterNode {
    /// Starts containerd, links it to the control plane and starts the agents.
    pub async fn start(
        cp: &Arc<ControlPlane>,
        name: &str,
        spec: NodeSpec,
    ) -> Result<ClusterNode, UpstreamError> {
        let (index, pod_cidr) = cp.net().reserve()?;
        let ctrd = match Containerd::start_with(ContainerdOptions {
            pod_cidr: pod_cidr.clone(),
            ..spec.runtime.clone()
        })
        .await
        {
            Ok(c) => c,
            Err(e) => {
                cp.net().release(index);
                return Err(UpstreamError::Setup {
                    context: "starting containerd".into(),
                    message: e.to_string(),
                });
            }
        };
        let link = match cp.net().attach(ctrd.netns(), index, &pod_cidr) {
            Ok(l) => l,
            Err(e) => {
                cp.net().release(index);
                return Err(e);
            }
        };
        let dir = ctrd.dir().join("agents");
        let node = ClusterNode {
            name: name.to_string(),
            ip: link.node_ip,
            spec: spec.clone(),
            dir: dir.clone(),
            node_agent: Mutex::new(None),
            proxy_agent: Mutex::new(None),
            link,
            cp: cp.clone(),
            ctrd,
        };
        std::fs::create_dir_all(&dir).map_err(UpstreamError::io("creating the agents' dir"))?;
        node.start_agents()?;
        Ok(node)
    }

    fn start_agents(&self) -> Result<(), UpstreamError> {
        let spec = self.spec.clone();
        let keelson_proxy_in_node =
            spec.node == NodeAgent::Keelson && spec.proxy == ProxyAgent::Keelson;
        *lock(&self.node_agent) = Some(self.spawn_node_agent()?);
        match spec.proxy {
            ProxyAgent::None => {}
            ProxyAgent::Keelson if keelson_proxy_in_node => {}
            ProxyAgent::Keelson => {
                let cfg = self.keelson_config(false, true)?;
                *lock(&self.proxy_agent) =
                    Some(self.spawn_keelson("keelson-proxy", &cfg, &["--proxy-only"])?);
            }
            ProxyAgent::KubeProxy => {
                *lock(&self.proxy_agent) = Some(self.spawn_kube_proxy()?);
            }
        }
        Ok(())
    }

    /// keelson's configuration for this node: as a user would write it,
    /// with the node's own kubeconfigs (node identity, kube-proxy identity).
    fn keelson_config(&self, node_role: bool, proxy_role: bool) -> Result<Config, UpstreamError> {
        let mut cfg = Config {
            node_name: Some(self.name.clone()),
            ..Config::default()
        };
        cfg.node.enabled = node_role;
        cfg.proxy.enabled = proxy_role;
        if node_role {
            let kc = self.dir.join("node.kubeconfig");
            self.cp.write_node_kubeconfig(&kc, &self.name)?;
            cfg.node.kubeconfig = Some(kc);
            cfg.node.container_runtime_endpoint = self.ctrd.endpoint();
            cfg.node.root_dir = self.dir.join("keelson-root");
            cfg.node.pod_logs_dir = self.dir.join("pod-logs");
            cfg.node.cgroup_root = self.ctrd.cgroup_parent();
            cfg.node.node_ip = Some(IpAddr::V4(self.ip));
            cfg.node.cluster_dns = vec![IpAddr::V4(CLUSTER_DNS)];
            cfg.node.cluster_domain = CLUSTER_DOMAIN.to_string();
            // The node API as the kubelet of this cluster has it: a serving
            // certificate the API server checks (--kubelet-certificate-authority)
            // and the cluster CA for its kubelet client certificate.
            let serving = self.cp.serving_cert(&self.name, IpAddr::V4(self.ip))?;
            let pki = self.dir.join("keelson-pki");
            std::fs::create_dir_all(&pki).map_err(UpstreamError::io("creating keelson pki"))?;
            let (crt, key) = serving.write(&pki, "kubelet")?;
            cfg.node.tls_cert_file = Some(crt);
            cfg.node.tls_private_key_file = Some(key);
            cfg.node.authentication.x509.client_ca_file = Some(self.cp.ca_file());
            ignore_host_disk(&mut cfg);
        }
        if proxy_role {
            let kc = self.dir.join("proxy.kubeconfig");
            self.cp.write_proxy_kubeconfig(&kc)?;
            cfg.proxy.client_connection.kubeconfig = Some(kc);
            cfg.proxy.cluster_cidr = CLUSTER_CIDR.to_string();
            cfg.proxy.mode = match self.spec.proxy_mode.as_str() {
                "ebpf" => ProxyMode::Ebpf,
                _ => ProxyMode::Nftables,
            };
        }
        if let Some(edit) = &self.spec.keelson {
            edit(&mut cfg);
        }
        cfg.validate().map_err(|e| UpstreamError::Setup {
            context: "keelson's configuration".into(),
            message: format!("{e:?}"),
        })?;
        Ok(cfg)
    }

    fn spawn_keelson(
        &self,
        name: &str,
        cfg: &Config,
        extra: &[&str],
    ) -> Result<Daemon, UpstreamError> {
        let path = self.dir.join(format!("{name}.yaml"));
        std::fs::write(&path, cfg.to_yaml())
            .map_err(UpstreamError::io("writing keelson's config"))?;
        let bin = keelson_bin().map_err(|e| UpstreamError::Setup {
            context: "finding keelson".into(),
            message: e.to_string(),
        })?;
        let mut cmd = self.ctrd.netns().command(&bin.display().to_string());
        cmd.arg("run").arg("--config").arg(&path).args(extra).env(
            "RUST_LOG",
            if self.spec.quiet {
                "warn"
            } else {
                "info,keelson=debug"
            },
        );
        cmd.envs(self.spec.agent_env.iter().map(|(k, v)| (k, v)));
        Daemon::spawn(name, cmd, &self.dir.join(format!("{name}.log")))
    }

    /// The KubeletConfiguration this node's kubelet runs with.
    pub fn kubelet_config_path(&self) -> PathBuf {
        self.dir.join("kubelet-config.yaml")
    }

    /// Writes the node's KubeletConfiguration (with the spec's edits), its
    /// serving certificate and node kubeconfig; returns (config, kubeconfig).
    fn write_kubelet_files(&self) -> Result<(PathBuf, PathBuf), UpstreamError> {
        let serving = self.cp.serving_cert(&self.name, IpAddr::V4(self.ip))?;
        let pki = self.dir.join("kubelet-pki");
        std::fs::create_dir_all(&pki).map_err(UpstreamError::io("creating kubelet pki"))?;
        let (crt, key) = serving.write(&pki, "kubelet")?;
        let kc = self.kubelet_kubeconfig_path();
        self.cp.write_node_kubeconfig(&kc, &self.name)?;
        let mut config = kubelet::config(&kubelet::ConfigInputs {
            runtime_endpoint: &self.ctrd.endpoint(),
            cgroup_root: &self.ctrd.cgroup_parent(),
            client_ca: &self.cp.ca_file(),
            serving_cert: &crt,
            serving_key: &key,
            pod_logs_dir: &self.dir.join("pod-logs"),
            cluster_dns: IpAddr::V4(CLUSTER_DNS),
            cluster_domain: CLUSTER_DOMAIN,
        });
        if let Some(edit) = &self.spec.kubelet {
            edit(&mut config);
        }
        let path = self.kubelet_config_path();
        let text = serde_yaml::to_string(&config).map_err(|e| UpstreamError::Setup {
            context: "rendering the KubeletConfiguration".into(),
            message: e.to_string(),
        })?;
        std::fs::write(&path, text).map_err(UpstreamError::io("writing kubelet's config"))?;
        Ok((path, kc))
    }

    fn spawn_kubelet(&self) -> Result<Daemon, UpstreamError> {
        kubelet::create_cgroup_root(&self.ctrd.cgroup_parent())?;
        let (path, kc) = self.write_kubelet_files()?;
        self.spawn_kubelet_with(&path, &kc)
    }

    /// kubelet on files already written (its root dir is always
    /// `kubelet-root`, its certificates `kubelet-pki`).
    fn spawn_kubelet_with(
        &self,
        config: &Path,
        kubeconfig: &Path,
    ) -> Result<Daemon, UpstreamError> {
        let socket = self.ctrd.socket_path();
        let mut cmd = kubelet::command(
            self.ctrd.netns(),
            &self.cp.bins().path("kubelet"),
            &kubelet::Layout {
                dir: &self.dir,
                config,
                kubeconfig,
                node_name: &self.name,
                node_ip: IpAddr::V4(self.ip),
                verbosity: if self.spec.quiet { 0 } else { 2 },
                containerd_socket: &socket,
                extra: &self.spec.kubelet_flags,
            },
        )?;
        cmd.envs(self.spec.agent_env.iter().map(|(k, v)| (k, v)));
        Daemon::spawn("kubelet", cmd, &self.dir.join("kubelet.log"))
    }

    /// The node agent's device plugin directory: keelson's
    /// `<rootDir>/device-plugins`; kubelet v1.36 always uses
    /// `/var/lib/kubelet/device-plugins` (`pluginapi.KubeletSocket`,
    /// whatever `--root-dir`), which its mount namespace shares with the host.
    pub fn device_plugins_dir(&self) -> PathBuf {
        match self.spec.node {
            NodeAgent::Kubelet => PathBuf::from("/var/lib/kubelet/device-plugins"),
            _ => self.dir.join("keelson-root").join("device-plugins"),
        }
    }

    /// The node agent's root dir: kubelet's `--root-dir`, or keelson's
    /// `node.rootDir`.
    pub fn node_root_dir(&self) -> PathBuf {
        match self.spec.node {
            NodeAgent::Kubelet => self.kubelet_root_dir(),
            _ => self.dir.join("keelson-root"),
        }
    }

    /// kubelet's root dir on this node (`--root-dir` of [`kubelet::command`]).
    pub fn kubelet_root_dir(&self) -> PathBuf {
        kubelet::root_dir(&self.dir)
    }

    /// The node kubeconfig kubelet runs with (`--kubeconfig`).
    fn kubelet_kubeconfig_path(&self) -> PathBuf {
        self.dir.join("kubelet.kubeconfig")
    }

    /// Writes kube-proxy's configuration file (with the spec's edits) and
    /// its kubeconfig; returns the file.
    fn write_kube_proxy_files(&self) -> Result<PathBuf, UpstreamError> {
        let kc = self.dir.join("kube-proxy.kubeconfig");
        self.cp.write_proxy_kubeconfig(&kc)?;
        let mut config = kube_proxy_config(&kc, &self.name, &self.spec.proxy_mode);
        if let Some(edit) = &self.spec.kube_proxy {
            edit(&mut config);
        }
        let path = self.dir.join("kube-proxy-config.yaml");
        let text = serde_yaml::to_string(&config).map_err(|e| UpstreamError::Setup {
            context: "rendering the KubeProxyConfiguration".into(),
            message: e.to_string(),
        })?;
        std::fs::write(&path, text).map_err(UpstreamError::io("writing kube-proxy's config"))?;
        Ok(path)
    }

    /// keelson with kubelet's command line: the KubeletConfiguration the
    /// kubelet of this node would read, kube-proxy's file when the proxy
    /// role runs in the same process, and kubelet's flags.
    fn spawn_keelson_from_upstream_files(&self, proxy_role: bool) -> Result<Daemon, UpstreamError> {
        let (config, kc) = self.write_kubelet_files()?;
        self.spawn_keelson_with_kubelet_files(
            &config,
            &kc,
            &self.dir.join("keelson-root"),
            proxy_role,
        )
    }

    /// `keelson run --kubelet-config <config> --kubeconfig <kubeconfig>
    /// --root-dir <root_dir> --node-ip ... --hostname-override ...`, with
    /// kube-proxy's file (`proxy_role`) or `--node-only`.
    fn spawn_keelson_with_kubelet_files(
        &self,
        config: &Path,
        kc: &Path,
        root_dir: &Path,
        proxy_role: bool,
    ) -> Result<Daemon, UpstreamError> {
        let bin = keelson_bin().map_err(|e| UpstreamError::Setup {
            context: "finding keelson".into(),
            message: e.to_string(),
        })?;
        let mut cmd = self.ctrd.netns().command(&bin.display().to_string());
        cmd.arg("run")
            .arg(format!("--kubelet-config={}", config.display()))
            .arg(format!("--kubeconfig={}", kc.display()))
            .arg(format!("--root-dir={}", root_dir.display()))
            .arg(format!("--node-ip={}", self.ip))
            .arg(format!("--hostname-override={}", self.name))
            .args(&self.spec.kubelet_flags);
        if proxy_role {
            cmd.arg(format!(
                "--proxy-config={}",
                self.write_kube_proxy_files()?.display()
            ));
        } else {
            cmd.arg("--node-only");
        }
        cmd.env("RUST_LOG", "info,keelson=debug");
        cmd.envs(self.spec.agent_env.iter().map(|(k, v)| (k, v)));
        Daemon::spawn("keelson", cmd, &self.dir.join("keelson.log"))
    }

    fn spawn_kube_proxy(&self) -> Result<Daemon, UpstreamError> {
        let path = self.write_kube_proxy_files()?;
        let mut cmd = self
            .ctrd
            .netns()
            .command(&self.cp.bins().path("kube-proxy").display().to_string());
        cmd.arg(format!("--config={}", path.display())).arg("--v=2");
        Daemon::spawn("kube-proxy", cmd, &self.dir.join("kube-proxy.log"))
    }

    /// The node's containerd (its namespace is the node's network).
    pub fn containerd(&self) -> &Containerd {
        &self.ctrd
    }

    /// The directory of the agents' files (configs, kubeconfigs, logs, root dirs).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The pod CIDR routed to this node.
    pub fn pod_cidr(&self) -> &str {
        &self.link.pod_cidr
    }

    /// `Err` with the log tail of an agent that exited.
    pub fn check_running(&self) -> Result<(), UpstreamError> {
        for agent in [&self.node_agent, &self.proxy_agent] {
            if let Some(d) = lock(agent).as_mut() {
                d.check_running()?;
            }
        }
        Ok(())
    }

    /// The last lines of the agents' logs, for a failing test.
    pub fn log_tails(&self, lines: usize) -> String {
        [&self.node_agent, &self.proxy_agent]
            .into_iter()
            .filter_map(|a| {
                lock(a).as_ref().map(|d| {
                    format!(
                        "--- {} ({}) ---\n{}",
                        d.name(),
                        self.name,
                        d.log_tail(lines)
                    )
                })
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// The node agent's log file.
    pub fn node_log(&self) -> Option<PathBuf> {
        lock(&self.node_agent)
            .as_ref()
            .map(|d| d.log_path().to_path_buf())
    }

    /// The proxy agent's log file (the node agent's when keelson runs both).
    pub fn proxy_log(&self) -> Option<PathBuf> {
        lock(&self.proxy_agent)
            .as_ref()
            .map(|d| d.log_path().to_path_buf())
            .or_else(|| self.node_log())
    }

    /// Waits until the Node is Ready in the API.
    pub async fn wait_ready(&self, client: &kube::Client) -> Result<Node, UpstreamError> {
        let nodes: Api<Node> = Api::all(client.clone());
        wait_for(
            &format!("node {} Ready", self.name),
            Duration::from_secs(120),
            Duration::from_millis(250),
            || {
                let nodes = nodes.clone();
                let name = self.name.clone();
                async move {
                    let n = nodes
                        .get_opt(&name)
                        .await
                        .map_err(|e| e.to_string())?
                        .ok_or("not registered")?;
                    let ready = n
                        .status
                        .as_ref()
                        .and_then(|s| s.conditions.as_ref())
                        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
                        .map(|c| format!("{} {:?}", c.status, c.message))
                        .unwrap_or_else(|| "no Ready condition".into());
                    if ready.starts_with("True") {
                        Ok(n)
                    } else {
                        Err(ready)
                    }
                }
            },
        )
        .await
        .map_err(|e| UpstreamError::Setup {
            context: format!("waiting for node {}", self.name),
            message: format!("{e}\n{}", self.log_tails(40)),
        })
    }

    /// The node agent's process id, while it runs (kubelet's or keelson's).
    pub fn node_agent_pid(&self) -> Option<u32> {
        lock(&self.node_agent).as_ref().and_then(Daemon::pid)
    }

    /// Stops the agents and starts others on the same containerd and
    /// network, registering as `name` (e.g. keelson, then kubelet, for a
    /// benchmark on identical ground).
    pub fn replace_agents(&mut self, name: &str, spec: NodeSpec) -> Result<(), UpstreamError> {
        self.stop_agents();
        self.name = name.to_string();
        self.spec = spec;
        self.start_agents()
    }

    /// Stops the node agent alone, as `systemctl stop` does (SIGTERM, grace,
    /// SIGKILL); containerd and the pods' containers stay. Returns how it
    /// ended.
    pub fn stop_node_agent(&self) -> String {
        lock(&self.node_agent)
            .take()
            .map_or_else(|| "not running".to_string(), |mut d| d.stop())
    }

    /// Starts `agent` as the node agent of a node whose kubelet ran before,
    /// on the very files that kubelet was started with (not written again):
    /// kubelet once more, or keelson as `keelson migrate --from-kubelet`
    /// runs it (agent/src/migrate/plan.rs) — kubelet's KubeletConfiguration,
    /// kubelet's kubeconfig (the node's identity) and kubelet's root dir as
    /// overrides, the node's IP and name as kubeadm's flags file gives them,
    /// the proxy role off. Fails while a node agent runs.
    pub fn start_node_agent_on_kubelets_files(
        &self,
        agent: NodeAgent,
    ) -> Result<(), UpstreamError> {
        let mut slot = lock(&self.node_agent);
        if slot.is_some() {
            return Err(UpstreamError::Setup {
                context: format!("starting {agent:?} on node {}", self.name),
                message: "a node agent is still running".into(),
            });
        }
        let config = self.kubelet_config_path();
        let kc = self.kubelet_kubeconfig_path();
        if !config.is_file() || !kc.is_file() {
            return Err(UpstreamError::Setup {
                context: format!("starting {agent:?} on node {}", self.name),
                message: "kubelet's files were never written (no kubelet ran here)".into(),
            });
        }
        *slot = Some(match agent {
            NodeAgent::Kubelet => self.spawn_kubelet_with(&config, &kc)?,
            NodeAgent::Keelson => self.spawn_keelson_with_kubelet_files(
                &config,
                &kc,
                &self.kubelet_root_dir(),
                false,
            )?,
        });
        Ok(())
    }

    /// Stops the node agent (as [`ClusterNode::stop_node_agent`]) and
    /// starts it again as it was started, on the same files and root dir
    /// (`systemctl restart`); containerd and the pods' containers stay.
    pub fn restart_node_agent(&self) -> Result<String, UpstreamError> {
        let how = self.stop_node_agent();
        *lock(&self.node_agent) = Some(self.spawn_node_agent()?);
        Ok(how)
    }

    /// The node agent of the spec, started.
    fn spawn_node_agent(&self) -> Result<Daemon, UpstreamError> {
        let spec = &self.spec;
        let keelson_proxy_in_node =
            spec.node == NodeAgent::Keelson && spec.proxy == ProxyAgent::Keelson;
        match spec.node {
            NodeAgent::Keelson if spec.keelson_files == KeelsonFiles::Upstream => {
                self.spawn_keelson_from_upstream_files(keelson_proxy_in_node)
            }
            NodeAgent::Keelson => {
                let cfg = self.keelson_config(true, keelson_proxy_in_node)?;
                self.spawn_keelson("keelson", &cfg, &[])
            }
            NodeAgent::Kubelet => self.spawn_kubelet(),
        }
    }

    /// Stops the agents (SIGTERM, grace, SIGKILL); containerd and the pods stay.
    pub fn stop_agents(&self) {
        for agent in [&self.proxy_agent, &self.node_agent] {
            if let Some(mut d) = lock(agent).take() {
                d.stop();
            }
        }
    }
}

impl ClusterNode {
    /// Removes everything of the node now, though others still hold it
    /// (a case that outlived its deadline): the agents, then what the
    /// containerd harness would remove for a killed run.
    pub fn force_cleanup(&self) {
        self.stop_agents();
        let instance = self.ctrd.instance().clone();
        instance.remove_stale();
    }
}

impl Drop for ClusterNode {
    fn drop(&mut self) {
        self.stop_agents();
        self.cp.net().release(self.link.index);
    }
}

/// kube-proxy's configuration file as a user writes it: its identity's
/// kubeconfig, the node's name, the pods' CIDR, and zeros where the node's
/// kernel settings must stay as they are (`oomScoreAdj`, conntrack).
pub fn kube_proxy_config(kubeconfig: &Path, node: &str, mode: &str) -> serde_yaml::Mapping {
    let text = format!(
        "apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: {kc}
hostnameOverride: {node}
mode: {mode}
clusterCIDR: {CLUSTER_CIDR}
oomScoreAdj: 0
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
  udpTimeout: 0s
  udpStreamTimeout: 0s
",
        kc = kubeconfig.display(),
    );
    serde_yaml::from_str(&text).unwrap_or_default()
}

fn lock(m: &Mutex<Option<Daemon>>) -> MutexGuard<'_, Option<Daemon>> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
