//! The contestants: the real `keelson run --proxy-only` binary in nftables
//! and eBPF mode, (when given) the proxy-only `keelson-proxy run` binary in
//! the same two modes, and (when given) the real kube-proxy binary in
//! nftables and iptables mode, each started with `nsenter --net` in its
//! own node namespace and stopped by PID.

use std::fmt;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use keelson::config::{Config, KubeDuration, ProxyMode};
use keelson_netplane::ebpf::{EbpfConfig, cgroup2_root, cleanup, ensure_bpffs};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};

use super::error::{BenchError, Result};
use super::procstat::{self, MemPeaks, MemSampler, ProcSample};
use crate::netns::{NetNs, unique_suffix};

/// Where a contestant serves `/metrics` inside its namespace (both
/// keelson's and kube-proxy's default `metricsBindAddress`).
pub const METRICS_ADDR: &str = "127.0.0.1:10249";

/// Which proxy, in which mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ContestantKind {
    /// `keelson run --proxy-only`, `proxy.mode: nftables`.
    KeelsonNftables,
    /// `keelson run --proxy-only`, `proxy.mode: ebpf`.
    KeelsonEbpf,
    /// `keelson-proxy run`, `proxy.mode: nftables`.
    KeelsonProxyNftables,
    /// `keelson-proxy run`, `proxy.mode: ebpf`.
    KeelsonProxyEbpf,
    /// `kube-proxy --proxy-mode=nftables`.
    KubeProxyNftables,
    /// `kube-proxy --proxy-mode=iptables`.
    KubeProxyIptables,
}

impl ContestantKind {
    /// Every kind, in report order.
    pub const ALL: [ContestantKind; 6] = [
        ContestantKind::KeelsonNftables,
        ContestantKind::KeelsonEbpf,
        ContestantKind::KeelsonProxyNftables,
        ContestantKind::KeelsonProxyEbpf,
        ContestantKind::KubeProxyNftables,
        ContestantKind::KubeProxyIptables,
    ];

    /// Name used on the command line and in file names.
    pub fn slug(self) -> &'static str {
        match self {
            ContestantKind::KeelsonNftables => "keelson-nftables",
            ContestantKind::KeelsonEbpf => "keelson-ebpf",
            ContestantKind::KeelsonProxyNftables => "keelson-proxy-nftables",
            ContestantKind::KeelsonProxyEbpf => "keelson-proxy-ebpf",
            ContestantKind::KubeProxyNftables => "kube-proxy-nftables",
            ContestantKind::KubeProxyIptables => "kube-proxy-iptables",
        }
    }

    /// Name used in reports.
    pub fn label(self) -> &'static str {
        match self {
            ContestantKind::KeelsonNftables => "keelson nftables",
            ContestantKind::KeelsonEbpf => "keelson eBPF",
            ContestantKind::KeelsonProxyNftables => "keelson-proxy nftables",
            ContestantKind::KeelsonProxyEbpf => "keelson-proxy eBPF",
            ContestantKind::KubeProxyNftables => "kube-proxy nftables",
            ContestantKind::KubeProxyIptables => "kube-proxy iptables",
        }
    }

    /// Parses a [`ContestantKind::slug`].
    pub fn from_slug(s: &str) -> Option<ContestantKind> {
        Self::ALL.into_iter().find(|k| k.slug() == s)
    }

    /// keelson or kube-proxy.
    pub fn is_kube_proxy(self) -> bool {
        matches!(
            self,
            ContestantKind::KubeProxyNftables | ContestantKind::KubeProxyIptables
        )
    }

    /// The `keelson-proxy` binary (not `keelson`).
    pub fn is_keelson_proxy(self) -> bool {
        matches!(
            self,
            ContestantKind::KeelsonProxyNftables | ContestantKind::KeelsonProxyEbpf
        )
    }

    /// A keelson binary in eBPF mode (it needs a cgroup and a bpffs).
    pub fn is_ebpf(self) -> bool {
        matches!(
            self,
            ContestantKind::KeelsonEbpf | ContestantKind::KeelsonProxyEbpf
        )
    }
}

impl fmt::Display for ContestantKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

