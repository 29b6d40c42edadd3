//! Eviction signals and the threshold arithmetic of kubelet's eviction
//! helpers: observations from a summary, which thresholds are met (with or
//! without their minimum reclaim), when each was first seen, which node
//! conditions they raise and for how long (transition period), which have
//! held for their grace period, and in which order they are reclaimed.
//! All pure functions of their inputs and of `now`.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::time::Instant;

use super::summary::Summary;
use crate::config::eviction::{Signal, Threshold, ThresholdValue};
use crate::status::capacity::threshold_quantity;

/// One observed signal: what is available out of what capacity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Observation {
    /// Available amount (bytes, inodes or PIDs); may be negative for PIDs.
    pub available: i64,
    /// Capacity.
    pub capacity: u64,
    /// When the figures were taken.
    pub time: Option<Instant>,
}

/// Observations by signal.
pub type Observations = BTreeMap<Signal, Observation>;

/// The node condition a signal raises.
pub fn node_condition(signal: Signal) -> &'static str {
    match signal {
        Signal::MemoryAvailable | Signal::AllocatableMemoryAvailable => "MemoryPressure",
        Signal::PidAvailable => "PIDPressure",
        _ => "DiskPressure",
    }
}

/// The resource a signal reclaims (`memory`, `ephemeral-storage`, `inodes`, `pids`).
pub fn signal_resource(signal: Signal) -> &'static str {
    match signal {
        Signal::MemoryAvailable | Signal::AllocatableMemoryAvailable => "memory",
        Signal::NodeFsAvailable | Signal::ImageFsAvailable | Signal::ContainerFsAvailable => {
            "ephemeral-storage"
        }
        Signal::NodeFsInodesFree | Signal::ImageFsInodesFree | Signal::ContainerFsInodesFree => {
            "inodes"
        }
        Signal::PidAvailable => "pids",
    }
}

/// kubelet's `isHardEvictionThreshold`: no grace period.
pub fn is_hard(t: &Threshold) -> bool {
    t.grace_period.is_zero()
}

/// kubelet's `hasThreshold` identity: signal, grace period and value.
pub fn same_threshold(a: &Threshold, b: &Threshold) -> bool {
    a.signal == b.signal && a.grace_period == b.grace_period && a.value == b.value
}

/// `addAllocatableThresholds`: every hard `memory.available` threshold gets
/// an `allocatableMemory.available` twin (node allocatable is enforced on pods).
pub fn add_allocatable_thresholds(thresholds: &[Threshold]) -> Vec<Threshold> {
    let mut out = thresholds.to_vec();
    for t in thresholds {
        if t.signal == Signal::MemoryAvailable && is_hard(t) {
            out.push(Threshold {
                signal: Signal::AllocatableMemoryAvailable,
                value: t.value,
                grace_period: Duration::ZERO,
                min_reclaim: t.min_reclaim,
                hard: true,
            });
        }
    }
    out
}

/// `UpdateContainerFsThresholds` for a runtime that keeps writable layers
/// with its images: `containerfs.*` thresholds follow `imagefs.*` when the
/// image filesystem is dedicated, else `nodefs.*`. Configured
/// `containerfs.*` thresholds are replaced, as upstream does.
pub fn with_container_fs_thresholds(
    thresholds: &[Threshold],
    dedicated_image_fs: bool,
) -> Vec<Threshold> {
    let mut out: Vec<Threshold> = thresholds
        .iter()
        .filter(|t| {
            !matches!(
                t.signal,
                Signal::ContainerFsAvailable | Signal::ContainerFsInodesFree
            )
        })
        .cloned()
        .collect();
    let (bytes, inodes) = if dedicated_image_fs {
        (Signal::ImageFsAvailable, Signal::ImageFsInodesFree)
    } else {
        (Signal::NodeFsAvailable, Signal::NodeFsInodesFree)
    };
    for t in thresholds {
        let twin = if t.signal == bytes {
            Signal::ContainerFsAvailable
        } else if t.signal == inodes {
            Signal::ContainerFsInodesFree
        } else {
            continue;
        };
        out.push(Threshold {
            signal: twin,
            ..t.clone()
        });
    }
    out
}

