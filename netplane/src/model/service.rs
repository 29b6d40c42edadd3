//! What the proxy needs of a Service, per service port and IP family, and
//! how it is read from a `v1.Service` (kube-proxy's `BaseServicePortInfo` and
//! `serviceToServiceMap`, with the same filters and defaults).

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;

use ipnet::IpNet;
use k8s_openapi::api::core::v1::Service;

use super::types::{IpFamily, NamespacedName, Protocol, ServicePortName};

/// Label that hands a Service to another proxy; kube-proxy (and keelson)
/// ignore Services and EndpointSlices carrying it.
pub const LABEL_SERVICE_PROXY_NAME: &str = "service.kubernetes.io/service-proxy-name";
/// Label the EndpointSlice controller puts on slices of headless Services.
pub const LABEL_HEADLESS: &str = "service.kubernetes.io/headless";
/// Default `sessionAffinityConfig.clientIP.timeoutSeconds` (3 hours).
pub const DEFAULT_STICKY_TIMEOUT_SECONDS: u32 = 10_800;

/// `spec.sessionAffinity`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SessionAffinity {
    /// No affinity: every new connection picks an endpoint at random.
    None,
    /// `ClientIP`: a client keeps its endpoint for `timeout_seconds` after its
    /// last new connection.
    ClientIp {
        /// `sessionAffinityConfig.clientIP.timeoutSeconds` (default 10800).
        timeout_seconds: u32,
    },
}

/// One service port of one Service for one IP family: everything a data
/// plane needs to route traffic to it (kube-proxy's `ServicePort`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ServicePortInfo {
    /// The ClusterIP of this family.
    pub cluster_ip: IpAddr,
    /// `spec.ports[].port`.
    pub port: u16,
    /// `spec.ports[].protocol`.
    pub protocol: Protocol,
    /// `spec.ports[].nodePort`, when allocated.
    pub node_port: Option<u16>,
    /// `spec.externalIPs` of this family.
    pub external_ips: Vec<IpAddr>,
    /// `status.loadBalancer.ingress[].ip` of this family in VIP mode
    /// (`ipMode` unset or `VIP`; `Proxy` ingress IPs are not ours to capture).
    pub load_balancer_ips: Vec<IpAddr>,
    /// `spec.loadBalancerSourceRanges` of this family (whitespace trimmed).
    pub load_balancer_source_ranges: Vec<IpNet>,
    /// `spec.sessionAffinity` (+ timeout).
    pub session_affinity: SessionAffinity,
    /// `externalTrafficPolicy: Local` on an externally reachable Service type
    /// (NodePort, LoadBalancer, or ClusterIP with externalIPs).
    pub external_policy_local: bool,
    /// `internalTrafficPolicy: Local`.
    pub internal_policy_local: bool,
    /// `spec.healthCheckNodePort` of a LoadBalancer Service with
    /// `externalTrafficPolicy: Local`.
    pub health_check_node_port: Option<u16>,
    /// `spec.trafficDistribution` (informational: endpoint choice follows the
    /// hints the EndpointSlice controller derives from it, as in kube-proxy).
    pub traffic_distribution: Option<String>,
}

impl ServicePortInfo {
    /// Reachable by something other than its ClusterIP (NodePort,
    /// externalIPs or load-balancer IPs).
    pub fn externally_accessible(&self) -> bool {
        self.node_port.is_some()
            || !self.load_balancer_ips.is_empty()
            || !self.external_ips.is_empty()
    }

    /// Ever sends traffic to endpoints chosen by the Cluster policy: when the
    /// internal policy is Cluster, or whenever it takes external traffic (even
    /// with eTP=Local, pod and host traffic is short-circuited to Cluster).
    pub fn uses_cluster_endpoints(&self) -> bool {
        !self.internal_policy_local || self.externally_accessible()
    }

    /// Ever sends traffic to endpoints chosen by the Local policy.
    pub fn uses_local_endpoints(&self) -> bool {
        self.internal_policy_local || (self.external_policy_local && self.externally_accessible())
    }

