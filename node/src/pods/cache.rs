//! The runtime cache (kubelet's `kubecontainer.Cache`): the newest runtime
//! view of each pod with the time it was taken. The PLEG fills it for pods
//! whose containers changed; a pod worker uses an entry only when it is
//! newer than its own last sync, and otherwise asks the runtime itself —
//! so a sync always acts on a state taken after its previous actions.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::SystemTime;

use super::runtime::status::RuntimePodStatus;

/// Shared cache; cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct RuntimeCache {
    inner: Arc<Mutex<HashMap<String, Arc<RuntimePodStatus>>>>,
}

impl RuntimeCache {
    /// An empty cache.
    pub fn new() -> Self {
        RuntimeCache::default()
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Arc<RuntimePodStatus>>> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Stores a pod's status (an older one than the cached is ignored).
    pub fn set(&self, status: RuntimePodStatus) {
        let mut m = self.lock();
        match m.get(&status.uid) {
            Some(old) if old.timestamp > status.timestamp => {}
            _ => {
                m.insert(status.uid.clone(), Arc::new(status));
            }
        }
    }

    /// The status of `uid` if it was taken at or after `t`.
    pub fn get_newer_than(&self, uid: &str, t: SystemTime) -> Option<Arc<RuntimePodStatus>> {
        self.lock().get(uid).filter(|s| s.timestamp >= t).cloned()
    }

    /// The status of `uid`, however old.
    pub fn get(&self, uid: &str) -> Option<Arc<RuntimePodStatus>> {
        self.lock().get(uid).cloned()
    }

    /// Forgets `uid`.
    pub fn delete(&self, uid: &str) {
        self.lock().remove(uid);
    }

    /// Every cached pod UID.
    pub fn uids(&self) -> Vec<String> {
        self.lock().keys().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn newer_than() {
        let c = RuntimeCache::new();
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(100);
        let mut s = RuntimePodStatus::empty("u", "p", "n");
        s.timestamp = t0;
        c.set(s.clone());
        assert!(c.get_newer_than("u", t0).is_some());
        assert!(c.get_newer_than("u", t0 + Duration::from_secs(1)).is_none());
        let mut older = s.clone();
        older.timestamp = t0 - Duration::from_secs(5);
        c.set(older);
        assert_eq!(c.get("u").map(|s| s.timestamp), Some(t0));
        c.delete("u");
        assert!(c.get("u").is_none());
    }
}
