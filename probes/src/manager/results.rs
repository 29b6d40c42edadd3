//! The probe results cache (upstream's readiness, liveness and startup
//! results managers in one map) and the update notifications the pod worker
//! wakes on.

use std::collections::HashMap;

use tokio::sync::mpsc::UnboundedSender;

use crate::result::{ProbeKind, ProbeState};

/// A probe's cached result changed. Sent only on change; the receiver wakes
/// the pod's worker, which then reads the manager's current results.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeUpdate {
    /// Pod UID.
    pub pod_uid: String,
    /// Container name.
    pub container_name: String,
    /// The container instance.
    pub container_id: String,
    /// Which probe.
    pub kind: ProbeKind,
    /// The new result.
    pub state: ProbeState,
}

/// Results by container instance, one slot per probe kind.
#[derive(Debug, Default)]
pub(crate) struct Results {
    map: HashMap<String, [Option<ProbeState>; 3]>,
}

fn slot(kind: ProbeKind) -> usize {
    match kind {
        ProbeKind::Liveness => 0,
        ProbeKind::Readiness => 1,
        ProbeKind::Startup => 2,
    }
}

impl Results {
    pub(crate) fn get(&self, container_id: &str, kind: ProbeKind) -> Option<ProbeState> {
        self.map
            .get(container_id)
            .and_then(|slots| slots[slot(kind)])
    }

    /// Sets a value without notifying (initial and adopted values).
    pub(crate) fn seed(&mut self, container_id: &str, kind: ProbeKind, state: ProbeState) {
        self.set(container_id, kind, state);
    }

    /// Sets a value; returns whether it changed.
    pub(crate) fn set(&mut self, container_id: &str, kind: ProbeKind, state: ProbeState) -> bool {
        let slots = match self.map.get_mut(container_id) {
            Some(slots) => slots,
            None => self.map.entry(container_id.to_string()).or_default(),
        };
        slots[slot(kind)].replace(state) != Some(state)
    }

    /// Forgets one result of a container instance.
    pub(crate) fn remove(&mut self, container_id: &str, kind: ProbeKind) {
        if let Some(slots) = self.map.get_mut(container_id) {
            slots[slot(kind)] = None;
        }
    }

    /// Forgets every result of a container instance.
    pub(crate) fn remove_container(&mut self, container_id: &str) {
        self.map.remove(container_id);
    }

    /// Number of container instances with results.
    pub(crate) fn containers(&self) -> usize {
        self.map.len()
    }
}

/// Sends updates; a closed receiver is not an error (the agent is stopping).
#[derive(Debug, Clone)]
pub(crate) struct Notifier {
    tx: UnboundedSender<ProbeUpdate>,
}

impl Notifier {
    pub(crate) fn new(tx: UnboundedSender<ProbeUpdate>) -> Notifier {
        Notifier { tx }
    }

    pub(crate) fn send(&self, update: ProbeUpdate) {
        let _ = self.tx.send(update);
    }
}
