//! `keelson diagnose service NS/NAME[:PORT]`: the chain of a Service as
//! this node's proxy sees it — the Service and its selector, its
//! EndpointSlices (ready / serving / terminating), which endpoints this
//! node's policy picks and why the others are left out (kube-proxy's
//! `CategorizeEndpoints`, the same code the proxy role runs), whether the
//! kernel holds exactly what the model renders (nftables objects read back
//! over netlink; in `proxy.mode: ebpf` also the socket LB's map entries,
//! [`super::socket_lb`]), the conntrack entries of its addresses and, with
//! `--probe`, real connections and datagrams from this node
//! ([`super::probe`]).

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use keelson_netplane::model::{
    Endpoint, IpFamily, NodeTopology, Protocol, ServicePortInfo, ServicePortKey, ServicePortName,
    ServicePortState, SkipReason, TopologyMode, endpoints_for_port, service_ports, slice_info,
    topology_mode,
};
use keelson_netplane::nftables::inspect::{Found, inspect_port};
use keelson_netplane::nftables::netlink::NfSocket;
use kube::api::ListParams;

use super::SubjectError;
use super::api::Lookup;
use super::context::Context;
use super::history::{self, Subject};
use super::report::{Link, Mark, Part, Report, Target, cut_after_failure};
use crate::introspection::types::ServiceState;

/// One service port of one family, with everything this node decides for it.
struct PortModel {
    state: ServicePortState,
    /// Ports of the EndpointSlices matched (for the endpoint list).
    all: Vec<Endpoint>,
}

fn selector_text(svc: &Service) -> Option<String> {
    let sel = svc.spec.as_ref()?.selector.as_ref()?;
    if sel.is_empty() {
        return None;
    }
    Some(
        sel.iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(","),
    )
}

fn port_matches(name: &ServicePortName, info: &ServicePortInfo, want: &str) -> bool {
    &*name.port == want || info.port.to_string() == want
}