    /// The sticky timeout when ClientIP affinity is on.
    pub fn affinity_timeout(&self) -> Option<u32> {
        match self.session_affinity {
            SessionAffinity::None => None,
            SessionAffinity::ClientIp { timeout_seconds } => Some(timeout_seconds),
        }
    }
}

/// Why a Service contributes no service ports (for one family).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SkipReason {
    /// `service.kubernetes.io/service-proxy-name` is set: another proxy owns it.
    OtherProxy(String),
    /// `clusterIP: None` or no ClusterIP at all.
    Headless,
    /// `type: ExternalName`.
    ExternalName,
    /// The Service has no ClusterIP of this family.
    NoClusterIpForFamily,
    /// The ClusterIP does not parse (the API validates it, so this is bad input).
    InvalidClusterIp(String),
}

/// The service ports of one Service for one family, or why there are none.
pub type ServicePorts = Result<BTreeMap<ServicePortName, Arc<ServicePortInfo>>, SkipReason>;

/// Reads the service ports of `svc` for `family`, following kube-proxy:
/// skipped when another proxy owns it, headless, ExternalName, or without a
/// ClusterIP of this family; other-family externalIPs, ingress IPs and source
/// ranges are filtered out; unparsable optional addresses are dropped with a
/// warning (never the whole Service).
pub fn service_ports(svc: &Service, family: IpFamily) -> ServicePorts {
    let meta = &svc.metadata;
    if let Some(proxy) = meta
        .labels
        .as_ref()
        .and_then(|l| l.get(LABEL_SERVICE_PROXY_NAME))
    {
        return Err(SkipReason::OtherProxy(proxy.clone()));
    }
    let Some(spec) = svc.spec.as_ref() else {
        return Err(SkipReason::Headless);
    };
    let cluster_ip = spec.cluster_ip.as_deref().unwrap_or("");
    if cluster_ip.is_empty() || cluster_ip == "None" {
        return Err(SkipReason::Headless);
    }
    if spec.type_.as_deref() == Some("ExternalName") {
        return Err(SkipReason::ExternalName);
    }
    let ip_str = cluster_ip_for_family(svc, family).ok_or(SkipReason::NoClusterIpForFamily)?;
    let cluster_ip: IpAddr = ip_str
        .trim()
        .parse()
        .map_err(|_| SkipReason::InvalidClusterIp(ip_str.to_string()))?;
    if IpFamily::of(&cluster_ip) != family {
        return Err(SkipReason::NoClusterIpForFamily);
    }

    let svc_name = NamespacedName::new(
        meta.namespace.clone().unwrap_or_default(),
        meta.name.clone().unwrap_or_default(),
    );
    let svc_type = spec.type_.as_deref().unwrap_or("ClusterIP");
    let external_ips_all = spec.external_ips.clone().unwrap_or_default();
    let externally_accessible_type = svc_type == "LoadBalancer"
        || svc_type == "NodePort"
        || (svc_type == "ClusterIP" && !external_ips_all.is_empty());
    let external_policy_local =
        externally_accessible_type && spec.external_traffic_policy.as_deref() == Some("Local");
    let internal_policy_local = spec.internal_traffic_policy.as_deref() == Some("Local");
    let session_affinity = if spec.session_affinity.as_deref() == Some("ClientIP") {
        let timeout = spec
            .session_affinity_config
            .as_ref()
            .and_then(|c| c.client_ip.as_ref())
            .and_then(|c| c.timeout_seconds)
            .and_then(|t| u32::try_from(t).ok())
            .unwrap_or(DEFAULT_STICKY_TIMEOUT_SECONDS);
        SessionAffinity::ClientIp {
            timeout_seconds: timeout,
        }
    } else {
        SessionAffinity::None
    };

    let external_ips = parse_ips_of_family(&svc_name, "externalIPs", &external_ips_all, family);
    let source_ranges: Vec<IpNet> = spec
        .load_balancer_source_ranges
        .iter()
        .flatten()
        .filter_map(|r| match r.trim().parse::<IpNet>() {
            Ok(net) => Some(net),
            Err(_) => {
                tracing::warn!(service = %svc_name, range = %r, "ignoring unparsable loadBalancerSourceRanges entry");
                None
            }
        })
        .filter(|net| IpFamily::of(&net.addr()) == family)
        .collect();
    let lb_ingress: Vec<String> = svc
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref())
        .into_iter()
        .flatten()
        .filter(|ing| matches!(ing.ip_mode.as_deref(), None | Some("VIP")))
        .filter_map(|ing| ing.ip.clone())
        .filter(|ip| !ip.is_empty())
        .collect();
    let load_balancer_ips =
        parse_ips_of_family(&svc_name, "loadBalancer ingress", &lb_ingress, family);
    let health_check_node_port = if svc_type == "LoadBalancer" && external_policy_local {
        match spec
            .health_check_node_port
            .and_then(|p| u16::try_from(p).ok())
            .filter(|p| *p != 0)
        {
            Some(p) => Some(p),
            None => {
                tracing::error!(service = %svc_name, "Service has no healthcheck nodeport");
                None
            }
        }
    } else {
        None
    };

    let mut out = BTreeMap::new();
    for port in spec.ports.iter().flatten() {
        let protocol = match port.protocol.as_deref() {
            None => Protocol::Tcp,
            Some(p) => match Protocol::from_k8s(p) {
                Some(p) => p,
                None => {
                    tracing::warn!(service = %svc_name, protocol = p, "ignoring service port with unknown protocol");
                    continue;
                }
            },
        };
        let Ok(port_num) = u16::try_from(port.port) else {
            tracing::warn!(service = %svc_name, port = port.port, "ignoring service port out of range");
            continue;
        };
        let node_port = port
            .node_port
            .and_then(|p| u16::try_from(p).ok())
            .filter(|p| *p != 0);
        let name = ServicePortName {
            service: svc_name.clone(),
            port: port.name.as_deref().unwrap_or_default().into(),
            protocol,
        };
        let info = ServicePortInfo {
            cluster_ip,
            port: port_num,
            protocol,
            node_port,
            external_ips: external_ips.clone(),
            load_balancer_ips: load_balancer_ips.clone(),
            load_balancer_source_ranges: source_ranges.clone(),
            session_affinity,
            external_policy_local,
            internal_policy_local,
            health_check_node_port,
            traffic_distribution: spec.traffic_distribution.clone(),
        };
        out.insert(name, Arc::new(info));
    }
    Ok(out)
}

