//! Table-driven tests of the model: Service/EndpointSlice reading, endpoint
//! selection and the tracker's diffs.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;

use super::*;
use crate::fixtures::{EndpointSpec as Ep, ServiceBuilder, SliceBuilder};

const NODE: &str = "node-a";

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap_or_else(|e| panic!("bad ip {s}: {e}"))
}

fn node(zone: Option<&str>) -> NodeTopology {
    NodeTopology {
        name: NODE.into(),
        zone: zone.map(Into::into),
    }
}

fn tracker(zone: Option<&str>) -> ChangeTracker {
    ChangeTracker::new([IpFamily::V4, IpFamily::V6], node(zone))
}

/// Builds the model from objects and returns the desired states by key.
fn build(
    zone: Option<&str>,
    services: &[Service],
    slices: &[EndpointSlice],
) -> Vec<Arc<ServicePortState>> {
    let mut t = tracker(zone);
    for s in services {
        t.update_service(s);
    }
    for s in slices {
        t.update_endpoint_slice(s);
    }
    let diff = t.diff();
    diff.changes
        .iter()
        .filter_map(|c| c.current.clone())
        .collect()
}

fn web() -> ServiceBuilder {
    ServiceBuilder::new("ns", "web")
        .cluster_ip("10.96.0.10")
        .port("http", Protocol::Tcp, 80)
}

fn web_slice() -> SliceBuilder {
    SliceBuilder::new("ns", "web", "web-abc", "IPv4").port("http", Protocol::Tcp, 8080)
}

fn ips(eps: &[Endpoint]) -> Vec<String> {
    eps.iter().map(|e| e.ip.to_string()).collect()
}

#[test]
fn service_filters_follow_kube_proxy() {
    struct Case {
        name: &'static str,
        svc: Service,
        ports_v4: usize,
        ports_v6: usize,
    }
    let cases = vec![
        Case {
            name: "plain ClusterIP",
            svc: web().build(),
            ports_v4: 1,
            ports_v6: 0,
        },
        Case {
            name: "headless",
            svc: ServiceBuilder::new("ns", "h")
                .cluster_ip("None")
                .port("", Protocol::Tcp, 80)
                .build(),
            ports_v4: 0,
            ports_v6: 0,
        },
        Case {
            name: "ExternalName with a stale clusterIP",
            svc: web().type_("ExternalName").build(),
            ports_v4: 0,
            ports_v6: 0,
        },
        Case {
            name: "service-proxy-name label",
            svc: web().label(LABEL_SERVICE_PROXY_NAME, "other").build(),
            ports_v4: 0,
            ports_v6: 0,
        },
        Case {
            name: "IPv6 single stack",
            svc: ServiceBuilder::new("ns", "v6")
                .cluster_ip("fd00::10")
                .port("", Protocol::Udp, 53)
                .build(),
            ports_v4: 0,
            ports_v6: 1,
        },
        Case {
            name: "dual stack, two ports",
            svc: ServiceBuilder::new("ns", "ds")
                .cluster_ips(&["10.96.0.11", "fd00::11"])
                .port("dns", Protocol::Udp, 53)
                .port("dns-tcp", Protocol::Tcp, 53)
                .build(),
            ports_v4: 2,
            ports_v6: 2,
        },
        Case {
            name: "no ipFamilies (old object) uses clusterIP's family",
            svc: {
                let mut s = web().build();
                if let Some(spec) = s.spec.as_mut() {
                    spec.ip_families = None;
                    spec.cluster_ips = None;
                }
                s
            },
            ports_v4: 1,
            ports_v6: 0,
        },
        Case {
            name: "unparsable clusterIP",
            svc: ServiceBuilder::new("ns", "bad")
                .cluster_ip("10.96.0.999")
                .port("", Protocol::Tcp, 80)
                .build(),
            ports_v4: 0,
            ports_v6: 0,
        },
    ];
    for c in cases {
        let v4 = service_ports(&c.svc, IpFamily::V4)
            .map(|p| p.len())
            .unwrap_or(0);
        let v6 = service_ports(&c.svc, IpFamily::V6)
            .map(|p| p.len())
            .unwrap_or(0);
        assert_eq!((v4, v6), (c.ports_v4, c.ports_v6), "case {}", c.name);
    }
    assert_eq!(
        service_ports(
            &web().label(LABEL_SERVICE_PROXY_NAME, "x").build(),
            IpFamily::V4
        ),
        Err(SkipReason::OtherProxy("x".into()))
    );
}

