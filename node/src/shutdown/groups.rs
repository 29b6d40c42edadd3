//! Pod groups by priority and their grace periods (kubelet's `podManager`,
//! pkg/kubelet/nodeshutdown/nodeshutdown_manager.go: `migrateConfig`,
//! `groupByPriority`, `periodRequested`).

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;

use crate::config::shutdown::ShutdownGracePeriodByPodPriority;

/// `scheduling.DefaultPriorityWhenNoDefaultClassExists`.
pub const DEFAULT_PRIORITY: i32 = 0;
/// `scheduling.SystemCriticalPriority`.
pub const SYSTEM_CRITICAL_PRIORITY: i32 = 2_000_000_000;

/// The grace periods by priority, lowest priority first; empty means
/// graceful node shutdown is off.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Periods(Vec<ShutdownGracePeriodByPodPriority>);

impl Periods {
    /// From the configuration: `by_priority` when given, else the two
    /// durations (`shutdownGracePeriod` minus the critical pods' part for
    /// every pod below system-critical priority, that part for the rest).
    pub fn from_config(
        total: Duration,
        critical: Duration,
        by_priority: &[ShutdownGracePeriodByPodPriority],
    ) -> Periods {
        let mut list = if by_priority.is_empty() {
            migrate(total, critical)
        } else {
            by_priority.to_vec()
        };
        list.sort_by_key(|p| p.priority);
        Periods(list)
    }

    /// Whether graceful node shutdown is on.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// How long the node must hold its shutdown back: every group's period
    /// together (the logind inhibit delay asked for).
    pub fn requested(&self) -> Duration {
        let secs: i64 = self.0.iter().map(|p| p.shutdown_grace_period_seconds).sum();
        Duration::from_secs(u64::try_from(secs).unwrap_or(0))
    }

    /// The pods in groups, lowest priority first; every group is listed,
    /// also when empty. A pod goes to the group of the highest priority not
    /// above its own (the first group when below every one).
    pub fn group<'a>(&self, pods: &'a [std::sync::Arc<Pod>]) -> Vec<Group<'a>> {
        let mut groups: Vec<Group<'a>> = self
            .0
            .iter()
            .map(|p| Group {
                priority: p.priority,
                seconds: p.shutdown_grace_period_seconds,
                pods: Vec::new(),
            })
            .collect();
        if groups.is_empty() {
            return groups;
        }
        for pod in pods {
            let priority = pod
                .spec
                .as_ref()
                .and_then(|s| s.priority)
                .unwrap_or(DEFAULT_PRIORITY);
            let i = match groups.iter().position(|g| g.priority >= priority) {
                None => groups.len() - 1,
                Some(i) if i > 0 && groups[i].priority > priority => i - 1,
                Some(i) => i,
            };
            groups[i].pods.push(pod);
        }
        groups
    }
}

fn migrate(total: Duration, critical: Duration) -> Vec<ShutdownGracePeriodByPodPriority> {
    if total.is_zero() || critical > total {
        return Vec::new();
    }
    let secs = |d: Duration| i64::try_from(d.as_secs()).unwrap_or(i64::MAX);
    vec![
        ShutdownGracePeriodByPodPriority {
            priority: DEFAULT_PRIORITY,
            shutdown_grace_period_seconds: secs(total - critical),
        },
        ShutdownGracePeriodByPodPriority {
            priority: SYSTEM_CRITICAL_PRIORITY,
            shutdown_grace_period_seconds: secs(critical),
        },
    ]
}

/// The pods of one priority group.
#[derive(Debug)]
pub struct Group<'a> {
    /// The group's lowest priority.
    pub priority: i32,
    /// Its grace period in seconds.
    pub seconds: i64,
    /// Its pods.
    pub pods: Vec<&'a std::sync::Arc<Pod>>,
}

impl Group<'_> {
    /// The grace period a pod of this group gets: the group's, or the
    /// pod's own `terminationGracePeriodSeconds` when that is not longer.
    pub fn grace_for(&self, pod: &Pod) -> i64 {
        match pod
            .spec
            .as_ref()
            .and_then(|s| s.termination_grace_period_seconds)
        {
            Some(own) if own <= self.seconds => own,
            _ => self.seconds,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    fn pod(name: &str, priority: Option<i32>, grace: Option<i64>) -> Arc<Pod> {
        let mut p = Pod::default();
        p.metadata.name = Some(name.into());
        let spec = p.spec.get_or_insert_with(Default::default);
        spec.priority = priority;
        spec.termination_grace_period_seconds = grace;
        Arc::new(p)
    }

    fn names(g: &Group<'_>) -> Vec<String> {
        g.pods
            .iter()
            .map(|p| p.metadata.name.clone().unwrap_or_default())
            .collect()
    }

    #[test]
    fn the_two_durations_become_two_groups() {
        let p = Periods::from_config(Duration::from_secs(30), Duration::from_secs(10), &[]);
        assert_eq!(p.requested(), Duration::from_secs(30));
        let pods = [
            pod("plain", None, None),
            pod("critical", Some(SYSTEM_CRITICAL_PRIORITY), None),
            pod("node-critical", Some(2_000_001_000), Some(5)),
        ];
        let g = p.group(&pods);
        assert_eq!((g[0].priority, g[0].seconds), (0, 20));
        assert_eq!(names(&g[0]), ["plain"]);
        assert_eq!(
            (g[1].priority, g[1].seconds),
            (SYSTEM_CRITICAL_PRIORITY, 10)
        );
        assert_eq!(names(&g[1]), ["critical", "node-critical"]);
        assert_eq!(g[1].grace_for(&pods[1]), 10);
        assert_eq!(g[1].grace_for(&pods[2]), 5);
    }

    #[test]
    fn off_without_a_period_or_with_critical_above_total() {
        assert!(Periods::from_config(Duration::ZERO, Duration::ZERO, &[]).is_empty());
        assert!(
            Periods::from_config(Duration::from_secs(5), Duration::from_secs(6), &[]).is_empty()
        );
    }

    #[test]
    fn by_priority_is_sorted_and_pods_go_to_the_group_below() {
        let entry = |priority, seconds| ShutdownGracePeriodByPodPriority {
            priority,
            shutdown_grace_period_seconds: seconds,
        };
        let p = Periods::from_config(
            Duration::ZERO,
            Duration::ZERO,
            &[entry(100_000, 120), entry(-5, 5), entry(10_000, 60)],
        );
        assert_eq!(p.requested(), Duration::from_secs(185));
        let pods = [
            pod("below-all", Some(-100), Some(30)),
            pod("exact", Some(10_000), Some(30)),
            pod("between", Some(50_000), Some(300)),
            pod("above-all", Some(200_000), None),
            pod("default", None, None),
        ];
        let g = p.group(&pods);
        assert_eq!(
            g.iter().map(|g| g.priority).collect::<Vec<_>>(),
            [-5, 10_000, 100_000]
        );
        assert_eq!(names(&g[0]), ["below-all", "default"]);
        assert_eq!(names(&g[1]), ["exact", "between"]);
        assert_eq!(names(&g[2]), ["above-all"]);
        // The group's period caps a longer own grace period.
        assert_eq!(g[1].grace_for(&pods[2]), 60);
        assert_eq!(g[0].grace_for(&pods[0]), 5);
    }
}
