//! The resize conditions kubelet's status manager keeps per pod
//! (`podResizeConditions`, `pkg/kubelet/status/status_manager.go`):
//! `PodResizePending` (reason `Infeasible`, or `Deferred` for anything
//! else) and `PodResizeInProgress` (no reason, or `Error` with the
//! failure), with their own probe and transition times and the generation
//! they are about. The status generator copies them into every status.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};

use k8s_openapi::api::core::v1::PodCondition;

use crate::pods::clock::{SharedClock, to_api_time};

/// `v1.PodResizePending`.
pub const PENDING: &str = "PodResizePending";
/// `v1.PodResizeInProgress`.
pub const IN_PROGRESS: &str = "PodResizeInProgress";
/// `v1.PodReasonInfeasible`.
pub const INFEASIBLE: &str = "Infeasible";
/// `v1.PodReasonDeferred`.
pub const DEFERRED: &str = "Deferred";
/// `v1.PodReasonError`.
pub const ERROR: &str = "Error";

#[derive(Debug, Clone, Default)]
struct Pair {
    pending: Option<PodCondition>,
    in_progress: Option<PodCondition>,
}

/// The resize conditions of every pod.
#[derive(Debug)]
pub struct ResizeConditions {
    clock: SharedClock,
    pods: Mutex<HashMap<String, Pair>>,
}

impl ResizeConditions {
    /// An empty store.
    pub fn new(clock: SharedClock) -> Self {
        ResizeConditions {
            clock,
            pods: Mutex::default(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Pair>> {
        self.pods.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// `updatedPodResizeCondition`: probe time now; transition time now
    /// unless the reason stays.
    fn updated(
        &self,
        ty: &str,
        old: Option<&PodCondition>,
        reason: &str,
        message: &str,
        generation: i64,
    ) -> PodCondition {
        let now = to_api_time(self.clock.now());
        let transition = match old {
            Some(o) if o.reason.as_deref().unwrap_or_default() == reason => {
                o.last_transition_time.clone()
            }
            _ => Some(now.clone()),
        };
        PodCondition {
            type_: ty.to_string(),
            status: "True".into(),
            last_probe_time: Some(now),
            last_transition_time: transition,
            observed_generation: (generation != 0).then_some(generation),
            reason: (!reason.is_empty()).then(|| reason.to_string()),
            message: (!message.is_empty()).then(|| message.to_string()),
        }
    }

    /// The pod's conditions (pending first).
    pub fn list(&self, uid: &str) -> Vec<PodCondition> {
        let pods = self.lock();
        let Some(p) = pods.get(uid) else {
            return Vec::new();
        };
        p.pending
            .iter()
            .chain(p.in_progress.iter())
            .cloned()
            .collect()
    }

    /// `SetPodResizePendingCondition`: any reason but `Infeasible` is
    /// `Deferred`; true when the reason or generation changed.
    pub fn set_pending(&self, uid: &str, reason: &str, message: &str, generation: i64) -> bool {
        let reason = if reason == INFEASIBLE {
            INFEASIBLE
        } else {
            DEFERRED
        };
        let mut pods = self.lock();
        let entry = pods.entry(uid.to_string()).or_default();
        let previous = entry.pending.clone();
        entry.pending = Some(self.updated(PENDING, previous.as_ref(), reason, message, generation));
        match previous {
            None => true,
            Some(p) => {
                p.reason.as_deref() != Some(reason)
                    || p.observed_generation.unwrap_or(0) != generation
            }
        }
    }

    /// `SetPodResizeInProgressCondition`: an existing condition keeps its
    /// generation (and its reason and message unless new ones are given);
    /// returns the generation and whether it changed.
    pub fn set_in_progress(
        &self,
        uid: &str,
        reason: &str,
        message: &str,
        generation: i64,
    ) -> (i64, bool) {
        let mut pods = self.lock();
        let entry = pods.entry(uid.to_string()).or_default();
        let previous = entry.in_progress.clone();
        let (mut reason, mut message, mut generation) =
            (reason.to_string(), message.to_string(), generation);
        if let Some(c) = &previous {
            if reason.is_empty() && message.is_empty() {
                reason = c.reason.clone().unwrap_or_default();
                message = c.message.clone().unwrap_or_default();
            }
            generation = c.observed_generation.unwrap_or(0);
        }
        let next = self.updated(
            IN_PROGRESS,
            previous.as_ref(),
            &reason,
            &message,
            generation,
        );
        let changed = match &previous {
            None => true,
            Some(p) => {
                p.reason != next.reason
                    || p.message != next.message
                    || p.observed_generation != next.observed_generation
            }
        };
        entry.in_progress = Some(next);
        (generation, changed)
    }

    /// `ClearPodResizePendingCondition`.
    pub fn clear_pending(&self, uid: &str) {
        if let Some(p) = self.lock().get_mut(uid) {
            p.pending = None;
        }
    }

    /// `ClearPodResizeInProgressCondition`: the cleared generation, if any.
    pub fn clear_in_progress(&self, uid: &str) -> Option<i64> {
        self.lock()
            .get_mut(uid)
            .and_then(|p| p.in_progress.take())
            .map(|c| c.observed_generation.unwrap_or(0))
    }

    /// Whether the pending resize is deferred.
    pub fn is_deferred(&self, uid: &str) -> bool {
        self.pending_reason(uid).as_deref() == Some(DEFERRED)
    }

    /// Whether the pending resize is infeasible.
    pub fn is_infeasible(&self, uid: &str) -> bool {
        self.pending_reason(uid).as_deref() == Some(INFEASIBLE)
    }

    fn pending_reason(&self, uid: &str) -> Option<String> {
        self.lock()
            .get(uid)
            .and_then(|p| p.pending.as_ref())
            .and_then(|c| c.reason.clone())
    }

    /// `BackfillPodResizeConditions`: conditions a pod's API status carries
    /// (after a keelson restart).
    pub fn backfill(&self, uid: &str, conditions: &[PodCondition]) {
        let mut pods = self.lock();
        for c in conditions {
            if c.type_ != PENDING && c.type_ != IN_PROGRESS {
                continue;
            }
            let entry = pods.entry(uid.to_string()).or_default();
            let mut c = c.clone();
            c.status = "True".into();
            if c.type_ == PENDING {
                entry.pending = Some(c);
            } else {
                entry.in_progress = Some(c);
            }
        }
    }

    /// Forgets a pod.
    pub fn remove(&self, uid: &str) {
        self.lock().remove(uid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn kubelets_rules() {
        let c = ResizeConditions::new(Arc::new(crate::pods::clock::WallClock));
        assert!(c.set_pending("u", "OutOfcpu", "Node didn't have enough resource", 2));
        assert!(c.is_deferred("u"));
        assert!(
            !c.set_pending("u", "OutOfmemory", "again", 2),
            "still Deferred, same generation"
        );
        assert!(c.set_pending("u", INFEASIBLE, "no", 2));
        assert!(c.is_infeasible("u"));
        assert_eq!(c.set_in_progress("u", "", "", 3), (3, true));
        // The generation stays; an error replaces reason and message.
        assert_eq!(c.set_in_progress("u", ERROR, "boom", 4), (3, true));
        assert_eq!(c.set_in_progress("u", "", "", 5), (3, false));
        let l = c.list("u");
        assert_eq!(l.len(), 2);
        assert_eq!(l[1].reason.as_deref(), Some(ERROR));
        assert_eq!(c.clear_in_progress("u"), Some(3));
        assert_eq!(c.clear_in_progress("u"), None);
        c.clear_pending("u");
        assert!(c.list("u").is_empty());
    }
}
