//! The downward API: values of `fieldRef` and `resourceFieldRef`, shared by
//! environment variables (built by the pod workers) and `downwardAPI` /
//! projected volumes. Semantics follow kubelet (`podFieldSelectorRuntimeValue`,
//! `fieldpath.ExtractFieldPathAsString`, `resource.ExtractContainerResourceValue`):
//! the same accepted paths, the same `key="value"` map format with Go quoting,
//! the same rounding up of resources by the divisor, and limits that default
//! to the node's allocatable resources when a container sets none.

use std::collections::BTreeMap;
use std::net::IpAddr;

use k8s_openapi::api::core::v1::{Container, ObjectFieldSelector, Pod, ResourceFieldSelector};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as ApiQuantity;

use keelson_common::quantity::Quantity;

/// Why a downward API value could not be computed. Display texts are
/// kubelet's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DownwardError {
    /// `fieldRef.apiVersion` other than `v1`.
    #[error("unsupported pod version: {0}")]
    UnsupportedVersion(String),
    /// A path the API does not accept for pods.
    #[error("field label not supported: {0}")]
    UnsupportedLabel(String),
    /// A subscript on a path that has none.
    #[error("field label does not support subscript: {0}")]
    SubscriptNotSupported(String),
    /// A path outside what the downward API can read.
    #[error("unsupported fieldPath: {0}")]
    UnsupportedFieldPath(String),
    /// A malformed `labels['…']` / `annotations['…']` key.
    #[error("invalid key subscript in {path}: {reason}")]
    InvalidSubscript {
        /// The whole field path.
        path: String,
        /// Why the key is not a qualified name.
        reason: InvalidName,
    },
    /// `resourceFieldRef.resource` not known.
    #[error("unsupported container resource : {0}")]
    UnsupportedResource(String),
    /// `resourceFieldRef.containerName` names no container of the pod.
    #[error("container {0} not found")]
    ContainerNotFound(String),
    /// A quantity (divisor, request or limit) that does not parse.
    #[error("{0}")]
    Quantity(String),
    /// `status.hostIP(s)` asked while the node's addresses are unknown.
    #[error("failed to get host IPs: the node's addresses are not known yet")]
    HostIpsUnknown,
}

/// Runtime facts about a pod that are not in its spec: what kubelet takes
/// from the sandbox status and from its own node object.
#[derive(Debug, Clone, Copy, Default)]
pub struct PodRuntime<'a> {
    /// The pod's IPs as the runtime reported them.
    pub pod_ips: &'a [String],
    /// The node's IPs (`status.hostIPs`), primary first.
    pub host_ips: &'a [String],
}

/// Splits `metadata.labels['key']` into (`metadata.labels`, `key`).
pub fn split_subscripted_path(field_path: &str) -> Option<(&str, &str)> {
    let s = field_path.strip_suffix("']")?;
    let (path, key) = s.split_once("['")?;
    if path.is_empty() {
        return None;
    }
    Some((path, key))
}

/// Checks `fieldRef.apiVersion` and the path as the API server's field label
/// conversion does; returns the internal path (`spec.host` → `spec.nodeName`).
pub fn convert_field_label(api_version: &str, label: &str) -> Result<String, DownwardError> {
    let version = if api_version.is_empty() {
        "v1"
    } else {
        api_version
    };
    if version != "v1" {
        return Err(DownwardError::UnsupportedVersion(version.to_string()));
    }
    if let Some((path, _)) = split_subscripted_path(label) {
        return match path {
            "metadata.annotations" | "metadata.labels" => Ok(label.to_string()),
            _ => Err(DownwardError::SubscriptNotSupported(label.to_string())),
        };
    }
    match label {
        "metadata.annotations"
        | "metadata.labels"
        | "metadata.name"
        | "metadata.namespace"
        | "metadata.uid"
        | "spec.nodeName"
        | "spec.restartPolicy"
        | "spec.serviceAccountName"
        | "spec.schedulerName"
        | "status.phase"
        | "status.hostIP"
        | "status.hostIPs"
        | "status.podIP"
        | "status.podIPs" => Ok(label.to_string()),
        "spec.host" => Ok("spec.nodeName".to_string()),
        _ => Err(DownwardError::UnsupportedLabel(label.to_string())),
    }
}

