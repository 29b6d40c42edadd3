//! The `systemd` cgroup driver (kubelet's systemd cgroup manager,
//! `pkg/kubelet/cm/cgroup_manager_linux.go` with libcontainer's systemd
//! managers, `opencontainers/cgroups/systemd/{v1,v2}.go`).
//!
//! The same driver-independent names as the cgroupfs driver, but each
//! cgroup is a transient slice unit of systemd:
//!
//! ```text
//! kubepods.slice                                   node allocatable; Guaranteed pods
//! kubepods-burstable.slice                         cpu shares = Σ burstable requests
//! kubepods-besteffort.slice                        cpu shares = 2
//! kubepods-<qos>-pod<uid with _ for ->.slice       the pod's own limits
//! ```
//!
//! As libcontainer does for kubelet:
//! - create: `StartTransientUnit` (a unit that exists already is fine),
//!   then the resources: `SetUnitProperties` with the unit properties
//!   ([`properties`]) and the same values written to the cgroup files
//!   (systemd does not manage every file; the directories are made in
//!   every hierarchy too);
//! - update: `SetUnitProperties` and the cgroup files;
//! - destroy: the processes left are killed, `StopUnit` (its errors, e.g.
//!   an unknown unit, only logged), `ResetFailedUnit`, then whatever
//!   directories remain are removed;
//! - the container runtime gets the expanded path
//!   (`/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod<uid>.slice`)
//!   as the sandbox's cgroup parent and puts each container in a scope of
//!   its own inside that slice.

pub mod dbus;
pub mod name;
pub mod properties;
pub mod units;

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use super::fs::{CgroupError, CgroupFs, ResourceConfig, kill_all};
use super::name::CgroupName;
use properties::{resource_properties, slice_start_properties};
pub use units::{UnitError, UnitManager};

/// Cgroups as systemd slices, the files written through `fs` at their
/// systemd paths.
#[derive(Debug, Clone)]
pub struct SystemdCgroups {
    fs: Arc<dyn CgroupFs>,
    units: Arc<dyn UnitManager>,
    version: Arc<OnceLock<i64>>,
}

impl SystemdCgroups {
    /// Slices through `units`, files through `fs` (the host's hierarchy, or
    /// a fake tree in tests).
    pub fn new(fs: Arc<dyn CgroupFs>, units: Arc<dyn UnitManager>) -> Self {
        SystemdCgroups {
            fs,
            units,
            version: Arc::new(OnceLock::new()),
        }
    }

    fn unified(&self) -> bool {
        self.fs.version() == "v2"
    }

    /// systemd's version, asked once (-1 when unknown, as libcontainer).
    fn systemd_version(&self) -> i64 {
        *self.version.get_or_init(|| match self.units.version() {
            Ok(v) => v,
            Err(e) => {
                tracing::error!(error = %e, "unable to get systemd version");
                -1
            }
        })
    }

    fn set(&self, name: &CgroupName, r: &ResourceConfig, create: bool) -> Result<(), CgroupError> {
        let unit = name::unit_name(name);
        let (props, applied) = resource_properties(r, self.unified(), self.systemd_version());
        if !props.is_empty() {
            self.units
                .set_unit_properties(&unit, &props)
                .map_err(CgroupError::from)?;
        }
        let dir = name::directory_name(name);
        if create {
            self.fs.create(&dir, &applied)
        } else {
            self.fs.update(&dir, &applied)
        }
    }
}

impl From<UnitError> for CgroupError {
    fn from(e: UnitError) -> Self {
        CgroupError::Systemd(e.to_string())
    }
}