/// kube-proxy's `GetClusterIPByFamily`: with `spec.ipFamilies` set, the
/// ClusterIP at the same index; otherwise (old objects) `spec.clusterIP` if
/// it is of the family.
fn cluster_ip_for_family(svc: &Service, family: IpFamily) -> Option<&str> {
    let spec = svc.spec.as_ref()?;
    let families = spec.ip_families.as_deref().unwrap_or(&[]);
    if families.is_empty() {
        let ip = spec.cluster_ip.as_deref()?;
        let parsed: IpAddr = ip.trim().parse().ok()?;
        return (IpFamily::of(&parsed) == family).then_some(ip);
    }
    let idx = families
        .iter()
        .position(|f| IpFamily::from_k8s(f) == Some(family))?;
    spec.cluster_ips.as_ref()?.get(idx).map(String::as_str)
}

fn parse_ips_of_family(
    svc: &NamespacedName,
    field: &str,
    ips: &[String],
    family: IpFamily,
) -> Vec<IpAddr> {
    ips.iter()
        .filter_map(|s| match s.trim().parse::<IpAddr>() {
            Ok(ip) => Some(ip),
            Err(_) => {
                tracing::warn!(service = %svc, field, value = %s, "ignoring unparsable IP");
                None
            }
        })
        .filter(|ip| IpFamily::of(ip) == family)
        .collect()
}