/// The value of an environment variable's `fieldRef` (kubelet's
/// `podFieldSelectorRuntimeValue`).
pub fn pod_field(
    pod: &Pod,
    selector: &ObjectFieldSelector,
    runtime: &PodRuntime<'_>,
) -> Result<String, DownwardError> {
    let path = convert_field_label(
        selector.api_version.as_deref().unwrap_or("v1"),
        &selector.field_path,
    )?;
    let spec = pod.spec.as_ref();
    let pod_ips = sort_by_family(runtime.pod_ips, runtime.host_ips.first());
    match path.as_str() {
        "spec.nodeName" => Ok(spec.and_then(|s| s.node_name.clone()).unwrap_or_default()),
        "spec.serviceAccountName" => Ok(spec
            .and_then(|s| s.service_account_name.clone())
            .unwrap_or_default()),
        "status.hostIP" => runtime
            .host_ips
            .first()
            .cloned()
            .ok_or(DownwardError::HostIpsUnknown),
        "status.hostIPs" => {
            if runtime.host_ips.is_empty() {
                return Err(DownwardError::HostIpsUnknown);
            }
            Ok(runtime.host_ips.join(","))
        }
        "status.podIP" => Ok(pod_ips.first().cloned().unwrap_or_default()),
        "status.podIPs" => Ok(pod_ips.join(",")),
        other => metadata_field(pod, other),
    }
}

/// Orders pod IPs so that the family of the node's primary IP comes first,
/// as kubelet's `sortPodIPs` does.
fn sort_by_family(pod_ips: &[String], node_ip: Option<&String>) -> Vec<String> {
    let want_v6 = node_ip
        .and_then(|ip| ip.parse::<IpAddr>().ok())
        .is_some_and(|ip| ip.is_ipv6());
    let is_v6 = |s: &String| s.parse::<IpAddr>().map(|ip| ip.is_ipv6()).unwrap_or(false);
    let (mut first, second): (Vec<String>, Vec<String>) =
        pod_ips.iter().cloned().partition(|ip| is_v6(ip) == want_v6);
    first.extend(second);
    first
}

/// A metadata field as `fieldpath.ExtractFieldPathAsString` reads it; the
/// only paths a `downwardAPI` volume item may use.
pub fn metadata_field(pod: &Pod, field_path: &str) -> Result<String, DownwardError> {
    let meta = &pod.metadata;
    if let Some((path, key)) = split_subscripted_path(field_path) {
        return match path {
            "metadata.annotations" => {
                qualified_name(&key.to_lowercase()).map_err(|reason| {
                    DownwardError::InvalidSubscript {
                        path: field_path.to_string(),
                        reason,
                    }
                })?;
                Ok(meta
                    .annotations
                    .as_ref()
                    .and_then(|m| m.get(key).cloned())
                    .unwrap_or_default())
            }
            "metadata.labels" => {
                qualified_name(key).map_err(|reason| DownwardError::InvalidSubscript {
                    path: field_path.to_string(),
                    reason,
                })?;
                Ok(meta
                    .labels
                    .as_ref()
                    .and_then(|m| m.get(key).cloned())
                    .unwrap_or_default())
            }
            _ => Err(DownwardError::SubscriptNotSupported(field_path.to_string())),
        };
    }
    match field_path {
        "metadata.annotations" => Ok(format_map(meta.annotations.as_ref())),
        "metadata.labels" => Ok(format_map(meta.labels.as_ref())),
        "metadata.name" => Ok(meta.name.clone().unwrap_or_default()),
        "metadata.namespace" => Ok(meta.namespace.clone().unwrap_or_default()),
        "metadata.uid" => Ok(meta.uid.clone().unwrap_or_default()),
        _ => Err(DownwardError::UnsupportedFieldPath(field_path.to_string())),
    }
}