impl CgroupFs for SystemdCgroups {
    fn version(&self) -> &'static str {
        self.fs.version()
    }

    fn literal_name(&self, name: &CgroupName) -> String {
        name::systemd_path(name)
    }

    fn create(&self, name: &CgroupName, resources: &ResourceConfig) -> Result<(), CgroupError> {
        if name.is_root() {
            return self.fs.create(name, resources);
        }
        let unit = name::unit_name(name);
        let props = slice_start_properties(&unit, &name::parent_unit(name), self.unified());
        match self.units.start_transient_unit(&unit, &props) {
            Ok(()) => tracing::debug!(unit = %unit, "created systemd slice"),
            // Making sure a slice exists (libcontainer's ignoreExist).
            Err(e) if e.is_unit_exists() => {}
            Err(e) => return Err(e.into()),
        }
        self.set(name, resources, true)
    }

    fn update(&self, name: &CgroupName, resources: &ResourceConfig) -> Result<(), CgroupError> {
        self.set(name, resources, false)
    }

    fn exists(&self, name: &CgroupName) -> bool {
        self.fs.exists(&name::directory_name(name))
    }

    fn pids(&self, name: &CgroupName) -> Result<Vec<i32>, CgroupError> {
        self.fs.pids(&name::directory_name(name))
    }

    fn destroy(&self, name: &CgroupName) -> Result<(), CgroupError> {
        if name.is_root() {
            return Err(CgroupError::Layout(
                "refusing to destroy the root cgroup".into(),
            ));
        }
        let dir = name::directory_name(name);
        // Kill what is left first (kubelet's tryKillingCgroupProcesses).
        for _ in 0..50 {
            let pids = self.fs.pids(&dir)?;
            if pids.is_empty() {
                break;
            }
            kill_all(&pids);
            std::thread::sleep(Duration::from_millis(20));
        }
        let unit = name::unit_name(name);
        match self.units.stop_unit(&unit) {
            Ok(()) => {}
            Err(e) if e.is_no_such_unit() => {}
            Err(e @ UnitError::Timeout { .. }) => return Err(e.into()),
            Err(e) => {
                tracing::info!(unit = %unit, error = %e, "stopping the slice failed; removing its cgroup anyway")
            }
        }
        let _ = self.units.reset_failed_unit(&unit);
        self.fs.destroy(&dir)
    }

    fn children(&self, name: &CgroupName) -> Result<Vec<String>, CgroupError> {
        let mut out: Vec<String> = self
            .fs
            .children(&name::directory_name(name))?
            .iter()
            .filter_map(|d| name::slice_child_base(d))
            .collect();
        out.sort();
        Ok(out)
    }

    fn read(&self, name: &CgroupName) -> Result<ResourceConfig, CgroupError> {
        self.fs.read(&name::directory_name(name))
    }
}

#[cfg(test)]
mod tests {
    use super::properties::PropValue;
    use super::units::memory::MemoryUnits;
    use super::*;
    use crate::cgroups::v2::V2;
    use crate::cgroups::{PodCgroups, QosCgroups};

