//! Endpoints as the proxy sees them, read from `discovery.k8s.io/v1`
//! EndpointSlices (kube-proxy's `EndpointSliceCache`): one entry per
//! (address, port) with its conditions, node, zone and hints.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::ops::Deref;
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

/// One endpoint of one service port: what its slice says about the address
/// (shared with the slice and with the Service's other ports, not copied)
/// plus the port and whether it is on this node. Dereferences to the
/// [`SliceEndpoint`], so `ep.ip`, `ep.ready`, `ep.node_name` read through.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Endpoint {
    /// What the slice says about the address.
    pub core: Arc<SliceEndpoint>,
    /// The target port (from the slice port matching the service port).
    pub port: u16,
    /// `nodeName` is this node.
    pub is_local: bool,
}

impl Deref for Endpoint {
    type Target = SliceEndpoint;
    fn deref(&self) -> &SliceEndpoint {
        &self.core
    }
}

impl Endpoint {
    /// The endpoint of `core` on `port`; local when `nodeName` is `node_name`.
    pub fn new(core: Arc<SliceEndpoint>, port: u16, node_name: &str) -> Endpoint {
        let is_local = !node_name.is_empty() && core.node_name.as_deref() == Some(node_name);
        Endpoint {
            core,
            port,
            is_local,
        }
    }

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

/// Topology hints of an endpoint (`hints.forZones`, `hints.forNodes`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct EndpointHints {
    /// `forZones[].name`, sorted, distinct.
    pub zones: Box<[Arc<str>]>,
    /// `forNodes[].name`, sorted, distinct.
    pub nodes: Box<[Arc<str>]>,
}

/// Interned names (node names, zones, hints): every endpoint of a node
/// shares one string.
#[derive(Debug, Default)]
pub struct Names(HashSet<Arc<str>>);

impl Names {
    /// The shared copy of `s`.
    pub fn get(&mut self, s: &str) -> Arc<str> {
        if let Some(a) = self.0.get(s) {
            return a.clone();
        }
        let a: Arc<str> = s.into();
        self.0.insert(a.clone());
        a
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
    pub endpoints: Vec<Arc<SliceEndpoint>>,
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

/// One endpoint address of an EndpointSlice, before it is paired with a
/// port (and shared by the Endpoint of each port).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
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
    pub node_name: Option<Arc<str>>,
    /// `zone`.
    pub zone: Option<Arc<str>>,
    /// `hints` (none for most endpoints).
    pub hints: Option<Box<EndpointHints>>,
}

impl SliceEndpoint {
    /// `hints.forZones[].name`.
    pub fn zone_hints(&self) -> &[Arc<str>] {
        self.hints.as_deref().map_or(&[], |h| &h.zones)
    }

    /// `hints.forNodes[].name`.
    pub fn node_hints(&self) -> &[Arc<str>] {
        self.hints.as_deref().map_or(&[], |h| &h.nodes)
    }
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
    slice_info_with(slice, &mut Names::default())
}

/// [`slice_info`], sharing node names, zones and hints through `names`.
pub fn slice_info_with(slice: &EndpointSlice, names: &mut Names) -> Result<SliceInfo, SliceSkip> {
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
        let mut names_of = |list: Vec<&str>| -> Box<[Arc<str>]> {
            let set: BTreeSet<&str> = list.into_iter().collect();
            set.into_iter().map(|n| names.get(n)).collect()
        };
        let zones = names_of(
            hints
                .and_then(|h| h.for_zones.as_ref())
                .into_iter()
                .flatten()
                .map(|z| z.name.as_str())
                .collect(),
        );
        let nodes = names_of(
            hints
                .and_then(|h| h.for_nodes.as_ref())
                .into_iter()
                .flatten()
                .map(|n| n.name.as_str())
                .collect(),
        );
        let hints = (!zones.is_empty() || !nodes.is_empty())
            .then(|| Box::new(EndpointHints { zones, nodes }));
        endpoints.push(Arc::new(SliceEndpoint {
            ip,
            ready: cond.and_then(|c| c.ready).unwrap_or(true),
            serving: cond.and_then(|c| c.serving).unwrap_or(true),
            terminating: cond.and_then(|c| c.terminating).unwrap_or(false),
            node_name: ep.node_name.as_deref().map(|n| names.get(n)),
            zone: ep.zone.as_deref().map(|z| names.get(z)),
            hints,
        }));
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
                set.insert(addr, Endpoint::new(ep.clone(), sp.port, node_name));
            }
        }
    }
    set.into_values().collect()
}