#[test]
fn service_port_fields() {
    let svc = ServiceBuilder::new("ns", "lb")
        .cluster_ips(&["10.96.0.20", "fd00::20"])
        .type_("LoadBalancer")
        .node_port("http", Protocol::Tcp, 80, 30080)
        .external_ips(&["192.0.2.1", "2001:db8::1", "not-an-ip"])
        .lb_ingress("198.51.100.1")
        .lb_ingress_mode("198.51.100.2", Some("Proxy"))
        .lb_ingress_mode("198.51.100.3", Some("VIP"))
        .lb_ingress("2001:db8::2")
        .source_ranges(&[" 203.0.113.0/24 ", "2001:db8:1::/48"])
        .external_traffic_local(Some(32000))
        .client_ip_affinity(60)
        .traffic_distribution("PreferClose")
        .build();
    let v4 = service_ports(&svc, IpFamily::V4).unwrap_or_else(|e| panic!("{e:?}"));
    let (name, info) = v4.iter().next().unwrap_or_else(|| panic!("one port"));
    assert_eq!(name.to_string(), "ns/lb:http");
    assert_eq!(info.cluster_ip, ip("10.96.0.20"));
    assert_eq!(info.node_port, Some(30080));
    assert_eq!(info.external_ips, vec![ip("192.0.2.1")]);
    assert_eq!(
        info.load_balancer_ips,
        vec![ip("198.51.100.1"), ip("198.51.100.3")]
    );
    assert_eq!(info.load_balancer_source_ranges.len(), 1);
    assert_eq!(
        info.load_balancer_source_ranges[0].to_string(),
        "203.0.113.0/24"
    );
    assert!(info.external_policy_local);
    assert!(!info.internal_policy_local);
    assert_eq!(info.health_check_node_port, Some(32000));
    assert_eq!(
        info.session_affinity,
        SessionAffinity::ClientIp {
            timeout_seconds: 60
        }
    );
    assert_eq!(info.traffic_distribution.as_deref(), Some("PreferClose"));
    let v6 = service_ports(&svc, IpFamily::V6).unwrap_or_else(|e| panic!("{e:?}"));
    let info6 = v6.values().next().unwrap_or_else(|| panic!("one port"));
    assert_eq!(info6.external_ips, vec![ip("2001:db8::1")]);
    assert_eq!(info6.load_balancer_ips, vec![ip("2001:db8::2")]);
    assert_eq!(
        info6.load_balancer_source_ranges[0].to_string(),
        "2001:db8:1::/48"
    );
}

