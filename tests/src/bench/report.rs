//! The markdown report: one table per N, contestants side by side, each
//! figure with its ratio against kube-proxy (nftables mode, else iptables
//! mode) when kube-proxy ran, else — for connection latency — against the
//! no-proxy baseline.

use std::fmt::Write;

use super::contestant::ContestantKind;
use super::results::{Baseline, BenchReport, RunResult};
use super::stats::Summary;

/// A duration in ms, written with a sensible unit.
pub fn fmt_ms(ms: f64) -> String {
    if ms < 1.0 {
        format!("{:.0} µs", ms * 1000.0)
    } else if ms < 10.0 {
        format!("{ms:.2} ms")
    } else if ms < 1000.0 {
        format!("{ms:.1} ms")
    } else {
        format!("{:.2} s", ms / 1000.0)
    }
}

/// Bytes as MiB.
pub fn fmt_mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

/// `value / reference` as a ratio, `×0.05`.
pub fn fmt_ratio(value: f64, reference: f64) -> Option<String> {
    (reference > 0.0 && value.is_finite()).then(|| {
        let r = value / reference;
        if r < 0.01 {
            format!("×{r:.4}")
        } else if r < 10.0 {
            format!("×{r:.2}")
        } else {
            format!("×{r:.0}")
        }
    })
}

fn with_ratio(text: String, value: Option<f64>, reference: Option<f64>) -> String {
    match (value, reference) {
        (Some(v), Some(r)) => match fmt_ratio(v, r) {
            Some(x) => format!("{text} ({x})"),
            None => text,
        },
        _ => text,
    }
}

fn ms_cell(v: Option<f64>, reference: Option<f64>) -> String {
    match v {
        Some(v) => with_ratio(fmt_ms(v), Some(v), reference),
        None => "—".into(),
    }
}

fn pair_cell(a: Option<f64>, b: Option<f64>, ra: Option<f64>, rb: Option<f64>) -> String {
    if a.is_none() && b.is_none() {
        return "—".into();
    }
    format!("{} / {}", ms_cell(a, ra), ms_cell(b, rb))
}

fn secs(v: Option<f64>) -> String {
    v.map_or("—".into(), |s| format!("{s:.2}"))
}

/// The run kube-proxy's figures are compared with at this N.
fn reference<'a>(runs: &[&'a RunResult]) -> Option<&'a RunResult> {
    [
        ContestantKind::KubeProxyNftables,
        ContestantKind::KubeProxyIptables,
    ]
    .iter()
    .find_map(|k| {
        runs.iter()
            .find(|r| r.contestant == *k && r.errors.is_empty())
    })
    .copied()
}

fn summary_pair(s: &Summary) -> (Option<f64>, Option<f64>) {
    (s.p50_ms, s.p99_ms)
}

