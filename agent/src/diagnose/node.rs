//! `keelson diagnose node`: the chain behind the node's Ready condition —
//! the runtime and its network (CNI), the PLEG, resource pressure against
//! the eviction thresholds, the API server and the Lease, the client
//! certificate, the clock and the cgroup driver — each with what
//! `kubectl describe node` shows because of it.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use keelson_cri::api;

use super::api::Lookup;
use super::certificate::{self, Credential};
use super::context::Context;
use super::history::{self, Subject};
use super::report::{Link, Mark, Part, Report, Target};
use super::runtime::RuntimeError;
use super::thresholds;
use super::words;
use crate::config::CgroupDriver;
use crate::introspection::types::{ApiCallStats, NodeState};
use crate::node::cgroups::driver;
use crate::node::eviction::signals;
use crate::node::status::conditions::aggregate;

/// Clock skew beyond which diagnose warns.
const SKEW_WARN: Duration = Duration::from_secs(5);
/// A certificate this close to its end is a warning.
const CERT_WARN: Duration = Duration::from_secs(7 * 24 * 3600);

struct RuntimeFacts {
    version: Result<api::VersionResponse, RuntimeError>,
    status: Result<api::StatusResponse, RuntimeError>,
    driver: driver::RuntimeDriver,
}

/// Diagnoses this node.
pub async fn diagnose(ctx: &Context) -> Report {
    let daemon_node = match ctx.daemon() {
        Some(d) => d.node().await.ok(),
        None => None,
    };
    let runtime = match &ctx.cri {
        Some(cri) => {
            let status = cri.status_verbose(true).await.map_err(RuntimeError::from);
            RuntimeFacts {
                version: cri.version().await.map_err(RuntimeError::from),
                driver: if status.is_ok() {
                    driver::runtime_driver(cri).await
                } else {
                    driver::RuntimeDriver::Unknown
                },
                status,
            }
        }
        None => RuntimeFacts {
            version: Err(RuntimeError::NotConfigured),
            status: Err(RuntimeError::NotConfigured),
            driver: driver::RuntimeDriver::Unknown,
        },
    };
    let api_link = api_server(ctx, daemon_node.as_ref()).await;
    let node_obj = match &ctx.api {
        Some(api) => api.get_cluster::<Node>(&ctx.node, "the Node").await,
        None => Lookup::Failed(ctx.api_error.clone().unwrap_or_default()),
    };
    let links = vec![
        runtime_link(ctx, &runtime, daemon_node.as_ref()),
        cni_link(&runtime),
        pressure_link(ctx, node_obj.clone().found().as_ref()).await,
        api_link,
        lease_link(ctx, daemon_node.as_ref()).await,
        certificate_link(ctx),
        clock_link(ctx).await,
        cgroup_driver_link(ctx, &runtime),
        node_ready_link(ctx, &node_obj, daemon_node.as_ref()),
    ];
    let mut report = ctx.report(
        Target {
            kind: "Node".into(),
            namespace: None,
            name: ctx.node.clone(),
            port: None,
        },
        links,
    );
    if let Some(since) = ctx.since {
        let recs = history::gather(
            ctx,
            &Subject {
                kind: "Node",
                namespace: None,
                name: &ctx.node,
                uid: None,
            },
        )
        .await;
        let mut lease = match ctx.daemon() {
            Some(d) => d
                .timeline(
                    "Lease",
                    Some("kube-node-lease"),
                    &ctx.node,
                    "1970-01-01T00:00:00Z",
                )
                .await
                .unwrap_or_default(),
            None => Vec::new(),
        };
        lease.extend(recs);
        history::sort(&mut lease);
        report.timeline = Some(history::since(&lease, since));
    }
    report
}

fn describe_ready_message(errors: &[String]) -> String {
    match aggregate(errors) {
        Some(m) => format!("kubectl describe node shows: Ready False, KubeletNotReady, {m}"),
        None => {
            "kubectl describe node shows: Ready True, KubeletReady, kubelet is posting ready status"
                .to_string()
        }
    }
}