#[test]
fn traffic_policy_and_health_check_apply_by_type() {
    struct Case {
        name: &'static str,
        svc: Service,
        etp_local: bool,
        hc: Option<u16>,
        externally_accessible: bool,
    }
    let cases = vec![
        Case {
            name: "ClusterIP with eTP Local and no externalIPs: not external",
            svc: web().external_traffic_local(None).build(),
            etp_local: false,
            hc: None,
            externally_accessible: false,
        },
        Case {
            name: "ClusterIP with externalIPs honours eTP Local, no health check",
            svc: web()
                .external_ips(&["192.0.2.5"])
                .external_traffic_local(None)
                .build(),
            etp_local: true,
            hc: None,
            externally_accessible: true,
        },
        Case {
            name: "NodePort eTP Local: no health check port",
            svc: ServiceBuilder::new("ns", "np")
                .cluster_ip("10.96.0.30")
                .type_("NodePort")
                .node_port("", Protocol::Tcp, 80, 30001)
                .external_traffic_local(Some(31000))
                .build(),
            etp_local: true,
            hc: None,
            externally_accessible: true,
        },
        Case {
            name: "LoadBalancer eTP Local without healthCheckNodePort",
            svc: ServiceBuilder::new("ns", "lb")
                .cluster_ip("10.96.0.31")
                .type_("LoadBalancer")
                .node_port("", Protocol::Tcp, 80, 30002)
                .external_traffic_local(None)
                .build(),
            etp_local: true,
            hc: None,
            externally_accessible: true,
        },
        Case {
            name: "LoadBalancer without allocated node ports nor ingress: not external",
            svc: ServiceBuilder::new("ns", "lb2")
                .cluster_ip("10.96.0.32")
                .type_("LoadBalancer")
                .port("", Protocol::Tcp, 80)
                .external_traffic_local(Some(31001))
                .build(),
            etp_local: true,
            hc: Some(31001),
            externally_accessible: false,
        },
    ];
    for c in cases {
        let ports =
            service_ports(&c.svc, IpFamily::V4).unwrap_or_else(|e| panic!("{}: {e:?}", c.name));
        let info = ports
            .values()
            .next()
            .unwrap_or_else(|| panic!("{}: a port", c.name));
        assert_eq!(info.external_policy_local, c.etp_local, "{}", c.name);
        assert_eq!(info.health_check_node_port, c.hc, "{}", c.name);
        assert_eq!(
            info.externally_accessible(),
            c.externally_accessible,
            "{}",
            c.name
        );
    }
}

#[test]
fn affinity_timeout_defaults_to_three_hours() {
    let mut svc = web().client_ip_affinity(5).build();
    if let Some(spec) = svc.spec.as_mut() {
        spec.session_affinity_config = None;
    }
    let ports = service_ports(&svc, IpFamily::V4).unwrap_or_else(|e| panic!("{e:?}"));
    let info = ports.values().next().unwrap_or_else(|| panic!("port"));
    assert_eq!(
        info.affinity_timeout(),
        Some(DEFAULT_STICKY_TIMEOUT_SECONDS)
    );
}

