//! Timed changes: an API write and the traffic probe that sees it take
//! effect, started together; latency = first correctly routed
//! connection's start − the moment before the write.

use std::time::Duration;

use super::agent::{Agent, Target};
use super::api::ApiTarget;
use super::clock::{mono_ns, since};
use super::error::{BenchError, Result};
use super::scenario::{Scenario, ServiceEntry};

/// What one timed change measured.
#[derive(Debug, Clone)]
pub struct ChangeOutcome {
    /// Write → first connection landing on the new endpoints (`None`: not
    /// seen within the timeout).
    pub latency: Option<Duration>,
    /// The API write's round trip.
    pub write: Duration,
    /// Why it was not seen, if it was not.
    pub last_error: Option<String>,
}

/// Replaces every endpoint of Service `i` in the scenario (the probed
/// change) and returns the Service as it must now be routed.
pub fn prepare_endpoint_change(
    scenario: &mut Scenario,
    i: usize,
) -> Result<(ServiceEntry, Target)> {
    scenario.replace_all(i)?;
    let svc = scenario
        .service(i)
        .cloned()
        .ok_or_else(|| BenchError::Invalid(format!("no Service {i}")))?;
    let target = svc
        .target()
        .ok_or_else(|| BenchError::Invalid(format!("Service {} has no ClusterIP", svc.name)))?;
    Ok((svc, target))
}

/// Writes `svc`'s endpoints and probes `target` until they answer.
pub async fn timed_endpoint_change(
    api: &ApiTarget,
    agent: &Agent,
    svc: &ServiceEntry,
    target: Target,
    timeout: Duration,
) -> Result<ChangeOutcome> {
    let t0 = mono_ns();
    let (reach, write) = tokio::join!(agent.reach(vec![target], timeout), async {
        let r = api.set_endpoints(svc).await;
        (r, mono_ns())
    });
    write.0?;
    let reach = reach?;
    Ok(ChangeOutcome {
        latency: reach
            .reached_ns
            .first()
            .copied()
            .flatten()
            .map(|t| since(t0, t)),
        write: since(t0, write.1),
        last_error: reach.last_error.first().cloned().flatten(),
    })
}

/// Creates a new Service and its slice and probes its VIP until the
/// endpoints answer; returns the outcome and the Service (to delete later).
pub async fn timed_service_add(
    api: &ApiTarget,
    agent: &Agent,
    mut svc: ServiceEntry,
    timeout: Duration,
) -> Result<(ChangeOutcome, ServiceEntry)> {
    let t0 = mono_ns();
    let ip = api.create_service(&svc).await?;
    svc.cluster_ip = Some(ip);
    let target = svc
        .target()
        .ok_or_else(|| BenchError::Invalid(format!("Service {} has no ClusterIP", svc.name)))?;
    let (reach, slice) = tokio::join!(agent.reach(vec![target], timeout), async {
        let r = api.create_slice(&svc).await;
        (r, mono_ns())
    });
    slice.0?;
    let reach = reach?;
    Ok((
        ChangeOutcome {
            latency: reach
                .reached_ns
                .first()
                .copied()
                .flatten()
                .map(|t| since(t0, t)),
            write: since(t0, slice.1),
            last_error: reach.last_error.first().cloned().flatten(),
        },
        svc,
    ))
}
