//! The benchmark's settings and the `--quick` preset.

use std::path::PathBuf;
use std::time::Duration;

use keelson::config::KubeDuration;
use serde::{Deserialize, Serialize};

use super::contestant::ContestantKind;
use super::error::{BenchError, Result};

/// Everything a benchmark run needs to know.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchConfig {
    /// Service counts (N) to measure at, ascending.
    pub services: Vec<usize>,
    /// Endpoints per Service (M).
    pub endpoints: usize,
    /// Backend namespaces (at least; more if the endpoints need them).
    pub backends: u8,
    /// Who runs.
    pub contestants: Vec<ContestantKind>,
    /// The `keelson` binary.
    pub keelson_bin: PathBuf,
    /// The `keelson-proxy` binary (the proxy role alone).
    #[serde(default)]
    pub keelson_proxy_bin: Option<PathBuf>,
    /// The `kube-proxy` binary.
    pub kube_proxy_bin: Option<PathBuf>,
    /// An outside cluster instead of the test API server.
    pub kubeconfig: Option<PathBuf>,
    /// A directory of upstream Kubernetes binaries (kube-apiserver,
    /// kube-controller-manager; etcd from the system): the benchmark starts
    /// a real control plane from them instead of the test API server.
    #[serde(default)]
    pub upstream_bin: Option<PathBuf>,
    /// Service ClusterIP range (the test API server's, or the cluster's).
    pub service_cidr: String,
    /// `minSyncPeriod` of every contestant.
    pub min_sync_period: Duration,
    /// kube-proxy's iptables mode runs the legacy iptables backend
    /// (`iptables-legacy*`) instead of the host's default (Debian's is
    /// `iptables-nft`).
    #[serde(default)]
    pub iptables_legacy: bool,
    /// Client-side API QPS of every contestant (`None`: upstream's 5).
    pub api_qps: Option<f32>,
    /// Client-side API burst of every contestant (`None`: upstream's 10).
    pub api_burst: Option<u32>,
    /// Background endpoint changes per second during churn (K).
    pub churn_rate: f64,
    /// Length of the churn phase.
    pub churn_duration: Duration,
    /// Probed changes per second during churn.
    pub probe_rate: f64,
    /// Probed changes without churn (idle programming latency).
    pub idle_probes: usize,
    /// New Services added one at a time among N.
    pub service_adds: usize,
    /// Timed connections through VIPs (and directly, for the baseline).
    pub latency_samples: u32,
    /// VIPs checked to call the cold sync done.
    pub sample_vips: usize,
    /// Check that every endpoint of every VIP answers (not only one).
    pub all_endpoints_check: bool,
    /// Longest cold sync.
    pub cold_sync_timeout: Duration,
    /// Longest wait for one change to be programmed.
    pub change_timeout: Duration,
    /// Where reports, plots and logs go.
    pub out_dir: PathBuf,
    /// Seed of the change generator.
    pub seed: u64,
    /// `--quick` preset.
    pub quick: bool,
}

impl BenchConfig {
    /// Defaults of a full run (everything overridable on the command line).
    pub fn full(keelson_bin: PathBuf) -> BenchConfig {
        BenchConfig {
            services: vec![100, 1_000, 10_000],
            endpoints: 10,
            backends: 2,
            contestants: vec![ContestantKind::KeelsonNftables, ContestantKind::KeelsonEbpf],
            keelson_bin,
            keelson_proxy_bin: None,
            kube_proxy_bin: None,
            kubeconfig: None,
            upstream_bin: None,
            service_cidr: "10.96.0.0/12".into(),
            min_sync_period: Duration::ZERO,
            iptables_legacy: false,
            api_qps: None,
            api_burst: None,
            churn_rate: 100.0,
            churn_duration: Duration::from_secs(30),
            probe_rate: 4.0,
            idle_probes: 20,
            service_adds: 10,
            latency_samples: 2_000,
            sample_vips: 30,
            all_endpoints_check: false,
            cold_sync_timeout: Duration::from_secs(900),
            change_timeout: Duration::from_secs(120),
            out_dir: PathBuf::from("keelson-bench-out"),
            seed: 1,
            quick: false,
        }
    }