/// `key="value"` lines in key order, values quoted as Go's `%q` does
/// (kubelet's `fieldpath.FormatMap`); no trailing newline.
pub fn format_map(map: Option<&BTreeMap<String, String>>) -> String {
    let Some(map) = map else {
        return String::new();
    };
    let lines: Vec<String> = map
        .iter()
        .map(|(k, v)| format!("{k}={}", keelson_common::gofmt::quote(v)))
        .collect();
    lines.join("\n")
}

/// Why a key is not a qualified name: `validation.IsQualifiedName`'s
/// reasons, joined with `;` as kubelet joins them.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", .0.join(";"))]
pub struct InvalidName(pub Vec<String>);

/// Checks a Kubernetes qualified name (`[prefix/]name`) as
/// `validation.IsQualifiedName`.
pub fn qualified_name(value: &str) -> Result<(), InvalidName> {
    let mut errs = Vec::new();
    let parts: Vec<&str> = value.split('/').collect();
    let name = match parts.as_slice() {
        [name] => *name,
        [prefix, name] => {
            if prefix.is_empty() {
                errs.push("prefix part must be non-empty".to_string());
            } else if let Some(e) = dns1123_subdomain_reason(prefix) {
                errs.push(format!("prefix part {e}"));
            }
            *name
        }
        _ => {
            return Err(InvalidName(vec!["a qualified name must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]') with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')".to_string()]));
        }
    };
    if name.is_empty() {
        errs.push("name part must be non-empty".to_string());
    } else {
        if name.len() > 63 {
            errs.push("name part must be no more than 63 characters".to_string());
        }
        let bytes = name.as_bytes();
        let ok_inner = bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
        let ok_ends = bytes.first().is_some_and(u8::is_ascii_alphanumeric)
            && bytes.last().is_some_and(u8::is_ascii_alphanumeric);
        if !(ok_inner && ok_ends) {
            errs.push("name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')".to_string());
        }
    }
    if errs.is_empty() {
        Ok(())
    } else {
        Err(InvalidName(errs))
    }
}

/// Why `value` is not a DNS-1123 subdomain, or `None` when it is one.
fn dns1123_subdomain_reason(value: &str) -> Option<&'static str> {
    if value.len() > 253 {
        return Some("must be no more than 253 characters");
    }
    let label_ok = |l: &str| {
        let b = l.as_bytes();
        !b.is_empty()
            && b.iter()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
            && b.first().is_some_and(|c| c.is_ascii_alphanumeric())
            && b.last().is_some_and(|c| c.is_ascii_alphanumeric())
    };
    if value.split('.').all(label_ok) {
        None
    } else {
        Some(
            "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')",
        )
    }
}

/// The value of a `resourceFieldRef` (environment variables and volumes).
/// When `selector.containerName` is set the named container (regular or
/// init) is used, otherwise `container`. Limits a container does not set
/// (cpu, memory, ephemeral-storage) are the node's allocatable amounts, as
/// kubelet defaults them for the downward API.
pub fn container_resource(
    pod: &Pod,
    container: Option<&Container>,
    selector: &ResourceFieldSelector,
    allocatable: &BTreeMap<String, ApiQuantity>,
) -> Result<String, DownwardError> {
    let target = match selector.container_name.as_deref().filter(|n| !n.is_empty()) {
        Some(name) => find_container(pod, name)?,
        None => container.ok_or_else(|| DownwardError::ContainerNotFound(String::new()))?,
    };
    let mut limits = target
        .resources
        .as_ref()
        .and_then(|r| r.limits.clone())
        .unwrap_or_default();
    for resource in ["cpu", "memory", "ephemeral-storage"] {
        let unset = limits
            .get(resource)
            .map(|q| {
                Quantity::parse(&q.0)
                    .map(|q| q == Quantity::ZERO)
                    .unwrap_or(true)
            })
            .unwrap_or(true);
        if unset && let Some(alloc) = allocatable.get(resource) {
            limits.insert(resource.to_string(), alloc.clone());
        }
    }
    let requests = target
        .resources
        .as_ref()
        .and_then(|r| r.requests.clone())
        .unwrap_or_default();
    resource_value(
        &selector.resource,
        selector.divisor.as_ref(),
        &limits,
        &requests,
    )
}