#[test]
fn endpoint_selection_table() {
    struct Case {
        name: &'static str,
        svc: Service,
        zone: Option<&'static str>,
        endpoints: Vec<Ep>,
        cluster: Vec<&'static str>,
        local: Vec<&'static str>,
        internal: Option<NoEndpointVerdict>,
        external: Option<NoEndpointVerdict>,
    }
    let np = || {
        ServiceBuilder::new("ns", "web")
            .cluster_ip("10.96.0.10")
            .type_("NodePort")
            .node_port("http", Protocol::Tcp, 80, 30080)
    };
    let cases = vec![
        Case {
            name: "ready endpoints only; not-ready and terminating ignored",
            svc: web().build(),
            zone: None,
            endpoints: vec![
                Ep::ready("10.0.0.1"),
                Ep::ready("10.0.0.2"),
                Ep::not_ready("10.0.0.3"),
                Ep::terminating("10.0.0.4", true),
            ],
            cluster: vec!["10.0.0.1", "10.0.0.2"],
            local: vec![],
            internal: None,
            external: None,
        },
        Case {
            name: "KEP-1669: no ready endpoint, serving terminating ones are used",
            svc: web().build(),
            zone: None,
            endpoints: vec![
                Ep::terminating("10.0.0.4", true),
                Ep::terminating("10.0.0.5", false),
                Ep::not_ready("10.0.0.6"),
            ],
            cluster: vec!["10.0.0.4"],
            local: vec![],
            internal: None,
            external: None,
        },
        Case {
            name: "no usable endpoint: reject",
            svc: web().build(),
            zone: None,
            endpoints: vec![
                Ep::terminating("10.0.0.5", false),
                Ep::not_ready("10.0.0.6"),
            ],
            cluster: vec![],
            local: vec![],
            internal: Some(NoEndpointVerdict::Reject),
            external: Some(NoEndpointVerdict::Reject),
        },
        Case {
            name: "unset conditions mean ready",
            svc: web().build(),
            zone: None,
            endpoints: vec![Ep::ready("10.0.0.7").conditions(None, None, None)],
            cluster: vec!["10.0.0.7"],
            local: vec![],
            internal: None,
            external: None,
        },
        Case {
            name: "zone hints: only same-zone endpoints",
            svc: web().traffic_distribution("PreferClose").build(),
            zone: Some("z1"),
            endpoints: vec![
                Ep::ready("10.0.0.1").zone("z1").zone_hints(&["z1"]),
                Ep::ready("10.0.0.2").zone("z2").zone_hints(&["z2"]),
            ],
            cluster: vec!["10.0.0.1"],
            local: vec![],
            internal: None,
            external: None,
        },
        Case {
            name: "zone hints ignored when one ready endpoint lacks a hint",
            svc: web().build(),
            zone: Some("z1"),
            endpoints: vec![
                Ep::ready("10.0.0.1").zone_hints(&["z1"]),
                Ep::ready("10.0.0.2"),
            ],
            cluster: vec!["10.0.0.1", "10.0.0.2"],
            local: vec![],
            internal: None,
            external: None,
        },
        Case {
            name: "zone hints ignored when none is for this zone",
            svc: web().build(),
            zone: Some("z3"),
            endpoints: vec![
                Ep::ready("10.0.0.1").zone_hints(&["z1"]),
                Ep::ready("10.0.0.2").zone_hints(&["z2"]),
            ],
            cluster: vec!["10.0.0.1", "10.0.0.2"],
            local: vec![],
            internal: None,
            external: None,
        },
        Case {
            name: "zone hints ignored when node has no zone",
            svc: web().build(),
            zone: None,
            endpoints: vec![
                Ep::ready("10.0.0.1").zone_hints(&["z1"]),
                Ep::ready("10.0.0.2").zone_hints(&["z2"]),
            ],
            cluster: vec!["10.0.0.1", "10.0.0.2"],
            local: vec![],
            internal: None,
            external: None,
        },
        Case {
            name: "hints only count ready endpoints (a hintless not-ready one does not disable them)",
            svc: web().build(),
            zone: Some("z1"),
            endpoints: vec![
                Ep::ready("10.0.0.1").zone_hints(&["z1"]),
                Ep::ready("10.0.0.2").zone_hints(&["z2"]),
                Ep::not_ready("10.0.0.3"),
            ],
            cluster: vec!["10.0.0.1"],
            local: vec![],
            internal: None,
            external: None,
        },
        Case {
            name: "node hints (PreferSameNode) win over zone hints",
            svc: web().traffic_distribution("PreferSameNode").build(),
            zone: Some("z1"),
            endpoints: vec![
                Ep::ready("10.0.0.1")
                    .node(NODE)
                    .node_hints(&[NODE])
                    .zone_hints(&["z1"]),
                Ep::ready("10.0.0.2")
                    .node("node-b")
                    .node_hints(&["node-b"])
                    .zone_hints(&["z1"]),
            ],
            cluster: vec!["10.0.0.1"],
            local: vec![],
            internal: None,
            external: None,
        },
        Case {
            name: "node hints for other nodes only: fall back to zone hints",
            svc: web().traffic_distribution("PreferSameNode").build(),
            zone: Some("z1"),
            endpoints: vec![
                Ep::ready("10.0.0.1")
                    .node_hints(&["node-b"])
                    .zone_hints(&["z1"]),
                Ep::ready("10.0.0.2")
                    .node_hints(&["node-c"])
                    .zone_hints(&["z2"]),
            ],
            cluster: vec!["10.0.0.1"],
            local: vec![],
            internal: None,
            external: None,
        },
        Case {
            name: "terminating fallback ignores topology",
            svc: web().build(),
            zone: Some("z1"),
            endpoints: vec![
                Ep::terminating("10.0.0.1", true).zone_hints(&["z2"]),
                Ep::terminating("10.0.0.2", true).zone_hints(&["z1"]),
            ],
            cluster: vec!["10.0.0.1", "10.0.0.2"],
            local: vec![],
            internal: None,
            external: None,
        },
        Case {
            name: "iTP Local: local ready endpoints only",
            svc: web().internal_traffic_local().build(),
            zone: None,
            endpoints: vec![
                Ep::ready("10.0.0.1").node(NODE),
                Ep::ready("10.0.0.2").node("node-b"),
            ],
            cluster: vec![],
            local: vec!["10.0.0.1"],
            internal: None,
            external: None,
        },
        Case {
            name: "iTP Local without a local endpoint: drop (endpoints exist elsewhere)",
            svc: web().internal_traffic_local().build(),
            zone: None,
            endpoints: vec![Ep::ready("10.0.0.2").node("node-b")],
            cluster: vec![],
            local: vec![],
            internal: Some(NoEndpointVerdict::Drop),
            external: None,
        },
        Case {
            name: "iTP Local: local serving-terminating fallback",
            svc: web().internal_traffic_local().build(),
            zone: None,
            endpoints: vec![
                Ep::terminating("10.0.0.1", true).node(NODE),
                Ep::ready("10.0.0.2").node("node-b"),
            ],
            cluster: vec![],
            local: vec!["10.0.0.1"],
            internal: None,
            external: None,
        },
        Case {
            name: "eTP Local NodePort: cluster set for short-circuit, local set for external",
            svc: np().external_traffic_local(None).build(),
            zone: None,
            endpoints: vec![
                Ep::ready("10.0.0.1").node(NODE),
                Ep::ready("10.0.0.2").node("node-b"),
            ],
            cluster: vec!["10.0.0.1", "10.0.0.2"],
            local: vec!["10.0.0.1"],
            internal: None,
            external: None,
        },
        Case {
            name: "eTP Local without local endpoint: external dropped, ClusterIP served",
            svc: np().external_traffic_local(None).build(),
            zone: None,
            endpoints: vec![Ep::ready("10.0.0.2").node("node-b")],
            cluster: vec!["10.0.0.2"],
            local: vec![],
            internal: None,
            external: Some(NoEndpointVerdict::Drop),
        },
        Case {
            name: "eTP Local with only remote endpoints, none ready: reject everything",
            svc: np().external_traffic_local(None).build(),
            zone: None,
            endpoints: vec![Ep::not_ready("10.0.0.2").node("node-b")],
            cluster: vec![],
            local: vec![],
            internal: Some(NoEndpointVerdict::Reject),
            external: Some(NoEndpointVerdict::Reject),
        },
        Case {
            name: "eTP Local: local terminating used for external while remote ready serve cluster",
            svc: np().external_traffic_local(None).build(),
            zone: None,
            endpoints: vec![
                Ep::terminating("10.0.0.1", true).node(NODE),
                Ep::ready("10.0.0.2").node("node-b"),
            ],
            cluster: vec!["10.0.0.2"],
            local: vec!["10.0.0.1"],
            internal: None,
            external: None,
        },
    ];
    for c in cases {
        let mut slice = web_slice();
        for ep in c.endpoints {
            slice = slice.endpoint(ep);
        }
        let states = build(c.zone, &[c.svc], &[slice.build()]);
        assert_eq!(states.len(), 1, "case {}", c.name);
        let st = &states[0];
        assert_eq!(
            ips(&st.cluster_endpoints),
            c.cluster,
            "cluster set, case {}",
            c.name
        );
        assert_eq!(
            ips(&st.local_endpoints),
            c.local,
            "local set, case {}",
            c.name
        );
        assert_eq!(
            st.internal_no_endpoint_verdict(),
            c.internal,
            "internal verdict, case {}",
            c.name
        );
        assert_eq!(
            st.external_no_endpoint_verdict(),
            c.external,
            "external verdict, case {}",
            c.name
        );
        assert!(
            st.cluster_endpoints.iter().all(|e| e.port == 8080),
            "target port, case {}",
            c.name
        );
    }
}