/// How contestants are started (the same for all where they share a knob).
#[derive(Debug, Clone)]
pub struct ContestantSettings {
    /// The `keelson` binary.
    pub keelson_bin: PathBuf,
    /// The `keelson-proxy` binary, if it takes part.
    pub keelson_proxy_bin: Option<PathBuf>,
    /// The `kube-proxy` binary, if kube-proxy takes part.
    pub kube_proxy_bin: Option<PathBuf>,
    /// `minSyncPeriod` / `--iptables-min-sync-period` for every contestant.
    pub min_sync_period: KubeDuration,
    /// The API server speaks JSON only (the test API server): kube-proxy
    /// gets `--kube-api-content-type=application/json`.
    pub json_only_api: bool,
    /// kube-proxy's iptables mode runs on the legacy iptables backend.
    pub iptables_legacy: bool,
    /// Client-side API rate for every contestant (`clientConnection.qps`,
    /// `--kube-api-qps`); `None`: their default (5, as upstream).
    pub api_qps: Option<f32>,
    /// Client-side API burst (`clientConnection.burst`,
    /// `--kube-api-burst`); `None`: their default (10).
    pub api_burst: Option<u32>,
}

/// The cgroup and bpffs of one eBPF run; removed on drop (stop the
/// contestant and the agent first: the cgroup must be empty).
#[derive(Debug)]
pub struct EbpfEnv {
    cgroup: PathBuf,
    mount: PathBuf,
    config: EbpfConfig,
}

impl EbpfEnv {
    /// Creates a cgroup v2 child for the socket hooks (the probe agent
    /// joins it) and mounts a private bpffs for keelson's pins.
    pub fn create() -> Result<EbpfEnv> {
        let root = cgroup2_root()
            .map_err(|e| BenchError::Invalid(format!("eBPF mode needs cgroup v2: {e}")))?;
        let sfx = unique_suffix();
        let cgroup = root.join(format!("keelson-bench-{sfx}"));
        std::fs::create_dir(&cgroup)
            .map_err(|e| BenchError::io(format!("creating cgroup {}", cgroup.display()), e))?;
        let mount = PathBuf::from(format!("/tmp/keelson-bench-bpffs-{sfx}"));
        let env = EbpfEnv {
            config: EbpfConfig {
                cgroup_path: Some(cgroup.clone()),
                bpffs_path: mount.join("keelson"),
            },
            cgroup,
            mount,
        };
        std::fs::create_dir_all(&env.mount)
            .map_err(|e| BenchError::io(format!("creating {}", env.mount.display()), e))?;
        ensure_bpffs(&env.mount)
            .map_err(|e| BenchError::Invalid(format!("mounting bpffs: {e}")))?;
        Ok(env)
    }

    /// The cgroup whose sockets are load-balanced.
    pub fn cgroup(&self) -> &Path {
        &self.cgroup
    }

    /// keelson's `proxy.ebpf.bpffsPath`.
    pub fn bpffs_path(&self) -> &Path {
        &self.config.bpffs_path
    }

    /// Where keelson pins its maps.
    pub fn maps_dir(&self) -> PathBuf {
        self.config.bpffs_path.join("maps")
    }
}

impl Drop for EbpfEnv {
    fn drop(&mut self) {
        if let Err(e) = cleanup(&self.config) {
            eprintln!("warning: removing eBPF pins: {e}");
        }
        if let Err(e) = nix::mount::umount2(&self.mount, nix::mount::MntFlags::MNT_DETACH) {
            eprintln!("warning: umount {}: {e}", self.mount.display());
        }
        let _ = std::fs::remove_dir(&self.mount);
        // A process that just exited may take a moment to leave the cgroup.
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            match std::fs::remove_dir(&self.cgroup) {
                Ok(()) => break,
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) && Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => {
                    eprintln!("warning: removing cgroup {}: {e}", self.cgroup.display());
                    break;
                }
            }
        }
    }
}

