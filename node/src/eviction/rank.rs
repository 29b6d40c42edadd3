//! The order in which pods are evicted, as kubelet ranks them:
//! - memory: pods whose working set exceeds their request first, then by
//!   priority (lowest first), then by working set above request (largest first);
//! - PIDs: by priority, then by process count (largest first);
//! - disk and inodes: usage above request first, then priority, then usage
//!   above request, counting what the signal's filesystem holds.
//!
//! Pods without stats rank first, as upstream. Sorting is stable, so ties
//! keep the order the pods were listed in.

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Container, Pod};

use super::summary::PodStats;
use crate::config::eviction::Signal;
use keelson_common::quantity::Quantity;

/// Which parts of a pod's disk usage count for a signal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FsStatsType {
    /// Container writable layers.
    Root,
    /// Container logs.
    Logs,
    /// Local volumes (emptyDir on disk, hostPath).
    LocalVolumes,
}

/// Bytes or inodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DiskResource {
    /// `ephemeral-storage`.
    Bytes,
    /// `inodes`.
    Inodes,
}

/// Per-pod stats by UID.
pub type StatsByUid = BTreeMap<String, PodStats>;

fn uid(pod: &Pod) -> &str {
    pod.metadata.uid.as_deref().unwrap_or_default()
}

fn request_of(c: &Container, resource: &str) -> Quantity {
    c.resources
        .as_ref()
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get(resource))
        .and_then(|q| Quantity::parse(&q.0).ok())
        .unwrap_or(Quantity::ZERO)
}

/// Upstream `GetResourceRequestQuantity`: the containers' requests added
/// up, at least the largest init container's, plus overhead when non-zero.
pub fn request_quantity(pod: &Pod, resource: &str) -> Quantity {
    let Some(spec) = pod.spec.as_ref() else {
        return Quantity::ZERO;
    };
    let mut total = spec
        .containers
        .iter()
        .map(|c| request_of(c, resource))
        .fold(Quantity::ZERO, Quantity::saturating_add);
    for c in spec.init_containers.iter().flatten() {
        let r = request_of(c, resource);
        if total < r {
            total = r;
        }
    }
    if total != Quantity::ZERO
        && let Some(o) = spec
            .overhead
            .as_ref()
            .and_then(|o| o.get(resource))
            .and_then(|q| Quantity::parse(&q.0).ok())
    {
        total = total.saturating_add(o);
    }
    total
}

/// `PodPriority`: the spec's priority, 0 when unset.
pub fn priority(pod: &Pod) -> i32 {
    pod.spec.as_ref().and_then(|s| s.priority).unwrap_or(0)
}

/// Disk usage of a pod counting `measure` (bytes or inodes).
pub fn pod_disk_usage(stats: &PodStats, measure: &[FsStatsType], resource: DiskResource) -> u64 {
    let pick = |u: Option<super::summary::DiskUsage>| {
        u.map(|u| match resource {
            DiskResource::Bytes => u.used_bytes,
            DiskResource::Inodes => u.inodes_used,
        })
        .unwrap_or(0)
    };
    let mut total = 0u64;
    for c in &stats.containers {
        if measure.contains(&FsStatsType::Root) {
            total = total.saturating_add(pick(c.rootfs));
        }
        if measure.contains(&FsStatsType::Logs) {
            total = total.saturating_add(pick(c.logs));
        }
    }
    if measure.contains(&FsStatsType::LocalVolumes) {
        for v in stats.volumes.iter().filter(|v| v.local_ephemeral) {
            total = total.saturating_add(pick(Some(v.usage)));
        }
    }
    total
}

/// `cmpBool`: true before false.
fn true_first(a: bool, b: bool) -> Ordering {
    b.cmp(&a)
}

type Cmp<'a> = Box<dyn Fn(&Pod, &Pod) -> Ordering + 'a>;

fn ordered_by(pods: &mut [Arc<Pod>], cmps: &[Cmp<'_>]) {
    pods.sort_by(|a, b| {
        for c in cmps {
            let o = c(a, b);
            if o != Ordering::Equal {
                return o;
            }
        }
        Ordering::Equal
    });
}

/// Compares by stats; pods without stats first.
fn with_stats<'a, F>(stats: &'a StatsByUid, f: F) -> Cmp<'a>
where
    F: Fn(&Pod, &PodStats, &Pod, &PodStats) -> Ordering + 'a,
{
    Box::new(move |a, b| match (stats.get(uid(a)), stats.get(uid(b))) {
        (Some(sa), Some(sb)) => f(a, sa, b, sb),
        (sa, sb) => true_first(sa.is_none(), sb.is_none()),
    })
}

fn by_priority<'a>() -> Cmp<'a> {
    Box::new(|a, b| priority(a).cmp(&priority(b)))
}

fn memory_usage(s: &PodStats) -> i128 {
    i128::from(s.memory_working_set.unwrap_or(0))
}

