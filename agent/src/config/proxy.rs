//! The `proxy:` section: the kube-proxy replacement's settings. Field names,
//! meanings and defaults follow KubeProxyConfiguration
//! (kubeproxy.config.k8s.io) where the same setting exists there.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::duration::KubeDuration;

/// Which data plane programs Service routing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum ProxyMode {
    /// nftables table `keelson` (kube-proxy's `nftables` mode).
    #[default]
    Nftables,
    /// eBPF socket-level load balancing, with nftables for north-south traffic.
    Ebpf,
}

/// How the proxy role talks to the API server (`clientConnection`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ClientConnection {
    /// Kubeconfig with kube-proxy's credentials. Empty: `--kubeconfig`,
    /// then `$KUBECONFIG`, then in-cluster.
    pub kubeconfig: Option<PathBuf>,
    /// Client-side request rate (`qps`).
    pub qps: f32,
    /// Client-side burst (`burst`).
    pub burst: i32,
}

impl Default for ClientConnection {
    fn default() -> Self {
        ClientConnection {
            kubeconfig: None,
            qps: 5.0,
            burst: 10,
        }
    }
}

/// nftables-specific settings (`nftables`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct NftablesConfig {
    /// Bit of the packet mark that flags packets for masquerading (`masqueradeBit`).
    pub masquerade_bit: i32,
    /// Masquerade all Service traffic (`masqueradeAll`).
    pub masquerade_all: bool,
}

impl Default for NftablesConfig {
    fn default() -> Self {
        NftablesConfig {
            masquerade_bit: 14,
            masquerade_all: false,
        }
    }
}

/// Conntrack settings kube-proxy applies to the node (`conntrack`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ConntrackConfig {
    /// Entries per CPU core for nf_conntrack_max; 0 leaves it as is (`maxPerCore`).
    pub max_per_core: i32,
    /// Lower bound of nf_conntrack_max (`min`).
    pub min: i32,
    /// Idle timeout of established TCP entries; 0 leaves it (`tcpEstablishedTimeout`).
    pub tcp_established_timeout: KubeDuration,
    /// Timeout of CLOSE_WAIT TCP entries; 0 leaves it (`tcpCloseWaitTimeout`).
    pub tcp_close_wait_timeout: KubeDuration,
    /// Set nf_conntrack_tcp_be_liberal (`tcpBeLiberal`).
    pub tcp_be_liberal: bool,
    /// UDP entry timeout; 0 leaves it (`udpTimeout`).
    pub udp_timeout: KubeDuration,
    /// UDP stream entry timeout; 0 leaves it (`udpStreamTimeout`).
    pub udp_stream_timeout: KubeDuration,
}

impl Default for ConntrackConfig {
    fn default() -> Self {
        ConntrackConfig {
            max_per_core: 32768,
            min: 131072,
            tcp_established_timeout: KubeDuration::from_secs(24 * 3600),
            tcp_close_wait_timeout: KubeDuration::from_secs(3600),
            tcp_be_liberal: false,
            udp_timeout: KubeDuration::from_secs(0),
            udp_stream_timeout: KubeDuration::from_secs(0),
        }
    }
}

/// eBPF-mode settings (`ebpf`, keelson only).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct EbpfConfig {
    /// cgroup v2 directory the socket hooks attach to (all processes below it
    /// are served). Empty: the node's cgroup v2 root (`/sys/fs/cgroup`, or
    /// `/sys/fs/cgroup/unified` on hybrid hosts).
    pub cgroup_path: Option<PathBuf>,
    /// bpffs directory where programs and maps are pinned.
    pub bpffs_path: PathBuf,
    /// Use the nftables data plane when the kernel lacks the eBPF hooks
    /// instead of failing at start.
    pub fallback_to_nftables: bool,
}

impl Default for EbpfConfig {
    fn default() -> Self {
        EbpfConfig {
            cgroup_path: None,
            bpffs_path: PathBuf::from("/sys/fs/bpf/keelson"),
            fallback_to_nftables: false,
        }
    }
}

/// The proxy role's settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ProxyConfig {
    /// Run the proxy role (kube-proxy). `--node-only` turns it off.
    pub enabled: bool,
    /// `nftables` or `ebpf` (`mode`).
    pub mode: ProxyMode,
    /// API connection (`clientConnection`).
    pub client_connection: ClientConnection,
    /// Address of the proxy health server used by load balancers (`healthzBindAddress`).
    pub healthz_bind_address: String,
    /// Pod network CIDRs, comma separated; traffic from outside them to a
    /// ClusterIP is masqueraded (`clusterCIDR`).
    #[serde(rename = "clusterCIDR")]
    pub cluster_cidr: String,
    /// Where NodePorts listen: CIDRs, or `primary` for the node's primary IPs
    /// (`nodePortAddresses`; empty means `primary`, as kube-proxy ≥ 1.31).
    pub node_port_addresses: Vec<String>,
    /// Longest time between full resyncs of the data plane (`syncPeriod`).
    pub sync_period: KubeDuration,
    /// Shortest time between syncs; bursts are coalesced (`minSyncPeriod`). 0 allowed.
    pub min_sync_period: KubeDuration,
    /// nftables settings (`nftables`).
    pub nftables: NftablesConfig,
    /// Conntrack settings (`conntrack`).
    pub conntrack: ConntrackConfig,
    /// eBPF settings (keelson only).
    pub ebpf: EbpfConfig,
    /// OOM score adjustment of keelson's process when only the proxy role
    /// runs (`oomScoreAdj`, -1000..=1000); with the node role, the node's
    /// `oomScoreAdj` applies, as kubelet's would.
    pub oom_score_adj: i32,
}

impl Default for ProxyConfig {
    fn default() -> Self {
        ProxyConfig {
            enabled: true,
            mode: ProxyMode::Nftables,
            client_connection: ClientConnection::default(),
            healthz_bind_address: "0.0.0.0:10256".to_string(),
            cluster_cidr: String::new(),
            node_port_addresses: Vec::new(),
            sync_period: KubeDuration::from_secs(30),
            min_sync_period: KubeDuration::from_secs(1),
            nftables: NftablesConfig::default(),
            conntrack: ConntrackConfig::default(),
            ebpf: EbpfConfig::default(),
            oom_score_adj: -999,
        }
    }
}