    /// `--quick`: a few dozen Services, seconds per contestant, every
    /// endpoint of every VIP checked (the smoke test's behaviour check).
    pub fn quick(keelson_bin: PathBuf) -> BenchConfig {
        BenchConfig {
            services: vec![24],
            endpoints: 3,
            backends: 2,
            churn_rate: 20.0,
            churn_duration: Duration::from_secs(3),
            probe_rate: 2.0,
            idle_probes: 3,
            service_adds: 2,
            latency_samples: 100,
            sample_vips: 8,
            all_endpoints_check: true,
            cold_sync_timeout: Duration::from_secs(60),
            change_timeout: Duration::from_secs(30),
            quick: true,
            ..BenchConfig::full(keelson_bin)
        }
    }

    /// `minSyncPeriod` as keelson's configuration type.
    pub fn min_sync_period_kube(&self) -> KubeDuration {
        KubeDuration(self.min_sync_period)
    }

    /// Checks the settings before anything is created.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(BenchError::Invalid(m));
        if self.services.is_empty() || self.services.contains(&0) {
            return bad("--services needs one or more counts ≥ 1".into());
        }
        if self.services.windows(2).any(|w| w[0] >= w[1]) {
            return bad("--services counts must be ascending".into());
        }
        if self.endpoints == 0 {
            return bad("--endpoints must be ≥ 1".into());
        }
        if self.contestants.is_empty() {
            return bad("no contestant selected".into());
        }
        if self.contestants.iter().any(|c| c.is_kube_proxy()) && self.kube_proxy_bin.is_none() {
            return bad("kube-proxy contestants need --kube-proxy PATH".into());
        }
        if self.contestants.iter().any(|c| c.is_keelson_proxy()) && self.keelson_proxy_bin.is_none()
        {
            return bad("keelson-proxy contestants need --keelson-proxy PATH".into());
        }
        if let Some(kp) = &self.keelson_proxy_bin
            && !kp.is_file()
        {
            return bad(format!(
                "keelson-proxy binary {} not found (cargo build --release -p keelson)",
                kp.display()
            ));
        }
        if !self.keelson_bin.is_file()
            && self
                .contestants
                .iter()
                .any(|c| !c.is_kube_proxy() && !c.is_keelson_proxy())
        {
            return bad(format!(
                "keelson binary {} not found (cargo build --release -p keelson, or --keelson PATH)",
                self.keelson_bin.display()
            ));
        }
        if let Some(kp) = &self.kube_proxy_bin
            && !kp.is_file()
        {
            return bad(format!("kube-proxy binary {} not found", kp.display()));
        }
        if self.kubeconfig.is_some() && self.upstream_bin.is_some() {
            return bad("--kubeconfig and --upstream are exclusive".into());
        }
        if self.api_qps.is_some_and(|q| !(q.is_finite() && q > 0.0)) {
            return bad("--api-qps must be > 0".into());
        }
        if self.churn_rate < 0.0 || self.probe_rate <= 0.0 {
            return bad("--churn-rate must be ≥ 0 and --probe-rate > 0".into());
        }
        let cidr: ipnet::IpNet = self.service_cidr.parse().map_err(|e| {
            BenchError::Invalid(format!("--service-cidr {}: {e}", self.service_cidr))
        })?;
        if !matches!(cidr, ipnet::IpNet::V4(_)) {
            return bad("--service-cidr must be IPv4 (the scenario is single-stack IPv4)".into());
        }
        Ok(())
    }

    /// The Service CIDR, parsed.
    pub fn service_net(&self) -> Result<ipnet::Ipv4Net> {
        self.service_cidr
            .parse()
            .map_err(|e| BenchError::Invalid(format!("--service-cidr {}: {e}", self.service_cidr)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation() {
        let exe = std::env::current_exe().expect("exe");
        let ok = BenchConfig::quick(exe.clone());
        ok.validate().expect("quick is valid");
        let mut c = ok.clone();
        c.services = vec![10, 5];
        assert!(c.validate().is_err());
        let mut c = ok.clone();
        c.contestants = vec![ContestantKind::KubeProxyNftables];
        assert!(
            c.validate()
                .expect_err("no kube-proxy")
                .to_string()
                .contains("--kube-proxy")
        );
        let mut c = ok.clone();
        c.keelson_bin = "/nonexistent/keelson".into();
        assert!(c.validate().is_err());
        let mut c = ok.clone();
        c.service_cidr = "fd00::/108".into();
        assert!(c.validate().is_err());
        let mut c = ok;
        c.services = vec![];
        assert!(c.validate().is_err());
    }
}
