//! The Services and EndpointSlices the proxy role watches, parsed down to
//! the fields it reads.
//!
//! kube-proxy's informers keep whole objects; keelson's watchers parse
//! each list and watch event into these types instead, which leave out
//! what the proxy never reads: `managedFields`, every annotation but the
//! EndpointSlice trigger time (`kubectl.kubernetes.io/last-applied-configuration`
//! can be kilobytes), `uid`, owner references, and the endpoints'
//! `targetRef` and `deprecatedTopology`. Skipped JSON is never allocated
//! (serde ignores unknown fields as it reads them). The objects are the
//! ordinary `k8s-openapi` types with those fields left empty, so the model
//! reads them as it reads any Service or EndpointSlice.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;

use k8s_openapi::api::core::v1::{
    LoadBalancerIngress, LoadBalancerStatus, Service, ServicePort, ServiceSpec, ServiceStatus,
    SessionAffinityConfig,
};
use k8s_openapi::api::discovery::v1::{
    Endpoint, EndpointConditions, EndpointHints, EndpointPort, EndpointSlice,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use keelson_netplane::model::{
    ANNOTATION_LAST_CHANGE_TRIGGER_TIME, LABEL_HEADLESS, LABEL_SERVICE_NAME,
    LABEL_SERVICE_PROXY_NAME,
};
use serde::de::{IgnoredAny, MapAccess, Visitor};
use serde::{Deserialize, Deserializer};

/// The metadata the proxy reads: the labels that select (or hand away) an
/// object and the trigger-time annotation; other labels and annotations
/// are skipped.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Meta {
    name: Option<String>,
    namespace: Option<String>,
    resource_version: Option<String>,
    #[serde(default, deserialize_with = "proxy_labels")]
    labels: Option<BTreeMap<String, String>>,
    #[serde(default, deserialize_with = "trigger_time_only")]
    annotations: Option<BTreeMap<String, String>>,
}

/// The labels the proxy reads.
const LABELS: &[&str] = &[LABEL_SERVICE_NAME, LABEL_SERVICE_PROXY_NAME, LABEL_HEADLESS];

impl From<Meta> for ObjectMeta {
    fn from(m: Meta) -> ObjectMeta {
        ObjectMeta {
            name: m.name,
            namespace: m.namespace,
            resource_version: m.resource_version,
            labels: m.labels.filter(|l| !l.is_empty()),
            annotations: m.annotations.filter(|a| !a.is_empty()),
            ..ObjectMeta::default()
        }
    }
}

fn proxy_labels<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<BTreeMap<String, String>>, D::Error> {
    d.deserialize_option(Only(LABELS))
}

/// Keeps `endpoints.kubernetes.io/last-change-trigger-time` of an
/// annotation map.
fn trigger_time_only<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<BTreeMap<String, String>>, D::Error> {
    d.deserialize_option(Only(&[ANNOTATION_LAST_CHANGE_TRIGGER_TIME]))
}

/// Reads a string map keeping only the given keys; the others are skipped
/// without being allocated.
struct Only(&'static [&'static str]);

impl<'de> Visitor<'de> for Only {
    type Value = Option<BTreeMap<String, String>>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a map of strings")
    }
    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_none<E>(self) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_some<D2: Deserializer<'de>>(self, d: D2) -> Result<Self::Value, D2::Error> {
        d.deserialize_map(self)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut out = BTreeMap::new();
        while let Some(key) = map.next_key::<Cow<'de, str>>()? {
            if self.0.contains(&&*key) {
                out.insert(key.into_owned(), map.next_value::<String>()?);
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(Some(out))
    }
}