/// `makeSignalObservations`.
pub fn observations(summary: &Summary) -> Observations {
    let mut out = Observations::new();
    let to_i64 = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
    if let Some(m) = summary.node_memory {
        out.insert(
            Signal::MemoryAvailable,
            Observation {
                available: to_i64(m.available),
                capacity: m.available.saturating_add(m.working_set),
                time: Some(m.time),
            },
        );
    }
    if let Some(m) = summary.pods_memory {
        out.insert(
            Signal::AllocatableMemoryAvailable,
            Observation {
                available: to_i64(m.available),
                capacity: m.available.saturating_add(m.working_set),
                time: Some(m.time),
            },
        );
    }
    for (fs, bytes, inodes) in [
        (
            summary.node_fs,
            Signal::NodeFsAvailable,
            Signal::NodeFsInodesFree,
        ),
        (
            summary.image_fs,
            Signal::ImageFsAvailable,
            Signal::ImageFsInodesFree,
        ),
        (
            summary.container_fs,
            Signal::ContainerFsAvailable,
            Signal::ContainerFsInodesFree,
        ),
    ] {
        if let Some(f) = fs {
            out.insert(
                bytes,
                Observation {
                    available: to_i64(f.available),
                    capacity: f.capacity,
                    time: Some(f.time),
                },
            );
            out.insert(
                inodes,
                Observation {
                    available: to_i64(f.inodes_free),
                    capacity: f.inodes,
                    time: Some(f.time),
                },
            );
        }
    }
    if let Some(r) = summary.rlimit {
        out.insert(
            Signal::PidAvailable,
            Observation {
                available: to_i64(r.max_pid) - to_i64(r.running),
                capacity: r.max_pid,
                time: Some(r.time),
            },
        );
    }
    out
}

/// The quantity a threshold stands for given the signal's capacity.
pub fn quantity(value: ThresholdValue, capacity: u64) -> i64 {
    i64::try_from(threshold_quantity(value, capacity)).unwrap_or(i64::MAX)
}

/// `thresholdsMet`: thresholds whose signal is below the value (plus the
/// minimum reclaim when `enforce_min_reclaim`).
pub fn thresholds_met(
    thresholds: &[Threshold],
    obs: &Observations,
    enforce_min_reclaim: bool,
) -> Vec<Threshold> {
    thresholds
        .iter()
        .filter(|t| {
            let Some(o) = obs.get(&t.signal) else {
                tracing::debug!(signal = %t.signal, "eviction manager: no observation found for eviction signal");
                return false;
            };
            let mut q = quantity(t.value, o.capacity);
            if enforce_min_reclaim && let Some(min) = t.min_reclaim {
                q = q.saturating_add(quantity(min, o.capacity));
            }
            q > o.available
        })
        .cloned()
        .collect()
}

/// `mergeThresholds`: `a`, plus what of `b` is not in `a`.
pub fn merge_thresholds(a: Vec<Threshold>, b: &[Threshold]) -> Vec<Threshold> {
    let mut out = a;
    for t in b {
        if !out.iter().any(|x| same_threshold(x, t)) {
            out.push(t.clone());
        }
    }
    out
}

/// When each active threshold was first met.
pub type FirstObserved = Vec<(Threshold, Instant)>;

/// `thresholdsFirstObservedAt`.
pub fn thresholds_first_observed_at(
    thresholds: &[Threshold],
    last: &FirstObserved,
    now: Instant,
) -> FirstObserved {
    thresholds
        .iter()
        .map(|t| {
            let at = last
                .iter()
                .find(|(x, _)| same_threshold(x, t))
                .map(|(_, at)| *at)
                .unwrap_or(now);
            (t.clone(), at)
        })
        .collect()
}

/// `nodeConditions`: the conditions raised by thresholds, each once.
pub fn node_conditions(thresholds: &[Threshold]) -> Vec<&'static str> {
    let mut out = Vec::new();
    for t in thresholds {
        let c = node_condition(t.signal);
        if !out.contains(&c) {
            out.push(c);
        }
    }
    out
}

/// When each condition was last observed.
pub type ConditionsObserved = BTreeMap<&'static str, Instant>;

/// `nodeConditionsLastObservedAt`.
pub fn node_conditions_last_observed_at(
    conditions: &[&'static str],
    last: &ConditionsObserved,
    now: Instant,
) -> ConditionsObserved {
    let mut out: ConditionsObserved = conditions.iter().map(|c| (*c, now)).collect();
    for (c, at) in last {
        out.entry(c).or_insert(*at);
    }
    out
}

/// `nodeConditionsObservedSince`: conditions seen within `period` of `now`.
pub fn node_conditions_observed_since(
    observed: &ConditionsObserved,
    period: Duration,
    now: Instant,
) -> Vec<&'static str> {
    observed
        .iter()
        .filter(|(_, at)| now.saturating_duration_since(**at) < period)
        .map(|(c, _)| *c)
        .collect()
}

/// `thresholdsMetGracePeriod`.
pub fn thresholds_met_grace_period(observed: &FirstObserved, now: Instant) -> Vec<Threshold> {
    observed
        .iter()
        .filter(|(t, at)| {
            let held = now.saturating_duration_since(*at);
            if held < t.grace_period {
                tracing::debug!(signal = %t.signal, held = ?held, grace = ?t.grace_period, "eviction manager: eviction criteria not yet met");
                false
            } else {
                true
            }
        })
        .map(|(t, _)| t.clone())
        .collect()
}

