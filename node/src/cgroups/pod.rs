//! Pod-level cgroups (kubelet's `podContainerManager`): `pod<uid>` under the
//! pod's QoS tier, with the pod's limits; the sandbox's `cgroup_parent`.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;

use super::fs::{CgroupError, ResourceConfig};
use super::name::CgroupName;
use super::qos::QosCgroups;
use super::resources::resource_config_for_pod;
use crate::pod::podutil;
use crate::pod::qos::{QosClass, pod_qos};

/// Creates, updates and removes pod cgroups.
#[derive(Debug, Clone)]
pub struct PodCgroups {
    /// `None` when `cgroupsPerQOS` is off: pods then run directly under the root.
    qos: Option<QosCgroups>,
    root: CgroupName,
    enforce_cpu_limits: bool,
    cfs_period_us: u64,
    pod_pids_limit: i64,
}

impl PodCgroups {
    /// Pod cgroups under `qos` tiers (or none when `qos` is `None`).
    pub fn new(
        qos: Option<QosCgroups>,
        cgroup_root: &str,
        enforce_cpu_limits: bool,
        cfs_period_us: u64,
        pod_pids_limit: i64,
    ) -> Self {
        PodCgroups {
            qos,
            root: CgroupName::from_cgroupfs(cgroup_root),
            enforce_cpu_limits,
            cfs_period_us,
            pod_pids_limit,
        }
    }

    /// The QoS tiers, when pod cgroups are on.
    pub fn qos(&self) -> Option<&QosCgroups> {
        self.qos.as_ref()
    }

    /// The pod's cgroup (`<root>/kubepods/<tier>/pod<uid>`), or the root when
    /// pod cgroups are off.
    pub fn name_of(&self, pod: &Pod) -> CgroupName {
        match &self.qos {
            Some(q) => q
                .parent_of(pod_qos(pod))
                .child(&format!("pod{}", podutil::uid(pod))),
            None => self.root.clone(),
        }
    }

    /// What the sandbox gets as `cgroup_parent`: the driver's form of the
    /// pod's cgroup (`/kubepods/burstable/pod<uid>`, or with systemd
    /// `/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid>.slice`).
    pub fn cgroup_parent(&self, pod: &Pod) -> String {
        let name = self.name_of(pod);
        match &self.qos {
            Some(q) => q.fs().literal_name(&name),
            None => name.to_cgroupfs(),
        }
    }

    /// The limits the pod's cgroup gets.
    pub fn resources_of(&self, pod: &Pod) -> ResourceConfig {
        resource_config_for_pod(
            pod,
            self.enforce_cpu_limits,
            self.cfs_period_us,
            self.pod_pids_limit,
        )
    }

    /// Whether the pod's cgroup exists (always true when pod cgroups are off).
    pub fn exists(&self, pod: &Pod) -> bool {
        match &self.qos {
            Some(q) => q.fs().exists(&self.name_of(pod)),
            None => true,
        }
    }

    /// Creates the pod's cgroup when missing (after refreshing the QoS tiers
    /// for `active` pods, as kubelet does); an existing one is left as is.
    pub fn ensure(&self, pod: &Pod, active: &[Arc<Pod>]) -> Result<(), CgroupError> {
        let Some(q) = &self.qos else { return Ok(()) };
        let name = self.name_of(pod);
        if q.fs().exists(&name) {
            return Ok(());
        }
        q.update(active)?;
        q.fs().create(&name, &self.resources_of(pod))
    }

    /// Kills what is left in a pod's cgroup and removes it, wherever it is.
    pub fn destroy(&self, uid: &str) -> Result<(), CgroupError> {
        let Some(q) = &self.qos else { return Ok(()) };
        for class in [
            QosClass::Guaranteed,
            QosClass::Burstable,
            QosClass::BestEffort,
        ] {
            let name = q.parent_of(class).child(&format!("pod{uid}"));
            if q.fs().exists(&name) || !q.fs().children(&name)?.is_empty() {
                q.fs().destroy(&name)?;
            }
        }
        Ok(())
    }

    /// Pod UIDs that have a cgroup, with its name (for orphan cleanup).
    pub fn existing(&self) -> Result<Vec<(String, CgroupName)>, CgroupError> {
        let Some(q) = &self.qos else {
            return Ok(Vec::new());
        };
        let mut out = Vec::new();
        for class in [
            QosClass::Guaranteed,
            QosClass::Burstable,
            QosClass::BestEffort,
        ] {
            let parent = q.parent_of(class);
            for child in q.fs().children(&parent)? {
                if let Some(uid) = child.strip_prefix("pod") {
                    out.push((uid.to_string(), parent.child(&child)));
                }
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cgroups::fs::CgroupFs;
    use crate::cgroups::v2::V2;
    use std::sync::Arc;

    #[test]
    fn pod_cgroup_lifecycle_on_a_fake_v2_tree() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("cgroup.controllers"), "cpu memory pids").expect("w");
        let fs: Arc<dyn CgroupFs> = Arc::new(V2::new(dir.path()));
        let q = QosCgroups::new(fs, "/");
        q.setup(&ResourceConfig::default(), &[]).expect("setup");
        let pods = PodCgroups::new(Some(q), "/", true, 100_000, -1);
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"uid": "abc"},
            "spec": {"containers": [{"name": "a", "resources": {"limits": {"cpu": "200m", "memory": "32Mi"},
                                                             "requests": {"cpu": "200m", "memory": "32Mi"}}}]}
        }))
        .expect("pod");
        assert_eq!(pods.cgroup_parent(&pod), "/kubepods/podabc");
        assert!(!pods.exists(&pod));
        pods.ensure(&pod, &[Arc::new(pod.clone())]).expect("ensure");
        assert!(pods.exists(&pod));
        assert_eq!(
            std::fs::read_to_string(dir.path().join("kubepods/podabc/cpu.max")).expect("r"),
            "20000 100000"
        );
        let existing = pods.existing().expect("existing");
        assert_eq!(existing.len(), 1);
        assert_eq!(existing[0].0, "abc");
        pods.destroy("abc").expect("destroy");
        assert!(!pods.exists(&pod));
    }
}
