//! Endpoints as the proxy sees them, read from `discovery.k8s.io/v1`
//! EndpointSlices (kube-proxy's `EndpointSliceCache`): one entry per
//! (address, port) with its conditions, node, zone and hints.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::SystemTime;

use k8s_openapi::api::discovery::v1::EndpointSlice;

use super::service::{LABEL_HEADLESS, LABEL_SERVICE_PROXY_NAME};
use super::types::{IpFamily, NamespacedName, Protocol};

/// Label naming the Service an EndpointSlice belongs to.
pub const LABEL_SERVICE_NAME: &str = "kubernetes.io/service-name";
/// Annotation carrying the time of the change that triggered the slice update
/// (RFC 3339), the start of the network-programming latency.
pub const ANNOTATION_LAST_CHANGE_TRIGGER_TIME: &str =
    "endpoints.kubernetes.io/last-change-trigger-time";

/// One endpoint of one service port.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Endpoint {
    /// The endpoint's address (`addresses[0]`).
    pub ip: IpAddr,
    /// The target port (from the slice port matching the service port).
    pub port: u16,
    /// `conditions.ready` (unset means true).
    pub ready: bool,
    /// `conditions.serving` (unset means true, as kube-proxy reads it).
    pub serving: bool,
    /// `conditions.terminating` (unset means false).
    pub terminating: bool,
    /// `nodeName`.
    pub node_name: Option<String>,
    /// `zone`.
    pub zone: Option<String>,
    /// `hints.forZones[].name`.
    pub zone_hints: BTreeSet<String>,
    /// `hints.forNodes[].name`.
    pub node_hints: BTreeSet<String>,
    /// `nodeName` is this node.
    pub is_local: bool,
}

impl Endpoint {
    /// `ip:port` (with brackets for IPv6).
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::new(self.ip, self.port)
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.addr())
    }
}

/// The part of an EndpointSlice the proxy keeps (kube-proxy keeps the same
/// subset): its family, ports and endpoints. Comparing two of them tells
/// whether an update changes anything for the proxy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SliceInfo {
    /// The Service the slice belongs to (`kubernetes.io/service-name`).
    pub service: NamespacedName,
    /// `metadata.name`.
    pub name: String,
    /// `addressType` (FQDN slices are not kept).
    pub family: IpFamily,
    /// Valid ports: named (possibly empty name) with a non-zero number.
    pub ports: Vec<SlicePort>,
    /// Endpoints with a parsable first address of the slice's family.
    pub endpoints: Vec<SliceEndpoint>,
}

/// One port of an EndpointSlice.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlicePort {
    /// `name` (matched against the service port's name).
    pub name: String,
    /// `protocol` (default TCP).
    pub protocol: Protocol,
    /// `port`.
    pub port: u16,
}

/// One endpoint of an EndpointSlice, before it is paired with a port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SliceEndpoint {
    /// `addresses[0]`.
    pub ip: IpAddr,
    /// `conditions.ready`, unset = true.
    pub ready: bool,
    /// `conditions.serving`, unset = true.
    pub serving: bool,
    /// `conditions.terminating`, unset = false.
    pub terminating: bool,
    /// `nodeName`.
    pub node_name: Option<String>,
    /// `zone`.
    pub zone: Option<String>,
    /// `hints.forZones`.
    pub zone_hints: BTreeSet<String>,
    /// `hints.forNodes`.
    pub node_hints: BTreeSet<String>,
}

/// Why an EndpointSlice is not used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SliceSkip {
    /// `addressType: FQDN` (or anything but IPv4/IPv6).
    #[error("address type {0} is not proxied")]
    AddressType(String),
    /// No `kubernetes.io/service-name` label, or no name/namespace.
    #[error("no {LABEL_SERVICE_NAME} label or no namespace/name")]
    NoServiceName,
    /// Owned by another proxy or belongs to a headless Service.
    #[error("labelled {0}")]
    Filtered(&'static str),
}