#[test]
fn slices_are_matched_by_port_name_protocol_and_family() {
    let svc = ServiceBuilder::new("ns", "dns")
        .cluster_ips(&["10.96.0.53", "fd00::53"])
        .port("dns", Protocol::Udp, 53)
        .port("dns-tcp", Protocol::Tcp, 53)
        .build();
    let v4 = SliceBuilder::new("ns", "dns", "dns-v4", "IPv4")
        .port("dns", Protocol::Udp, 5353)
        .port("dns-tcp", Protocol::Tcp, 5354)
        .port("dns", Protocol::Tcp, 9999) // same name, other protocol: not this port
        .endpoint(Ep::ready("10.0.0.1"))
        .endpoint(Ep::ready("fd00::99")) // wrong family inside an IPv4 slice: dropped
        .build();
    let v6 = SliceBuilder::new("ns", "dns", "dns-v6", "IPv6")
        .port("dns", Protocol::Udp, 5353)
        .endpoint(Ep::ready("fd00::1"))
        .build();
    let fqdn = SliceBuilder::new("ns", "dns", "dns-fqdn", "FQDN")
        .port("dns", Protocol::Udp, 53)
        .endpoint(Ep::ready("example.com"))
        .build();
    let headless = SliceBuilder::new("ns", "dns", "dns-h", "IPv4")
        .label(LABEL_HEADLESS, "")
        .port("dns", Protocol::Udp, 53)
        .endpoint(Ep::ready("10.0.0.77"))
        .build();
    let states = build(None, &[svc], &[v4, v6, fqdn, headless]);
    let got: Vec<(String, Vec<String>)> = states
        .iter()
        .map(|s| {
            (
                s.key.to_string(),
                s.endpoints.iter().map(|e| e.addr().to_string()).collect(),
            )
        })
        .collect();
    assert_eq!(
        got,
        vec![
            (
                "ns/dns:dns (IPv4)".to_string(),
                vec!["10.0.0.1:5353".to_string()]
            ),
            (
                "ns/dns:dns-tcp (IPv4)".to_string(),
                vec!["10.0.0.1:5354".to_string()]
            ),
            (
                "ns/dns:dns (IPv6)".to_string(),
                vec!["[fd00::1]:5353".to_string()]
            ),
            ("ns/dns:dns-tcp (IPv6)".to_string(), vec![]),
        ]
    );
}

