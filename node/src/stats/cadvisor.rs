//! `/metrics/cadvisor`: what kubelet v1.36 serves there
//! (`pkg/kubelet/server/server.go` `InstallDefaultHandlers`: cAdvisor's
//! container collector with the metric set `CpuUsageMetrics`,
//! `MemoryUsageMetrics`, `CpuLoadMetrics`, `DiskIOMetrics`,
//! `DiskUsageMetrics`, `NetworkUsageMetrics`, `AppMetrics`,
//! `ProcessMetrics`, `OOMMetrics`, and cAdvisor's machine collector),
//! rendered from a housekeeping round's [`CgroupInfo`]s and [`Machine`]
//! with cAdvisor's names, help texts, types, labels and timestamps
//! (`vendor/github.com/google/cadvisor/metrics/prometheus.go`,
//! `prometheus_machine.go`).
//!
//! Every container series carries kubelet's base labels
//! (`containerPrometheusLabelsFunc`): `container`, `id` (the cgroup),
//! `image`, `name` (the runtime's container ID), `namespace`, `pod`, empty
//! where they do not apply; families and series are ordered as the
//! Prometheus client orders them (by name, then by label values).
//!
//! Families keelson does not produce (disk I/O and filesystem usage, CPU
//! load and task states, `cadvisor_version_info`, NVM, NUMA and DIMM
//! machine figures) are left out, not written as zeros; `docs/metrics.md`
//! lists them.

use std::collections::BTreeMap;
use std::fmt::Write;

use super::cgroup_info::{CgroupInfo, CgroupStats};
use super::exposition::{escape, fmt_value};
use super::machine::Machine;

/// What one housekeeping round read for `/metrics/cadvisor`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CadvisorInfo {
    /// The root, `kubepods` and QoS cgroups, pod cgroups, pod sandboxes
    /// and containers.
    pub cgroups: Vec<CgroupInfo>,
    /// The machine (`None` when it could not be read).
    pub machine: Option<Machine>,
}

/// cAdvisor's `maxMemorySize`: larger limits are "unlimited" and written
/// as 0 (`specMemoryValue`).
const MAX_MEMORY_SIZE: u64 = 1 << 62;

fn spec_memory(v: u64) -> f64 {
    if v > MAX_MEMORY_SIZE { 0.0 } else { v as f64 }
}

