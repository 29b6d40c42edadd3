//! The pod lifecycle's read side for `keelson diagnose`: what only the
//! running node knows about a pod (its worker, probe results, CrashLoopBackOff
//! and image pull back-offs, the status it generated last). Reads only.

use std::time::SystemTime;

use k8s_openapi::api::core::v1::Container;
use keelson_probes::{ProbeKind, ProbeState as Result_};

use super::PodsHandle;
use super::runtime::status::ContainerState as RtState;
use super::runtime::sync::stable_key;
use crate::pod::podutil;
use keelson_common::introspection::timeline::rfc3339;
use keelson_common::introspection::types::{Backoff, ContainerState, PodState, ProbeState};

fn result_word(r: Result_) -> &'static str {
    match r {
        Result_::Success => "Success",
        Result_::Failure => "Failure",
        Result_::Unknown => "Unknown",
    }
}

fn has_probe(c: &Container, kind: ProbeKind) -> bool {
    match kind {
        ProbeKind::Liveness => c.liveness_probe.is_some(),
        ProbeKind::Readiness => c.readiness_probe.is_some(),
        ProbeKind::Startup => c.startup_probe.is_some(),
    }
}

fn from_nanos(ns: i64) -> SystemTime {
    SystemTime::UNIX_EPOCH + std::time::Duration::from_nanos(u64::try_from(ns).unwrap_or(0))
}

impl PodsHandle {
    /// What the node holds for pod `namespace/name` (`None`: not on this node).
    pub fn introspect(&self, namespace: &str, name: &str) -> Option<PodState> {
        let lc = self.workers.lifecycle();
        let pod = lc
            .store
            .pods_where(|p| podutil::namespace(p) == namespace && podutil::name(p) == name)
            .into_iter()
            .max_by_key(|p| p.metadata.creation_timestamp.as_ref().map(|t| t.0))?;
        let uid = podutil::uid(&pod).to_string();
        let runtime = lc.cache.get(&uid);
        let (last_sync, next_sync) = match self.workers.timing(&uid) {
            Some((last, requeue)) => {
                let next = requeue.map(|at| {
                    let now = tokio::time::Instant::now();
                    SystemTime::now() + at.saturating_duration_since(now)
                });
                (Some(last), next)
            }
            None => (None, None),
        };
        let spec = pod.spec.as_ref();
        let containers = spec
            .into_iter()
            .flat_map(|s| {
                s.init_containers
                    .iter()
                    .flatten()
                    .chain(s.containers.iter())
            })
            .map(|c| {
                let newest = runtime
                    .as_ref()
                    .and_then(|r| r.containers_named(&c.name).next().cloned());
                let probes = match (&lc.probes, &newest) {
                    (Some(p), Some(rt)) => ProbeKind::ALL
                        .into_iter()
                        .filter(|k| has_probe(c, *k))
                        .map(|k| ProbeState {
                            kind: k.as_str().to_lowercase(),
                            result: p
                                .manager()
                                .result(k, &rt.id)
                                .map(result_word)
                                .unwrap_or("Unknown")
                                .to_string(),
                        })
                        .collect(),
                    _ => Vec::new(),
                };
                let backoff = lc.runtime.crash_backoff();
                let restart_backoff = newest
                    .as_ref()
                    .filter(|rt| rt.state == RtState::Exited)
                    .and_then(|rt| {
                        let key = stable_key(&pod, c);
                        let until = backoff.expires_at(&key, from_nanos(rt.finished_at))?;
                        (until > backoff.now()).then(|| Backoff {
                            delay_seconds: backoff.get(&key).as_secs(),
                            until: Some(rfc3339(until)),
                        })
                    });
                // Pull back-off is keyed by the image as the container
                // names it (kubelet's `backOffKey`).
                let pull_backoff = c.image.as_deref().and_then(|image| {
                    let key = format!("{uid}_{image}");
                    let images = lc.runtime.images();
                    let until = images.backoff_until(&key)?;
                    (until > backoff.now()).then(|| Backoff {
                        delay_seconds: images.backoff_delay(&key).as_secs(),
                        until: Some(rfc3339(until)),
                    })
                });
                ContainerState {
                    name: c.name.clone(),
                    container_id: newest.map(|rt| rt.id),
                    probes,
                    restart_backoff,
                    pull_backoff,
                }
            })
            .collect();
        let status = self.pod_status(&uid);
        let rejected = status.as_ref().is_some_and(|s| {
            s.phase.as_deref() == Some("Failed")
                && s.message
                    .as_deref()
                    .is_some_and(|m| m.starts_with("Pod was rejected: "))
        });
        Some(PodState {
            worker_phase: self.workers.phase(&uid).map(|p| format!("{p:?}")),
            rejected,
            last_sync: last_sync.map(rfc3339),
            next_sync: next_sync.map(rfc3339),
            containers,
            status,
            pod: Some((*pod).clone()),
            uid,
        })
    }

    /// PLEG health (`Err` when stale) and the number of pod workers.
    pub fn introspect_node(&self) -> (Option<String>, usize) {
        (
            self.pleg.check().err().map(|e| e.to_string()),
            self.workers.uids().len(),
        )
    }
}