/// The keelson configuration of a contestant.
pub fn keelson_config(
    kind: ContestantKind,
    settings: &ContestantSettings,
    node_name: &str,
    kubeconfig: &Path,
    ebpf: Option<&EbpfEnv>,
) -> Result<Config> {
    let mut cfg = Config {
        node_name: Some(node_name.to_string()),
        shutdown_timeout: KubeDuration::from_secs(5),
        ..Config::default()
    };
    cfg.node.enabled = false;
    cfg.proxy.client_connection.kubeconfig = Some(kubeconfig.to_path_buf());
    cfg.proxy.min_sync_period = settings.min_sync_period;
    if let Some(q) = settings.api_qps {
        cfg.proxy.client_connection.qps = q;
    }
    if let Some(b) = settings.api_burst {
        cfg.proxy.client_connection.burst = i32::try_from(b).unwrap_or(i32::MAX);
    }
    cfg.proxy.mode = match kind {
        ContestantKind::KeelsonNftables | ContestantKind::KeelsonProxyNftables => {
            ProxyMode::Nftables
        }
        ContestantKind::KeelsonEbpf | ContestantKind::KeelsonProxyEbpf => ProxyMode::Ebpf,
        other => {
            return Err(BenchError::Invalid(format!("{other} is not keelson")));
        }
    };
    if kind.is_ebpf() {
        let env = ebpf.ok_or_else(|| BenchError::Invalid("eBPF run without its cgroup".into()))?;
        cfg.proxy.ebpf.cgroup_path = Some(env.cgroup().to_path_buf());
        cfg.proxy.ebpf.bpffs_path = env.bpffs_path().to_path_buf();
    }
    if let Err(errs) = cfg.validate() {
        return Err(BenchError::Invalid(format!(
            "generated keelson config is invalid: {errs:?}"
        )));
    }
    Ok(cfg)
}

/// kube-proxy's flags for a contestant.
pub fn kube_proxy_args(
    kind: ContestantKind,
    settings: &ContestantSettings,
    node_name: &str,
    kubeconfig: &Path,
) -> Result<Vec<String>> {
    let mode = match kind {
        ContestantKind::KubeProxyNftables => "nftables",
        ContestantKind::KubeProxyIptables => "iptables",
        other => return Err(BenchError::Invalid(format!("{other} is not kube-proxy"))),
    };
    let mut args = vec![
        format!("--kubeconfig={}", kubeconfig.display()),
        format!("--hostname-override={node_name}"),
        format!("--proxy-mode={mode}"),
        // nftables mode reads the iptables flag too; v1.36 has no
        // `--min-sync-period`.
        format!("--iptables-min-sync-period={}", settings.min_sync_period),
        // nf_conntrack_max is host-wide: leave it alone.
        "--conntrack-max-per-core=0".to_string(),
        format!("--metrics-bind-address={METRICS_ADDR}"),
        "--healthz-bind-address=0.0.0.0:10256".to_string(),
    ];
    if settings.json_only_api {
        args.push("--kube-api-content-type=application/json".to_string());
    }
    if let Some(q) = settings.api_qps {
        args.push(format!("--kube-api-qps={q}"));
    }
    if let Some(b) = settings.api_burst {
        args.push(format!("--kube-api-burst={b}"));
    }
    Ok(args)
}

/// The multi-call binary of the legacy iptables backend (Debian's
/// `iptables` package ships it beside `xtables-nft-multi`).
pub const XTABLES_LEGACY_MULTI: &str = "/usr/sbin/xtables-legacy-multi";

/// The names kube-proxy's iptables mode runs (pkg/util/iptables: the
/// `iptables`, `-save` and `-restore` commands of both families).
const IPTABLES_COMMANDS: [&str; 6] = [
    "iptables",
    "iptables-save",
    "iptables-restore",
    "ip6tables",
    "ip6tables-save",
    "ip6tables-restore",
];

/// A directory under `work_dir` whose `iptables*` commands are the legacy
/// backend (symbolic links to [`XTABLES_LEGACY_MULTI`], which picks its
/// command from the name it is run as); put first in kube-proxy's PATH.
pub fn legacy_iptables_dir(work_dir: &Path) -> Result<PathBuf> {
    let multi = Path::new(XTABLES_LEGACY_MULTI);
    if !multi.exists() {
        return Err(BenchError::Invalid(format!(
            "--iptables-legacy needs {XTABLES_LEGACY_MULTI} (Debian package iptables)"
        )));
    }
    let dir = work_dir.join("iptables-legacy-bin");
    std::fs::create_dir_all(&dir)
        .map_err(|e| BenchError::io(format!("creating {}", dir.display()), e))?;
    for name in IPTABLES_COMMANDS {
        let link = dir.join(name);
        if link.symlink_metadata().is_err() {
            std::os::unix::fs::symlink(multi, &link)
                .map_err(|e| BenchError::io(format!("linking {}", link.display()), e))?;
        }
    }
    Ok(dir)
}

