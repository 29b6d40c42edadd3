//! How diagnose words things: upstream's spellings (kubectl describe's
//! probe and container state lines, Go durations, quantities) and relative
//! times.

use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::{ContainerState, Probe};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

/// Go's `time.Duration` text, rounded to seconds (`1m30s`).
pub fn go_duration(d: Duration) -> String {
    keelson_common::gofmt::duration(Duration::from_secs(d.as_secs()))
}

/// "12s ago" / "in 28s" relative to now.
pub fn relative(t: SystemTime) -> String {
    let now = SystemTime::now();
    match t.duration_since(now) {
        Ok(ahead) => format!("in {}", go_duration(ahead)),
        Err(e) => format!("{} ago", go_duration(e.duration())),
    }
}

/// An RFC 3339 string, parsed.
pub fn parse_time(s: &str) -> Option<SystemTime> {
    s.parse::<jiff::Timestamp>().ok().map(SystemTime::from)
}

/// RFC 3339 (UTC, whole seconds).
pub fn rfc3339(t: SystemTime) -> String {
    jiff::Timestamp::try_from(t)
        .map(|ts| ts.round(jiff::Unit::Second).unwrap_or(ts).to_string())
        .unwrap_or_default()
}

/// An API time.
pub fn api_time(t: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time) -> SystemTime {
    SystemTime::from(t.0)
}

/// Bytes in binary units as Kubernetes writes memory (`3.1Gi`, `100Mi`, `512Ki`).
pub fn bytes(n: i64) -> String {
    let neg = n < 0;
    let v = n.unsigned_abs() as f64;
    let units = [
        ("Ti", 1u64 << 40),
        ("Gi", 1 << 30),
        ("Mi", 1 << 20),
        ("Ki", 1 << 10),
    ];
    let text = units
        .iter()
        .find(|(_, size)| v >= *size as f64)
        .map(|(u, size)| {
            let x = v / *size as f64;
            if (x - x.round()).abs() < 0.05 {
                format!("{}{u}", x.round())
            } else {
                format!("{x:.1}{u}")
            }
        })
        .unwrap_or_else(|| format!("{}", n.unsigned_abs()));
    if neg { format!("-{text}") } else { text }
}

fn port_text(p: &IntOrString) -> String {
    match p {
        IntOrString::Int(i) => i.to_string(),
        IntOrString::String(s) => s.clone(),
    }
}

/// kubectl describe's probe line (`DescribeProbe`):
/// `http-get http://:80/healthz delay=0s timeout=1s period=10s #success=1 #failure=3`.
pub fn describe_probe(p: &Probe) -> String {
    let attrs = format!(
        "delay={}s timeout={}s period={}s #success={} #failure={}",
        p.initial_delay_seconds.unwrap_or(0),
        p.timeout_seconds.unwrap_or(1),
        p.period_seconds.unwrap_or(10),
        p.success_threshold.unwrap_or(1),
        p.failure_threshold.unwrap_or(3)
    );
    if let Some(e) = &p.exec {
        return format!(
            "exec [{}] {attrs}",
            e.command.clone().unwrap_or_default().join(" ")
        );
    }
    if let Some(h) = &p.http_get {
        let scheme = h.scheme.as_deref().unwrap_or("HTTP").to_lowercase();
        let host = h.host.clone().unwrap_or_default();
        let port = port_text(&h.port);
        let host_port = if host.contains(':') {
            format!("[{host}]:{port}")
        } else {
            format!("{host}:{port}")
        };
        return format!(
            "http-get {scheme}://{host_port}{} {attrs}",
            h.path.as_deref().unwrap_or_default()
        );
    }
    if let Some(t) = &p.tcp_socket {
        return format!(
            "tcp-socket {}:{} {attrs}",
            t.host.as_deref().unwrap_or_default(),
            port_text(&t.port)
        );
    }
    if let Some(g) = &p.grpc {
        return format!(
            "grpc <pod>:{} {} {attrs}",
            g.port,
            g.service.as_deref().unwrap_or_default()
        );
    }
    format!("unknown {attrs}")
}

/// kubectl describe's container state, on one line:
/// `Terminated (Reason: OOMKilled, Exit Code: 137, Finished: 2025-...)`.
pub fn describe_state(s: &ContainerState) -> String {
    if let Some(r) = &s.running {
        return match &r.started_at {
            Some(t) => format!("Running (Started: {})", rfc3339(api_time(t))),
            None => "Running".to_string(),
        };
    }
    if let Some(w) = &s.waiting {
        return match w.reason.as_deref() {
            Some(r) if !r.is_empty() => format!("Waiting (Reason: {r})"),
            _ => "Waiting".to_string(),
        };
    }
    if let Some(t) = &s.terminated {
        let mut fields = Vec::new();
        if let Some(r) = t.reason.as_deref().filter(|r| !r.is_empty()) {
            fields.push(format!("Reason: {r}"));
        }
        if let Some(m) = t.message.as_deref().filter(|m| !m.is_empty()) {
            fields.push(format!("Message: {}", m.trim()));
        }
        fields.push(format!("Exit Code: {}", t.exit_code));
        if let Some(sig) = t.signal.filter(|s| *s != 0) {
            fields.push(format!("Signal: {sig}"));
        }
        if let Some(st) = &t.started_at {
            fields.push(format!("Started: {}", rfc3339(api_time(st))));
        }
        if let Some(f) = &t.finished_at {
            fields.push(format!("Finished: {}", rfc3339(api_time(f))));
        }
        return format!("Terminated ({})", fields.join(", "));
    }
    "Waiting".to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        ContainerStateTerminated, ContainerStateWaiting, ExecAction, HTTPGetAction,
    };

    #[test]
    fn probes_read_as_kubectl_describe_prints_them() {
        let http = Probe {
            http_get: Some(HTTPGetAction {
                path: Some("/healthz".into()),
                port: IntOrString::Int(80),
                scheme: Some("HTTP".into()),
                ..Default::default()
            }),
            timeout_seconds: Some(1),
            period_seconds: Some(2),
            success_threshold: Some(1),
            failure_threshold: Some(3),
            ..Default::default()
        };
        assert_eq!(
            describe_probe(&http),
            "http-get http://:80/healthz delay=0s timeout=1s period=2s #success=1 #failure=3"
        );
        let exec = Probe {
            exec: Some(ExecAction {
                command: Some(vec!["cat".into(), "/tmp/ready".into()]),
            }),
            ..Default::default()
        };
        assert_eq!(
            describe_probe(&exec),
            "exec [cat /tmp/ready] delay=0s timeout=1s period=10s #success=1 #failure=3"
        );
    }

    #[test]
    fn states_and_quantities() {
        let oom = ContainerState {
            terminated: Some(ContainerStateTerminated {
                exit_code: 137,
                reason: Some("OOMKilled".into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(
            describe_state(&oom),
            "Terminated (Reason: OOMKilled, Exit Code: 137)"
        );
        let waiting = ContainerState {
            waiting: Some(ContainerStateWaiting {
                reason: Some("CrashLoopBackOff".into()),
                message: Some("back-off".into()),
            }),
            ..Default::default()
        };
        assert_eq!(
            describe_state(&waiting),
            "Waiting (Reason: CrashLoopBackOff)"
        );
        assert_eq!(bytes(100 << 20), "100Mi");
        assert_eq!(bytes(3_328_599_654), "3.1Gi");
        assert_eq!(bytes(512), "512");
        assert_eq!(go_duration(Duration::from_millis(90_500)), "1m30s");
    }
}
