//! What an eviction says, in kubelet's words: the pod's status message and
//! the `Evicted` event's message (`The node was low on resource: memory.
//! Threshold quantity: 100Mi, available: 51200Ki. Container hog was using
//! 300Mi, request is 0, has larger consumption of memory. `), the event's
//! annotations (`offending_containers`, `offending_containers_usage`,
//! `starved_resource`, and `offending_pod`/`offending_pod_usage` for a pod
//! with pod-level resources), and the messages of local storage limit
//! evictions. Upstream: `evictionMessage` in pkg/kubelet/eviction/helpers.go.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;

use super::signals::{Observations, quantity, signal_resource};
use super::summary::PodStats;
use crate::config::eviction::Threshold;
use crate::pod::resources::{pod_level, pod_level_resources_set};
use crate::status::format::{Format, canonical};
use keelson_common::quantity::Quantity;

/// `offending_containers` annotation key.
pub const OFFENDING_CONTAINERS: &str = "offending_containers";
/// `offending_containers_usage` annotation key.
pub const OFFENDING_CONTAINERS_USAGE: &str = "offending_containers_usage";
/// `offending_pod` annotation key (pod-level resources).
pub const OFFENDING_POD: &str = "offending_pod";
/// `offending_pod_usage` annotation key (pod-level resources).
pub const OFFENDING_POD_USAGE: &str = "offending_pod_usage";
/// `starved_resource` annotation key.
pub const STARVED_RESOURCE: &str = "starved_resource";

fn format_for(resource: &str) -> Format {
    match resource {
        "memory" | "ephemeral-storage" => Format::BinarySi,
        _ => Format::DecimalSi,
    }
}

fn text(resource: &str, v: i128) -> String {
    canonical(
        Quantity::from_units(i64::try_from(v).unwrap_or(i64::MAX)),
        format_for(resource),
    )
}

/// kubelet's `evictionMessage`.
pub fn eviction_message(
    resource: &str,
    pod: &Pod,
    stats: Option<&PodStats>,
    thresholds: &[Threshold],
    obs: &Observations,
) -> (String, BTreeMap<String, String>) {
    let mut message = format!("The node was low on resource: {resource}. ");
    if let Some(t) = thresholds
        .iter()
        .find(|t| signal_resource(t.signal) == resource)
        && let Some(o) = obs.get(&t.signal)
    {
        message.push_str(&format!(
            "Threshold quantity: {}, available: {}. ",
            text(resource, i128::from(quantity(t.value, o.capacity))),
            text(resource, i128::from(o.available))
        ));
    }
    let mut annotations = BTreeMap::new();
    let Some(stats) = stats else {
        return (message, annotations);
    };
    // Pod-level resources (PodLevelResources, on by default since v1.34):
    // for memory, the pod's usage against its pod-level request, stated
    // whenever that request is set (upstream does not compare the two).
    if resource == "memory"
        && pod_level_resources_set(pod)
        && let Some(request) = pod_level(pod)
            .and_then(|r| r.requests.as_ref())
            .and_then(|r| r.get("memory"))
        && let Some(usage) = stats.memory_working_set
    {
        let used = text(resource, i128::from(usage));
        // Go's `Quantity.String()` of the decoded request: the API server
        // already stores it canonical, in its own format.
        let request = &request.0;
        let name = pod.metadata.name.clone().unwrap_or_default();
        message.push_str(&format!(
            "Pod {name} was using {used}, request is {request}, has larger consumption of {resource}. "
        ));
        annotations.insert(OFFENDING_POD.to_string(), name);
        annotations.insert(OFFENDING_POD_USAGE.to_string(), used);
    }
    let spec = pod.spec.clone().unwrap_or_default();
    let containers: Vec<_> = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .collect();
    let mut offending = Vec::new();
    let mut usages = Vec::new();
    for cs in &stats.containers {
        let Some(c) = containers.iter().find(|c| c.name == cs.name) else {
            continue;
        };
        let request = c
            .resources
            .as_ref()
            .and_then(|r| r.requests.as_ref())
            .and_then(|r| r.get(resource))
            .and_then(|q| Quantity::parse(&q.0).ok())
            .unwrap_or(Quantity::ZERO);
        let usage = match resource {
            "memory" => cs.memory_working_set.map(i128::from),
            "ephemeral-storage" => match (cs.rootfs, cs.logs) {
                (Some(r), Some(l)) => Some(i128::from(r.used_bytes) + i128::from(l.used_bytes)),
                _ => None,
            },
            _ => None,
        };
        if let Some(u) = usage
            && u * 1000 > request.milli_value()
        {
            let used = text(resource, u);
            message.push_str(&format!(
                "Container {} was using {used}, request is {}, has larger consumption of {resource}. ",
                c.name,
                canonical(request, format_for(resource))
            ));
            offending.push(c.name.clone());
            usages.push(used);
        }
    }
    annotations.insert(OFFENDING_CONTAINERS.to_string(), offending.join(","));
    annotations.insert(OFFENDING_CONTAINERS_USAGE.to_string(), usages.join(","));
    annotations.insert(STARVED_RESOURCE.to_string(), resource.to_string());
    (message, annotations)
}

/// kubelet's `nodeConditionMessageFmt` for refused admissions:
/// `The node had condition: [MemoryPressure]. `.
pub fn node_condition_message(conditions: &[&str]) -> String {
    format!("The node had condition: [{}]. ", conditions.join(" "))
}

