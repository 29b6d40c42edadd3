//! The churn phase: background endpoint changes at K per second (one
//! endpoint of a random Service replaced per write) while probed changes
//! (every endpoint of a reserved Service replaced, then timed by traffic)
//! run at their own rate on Services the background never touches.

use std::collections::HashSet;
use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, Instant};

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use tokio::time::MissedTickBehavior;

use super::agent::Agent;
use super::api::ApiTarget;
use super::changes::{ChangeOutcome, prepare_endpoint_change, timed_endpoint_change};
use super::contestant::ProxyProcess;
use super::error::Result;
use super::results::ChurnStats;
use super::scenario::Scenario;

/// Background writes in flight at most (beyond that a tick is skipped and
/// the achieved rate shows it).
const MAX_WRITES_IN_FLIGHT: usize = 32;

/// The Services reserved for probed changes among `n`.
pub fn probe_pool(n: usize) -> std::ops::Range<usize> {
    0..(n / 4).clamp(1, 256).min(n)
}

/// Settings of one churn phase.
#[derive(Debug, Clone, Copy)]
pub struct ChurnPlan {
    /// Services in the scenario (N).
    pub services: usize,
    /// Background changes per second (0: none).
    pub rate: f64,
    /// Probed changes per second.
    pub probe_rate: f64,
    /// Length.
    pub duration: Duration,
    /// Longest wait for one probed change.
    pub change_timeout: Duration,
}

/// What the phase measured.
#[derive(Debug, Clone, Default)]
pub struct ChurnOutcome {
    /// Counters.
    pub stats: ChurnStats,
    /// Probed changes, in completion order.
    pub probes: Vec<ChangeOutcome>,
    /// The first refused write, if any.
    pub first_write_error: Option<String>,
}

type BoxFut<'a, T> = Pin<Box<dyn Future<Output = T> + 'a>>;

fn interval(per_second: f64) -> tokio::time::Interval {
    let period = Duration::from_secs_f64(1.0 / per_second.max(0.001));
    let mut i = tokio::time::interval(period);
    i.set_missed_tick_behavior(MissedTickBehavior::Skip);
    i
}

/// Runs the phase; fails early if the contestant exits.
pub async fn run(
    plan: ChurnPlan,
    scenario: &mut Scenario,
    api: &ApiTarget,
    agent: &Agent,
    proc: &mut ProxyProcess,
) -> Result<ChurnOutcome> {
    let n = plan.services;
    let probes_range = probe_pool(n);
    let background = if probes_range.end < n {
        probes_range.end..n
    } else {
        0..n
    };
    let mut out = ChurnOutcome {
        stats: ChurnStats {
            target_rate: plan.rate,
            ..ChurnStats::default()
        },
        ..ChurnOutcome::default()
    };
    let mut writes: FuturesUnordered<BoxFut<'_, Result<()>>> = FuturesUnordered::new();
    let mut probes: FuturesUnordered<BoxFut<'_, (usize, Result<ChangeOutcome>)>> =
        FuturesUnordered::new();
    let mut in_flight: HashSet<usize> = HashSet::new();
    let mut churn_tick = interval(plan.rate);
    let mut probe_tick = interval(plan.probe_rate);
    let mut alive_tick = tokio::time::interval(Duration::from_millis(500));
    let started = Instant::now();
    let end = tokio::time::Instant::from_std(started + plan.duration);
    loop {
        let running = tokio::time::Instant::now() < end;
        if !running && writes.is_empty() && probes.is_empty() {
            break;
        }
        tokio::select! {
            _ = churn_tick.tick(), if running && plan.rate > 0.0 => {
                if writes.len() >= MAX_WRITES_IN_FLIGHT {
                    continue;
                }
                let mut i = scenario.pick(background.clone());
                for _ in 0..8 {
                    if !in_flight.contains(&i) { break; }
                    i = scenario.pick(background.clone());
                }
                if in_flight.contains(&i) {
                    continue;
                }
                scenario.replace_one(i)?;
                if let Some(svc) = scenario.service(i).cloned() {
                    out.stats.writes += 1;
                    writes.push(Box::pin(async move { api.set_endpoints(&svc).await }));
                }
            }
            _ = probe_tick.tick(), if running => {
                let free = (0..16)
                    .map(|_| scenario.pick(probes_range.clone()))
                    .find(|i| !in_flight.contains(i));
                let Some(i) = free else { continue };
                let (svc, target) = prepare_endpoint_change(scenario, i)?;
                in_flight.insert(i);
                out.stats.probes += 1;
                let timeout = plan.change_timeout;
                probes.push(Box::pin(async move {
                    (i, timed_endpoint_change(api, agent, &svc, target, timeout).await)
                }));
            }
            Some(r) = writes.next() => {
                if let Err(e) = r {
                    out.stats.write_errors += 1;
                    out.first_write_error.get_or_insert_with(|| e.to_string());
                }
            }
            Some((i, r)) = probes.next() => {
                in_flight.remove(&i);
                out.probes.push(r?);
            }
            _ = alive_tick.tick() => proc.check_alive()?,
            _ = tokio::time::sleep_until(end), if running => {}
        }
    }
    let secs = plan.duration.as_secs_f64();
    out.stats.seconds = secs;
    out.stats.achieved_rate = (out.stats.writes + out.stats.probes) as f64 / secs.max(1e-9);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_pool_sizes() {
        assert_eq!(probe_pool(1), 0..1);
        assert_eq!(probe_pool(24), 0..6);
        assert_eq!(probe_pool(10_000), 0..256);
    }
}
