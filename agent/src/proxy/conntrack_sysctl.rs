//! kube-proxy's conntrack tuning (`proxy.conntrack.*`), applied once when
//! the proxy role starts: `nf_conntrack_max` (from `maxPerCore` × CPUs, at
//! least `min`) with the module's hash size raised to a quarter of it, the
//! TCP established and CLOSE_WAIT timeouts, `nf_conntrack_tcp_be_liberal`
//! and the UDP timeouts. A value of 0 leaves the kernel's setting; a sysctl
//! already at the wanted value is not written.
//!
//! `nf_conntrack_max` and the hash size are global: the kernel refuses
//! `nf_conntrack_max` outside the initial network namespace (and the hash
//! size is then left alone, as kube-proxy does), while the timeouts belong
//! to the proxy's network namespace. A refused write is reported, never
//! fatal: the proxy serves with the kernel's values.

use std::path::{Path, PathBuf};

use crate::config::proxy::ConntrackConfig;

/// One sysctl keelson could not set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SysctlFailure {
    /// The file (`net/netfilter/nf_conntrack_max`, or the hash size parameter).
    pub name: String,
    /// The value keelson wanted.
    pub value: u64,
    /// Why it failed.
    pub message: String,
}

impl std::fmt::Display for SysctlFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "setting {} to {}: {}",
            self.name, self.value, self.message
        )
    }
}

/// Where the settings live (`/proc/sys` and `/sys/module`; tests give a
/// temporary tree).
#[derive(Debug, Clone)]
pub struct SysctlPaths {
    /// `/proc/sys`.
    pub proc_sys: PathBuf,
    /// `/sys/module/nf_conntrack/parameters/hashsize`.
    pub hashsize: PathBuf,
}

impl Default for SysctlPaths {
    fn default() -> Self {
        SysctlPaths {
            proc_sys: PathBuf::from("/proc/sys"),
            hashsize: PathBuf::from("/sys/module/nf_conntrack/parameters/hashsize"),
        }
    }
}

/// kube-proxy's `getConntrackMax`: `maxPerCore` × CPUs, at least `min`;
/// 0 (leave it) when `maxPerCore` is 0.
pub fn conntrack_max(cfg: &ConntrackConfig, cpus: usize) -> u64 {
    if cfg.max_per_core <= 0 {
        return 0;
    }
    let scaled = u64::try_from(cfg.max_per_core)
        .unwrap_or(0)
        .saturating_mul(cpus as u64);
    scaled.max(u64::try_from(cfg.min).unwrap_or(0))
}

fn read_u64(path: &Path) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// Writes `value` unless the file already holds it.
fn set(path: &Path, name: &str, value: u64) -> Result<(), SysctlFailure> {
    if read_u64(path) == Some(value) {
        return Ok(());
    }
    std::fs::write(path, value.to_string()).map_err(|e| SysctlFailure {
        name: name.to_string(),
        value,
        message: e.to_string(),
    })?;
    tracing::info!(sysctl = name, value, "set conntrack sysctl");
    Ok(())
}

