//! What a benchmark run measured (written as `results.json`, rendered by
//! [`super::report`] and [`super::plot`]).

use serde::{Deserialize, Serialize};

use super::contestant::ContestantKind;
use super::kernel::KernelCounts;
use super::metrics::SelfReported;
use super::stats::Summary;

/// Outcome of a correctness sweep over every VIP.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Correctness {
    /// VIPs checked.
    pub checked: usize,
    /// VIPs whose connections all landed on their own endpoints (and, when
    /// every endpoint was required, reached each of them).
    pub ok: usize,
    /// VIPs with a connection landing on a foreign endpoint.
    pub wrong: usize,
    /// VIPs not (fully) reachable.
    pub unreached: usize,
    /// A few failures, described.
    pub examples: Vec<String>,
}

impl Correctness {
    /// Every VIP checked was right.
    pub fn all_ok(&self) -> bool {
        self.checked > 0 && self.ok == self.checked
    }
}

/// The churn phase as it ran.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ChurnStats {
    /// Asked-for background changes per second.
    pub target_rate: f64,
    /// Background changes written.
    pub writes: usize,
    /// Probed changes written.
    pub probes: usize,
    /// Length, seconds.
    pub seconds: f64,
    /// Background + probed writes per second achieved.
    pub achieved_rate: f64,
    /// Writes the API refused.
    pub write_errors: usize,
}

/// Figures of one contestant at one N.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunResult {
    /// Who.
    pub contestant: ContestantKind,
    /// N.
    pub services: usize,
    /// M.
    pub endpoints_per_service: usize,
    /// Process start → every sampled VIP answers from its endpoints, ms.
    pub cold_sync_ms: Option<f64>,
    /// The proxy stopped and started again with its rules in place:
    /// process start → end of its first sync (its own
    /// `kubeproxy_sync_proxy_rules_last_timestamp_seconds`), ms.
    #[serde(default)]
    pub warm_restart_ms: Option<f64>,
    /// Sampled VIPs answering correctly while the proxy was stopped and
    /// again after the restart: (ok while stopped, ok after, checked).
    #[serde(default)]
    pub warm_restart_vips: Option<(usize, usize, usize)>,
    /// Peak RSS of the restarted process (it adopts instead of building).
    #[serde(default)]
    pub warm_restart_peak_rss_bytes: Option<u64>,
    /// CPU used until then, seconds.
    pub cold_sync_cpu_s: Option<f64>,
    /// Every VIP checked after the cold sync.
    pub correct_after_sync: Correctness,
    /// Every VIP checked again after the churn.
    pub correct_after_churn: Correctness,
    /// Conntrack entries in the node namespace right after the first sweep:
    /// (all TCP, with a Service address as original destination). Socket
    /// load balancing (eBPF) never creates the latter.
    pub conntrack_after_sweep: Option<(usize, usize)>,
    /// `connect()` through a VIP.
    pub connect: Summary,
    /// Timed connections that failed or landed wrong.
    pub connect_failures: u32,
    /// One new Service (+ its slice) among N: API write → traffic.
    pub service_add: Summary,
    /// Probed endpoint changes without other load: API write → traffic.
    pub programming_idle: Summary,
    /// Probed endpoint changes during churn.
    pub programming_churn: Summary,
    /// Probed changes / adds never seen programmed in time.
    pub probe_timeouts: usize,
    /// The churn phase.
    pub churn: ChurnStats,
    /// API write round trips of the probed changes (included in the
    /// programming latencies, which start before the write).
    pub api_write: Summary,
    /// CPU during the churn phase, seconds.
    pub churn_cpu_s: Option<f64>,
    /// CPU over the whole run, seconds.
    pub total_cpu_s: Option<f64>,
    /// Peak resident memory, bytes.
    pub peak_rss_bytes: Option<u64>,
    /// Resident memory at the end of the run (steady state), bytes.
    #[serde(default)]
    pub end_rss_bytes: Option<u64>,
    /// Largest anonymous RSS (`RssAnon`) sampled during the run, bytes
    /// (procstat::MemSampler).
    #[serde(default)]
    pub peak_rss_anon_bytes: Option<u64>,
    /// Largest file-backed RSS (`RssFile`: mostly the binary's text)
    /// sampled during the run, bytes.
    #[serde(default)]
    pub peak_rss_file_bytes: Option<u64>,
    /// Kernel objects after the run.
    pub kernel: Option<KernelCounts>,
    /// The contestant's own metrics.
    pub self_reported: SelfReported,
    /// What went wrong (empty on a clean run).
    pub errors: Vec<String>,
}

impl RunResult {
    /// An empty result for `contestant` at N.
    pub fn new(contestant: ContestantKind, services: usize, endpoints: usize) -> RunResult {
        RunResult {
            contestant,
            services,
            endpoints_per_service: endpoints,
            cold_sync_ms: None,
            warm_restart_ms: None,
            warm_restart_vips: None,
            warm_restart_peak_rss_bytes: None,
            cold_sync_cpu_s: None,
            correct_after_sync: Correctness::default(),
            correct_after_churn: Correctness::default(),
            conntrack_after_sweep: None,
            connect: Summary::default(),
            connect_failures: 0,
            service_add: Summary::default(),
            programming_idle: Summary::default(),
            programming_churn: Summary::default(),
            probe_timeouts: 0,
            churn: ChurnStats::default(),
            api_write: Summary::default(),
            churn_cpu_s: None,
            total_cpu_s: None,
            peak_rss_bytes: None,
            end_rss_bytes: None,
            peak_rss_anon_bytes: None,
            peak_rss_file_bytes: None,
            kernel: None,
            self_reported: SelfReported::default(),
            errors: Vec::new(),
        }
    }

    /// The behaviour check of the smoke test: programmed correctly after
    /// the cold sync and after the churn, every change seen, no error.
    pub fn programmed_correctly(&self) -> bool {
        self.errors.is_empty()
            && self.correct_after_sync.all_ok()
            && self.correct_after_churn.all_ok()
            && self.probe_timeouts == 0
            && self.cold_sync_ms.is_some()
    }
}

/// Direct connections to endpoints from a namespace without any proxy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Baseline {
    /// N at the time.
    pub services: usize,
    /// `connect()` straight to an endpoint address.
    pub connect: Summary,
}

/// Facts about the machine, for the record.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Machine {
    /// `uname -r`.
    pub kernel: String,
    /// Online CPUs.
    pub cpus: usize,
    /// `/proc/loadavg` at start.
    pub load_at_start: String,
    /// `/proc/loadavg` at the end (other work on the machine shows here).
    #[serde(default)]
    pub load_at_end: String,
    /// `nft --version`.
    pub nft: String,
    /// kube-proxy `--version`, when given.
    pub kube_proxy: Option<String>,
}

/// Everything a run produced.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchReport {
    /// The command line.
    pub command: String,
    /// When it started (RFC 3339).
    pub started: String,
    /// The machine.
    pub machine: Machine,
    /// The API server used.
    pub api_server: String,
    /// Settings.
    pub config: super::config::BenchConfig,
    /// Baselines, one per N.
    pub baselines: Vec<Baseline>,
    /// One per contestant per N.
    pub runs: Vec<RunResult>,
}