/// What [`ProxyProcess::start`] needs.
#[derive(Debug, Clone, Copy)]
pub struct Launch<'a> {
    /// Which contestant.
    pub kind: ContestantKind,
    /// Shared settings.
    pub settings: &'a ContestantSettings,
    /// Its node namespace.
    pub ns: &'a NetNs,
    /// Its Node name.
    pub node_name: &'a str,
    /// Kubeconfig reaching the API server from the namespace.
    pub kubeconfig: &'a Path,
    /// eBPF mode's cgroup and bpffs.
    pub ebpf: Option<&'a EbpfEnv>,
    /// Where its config file goes.
    pub work_dir: &'a Path,
    /// Where its output goes.
    pub log: &'a Path,
}

/// A running contestant. Dropping it kills the process.
#[derive(Debug)]
pub struct ProxyProcess {
    kind: ContestantKind,
    child: Child,
    log: PathBuf,
    last: Option<ProcSample>,
    memory: MemSampler,
}

/// What a stopped contestant used.
#[derive(Debug, Clone, Copy, Default)]
pub struct Stopped {
    /// The last sample before the stop (CPU, `VmHWM`, RSS at the end).
    pub last: Option<ProcSample>,
    /// The largest anonymous and file-backed RSS sampled while it ran.
    pub memory: MemPeaks,
}

impl ProxyProcess {
    /// Starts a contestant as `launch` says.
    pub fn start(launch: &Launch<'_>) -> Result<ProxyProcess> {
        let Launch {
            kind,
            settings,
            ns,
            node_name,
            kubeconfig,
            ebpf,
            work_dir,
            log,
        } = *launch;
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--net={}", ns.path().display())).arg("--");
        if kind.is_kube_proxy() {
            let bin = settings
                .kube_proxy_bin
                .as_ref()
                .ok_or_else(|| BenchError::Invalid(format!("{kind} needs --kube-proxy PATH")))?;
            cmd.arg(bin)
                .args(kube_proxy_args(kind, settings, node_name, kubeconfig)?);
            if kind == ContestantKind::KubeProxyIptables && settings.iptables_legacy {
                let dir = legacy_iptables_dir(work_dir)?;
                let path = std::env::var("PATH").unwrap_or_default();
                cmd.env("PATH", format!("{}:{path}", dir.display()));
            }
        } else {
            let cfg = keelson_config(kind, settings, node_name, kubeconfig, ebpf)?;
            let path = work_dir.join(format!("{}.yaml", kind.slug()));
            std::fs::write(&path, cfg.to_yaml())
                .map_err(|e| BenchError::io(format!("writing {}", path.display()), e))?;
            let bin = if kind.is_keelson_proxy() {
                settings.keelson_proxy_bin.as_ref().ok_or_else(|| {
                    BenchError::Invalid(format!("{kind} needs --keelson-proxy PATH"))
                })?
            } else {
                &settings.keelson_bin
            };
            // keelson-proxy takes `keelson run --proxy-only`'s command line.
            cmd.arg(bin)
                .arg("run")
                .arg("--proxy-only")
                .arg("--config")
                .arg(&path);
        }
        let out = File::create(log)
            .map_err(|e| BenchError::io(format!("creating {}", log.display()), e))?;
        let err = out
            .try_clone()
            .map_err(|e| BenchError::io("duplicating the log file", e))?;
        let child = cmd
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(|e| BenchError::Contestant {
                name: kind.label().into(),
                message: format!("starting: {e}"),
            })?;
        let memory = MemSampler::start(child.id());
        Ok(ProxyProcess {
            kind,
            child,
            log: log.to_path_buf(),
            last: None,
            memory,
        })
    }

    /// The process id (nsenter execs the proxy, so it is the proxy's).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// CPU and memory now (the last known sample once it exited).
    pub fn sample(&mut self) -> Option<ProcSample> {
        if let Some(s) = procstat::sample(self.pid()) {
            self.last = Some(s);
        }
        self.last
    }

    /// An error with the end of the log if the process has exited.
    pub fn check_alive(&mut self) -> Result<()> {
        match self.child.try_wait() {
            Ok(None) => Ok(()),
            Ok(Some(status)) => Err(BenchError::Contestant {
                name: self.kind.label().into(),
                message: format!("exited ({status}); last log lines:\n{}", self.log_tail(20)),
            }),
            Err(e) => Err(BenchError::io("checking a contestant", e)),
        }
    }