fn find_container<'a>(pod: &'a Pod, name: &str) -> Result<&'a Container, DownwardError> {
    let spec = pod.spec.as_ref();
    spec.into_iter()
        .flat_map(|s| s.containers.iter())
        .chain(
            spec.into_iter()
                .flat_map(|s| s.init_containers.iter().flatten()),
        )
        .find(|c| c.name == name)
        .ok_or_else(|| DownwardError::ContainerNotFound(name.to_string()))
}

fn parse_quantity(q: Option<&ApiQuantity>) -> Result<Quantity, DownwardError> {
    match q {
        None => Ok(Quantity::ZERO),
        Some(q) => Quantity::parse(&q.0).map_err(|e| DownwardError::Quantity(e.to_string())),
    }
}

fn resource_value(
    resource: &str,
    divisor: Option<&ApiQuantity>,
    limits: &BTreeMap<String, ApiQuantity>,
    requests: &BTreeMap<String, ApiQuantity>,
) -> Result<String, DownwardError> {
    let mut div = parse_quantity(divisor)?;
    if div == Quantity::ZERO {
        div = Quantity::from_units(1);
    }
    let (map, name) = if let Some(n) = resource.strip_prefix("limits.") {
        (limits, n)
    } else if let Some(n) = resource.strip_prefix("requests.") {
        (requests, n)
    } else {
        return Err(DownwardError::UnsupportedResource(resource.to_string()));
    };
    let value = parse_quantity(map.get(name))?;
    match name {
        "cpu" => Ok(ceil_div(value.milli_value(), div.milli_value()).to_string()),
        "memory" | "ephemeral-storage" => Ok(ceil_div(value.value(), div.value()).to_string()),
        n if n.starts_with("hugepages-") => Ok(ceil_div(value.value(), div.value()).to_string()),
        _ => Err(DownwardError::UnsupportedResource(resource.to_string())),
    }
}