/// Applies `cfg` on a machine with `cpus` CPUs; returns what failed.
pub fn apply(cfg: &ConntrackConfig, cpus: usize, paths: &SysctlPaths) -> Vec<SysctlFailure> {
    let mut failures = Vec::new();
    let netfilter = |name: &str| paths.proc_sys.join("net/netfilter").join(name);
    let max = conntrack_max(cfg, cpus);
    if max > 0 {
        match set(
            &netfilter("nf_conntrack_max"),
            "net/netfilter/nf_conntrack_max",
            max,
        ) {
            Ok(()) => {
                let buckets = max / 4;
                if read_u64(&paths.hashsize).is_some_and(|h| h < buckets) {
                    let name = paths.hashsize.display().to_string();
                    if let Err(e) = set(&paths.hashsize, &name, buckets) {
                        failures.push(e);
                    }
                }
            }
            Err(e) => failures.push(e),
        }
    }
    let seconds = |d: crate::config::duration::KubeDuration| std::time::Duration::from(d).as_secs();
    let timeouts = [
        (
            "nf_conntrack_tcp_timeout_established",
            seconds(cfg.tcp_established_timeout),
        ),
        (
            "nf_conntrack_tcp_timeout_close_wait",
            seconds(cfg.tcp_close_wait_timeout),
        ),
        ("nf_conntrack_udp_timeout", seconds(cfg.udp_timeout)),
        (
            "nf_conntrack_udp_timeout_stream",
            seconds(cfg.udp_stream_timeout),
        ),
        ("nf_conntrack_tcp_be_liberal", u64::from(cfg.tcp_be_liberal)),
    ];
    for (name, value) in timeouts {
        if value == 0 {
            continue;
        }
        if let Err(e) = set(&netfilter(name), &format!("net/netfilter/{name}"), value) {
            failures.push(e);
        }
    }
    failures
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::config::duration::KubeDuration;

    fn tree(max: u64, hashsize: u64) -> (tempfile::TempDir, SysctlPaths) {
        let dir = tempfile::tempdir().unwrap();
        let nf = dir.path().join("proc/net/netfilter");
        std::fs::create_dir_all(&nf).unwrap();
        for (name, v) in [
            ("nf_conntrack_max", max),
            ("nf_conntrack_tcp_timeout_established", 432000),
            ("nf_conntrack_tcp_timeout_close_wait", 60),
            ("nf_conntrack_udp_timeout", 30),
            ("nf_conntrack_udp_timeout_stream", 120),
            ("nf_conntrack_tcp_be_liberal", 0),
        ] {
            std::fs::write(nf.join(name), format!("{v}\n")).unwrap();
        }
        std::fs::write(dir.path().join("hashsize"), format!("{hashsize}\n")).unwrap();
        let paths = SysctlPaths {
            proc_sys: dir.path().join("proc"),
            hashsize: dir.path().join("hashsize"),
        };
        (dir, paths)
    }

    fn read(paths: &SysctlPaths, name: &str) -> u64 {
        read_u64(&paths.proc_sys.join("net/netfilter").join(name)).unwrap()
    }

    #[test]
    fn max_is_per_core_with_a_floor_and_zero_leaves_it() {
        let cfg = ConntrackConfig::default();
        assert_eq!(conntrack_max(&cfg, 2), 131072);
        assert_eq!(conntrack_max(&cfg, 8), 262144);
        let off = ConntrackConfig {
            max_per_core: 0,
            ..ConntrackConfig::default()
        };
        assert_eq!(conntrack_max(&off, 8), 0);
    }

    #[test]
    fn defaults_set_max_hashsize_and_tcp_timeouts_only() {
        let (_d, paths) = tree(65536, 16384);
        let failures = apply(&ConntrackConfig::default(), 2, &paths);
        assert!(failures.is_empty(), "{failures:?}");
        assert_eq!(read(&paths, "nf_conntrack_max"), 131072);
        assert_eq!(read_u64(&paths.hashsize), Some(32768));
        assert_eq!(read(&paths, "nf_conntrack_tcp_timeout_established"), 86400);
        assert_eq!(read(&paths, "nf_conntrack_tcp_timeout_close_wait"), 3600);
        // 0 leaves the kernel's value; false leaves be_liberal.
        assert_eq!(read(&paths, "nf_conntrack_udp_timeout"), 30);
        assert_eq!(read(&paths, "nf_conntrack_tcp_be_liberal"), 0);
    }

    #[test]
    fn a_large_enough_hash_is_kept_and_udp_and_liberal_apply() {
        let (_d, paths) = tree(65536, 1 << 20);
        let cfg = ConntrackConfig {
            tcp_be_liberal: true,
            udp_timeout: KubeDuration::from_secs(45),
            udp_stream_timeout: KubeDuration::from_secs(150),
            ..ConntrackConfig::default()
        };
        assert!(apply(&cfg, 2, &paths).is_empty());
        assert_eq!(read_u64(&paths.hashsize), Some(1 << 20));
        assert_eq!(read(&paths, "nf_conntrack_udp_timeout"), 45);
        assert_eq!(read(&paths, "nf_conntrack_udp_timeout_stream"), 150);
        assert_eq!(read(&paths, "nf_conntrack_tcp_be_liberal"), 1);
    }

    #[test]
    fn a_refused_max_leaves_the_hash_size_and_the_rest_still_applies() {
        let (_d, paths) = tree(65536, 16384);
        // A directory where the file should be: the write fails.
        let max = paths.proc_sys.join("net/netfilter/nf_conntrack_max");
        std::fs::remove_file(&max).unwrap();
        std::fs::create_dir(&max).unwrap();
        let failures = apply(&ConntrackConfig::default(), 2, &paths);
        assert_eq!(failures.len(), 1, "{failures:?}");
        assert_eq!(failures[0].name, "net/netfilter/nf_conntrack_max");
        assert_eq!(failures[0].value, 131072);
        assert_eq!(read_u64(&paths.hashsize), Some(16384));
        assert_eq!(read(&paths, "nf_conntrack_tcp_timeout_established"), 86400);
    }
}
