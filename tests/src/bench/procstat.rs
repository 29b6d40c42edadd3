//! A contestant's CPU time and memory, read from `/proc/<pid>`, and the
//! peaks of its anonymous and file-backed memory, sampled.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
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
    /// Anonymous resident memory now (`RssAnon`: heap, stacks), bytes.
    pub rss_anon_bytes: u64,
    /// File-backed resident memory now (`RssFile`: the binary's text and
    /// other mapped files, shared with the page cache), bytes.
    pub rss_file_bytes: u64,
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
        rss_anon_bytes: parse_status_kb(&status, "RssAnon").unwrap_or(0),
        rss_file_bytes: parse_status_kb(&status, "RssFile").unwrap_or(0),
    })
}

/// How often [`MemSampler`] reads `/proc/<pid>/status`.
pub const MEM_SAMPLE_INTERVAL: Duration = Duration::from_millis(20);

/// The largest anonymous and file-backed resident memory seen. The
/// kernel keeps only the total's peak (`VmHWM`), so these are sampled
/// every [`MEM_SAMPLE_INTERVAL`]; each is its own maximum (the two need
/// not peak at the same moment).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemPeaks {
    /// Largest `RssAnon` seen, bytes.
    pub anon_bytes: u64,
    /// Largest `RssFile` seen, bytes.
    pub file_bytes: u64,
    /// Samples taken.
    pub samples: u64,
}

impl MemPeaks {
    fn add(&mut self, s: &ProcSample) {
        self.anon_bytes = self.anon_bytes.max(s.rss_anon_bytes);
        self.file_bytes = self.file_bytes.max(s.rss_file_bytes);
        self.samples += 1;
    }
}

/// A thread sampling a process's memory into [`MemPeaks`] until stopped
/// or the process is gone.
#[derive(Debug)]
pub struct MemSampler {
    peaks: Arc<Mutex<MemPeaks>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl MemSampler {
    /// Starts sampling `pid`.
    pub fn start(pid: u32) -> MemSampler {
        let peaks = Arc::new(Mutex::new(MemPeaks::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let (p, st) = (peaks.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            while !st.load(Ordering::Relaxed) {
                // A zombie's status has no Rss lines: nothing more to see.
                let Some(s) = sample(pid).filter(|s| s.rss_bytes > 0) else {
                    break;
                };
                if let Ok(mut g) = p.lock() {
                    g.add(&s);
                }
                std::thread::sleep(MEM_SAMPLE_INTERVAL);
            }
        });
        MemSampler {
            peaks,
            stop,
            thread: Some(thread),
        }
    }

    /// Stops sampling; the peaks seen.
    pub fn finish(&mut self) -> MemPeaks {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.peaks.lock().map(|g| *g).unwrap_or_default()
    }
}

impl Drop for MemSampler {
    fn drop(&mut self) {
        self.finish();
    }
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
        let status = "Name:\tkeelson\nVmHWM:\t   20480 kB\nVmRSS:\t   10240 kB\nRssAnon:\t    4096 kB\nRssFile:\t    6144 kB\n";
        assert_eq!(parse_status_kb(status, "VmHWM"), Some(20 * 1024 * 1024));
        assert_eq!(parse_status_kb(status, "VmRSS"), Some(10 * 1024 * 1024));
        assert_eq!(parse_status_kb(status, "RssAnon"), Some(4 * 1024 * 1024));
        assert_eq!(parse_status_kb(status, "RssFile"), Some(6 * 1024 * 1024));
        assert_eq!(parse_status_kb(status, "VmSwap"), None);
    }

    #[test]
    fn own_process_sample() {
        let s = sample(std::process::id()).expect("own /proc");
        assert!(s.peak_rss_bytes >= s.rss_bytes / 2);
        assert!(s.rss_bytes > 0);
        assert!(s.rss_anon_bytes > 0 && s.rss_file_bytes > 0);
        assert!(s.rss_anon_bytes + s.rss_file_bytes <= s.rss_bytes);
    }

    #[test]
    fn sampler_sees_a_larger_heap() {
        let mut sampler = MemSampler::start(std::process::id());
        let before = sample(std::process::id()).expect("own /proc");
        // 64 MiB touched: anonymous memory the sampler must see grow.
        let big = vec![1u8; 64 << 20];
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while sampler.peaks.lock().expect("lock").anon_bytes < before.rss_anon_bytes + (48 << 20) {
            assert!(
                std::time::Instant::now() < deadline,
                "sampler never saw the heap grow"
            );
            std::thread::sleep(MEM_SAMPLE_INTERVAL);
        }
        std::hint::black_box(&big);
        let peaks = sampler.finish();
        assert!(peaks.samples >= 1);
        assert!(peaks.file_bytes > 0);
    }
}