/// `ceil(a / b)` for the non-negative values resources have; a zero or
/// negative divisor yields 0 rather than a panic.
fn ceil_div(a: i128, b: i128) -> i128 {
    if b <= 0 {
        return 0;
    }
    if a >= 0 { (a + b - 1) / b } else { a / b }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{PodSpec, ResourceRequirements};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn pod() -> Pod {
        let c = Container {
            name: "app".into(),
            resources: Some(ResourceRequirements {
                limits: Some(BTreeMap::from([(
                    "memory".into(),
                    ApiQuantity("128Mi".into()),
                )])),
                requests: Some(BTreeMap::from([
                    ("cpu".into(), ApiQuantity("250m".into())),
                    ("memory".into(), ApiQuantity("64Mi".into())),
                ])),
                ..Default::default()
            }),
            ..Default::default()
        };
        Pod {
            metadata: ObjectMeta {
                name: Some("web".into()),
                namespace: Some("prod".into()),
                uid: Some("u-1".into()),
                labels: Some(BTreeMap::from([
                    ("b".into(), "two \"q\"\n".into()),
                    ("a".into(), "one".into()),
                ])),
                annotations: Some(BTreeMap::from([("k8s.io/x".into(), "y".into())])),
                ..Default::default()
            },
            spec: Some(PodSpec {
                node_name: Some("n1".into()),
                service_account_name: Some("sa".into()),
                containers: vec![c],
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn sel(path: &str) -> ObjectFieldSelector {
        ObjectFieldSelector {
            api_version: Some("v1".into()),
            field_path: path.into(),
        }
    }

    #[test]
    fn metadata_and_spec_fields() {
        let p = pod();
        let ips = ["10.0.0.5".to_string(), "fd00::5".to_string()];
        let hosts = ["fd00::1".to_string(), "192.168.1.1".to_string()];
        let rt = PodRuntime {
            pod_ips: &ips,
            host_ips: &hosts,
        };
        let cases = [
            ("metadata.name", "web"),
            ("metadata.namespace", "prod"),
            ("metadata.uid", "u-1"),
            ("metadata.labels", "a=\"one\"\nb=\"two \\\"q\\\"\\n\""),
            ("metadata.labels['a']", "one"),
            ("metadata.labels['missing']", ""),
            ("metadata.annotations['k8s.io/x']", "y"),
            ("spec.nodeName", "n1"),
            ("spec.host", "n1"),
            ("spec.serviceAccountName", "sa"),
            ("status.podIP", "fd00::5"),
            ("status.podIPs", "fd00::5,10.0.0.5"),
            ("status.hostIP", "fd00::1"),
            ("status.hostIPs", "fd00::1,192.168.1.1"),
        ];
        for (path, want) in cases {
            assert_eq!(
                pod_field(&p, &sel(path), &rt).as_deref(),
                Ok(want),
                "{path}"
            );
        }
    }

    #[test]
    fn errors_use_kubelet_wording() {
        let p = pod();
        let rt = PodRuntime::default();
        assert_eq!(
            pod_field(&p, &sel("spec.containers"), &rt)
                .unwrap_err()
                .to_string(),
            "field label not supported: spec.containers"
        );
        assert_eq!(
            pod_field(&p, &sel("metadata.name['x']"), &rt)
                .unwrap_err()
                .to_string(),
            "field label does not support subscript: metadata.name['x']"
        );
        let v2 = ObjectFieldSelector {
            api_version: Some("v2".into()),
            field_path: "metadata.name".into(),
        };
        assert_eq!(
            pod_field(&p, &v2, &rt).unwrap_err().to_string(),
            "unsupported pod version: v2"
        );
        assert_eq!(
            metadata_field(&p, "spec.nodeName").unwrap_err().to_string(),
            "unsupported fieldPath: spec.nodeName"
        );
        assert!(matches!(
            metadata_field(&p, "metadata.labels['-bad-']"),
            Err(DownwardError::InvalidSubscript { .. })
        ));
        assert_eq!(
            pod_field(&p, &sel("status.hostIP"), &rt),
            Err(DownwardError::HostIpsUnknown)
        );
    }

    #[test]
    fn resources_round_up_and_default_to_allocatable() {
        let p = pod();
        let c = &p.spec.as_ref().unwrap().containers[0];
        let alloc = BTreeMap::from([
            ("cpu".to_string(), ApiQuantity("4".into())),
            ("memory".to_string(), ApiQuantity("8Gi".into())),
            ("ephemeral-storage".to_string(), ApiQuantity("100Gi".into())),
        ]);
        let r = |res: &str, div: Option<&str>| {
            container_resource(
                &p,
                Some(c),
                &ResourceFieldSelector {
                    resource: res.into(),
                    divisor: div.map(|d| ApiQuantity(d.into())),
                    container_name: None,
                },
                &alloc,
            )
        };
        assert_eq!(r("requests.cpu", None).as_deref(), Ok("1"));
        assert_eq!(r("requests.cpu", Some("1m")).as_deref(), Ok("250"));
        assert_eq!(r("limits.cpu", None).as_deref(), Ok("4"));
        assert_eq!(r("limits.memory", Some("1Mi")).as_deref(), Ok("128"));
        assert_eq!(r("requests.memory", Some("1Gi")).as_deref(), Ok("1"));
        assert_eq!(
            r("limits.ephemeral-storage", Some("1Gi")).as_deref(),
            Ok("100")
        );
        assert_eq!(r("requests.ephemeral-storage", None).as_deref(), Ok("0"));
        assert_eq!(r("limits.hugepages-2Mi", None).as_deref(), Ok("0"));
        assert_eq!(
            r("limits.gpu", None).unwrap_err().to_string(),
            "unsupported container resource : limits.gpu"
        );
        let named = container_resource(
            &p,
            None,
            &ResourceFieldSelector {
                resource: "limits.memory".into(),
                divisor: None,
                container_name: Some("nope".into()),
            },
            &alloc,
        );
        assert_eq!(named.unwrap_err().to_string(), "container nope not found");
    }
}
