//! Local ephemeral storage limits, enforced by eviction as kubelet's
//! `localStorageEviction` does, before any pressure handling: an emptyDir
//! over its `sizeLimit`, a pod over the sum of its containers'
//! `ephemeral-storage` limits, or a container over its own limit gets its
//! pod evicted (1 s grace, no DisruptionTarget condition).

use k8s_openapi::api::core::v1::{Container, Pod};

use super::message::{
    container_ephemeral_storage_message, empty_dir_message, pod_ephemeral_storage_message,
};
use super::summary::PodStats;
use crate::status::format::{Format, canonical};
use keelson_common::quantity::Quantity;

/// `emptydirfs.limit` (the `kubelet_evictions` label).
pub const SIGNAL_EMPTY_DIR: &str = "emptydirfs.limit";
/// `ephemeralpodfs.limit`.
pub const SIGNAL_POD_FS: &str = "ephemeralpodfs.limit";
/// `ephemeralcontainerfs.limit`.
pub const SIGNAL_CONTAINER_FS: &str = "ephemeralcontainerfs.limit";

/// A pod that broke a local storage limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimitViolation {
    /// Status and event message.
    pub message: String,
    /// The `kubelet_evictions` signal label.
    pub signal: &'static str,
}

fn limit_of(c: &Container) -> Option<Quantity> {
    c.resources
        .as_ref()?
        .limits
        .as_ref()?
        .get("ephemeral-storage")
        .and_then(|q| Quantity::parse(&q.0).ok())
}

fn bytes_text(q: Quantity) -> String {
    canonical(q, Format::BinarySi)
}

/// Upstream `PodLimits` for `ephemeral-storage`: containers and sidecars add
/// up, an init container counts with the sidecars before it, the pod needs
/// the larger; `None` when no container sets the limit.
pub fn pod_ephemeral_limit(pod: &Pod) -> Option<Quantity> {
    let spec = pod.spec.as_ref()?;
    let any = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .any(|c| limit_of(c).is_some());
    if !any {
        return None;
    }
    let mut total = spec
        .containers
        .iter()
        .filter_map(limit_of)
        .fold(Quantity::ZERO, Quantity::saturating_add);
    let mut sidecars = Quantity::ZERO;
    let mut init_peak = Quantity::ZERO;
    for c in spec.init_containers.iter().flatten() {
        let own = limit_of(c).unwrap_or(Quantity::ZERO);
        let need = if crate::pod::podutil::is_restartable_init(c) {
            total = total.saturating_add(own);
            sidecars = sidecars.saturating_add(own);
            sidecars
        } else {
            own.saturating_add(sidecars)
        };
        if need > init_peak {
            init_peak = need;
        }
    }
    Some(if init_peak > total { init_peak } else { total })
}