/// The spec fields of a Service the proxy reads (kube-proxy's
/// `ServicePort` and `serviceToServiceMap`): not the selector, nor
/// `externalName`, `loadBalancerClass`, `publishNotReadyAddresses`, ...
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
struct SlimSpec {
    #[serde(rename = "type")]
    type_: Option<String>,
    #[serde(rename = "clusterIP")]
    cluster_ip: Option<String>,
    #[serde(rename = "clusterIPs")]
    cluster_ips: Option<Vec<String>>,
    ip_families: Option<Vec<String>>,
    ports: Option<Vec<SlimPort>>,
    #[serde(rename = "externalIPs")]
    external_ips: Option<Vec<String>>,
    load_balancer_source_ranges: Option<Vec<String>>,
    session_affinity: Option<String>,
    session_affinity_config: Option<SessionAffinityConfig>,
    external_traffic_policy: Option<String>,
    internal_traffic_policy: Option<String>,
    health_check_node_port: Option<i32>,
    traffic_distribution: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
struct SlimPort {
    name: Option<String>,
    protocol: Option<String>,
    port: i32,
    node_port: Option<i32>,
}

/// A v1 Service as the proxy reads it (see the module docs);
/// [`ProxyService::to_api`] gives the API object the model reads.
#[derive(Clone, Debug, PartialEq)]
pub struct ProxyService {
    metadata: ObjectMeta,
    spec: Option<SlimSpec>,
    ingress: Option<Vec<LoadBalancerIngress>>,
}

impl ProxyService {
    /// The Service as an API object (with only the fields the proxy reads).
    pub fn to_api(&self) -> Service {
        let spec = self.spec.as_ref().map(|s| ServiceSpec {
            type_: s.type_.clone(),
            cluster_ip: s.cluster_ip.clone(),
            cluster_ips: s.cluster_ips.clone(),
            ip_families: s.ip_families.clone(),
            ports: s.ports.as_ref().map(|ports| {
                ports
                    .iter()
                    .map(|p| ServicePort {
                        name: p.name.clone(),
                        protocol: p.protocol.clone(),
                        port: p.port,
                        node_port: p.node_port,
                        ..ServicePort::default()
                    })
                    .collect()
            }),
            external_ips: s.external_ips.clone(),
            load_balancer_source_ranges: s.load_balancer_source_ranges.clone(),
            session_affinity: s.session_affinity.clone(),
            session_affinity_config: s.session_affinity_config.clone(),
            external_traffic_policy: s.external_traffic_policy.clone(),
            internal_traffic_policy: s.internal_traffic_policy.clone(),
            health_check_node_port: s.health_check_node_port,
            traffic_distribution: s.traffic_distribution.clone(),
            ..ServiceSpec::default()
        });
        Service {
            metadata: self.metadata.clone(),
            spec,
            status: self.ingress.as_ref().map(|ingress| ServiceStatus {
                load_balancer: Some(LoadBalancerStatus {
                    ingress: Some(ingress.clone()),
                }),
                ..ServiceStatus::default()
            }),
        }
    }
}

impl<'de> Deserialize<'de> for ProxyService {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Lb {
            ingress: Option<Vec<LoadBalancerIngress>>,
        }
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Status {
            load_balancer: Option<Lb>,
        }
        #[derive(Deserialize)]
        struct Raw {
            metadata: Meta,
            spec: Option<SlimSpec>,
            status: Option<Status>,
        }
        let raw = Raw::deserialize(d)?;
        Ok(ProxyService {
            metadata: raw.metadata.into(),
            spec: raw.spec,
            ingress: raw
                .status
                .and_then(|s| s.load_balancer)
                .and_then(|lb| lb.ingress)
                .filter(|i| !i.is_empty()),
        })
    }
}

/// One endpoint of a slice as the proxy reads it: no `targetRef`, no
/// `deprecatedTopology`, and only the first address (the one kube-proxy
/// uses). A quarter of the size of the API type, which keeps an inline
/// `targetRef` for every endpoint; the initial list holds thousands.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
struct SlimEndpoint {
    #[serde(default, deserialize_with = "first_address")]
    addresses: Option<String>,
    conditions: Option<EndpointConditions>,
    #[serde(default, deserialize_with = "boxed_hints")]
    hints: Option<Box<EndpointHints>>,
    node_name: Option<String>,
    zone: Option<String>,
}

fn first_address<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    let all: Option<Vec<String>> = Option::deserialize(d)?;
    Ok(all.and_then(|a| a.into_iter().next()))
}

fn boxed_hints<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Box<EndpointHints>>, D::Error> {
    Ok(Option::<EndpointHints>::deserialize(d)?.map(Box::new))
}

/// A discovery.k8s.io/v1 EndpointSlice as the proxy reads it (see the
/// module docs); [`ProxyEndpointSlice::to_api`] gives the API object the
/// model reads.
#[derive(Clone, Debug, PartialEq)]
pub struct ProxyEndpointSlice {
    metadata: ObjectMeta,
    address_type: String,
    endpoints: Vec<SlimEndpoint>,
    ports: Option<Vec<EndpointPort>>,
}

impl ProxyEndpointSlice {
    /// The slice as an API object (with only the fields the proxy reads).
    pub fn to_api(&self) -> EndpointSlice {
        EndpointSlice {
            metadata: self.metadata.clone(),
            address_type: self.address_type.clone(),
            endpoints: Some(
                self.endpoints
                    .iter()
                    .map(|e| Endpoint {
                        addresses: e.addresses.iter().cloned().collect(),
                        conditions: e.conditions.clone(),
                        hints: e.hints.as_deref().cloned(),
                        node_name: e.node_name.clone(),
                        zone: e.zone.clone(),
                        ..Endpoint::default()
                    })
                    .collect(),
            ),
            ports: self.ports.clone(),
        }
    }
}

impl<'de> Deserialize<'de> for ProxyEndpointSlice {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Raw {
            metadata: Meta,
            #[serde(default)]
            address_type: String,
            endpoints: Option<Vec<SlimEndpoint>>,
            ports: Option<Vec<EndpointPort>>,
        }
        let raw = Raw::deserialize(d)?;
        Ok(ProxyEndpointSlice {
            metadata: raw.metadata.into(),
            address_type: raw.address_type,
            endpoints: raw.endpoints.unwrap_or_default(),
            ports: raw.ports,
        })
    }
}