/// An emptyDir over its `sizeLimit`.
pub fn empty_dir_message(volume: &str, limit: &str) -> String {
    format!("Usage of EmptyDir volume {volume:?} exceeds the limit {limit:?}. ")
}

/// A pod over the sum of its containers' ephemeral-storage limits.
pub fn pod_ephemeral_storage_message(limit: &str) -> String {
    format!("Pod ephemeral local storage usage exceeds the total limit of containers {limit}. ")
}

/// A container over its ephemeral-storage limit.
pub fn container_ephemeral_storage_message(container: &str, limit: &str) -> String {
    format!("Container {container} exceeded its local ephemeral storage limit {limit:?}. ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::eviction::{Signal, ThresholdValue};
    use crate::eviction::signals::Observation;
    use crate::eviction::summary::ContainerStats;
    use k8s_openapi::api::core::v1::{Container, PodSpec, ResourceRequirements};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity as ApiQuantity;

    #[test]
    fn memory_eviction_message_names_threshold_and_usage() {
        let pod = Pod {
            spec: Some(PodSpec {
                containers: vec![
                    Container {
                        name: "hog".into(),
                        ..Default::default()
                    },
                    Container {
                        name: "modest".into(),
                        resources: Some(ResourceRequirements {
                            requests: Some(
                                [("memory".to_string(), ApiQuantity("64Mi".into()))].into(),
                            ),
                            ..Default::default()
                        }),
                        ..Default::default()
                    },
                ],
                ..Default::default()
            }),
            ..Default::default()
        };
        let stats = PodStats {
            containers: vec![
                ContainerStats {
                    name: "hog".into(),
                    memory_working_set: Some(300 * 1024 * 1024),
                    ..Default::default()
                },
                ContainerStats {
                    name: "modest".into(),
                    memory_working_set: Some(10 * 1024 * 1024),
                    ..Default::default()
                },
            ],
            ..Default::default()
        };
        let t = Threshold {
            signal: Signal::AllocatableMemoryAvailable,
            value: ThresholdValue::parse("100Mi").expect("v"),
            grace_period: std::time::Duration::ZERO,
            min_reclaim: None,
            hard: true,
        };
        let obs: Observations = [(
            Signal::AllocatableMemoryAvailable,
            Observation {
                available: 50 * 1024 * 1024,
                capacity: 400 * 1024 * 1024,
                time: None,
            },
        )]
        .into();
        let (m, a) = eviction_message("memory", &pod, Some(&stats), &[t], &obs);
        assert_eq!(
            m,
            "The node was low on resource: memory. Threshold quantity: 100Mi, available: 50Mi. Container hog was using 300Mi, request is 0, has larger consumption of memory. "
        );
        assert_eq!(a[OFFENDING_CONTAINERS], "hog");
        assert_eq!(a[OFFENDING_CONTAINERS_USAGE], "300Mi");
        assert_eq!(a[STARVED_RESOURCE], "memory");
    }

    #[test]
    fn pod_level_memory_request_names_the_pod() {
        let pod = Pod {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                name: Some("big".into()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                resources: Some(ResourceRequirements {
                    requests: Some([("memory".to_string(), ApiQuantity("128Mi".into()))].into()),
                    ..Default::default()
                }),
                containers: vec![Container {
                    name: "app".into(),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..Default::default()
        };
        let stats = PodStats {
            memory_working_set: Some(200 * 1024 * 1024),
            containers: vec![ContainerStats {
                name: "app".into(),
                memory_working_set: Some(200 * 1024 * 1024),
                ..Default::default()
            }],
            ..Default::default()
        };
        let (m, a) = eviction_message("memory", &pod, Some(&stats), &[], &Observations::new());
        assert_eq!(
            m,
            "The node was low on resource: memory. Pod big was using 200Mi, request is 128Mi, has larger consumption of memory. Container app was using 200Mi, request is 0, has larger consumption of memory. "
        );
        assert_eq!(a[OFFENDING_POD], "big");
        assert_eq!(a[OFFENDING_POD_USAGE], "200Mi");
        assert_eq!(a[OFFENDING_CONTAINERS], "app");
        // Not for other resources.
        let (_, a) = eviction_message(
            "ephemeral-storage",
            &pod,
            Some(&stats),
            &[],
            &Observations::new(),
        );
        assert!(!a.contains_key(OFFENDING_POD));
        assert_eq!(a[OFFENDING_CONTAINERS], "");
        assert_eq!(a[STARVED_RESOURCE], "ephemeral-storage");
    }

    #[test]
    fn other_messages() {
        assert_eq!(
            node_condition_message(&["MemoryPressure"]),
            "The node had condition: [MemoryPressure]. "
        );
        assert_eq!(
            empty_dir_message("scratch", "1Gi"),
            "Usage of EmptyDir volume \"scratch\" exceeds the limit \"1Gi\". "
        );
        assert_eq!(
            container_ephemeral_storage_message("app", "2Gi"),
            "Container app exceeded its local ephemeral storage limit \"2Gi\". "
        );
        assert_eq!(
            pod_ephemeral_storage_message("3Gi"),
            "Pod ephemeral local storage usage exceeds the total limit of containers 3Gi. "
        );
    }
}