/// The first limit `pod` breaks, if any (emptyDir, then pod, then container).
pub fn violation(pod: &Pod, stats: &PodStats, dedicated_image_fs: bool) -> Option<LimitViolation> {
    let spec = pod.spec.as_ref()?;
    // emptyDir sizeLimit.
    for v in spec.volumes.iter().flatten() {
        let Some(ed) = v.empty_dir.as_ref() else {
            continue;
        };
        let Some(limit) = ed
            .size_limit
            .as_ref()
            .and_then(|q| Quantity::parse(&q.0).ok())
        else {
            continue;
        };
        if limit <= Quantity::ZERO {
            continue;
        }
        let used = stats
            .volumes
            .iter()
            .find(|s| s.name == v.name)
            .map(|s| s.usage.used_bytes);
        if let Some(used) = used
            && i128::from(used) * 1000 > limit.milli_value()
        {
            return Some(LimitViolation {
                message: empty_dir_message(
                    &v.name,
                    &ed.size_limit
                        .as_ref()
                        .map(|q| q.0.clone())
                        .unwrap_or_default(),
                ),
                signal: SIGNAL_EMPTY_DIR,
            });
        }
    }
    // Pod total.
    if let Some(limit) = pod_ephemeral_limit(pod)
        && i128::from(stats.ephemeral_storage_used()) * 1000 > limit.milli_value()
    {
        return Some(LimitViolation {
            message: pod_ephemeral_storage_message(&bytes_text(limit)),
            signal: SIGNAL_POD_FS,
        });
    }
    // Each container.
    for cs in &stats.containers {
        let Some(c) = spec.containers.iter().find(|c| c.name == cs.name) else {
            continue;
        };
        let Some(limit) = limit_of(c).filter(|l| *l != Quantity::ZERO) else {
            continue;
        };
        let mut used = cs.logs.map(|u| u.used_bytes).unwrap_or(0);
        if !dedicated_image_fs {
            used += cs.rootfs.map(|u| u.used_bytes).unwrap_or(0);
        }
        if limit.milli_value() < i128::from(used) * 1000 {
            return Some(LimitViolation {
                message: container_ephemeral_storage_message(&c.name, &bytes_text(limit)),
                signal: SIGNAL_CONTAINER_FS,
            });
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::eviction::summary::{ContainerStats, DiskUsage, VolumeStats};
    use k8s_openapi::api::core::v1::{EmptyDirVolumeSource, PodSpec, ResourceRequirements, Volume};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity as ApiQuantity;

    const MI: u64 = 1024 * 1024;

    fn container(name: &str, limit: Option<&str>) -> Container {
        Container {
            name: name.into(),
            resources: Some(ResourceRequirements {
                limits: limit
                    .map(|l| [("ephemeral-storage".to_string(), ApiQuantity(l.into()))].into()),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn pod(containers: Vec<Container>, size_limit: Option<&str>) -> Pod {
        Pod {
            spec: Some(PodSpec {
                containers,
                volumes: Some(vec![Volume {
                    name: "scratch".into(),
                    empty_dir: Some(EmptyDirVolumeSource {
                        size_limit: size_limit.map(|s| ApiQuantity(s.into())),
                        ..Default::default()
                    }),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn stats(rootfs: u64, logs: u64, volume: u64) -> PodStats {
        PodStats {
            containers: vec![ContainerStats {
                name: "app".into(),
                rootfs: Some(DiskUsage {
                    used_bytes: rootfs * MI,
                    inodes_used: 1,
                }),
                logs: Some(DiskUsage {
                    used_bytes: logs * MI,
                    inodes_used: 1,
                }),
                ..Default::default()
            }],
            volumes: vec![VolumeStats {
                name: "scratch".into(),
                usage: DiskUsage {
                    used_bytes: volume * MI,
                    inodes_used: 1,
                },
                local_ephemeral: true,
            }],
            ..Default::default()
        }
    }

    #[test]
    fn limits_table() {
        let cases: Vec<(Pod, PodStats, bool, Option<&str>)> = vec![
            (
                pod(vec![container("app", None)], Some("100Mi")),
                stats(0, 0, 101),
                false,
                Some(SIGNAL_EMPTY_DIR),
            ),
            (
                pod(vec![container("app", None)], Some("100Mi")),
                stats(0, 0, 100),
                false,
                None,
            ),
            (
                pod(vec![container("app", None)], None),
                stats(0, 0, 10_000),
                false,
                None,
            ),
            // Pod total 50+10+60 > 100, but the container alone (60) is within 100.
            (
                pod(vec![container("app", Some("100Mi"))], None),
                stats(50, 10, 60),
                false,
                Some(SIGNAL_POD_FS),
            ),
            // Container over its own limit (writable layer + logs on one filesystem).
            (
                pod(
                    vec![
                        container("app", Some("100Mi")),
                        container("other", Some("1Gi")),
                    ],
                    None,
                ),
                stats(95, 10, 0),
                false,
                Some(SIGNAL_CONTAINER_FS),
            ),
            // With a dedicated image filesystem only logs count for the container.
            (
                pod(
                    vec![
                        container("app", Some("100Mi")),
                        container("other", Some("1Gi")),
                    ],
                    None,
                ),
                stats(95, 10, 0),
                true,
                None,
            ),
        ];
        for (i, (p, s, dedicated, want)) in cases.into_iter().enumerate() {
            assert_eq!(
                violation(&p, &s, dedicated).map(|v| v.signal),
                want,
                "case {i}"
            );
        }
        let v = violation(
            &pod(vec![container("app", None)], Some("100Mi")),
            &stats(0, 0, 101),
            false,
        )
        .expect("violation");
        assert_eq!(
            v.message,
            "Usage of EmptyDir volume \"scratch\" exceeds the limit \"100Mi\". "
        );
    }
}