macro_rules! resource {
    ($ty:ty, $kind:literal, $group:literal, $version:literal, $plural:literal, $meta:expr, $meta_mut:expr) => {
        impl kube::Resource for $ty {
            type DynamicType = ();
            type Scope = k8s_openapi::NamespaceResourceScope;

            fn kind(_: &()) -> Cow<'_, str> {
                $kind.into()
            }
            fn group(_: &()) -> Cow<'_, str> {
                $group.into()
            }
            fn version(_: &()) -> Cow<'_, str> {
                $version.into()
            }
            fn plural(_: &()) -> Cow<'_, str> {
                $plural.into()
            }
            fn meta(&self) -> &ObjectMeta {
                let f: fn(&$ty) -> &ObjectMeta = $meta;
                f(self)
            }
            fn meta_mut(&mut self) -> &mut ObjectMeta {
                let f: fn(&mut $ty) -> &mut ObjectMeta = $meta_mut;
                f(self)
            }
        }
    };
}

resource!(
    ProxyService,
    "Service",
    "",
    "v1",
    "services",
    |s| &s.metadata,
    |s| &mut s.metadata
);
resource!(
    ProxyEndpointSlice,
    "EndpointSlice",
    "discovery.k8s.io",
    "v1",
    "endpointslices",
    |s| &s.metadata,
    |s| &mut s.metadata
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_service_keeps_what_the_proxy_reads_and_nothing_else() {
        let json = serde_json::json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {
                "name": "web", "namespace": "ns", "uid": "u-1", "resourceVersion": "42",
                "labels": {"service.kubernetes.io/service-proxy-name": "other", "app": "web"},
                "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{\"big\":1}"},
                "managedFields": [{"manager": "kubectl", "fieldsV1": {"f:spec": {}}}]
            },
            "spec": {"clusterIP": "10.96.0.1", "ports": [{"port": 80}], "externalTrafficPolicy": "Local"},
            "status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.1", "ipMode": "VIP"}]}}
        });
        let slim: ProxyService = serde_json::from_value(json).expect("parses");
        let s = slim.to_api();
        assert_eq!(s.metadata.name.as_deref(), Some("web"));
        assert_eq!(s.metadata.resource_version.as_deref(), Some("42"));
        assert_eq!(
            s.metadata.labels.as_ref().map(|l| l.len()),
            Some(1),
            "only the label that selects the proxy"
        );
        assert_eq!(s.metadata.annotations, None);
        assert_eq!(s.metadata.managed_fields, None);
        assert_eq!(s.metadata.uid, None);
        let spec = s.spec.clone().expect("spec");
        assert_eq!(spec.external_traffic_policy.as_deref(), Some("Local"));
        assert_eq!(spec.ports.as_ref().map(|p| p[0].port), Some(80));
        assert_eq!(
            keelson_netplane::model::service_ports(&s, keelson_netplane::model::IpFamily::V4),
            Err(keelson_netplane::model::SkipReason::OtherProxy(
                "other".into()
            )),
            "the model reads the kept label"
        );
        let ingress = s
            .status
            .clone()
            .and_then(|st| st.load_balancer)
            .and_then(|lb| lb.ingress)
            .expect("ingress");
        assert_eq!(ingress[0].ip_mode.as_deref(), Some("VIP"));
    }

    #[test]
    fn a_slice_keeps_the_trigger_time_and_drops_target_refs() {
        let json = serde_json::json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {
                "name": "web-x", "namespace": "ns",
                "labels": {"kubernetes.io/service-name": "web"},
                "annotations": {
                    "endpoints.kubernetes.io/last-change-trigger-time": "2026-01-01T00:00:00Z",
                    "other": "x"
                },
                "ownerReferences": [{"apiVersion": "v1", "kind": "Service", "name": "web", "uid": "u"}]
            },
            "addressType": "IPv4",
            "endpoints": [{
                "addresses": ["10.0.0.1"],
                "conditions": {"ready": true},
                "nodeName": "n1", "zone": "z",
                "hints": {"forZones": [{"name": "z"}]},
                "targetRef": {"kind": "Pod", "name": "web-0", "namespace": "ns", "uid": "p"}
            }],
            "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}]
        });
        let slim: ProxyEndpointSlice = serde_json::from_value(json).expect("parses");
        let s = slim.to_api();
        let annotations = s.metadata.annotations.as_ref().expect("trigger time kept");
        assert_eq!(annotations.len(), 1);
        assert!(annotations.contains_key(ANNOTATION_LAST_CHANGE_TRIGGER_TIME));
        assert_eq!(s.metadata.owner_references, None);
        let ep = &s.endpoints.as_ref().expect("endpoints")[0];
        assert_eq!(ep.target_ref, None);
        assert_eq!(ep.node_name.as_deref(), Some("n1"));
        assert_eq!(ep.conditions.as_ref().and_then(|c| c.ready), Some(true));
        assert!(ep.hints.is_some());
        // And the model reads it as any slice.
        let info = keelson_netplane::model::slice_info(&s).expect("usable slice");
        assert_eq!(info.ports[0].port, 8080);
        assert!(keelson_netplane::model::last_change_trigger_time(&s).is_some());
    }
}