/// One series.
struct Series {
    /// Label pairs, sorted by name.
    labels: Vec<(&'static str, String)>,
    value: f64,
    timestamp_ms: Option<i64>,
}

/// One family.
struct Family {
    help: &'static str,
    kind: &'static str,
    series: Vec<Series>,
}

/// The families of one scrape, by name.
#[derive(Default)]
struct Families(BTreeMap<&'static str, Family>);

impl Families {
    fn push(
        &mut self,
        name: &'static str,
        kind: &'static str,
        help: &'static str,
        mut labels: Vec<(&'static str, String)>,
        value: f64,
        timestamp_ms: Option<i64>,
    ) {
        labels.sort_by(|a, b| a.0.cmp(b.0));
        self.0
            .entry(name)
            .or_insert_with(|| Family {
                help,
                kind,
                series: Vec::new(),
            })
            .series
            .push(Series {
                labels,
                value,
                timestamp_ms,
            });
    }

    fn render(mut self) -> String {
        let mut out = String::new();
        for (name, f) in &mut self.0 {
            // client_golang orders a family's metrics by their label
            // values (labels sorted by name), then by timestamp.
            f.series.sort_by(|a, b| {
                a.labels
                    .iter()
                    .map(|l| &l.1)
                    .cmp(b.labels.iter().map(|l| &l.1))
                    .then(a.timestamp_ms.cmp(&b.timestamp_ms))
            });
            let _ = writeln!(out, "# HELP {name} {}", f.help);
            let _ = writeln!(out, "# TYPE {name} {}", f.kind);
            for s in &f.series {
                out.push_str(name);
                if !s.labels.is_empty() {
                    out.push('{');
                    for (i, (k, v)) in s.labels.iter().enumerate() {
                        if i > 0 {
                            out.push(',');
                        }
                        let _ = write!(out, "{k}=\"{}\"", escape(v));
                    }
                    out.push('}');
                }
                let _ = write!(out, " {}", fmt_value(s.value));
                if let Some(t) = s.timestamp_ms {
                    let _ = write!(out, " {t}");
                }
                out.push('\n');
            }
        }
        out
    }
}

const GAUGE: &str = "gauge";
const COUNTER: &str = "counter";

/// The container families of one cgroup (cAdvisor's `containerMetrics`
/// for kubelet's metric set, in its order).
fn container_families(f: &mut Families, c: &CgroupInfo, now_ms: i64) {
    let r = &c.reference;
    let base = || -> Vec<(&'static str, String)> {
        vec![
            ("container", r.container.clone()),
            ("id", r.id.clone()),
            ("image", r.image.clone()),
            ("name", r.name.clone()),
            ("namespace", r.namespace.clone()),
            ("pod", r.pod.clone()),
        ]
    };
    let with = |extra: &[(&'static str, &str)]| {
        let mut l = base();
        l.extend(extra.iter().map(|(k, v)| (*k, v.to_string())));
        l
    };
    // The spec: no timestamps.
    if let Some(t) = c.spec.creation_time {
        f.push(
            "container_start_time_seconds",
            GAUGE,
            "Start time of the container since unix epoch in seconds.",
            base(),
            t as f64,
            None,
        );
    }
    if let Some(cpu) = c.spec.cpu {
        f.push(
            "container_spec_cpu_period",
            GAUGE,
            "CPU period of the container.",
            base(),
            cpu.period as f64,
            None,
        );
        if cpu.quota != 0 {
            f.push(
                "container_spec_cpu_quota",
                GAUGE,
                "CPU quota of the container.",
                base(),
                cpu.quota as f64,
                None,
            );
        }
        f.push(
            "container_spec_cpu_shares",
            GAUGE,
            "CPU share of the container.",
            base(),
            cpu.shares as f64,
            None,
        );
    }
    if let Some(m) = c.spec.memory {
        f.push(
            "container_spec_memory_limit_bytes",
            GAUGE,
            "Memory limit for the container.",
            base(),
            spec_memory(m.limit),
            None,
        );
        f.push(
            "container_spec_memory_swap_limit_bytes",
            GAUGE,
            "Memory swap limit for the container.",
            base(),
            spec_memory(m.swap_limit),
            None,
        );
        f.push(
            "container_spec_memory_reservation_limit_bytes",
            GAUGE,
            "Memory reservation limit for the container.",
            base(),
            spec_memory(m.reservation),
            None,
        );
    }
    let s: &CgroupStats = &c.stats;
    let ts = Some(s.timestamp_ms);
    // `container_last_seen` is the scrape's time, as cAdvisor's `now`.
    f.push(
        "container_last_seen",
        GAUGE,
        "Last time a container was seen by the exporter",
        base(),
        (now_ms / 1000) as f64,
        Some(now_ms),
    );
    // Docker health checks: CRI containers have none, which cAdvisor
    // writes as -1.
    f.push(
        "container_health_state",
        GAUGE,
        "The result of the container's health check",
        base(),
        -1.0,
        ts,
    );
    // CpuUsageMetrics (kubelet's set has no per-CPU usage: `cpu="total"`).
    f.push(
        "container_cpu_user_seconds_total",
        COUNTER,
        "Cumulative user cpu time consumed in seconds.",
        base(),
        s.cpu.user as f64 / 1e9,
        ts,
    );
    f.push(
        "container_cpu_system_seconds_total",
        COUNTER,
        "Cumulative system cpu time consumed in seconds.",
        base(),
        s.cpu.system as f64 / 1e9,
        ts,
    );
    if s.cpu.total > 0 {
        f.push(
            "container_cpu_usage_seconds_total",
            COUNTER,
            "Cumulative cpu time consumed in seconds.",
            with(&[("cpu", "total")]),
            s.cpu.total as f64 / 1e9,
            ts,
        );
    }
    if c.spec.cpu.is_some_and(|cpu| cpu.quota != 0) {
        f.push(
            "container_cpu_cfs_periods_total",
            COUNTER,
            "Number of elapsed enforcement period intervals.",
            base(),
            s.cpu.periods as f64,
            ts,
        );
        f.push(
            "container_cpu_cfs_throttled_periods_total",
            COUNTER,
            "Number of throttled period intervals.",
            base(),
            s.cpu.throttled_periods as f64,
            ts,
        );
        f.push(
            "container_cpu_cfs_throttled_seconds_total",
            COUNTER,
            "Total time duration the container has been throttled.",
            base(),
            s.cpu.throttled_time as f64 / 1e9,
            ts,
        );
        f.push(
            "container_cpu_cfs_burst_periods_total",
            COUNTER,
            "Number of periods when burst occurs.",
            base(),
            s.cpu.burst_periods as f64,
            ts,
        );
        f.push(
            "container_cpu_cfs_burst_seconds_total",
            COUNTER,
            "Total time duration the container has been bursted.",
            base(),
            s.cpu.burst_time as f64 / 1e9,
            ts,
        );
    }
    // MemoryUsageMetrics.
    let m = &s.memory;
    let mut g = |name: &'static str, kind: &'static str, help: &'static str, v: u64| {
        f.push(name, kind, help, base(), v as f64, ts);
    };
    g(
        "container_memory_cache",
        GAUGE,
        "Number of bytes of page cache memory.",
        m.cache,
    );
    g(
        "container_memory_rss",
        GAUGE,
        "Size of RSS in bytes.",
        m.rss,
    );
    g(
        "container_memory_kernel_usage",
        GAUGE,
        "Size of kernel memory allocated in bytes.",
        m.kernel,
    );
    g(
        "container_memory_mapped_file",
        GAUGE,
        "Size of memory mapped files in bytes.",
        m.mapped_file,
    );
    g(
        "container_memory_swap",
        GAUGE,
        "Container swap usage in bytes.",
        m.swap,
    );
    g(
        "container_memory_failcnt",
        COUNTER,
        "Number of memory usage hits limits",
        m.failcnt,
    );
    g(
        "container_memory_usage_bytes",
        GAUGE,
        "Current memory usage in bytes, including all memory regardless of when it was accessed",
        m.usage,
    );
    g(
        "container_memory_max_usage_bytes",
        GAUGE,
        "Maximum memory usage recorded in bytes",
        m.max_usage,
    );
    g(
        "container_memory_working_set_bytes",
        GAUGE,
        "Current working set in bytes.",
        m.working_set,
    );
    g(
        "container_memory_total_active_file_bytes",
        GAUGE,
        "Current total active file in bytes.",
        m.active_file,
    );
    g(
        "container_memory_total_inactive_file_bytes",
        GAUGE,
        "Current total inactive file in bytes.",
        m.inactive_file,
    );
    for (kind, scope, v) in [
        ("pgfault", "container", m.pgfault),
        ("pgmajfault", "container", m.pgmajfault),
        ("pgfault", "hierarchy", m.pgfault),
        ("pgmajfault", "hierarchy", m.pgmajfault),
    ] {
        f.push(
            "container_memory_failures_total",
            COUNTER,
            "Cumulative count of memory allocation failures.",
            with(&[("failure_type", kind), ("scope", scope)]),
            v as f64,
            ts,
        );
    }
    // NetworkUsageMetrics: the cgroups with a network namespace of their
    // own (the root, pod sandboxes).
    type Counter = fn(&super::cgroup_info::InterfaceUsage) -> u64;
    let net: [(&'static str, &'static str, Counter); 8] = [
        (
            "container_network_receive_bytes_total",
            "Cumulative count of bytes received",
            |i| i.rx_bytes,
        ),
        (
            "container_network_receive_packets_total",
            "Cumulative count of packets received",
            |i| i.rx_packets,
        ),
        (
            "container_network_receive_packets_dropped_total",
            "Cumulative count of packets dropped while receiving",
            |i| i.rx_dropped,
        ),
        (
            "container_network_receive_errors_total",
            "Cumulative count of errors encountered while receiving",
            |i| i.rx_errors,
        ),
        (
            "container_network_transmit_bytes_total",
            "Cumulative count of bytes transmitted",
            |i| i.tx_bytes,
        ),
        (
            "container_network_transmit_packets_total",
            "Cumulative count of packets transmitted",
            |i| i.tx_packets,
        ),
        (
            "container_network_transmit_packets_dropped_total",
            "Cumulative count of packets dropped while transmitting",
            |i| i.tx_dropped,
        ),
        (
            "container_network_transmit_errors_total",
            "Cumulative count of errors encountered while transmitting",
            |i| i.tx_errors,
        ),
    ];
    for (name, help, get) in net {
        for i in &s.network {
            f.push(
                name,
                COUNTER,
                help,
                with(&[("interface", &i.name)]),
                get(i) as f64,
                ts,
            );
        }
    }
    // ProcessMetrics.
    let p = &s.processes;
    let mut g = |name: &'static str, help: &'static str, v: u64| {
        f.push(name, GAUGE, help, base(), v as f64, ts);
    };
    g(
        "container_processes",
        "Number of processes running inside the container.",
        p.processes,
    );
    g(
        "container_file_descriptors",
        "Number of open file descriptors for the container.",
        p.fds,
    );
    g(
        "container_sockets",
        "Number of open sockets for the container.",
        p.sockets,
    );
    g(
        "container_threads_max",
        "Maximum number of threads allowed inside the container, infinity if value is zero",
        p.threads_max,
    );
    g(
        "container_threads",
        "Number of threads running inside the container",
        p.threads,
    );
    if let Some(v) = p.max_open_files {
        f.push(
            "container_ulimits_soft",
            GAUGE,
            "Soft ulimit values for the container root process. Unlimited if -1, except priority and nice",
            with(&[("ulimit", "max_open_files")]),
            v as f64,
            ts,
        );
    }
    // OOMMetrics.
    if let Some(v) = s.oom_events {
        f.push(
            "container_oom_events_total",
            COUNTER,
            "Count of out of memory events observed for the container",
            base(),
            v as f64,
            ts,
        );
    }
}

/// The machine collector's families (`prometheus_machine.go`), labelled
/// `boot_id`, `machine_id`, `system_uuid`.
fn machine_families(f: &mut Families, m: &Machine) {
    let labels = || {
        vec![
            ("boot_id", m.info.boot_id.clone()),
            ("machine_id", m.info.machine_id.clone()),
            ("system_uuid", m.info.system_uuid.clone()),
        ]
    };
    let ts = Some(m.timestamp_ms);
    for (name, help, v) in [
        (
            "machine_cpu_physical_cores",
            "Number of physical CPU cores.",
            m.physical_cores,
        ),
        (
            "machine_cpu_cores",
            "Number of logical CPU cores.",
            m.info.num_cores,
        ),
        ("machine_cpu_sockets", "Number of CPU sockets.", m.sockets),
        ("machine_cpu_books", "Number of CPU books.", m.books),
        ("machine_cpu_drawers", "Number of CPU drawers.", m.drawers),
        (
            "machine_memory_bytes",
            "Amount of memory installed on the machine.",
            m.info.memory_capacity,
        ),
        (
            "machine_swap_bytes",
            "Amount of swap memory available on the machine.",
            m.info.swap_capacity,
        ),
    ] {
        f.push(name, GAUGE, help, labels(), v as f64, ts);
    }
}

/// The whole `/metrics/cadvisor` text of a round: its cgroups and the
/// machine (`None`: the round failed, then only the scrape error gauges,
/// at 1, are written, as kubelet's collectors do when cAdvisor fails).
/// `now_ms` is the scrape's time (`container_last_seen`).
pub fn cadvisor_metrics(round: Option<&CadvisorInfo>, now_ms: i64) -> String {
    let mut f = Families::default();
    let (containers_ok, machine_ok) = match round {
        Some(r) => {
            for c in &r.cgroups {
                container_families(&mut f, c, now_ms);
            }
            if let Some(m) = &r.machine {
                machine_families(&mut f, m);
            }
            (true, r.machine.is_some())
        }
        None => (false, false),
    };
    f.push(
        "container_scrape_error",
        GAUGE,
        "1 if there was an error while getting container metrics, 0 otherwise",
        Vec::new(),
        if containers_ok { 0.0 } else { 1.0 },
        None,
    );
    f.push(
        "machine_scrape_error",
        GAUGE,
        "1 if there was an error while getting machine metrics, 0 otherwise.",
        Vec::new(),
        if machine_ok { 0.0 } else { 1.0 },
        None,
    );
    f.render()
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::panic)]
mod tests {
    use super::super::cgroup_info::*;
    use super::*;
    use crate::status::host::MachineInfo;

    fn container() -> CgroupInfo {
        CgroupInfo {
            reference: CgroupRef {
                id: "/kubepods/burstable/pod1/abc".into(),
                name: "abc".into(),
                image: "docker.io/library/busybox:1.36".into(),
                pod: "p\"1".into(),
                namespace: "ns".into(),
                container: "main".into(),
            },
            spec: CgroupSpec {
                creation_time: Some(1_700_000_000),
                cpu: Some(CpuSpec {
                    shares: 2,
                    period: 100_000,
                    quota: 50_000,
                }),
                memory: Some(MemorySpec {
                    limit: 64 << 20,
                    swap_limit: u64::MAX,
                    reservation: 0,
                }),
            },
            stats: CgroupStats {
                timestamp_ms: 1_700_000_100_000,
                cpu: CpuUsage {
                    total: 2_500_000_000,
                    user: 2_000_000_000,
                    system: 500_000_000,
                    ..Default::default()
                },
                memory: MemoryUsage {
                    usage: 4096,
                    working_set: 1024,
                    ..Default::default()
                },
                processes: ProcessUsage {
                    processes: 1,
                    max_open_files: Some(1024),
                    ..Default::default()
                },
                oom_events: Some(0),
                ..Default::default()
            },
        }
    }

    fn machine() -> Machine {
        Machine {
            info: MachineInfo {
                num_cores: 4,
                memory_capacity: 8_342_499_328,
                hugepages: Vec::new(),
                machine_id: "m".into(),
                system_uuid: "u".into(),
                boot_id: "b".into(),
                swap_capacity: 0,
            },
            physical_cores: 2,
            sockets: 1,
            books: 0,
            drawers: 0,
            timestamp_ms: 1_700_000_000_000,
        }
    }

    #[test]
    fn writes_cadvisors_families_labels_and_timestamps() {
        let c = container();
        let text = cadvisor_metrics(
            Some(&CadvisorInfo {
                cgroups: vec![c],
                machine: Some(machine()),
            }),
            1_700_000_200_123,
        );
        let labels = "container=\"main\",id=\"/kubepods/burstable/pod1/abc\",image=\"docker.io/library/busybox:1.36\",name=\"abc\",namespace=\"ns\",pod=\"p\\\"1\"";
        for want in [
            "# HELP container_cpu_usage_seconds_total Cumulative cpu time consumed in seconds.\n# TYPE container_cpu_usage_seconds_total counter\n".to_string(),
            "container_cpu_usage_seconds_total{container=\"main\",cpu=\"total\",id=\"/kubepods/burstable/pod1/abc\",image=\"docker.io/library/busybox:1.36\",name=\"abc\",namespace=\"ns\",pod=\"p\\\"1\"} 2.5 1700000100000\n".to_string(),
            format!("container_memory_working_set_bytes{{{labels}}} 1024 1700000100000\n"),
            format!("container_spec_memory_limit_bytes{{{labels}}} 6.7108864e+07\n"),
            format!("container_spec_memory_swap_limit_bytes{{{labels}}} 0\n"),
            format!("container_spec_cpu_quota{{{labels}}} 50000\n"),
            format!("container_start_time_seconds{{{labels}}} 1.7e+09\n"),
            format!("container_last_seen{{{labels}}} 1.7000002e+09 1700000200123\n"),
            format!("container_ulimits_soft{{{labels},ulimit=\"max_open_files\"}} 1024 1700000100000\n"),
            "container_memory_failures_total{container=\"main\",failure_type=\"pgfault\",id=\"/kubepods/burstable/pod1/abc\",image=\"docker.io/library/busybox:1.36\",name=\"abc\",namespace=\"ns\",pod=\"p\\\"1\",scope=\"container\"} 0 1700000100000\n".to_string(),
            format!("container_cpu_cfs_periods_total{{{labels}}} 0 1700000100000\n"),
            "machine_memory_bytes{boot_id=\"b\",machine_id=\"m\",system_uuid=\"u\"} 8.342499328e+09 1700000000000\n".to_string(),
            "# TYPE machine_cpu_cores gauge\n".to_string(),
            "container_scrape_error 0\n".to_string(),
            "machine_scrape_error 0\n".to_string(),
        ] {
            assert!(text.contains(&want), "missing {want:?} in:\n{text}");
        }
        // No network namespace of its own: no network families.
        assert!(!text.contains("container_network_"), "{text}");
        // Families in name order, each with its HELP and TYPE once.
        let names: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .map(|l| l.split(' ').next().unwrap())
            .collect();
        let mut sorted = names.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(names, sorted);
    }

    #[test]
    fn a_sandbox_has_its_interfaces_and_a_cgroup_without_quota_no_cfs() {
        let mut c = container();
        c.spec.cpu = Some(CpuSpec {
            shares: 2,
            period: 100_000,
            quota: 0,
        });
        c.stats.cpu.total = 0;
        c.stats.network = vec![InterfaceUsage {
            name: "eth0".into(),
            rx_bytes: 42,
            ..Default::default()
        }];
        let text = cadvisor_metrics(
            Some(&CadvisorInfo {
                cgroups: vec![c],
                machine: None,
            }),
            0,
        );
        assert!(
            text.contains("interface=\"eth0\",name=\"abc\",namespace=\"ns\",pod=\"p\\\"1\"} 42 "),
            "{text}"
        );
        assert!(!text.contains("container_cpu_cfs_"), "{text}");
        assert!(!text.contains("container_spec_cpu_quota"), "{text}");
        // No CPU time yet: no usage series (cAdvisor writes none at 0).
        assert!(
            !text.contains("container_cpu_usage_seconds_total{"),
            "{text}"
        );
        assert!(text.contains("machine_scrape_error 1\n"), "{text}");
    }

    #[test]
    fn a_failed_round_writes_the_scrape_errors() {
        let text = cadvisor_metrics(None, 0);
        assert_eq!(
            text,
            "# HELP container_scrape_error 1 if there was an error while getting container metrics, 0 otherwise\n# TYPE container_scrape_error gauge\ncontainer_scrape_error 1\n# HELP machine_scrape_error 1 if there was an error while getting machine metrics, 0 otherwise.\n# TYPE machine_scrape_error gauge\nmachine_scrape_error 1\n"
        );
    }

    #[test]
    fn series_sort_by_label_values() {
        let mut a = container();
        a.reference.id = "/b".into();
        let mut b = container();
        b.reference.id = "/a".into();
        let text = cadvisor_metrics(
            Some(&CadvisorInfo {
                cgroups: vec![a, b],
                machine: None,
            }),
            0,
        );
        let ids: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("container_memory_rss{"))
            .map(|l| l.split("id=\"").nth(1).unwrap().split('"').next().unwrap())
            .collect();
        assert_eq!(ids, ["/a", "/b"]);
    }
}
