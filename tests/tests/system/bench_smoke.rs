//! Smoke test of the benchmark: `keelson-bench --quick` runs every keelson
//! contestant, `keelson` and the proxy-only `keelson-proxy` (and kube-proxy when `KEELSON_BENCH_KUBE_PROXY` names a
//! binary) on a few dozen Services and must find that each one programmed
//! the scenario correctly: every VIP lands on its own endpoints, every
//! endpoint answers, after the cold sync and again after the churn, and
//! every timed change was seen; the sampled VIPs still answer while the
//! proxy is stopped and after it restarts. A behaviour check only: no timing is
//! asserted (the figures are the benchmark's business).

use std::process::Command;

use keelson_tests::bench::{BenchReport, ContestantKind};
use keelson_tests::node_harness::keelson_bin;
use keelson_tests::support::require_root;

#[test]
fn quick_bench_programs_every_contestant_correctly() {
    if !require_root("quick_bench_programs_every_contestant_correctly") {
        return;
    }
    let keelson = keelson_bin().expect("keelson binary (cargo build -p keelson)");
    let keelson_proxy = keelson.with_file_name("keelson-proxy");
    assert!(
        keelson_proxy.is_file(),
        "{} missing: cargo build -p keelson --bins",
        keelson_proxy.display()
    );
    let out = tempfile::tempdir().expect("output dir");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_keelson-bench"));
    cmd.arg("--quick")
        .arg("--keelson")
        .arg(&keelson)
        .arg("--keelson-proxy")
        .arg(&keelson_proxy)
        .arg("--out")
        .arg(out.path());
    let kube_proxy = std::env::var_os("KEELSON_BENCH_KUBE_PROXY");
    if let Some(kp) = &kube_proxy {
        cmd.arg("--kube-proxy").arg(kp);
    }
    let status = cmd.status().expect("running keelson-bench");

    let text = std::fs::read_to_string(out.path().join("results.json"))
        .unwrap_or_else(|e| panic!("keelson-bench ({status}) wrote no results.json: {e}"));
    let report: BenchReport = serde_json::from_str(&text).expect("results.json");
    let mut expected = vec![
        ContestantKind::KeelsonNftables,
        ContestantKind::KeelsonEbpf,
        ContestantKind::KeelsonProxyNftables,
        ContestantKind::KeelsonProxyEbpf,
    ];
    if kube_proxy.is_some() {
        expected.extend([
            ContestantKind::KubeProxyNftables,
            ContestantKind::KubeProxyIptables,
        ]);
    }
    let ran: Vec<ContestantKind> = report.runs.iter().map(|r| r.contestant).collect();
    assert_eq!(ran, expected, "every contestant ran once");
    for r in &report.runs {
        assert!(
            r.programmed_correctly(),
            "{} did not program the scenario correctly: after sync {:?}, after churn {:?}, errors {:?}",
            r.contestant,
            r.correct_after_sync,
            r.correct_after_churn,
            r.errors
        );
        assert_eq!(r.correct_after_sync.checked, r.services);
        // The memory split was sampled: heap and mapped text both resident.
        let (anon, file, peak) = (
            r.peak_rss_anon_bytes.unwrap_or(0),
            r.peak_rss_file_bytes.unwrap_or(0),
            r.peak_rss_bytes.unwrap_or(0),
        );
        assert!(
            anon > 0 && file > 0 && anon.max(file) <= peak,
            "{}: anonymous {anon} / file-backed {file} of peak {peak}",
            r.contestant
        );
        assert!(
            r.connect.n > 0,
            "{}: no connection through a VIP was timed",
            r.contestant
        );
        assert_eq!(
            r.service_add.n, report.config.service_adds,
            "{}",
            r.contestant
        );
        assert_eq!(
            r.programming_idle.n, report.config.idle_probes,
            "{}",
            r.contestant
        );
        assert!(
            r.programming_churn.n > 0,
            "{}: no change probed under churn",
            r.contestant
        );
        // Rules (and pinned eBPF programs) outlive the process, and the
        // restarted one adopts them.
        assert!(
            r.warm_restart_ms.is_some(),
            "{}: warm restart",
            r.contestant
        );
        let (stopped, after, sampled) = r.warm_restart_vips.expect("warm restart sampled");
        assert!(sampled > 0, "{}: no VIP sampled", r.contestant);
        assert_eq!(
            (stopped, after),
            (sampled, sampled),
            "{}: sampled VIPs right while stopped and after the restart",
            r.contestant
        );
    }
    // eBPF mode balances at the socket: the VIP never reaches netfilter,
    // so no conntrack entry has a Service address as its destination.
    let ebpf = report
        .runs
        .iter()
        .find(|r| r.contestant == ContestantKind::KeelsonEbpf)
        .expect("eBPF run");
    let (all, from_vip) = ebpf.conntrack_after_sweep.expect("conntrack read");
    assert_eq!(
        from_vip, 0,
        "eBPF run: {from_vip} of {all} flows were NATed by netfilter"
    );
    let nft = report
        .runs
        .iter()
        .find(|r| r.contestant == ContestantKind::KeelsonNftables)
        .expect("nftables run");
    let (_, nat_from_vip) = nft.conntrack_after_sweep.expect("conntrack read");
    assert!(
        nat_from_vip > 0,
        "nftables run: the sweep's flows are NATed from VIPs"
    );
    assert!(status.success(), "keelson-bench exited with {status}");
    for f in ["report.md", "latency.svg", "latency.png"] {
        assert!(out.path().join(f).is_file(), "{f} written");
    }
}