/// Diagnoses Service `namespace/name`, optionally one `port` (name or number).
pub async fn diagnose(
    ctx: &Context,
    namespace: &str,
    name: &str,
    port: Option<&str>,
) -> Result<Report, SubjectError> {
    let (ns, nm) = (namespace.to_string(), name.to_string());
    let Some(api) = &ctx.api else {
        return Err(SubjectError::NoApiClient {
            namespace: ns,
            name: nm,
            reason: ctx.api_error.clone().unwrap_or_default(),
        });
    };
    // A list with a name selector, not a get: kube-proxy's role
    // (system:node-proxier) may list and watch Services but not get one.
    let svc = match api
        .list::<Service>(
            namespace,
            &ListParams::default().fields(&format!("metadata.name={name}")),
            "the Service",
        )
        .await
        .map(|l| l.into_iter().next())
    {
        Lookup::Found(Some(s)) => s,
        Lookup::Found(None) | Lookup::NotFound => {
            return Err(SubjectError::NotFound {
                kind: "service",
                namespace: ns,
                name: nm,
            });
        }
        Lookup::Forbidden(m) => {
            let rule = api
                .missing()
                .last()
                .map(|p| p.rule.clone())
                .unwrap_or_default();
            return Err(SubjectError::ServiceForbidden {
                namespace: ns,
                name: nm,
                reason: m,
                rule,
            });
        }
        Lookup::Failed(e) => {
            return Err(SubjectError::ServiceUnreadable {
                namespace: ns,
                name: nm,
                reason: e,
            });
        }
    };
    let node = api
        .get_cluster::<Node>(&ctx.node, "this node's addresses and zone")
        .await;
    let node = node.found();
    let node_ips = node
        .as_ref()
        .map(crate::proxy::settings::node_ips)
        .unwrap_or_default();
    let families = crate::proxy::settings::families(&node_ips);
    let topology = NodeTopology {
        name: ctx.node.clone(),
        zone: node
            .as_ref()
            .and_then(|n| n.metadata.labels.as_ref())
            .and_then(|l| l.get("topology.kubernetes.io/zone"))
            .cloned(),
    };
    let slices = match api
        .list::<EndpointSlice>(
            namespace,
            &ListParams::default().labels(&format!("kubernetes.io/service-name={name}")),
            "the Service's EndpointSlices",
        )
        .await
    {
        Lookup::Found(s) => Ok(s),
        Lookup::Forbidden(m) => Err(format!("EndpointSlices cannot be read: {m}")),
        Lookup::NotFound => Ok(Vec::new()),
        Lookup::Failed(e) => Err(format!("EndpointSlices cannot be read: {e}")),
    };
    let infos: Vec<Arc<keelson_netplane::model::SliceInfo>> = slices
        .as_ref()
        .map(|s| {
            s.iter()
                .filter_map(|s| slice_info(s).ok().map(Arc::new))
                .collect()
        })
        .unwrap_or_default();

    // The model, per family and service port.
    let mut skip: Option<SkipReason> = None;
    let mut models: Vec<PortModel> = Vec::new();
    for family in &families {
        match service_ports(&svc, *family) {
            Ok(ports) => {
                for (pname, info) in ports {
                    if port.is_some_and(|p| !port_matches(&pname, &info, p)) {
                        continue;
                    }
                    let fam_slices: Vec<&Arc<_>> =
                        infos.iter().filter(|s| s.family == *family).collect();
                    let all =
                        endpoints_for_port(fam_slices, &pname.port, pname.protocol, &ctx.node);
                    let key = ServicePortKey {
                        family: *family,
                        name: pname,
                    };
                    let state = ServicePortState::new(key, info, all.clone(), &topology);
                    models.push(PortModel { state, all });
                }
            }
            Err(r) => skip = Some(r),
        }
    }
    if let (Some(p), true) = (port, models.is_empty() && skip.is_none()) {
        let ports: Vec<String> = svc
            .spec
            .iter()
            .flat_map(|s| s.ports.iter().flatten())
            .map(|sp| {
                format!(
                    "{} {}/{}",
                    sp.name.clone().unwrap_or_default(),
                    sp.port,
                    sp.protocol.clone().unwrap_or_else(|| "TCP".into())
                )
            })
            .collect();
        return Err(SubjectError::NoSuchPort {
            namespace: ns,
            name: nm,
            port: p.to_string(),
            ports: ports.join(", "),
        });
    }
    let daemon = match ctx.daemon() {
        Some(d) => d.service(namespace, name).await.ok(),
        None => None,
    };

    let mut links = vec![service_link(&svc, skip.as_ref(), &models)];
    if skip.is_none() {
        links.push(endpoints_link(ctx, &svc, &slices, &models).await);
        links.push(selection_link(&models, &topology, daemon.as_ref()));
        links.push(data_plane_link(
            ctx,
            &models,
            &node_ips,
            &families,
            daemon.as_ref(),
            port.is_none(),
        ));
        links.push(conntrack_link(&models));
        if ctx.probe {
            let ports: Vec<(String, &ServicePortState)> = models
                .iter()
                .map(|m| (port_label(&m.state), &m.state))
                .collect();
            links.push(super::probe::link(&ports).await);
        }
    }
    cut_after_failure(&mut links, &["conntrack", "probe"]);
    let mut report = ctx.report(
        Target {
            kind: "Service".into(),
            namespace: Some(namespace.into()),
            name: name.into(),
            port: port.map(str::to_string),
        },
        links,
    );
    if let Some(since) = ctx.since {
        let recs = history::gather(
            ctx,
            &Subject {
                kind: "Service",
                namespace: Some(namespace),
                name,
                uid: None,
            },
        )
        .await;
        report.timeline = Some(history::since(&recs, since));
    }
    Ok(report)
}