/// `thresholdsUpdatedStats`: thresholds whose observation is newer than
/// the previous round's.
pub fn thresholds_updated_stats(
    thresholds: &[Threshold],
    obs: &Observations,
    last: &Observations,
) -> Vec<Threshold> {
    thresholds
        .iter()
        .filter(|t| {
            let Some(o) = obs.get(&t.signal) else {
                return false;
            };
            match (last.get(&t.signal), o.time) {
                (None, _) | (_, None) => true,
                (Some(l), Some(now)) => l.time.is_none_or(|lt| now > lt),
            }
        })
        .cloned()
        .collect()
}

/// `byEvictionPriority` (a stable sort): memory signals first, signals with
/// no resource to reclaim last.
pub fn sort_by_eviction_priority(thresholds: &mut [Threshold]) {
    thresholds.sort_by_key(|t| match t.signal {
        Signal::MemoryAvailable | Signal::AllocatableMemoryAvailable => 0,
        _ => 1,
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use keelson_common::quantity::Quantity;

    fn hard(signal: Signal, v: &str) -> Threshold {
        Threshold {
            signal,
            value: ThresholdValue::parse(v).expect("value"),
            grace_period: Duration::ZERO,
            min_reclaim: None,
            hard: true,
        }
    }

    fn soft(signal: Signal, v: &str, grace: u64) -> Threshold {
        Threshold {
            grace_period: Duration::from_secs(grace),
            hard: false,
            ..hard(signal, v)
        }
    }

    fn obs(signal: Signal, available: i64, capacity: u64) -> Observations {
        [(
            signal,
            Observation {
                available,
                capacity,
                time: None,
            },
        )]
        .into()
    }

    const MI: i64 = 1024 * 1024;

    #[test]
    fn quantities_and_percentages() {
        let t = vec![
            hard(Signal::MemoryAvailable, "100Mi"),
            hard(Signal::NodeFsAvailable, "10%"),
        ];
        let mut o = obs(Signal::MemoryAvailable, 100 * MI, 1000 * MI as u64);
        o.insert(
            Signal::NodeFsAvailable,
            Observation {
                available: 101,
                capacity: 1000,
                time: None,
            },
        );
        // available == threshold: not met (strictly less than).
        assert!(thresholds_met(&t, &o, false).is_empty());
        o.get_mut(&Signal::MemoryAvailable).expect("mem").available = 100 * MI - 1;
        o.get_mut(&Signal::NodeFsAvailable).expect("fs").available = 99;
        let met = thresholds_met(&t, &o, false);
        assert_eq!(met.len(), 2);
        // No observation: never met.
        assert!(thresholds_met(&[hard(Signal::PidAvailable, "100")], &o, false).is_empty());
    }

    #[test]
    fn minimum_reclaim_keeps_a_threshold_until_reclaimed() {
        let mut t = hard(Signal::MemoryAvailable, "100Mi");
        t.min_reclaim = Some(ThresholdValue::Quantity(
            Quantity::parse("50Mi").expect("q"),
        ));
        let o = obs(Signal::MemoryAvailable, 120 * MI, 1000 * MI as u64);
        assert!(thresholds_met(std::slice::from_ref(&t), &o, false).is_empty());
        // Previously met: stays until available ≥ 150Mi.
        assert_eq!(thresholds_met(std::slice::from_ref(&t), &o, true).len(), 1);
        let o = obs(Signal::MemoryAvailable, 150 * MI, 1000 * MI as u64);
        assert!(thresholds_met(std::slice::from_ref(&t), &o, true).is_empty());
        // Percent minimum reclaim.
        t.min_reclaim = Some(ThresholdValue::Percentage(0.1));
        let o = obs(Signal::MemoryAvailable, 150 * MI, 1000 * MI as u64);
        assert_eq!(thresholds_met(std::slice::from_ref(&t), &o, true).len(), 1);
    }

    #[test]
    fn grace_periods_and_first_observation() {
        let t0 = Instant::now();
        let s = soft(Signal::MemoryAvailable, "1Gi", 30);
        let h = hard(Signal::MemoryAvailable, "100Mi");
        let first = thresholds_first_observed_at(&[s.clone(), h.clone()], &Vec::new(), t0);
        // Hard: at once. Soft: only after its grace period.
        let met = thresholds_met_grace_period(&first, t0);
        assert_eq!(met.len(), 1);
        assert!(same_threshold(&met[0], &h));
        let later = thresholds_first_observed_at(
            std::slice::from_ref(&s),
            &first,
            t0 + Duration::from_secs(29),
        );
        assert_eq!(later[0].1, t0, "first observation is kept");
        assert!(thresholds_met_grace_period(&later, t0 + Duration::from_secs(29)).is_empty());
        assert_eq!(
            thresholds_met_grace_period(&later, t0 + Duration::from_secs(30)).len(),
            1
        );
        // Not met in between: the clock starts again.
        let gone = thresholds_first_observed_at(&[], &later, t0 + Duration::from_secs(31));
        let again = thresholds_first_observed_at(&[s], &gone, t0 + Duration::from_secs(40));
        assert_eq!(again[0].1, t0 + Duration::from_secs(40));
    }

    #[test]
    fn conditions_stay_for_the_transition_period() {
        let t0 = Instant::now();
        let period = Duration::from_secs(300);
        let seen = node_conditions_last_observed_at(&["MemoryPressure"], &BTreeMap::new(), t0);
        assert_eq!(
            node_conditions_observed_since(&seen, period, t0),
            ["MemoryPressure"]
        );
        // The pressure is gone; the condition stays for the transition period.
        let t1 = t0 + Duration::from_secs(10);
        let seen = node_conditions_last_observed_at(&[], &seen, t1);
        assert_eq!(
            node_conditions_observed_since(&seen, period, t1),
            ["MemoryPressure"]
        );
        let t2 = t0 + period - Duration::from_millis(1);
        assert_eq!(
            node_conditions_observed_since(&seen, period, t2),
            ["MemoryPressure"]
        );
        assert!(node_conditions_observed_since(&seen, period, t0 + period).is_empty());
        // Seen again: the window restarts.
        let seen = node_conditions_last_observed_at(&["MemoryPressure"], &seen, t0 + period);
        assert_eq!(seen["MemoryPressure"], t0 + period);
    }

    #[test]
    fn signals_map_to_conditions_and_resources() {
        let t = vec![
            hard(Signal::NodeFsAvailable, "10%"),
            hard(Signal::ImageFsInodesFree, "5%"),
            hard(Signal::PidAvailable, "100"),
            hard(Signal::AllocatableMemoryAvailable, "100Mi"),
        ];
        assert_eq!(
            node_conditions(&t),
            ["DiskPressure", "PIDPressure", "MemoryPressure"]
        );
        assert_eq!(signal_resource(Signal::ImageFsInodesFree), "inodes");
        assert_eq!(signal_resource(Signal::PidAvailable), "pids");
        let mut sorted = t.clone();
        sort_by_eviction_priority(&mut sorted);
        assert_eq!(sorted[0].signal, Signal::AllocatableMemoryAvailable);
        assert_eq!(sorted[1].signal, Signal::NodeFsAvailable);
    }

    #[test]
    fn allocatable_and_container_fs_twins() {
        let t = vec![
            hard(Signal::MemoryAvailable, "100Mi"),
            soft(Signal::MemoryAvailable, "500Mi", 10),
            hard(Signal::NodeFsAvailable, "10%"),
            hard(Signal::ImageFsAvailable, "15%"),
        ];
        let with = add_allocatable_thresholds(&t);
        let twins: Vec<&Threshold> = with
            .iter()
            .filter(|x| x.signal == Signal::AllocatableMemoryAvailable)
            .collect();
        assert_eq!(twins.len(), 1, "only hard memory thresholds get a twin");
        let c = with_container_fs_thresholds(&t, false);
        let cfs = c
            .iter()
            .find(|x| x.signal == Signal::ContainerFsAvailable)
            .expect("containerfs");
        assert_eq!(cfs.value, ThresholdValue::Percentage(0.1));
        let c = with_container_fs_thresholds(&t, true);
        let cfs = c
            .iter()
            .find(|x| x.signal == Signal::ContainerFsAvailable)
            .expect("containerfs");
        assert_eq!(cfs.value, ThresholdValue::Percentage(0.15));
    }

    #[test]
    fn updated_stats_only() {
        let t0 = Instant::now();
        let t = vec![hard(Signal::MemoryAvailable, "100Mi")];
        let at = |time| -> Observations {
            [(
                Signal::MemoryAvailable,
                Observation {
                    available: 0,
                    capacity: 1,
                    time,
                },
            )]
            .into()
        };
        assert_eq!(
            thresholds_updated_stats(&t, &at(Some(t0)), &Observations::new()).len(),
            1
        );
        assert!(thresholds_updated_stats(&t, &at(Some(t0)), &at(Some(t0))).is_empty());
        assert_eq!(
            thresholds_updated_stats(&t, &at(Some(t0 + Duration::from_secs(1))), &at(Some(t0)))
                .len(),
            1
        );
    }
}
