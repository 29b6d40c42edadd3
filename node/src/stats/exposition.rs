//! `/metrics/resource` (kubelet's resource metrics collector,
//! `pkg/kubelet/metrics/collectors/resource_metrics.go`, what
//! metrics-server reads), rendered in the Prometheus text format from a
//! [`Summary`], with the samples' times as timestamps as kubelet writes
//! them; and the text format's value and label writing shared with
//! `/metrics/cadvisor` ([`super::cadvisor`]).

use std::fmt::Write;

use super::types::{CpuStats, MemoryStats, Summary};

fn ms(time: &str) -> Option<i64> {
    let t: jiff::Timestamp = time.parse().ok()?;
    Some(t.as_millisecond())
}

/// A label value escaped for the text format (backslash, quote, newline).
pub(crate) fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

struct Family {
    name: &'static str,
    help: &'static str,
    kind: &'static str,
    lines: Vec<String>,
}

impl Family {
    fn new(name: &'static str, kind: &'static str, help: &'static str) -> Self {
        Family {
            name,
            help,
            kind,
            lines: Vec::new(),
        }
    }

    fn push(&mut self, labels: &[(&str, &str)], value: f64, time: Option<&str>) {
        let mut l = self.name.to_string();
        if !labels.is_empty() {
            l.push('{');
            let parts: Vec<String> = labels
                .iter()
                .map(|(k, v)| format!("{k}=\"{}\"", escape(v)))
                .collect();
            l.push_str(&parts.join(","));
            l.push('}');
        }
        let _ = write!(l, " {}", fmt_value(value));
        if let Some(t) = time.and_then(ms) {
            let _ = write!(l, " {t}");
        }
        self.lines.push(l);
    }

    fn render(&self, out: &mut String) {
        let _ = writeln!(out, "# HELP {} {}", self.name, self.help);
        let _ = writeln!(out, "# TYPE {} {}", self.name, self.kind);
        for l in &self.lines {
            out.push_str(l);
            out.push('\n');
        }
    }
}