fn port_label(s: &ServicePortState) -> String {
    let n = &s.key.name;
    let name = if n.port.is_empty() {
        "(unnamed)"
    } else {
        &n.port
    };
    format!(
        "{name} {}/{} ({})",
        s.info.port,
        n.protocol.as_k8s(),
        s.key.family.as_k8s()
    )
}

fn service_link(svc: &Service, skip: Option<&SkipReason>, models: &[PortModel]) -> Link {
    const T: &str = "Service";
    let spec = svc.spec.clone().unwrap_or_default();
    let type_ = spec.type_.clone().unwrap_or_else(|| "ClusterIP".into());
    let selector = selector_text(svc).unwrap_or_else(|| "<none>".into());
    let mut evidence = vec![format!(
        "Type: {type_}, IP: {}, Selector: {selector}",
        spec.cluster_ip.clone().unwrap_or_default()
    )];
    for p in spec.ports.iter().flatten() {
        evidence.push(format!(
            "Port: {} {}/{} -> TargetPort {}{}",
            p.name.clone().unwrap_or_else(|| "<unset>".into()),
            p.port,
            p.protocol.clone().unwrap_or_else(|| "TCP".into()),
            p.target_port
                .as_ref()
                .map(|t| match t {
                    k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(i) =>
                        i.to_string(),
                    k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String(s) =>
                        s.clone(),
                })
                .unwrap_or_else(|| p.port.to_string()),
            p.node_port
                .map(|n| format!(", NodePort {n}"))
                .unwrap_or_default()
        ));
    }
    let (mark, summary) = match skip {
        Some(SkipReason::Headless) => (
            Mark::Ok,
            "headless (clusterIP: None): no proxy rules exist for it; DNS answers with the pod IPs"
                .to_string(),
        ),
        Some(SkipReason::ExternalName) => (
            Mark::Ok,
            format!(
                "ExternalName ({}): DNS answers with a CNAME; no proxy rules exist for it",
                spec.external_name.clone().unwrap_or_default()
            ),
        ),
        Some(SkipReason::OtherProxy(p)) => (
            Mark::Ok,
            format!(
                "labelled service.kubernetes.io/service-proxy-name={p}: that proxy programs it, not keelson"
            ),
        ),
        Some(SkipReason::NoClusterIpForFamily) => (
            Mark::Failed,
            "no ClusterIP of this node's IP family".to_string(),
        ),
        Some(SkipReason::InvalidClusterIp(ip)) => (Mark::Failed, format!("invalid ClusterIP {ip}")),
        None => (
            Mark::Ok,
            format!(
                "{type_} {}, {} port(s), selector {selector}",
                spec.cluster_ip.clone().unwrap_or_default(),
                models.len()
            ),
        ),
    };
    Link::new("service", T, mark, summary).with_evidence(evidence)
}

fn endpoint_line(e: &Endpoint) -> String {
    let mut flags = Vec::new();
    flags.push(if e.ready { "ready" } else { "not ready" });
    if !e.ready && e.serving {
        flags.push("serving");
    }
    if e.terminating {
        flags.push("terminating");
    }
    format!(
        "{} on node {}{} ({})",
        e.addr(),
        e.node_name.as_deref().unwrap_or("?"),
        e.zone
            .as_deref()
            .map(|z| format!(" zone {z}"))
            .unwrap_or_default(),
        flags.join(", ")
    )
}

fn target_pod(slices: &[EndpointSlice], ip: IpAddr) -> Option<(String, String)> {
    slices
        .iter()
        .flat_map(|s| s.endpoints.iter().flatten())
        .find(|e| {
            e.addresses
                .iter()
                .any(|a| a.parse::<IpAddr>().ok() == Some(ip))
        })
        .and_then(|e| e.target_ref.as_ref())
        .filter(|r| r.kind.as_deref() == Some("Pod"))
        .map(|r| {
            (
                r.namespace.clone().unwrap_or_default(),
                r.name.clone().unwrap_or_default(),
            )
        })
}