    fn fake() -> (tempfile::TempDir, Arc<MemoryUnits>, SystemdCgroups) {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("cgroup.controllers"), "cpu memory pids").expect("w");
        let units = Arc::new(MemoryUnits::default());
        let fs: Arc<dyn CgroupFs> = Arc::new(V2::new(dir.path()));
        let sd = SystemdCgroups::new(fs, units.clone());
        (dir, units, sd)
    }

    fn prop(units: &MemoryUnits, unit: &str, p: &str) -> Option<PropValue> {
        units
            .units
            .lock()
            .expect("lock")
            .get(unit)?
            .iter()
            .find(|(n, _)| n == p)
            .map(|(_, v)| v.clone())
    }

    #[test]
    fn qos_and_pod_slices_on_a_fake_v2_tree() {
        let (dir, units, sd) = fake();
        let fs: Arc<dyn CgroupFs> = Arc::new(sd);
        let q = QosCgroups::new(fs.clone(), "/");
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
            prop(&units, "kubepods.slice", "MemoryMax"),
            Some(PropValue::U64(1 << 30))
        );
        assert_eq!(
            prop(&units, "kubepods.slice", "Wants"),
            Some(PropValue::Strs(vec!["-.slice".into()]))
        );
        assert_eq!(
            prop(&units, "kubepods-besteffort.slice", "CPUWeight"),
            Some(PropValue::U64(1))
        );
        assert_eq!(
            std::fs::read_to_string(dir.path().join("kubepods.slice/memory.max")).expect("r"),
            "1073741824"
        );
        let pods = PodCgroups::new(Some(q), "/", true, 100_000, 64);
        let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"uid": "ab-cd"},
            "spec": {"containers": [{"name": "a", "resources": {"limits": {"cpu": "250m", "memory": "32Mi"},
                                                             "requests": {"cpu": "250m", "memory": "32Mi"}}}]}
        }))
        .expect("pod");
        assert_eq!(
            pods.cgroup_parent(&pod),
            "/kubepods.slice/kubepods-podab_cd.slice"
        );
        pods.ensure(&pod, &[Arc::new(pod.clone())]).expect("ensure");
        let unit = "kubepods-podab_cd.slice";
        assert_eq!(
            prop(&units, unit, "CPUQuotaPerSecUSec"),
            Some(PropValue::U64(250_000))
        );
        assert_eq!(prop(&units, unit, "TasksMax"), Some(PropValue::U64(64)));
        assert_eq!(
            std::fs::read_to_string(
                dir.path()
                    .join("kubepods.slice/kubepods-podab_cd.slice/cpu.max")
            )
            .expect("r"),
            "25000 100000"
        );
        let existing = pods.existing().expect("existing");
        assert_eq!(existing.len(), 1);
        assert_eq!(existing[0].0, "ab-cd");
        pods.destroy("ab-cd").expect("destroy");
        assert!(!pods.exists(&pod));
        assert!(!units.units.lock().expect("lock").contains_key(unit));
        assert!(
            units
                .calls
                .lock()
                .expect("lock")
                .contains(&format!("reset {unit}"))
        );
    }

    #[test]
    fn v1_slices_get_v1_properties_and_a_directory_in_every_hierarchy() {
        let (dir, v1) = crate::cgroups::v1::tests::fake();
        let units = Arc::new(MemoryUnits::default());
        let sd = SystemdCgroups::new(Arc::new(v1), units.clone());
        let name = CgroupName::from_cgroupfs("/kubepods/besteffort/podaa-bb");
        let r = ResourceConfig {
            cpu_shares: Some(2),
            cpu_quota: Some(-1),
            cpu_period: Some(100_000),
            memory: Some(64 << 20),
            pids_limit: Some(0),
        };
        sd.create(&name, &r).expect("create");
        let unit = "kubepods-besteffort-podaa_bb.slice";
        assert_eq!(
            prop(&units, unit, "BlockIOAccounting"),
            Some(PropValue::Bool(true))
        );
        assert_eq!(prop(&units, unit, "CPUShares"), Some(PropValue::U64(2)));
        assert_eq!(
            prop(&units, unit, "MemoryLimit"),
            Some(PropValue::U64(64 << 20))
        );
        assert_eq!(prop(&units, unit, "MemoryMax"), None);
        assert_eq!(
            prop(&units, unit, "CPUQuotaPerSecUSec"),
            Some(PropValue::U64(properties::INFINITY))
        );
        assert_eq!(prop(&units, unit, "TasksMax"), Some(PropValue::U64(1)));
        let path = "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-podaa_bb.slice";
        for c in ["cpu", "memory", "pids", "cpuset"] {
            assert!(dir.path().join(c).join(path).is_dir(), "{c}");
        }
        assert_eq!(
            std::fs::read_to_string(
                dir.path()
                    .join("memory")
                    .join(path)
                    .join("memory.limit_in_bytes")
            )
            .expect("r"),
            (64u64 << 20).to_string()
        );
        assert_eq!(sd.literal_name(&name), format!("/{path}"));
        sd.destroy(&name).expect("destroy");
        assert!(!sd.exists(&name));
        assert!(!units.units.lock().expect("lock").contains_key(unit));
    }

    #[test]
    fn an_existing_slice_is_fine_and_a_missing_one_is_removed_anyway() {
        let (_dir, units, sd) = fake();
        let name = CgroupName::from_cgroupfs("/kubepods");
        sd.create(&name, &ResourceConfig::default()).expect("first");
        sd.create(&name, &ResourceConfig::default()).expect("again");
        units.units.lock().expect("lock").clear();
        sd.destroy(&name).expect("destroy with no unit");
        assert!(!sd.exists(&name));
    }
}