fn table(
    out: &mut String,
    n: usize,
    runs: &[&RunResult],
    baseline: Option<&Baseline>,
    report: &BenchReport,
) {
    let reference = reference(runs);
    let refv = |f: &dyn Fn(&RunResult) -> Option<f64>| reference.and_then(f);
    let _ = writeln!(
        out,
        "\n### N = {n} Services × M = {} endpoints\n",
        report.config.endpoints
    );
    match reference {
        Some(r) => {
            let _ = writeln!(
                out,
                "Ratios: against {} at the same N (×1 = same; below 1 = better).\n",
                r.contestant
            );
        }
        None => {
            let _ = writeln!(
                out,
                "Ratios: kube-proxy did not run, so only connection latency has one (against the no-proxy baseline).\n"
            );
        }
    }
    let mut header = String::from("| figure |");
    let mut rule = String::from("|---|");
    for r in runs {
        let _ = write!(header, " {} |", r.contestant);
        rule.push_str("---|");
    }
    header.push_str(" no proxy (baseline) |");
    rule.push_str("---|");
    let _ = writeln!(out, "{header}\n{rule}");

    let mut row = |name: &str, cells: Vec<String>, base: String| {
        let _ = writeln!(out, "| {name} | {} | {base} |", cells.join(" | "));
    };
    let dash = || "—".to_string();

    row(
        "programmed correctly (VIPs right after sync · after churn)",
        runs.iter()
            .map(|r| {
                let mark = if r.programmed_correctly() {
                    "yes"
                } else {
                    "**NO**"
                };
                format!(
                    "{mark}: {}/{} · {}/{}",
                    r.correct_after_sync.ok,
                    r.correct_after_sync.checked,
                    r.correct_after_churn.ok,
                    r.correct_after_churn.checked
                )
            })
            .collect(),
        dash(),
    );
    let cold_ref = refv(&|r| r.cold_sync_ms);
    row(
        "cold sync: start → every sampled VIP answers",
        runs.iter()
            .map(|r| ms_cell(r.cold_sync_ms, cold_ref))
            .collect(),
        dash(),
    );
    let (ra, rb) = reference.map_or((None, None), |r| {
        (r.service_add.p50_ms, r.service_add.max_ms)
    });
    row(
        "one new Service among N (p50 / max)",
        runs.iter()
            .map(|r| pair_cell(r.service_add.p50_ms, r.service_add.max_ms, ra, rb))
            .collect(),
        dash(),
    );
    let (ra, rb) = reference.map_or((None, None), |r| summary_pair(&r.programming_idle));
    row(
        "endpoint change → traffic, idle (p50 / p99)",
        runs.iter()
            .map(|r| {
                let (a, b) = summary_pair(&r.programming_idle);
                pair_cell(a, b, ra, rb)
            })
            .collect(),
        dash(),
    );
    let (ra, rb) = reference.map_or((None, None), |r| summary_pair(&r.programming_churn));
    row(
        &format!(
            "endpoint change → traffic, under churn of {}/s (p50 / p99)",
            report.config.churn_rate
        ),
        runs.iter()
            .map(|r| {
                let (a, b) = summary_pair(&r.programming_churn);
                format!("{} (n={})", pair_cell(a, b, ra, rb), r.programming_churn.n)
            })
            .collect(),
        dash(),
    );
    let base = baseline.map(|b| summary_pair(&b.connect));
    let (ra, rb) = match reference {
        Some(r) => summary_pair(&r.connect),
        None => base.unwrap_or((None, None)),
    };
    row(
        "TCP connect() through a VIP (p50 / p99)",
        runs.iter()
            .map(|r| {
                let (a, b) = summary_pair(&r.connect);
                pair_cell(a, b, ra, rb)
            })
            .collect(),
        base.map_or(dash(), |(a, b)| pair_cell(a, b, None, None)),
    );
    let cpu_ref = refv(&|r| r.total_cpu_s);
    row(
        "proxy CPU seconds: cold sync / churn / whole run",
        runs.iter()
            .map(|r| {
                with_ratio(
                    format!(
                        "{} / {} / {}",
                        secs(r.cold_sync_cpu_s),
                        secs(r.churn_cpu_s),
                        secs(r.total_cpu_s)
                    ),
                    r.total_cpu_s,
                    cpu_ref,
                )
            })
            .collect(),
        dash(),
    );
    let warm_ref = refv(&|r| r.warm_restart_ms);
    row(
        "warm restart: start → first sync done (rules kept)",
        runs.iter()
            .map(|r| ms_cell(r.warm_restart_ms, warm_ref))
            .collect(),
        dash(),
    );
    row(
        "sampled VIPs right while stopped · after the restart",
        runs.iter()
            .map(|r| match r.warm_restart_vips {
                Some((stopped, after, n)) => format!("{stopped}/{n} · {after}/{n}"),
                None => dash(),
            })
            .collect(),
        dash(),
    );
    let rss_ref = refv(&|r| r.peak_rss_bytes.map(|b| b as f64));
    row(
        "proxy RSS: peak / at the end",
        runs.iter()
            .map(|r| match r.peak_rss_bytes {
                Some(b) => with_ratio(
                    format!(
                        "{} / {}",
                        fmt_mib(b),
                        r.end_rss_bytes.map_or(dash(), fmt_mib)
                    ),
                    Some(b as f64),
                    rss_ref,
                ),
                None => dash(),
            })
            .collect(),
        dash(),
    );
    let anon_ref = refv(&|r| r.peak_rss_anon_bytes.map(|b| b as f64));
    let file_ref = refv(&|r| r.peak_rss_file_bytes.map(|b| b as f64));
    row(
        "proxy RSS peak, sampled: anonymous / file-backed",
        runs.iter()
            .map(|r| match (r.peak_rss_anon_bytes, r.peak_rss_file_bytes) {
                (Some(a), Some(f)) => format!(
                    "{} / {}",
                    with_ratio(fmt_mib(a), Some(a as f64), anon_ref),
                    with_ratio(fmt_mib(f), Some(f as f64), file_ref)
                ),
                _ => dash(),
            })
            .collect(),
        dash(),
    );
    let cr_ref = refv(&|r| r.kernel.as_ref().map(|k| k.chains_and_rules() as f64));
    row(
        "kernel: nft chains + rules (chains / rules)",
        runs.iter()
            .map(|r| match &r.kernel {
                Some(k) => with_ratio(
                    format!("{} ({} / {})", k.chains_and_rules(), k.chains, k.rules),
                    Some(k.chains_and_rules() as f64),
                    cr_ref,
                ),
                None => dash(),
            })
            .collect(),
        dash(),
    );
    row(
        "kernel: set+map elements / eBPF Service map entries",
        runs.iter()
            .map(|r| match &r.kernel {
                Some(k) => format!("{} / {}", k.elements, k.bpf_service_entries()),
                None => dash(),
            })
            .collect(),
        dash(),
    );
    row(
        "conntrack entries from a VIP after the sweep (of all)",
        runs.iter()
            .map(|r| match r.conntrack_after_sweep {
                Some((all, vip)) => format!("{vip} of {all}"),
                None => dash(),
            })
            .collect(),
        dash(),
    );
    row(
        "self-reported: mean sync / mean programming latency",
        runs.iter()
            .map(|r| {
                let s = &r.self_reported;
                format!(
                    "{} ({} syncs) / {}",
                    s.sync_mean_ms.map_or(dash(), fmt_ms),
                    s.syncs.map_or(dash(), |c| format!("{c:.0}")),
                    s.programming_mean_ms.map_or(dash(), fmt_ms)
                )
            })
            .collect(),
        dash(),
    );
    row(
        "churn achieved (writes/s) · API write p50",
        runs.iter()
            .map(|r| {
                format!(
                    "{:.1} · {}",
                    r.churn.achieved_rate,
                    r.api_write.p50_ms.map_or(dash(), fmt_ms)
                )
            })
            .collect(),
        dash(),
    );
    for r in runs {
        for e in &r.errors {
            let _ = writeln!(out, "\n- {}: {}", r.contestant, e.replace('\n', " "));
        }
        for ex in r
            .correct_after_sync
            .examples
            .iter()
            .chain(&r.correct_after_churn.examples)
        {
            let _ = writeln!(out, "\n- {} (wrong VIP): {ex}", r.contestant);
        }
    }
}