async fn endpoints_link(
    ctx: &Context,
    svc: &Service,
    slices: &Result<Vec<EndpointSlice>, String>,
    models: &[PortModel],
) -> Link {
    const T: &str = "Endpoints";
    let slices = match slices {
        Ok(s) => s,
        Err(e) => return Link::new("endpoints", T, Mark::Unknown, e.clone()),
    };
    let ns = svc.metadata.namespace.clone().unwrap_or_default();
    let selector = selector_text(svc);
    let mut evidence = vec![if slices.is_empty() {
        format!(
            "no EndpointSlice labelled kubernetes.io/service-name={}",
            svc.metadata.name.clone().unwrap_or_default()
        )
    } else {
        format!(
            "{} EndpointSlice(s): {}",
            slices.len(),
            slices
                .iter()
                .filter_map(|s| s.metadata.name.clone())
                .collect::<Vec<_>>()
                .join(", ")
        )
    }];
    let mut parts = Vec::new();
    for m in models {
        for e in &m.all {
            let status = if e.ready {
                Mark::Ok
            } else if e.serving && e.terminating {
                Mark::Warning
            } else {
                Mark::Failed
            };
            let mut ev = Vec::new();
            if !e.ready
                && let Some((pns, pod)) = target_pod(slices, e.ip)
            {
                ev.push(format!(
                    "pod {pns}/{pod}: `keelson diagnose pod {pns}/{pod}` on node {}",
                    e.node_name.as_deref().unwrap_or("?")
                ));
            }
            parts.push(Part {
                name: port_label(&m.state),
                status,
                summary: endpoint_line(e),
                evidence: ev,
            });
        }
    }
    let total = parts.len();
    let ready = parts.iter().filter(|p| p.status == Mark::Ok).count();
    let mut link = if total == 0 {
        match &selector {
            Some(sel) => {
                // Who matches the selector, if this identity may look.
                let pods = match &ctx.api {
                    Some(api) => {
                        api.list::<Pod>(&ns, &ListParams::default().labels(sel), "pods matching the selector")
                            .await
                    }
                    None => Lookup::Failed("no API client".into()),
                };
                match pods {
                    Lookup::Found(p) if p.is_empty() => evidence.push(format!(
                        "no pod in namespace {ns} matches the selector {sel}"
                    )),
                    Lookup::Found(p) => evidence.push(format!(
                        "{} pod(s) match the selector {sel}, none ready with a matching port: {}",
                        p.len(),
                        p.iter()
                            .filter_map(|p| p.metadata.name.clone())
                            .collect::<Vec<_>>()
                            .join(", ")
                    )),
                    _ => evidence.push(format!(
                        "the pods matching {sel} cannot be listed with this identity"
                    )),
                }
                Link::new(
                    "endpoints",
                    T,
                    Mark::Failed,
                    format!("no endpoints: the selector {sel} matches no ready pod"),
                )
                .with_next(format!(
                    "kubectl get pods -n {ns} -l {sel} --show-labels: the pods' labels must match the selector, and their containerPort the targetPort"
                ))
            }
            None => Link::new(
                "endpoints",
                T,
                Mark::Failed,
                "no endpoints: the Service has no selector and no EndpointSlice lists an endpoint for it",
            )
            .with_next("a Service without a selector needs EndpointSlices made by hand (or by its controller)"),
        }
    } else if ready == 0 {
        Link::new(
            "endpoints",
            T,
            Mark::Failed,
            format!("0 of {total} endpoints ready"),
        )
        .with_next(
            "the pods behind the endpoints: their readiness (keelson diagnose pod on their node)",
        )
    } else if ready < total {
        Link::new(
            "endpoints",
            T,
            Mark::Warning,
            format!("{ready} of {total} endpoints ready"),
        )
    } else {
        Link::new(
            "endpoints",
            T,
            Mark::Ok,
            format!("{ready} of {total} endpoints ready"),
        )
    };
    link.evidence.append(&mut evidence);
    link.parts = parts;
    link
}