#[test]
fn duplicate_endpoints_across_slices_prefer_non_terminating() {
    let a = web_slice()
        .endpoint(Ep::terminating("10.0.0.1", true))
        .build();
    let mut b = SliceBuilder::new("ns", "web", "web-b", "IPv4")
        .port("http", Protocol::Tcp, 8080)
        .endpoint(Ep::ready("10.0.0.1"))
        .build();
    let states = build(None, &[web().build()], &[a.clone(), b.clone()]);
    assert_eq!(states[0].endpoints.len(), 1);
    assert!(states[0].endpoints[0].ready, "non-terminating copy wins");
    // Order of slices does not matter.
    b.metadata.name = Some("web-0".into());
    let states = build(None, &[web().build()], &[a, b]);
    assert!(states[0].endpoints[0].ready);
}

#[test]
fn local_endpoints_are_those_on_this_node() {
    let slice = web_slice()
        .endpoint(Ep::ready("10.0.0.1").node(NODE))
        .endpoint(Ep::ready("10.0.0.2").node("node-b"))
        .endpoint(Ep::ready("10.0.0.3"))
        .build();
    let states = build(None, &[web().build()], &[slice]);
    let local: Vec<bool> = states[0].endpoints.iter().map(|e| e.is_local).collect();
    assert_eq!(local, vec![true, false, false]);
    let local_ready: BTreeSet<IpAddr> = states[0].local_ready_ips().collect();
    assert_eq!(local_ready, BTreeSet::from([ip("10.0.0.1")]));
}

