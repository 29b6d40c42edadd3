//! A contestant's CPU time and memory, read from `/proc/<pid>`.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// CPU and memory of a process at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct ProcSample {
    /// User + system CPU of the process and of its waited-for children
    /// (kube-proxy's iptables mode runs `iptables-restore` children).
    pub cpu: Duration,
    /// Resident set size now, bytes.
    pub rss_bytes: u64,
    /// Peak resident set size (`VmHWM`), bytes.
    pub peak_rss_bytes: u64,
}

/// Parses the CPU fields of `/proc/<pid>/stat` (utime, stime, cutime,
/// cstime; fields 14–17) into a duration, given the clock tick rate.
pub fn parse_stat_cpu(stat: &str, ticks_per_second: u64) -> Option<Duration> {
    // The command name (field 2) is in parentheses and may contain spaces.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // `rest` starts at field 3 (state), so field k is at index k - 3.
    let ticks: u64 = (14..=17)
        .map(|k| fields.get(k - 3)?.parse::<u64>().ok())
        .sum::<Option<u64>>()?;
    if ticks_per_second == 0 {
        return None;
    }
    Some(Duration::from_nanos(
        ticks.saturating_mul(1_000_000_000) / ticks_per_second,
    ))
}

/// Parses a `kB` line of `/proc/<pid>/status` (e.g. `VmHWM`) into bytes.
pub fn parse_status_kb(status: &str, key: &str) -> Option<u64> {
    status.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        if k != key {
            return None;
        }
        let kb: u64 = v.split_whitespace().next()?.parse().ok()?;
        Some(kb * 1024)
    })
}

fn ticks_per_second() -> u64 {
    nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .and_then(|t| u64::try_from(t).ok())
        .unwrap_or(100)
}

/// Reads the sample of process `pid`; `None` if it is gone.
pub fn sample(pid: u32) -> Option<ProcSample> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    Some(ProcSample {
        cpu: parse_stat_cpu(&stat, ticks_per_second())?,
        rss_bytes: parse_status_kb(&status, "VmRSS").unwrap_or(0),
        peak_rss_bytes: parse_status_kb(&status, "VmHWM").unwrap_or(0),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_cpu_with_spaces_in_the_name() {
        let stat =
            "1234 (kube proxy) S 1 1234 1234 0 -1 4194560 100 0 0 0 250 50 7 3 20 0 12 0 555 0 0";
        assert_eq!(parse_stat_cpu(stat, 100), Some(Duration::from_millis(3100)));
        assert_eq!(parse_stat_cpu("garbage", 100), None);
        assert_eq!(parse_stat_cpu(stat, 0), None);
    }

    #[test]
    fn status_kb_lines() {
        let status = "Name:\tkeelson\nVmHWM:\t   20480 kB\nVmRSS:\t   10240 kB\n";
        assert_eq!(parse_status_kb(status, "VmHWM"), Some(20 * 1024 * 1024));
        assert_eq!(parse_status_kb(status, "VmRSS"), Some(10 * 1024 * 1024));
        assert_eq!(parse_status_kb(status, "VmSwap"), None);
    }

    #[test]
    fn own_process_sample() {
        let s = sample(std::process::id()).expect("own /proc");
        assert!(s.peak_rss_bytes >= s.rss_bytes / 2);
        assert!(s.rss_bytes > 0);
    }
}