/// Why an endpoint is not in this node's set for the port.
fn excluded_because(e: &Endpoint, s: &ServicePortState, node: &NodeTopology) -> String {
    let info = &s.info;
    if info.internal_policy_local && !e.is_local {
        return "on another node (internalTrafficPolicy: Local)".to_string();
    }
    if !e.ready {
        return if e.serving && e.terminating {
            "terminating: used only while no endpoint is ready (KEP-1669)".to_string()
        } else {
            "not ready".to_string()
        };
    }
    match topology_mode(&s.endpoints, node) {
        TopologyMode::PreferSameNode => format!(
            "topology: hinted for nodes {:?}, this node keeps its own",
            e.node_hints()
        ),
        TopologyMode::PreferSameZone => format!(
            "topology: hinted for zones {:?}, this node is in zone {}",
            e.zone_hints(),
            node.zone.as_deref().unwrap_or("<none>")
        ),
        TopologyMode::All => "not chosen".to_string(),
    }
}

fn selection_link(
    models: &[PortModel],
    node: &NodeTopology,
    daemon: Option<&ServiceState>,
) -> Link {
    const T: &str = "This node's choice";
    let mut parts = Vec::new();
    for m in models {
        let s = &m.state;
        let picked = s.internal_endpoints();
        let mut evidence = Vec::new();
        let policy = if s.info.internal_policy_local {
            "internalTrafficPolicy Local"
        } else {
            "internalTrafficPolicy Cluster"
        };
        let mode = topology_mode(&s.endpoints, node);
        if mode != TopologyMode::All {
            evidence.push(format!("topology: {mode:?} (hints of the ready endpoints)"));
        }
        for e in &s.endpoints {
            if !picked.iter().any(|p| p.addr() == e.addr()) {
                evidence.push(format!(
                    "left out {}: {}",
                    e.addr(),
                    excluded_because(e, s, node)
                ));
            }
        }
        if s.info.externally_accessible() {
            let ext: Vec<String> = s
                .external_endpoints()
                .iter()
                .map(|e| e.addr().to_string())
                .collect();
            evidence.push(format!(
                "external traffic (externalTrafficPolicy {}): {}",
                if s.info.external_policy_local {
                    "Local"
                } else {
                    "Cluster"
                },
                if ext.is_empty() {
                    "none".to_string()
                } else {
                    ext.join(", ")
                }
            ));
        }
        if let Some(d) = daemon.filter(|d| d.proxy_role) {
            let key = format!("{}/{}", s.key.name, s.info.protocol.as_k8s());
            let programmed = d
                .ports
                .iter()
                .find(|p| p.name == key && p.family == s.key.family.as_k8s());
            let want: Vec<String> = s
                .cluster_endpoints
                .iter()
                .filter(|_| s.uses_cluster_policy())
                .map(|e| e.addr().to_string())
                .collect();
            match programmed {
                Some(p) if p.cluster_endpoints == want => {
                    evidence.push("the running proxy programmed the same endpoints".to_string())
                }
                Some(p) => evidence.push(format!(
                    "the running proxy programmed {:?}{}",
                    p.cluster_endpoints,
                    if d.pending {
                        " (newer changes wait for a sync)"
                    } else {
                        ""
                    }
                )),
                None => evidence.push(format!(
                    "the running proxy has not programmed this port{}",
                    if d.pending {
                        " yet (changes wait for a sync)"
                    } else {
                        ""
                    }
                )),
            }
        }
        let (status, summary) = match s.internal_no_endpoint_verdict() {
            None => (
                Mark::Ok,
                format!(
                    "{policy}: {}",
                    picked.iter().map(|e| e.addr().to_string()).collect::<Vec<_>>().join(", ")
                ),
            ),
            Some(keelson_netplane::model::NoEndpointVerdict::Reject) => (
                Mark::Failed,
                "no usable endpoint anywhere: new connections to the ClusterIP are rejected (ICMP port unreachable / TCP reset)".to_string(),
            ),
            Some(keelson_netplane::model::NoEndpointVerdict::Drop) => (
                Mark::Failed,
                format!("{policy} and no endpoint on this node: connections from this node are dropped"),
            ),
        };
        parts.push(Part {
            name: port_label(s),
            status,
            summary,
            evidence,
        });
    }
    let healthy = format!("{} port(s) have endpoints to send to", parts.len());
    Link::of_parts("selection", T, parts, healthy)
}

