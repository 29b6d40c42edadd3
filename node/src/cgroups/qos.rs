//! The QoS tiers (kubelet's `qosContainerManager`): `kubepods` with the
//! node's allocatable resources, `burstable` whose CPU shares follow the sum
//! of its pods' requests, and `besteffort` with the minimum shares.
//! Guaranteed pods live directly in `kubepods`.

use std::borrow::Borrow;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;

use super::fs::{CgroupError, CgroupFs, ResourceConfig};
use super::name::CgroupName;
use super::shares::{MIN_SHARES, milli_cpu_to_shares};
use crate::pod::qos::{QosClass, pod_qos};
use crate::pod::resources::pod_requests;

/// The node-level part of the cgroup tree.
#[derive(Debug, Clone)]
pub struct QosCgroups {
    fs: Arc<dyn CgroupFs>,
    kubepods: CgroupName,
}

impl QosCgroups {
    /// The tiers below `cgroup_root` (kubelet `--cgroup-root`, `/` by default).
    pub fn new(fs: Arc<dyn CgroupFs>, cgroup_root: &str) -> Self {
        QosCgroups {
            fs,
            kubepods: CgroupName::from_cgroupfs(cgroup_root).child("kubepods"),
        }
    }

    /// The filesystem.
    pub fn fs(&self) -> &Arc<dyn CgroupFs> {
        &self.fs
    }

    /// `<root>/kubepods`.
    pub fn kubepods(&self) -> &CgroupName {
        &self.kubepods
    }

    /// The cgroup pods of a class live in.
    pub fn parent_of(&self, qos: QosClass) -> CgroupName {
        match qos {
            QosClass::Guaranteed => self.kubepods.clone(),
            QosClass::Burstable => self.kubepods.child("burstable"),
            QosClass::BestEffort => self.kubepods.child("besteffort"),
        }
    }

    /// Creates `kubepods` with the node's allocatable limits and both tiers.
    pub fn setup(&self, allocatable: &ResourceConfig, active: &[Pod]) -> Result<(), CgroupError> {
        self.fs.create(&self.kubepods, allocatable)?;
        self.fs.create(
            &self.parent_of(QosClass::Burstable),
            &ResourceConfig {
                cpu_shares: Some(burstable_shares(active)),
                ..Default::default()
            },
        )?;
        self.fs.create(
            &self.parent_of(QosClass::BestEffort),
            &ResourceConfig {
                cpu_shares: Some(MIN_SHARES),
                ..Default::default()
            },
        )
    }

    /// Re-applies the tiers' CPU shares for the pods now active
    /// (kubelet `UpdateCgroups`), creating a tier that went missing.
    pub fn update<P: Borrow<Pod>>(&self, active: &[P]) -> Result<(), CgroupError> {
        let burstable = self.parent_of(QosClass::Burstable);
        let best_effort = self.parent_of(QosClass::BestEffort);
        let b = ResourceConfig {
            cpu_shares: Some(burstable_shares(active)),
            ..Default::default()
        };
        let e = ResourceConfig {
            cpu_shares: Some(MIN_SHARES),
            ..Default::default()
        };
        if self.fs.exists(&burstable) {
            self.fs.update(&burstable, &b)?;
        } else {
            self.fs.create(&burstable, &b)?;
        }
        if self.fs.exists(&best_effort) {
            self.fs.update(&best_effort, &e)
        } else {
            self.fs.create(&best_effort, &e)
        }
    }
}

/// Shares of the burstable tier: Σ CPU requests of burstable pods.
pub fn burstable_shares<P: Borrow<Pod>>(active: &[P]) -> u64 {
    let milli: i64 = active
        .iter()
        .map(Borrow::borrow)
        .filter(|p| pod_qos(p) == QosClass::Burstable)
        .map(|p| pod_requests(p).cpu_milli)
        .sum();
    milli_cpu_to_shares(milli)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cgroups::v2::V2;

    #[test]
    fn tiers_and_burstable_shares() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("cgroup.controllers"), "cpu memory pids").expect("w");
        let fs: Arc<dyn CgroupFs> = Arc::new(V2::new(dir.path()));
        let q = QosCgroups::new(fs.clone(), "/test-root");
        let burstable: Pod = serde_json::from_value(serde_json::json!({
            "spec": {"containers": [{"name": "a", "resources": {"requests": {"cpu": "1"}}}]}
        }))
        .expect("pod");
        q.setup(
            &ResourceConfig {
                cpu_shares: Some(2048),
                memory: Some(1 << 30),
                ..Default::default()
            },
            &[],
        )
        .expect("setup");
        assert_eq!(
            q.parent_of(QosClass::Guaranteed).to_cgroupfs(),
            "/test-root/kubepods"
        );
        let b = q.parent_of(QosClass::Burstable);
        assert_eq!(b.to_cgroupfs(), "/test-root/kubepods/burstable");
        assert_eq!(
            std::fs::read_to_string(dir.path().join("test-root/kubepods/memory.max")).expect("r"),
            "1073741824"
        );
        assert_eq!(
            fs.read(&b).expect("read").cpu_shares.map(|s| s < 10),
            Some(true)
        );
        q.update(std::slice::from_ref(&burstable)).expect("update");
        // 1 CPU = 1024 shares = weight 39.
        assert_eq!(
            std::fs::read_to_string(dir.path().join("test-root/kubepods/burstable/cpu.weight"))
                .expect("r"),
            "39"
        );
        assert_eq!(burstable_shares(&[burstable]), 1024);
    }
}