/// `rankMemoryPressure`.
pub fn rank_memory(pods: &mut [Arc<Pod>], stats: &StatsByUid) {
    let request = |p: &Pod| request_quantity(p, "memory").value();
    ordered_by(
        pods,
        &[
            with_stats(stats, move |a, sa, b, sb| {
                true_first(memory_usage(sa) > request(a), memory_usage(sb) > request(b))
            }),
            by_priority(),
            with_stats(stats, move |a, sa, b, sb| {
                (memory_usage(sb) - request(b)).cmp(&(memory_usage(sa) - request(a)))
            }),
        ],
    );
}

/// `rankPIDPressure`.
pub fn rank_pids(pods: &mut [Arc<Pod>], stats: &StatsByUid) {
    ordered_by(
        pods,
        &[
            by_priority(),
            with_stats(stats, |_, sa, _, sb| {
                sb.process_count
                    .unwrap_or(0)
                    .cmp(&sa.process_count.unwrap_or(0))
            }),
        ],
    );
}

/// `rankDiskPressureFunc(measure, resource)`.
pub fn rank_disk(
    pods: &mut [Arc<Pod>],
    stats: &StatsByUid,
    measure: &[FsStatsType],
    resource: DiskResource,
) {
    let request_name = match resource {
        DiskResource::Bytes => "ephemeral-storage",
        DiskResource::Inodes => "inodes",
    };
    let usage = move |s: &PodStats| i128::from(pod_disk_usage(s, measure, resource));
    ordered_by(
        pods,
        &[
            with_stats(stats, move |a, sa, b, sb| {
                true_first(
                    usage(sa) > request_quantity(a, request_name).value(),
                    usage(sb) > request_quantity(b, request_name).value(),
                )
            }),
            by_priority(),
            with_stats(stats, move |a, sa, b, sb| {
                // Usage above the ephemeral-storage request, as upstream (also for inodes).
                let ra = request_quantity(a, "ephemeral-storage").value();
                let rb = request_quantity(b, "ephemeral-storage").value();
                (usage(sb) - rb).cmp(&(usage(sa) - ra))
            }),
        ],
    );
}