/// A sample value as kubelet's exposition writes it (`expfmt`'s
/// `writeFloat`: `strconv.AppendFloat(v, 'g', -1, 64)`): the shortest
/// digits that read back exactly, in exponent form (`1.7e+09`) when the
/// decimal exponent is below -4 or 6 and above.
pub(crate) fn fmt_value(v: f64) -> String {
    if v.is_nan() {
        return "NaN".to_string();
    }
    if v.is_infinite() {
        return if v > 0.0 { "+Inf" } else { "-Inf" }.to_string();
    }
    if v == 0.0 {
        return "0".to_string();
    }
    // Rust's `{:e}` gives the shortest round-trip digits: `d.ddde±x`.
    let e = format!("{v:e}");
    let (mantissa, exp) = e.split_once('e').unwrap_or((&e, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let (neg, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => (true, m),
        None => (false, mantissa),
    };
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let sign = if neg { "-" } else { "" };
    // strconv's `%g` with the shortest precision: `%e` when the
    // exponent is < -4 or >= 6.
    if !(-4..6).contains(&exp) {
        let (first, rest) = digits.split_at(1);
        let frac = if rest.is_empty() {
            String::new()
        } else {
            format!(".{rest}")
        };
        let esign = if exp < 0 { '-' } else { '+' };
        return format!("{sign}{first}{frac}e{esign}{:02}", exp.abs());
    }
    if exp >= 0 {
        let int_len = (exp + 1) as usize;
        if digits.len() <= int_len {
            format!("{sign}{digits}{}", "0".repeat(int_len - digits.len()))
        } else {
            format!("{sign}{}.{}", &digits[..int_len], &digits[int_len..])
        }
    } else {
        format!("{sign}0.{}{digits}", "0".repeat((-exp - 1) as usize))
    }
}

fn cpu_seconds(c: &Option<CpuStats>) -> Option<(f64, &str)> {
    let c = c.as_ref()?;
    Some((c.usage_core_nano_seconds? as f64 / 1e9, c.time.as_str()))
}

fn working_set(m: &Option<MemoryStats>) -> Option<(f64, &str)> {
    let m = m.as_ref()?;
    Some((m.working_set_bytes? as f64, m.time.as_str()))
}

/// `/metrics/resource`; `error` set when the summary could not be had
/// (then only `scrape_error`/`resource_scrape_error` 1 are written).
pub fn resource_metrics(summary: Option<&Summary>) -> String {
    let mut node_cpu = Family::new(
        "node_cpu_usage_seconds_total",
        "counter",
        "[STABLE] Cumulative cpu time consumed by the node in core-seconds",
    );
    let mut node_mem = Family::new(
        "node_memory_working_set_bytes",
        "gauge",
        "[STABLE] Current working set of the node in bytes",
    );
    let mut c_start = Family::new(
        "container_start_time_seconds",
        "gauge",
        "[STABLE] Start time of the container since unix epoch in seconds",
    );
    let mut c_cpu = Family::new(
        "container_cpu_usage_seconds_total",
        "counter",
        "[STABLE] Cumulative cpu time consumed by the container in core-seconds",
    );
    let mut c_mem = Family::new(
        "container_memory_working_set_bytes",
        "gauge",
        "[STABLE] Current working set of the container in bytes",
    );
    let mut p_cpu = Family::new(
        "pod_cpu_usage_seconds_total",
        "counter",
        "[STABLE] Cumulative cpu time consumed by the pod in core-seconds",
    );
    let mut p_mem = Family::new(
        "pod_memory_working_set_bytes",
        "gauge",
        "[STABLE] Current working set of the pod in bytes",
    );
    let mut scrape = Family::new(
        "scrape_error",
        "gauge",
        "[ALPHA] (Deprecated since 1.29.0) 1 if there was an error while getting container metrics, 0 otherwise",
    );
    let mut scrape2 = Family::new(
        "resource_scrape_error",
        "gauge",
        "[STABLE] 1 if there was an error while getting container metrics, 0 otherwise",
    );
    if let Some(s) = summary {
        if let Some((v, t)) = cpu_seconds(&s.node.cpu) {
            node_cpu.push(&[], v, Some(t));
        }
        if let Some((v, t)) = working_set(&s.node.memory) {
            node_mem.push(&[], v, Some(t));
        }
        for p in &s.pods {
            let (pod, ns) = (p.pod_ref.name.as_str(), p.pod_ref.namespace.as_str());
            for c in &p.containers {
                let labels = [
                    ("container", c.name.as_str()),
                    ("namespace", ns),
                    ("pod", pod),
                ];
                if let Some(start) = ms(&c.start_time).filter(|v| *v > 0) {
                    c_start.push(&labels, start as f64 / 1000.0, None);
                }
                if let Some((v, t)) = cpu_seconds(&c.cpu) {
                    c_cpu.push(&labels, v, Some(t));
                }
                if let Some((v, t)) = working_set(&c.memory) {
                    c_mem.push(&labels, v, Some(t));
                }
            }
            let labels = [("namespace", ns), ("pod", pod)];
            if let Some((v, t)) = cpu_seconds(&p.cpu) {
                p_cpu.push(&labels, v, Some(t));
            }
            if let Some((v, t)) = working_set(&p.memory) {
                p_mem.push(&labels, v, Some(t));
            }
        }
    }
    let err = if summary.is_some() { 0.0 } else { 1.0 };
    scrape.push(&[], err, None);
    scrape2.push(&[], err, None);
    let mut out = String::new();
    for f in [
        &c_cpu, &c_mem, &c_start, &node_cpu, &node_mem, &p_cpu, &p_mem, &scrape2, &scrape,
    ] {
        if !f.lines.is_empty() {
            f.render(&mut out);
        }
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::panic)]
mod tests {
    use super::super::types::*;
    use super::*;

    #[test]
    fn resource_metrics_read_as_kubelet() {
        let t = "2024-01-01T00:00:00Z".to_string();
        let s = Summary {
            node: NodeStats {
                cpu: Some(CpuStats {
                    time: t.clone(),
                    usage_nano_cores: None,
                    usage_core_nano_seconds: Some(2_500_000_000),
                }),
                memory: Some(MemoryStats {
                    time: t.clone(),
                    working_set_bytes: Some(1024),
                    ..Default::default()
                }),
                ..Default::default()
            },
            pods: vec![PodStats {
                pod_ref: PodReference {
                    name: "p".into(),
                    namespace: "ns".into(),
                    uid: "u".into(),
                },
                containers: vec![ContainerStats {
                    name: "c".into(),
                    start_time: t.clone(),
                    cpu: Some(CpuStats {
                        time: t.clone(),
                        usage_nano_cores: None,
                        usage_core_nano_seconds: Some(1_000_000_000),
                    }),
                    ..Default::default()
                }],
                ..Default::default()
            }],
        };
        let text = resource_metrics(Some(&s));
        assert!(
            text.contains("node_cpu_usage_seconds_total 2.5 1704067200000\n"),
            "{text}"
        );
        assert!(
            text.contains("node_memory_working_set_bytes 1024 1704067200000\n"),
            "{text}"
        );
        assert!(text.contains(
            "container_cpu_usage_seconds_total{container=\"c\",namespace=\"ns\",pod=\"p\"} 1 1704067200000\n"
        ), "{text}");
        assert!(text.contains("container_start_time_seconds{container=\"c\",namespace=\"ns\",pod=\"p\"} 1.7040672e+09\n"), "{text}");
        assert!(text.contains("resource_scrape_error 0\n"), "{text}");
        assert!(
            text.contains("# TYPE node_cpu_usage_seconds_total counter"),
            "{text}"
        );
        let failed = resource_metrics(None);
        assert!(failed.contains("scrape_error 1\n"), "{failed}");
    }

    #[test]
    fn values_are_written_as_go_writes_them() {
        for (v, want) in [
            (0.0, "0"),
            (-0.0, "0"),
            (1.0, "1"),
            (-1.0, "-1"),
            (2.5, "2.5"),
            (1024.0, "1024"),
            (999_999.0, "999999"),
            (1_000_000.0, "1e+06"),
            (1_704_067_200.0, "1.7040672e+09"),
            (8_342_499_328.0, "8.342499328e+09"),
            (67_108_864.0, "6.7108864e+07"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (0.123_456_789, "0.123456789"),
            (123_456.5, "123456.5"),
            (-3.5e-7, "-3.5e-07"),
            (1e21, "1e+21"),
            (f64::INFINITY, "+Inf"),
            (f64::NEG_INFINITY, "-Inf"),
            (f64::NAN, "NaN"),
        ] {
            assert_eq!(fmt_value(v), want, "{v}");
        }
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(escape("a\\b\"c\nd"), "a\\\\b\\\"c\\nd");
    }
}
