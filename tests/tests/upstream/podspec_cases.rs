//! The same PodSpec on keelson's node and on kubelet's (issue 19): what
//! each shows — phase, reason, container states as they change, events.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::ensure;
use k8s_openapi::api::core::v1::Pod;
use keelson_tests::upstream::{Agents, Case, Env};
use kube::Api;

use crate::support::{busybox_pod, create_pod, events_for, namespace};

pub const CASES: &[Case] = &[Case {
    name: "crash_loop_status_sequence",
    agents: &[Agents::Keelson],
    run: |env, _| Box::pin(crash_loop_status_sequence(env)),
}];

/// What a watcher saw of a crashing pod.
#[derive(Debug)]
struct Sequence {
    /// Seconds since creation, restart count, container state.
    states: Vec<(f64, i32, String)>,
    /// The phase at the end.
    phase: String,
    /// Distinct events (type, reason, message with the namespace and the
    /// pod's UID taken out).
    events: BTreeSet<String>,
}

/// The distinct events about `name`, their namespace and pod UID replaced
/// so that two nodes' events compare.
async fn event_set(c: &kube::Client, ns: &str, name: &str) -> anyhow::Result<BTreeSet<String>> {
    let uid = Api::<Pod>::namespaced(c.clone(), ns)
        .get(name)
        .await?
        .metadata
        .uid
        .unwrap_or_default();
    Ok(events_for(c, ns, name)
        .await?
        .into_iter()
        .map(|e| {
            let msg = e
                .message
                .unwrap_or_default()
                .replace(&uid, "UID")
                .replace(ns, "NS");
            format!(
                "{} {} {:?}",
                e.type_.unwrap_or_default(),
                e.reason.unwrap_or_default(),
                msg
            )
        })
        .collect())
}

/// One container's state as a watcher sees it change: restart count and
/// `running`, `waiting/<reason>` or `terminated/<reason>`.
fn container_state(p: &Pod) -> Option<(i32, String)> {
    let cs = p.status.as_ref()?.container_statuses.as_ref()?.first()?;
    let st = cs.state.as_ref()?;
    let what = if let Some(w) = &st.waiting {
        format!("waiting/{}", w.reason.clone().unwrap_or_default())
    } else if let Some(t) = &st.terminated {
        format!("terminated/{}", t.reason.clone().unwrap_or_default())
    } else {
        "running".to_string()
    };
    Some((cs.restart_count, what))
}

/// Follows a crashing pod from its creation until its third restart and
/// returns every distinct container state with the seconds since creation.
async fn crash_loop_on(env: &Env, agents: Agents) -> anyhow::Result<Sequence> {
    let node = env.node(agents).await?;
    let c = &env.admin;
    let ns = namespace(c, "seq").await?;
    let pods: Api<Pod> = Api::namespaced(c.clone(), &ns);
    let start = Instant::now();
    create_pod(c, &ns, busybox_pod("crasher", &node.name, "exit 3")).await?;
    let mut seen: Vec<(f64, i32, String)> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(150);
    loop {
        ensure!(Instant::now() < deadline, "no third restart: {seen:?}");
        // Every 50 ms: a state shown for less may be missed on either node.
        tokio::time::sleep(Duration::from_millis(50)).await;
        let pod = pods.get("crasher").await?;
        let Some((restarts, what)) = container_state(&pod) else {
            continue;
        };
        if seen
            .last()
            .is_none_or(|(_, r, w)| (*r, w) != (restarts, &what))
        {
            seen.push((start.elapsed().as_secs_f64(), restarts, what));
        }
        if restarts >= 3 {
            let phase = pod.status.and_then(|s| s.phase).unwrap_or_default();
            let events = event_set(c, &ns, "crasher").await?;
            return Ok(Sequence {
                states: seen,
                phase,
                events,
            });
        }
    }
}

/// A container that exits at once: the states a watcher sees through three
/// restarts — created, terminated, the immediate first restart, then
/// `terminated` through each back-off and `CrashLoopBackOff` at its end —
/// are kubelet's.
async fn crash_loop_status_sequence(env: Arc<Env>) -> anyhow::Result<()> {
    let (mine, theirs) = tokio::join!(
        crash_loop_on(&env, Agents::Keelson),
        crash_loop_on(&env, Agents::Upstream)
    );
    let (mine, theirs) = (mine?, theirs?);
    eprintln!("keelson: {mine:?}\nkubelet: {theirs:?}");
    let states = |s: &Sequence| -> Vec<(i32, String)> {
        s.states.iter().map(|(_, r, w)| (*r, w.clone())).collect()
    };
    // The states in order (kubelet sometimes shows CrashLoopBackOff a
    // second after the crash, when a sync was already pending, rather than
    // at the back-off's end: the order is the same).
    ensure!(
        states(&mine) == states(&theirs),
        "keelson's states differ from kubelet's:\n  keelson: {:?}\n  kubelet: {:?}",
        mine.states,
        theirs.states
    );
    ensure!(
        mine.phase == theirs.phase,
        "phase {} vs kubelet's {}",
        mine.phase,
        theirs.phase
    );
    ensure!(
        mine.events == theirs.events,
        "events differ:\n  keelson: {:#?}\n  kubelet: {:#?}",
        mine.events,
        theirs.events
    );
    // The restarts after a back-off come no earlier than 10 s, then 20 s,
    // after the crash before them, and at most half again later (kubelet's
    // jitter) plus a relist.
    for seq in [&mine, &theirs] {
        let crash = |r: i32| {
            seq.states
                .iter()
                .find(|(_, n, w)| *n == r && w.starts_with("terminated"))
                .map(|(t, _, _)| *t)
        };
        let start = |r: i32| {
            seq.states
                .iter()
                .find(|(_, n, w)| *n == r && w == "running")
                .map(|(t, _, _)| *t)
        };
        for (r, backoff) in [(1, 10.0), (2, 20.0)] {
            let (Some(c), Some(s)) = (crash(r), start(r + 1)) else {
                anyhow::bail!("no crash {r} or restart {}: {:?}", r + 1, seq.states);
            };
            let gap = s - c;
            ensure!(
                gap >= backoff - 1.0 && gap <= backoff * 1.5 + 2.0,
                "restart {} came {gap:.1} s after crash {r} (back-off {backoff} s): {:?}",
                r + 1,
                seq.states
            );
        }
    }
    Ok(())
}