fn data_plane_link(
    ctx: &Context,
    models: &[PortModel],
    node_ips: &BTreeMap<IpFamily, IpAddr>,
    families: &[IpFamily],
    daemon: Option<&ServiceState>,
    whole_service: bool,
) -> Link {
    const T: &str = "Data plane";
    let cfg = &ctx.config.proxy;
    let nft = match crate::proxy::nftables_config(cfg, families, node_ips) {
        Ok(n) => n,
        Err(e) => {
            return Link::new(
                "dataPlane",
                T,
                Mark::Unknown,
                format!("proxy configuration: {e}"),
            );
        }
    };
    let mut sock = match NfSocket::open() {
        Ok(s) => s,
        Err(e) => {
            return Link::new(
                "dataPlane",
                T,
                Mark::Unknown,
                format!(
                    "cannot read nftables (netlink): {e} (run as root in the node's network namespace)"
                ),
            );
        }
    };
    let mode = daemon
        .filter(|d| d.proxy_role)
        .map(|d| d.mode.clone())
        .unwrap_or_else(|| format!("{:?}", cfg.mode).to_lowercase());
    let mut parts = Vec::new();
    let mut objects = 0;
    for m in models {
        match inspect_port(&mut sock, &nft, &m.state) {
            Ok(ins) => {
                objects += ins.checks.len();
                let problems: Vec<String> = ins
                    .problems()
                    .map(|c| match &c.found {
                        Found::Missing => format!(
                            "{} missing from table {} (the model wants {})",
                            c.object, c.table, c.expected
                        ),
                        Found::Different(d) => format!(
                            "{} in table {}: {d}, the model wants {}",
                            c.object, c.table, c.expected
                        ),
                        Found::Present => String::new(),
                    })
                    .collect();
                let present = ins.checks.len() - problems.len();
                parts.push(Part {
                    name: port_label(&m.state),
                    status: if problems.is_empty() {
                        Mark::Ok
                    } else {
                        Mark::Failed
                    },
                    summary: if problems.is_empty() {
                        format!("{present} object(s) in the kernel, as the model renders them")
                    } else {
                        format!(
                            "{} of {} object(s) missing or different",
                            problems.len(),
                            ins.checks.len()
                        )
                    },
                    evidence: problems,
                });
            }
            Err(e) => parts.push(Part {
                name: port_label(&m.state),
                status: Mark::Unknown,
                summary: format!("reading the tables failed: {e}"),
                evidence: Vec::new(),
            }),
        }
    }
    let ebpf = (mode == "ebpf").then(|| crate::proxy::ebpf_config(cfg));
    let mut entries = 0;
    if let Some(ebpf) = &ebpf {
        let ports: Vec<(String, &ServicePortState)> = models
            .iter()
            .map(|m| (port_label(&m.state), &m.state))
            .collect();
        let (lb_parts, n) = super::socket_lb::parts(ebpf, &ports, whole_service);
        parts.extend(lb_parts);
        entries = n;
    }
    let worst = Link::worst_part(&parts);
    let mut link = Link::new(
        "dataPlane",
        T,
        worst,
        match worst {
            Mark::Ok if ebpf.is_some() => format!(
                "nftables table {} holds the {objects} object(s) and the socket-LB maps the {entries} entries the model renders",
                nft.table
            ),
            Mark::Ok => format!(
                "nftables table {} holds the {objects} object(s) the model renders",
                nft.table
            ),
            Mark::Failed if ebpf.is_some() => {
                "the kernel's rules or socket-LB maps differ from the model".to_string()
            }
            Mark::Failed => "the kernel's rules differ from the model".to_string(),
            _ => "the kernel's rules could not be compared".to_string(),
        },
    );
    link.evidence.push(format!("proxy mode: {mode}"));
    if let Some(ebpf) = &ebpf {
        link.evidence.push(super::socket_lb::mode_evidence(ebpf));
    }
    if worst == Mark::Failed {
        let what = if ebpf.is_some() {
            "keelson's tables or maps"
        } else {
            "keelson's tables"
        };
        let owner = if ebpf.is_some() {
            "these tables and maps"
        } else {
            "this table"
        };
        link.next = Some(match daemon.filter(|d| d.proxy_role) {
            Some(_) => format!(
                "something changed {what}: the next periodic sync (proxy.syncPeriod) rewrites them, or restart keelson"
            ),
            None => format!(
                "no running keelson proxy keeps {owner}: start keelson (or the proxy that owns this node)"
            ),
        });
    }
    link.parts = parts;
    link
}