/// Reads the part of an EndpointSlice the proxy uses. Endpoints without an
/// address, or whose first address does not parse or is of the other family,
/// are dropped with a warning; ports without a name or number are dropped
/// (kube-proxy logs and ignores both).
pub fn slice_info(slice: &EndpointSlice) -> Result<SliceInfo, SliceSkip> {
    let meta = &slice.metadata;
    let family = IpFamily::from_k8s(&slice.address_type)
        .ok_or_else(|| SliceSkip::AddressType(slice.address_type.clone()))?;
    let labels = meta.labels.as_ref();
    if labels.is_some_and(|l| l.contains_key(LABEL_SERVICE_PROXY_NAME)) {
        return Err(SliceSkip::Filtered(LABEL_SERVICE_PROXY_NAME));
    }
    if labels.is_some_and(|l| l.contains_key(LABEL_HEADLESS)) {
        return Err(SliceSkip::Filtered(LABEL_HEADLESS));
    }
    let service_name = labels
        .and_then(|l| l.get(LABEL_SERVICE_NAME))
        .filter(|s| !s.is_empty())
        .ok_or(SliceSkip::NoServiceName)?;
    let (Some(namespace), Some(name)) = (meta.namespace.as_ref(), meta.name.as_ref()) else {
        return Err(SliceSkip::NoServiceName);
    };
    if namespace.is_empty() || name.is_empty() {
        return Err(SliceSkip::NoServiceName);
    }
    let service = NamespacedName::new(namespace.clone(), service_name.clone());

    let mut ports = Vec::new();
    for p in slice.ports.iter().flatten() {
        let Some(port_name) = p.name.clone() else {
            tracing::warn!(slice = %name, "ignoring EndpointSlice port with nil name");
            continue;
        };
        let Some(port) = p
            .port
            .and_then(|n| u16::try_from(n).ok())
            .filter(|n| *n != 0)
        else {
            tracing::warn!(slice = %name, port = %port_name, "ignoring invalid endpoint port");
            continue;
        };
        let protocol = match p.protocol.as_deref() {
            None => Protocol::Tcp,
            Some(s) => match Protocol::from_k8s(s) {
                Some(p) => p,
                None => {
                    tracing::warn!(slice = %name, protocol = s, "ignoring endpoint port with unknown protocol");
                    continue;
                }
            },
        };
        ports.push(SlicePort {
            name: port_name,
            protocol,
            port,
        });
    }
    ports.sort_by_key(|p| p.port);

    let mut endpoints = Vec::new();
    for ep in slice.endpoints.iter().flatten() {
        let Some(first) = ep.addresses.first() else {
            tracing::warn!(slice = %name, "ignoring endpoint with empty address");
            continue;
        };
        let ip: IpAddr = match first.trim().parse() {
            Ok(ip) => ip,
            Err(_) => {
                tracing::warn!(slice = %name, address = %first, "ignoring endpoint with unparsable address");
                continue;
            }
        };
        if IpFamily::of(&ip) != family {
            tracing::warn!(slice = %name, address = %ip, "ignoring endpoint of the wrong IP family");
            continue;
        }
        let cond = ep.conditions.as_ref();
        let hints = ep.hints.as_ref();
        endpoints.push(SliceEndpoint {
            ip,
            ready: cond.and_then(|c| c.ready).unwrap_or(true),
            serving: cond.and_then(|c| c.serving).unwrap_or(true),
            terminating: cond.and_then(|c| c.terminating).unwrap_or(false),
            node_name: ep.node_name.clone(),
            zone: ep.zone.clone(),
            zone_hints: hints
                .and_then(|h| h.for_zones.as_ref())
                .into_iter()
                .flatten()
                .map(|z| z.name.clone())
                .collect(),
            node_hints: hints
                .and_then(|h| h.for_nodes.as_ref())
                .into_iter()
                .flatten()
                .map(|n| n.name.clone())
                .collect(),
        });
    }
    endpoints.sort_by_key(|e| e.ip);
    Ok(SliceInfo {
        service,
        name: name.clone(),
        family,
        ports,
        endpoints,
    })
}

/// The `endpoints.kubernetes.io/last-change-trigger-time` of a slice, if set
/// and valid.
pub fn last_change_trigger_time(slice: &EndpointSlice) -> Option<SystemTime> {
    let value = slice
        .metadata
        .annotations
        .as_ref()?
        .get(ANNOTATION_LAST_CHANGE_TRIGGER_TIME)?;
    match value.parse::<jiff::Timestamp>() {
        Ok(ts) => Some(SystemTime::from(ts)),
        Err(e) => {
            tracing::warn!(value = %value, error = %e, "error parsing {ANNOTATION_LAST_CHANGE_TRIGGER_TIME}");
            None
        }
    }
}

/// Builds the endpoints of one service port (matched by port name and
/// protocol) from the slices of one family, deduplicated by `ip:port`
/// (preferring a non-terminating entry when an address appears twice) and
/// sorted by address.
pub fn endpoints_for_port<'a>(
    slices: impl IntoIterator<Item = &'a Arc<SliceInfo>>,
    port_name: &str,
    protocol: Protocol,
    node_name: &str,
) -> Vec<Endpoint> {
    let mut set: BTreeMap<SocketAddr, Endpoint> = BTreeMap::new();
    for slice in slices {
        for sp in slice
            .ports
            .iter()
            .filter(|p| p.name == port_name && p.protocol == protocol)
        {
            for ep in &slice.endpoints {
                let addr = SocketAddr::new(ep.ip, sp.port);
                if set.contains_key(&addr) && ep.terminating {
                    continue;
                }
                let is_local = !node_name.is_empty() && ep.node_name.as_deref() == Some(node_name);
                set.insert(
                    addr,
                    Endpoint {
                        ip: ep.ip,
                        port: sp.port,
                        ready: ep.ready,
                        serving: ep.serving,
                        terminating: ep.terminating,
                        node_name: ep.node_name.clone(),
                        zone: ep.zone.clone(),
                        zone_hints: ep.zone_hints.clone(),
                        node_hints: ep.node_hints.clone(),
                        is_local,
                    },
                );
            }
        }
    }
    set.into_values().collect()
}