#[test]
fn tracker_ignores_updates_that_change_nothing_the_proxy_uses() {
    let mut t = tracker(None);
    assert!(t.update_service(&web().build()));
    let slice = web_slice().endpoint(Ep::ready("10.0.0.1")).build();
    assert!(t.update_endpoint_slice(&slice));
    let diff = t.diff();
    t.commit(&diff);
    assert!(!t.has_pending());
    // Same content, other metadata (labels, annotations, resourceVersion).
    let mut again = web().build();
    again.metadata.resource_version = Some("42".into());
    again
        .metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert("x".into(), "y".into());
    assert!(!t.update_service(&again));
    let mut slice2 = slice.clone();
    slice2.metadata.resource_version = Some("43".into());
    assert!(!t.update_endpoint_slice(&slice2));
    assert!(!t.has_pending());
    // A real change.
    assert!(t.update_endpoint_slice(&web_slice().endpoint(Ep::ready("10.0.0.2")).build()));
    assert!(t.has_pending());
}

#[test]
fn tracker_diff_commit_and_removal() {
    let mut t = tracker(None);
    t.update_service(&web().build());
    t.update_endpoint_slice(&web_slice().endpoint(Ep::ready("10.0.0.1")).build());
    let d1 = t.diff();
    assert_eq!(d1.changes.len(), 1);
    assert!(d1.changes[0].is_added());
    assert!(
        d1.node_port_addresses.is_some(),
        "first diff carries the node port addresses"
    );
    // Not committed (backend failed): the same change is offered again.
    let again = t.diff();
    assert_eq!(again.changes.len(), 1);
    t.commit(&d1);
    assert!(t.diff().is_empty());

    // Endpoint change: previous and current both present.
    t.update_endpoint_slice(
        &web_slice()
            .endpoint(Ep::ready("10.0.0.1"))
            .endpoint(Ep::ready("10.0.0.2"))
            .build(),
    );
    let d2 = t.diff();
    assert_eq!(d2.changes.len(), 1);
    let c = &d2.changes[0];
    assert_eq!(c.previous.as_ref().map(|p| p.endpoints.len()), Some(1));
    assert_eq!(c.current.as_ref().map(|p| p.endpoints.len()), Some(2));
    t.commit(&d2);

    // Deleting the Service removes its port.
    assert!(t.delete_service("ns", "web"));
    let d3 = t.diff();
    assert_eq!(d3.changes.len(), 1);
    assert!(d3.changes[0].is_removed());
    t.commit(&d3);
    assert!(t.applied().is_empty());
}

#[test]
fn updates_during_a_sync_are_not_lost() {
    let mut t = tracker(None);
    t.update_service(&web().build());
    let d1 = t.diff();
    // While the backend programs d1, an endpoint arrives.
    t.update_endpoint_slice(&web_slice().endpoint(Ep::ready("10.0.0.1")).build());
    t.commit(&d1);
    assert!(t.has_pending(), "the newer update is still pending");
    let d2 = t.diff();
    assert_eq!(d2.changes.len(), 1);
    assert_eq!(
        d2.changes[0].current.as_ref().map(|s| s.endpoints.len()),
        Some(1)
    );
}

#[test]
fn replace_after_relist_deletes_what_disappeared() {
    let mut t = tracker(None);
    let other = ServiceBuilder::new("ns", "other")
        .cluster_ip("10.96.0.99")
        .port("", Protocol::Tcp, 1)
        .build();
    t.update_service(&web().build());
    t.update_service(&other);
    let s1 = web_slice().endpoint(Ep::ready("10.0.0.1")).build();
    t.update_endpoint_slice(&s1);
    let d = t.diff();
    t.commit(&d);
    assert_eq!(t.applied().len(), 2);
    // Relist: "other" and the slice are gone.
    assert!(t.replace_services([&web().build()]));
    assert!(t.replace_endpoint_slices(std::iter::empty::<&EndpointSlice>()));
    let d = t.diff();
    let removed: Vec<String> = d
        .changes
        .iter()
        .filter(|c| c.is_removed())
        .map(|c| c.key.to_string())
        .collect();
    assert_eq!(removed, vec!["ns/other (IPv4)".to_string()]);
    let web_change = d
        .changes
        .iter()
        .find(|c| &*c.key.name.service.name == "web");
    assert_eq!(
        web_change
            .and_then(|c| c.current.as_ref())
            .map(|s| s.endpoints.len()),
        Some(0)
    );
}

