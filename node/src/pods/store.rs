//! The pod manager (kubelet's `pod.Manager`): the pods this node should
//! run, from every source (the API and static manifests), by UID, and the
//! mirror pods standing for static pods in the API.

use std::collections::HashMap;
use std::sync::{Arc, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use k8s_openapi::api::core::v1::Pod;

use crate::pod::podutil;

#[derive(Debug, Default)]
struct Inner {
    /// Desired pods (API pods and static pods), mirror pods excluded.
    pods: HashMap<String, Arc<Pod>>,
    /// Mirror pods by full name (`name_namespace`).
    mirrors: HashMap<String, Arc<Pod>>,
}

/// Shared store; cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct PodStore {
    inner: Arc<RwLock<Inner>>,
}

impl PodStore {
    /// An empty store.
    pub fn new() -> Self {
        PodStore::default()
    }

    fn read(&self) -> RwLockReadGuard<'_, Inner> {
        self.inner.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write(&self) -> RwLockWriteGuard<'_, Inner> {
        self.inner.write().unwrap_or_else(PoisonError::into_inner)
    }

    /// Adds or replaces a pod (a mirror pod goes to the mirror table).
    pub fn upsert(&self, pod: Pod) -> Arc<Pod> {
        let pod = Arc::new(pod);
        let mut w = self.write();
        if podutil::is_mirror(&pod) {
            w.mirrors.insert(podutil::full_name(&pod), pod.clone());
        } else {
            w.pods.insert(podutil::uid(&pod).to_string(), pod.clone());
        }
        pod
    }

    /// Removes a pod (or mirror pod) by its object; returns the removed pod.
    pub fn remove(&self, pod: &Pod) -> Option<Arc<Pod>> {
        let mut w = self.write();
        if podutil::is_mirror(pod) {
            let key = podutil::full_name(pod);
            if w.mirrors
                .get(&key)
                .is_some_and(|m| podutil::uid(m) == podutil::uid(pod))
            {
                return w.mirrors.remove(&key);
            }
            None
        } else {
            w.pods.remove(podutil::uid(pod))
        }
    }

    /// A desired pod by UID.
    pub fn get(&self, uid: &str) -> Option<Arc<Pod>> {
        self.read().pods.get(uid).cloned()
    }

    /// Every desired pod.
    pub fn pods(&self) -> Vec<Arc<Pod>> {
        self.read().pods.values().cloned().collect()
    }

    /// Desired pods from one kind of source (`static_only`: file pods).
    pub fn pods_where(&self, f: impl Fn(&Pod) -> bool) -> Vec<Arc<Pod>> {
        self.read()
            .pods
            .values()
            .filter(|p| f(p))
            .cloned()
            .collect()
    }

    /// The mirror pod of a static pod.
    pub fn mirror_of(&self, pod: &Pod) -> Option<Arc<Pod>> {
        self.read().mirrors.get(&podutil::full_name(pod)).cloned()
    }

    /// Every mirror pod.
    pub fn mirrors(&self) -> Vec<Arc<Pod>> {
        self.read().mirrors.values().cloned().collect()
    }

    /// The API object a pod's status is written to: the pod itself, or for
    /// a static pod its mirror.
    pub fn api_object(&self, uid: &str) -> Option<Arc<Pod>> {
        let r = self.read();
        let pod = r.pods.get(uid)?;
        if podutil::is_static(pod) {
            r.mirrors.get(&podutil::full_name(pod)).cloned()
        } else {
            Some(pod.clone())
        }
    }

    /// Replaces all pods of the API source with `pods` (a relist), keeping
    /// static pods; returns the removed API pods.
    pub fn replace_api_pods(&self, pods: Vec<Pod>) -> Vec<Arc<Pod>> {
        let mut w = self.write();
        let mut new_pods: HashMap<String, Arc<Pod>> = HashMap::new();
        let mut new_mirrors: HashMap<String, Arc<Pod>> = HashMap::new();
        for p in pods {
            let p = Arc::new(p);
            if podutil::is_mirror(&p) {
                new_mirrors.insert(podutil::full_name(&p), p);
            } else {
                new_pods.insert(podutil::uid(&p).to_string(), p);
            }
        }
        let mut removed = Vec::new();
        for (uid, p) in w.pods.drain() {
            if podutil::is_static(&p) {
                new_pods.insert(uid, p);
            } else if !new_pods.contains_key(&uid) {
                removed.push(p);
            }
        }
        w.pods = new_pods;
        w.mirrors = new_mirrors;
        removed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, uid: &str, ann: serde_json::Value) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "ns", "uid": uid, "annotations": ann},
            "spec": {"containers": []}
        }))
        .expect("pod")
    }

    #[test]
    fn static_pods_and_mirrors() {
        let s = PodStore::new();
        s.upsert(pod("api", "a", serde_json::json!({})));
        s.upsert(pod(
            "web-n1",
            "st",
            serde_json::json!({"kubernetes.io/config.source": "file"}),
        ));
        s.upsert(pod(
            "web-n1",
            "m1",
            serde_json::json!({"kubernetes.io/config.mirror": "st"}),
        ));
        assert_eq!(s.pods().len(), 2);
        assert_eq!(
            s.api_object("st").map(|p| podutil::uid(&p).to_string()),
            Some("m1".into())
        );
        assert_eq!(
            s.api_object("a").map(|p| podutil::uid(&p).to_string()),
            Some("a".into())
        );
        let removed = s.replace_api_pods(vec![]);
        assert_eq!(removed.len(), 1);
        assert!(s.get("st").is_some());
        assert!(s.api_object("st").is_none());
    }
}