fn condition_text(c: &api::RuntimeCondition) -> String {
    if c.status {
        format!("{}=true", c.r#type)
    } else {
        format!(
            "{}=false reason:{} message:{}",
            c.r#type, c.reason, c.message
        )
    }
}

fn runtime_link(ctx: &Context, rt: &RuntimeFacts, daemon: Option<&NodeState>) -> Link {
    const T: &str = "Container runtime";
    let endpoint = &ctx.config.node.container_runtime_endpoint;
    let mut evidence = Vec::new();
    if let Some(d) = daemon.filter(|d| d.node_role) {
        let mut errors = d.runtime_errors.clone();
        errors.extend(d.network_errors.iter().cloned());
        evidence.push(describe_ready_message(&errors));
        if let Some(p) = &d.pleg_error {
            evidence.push(format!("PLEG is not healthy: {p}"));
        }
    }
    let mut link = match (&rt.version, &rt.status) {
        (Ok(v), Ok(s)) => {
            let conds: Vec<String> = s
                .status
                .iter()
                .flat_map(|s| s.conditions.iter())
                .map(condition_text)
                .collect();
            let runtime_ready = s
                .status
                .iter()
                .flat_map(|s| s.conditions.iter())
                .any(|c| c.r#type == "RuntimeReady" && c.status);
            let mark = if runtime_ready {
                Mark::Ok
            } else {
                Mark::Failed
            };
            Link::new(
                "runtime",
                T,
                mark,
                format!(
                    "{} {} (CRI {}) on {endpoint}: {}",
                    v.runtime_name,
                    v.runtime_version,
                    v.runtime_api_version,
                    conds.join(", ")
                ),
            )
        }
        (Err(e), _) | (_, Err(e)) => {
            let mut l = Link::new(
                "runtime",
                T,
                Mark::Failed,
                format!("the container runtime does not answer on {endpoint}: {e}"),
            )
            .with_next("start the runtime (systemctl status containerd; journalctl -u containerd)");
            if daemon.is_some_and(|d| d.node_role && d.runtime_errors.is_empty()) {
                l.evidence.push(
                    "the node is still Ready: kubelet (and keelson) report \"container runtime is down\" once the runtime has not answered for 30s".to_string(),
                );
            }
            l
        }
    };
    if daemon.is_some_and(|d| d.pleg_error.is_some()) {
        link.status = Mark::Failed;
        link.summary = format!("{} — PLEG is not healthy", link.summary);
    }
    link.evidence.extend(evidence);
    link
}

fn cni_link(rt: &RuntimeFacts) -> Link {
    const T: &str = "Pod network (CNI)";
    let Ok(s) = &rt.status else {
        return Link::new("cni", T, Mark::NotReached, "not reached");
    };
    let net = s
        .status
        .iter()
        .flat_map(|s| s.conditions.iter())
        .find(|c| c.r#type == "NetworkReady");
    let mut evidence = Vec::new();
    if let Some(raw) = s.info.get("cniconfig")
        && let Ok(v) = serde_json::from_str::<serde_json::Value>(raw)
    {
        let dir = v
            .get("PluginConfDir")
            .and_then(|d| d.as_str())
            .unwrap_or_default();
        let nets: Vec<String> = v
            .get("Networks")
            .and_then(|n| n.as_array())
            .into_iter()
            .flatten()
            .filter_map(|n| {
                let cfg = n.get("Config")?;
                let name = cfg.get("Name")?.as_str()?;
                let types: Vec<&str> = cfg
                    .get("Plugins")
                    .and_then(|p| p.as_array())
                    .into_iter()
                    .flatten()
                    .filter_map(|p| p.get("Network")?.get("type")?.as_str())
                    .collect();
                Some(format!("{name} ({})", types.join(", ")))
            })
            .collect();
        evidence.push(format!(
            "CNI config in {dir}: {}",
            if nets.is_empty() {
                "none loaded".to_string()
            } else {
                nets.join("; ")
            }
        ));
    }
    if let Some(last) = s.info.get("lastCNILoadStatus")
        && last != "OK"
    {
        evidence.push(format!("last CNI config load: {last}"));
    }
    match net {
        Some(c) if c.status => {
            Link::new("cni", T, Mark::Ok, "NetworkReady=true").with_evidence(evidence)
        }
        Some(c) => Link::new("cni", T, Mark::Failed, condition_text(c))
            .with_evidence(evidence)
            .with_next("the runtime's CNI configuration directory and plugin binaries"),
        None => Link::new(
            "cni",
            T,
            Mark::Unknown,
            "the runtime reports no NetworkReady condition",
        )
        .with_evidence(evidence),
    }
}

async fn pressure_link(ctx: &Context, node: Option<&Node>) -> Link {
    const T: &str = "Resource pressure";
    let mut parts = Vec::new();
    let no_pods: [Arc<k8s_openapi::api::core::v1::Pod>; 0] = [];
    for r in thresholds::measure(ctx, &no_pods)
        .await
        .map(|(_, r)| r)
        .unwrap_or_default()
    {
        let condition = signals::node_condition(r.signal);
        let (kind, available, limit) = (r.kind, &r.available, &r.limit);
        let (status, summary) = if r.below {
            (
                Mark::Failed,
                format!(
                    "{available} available < {kind} {limit}: {condition} True, kubelet evicts pods ({} first)",
                    if condition == "MemoryPressure" {
                        "BestEffort, then Burstable above requests"
                    } else {
                        "by usage"
                    }
                ),
            )
        } else {
            (
                if r.near { Mark::Warning } else { Mark::Ok },
                format!("{available} available, {kind} {limit}"),
            )
        };
        parts.push(Part {
            name: r.signal.to_string(),
            status,
            summary,
            evidence: Vec::new(),
        });
    }
    let conditions: Vec<String> = node
        .into_iter()
        .flat_map(|n| n.status.iter().flat_map(|s| s.conditions.iter().flatten()))
        .filter(|c| c.type_.ends_with("Pressure"))
        .map(|c| {
            format!(
                "{} {} ({})",
                c.type_,
                c.status,
                c.reason.clone().unwrap_or_default()
            )
        })
        .collect();
    let mut link = if parts.is_empty() {
        Link::new(
            "pressure",
            T,
            Mark::Unknown,
            "no figures (the runtime does not answer)",
        )
    } else {
        Link::of_parts(
            "pressure",
            T,
            parts,
            "every signal above its eviction threshold",
        )
    };
    if !conditions.is_empty() {
        link.evidence.push(format!(
            "kubectl describe node shows: {}",
            conditions.join(", ")
        ));
    }
    link
}

fn stats_evidence(what: &str, s: &ApiCallStats) -> Vec<String> {
    let mut out = Vec::new();
    if s.requests == 0 {
        return out;
    }
    let ago = |t: &Option<String>| {
        t.as_deref()
            .and_then(words::parse_time)
            .map(words::relative)
            .unwrap_or_else(|| "never".into())
    };
    out.push(format!(
        "{what} (the daemon's request log): last success {}, {} of {} failed",
        ago(&s.last_success),
        s.failures,
        s.requests
    ));
    if s.consecutive_failures > 0 {
        out.push(format!(
            "{} failed in a row since then; last error ({}): {}",
            s.consecutive_failures,
            ago(&s.last_failure),
            s.last_error.clone().unwrap_or_default()
        ));
    }
    if let (Some(last), Some(max)) = (s.last_latency_ms, s.max_recent_latency_ms) {
        out.push(format!("latency: last {last} ms, at most {max} ms lately"));
    }
    out
}

async fn api_server(ctx: &Context, daemon: Option<&NodeState>) -> Link {
    const T: &str = "API server";
    let Some(api) = &ctx.api else {
        return Link::new(
            "api",
            T,
            Mark::Failed,
            format!(
                "no API client: {}",
                ctx.api_error.clone().unwrap_or_default()
            ),
        );
    };
    let daemon_evidence = daemon
        .map(|d| stats_evidence("the node role's API requests", &d.api))
        .unwrap_or_default();
    match api.server_date().await {
        Ok((_, rtt)) => Link::new(
            "api",
            T,
            Mark::Ok,
            format!("answers (GET /version in {} ms)", rtt.as_millis()),
        )
        .with_evidence(daemon_evidence),
        Err(e) => Link::new("api", T, Mark::Failed, format!("unreachable: {e}"))
            .with_evidence(daemon_evidence)
            .with_evidence([
                "kubectl describe node shows, once the node monitor grace period (40s) passes: Ready Unknown, NodeStatusUnknown, Kubelet stopped posting node status.".to_string(),
            ])
            .with_next("the API server, and the network path from this node to the server in the kubeconfig"),
    }
}

async fn lease_link(ctx: &Context, daemon: Option<&NodeState>) -> Link {
    const T: &str = "Node lease";
    let duration = i64::from(ctx.config.node.node_lease_duration_seconds);
    let mut evidence = daemon
        .map(|d| stats_evidence("renewals", &d.lease))
        .unwrap_or_default();
    let lease = match &ctx.api {
        Some(api) => {
            api.get::<Lease>("kube-node-lease", &ctx.node, "the node's Lease")
                .await
        }
        None => Lookup::Failed("no API client".into()),
    };
    let renewed_from_api = match &lease {
        Lookup::Found(l) => l
            .spec
            .as_ref()
            .and_then(|s| s.renew_time.as_ref())
            .map(|t| SystemTime::from(t.0)),
        _ => None,
    };
    let renewed = renewed_from_api.or_else(|| {
        daemon
            .and_then(|d| d.lease.last_success.as_deref())
            .and_then(words::parse_time)
    });
    let failing = daemon.is_some_and(|d| d.lease.consecutive_failures > 0);
    let age = renewed.and_then(|t| SystemTime::now().duration_since(t).ok());
    let expired = age.is_some_and(|a| a.as_secs() as i64 > duration);
    let age_text = age
        .map(|a| format!("{} ago", words::go_duration(a)))
        .unwrap_or_else(|| "never".into());
    if let Lookup::Found(_) = &lease {
        evidence.insert(
            0,
            format!(
                "kube-node-lease/{}: renewTime {age_text}, leaseDurationSeconds {duration}",
                ctx.node
            ),
        );
    }
    let link = if expired || (failing && renewed.is_none()) {
        Link::new(
            "lease",
            T,
            Mark::Failed,
            format!(
                "not renewed for {} (leaseDurationSeconds {duration}): the node lifecycle controller marks the node NotReady and taints it",
                age.map(words::go_duration).unwrap_or_else(|| "ever".into())
            ),
        )
    } else if failing {
        Link::new(
            "lease",
            T,
            Mark::Failed,
            format!("renewals fail (last renewal {age_text}; the Lease expires after {duration}s)"),
        )
    } else if let Lookup::NotFound = lease {
        Link::new("lease", T, Mark::Failed, "the node has no Lease yet")
    } else if renewed.is_some() {
        Link::new(
            "lease",
            T,
            Mark::Ok,
            format!("renewed {age_text} (leaseDurationSeconds {duration})"),
        )
    } else {
        Link::new(
            "lease",
            T,
            Mark::Unknown,
            "neither the API server nor the daemon can tell",
        )
    };
    let mut link = link.with_evidence(evidence);
    if link.status == Mark::Failed {
        link.next =
            Some("the API server link above; the daemon's log (lease renewal errors)".into());
    }
    link
}

fn certificate_link(ctx: &Context) -> Link {
    const T: &str = "Client certificate";
    let Some(kc) = &ctx.config.node.kubeconfig else {
        return Link::new(
            "certificate",
            T,
            Mark::Ok,
            "no node.kubeconfig (in-cluster or $KUBECONFIG credentials)",
        );
    };
    match certificate::credential(kc) {
        Ok(Credential::Certificate {
            source,
            subject,
            not_before,
            not_after,
        }) => {
            let now = SystemTime::now();
            let evidence = vec![format!(
                "{subject} from {source}, valid {} to {}",
                words::rfc3339(not_before),
                words::rfc3339(not_after)
            )];
            let (mark, summary) = match not_after.duration_since(now) {
                Err(_) => (
                    Mark::Failed,
                    format!(
                        "expired {}: the API server answers 401 Unauthorized",
                        words::relative(not_after)
                    ),
                ),
                Ok(left) if left < CERT_WARN => (
                    Mark::Warning,
                    format!("expires {}", words::relative(not_after)),
                ),
                Ok(_) if now < not_before => (
                    Mark::Failed,
                    format!("not valid yet (from {})", words::rfc3339(not_before)),
                ),
                Ok(_) => (Mark::Ok, format!("expires {}", words::relative(not_after))),
            };
            Link::new("certificate", T, mark, summary).with_evidence(evidence)
        }
        Ok(Credential::Token) => Link::new(
            "certificate",
            T,
            Mark::Ok,
            "a bearer token (no client certificate)",
        ),
        Ok(Credential::Plugin(p)) => {
            Link::new("certificate", T, Mark::Ok, format!("credentials from {p}"))
        }
        Ok(Credential::None) => Link::new(
            "certificate",
            T,
            Mark::Warning,
            "the kubeconfig has no credentials",
        ),
        Err(e) => Link::new(
            "certificate",
            T,
            Mark::Failed,
            format!("{}: {e}", kc.display()),
        ),
    }
}

async fn clock_link(ctx: &Context) -> Link {
    const T: &str = "Clock";
    let Some(api) = &ctx.api else {
        return Link::new("clock", T, Mark::Unknown, "no API server to compare with");
    };
    let before = SystemTime::now();
    match api.server_date().await {
        Ok((server, rtt)) => {
            let local = before + rtt / 2;
            let server = SystemTime::from(server);
            // The Date header has whole seconds.
            let (ahead, skew) = match server.duration_since(local) {
                Ok(d) => ("ahead of", d),
                Err(e) => ("behind", e.duration()),
            };
            let skew = skew.saturating_sub(Duration::from_secs(1));
            if skew > SKEW_WARN {
                Link::new(
                    "clock",
                    T,
                    Mark::Warning,
                    format!(
                        "the API server's clock is {} {ahead} this node's: certificates and token expiry are judged on different clocks",
                        words::go_duration(skew)
                    ),
                )
            } else {
                Link::new(
                    "clock",
                    T,
                    Mark::Ok,
                    "within 1s of the API server's Date header",
                )
            }
        }
        Err(e) => Link::new(
            "clock",
            T,
            Mark::Unknown,
            format!("the API server does not answer: {e}"),
        ),
    }
}

fn cgroup_driver_link(ctx: &Context, rt: &RuntimeFacts) -> Link {
    const T: &str = "Cgroup driver";
    if rt.status.is_err() {
        return Link::new("cgroupDriver", T, Mark::NotReached, "not reached");
    }
    let ours = driver::name(ctx.config.node.cgroup_driver);
    // The daemon's own start-up check: the same question, the same verdict.
    match driver::decide(ctx.config.node.cgroup_driver, rt.driver) {
        Ok(used) => {
            let summary = match rt.driver {
                driver::RuntimeDriver::Reported(_) => format!(
                    "{} (the runtime's, from CRI RuntimeConfig; node.cgroupDriver {ours})",
                    driver::name(used)
                ),
                driver::RuntimeDriver::FromStatus(d) => format!(
                    "{ours} on both sides (node.cgroupDriver, runtime SystemdCgroup={})",
                    d == CgroupDriver::Systemd
                ),
                driver::RuntimeDriver::Unknown => {
                    format!("node.cgroupDriver is {ours}; the runtime does not report its own")
                }
            };
            Link::new("cgroupDriver", T, Mark::Ok, summary)
        }
        Err(e) => Link::new("cgroupDriver", T, Mark::Failed, e.to_string()).with_next(
            "make node.cgroupDriver and the runtime's driver agree (the node role does not start until they do)",
        ),
    }
}

fn node_ready_link(ctx: &Context, node: &Lookup<Node>, daemon: Option<&NodeState>) -> Link {
    const T: &str = "Node Ready";
    let node = match node {
        Lookup::Found(n) => n,
        Lookup::NotFound => {
            return Link::new(
                "nodeReady",
                T,
                Mark::Failed,
                format!("no Node {} in the API (not registered yet)", ctx.node),
            );
        }
        Lookup::Forbidden(m) => return Link::new("nodeReady", T, Mark::Unknown, m.clone()),
        Lookup::Failed(e) => {
            let expected = daemon
                .map(|d| {
                    let mut errors = d.runtime_errors.clone();
                    errors.extend(d.network_errors.iter().cloned());
                    describe_ready_message(&errors)
                })
                .unwrap_or_default();
            return Link::new(
                "nodeReady",
                T,
                Mark::Unknown,
                format!("the API server cannot be read: {e}"),
            )
            .with_evidence(if expected.is_empty() {
                Vec::new()
            } else {
                vec![format!("what the daemon would post: {expected}")]
            });
        }
    };
    let conds: Vec<&k8s_openapi::api::core::v1::NodeCondition> = node
        .status
        .iter()
        .flat_map(|s| s.conditions.iter().flatten())
        .collect();
    let evidence: Vec<String> = conds
        .iter()
        .map(|c| {
            format!(
                "{} {} {} {}",
                c.type_,
                c.status,
                c.reason.clone().unwrap_or_default(),
                c.message.clone().unwrap_or_default()
            )
        })
        .collect();
    let ready = conds.iter().find(|c| c.type_ == "Ready");
    let mut link = match ready {
        Some(c) if c.status == "True" => {
            Link::new("nodeReady", T, Mark::Ok, "Ready True (KubeletReady)")
        }
        Some(c) => Link::new(
            "nodeReady",
            T,
            Mark::Failed,
            format!(
                "Ready {} ({}): {}",
                c.status,
                c.reason.clone().unwrap_or_default(),
                c.message.clone().unwrap_or_default()
            ),
        ),
        None => Link::new("nodeReady", T, Mark::Failed, "no Ready condition yet"),
    };
    link.evidence
        .push("kubectl describe node, Conditions:".to_string());
    link.evidence
        .extend(evidence.into_iter().map(|e| format!("  {e}")));
    let taints: Vec<String> = node
        .spec
        .iter()
        .flat_map(|s| s.taints.iter().flatten())
        .map(|t| format!("{}:{}", t.key, t.effect))
        .collect();
    if !taints.is_empty() {
        link.evidence.push(format!("Taints: {}", taints.join(", ")));
    }
    link
}
