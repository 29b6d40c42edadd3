//! `node.status.volumesInUse`, as kubelet v1.36 keeps it
//! (pkg/kubelet/volumemanager/volume_manager.go `GetVolumesInUse`,
//! `MarkVolumesAsReportedInUse`, `ReconcilerStatesHasBeenSynced`;
//! pkg/kubelet/nodestatus/setters.go `VolumesInUse`): the attachable
//! volumes some pod on the node wants mounted (desired state) together
//! with those still attached to the node as far as the volume manager
//! knows (actual state: until their device is unmounted), sorted and
//! deduplicated. The attach/detach controller never detaches a volume
//! listed there.
//!
//! The volume manager writes it, the node status manager reports it once
//! the volume manager has read back what an earlier process left mounted
//! ([`VolumesInUse::set_synced`]) and, after a successful status write,
//! tells which names the API server has ([`VolumesInUse::mark_reported`]):
//! kubelet waits for that before it verifies a volume's attachment.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

#[derive(Debug, Default)]
struct State {
    /// Per pod UID, the attachable volumes it wants mounted.
    desired: BTreeMap<String, BTreeSet<String>>,
    /// Volumes attached to the node whose device is not unmounted yet.
    attached: BTreeSet<String>,
    /// What the last successful status write carried.
    reported: BTreeSet<String>,
    /// The volume manager has reconstructed its state.
    synced: bool,
}

/// The node's volumes in use; cheap to clone, shared by the volume manager
/// and the node status manager.
#[derive(Debug, Clone, Default)]
pub struct VolumesInUse {
    inner: Arc<Mutex<State>>,
}

impl VolumesInUse {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Pod `uid` wants the attachable volume `name` mounted.
    pub fn add_desired(&self, uid: &str, name: &str) {
        self.state()
            .desired
            .entry(uid.to_string())
            .or_default()
            .insert(name.to_string());
    }

    /// Pod `uid` wants no volume any more (its volumes are torn down).
    pub fn remove_pod(&self, uid: &str) {
        self.state().desired.remove(uid);
    }

    /// Whether some pod wants the volume `name` mounted.
    pub fn is_desired(&self, name: &str) -> bool {
        self.state().desired.values().any(|v| v.contains(name))
    }

    /// The volume `name` is attached (verified, or found staged).
    pub fn add_attached(&self, name: &str) {
        self.state().attached.insert(name.to_string());
    }

    /// The device of `name` is unmounted: it is no longer attached as far
    /// as this node is concerned (`MarkVolumeAsDetached`).
    pub fn remove_attached(&self, name: &str) {
        self.state().attached.remove(name);
    }

    /// The volume manager's state is reconstructed: the list may be
    /// reported.
    pub fn set_synced(&self) {
        self.state().synced = true;
    }

    /// The sorted list to report, or `None` before the volume manager
    /// synced (the Node's list is then left as it is).
    pub fn to_report(&self) -> Option<Vec<String>> {
        let st = self.state();
        if !st.synced {
            return None;
        }
        let all: BTreeSet<&String> = st
            .desired
            .values()
            .flatten()
            .chain(st.attached.iter())
            .collect();
        Some(all.into_iter().cloned().collect())
    }

    /// The API server has `names` in the Node's `volumesInUse`.
    pub fn mark_reported(&self, names: &[String]) {
        self.state().reported = names.iter().cloned().collect();
    }

    /// Whether `name` was in the last written `volumesInUse`.
    pub fn is_reported(&self, name: &str) -> bool {
        self.state().reported.contains(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn desired_and_attached_until_unmounted() {
        let v = VolumesInUse::default();
        v.add_desired("pod-a", "kubernetes.io/csi/d^h2");
        v.add_desired("pod-b", "kubernetes.io/csi/d^h1");
        v.add_desired("pod-a", "kubernetes.io/csi/d^h1");
        // Nothing reported before the volume manager synced.
        assert_eq!(v.to_report(), None);
        v.set_synced();
        assert_eq!(
            v.to_report(),
            Some(vec![
                "kubernetes.io/csi/d^h1".to_string(),
                "kubernetes.io/csi/d^h2".to_string()
            ])
        );
        v.add_attached("kubernetes.io/csi/d^h1");
        assert!(v.is_desired("kubernetes.io/csi/d^h2"));
        v.remove_pod("pod-a");
        assert!(!v.is_desired("kubernetes.io/csi/d^h2"));
        v.remove_pod("pod-b");
        // Still attached (device mounted): still in use.
        assert_eq!(
            v.to_report(),
            Some(vec!["kubernetes.io/csi/d^h1".to_string()])
        );
        v.remove_attached("kubernetes.io/csi/d^h1");
        assert_eq!(v.to_report(), Some(vec![]));
        assert!(!v.is_reported("x"));
        v.mark_reported(&["x".to_string()]);
        assert!(v.is_reported("x"));
    }
}