    /// The last `n` lines of the contestant's output.
    pub fn log_tail(&self, n: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    /// SIGTERM, then SIGKILL after `grace`; returns the last sample taken
    /// before, and the memory peaks sampled until, the signal.
    pub fn stop(mut self, grace: Duration) -> Stopped {
        let last = self.sample();
        let memory = self.memory.finish();
        self.terminate(grace);
        Stopped { last, memory }
    }

    fn terminate(&mut self, grace: Duration) {
        if matches!(self.child.try_wait(), Ok(Some(_))) {
            return;
        }
        let pid = Pid::from_raw(self.child.id() as i32);
        let _ = kill(pid, Signal::SIGTERM);
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for ProxyProcess {
    fn drop(&mut self) {
        self.terminate(Duration::from_secs(5));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> ContestantSettings {
        ContestantSettings {
            keelson_bin: "/bin/keelson".into(),
            keelson_proxy_bin: Some("/bin/keelson-proxy".into()),
            kube_proxy_bin: Some("/bin/kube-proxy".into()),
            min_sync_period: KubeDuration::from_millis(0),
            json_only_api: true,
            iptables_legacy: false,
            api_qps: Some(50.0),
            api_burst: Some(100),
        }
    }

    #[test]
    fn slugs_round_trip() {
        for k in ContestantKind::ALL {
            assert_eq!(ContestantKind::from_slug(k.slug()), Some(k));
        }
        assert_eq!(ContestantKind::from_slug("ipvs"), None);
        assert!(ContestantKind::KubeProxyIptables.is_kube_proxy());
        assert!(!ContestantKind::KeelsonEbpf.is_kube_proxy());
        assert!(ContestantKind::KeelsonProxyEbpf.is_keelson_proxy());
        assert!(!ContestantKind::KeelsonEbpf.is_keelson_proxy());
        assert!(ContestantKind::KeelsonProxyEbpf.is_ebpf());
        assert!(!ContestantKind::KeelsonProxyNftables.is_ebpf());
        let modes = ContestantKind::ALL
            .into_iter()
            .filter(|k| !k.is_kube_proxy())
            .map(|k| {
                keelson_config(k, &settings(), "n", Path::new("/kc"), None)
                    .map(|c| c.proxy.mode)
                    .ok()
            })
            .collect::<Vec<_>>();
        // eBPF kinds need their cgroup; the nftables ones get nftables.
        assert_eq!(
            modes,
            [
                Some(ProxyMode::Nftables),
                None,
                Some(ProxyMode::Nftables),
                None
            ]
        );
    }

    #[test]
    fn keelson_nftables_config() {
        let cfg = keelson_config(
            ContestantKind::KeelsonNftables,
            &settings(),
            "kb-node",
            Path::new("/tmp/kc"),
            None,
        )
        .expect("config");
        let yaml = cfg.to_yaml();
        let back = Config::from_yaml_str(&yaml).expect("valid keelson config");
        assert_eq!(back.proxy.mode, ProxyMode::Nftables);
        assert_eq!(back.node_name.as_deref(), Some("kb-node"));
        assert_eq!(back.proxy.min_sync_period, KubeDuration::from_millis(0));
        assert!(!back.node.enabled);
        assert_eq!(back.proxy.client_connection.qps, 50.0);
        assert_eq!(back.proxy.client_connection.burst, 100);
        assert_eq!(
            back.proxy.client_connection.kubeconfig.as_deref(),
            Some(Path::new("/tmp/kc"))
        );
        assert!(
            keelson_config(
                ContestantKind::KeelsonEbpf,
                &settings(),
                "n",
                Path::new("/kc"),
                None
            )
            .is_err(),
            "eBPF needs its cgroup"
        );
    }

    #[test]
    fn kube_proxy_flags() {
        let args = kube_proxy_args(
            ContestantKind::KubeProxyIptables,
            &settings(),
            "kb-node",
            Path::new("/tmp/kc"),
        )
        .expect("args");
        assert!(args.contains(&"--proxy-mode=iptables".to_string()));
        assert!(args.contains(&"--hostname-override=kb-node".to_string()));
        assert!(args.contains(&"--iptables-min-sync-period=0s".to_string()));
        assert!(
            !args.iter().any(|a| a.starts_with("--min-sync-period")),
            "kube-proxy v1.36 has no --min-sync-period flag"
        );
        assert!(args.contains(&"--kube-api-content-type=application/json".to_string()));
        assert!(args.contains(&"--conntrack-max-per-core=0".to_string()));
        assert!(args.contains(&"--kube-api-qps=50".to_string()));
        assert!(args.contains(&"--kube-api-burst=100".to_string()));
        assert!(
            kube_proxy_args(
                ContestantKind::KeelsonNftables,
                &settings(),
                "n",
                Path::new("/kc")
            )
            .is_err()
        );
    }
}