#[test]
fn zone_change_reevaluates_topology() {
    let mut t = tracker(Some("z1"));
    t.update_service(&web().build());
    t.update_endpoint_slice(
        &web_slice()
            .endpoint(Ep::ready("10.0.0.1").zone_hints(&["z1"]))
            .endpoint(Ep::ready("10.0.0.2").zone_hints(&["z2"]))
            .build(),
    );
    let d = t.diff();
    t.commit(&d);
    assert_eq!(
        ips(&t
            .applied()
            .values()
            .next()
            .map(|s| s.cluster_endpoints.clone())
            .unwrap_or_default()),
        vec!["10.0.0.1"]
    );
    assert!(t.set_node_zone(Some("z2".into())));
    let d = t.diff();
    assert_eq!(d.changes.len(), 1);
    t.commit(&d);
    assert_eq!(
        ips(&t
            .applied()
            .values()
            .next()
            .map(|s| s.cluster_endpoints.clone())
            .unwrap_or_default()),
        vec!["10.0.0.2"]
    );
}

#[test]
fn trigger_times_are_reported_once() {
    let mut t = tracker(None);
    t.update_service(&web().build());
    // A trigger time before the tracker started is ignored (kube-proxy does too).
    t.update_endpoint_slice(
        &web_slice()
            .endpoint(Ep::ready("10.0.0.1"))
            .trigger_time("2001-01-01T00:00:00Z")
            .build(),
    );
    let d = t.diff();
    assert!(d.trigger_times.is_empty());
    t.commit(&d);
    let future = "2999-01-01T00:00:00Z";
    t.update_endpoint_slice(
        &web_slice()
            .endpoint(Ep::ready("10.0.0.2"))
            .trigger_time(future)
            .build(),
    );
    let d = t.diff();
    assert_eq!(d.trigger_times.len(), 1);
    t.commit(&d);
    assert!(t.diff().trigger_times.is_empty());
}

#[test]
fn one_endpoint_added_among_ten_thousand_services_is_one_change() {
    let mut t = ChangeTracker::new([IpFamily::V4], node(None));
    for i in 0..10_000u32 {
        let name = format!("svc-{i}");
        let cip = format!("10.{}.{}.{}", 100 + i / 65536, (i / 256) % 256, i % 256);
        t.update_service(
            &ServiceBuilder::new("ns", &name)
                .cluster_ip(&cip)
                .port("p", Protocol::Tcp, 80)
                .build(),
        );
        t.update_endpoint_slice(
            &SliceBuilder::new("ns", &name, &format!("{name}-x"), "IPv4")
                .port("p", Protocol::Tcp, 8080)
                .endpoint(Ep::ready("10.1.0.1"))
                .endpoint(Ep::ready("10.1.0.2"))
                .build(),
        );
    }
    let d = t.diff();
    assert_eq!(d.changes.len(), 10_000);
    t.commit(&d);
    t.update_endpoint_slice(
        &SliceBuilder::new("ns", "svc-1234", "svc-1234-x", "IPv4")
            .port("p", Protocol::Tcp, 8080)
            .endpoint(Ep::ready("10.1.0.1"))
            .endpoint(Ep::ready("10.1.0.2"))
            .endpoint(Ep::ready("10.1.0.3"))
            .build(),
    );
    let d = t.diff();
    assert_eq!(d.changes.len(), 1);
    assert_eq!(&*d.changes[0].key.name.service.name, "svc-1234");
    assert!(d.node_port_addresses.is_none());
}
