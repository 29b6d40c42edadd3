//! Builders of `v1.Service` and `discovery.k8s.io/v1` EndpointSlice objects
//! for tests, the shared Service-case table and benchmarks, and a few
//! model values (a ClusterIP port, an endpoint, a port's state) for the
//! backends' own tests. They produce
//! what the API server would store (defaults filled in: `ipFamilies`,
//! `clusterIPs`, protocol TCP, `kubernetes.io/service-name` label).

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{
    ClientIPConfig, LoadBalancerIngress, LoadBalancerStatus, Service, ServicePort, ServiceSpec,
    ServiceStatus, SessionAffinityConfig,
};
use k8s_openapi::api::discovery::v1::{
    Endpoint as K8sEndpoint, EndpointConditions, EndpointHints, EndpointPort, EndpointSlice,
    ForNode, ForZone,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::model::{
    ANNOTATION_LAST_CHANGE_TRIGGER_TIME, Endpoint, IpFamily, LABEL_SERVICE_NAME, NodeTopology,
    Protocol, ServicePortInfo, ServicePortKey, ServicePortName, ServicePortState, SessionAffinity,
    SliceEndpoint,
};

/// Builds a Service.
#[derive(Debug, Clone)]
pub struct ServiceBuilder {
    svc: Service,
}

impl ServiceBuilder {
    /// A `type: ClusterIP` Service without ports or IPs.
    pub fn new(namespace: &str, name: &str) -> Self {
        ServiceBuilder {
            svc: Service {
                metadata: ObjectMeta {
                    namespace: Some(namespace.into()),
                    name: Some(name.into()),
                    ..Default::default()
                },
                spec: Some(ServiceSpec {
                    type_: Some("ClusterIP".into()),
                    session_affinity: Some("None".into()),
                    internal_traffic_policy: Some("Cluster".into()),
                    ..Default::default()
                }),
                status: None,
            },
        }
    }

    fn spec(&mut self) -> &mut ServiceSpec {
        self.svc.spec.get_or_insert_with(Default::default)
    }

    /// Sets `clusterIP`, `clusterIPs` and `ipFamilies` from the given IPs
    /// (first is primary). `"None"` makes the Service headless.
    pub fn cluster_ips(mut self, ips: &[&str]) -> Self {
        let spec = self.spec();
        spec.cluster_ip = ips.first().map(|s| s.to_string());
        if ips.first() == Some(&"None") {
            spec.cluster_ips = Some(vec!["None".into()]);
            return self;
        }
        spec.cluster_ips = Some(ips.iter().map(|s| s.to_string()).collect());
        spec.ip_families = Some(
            ips.iter()
                .map(|s| if s.contains(':') { "IPv6" } else { "IPv4" }.to_string())
                .collect(),
        );
        spec.ip_family_policy = Some(
            if ips.len() > 1 {
                "RequireDualStack"
            } else {
                "SingleStack"
            }
            .into(),
        );
        self
    }

    /// Shorthand for one ClusterIP.
    pub fn cluster_ip(self, ip: &str) -> Self {
        self.cluster_ips(&[ip])
    }

    /// Sets `type` (`ClusterIP`, `NodePort`, `LoadBalancer`, `ExternalName`).
    /// Non-ClusterIP types get `externalTrafficPolicy: Cluster` by default.
    pub fn type_(mut self, t: &str) -> Self {
        let spec = self.spec();
        spec.type_ = Some(t.into());
        if t == "NodePort" || t == "LoadBalancer" {
            spec.external_traffic_policy
                .get_or_insert_with(|| "Cluster".into());
        }
        self
    }

    /// Adds a port (`targetPort` = `port`; no NodePort).
    pub fn port(mut self, name: &str, protocol: Protocol, port: u16) -> Self {
        self.spec()
            .ports
            .get_or_insert_with(Vec::new)
            .push(ServicePort {
                name: (!name.is_empty()).then(|| name.into()),
                protocol: Some(protocol.as_k8s().into()),
                port: port.into(),
                ..Default::default()
            });
        self
    }

    /// Adds a port with a NodePort.
    pub fn node_port(mut self, name: &str, protocol: Protocol, port: u16, node_port: u16) -> Self {
        self.spec()
            .ports
            .get_or_insert_with(Vec::new)
            .push(ServicePort {
                name: (!name.is_empty()).then(|| name.into()),
                protocol: Some(protocol.as_k8s().into()),
                port: port.into(),
                node_port: Some(node_port.into()),
                ..Default::default()
            });
        self
    }

    /// Sets `externalIPs`.
    pub fn external_ips(mut self, ips: &[&str]) -> Self {
        self.spec().external_ips = Some(ips.iter().map(|s| s.to_string()).collect());
        self
    }

    /// Adds a `status.loadBalancer.ingress` IP (`ipMode` unset = VIP).
    pub fn lb_ingress(self, ip: &str) -> Self {
        self.lb_ingress_mode(ip, None)
    }

    /// Adds a `status.loadBalancer.ingress` IP with an `ipMode`.
    pub fn lb_ingress_mode(mut self, ip: &str, mode: Option<&str>) -> Self {
        let status = self.svc.status.get_or_insert_with(ServiceStatus::default);
        let lb = status
            .load_balancer
            .get_or_insert_with(LoadBalancerStatus::default);
        lb.ingress
            .get_or_insert_with(Vec::new)
            .push(LoadBalancerIngress {
                ip: Some(ip.into()),
                ip_mode: mode.map(Into::into),
                ..Default::default()
            });
        self
    }

    /// Sets `loadBalancerSourceRanges`.
    pub fn source_ranges(mut self, ranges: &[&str]) -> Self {
        self.spec().load_balancer_source_ranges =
            Some(ranges.iter().map(|s| s.to_string()).collect());
        self
    }

    /// `externalTrafficPolicy: Local` (+ `healthCheckNodePort` when given).
    pub fn external_traffic_local(mut self, health_check_node_port: Option<u16>) -> Self {
        let spec = self.spec();
        spec.external_traffic_policy = Some("Local".into());
        spec.health_check_node_port = health_check_node_port.map(Into::into);
        self
    }

    /// `internalTrafficPolicy: Local`.
    pub fn internal_traffic_local(mut self) -> Self {
        self.spec().internal_traffic_policy = Some("Local".into());
        self
    }

    /// `sessionAffinity: ClientIP` with a timeout.
    pub fn client_ip_affinity(mut self, timeout_seconds: i32) -> Self {
        let spec = self.spec();
        spec.session_affinity = Some("ClientIP".into());
        spec.session_affinity_config = Some(SessionAffinityConfig {
            client_ip: Some(ClientIPConfig {
                timeout_seconds: Some(timeout_seconds),
            }),
        });
        self
    }

    /// Sets `trafficDistribution`.
    pub fn traffic_distribution(mut self, value: &str) -> Self {
        self.spec().traffic_distribution = Some(value.into());
        self
    }

    /// Adds a label.
    pub fn label(mut self, key: &str, value: &str) -> Self {
        self.svc
            .metadata
            .labels
            .get_or_insert_with(BTreeMap::new)
            .insert(key.into(), value.into());
        self
    }

    /// The Service.
    pub fn build(self) -> Service {
        self.svc
    }
}

/// One endpoint of a slice.
#[derive(Debug, Clone)]
pub struct EndpointSpec {
    ip: String,
    ready: Option<bool>,
    serving: Option<bool>,
    terminating: Option<bool>,
    node: Option<String>,
    zone: Option<String>,
    zone_hints: Vec<String>,
    node_hints: Vec<String>,
}

impl EndpointSpec {
    /// A ready endpoint (conditions as the controller writes them).
    pub fn ready(ip: &str) -> Self {
        EndpointSpec {
            ip: ip.into(),
            ready: Some(true),
            serving: Some(true),
            terminating: Some(false),
            node: None,
            zone: None,
            zone_hints: Vec::new(),
            node_hints: Vec::new(),
        }
    }

    /// A not-ready, not-terminating endpoint.
    pub fn not_ready(ip: &str) -> Self {
        EndpointSpec {
            ready: Some(false),
            serving: Some(false),
            ..Self::ready(ip)
        }
    }

    /// A terminating endpoint, still serving or not.
    pub fn terminating(ip: &str, serving: bool) -> Self {
        EndpointSpec {
            ready: Some(false),
            serving: Some(serving),
            terminating: Some(true),
            ..Self::ready(ip)
        }
    }

    /// Sets the conditions directly (`None` = unset).
    pub fn conditions(
        mut self,
        ready: Option<bool>,
        serving: Option<bool>,
        terminating: Option<bool>,
    ) -> Self {
        self.ready = ready;
        self.serving = serving;
        self.terminating = terminating;
        self
    }

    /// Sets `nodeName`.
    pub fn node(mut self, node: &str) -> Self {
        self.node = Some(node.into());
        self
    }

    /// Sets `zone`.
    pub fn zone(mut self, zone: &str) -> Self {
        self.zone = Some(zone.into());
        self
    }

    /// Adds `hints.forZones`.
    pub fn zone_hints(mut self, zones: &[&str]) -> Self {
        self.zone_hints.extend(zones.iter().map(|s| s.to_string()));
        self
    }

    /// Adds `hints.forNodes`.
    pub fn node_hints(mut self, nodes: &[&str]) -> Self {
        self.node_hints.extend(nodes.iter().map(|s| s.to_string()));
        self
    }

    fn build(&self) -> K8sEndpoint {
        let hints =
            (!self.zone_hints.is_empty() || !self.node_hints.is_empty()).then(|| EndpointHints {
                for_zones: (!self.zone_hints.is_empty()).then(|| {
                    self.zone_hints
                        .iter()
                        .map(|z| ForZone { name: z.clone() })
                        .collect()
                }),
                for_nodes: (!self.node_hints.is_empty()).then(|| {
                    self.node_hints
                        .iter()
                        .map(|n| ForNode { name: n.clone() })
                        .collect()
                }),
            });
        K8sEndpoint {
            addresses: vec![self.ip.clone()],
            conditions: Some(EndpointConditions {
                ready: self.ready,
                serving: self.serving,
                terminating: self.terminating,
            }),
            node_name: self.node.clone(),
            zone: self.zone.clone(),
            hints,
            ..Default::default()
        }
    }
}

/// Builds an EndpointSlice.
#[derive(Debug, Clone)]
pub struct SliceBuilder {
    slice: EndpointSlice,
    endpoints: Vec<EndpointSpec>,
}

impl SliceBuilder {
    /// A slice named `slice_name` of `service` with address type `IPv4` or `IPv6`.
    pub fn new(namespace: &str, service: &str, slice_name: &str, address_type: &str) -> Self {
        let mut labels = BTreeMap::new();
        labels.insert(LABEL_SERVICE_NAME.to_string(), service.to_string());
        labels.insert(
            "endpointslice.kubernetes.io/managed-by".to_string(),
            "endpointslice-controller.k8s.io".to_string(),
        );
        SliceBuilder {
            slice: EndpointSlice {
                address_type: address_type.into(),
                endpoints: None,
                metadata: ObjectMeta {
                    namespace: Some(namespace.into()),
                    name: Some(slice_name.into()),
                    labels: Some(labels),
                    ..Default::default()
                },
                ports: None,
            },
            endpoints: Vec::new(),
        }
    }

    /// Adds a port (name may be empty, as for a Service's single unnamed port).
    pub fn port(mut self, name: &str, protocol: Protocol, port: u16) -> Self {
        self.slice
            .ports
            .get_or_insert_with(Vec::new)
            .push(EndpointPort {
                name: Some(name.into()),
                protocol: Some(protocol.as_k8s().into()),
                port: Some(port.into()),
                app_protocol: None,
            });
        self
    }

    /// Adds an endpoint.
    pub fn endpoint(mut self, ep: EndpointSpec) -> Self {
        self.endpoints.push(ep);
        self
    }

    /// Sets `endpoints.kubernetes.io/last-change-trigger-time`.
    pub fn trigger_time(mut self, rfc3339: &str) -> Self {
        self.slice
            .metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(ANNOTATION_LAST_CHANGE_TRIGGER_TIME.into(), rfc3339.into());
        self
    }

    /// Adds a label.
    pub fn label(mut self, key: &str, value: &str) -> Self {
        self.slice
            .metadata
            .labels
            .get_or_insert_with(BTreeMap::new)
            .insert(key.into(), value.into());
        self
    }

    /// The EndpointSlice.
    pub fn build(self) -> EndpointSlice {
        let mut slice = self.slice;
        slice.endpoints = Some(self.endpoints.iter().map(EndpointSpec::build).collect());
        slice
    }
}

// ---- model values, for tests of what renders from the model ----

/// A ClusterIP-only service port (no NodePort, external or load-balancer
/// IPs, no affinity, `Cluster` traffic policies).
pub fn cluster_ip_port(cluster_ip: IpAddr, port: u16, protocol: Protocol) -> ServicePortInfo {
    ServicePortInfo {
        cluster_ip,
        port,
        protocol,
        node_port: None,
        external_ips: Vec::new(),
        load_balancer_ips: Vec::new(),
        load_balancer_source_ranges: Vec::new(),
        session_affinity: SessionAffinity::None,
        external_policy_local: false,
        internal_policy_local: false,
        health_check_node_port: None,
        traffic_distribution: None,
    }
}

/// A serving endpoint `ip:port` on `node`, as seen from node [`LOCAL_NODE`].
pub fn model_endpoint(
    ip: IpAddr,
    port: u16,
    ready: bool,
    terminating: bool,
    node: &str,
) -> Endpoint {
    let core = SliceEndpoint {
        ip,
        ready,
        serving: true,
        terminating,
        node_name: Some(node.into()),
        zone: None,
        hints: None,
    };
    Endpoint::new(Arc::new(core), port, LOCAL_NODE)
}

/// The node [`port_state`] and [`model_endpoint`] see from (no zone).
pub const LOCAL_NODE: &str = "me";

/// The state of port `p` of Service `ns/<service>` (family from the
/// ClusterIP) on node [`LOCAL_NODE`].
pub fn port_state(
    service: &str,
    info: ServicePortInfo,
    endpoints: Vec<Endpoint>,
) -> ServicePortState {
    let key = ServicePortKey {
        family: IpFamily::of(&info.cluster_ip),
        name: ServicePortName::new("ns", service, "p", info.protocol),
    };
    ServicePortState::new(
        key,
        Arc::new(info),
        endpoints,
        &NodeTopology {
            name: LOCAL_NODE.into(),
            zone: None,
        },
    )
}