/// Renders the report.
pub fn markdown(report: &BenchReport) -> String {
    let c = &report.config;
    let mut out = String::new();
    let _ = writeln!(out, "## keelson-bench results\n");
    let _ = writeln!(out, "- command: `{}`", report.command);
    let _ = writeln!(out, "- started: {}", report.started);
    let _ = writeln!(
        out,
        "- machine: Linux {}, {} CPUs, load at start {}, at the end {}, {}",
        report.machine.kernel,
        report.machine.cpus,
        report.machine.load_at_start,
        report.machine.load_at_end,
        report.machine.nft
    );
    if let Some(kp) = &report.machine.kube_proxy {
        let _ = writeln!(out, "- kube-proxy: {kp}");
    }
    let _ = writeln!(out, "- API server: {}", report.api_server);
    let _ = writeln!(
        out,
        "- scenario: N = {:?} Services × M = {} endpoints (real backends in network namespaces); minSyncPeriod {:?} and API client QPS/burst {} for every contestant; churn {} endpoint changes/s for {:?} with {} probed changes/s; {} Services added one by one; {} idle probed changes; {} timed connections",
        c.services,
        c.endpoints,
        c.min_sync_period,
        match (c.api_qps, c.api_burst) {
            (None, None) => "5/10 (upstream default)".to_string(),
            (q, b) => format!(
                "{}/{}",
                q.map_or("5".to_string(), |q| q.to_string()),
                b.map_or("10".to_string(), |b| b.to_string())
            ),
        },
        c.churn_rate,
        c.churn_duration,
        c.probe_rate,
        c.service_adds,
        c.idle_probes,
        c.latency_samples
    );
    if c.contestants.contains(&ContestantKind::KubeProxyIptables) {
        let backend = if c.iptables_legacy {
            "the legacy iptables backend (`iptables-legacy*` first in its PATH; its rules counted with `iptables-legacy-save`)"
        } else {
            "the host's default `iptables` (Debian: `iptables-nft`, whose rules are nftables objects)"
        };
        let _ = writeln!(out, "- kube-proxy iptables runs on {backend}");
    }
    for &n in &c.services {
        let runs: Vec<&RunResult> = report.runs.iter().filter(|r| r.services == n).collect();
        let baseline = report.baselines.iter().find(|b| b.services == n);
        table(&mut out, n, &runs, baseline, report);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::config::BenchConfig;
    use crate::bench::results::Machine;

    #[test]
    fn units_and_ratios() {
        assert_eq!(fmt_ms(0.0625), "62 µs");
        assert_eq!(fmt_ms(3.25), "3.25 ms");
        assert_eq!(fmt_ms(141.0), "141.0 ms");
        assert_eq!(fmt_ms(65_000.0), "65.00 s");
        assert_eq!(fmt_mib(3 * 1024 * 1024), "3.0 MiB");
        assert_eq!(fmt_ratio(5.0, 141.0).as_deref(), Some("×0.04"));
        assert_eq!(fmt_ratio(1.0, 1000.0).as_deref(), Some("×0.0010"));
        assert_eq!(fmt_ratio(50.0, 2.0).as_deref(), Some("×25"));
        assert_eq!(fmt_ratio(1.0, 0.0), None);
    }

    fn run(kind: ContestantKind, add_ms: f64) -> RunResult {
        let mut r = RunResult::new(kind, 10, 2);
        r.service_add = Summary {
            n: 1,
            p50_ms: Some(add_ms),
            max_ms: Some(add_ms),
            ..Summary::default()
        };
        r.cold_sync_ms = Some(add_ms * 10.0);
        r
    }

    fn report(runs: Vec<RunResult>) -> BenchReport {
        let mut config = BenchConfig::quick("/bin/true".into());
        config.services = vec![10];
        config.endpoints = 2;
        BenchReport {
            command: "keelson-bench --quick".into(),
            started: "now".into(),
            machine: Machine::default(),
            api_server: "test".into(),
            config,
            baselines: vec![Baseline {
                services: 10,
                connect: Summary {
                    n: 1,
                    p50_ms: Some(0.05),
                    p99_ms: Some(0.1),
                    ..Summary::default()
                },
            }],
            runs,
        }
    }

    #[test]
    fn ratios_against_kube_proxy_when_present() {
        let md = markdown(&report(vec![
            run(ContestantKind::KeelsonNftables, 5.0),
            run(ContestantKind::KubeProxyNftables, 141.0),
        ]));
        assert!(md.contains("against kube-proxy nftables"), "{md}");
        assert!(md.contains("5.00 ms (×0.04)"), "{md}");
        assert!(md.contains("| keelson nftables | kube-proxy nftables | no proxy (baseline) |"));
    }

    #[test]
    fn baseline_ratio_for_latency_without_kube_proxy() {
        let mut k = run(ContestantKind::KeelsonEbpf, 5.0);
        k.connect = Summary {
            n: 1,
            p50_ms: Some(0.06),
            p99_ms: Some(0.2),
            ..Summary::default()
        };
        let md = markdown(&report(vec![k]));
        assert!(md.contains("against the no-proxy baseline"), "{md}");
        assert!(md.contains("60 µs (×1.20) / 200 µs (×2.00)"), "{md}");
        assert!(
            md.contains("**NO**"),
            "a run without sweeps is not correct: {md}"
        );
    }
}
