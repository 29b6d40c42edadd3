//! `usageNanoCores`: the rate of a cumulative CPU counter between two
//! samples, as cAdvisor computes it between housekeeping rounds (kubelet
//! asks it for `Count: 2` samples, `pkg/kubelet/stats/helper.go`
//! `getCgroupInfo`) and as kubelet's CRI stats provider does with its
//! `cpuUsageCache` (`pkg/kubelet/stats/cri_stats_provider.go`
//! `getAndUpdateContainerUsageNanoCores`).
//!
//! One entry per cgroup or container, keyed by the caller; entries not
//! sampled in a round are dropped at its end ([`CpuRates::end_round`]), so a
//! removed container's history goes with it and a container that comes back
//! under the same key starts over.

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

/// Shortest window for a rate: closer samples keep the previous rate.
pub const MIN_RATE_WINDOW: Duration = Duration::from_secs(1);

#[derive(Debug, Clone, Copy)]
struct Sample {
    at: Instant,
    usage: u64,
    rate: Option<u64>,
    round: u64,
}

/// The last sample of every counter.
#[derive(Debug, Default)]
pub struct CpuRates {
    samples: HashMap<String, Sample>,
    round: u64,
}

impl CpuRates {
    /// Records `usage` (cumulative ns) of `key` read at `at` and returns
    /// the rate since the previous sample in nanocores: `None` for the
    /// first sample; the previous rate when the two are less than
    /// [`MIN_RATE_WINDOW`] apart (the older sample is kept); 0 when the
    /// counter went backwards (a cgroup recreated under the same name).
    pub fn observe(&mut self, key: &str, at: Instant, usage: u64) -> Option<u64> {
        let round = self.round;
        let rate = match self.samples.get_mut(key) {
            Some(prev) if at.saturating_duration_since(prev.at) >= MIN_RATE_WINDOW => {
                let dt = at.saturating_duration_since(prev.at).as_secs_f64();
                let rate = (usage.saturating_sub(prev.usage) as f64 / dt) as u64;
                *prev = Sample {
                    at,
                    usage,
                    rate: Some(rate),
                    round,
                };
                return Some(rate);
            }
            Some(prev) => {
                prev.round = round;
                return prev.rate;
            }
            None => None,
        };
        self.samples.insert(
            key.to_string(),
            Sample {
                at,
                usage,
                rate,
                round,
            },
        );
        rate
    }

    /// Ends a round: forgets every key not observed since the previous
    /// call.
    pub fn end_round(&mut self) {
        let round = self.round;
        self.samples.retain(|_, s| s.round == round);
        self.round = self.round.wrapping_add(1);
    }

    /// Keys remembered.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.samples.len()
    }

    /// Whether nothing is remembered.
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::panic)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn rate_between_two_samples() {
        let mut r = CpuRates::default();
        let t0 = Instant::now();
        assert_eq!(r.observe("c", t0, 1_000_000_000), None);
        // 10 s later, 5 s of CPU: half a core.
        let t1 = t0 + Duration::from_secs(10);
        assert_eq!(r.observe("c", t1, 6_000_000_000), Some(500_000_000));
        // Another 10 s, 20 s of CPU: two cores.
        let t2 = t1 + Duration::from_secs(10);
        assert_eq!(r.observe("c", t2, 26_000_000_000), Some(2_000_000_000));
    }

    #[tokio::test(start_paused = true)]
    async fn close_samples_keep_the_previous_rate_and_window() {
        let mut r = CpuRates::default();
        let t0 = Instant::now();
        r.observe("c", t0, 0);
        let t1 = t0 + Duration::from_secs(2);
        assert_eq!(r.observe("c", t1, 2_000_000_000), Some(1_000_000_000));
        // 100 ms later: too close, the rate stays and t1 stays the base.
        let t2 = t1 + Duration::from_millis(100);
        assert_eq!(r.observe("c", t2, 9_000_000_000), Some(1_000_000_000));
        // 1 s after t1 (not after t2): the window is t1..t3.
        let t3 = t1 + Duration::from_secs(1);
        assert_eq!(r.observe("c", t3, 2_500_000_000), Some(500_000_000));
    }

    #[tokio::test(start_paused = true)]
    async fn a_counter_that_goes_back_is_zero_not_a_wrap() {
        let mut r = CpuRates::default();
        let t0 = Instant::now();
        r.observe("c", t0, 5_000_000_000);
        assert_eq!(r.observe("c", t0 + Duration::from_secs(5), 1), Some(0));
    }

    #[tokio::test(start_paused = true)]
    async fn keys_not_seen_in_a_round_are_forgotten() {
        let mut r = CpuRates::default();
        let t0 = Instant::now();
        r.observe("a", t0, 0);
        r.observe("b", t0, 0);
        r.end_round();
        let t1 = t0 + Duration::from_secs(10);
        assert_eq!(r.observe("a", t1, 10_000_000_000), Some(1_000_000_000));
        r.end_round();
        assert_eq!(r.len(), 1, "b was not sampled in the second round");
        // b comes back: a first sample again, no rate against old history.
        let t2 = t1 + Duration::from_secs(10);
        assert_eq!(r.observe("b", t2, 50_000_000_000), None);
    }
}