/// Ranks pods for the signal being reclaimed (`buildSignalToRankFunc`).
pub fn rank_for_signal(
    signal: Signal,
    dedicated_image_fs: bool,
    pods: &mut [Arc<Pod>],
    stats: &StatsByUid,
) {
    use FsStatsType::*;
    let all: &[FsStatsType] = &[Root, Logs, LocalVolumes];
    let (node_measure, image_measure): (&[FsStatsType], &[FsStatsType]) = if dedicated_image_fs {
        (&[Logs, LocalVolumes], &[Root])
    } else {
        (all, all)
    };
    match signal {
        Signal::MemoryAvailable | Signal::AllocatableMemoryAvailable => rank_memory(pods, stats),
        Signal::PidAvailable => rank_pids(pods, stats),
        Signal::NodeFsAvailable => rank_disk(pods, stats, node_measure, DiskResource::Bytes),
        Signal::NodeFsInodesFree => rank_disk(pods, stats, node_measure, DiskResource::Inodes),
        Signal::ImageFsAvailable | Signal::ContainerFsAvailable => {
            rank_disk(pods, stats, image_measure, DiskResource::Bytes)
        }
        Signal::ImageFsInodesFree | Signal::ContainerFsInodesFree => {
            rank_disk(pods, stats, image_measure, DiskResource::Inodes)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::eviction::summary::{ContainerStats, DiskUsage, VolumeStats};
    use k8s_openapi::api::core::v1::{PodSpec, ResourceRequirements};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity as ApiQuantity;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    const MI: u64 = 1024 * 1024;

    fn pod(name: &str, priority: i32, memory_request: Option<&str>) -> Arc<Pod> {
        let requests = memory_request.map(|r| {
            [
                ("memory".to_string(), ApiQuantity(r.to_string())),
                ("ephemeral-storage".to_string(), ApiQuantity(r.to_string())),
            ]
            .into()
        });
        Arc::new(Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                uid: Some(format!("uid-{name}")),
                ..Default::default()
            },
            spec: Some(PodSpec {
                priority: Some(priority),
                containers: vec![Container {
                    name: "c".into(),
                    resources: Some(ResourceRequirements {
                        requests,
                        ..Default::default()
                    }),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            status: None,
        })
    }

    fn mem(pods: &[(&str, u64)]) -> StatsByUid {
        pods.iter()
            .map(|(n, m)| {
                (
                    format!("uid-{n}"),
                    PodStats {
                        memory_working_set: Some(m * MI),
                        ..Default::default()
                    },
                )
            })
            .collect()
    }

    fn names(pods: &[Arc<Pod>]) -> Vec<String> {
        pods.iter()
            .map(|p| p.metadata.name.clone().unwrap_or_default())
            .collect()
    }

    #[test]
    fn memory_ranking_table() {
        // (name, priority, request, usage)
        struct Case {
            pods: Vec<(&'static str, i32, Option<&'static str>, u64)>,
            want: Vec<&'static str>,
        }
        let cases = vec![
            // Exceeding requests beats priority: the best-effort user of 10Mi
            // goes before a high-priority pod within its request.
            Case {
                pods: vec![
                    ("guaranteed", 0, Some("500Mi"), 400),
                    ("besteffort", 1000, None, 10),
                ],
                want: vec!["besteffort", "guaranteed"],
            },
            // Among pods over their requests: lowest priority first.
            Case {
                pods: vec![
                    ("high", 100, Some("100Mi"), 500),
                    ("low", -10, Some("100Mi"), 150),
                ],
                want: vec!["low", "high"],
            },
            // Same priority: the largest usage above request first.
            Case {
                pods: vec![
                    ("small", 0, Some("100Mi"), 150),
                    ("big", 0, Some("100Mi"), 900),
                    ("none", 0, None, 200),
                ],
                want: vec!["big", "none", "small"],
            },
            // Within requests: priority, then the closest to its request first.
            Case {
                pods: vec![
                    ("a", 0, Some("500Mi"), 100),
                    ("b", 0, Some("500Mi"), 450),
                    ("c", -1, Some("500Mi"), 10),
                ],
                want: vec!["c", "b", "a"],
            },
        ];
        for case in cases {
            let mut pods: Vec<Arc<Pod>> = case
                .pods
                .iter()
                .map(|(n, p, r, _)| pod(n, *p, *r))
                .collect();
            let stats = mem(&case
                .pods
                .iter()
                .map(|(n, _, _, u)| (*n, *u))
                .collect::<Vec<_>>());
            rank_memory(&mut pods, &stats);
            assert_eq!(names(&pods), case.want);
        }
    }

    #[test]
    fn pods_without_stats_go_first() {
        let mut pods = vec![pod("measured", 0, None), pod("unknown", 1000, Some("1Gi"))];
        rank_memory(&mut pods, &mem(&[("measured", 900)]));
        assert_eq!(names(&pods), ["unknown", "measured"]);
    }

    #[test]
    fn pid_ranking_is_priority_then_processes() {
        let mut pods = vec![
            pod("many-high", 10, None),
            pod("few", 0, None),
            pod("many", 0, None),
        ];
        let stats: StatsByUid = [("many-high", 500u64), ("few", 3), ("many", 400)]
            .into_iter()
            .map(|(n, c)| {
                (
                    format!("uid-{n}"),
                    PodStats {
                        process_count: Some(c),
                        ..Default::default()
                    },
                )
            })
            .collect();
        rank_pids(&mut pods, &stats);
        assert_eq!(names(&pods), ["many", "few", "many-high"]);
    }

    #[test]
    fn disk_ranking_counts_what_the_filesystem_holds() {
        let disk = |root: u64, logs: u64, vol: u64| PodStats {
            containers: vec![ContainerStats {
                name: "c".into(),
                rootfs: Some(DiskUsage {
                    used_bytes: root * MI,
                    inodes_used: root,
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
                    used_bytes: vol * MI,
                    inodes_used: vol,
                },
                local_ephemeral: true,
            }],
            ..Default::default()
        };
        let stats: StatsByUid = [
            ("layer".to_string(), disk(900, 1, 0)),
            ("volume".to_string(), disk(1, 1, 500)),
        ]
        .into_iter()
        .map(|(n, s)| (format!("uid-{n}"), s))
        .collect();
        let mut pods = vec![pod("volume", 0, None), pod("layer", 0, None)];
        // One filesystem: everything counts; the writable layer is larger.
        rank_for_signal(Signal::NodeFsAvailable, false, &mut pods, &stats);
        assert_eq!(names(&pods), ["layer", "volume"]);
        // Dedicated imagefs: nodefs pressure counts logs and volumes only.
        rank_for_signal(Signal::NodeFsAvailable, true, &mut pods, &stats);
        assert_eq!(names(&pods), ["volume", "layer"]);
        // ...and imagefs pressure the writable layers.
        rank_for_signal(Signal::ImageFsAvailable, true, &mut pods, &stats);
        assert_eq!(names(&pods), ["layer", "volume"]);
        // A request covering the usage ranks the pod after the one exceeding its own.
        let mut pods = vec![pod("layer", 0, Some("2Gi")), pod("volume", 0, None)];
        rank_for_signal(Signal::NodeFsAvailable, false, &mut pods, &stats);
        assert_eq!(names(&pods), ["volume", "layer"]);
    }

    #[test]
    fn requests_follow_upstream() {
        let mut p = (*pod("p", 0, Some("100Mi"))).clone();
        if let Some(spec) = p.spec.as_mut() {
            spec.init_containers = Some(vec![Container {
                name: "init".into(),
                resources: Some(ResourceRequirements {
                    requests: Some([("memory".to_string(), ApiQuantity("300Mi".into()))].into()),
                    ..Default::default()
                }),
                ..Default::default()
            }]);
            spec.overhead = Some([("memory".to_string(), ApiQuantity("10Mi".into()))].into());
        }
        assert_eq!(request_quantity(&p, "memory").value(), i128::from(310 * MI));
        let none = pod("n", 0, None);
        assert_eq!(request_quantity(&none, "memory"), Quantity::ZERO);
    }
}
