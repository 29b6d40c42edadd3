//! Renders the proxy model into socket-LB frontends.
//!
//! Socket LB serves exactly one thing: connections and datagrams that a
//! process on this node (in the attached cgroup) addresses to a Service's
//! **ClusterIP** and port, for **TCP and UDP**. The endpoints are the
//! model's internal choice ([`ServicePortState::internal_endpoints`]:
//! KEP-1669 terminating fallback, topology hints, internalTrafficPolicy),
//! so the eBPF path never re-derives it. A port with no internal endpoint
//! gets an entry with no backend, which the programs pass through untouched
//! so nftables answers it (reject or drop, as kube-proxy would).
//! Everything else — NodePort, externalIPs, load-balancer IPs, SCTP — is
//! rendered by the nftables backend from the same model.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use crate::model::{Protocol, ProxyDiff, ProxySnapshot, ServicePortState};

use super::layout::LbService;
use super::layout::{Frontend, L4Proto};

/// The socket-LB frontend of a service port, if socket LB serves it.
pub fn frontend_of(state: &ServicePortState) -> Option<Frontend> {
    let proto = match state.info.protocol {
        Protocol::Tcp => L4Proto::Tcp,
        Protocol::Udp => L4Proto::Udp,
        Protocol::Sctp => return None,
    };
    Some(Frontend {
        vip: state.info.cluster_ip,
        port: state.info.port,
        proto,
    })
}

/// The desired socket-LB state of a service port.
pub fn service_of(state: &ServicePortState) -> LbService {
    let backends: Vec<SocketAddr> = if state.has_internal_endpoints() {
        state
            .internal_endpoints()
            .iter()
            .map(|e| e.addr())
            .collect()
    } else {
        Vec::new()
    };
    LbService {
        name: state.key.name.to_string(),
        affinity_timeout: state.info.affinity_timeout(),
        backends,
    }
}

/// The frontend changes of a diff: removals first (a frontend may move
/// from one service port to another in the same diff), then the rest.
pub fn changes_of(diff: &ProxyDiff) -> Vec<(Frontend, Option<LbService>)> {
    let mut removals = Vec::new();
    let mut sets = Vec::new();
    for change in &diff.changes {
        let current = change
            .current
            .as_deref()
            .and_then(|s| frontend_of(s).map(|f| (f, s)));
        let previous = change.previous.as_deref().and_then(frontend_of);
        if let Some(prev) = previous
            && current.map(|(f, _)| f) != Some(prev)
        {
            removals.push((prev, None));
        }
        if let Some((f, s)) = current {
            sets.push((f, Some(service_of(s))));
        }
    }
    removals.extend(sets);
    removals
}

/// Every frontend of a snapshot.
pub fn desired_of(snapshot: &ProxySnapshot) -> BTreeMap<Frontend, LbService> {
    snapshot
        .services
        .values()
        .filter_map(|s| frontend_of(s).map(|f| (f, service_of(s))))
        .collect()
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;
    use std::sync::Arc;

    use crate::fixtures::{cluster_ip_port, model_endpoint, port_state};
    use crate::model::{Endpoint, ServicePortChange, ServicePortInfo, SessionAffinity};

    use super::*;

    fn info(ip: &str, port: u16, protocol: Protocol) -> ServicePortInfo {
        cluster_ip_port(ip.parse().expect("ip"), port, protocol)
    }

    fn ep(ip: &str, port: u16, ready: bool, terminating: bool, node: &str) -> Endpoint {
        model_endpoint(ip.parse().expect("ip"), port, ready, terminating, node)
    }

    fn state(name: &str, info: ServicePortInfo, eps: Vec<Endpoint>) -> Arc<ServicePortState> {
        Arc::new(port_state(name, info, eps))
    }

    fn addrs(s: &LbService) -> Vec<String> {
        s.backends.iter().map(|a| a.to_string()).collect()
    }

    #[test]
    fn cluster_ip_tcp_and_udp_are_served_sctp_is_not() {
        let s = state("a", info("10.96.0.1", 80, Protocol::Tcp), vec![]);
        assert_eq!(
            frontend_of(&s),
            Some(Frontend {
                vip: IpAddr::from([10, 96, 0, 1]),
                port: 80,
                proto: L4Proto::Tcp
            })
        );
        let s = state("a", info("10.96.0.1", 53, Protocol::Udp), vec![]);
        assert_eq!(frontend_of(&s).map(|f| f.proto), Some(L4Proto::Udp));
        let s = state("a", info("10.96.0.1", 9, Protocol::Sctp), vec![]);
        assert_eq!(frontend_of(&s), None);
    }

    #[test]
    fn backends_are_the_models_internal_choice() {
        // Ready endpoints win; terminating ones are a fallback only.
        let s = state(
            "a",
            info("10.96.0.1", 80, Protocol::Tcp),
            vec![
                ep("10.1.0.1", 8080, true, false, "n1"),
                ep("10.1.0.2", 8080, false, true, "n2"),
            ],
        );
        assert_eq!(addrs(&service_of(&s)), ["10.1.0.1:8080"]);
        let s = state(
            "a",
            info("10.96.0.1", 80, Protocol::Tcp),
            vec![ep("10.1.0.2", 8080, false, true, "n2")],
        );
        assert_eq!(
            addrs(&service_of(&s)),
            ["10.1.0.2:8080"],
            "terminating fallback"
        );
        // internalTrafficPolicy Local: only this node's endpoints.
        let mut i = info("10.96.0.1", 80, Protocol::Tcp);
        i.internal_policy_local = true;
        let s = state(
            "a",
            i.clone(),
            vec![
                ep("10.1.0.1", 8080, true, false, "n1"),
                ep("10.1.0.3", 8080, true, false, "me"),
            ],
        );
        assert_eq!(addrs(&service_of(&s)), ["10.1.0.3:8080"]);
        // ... and none when no local endpoint: left to nftables (drop).
        let s = state("a", i, vec![ep("10.1.0.1", 8080, true, false, "n1")]);
        assert!(service_of(&s).backends.is_empty());
    }

    #[test]
    fn affinity_and_name_are_carried() {
        let mut i = info("10.96.0.1", 80, Protocol::Tcp);
        i.session_affinity = SessionAffinity::ClientIp {
            timeout_seconds: 60,
        };
        let s = service_of(&state("web", i, vec![]));
        assert_eq!(s.affinity_timeout, Some(60));
        assert_eq!(s.name, "ns/web:p");
    }

    #[test]
    fn diff_moves_a_frontend_and_removes_gone_ports() {
        let old = state("a", info("10.96.0.1", 80, Protocol::Tcp), vec![]);
        let new = state("a", info("10.96.0.1", 81, Protocol::Tcp), vec![]);
        let gone = state("b", info("10.96.0.2", 80, Protocol::Udp), vec![]);
        let diff = ProxyDiff {
            changes: vec![
                ServicePortChange {
                    key: old.key.clone(),
                    previous: Some(old.clone()),
                    current: Some(new.clone()),
                },
                ServicePortChange {
                    key: gone.key.clone(),
                    previous: Some(gone.clone()),
                    current: None,
                },
            ],
            ..Default::default()
        };
        let changes = changes_of(&diff);
        let summary: Vec<(u16, bool)> =
            changes.iter().map(|(f, s)| (f.port, s.is_some())).collect();
        assert_eq!(summary, [(80, false), (80, false), (81, true)]);
        assert_eq!(changes[1].0.proto, L4Proto::Udp);
    }
}