fn conntrack_link(models: &[PortModel]) -> Link {
    const T: &str = "Conntrack";
    let mut parts = Vec::new();
    for m in models {
        let s = &m.state;
        let flows = match keelson_netplane::proxier::flows(s.key.family) {
            Ok(f) => f,
            Err(e) => {
                return Link::new(
                    "conntrack",
                    T,
                    Mark::Unknown,
                    format!("cannot read conntrack: {e}"),
                );
            }
        };
        let addrs: Vec<IpAddr> = std::iter::once(s.info.cluster_ip)
            .chain(s.info.external_ips.iter().copied())
            .chain(s.info.load_balancer_ips.iter().copied())
            .collect();
        let proto = s.info.protocol.number();
        let mine: Vec<_> = flows
            .iter()
            .filter(|f| {
                f.protocol == proto && f.orig_dport == s.info.port && addrs.contains(&f.orig_dst)
            })
            .collect();
        let serving: Vec<SocketAddr> = s
            .endpoints
            .iter()
            .filter(|e| e.serving)
            .map(Endpoint::addr)
            .collect();
        let mut by_backend: BTreeMap<String, usize> = BTreeMap::new();
        let mut stale = 0;
        for f in &mine {
            let backend = SocketAddr::new(f.reply_src, f.reply_sport);
            let is_vip = addrs.contains(&f.reply_src);
            if !is_vip && !serving.contains(&backend) {
                stale += 1;
            }
            *by_backend
                .entry(if is_vip {
                    "not translated".to_string()
                } else {
                    backend.to_string()
                })
                .or_default() += 1;
        }
        let udp = s.info.protocol == Protocol::Udp;
        let (status, summary) = if stale > 0 && udp {
            (
                Mark::Warning,
                format!(
                    "{} entries, {stale} UDP entries point at endpoints that are gone (stale: their datagrams are lost until the entries expire)",
                    mine.len()
                ),
            )
        } else {
            (
                Mark::Ok,
                format!(
                    "{} entries to {}{}",
                    mine.len(),
                    addrs
                        .iter()
                        .map(|a| SocketAddr::new(*a, s.info.port).to_string())
                        .collect::<Vec<_>>()
                        .join(", "),
                    if stale > 0 {
                        format!(", {stale} to endpoints that are gone")
                    } else {
                        String::new()
                    }
                ),
            )
        };
        parts.push(Part {
            name: port_label(s),
            status,
            summary,
            evidence: by_backend
                .iter()
                .map(|(b, n)| format!("{n} to {b}"))
                .collect(),
        });
    }
    let worst = Link::worst_part(&parts);
    let total: usize = parts.len();
    let mut link = Link::new(
        "conntrack",
        T,
        worst,
        if worst == Mark::Ok {
            format!("{total} port(s), no stale UDP entries")
        } else {
            "stale UDP entries".to_string()
        },
    );
    link.parts = parts;
    link
}
