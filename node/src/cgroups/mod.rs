//! Pod and QoS cgroups, as kubelet's container manager creates them. With
//! the `cgroupfs` driver:
//!
//! ```text
//! <cgroupRoot>/kubepods                      node allocatable; Guaranteed pods
//! <cgroupRoot>/kubepods/burstable            cpu shares = Σ burstable requests
//! <cgroupRoot>/kubepods/besteffort           cpu shares = 2
//! <cgroupRoot>/kubepods/<qos>/pod<uid>        the pod's own limits
//! ```
//!
//! The container runtime creates each container's cgroup under the pod's
//! (the pod cgroup is the sandbox's `cgroup_parent`). With the `systemd`
//! driver ([`systemd`]) the same names are systemd slices
//! (`kubepods.slice`, `kubepods-burstable.slice`,
//! `kubepods-burstable-pod<uid>.slice`) created over D-Bus, their files
//! written through the same [`CgroupFs`] at the slices' paths.
//!
//! Kernel access goes through one narrow trait, [`CgroupFs`], with two real
//! implementations: [`v1::V1`] (one hierarchy per controller, the hybrid
//! layout of this machine) and [`v2::V2`] (the unified hierarchy most
//! production nodes run). Both write plain files under a root directory, so
//! v2 is tested against a fake tree in a temporary directory and v1 against
//! the real `/sys/fs/cgroup` in the system tier.

pub mod detect;
pub mod driver;
pub mod fs;
pub mod name;
pub mod pod;
pub mod qos;
pub mod resources;
pub mod shares;
pub mod systemd;
pub mod v1;
pub mod v2;

pub use detect::{CgroupMode, detect_mode};
pub use fs::{CgroupError, CgroupFs, ResourceConfig};
pub use name::CgroupName;
pub use pod::PodCgroups;
pub use qos::QosCgroups;
pub use resources::resource_config_for_pod;

use std::sync::Arc;

use crate::config::CgroupDriver;

/// Opens the cgroup filesystem of this host: v2 when `/sys/fs/cgroup` is the
/// unified hierarchy, else v1 with each controller's own mount.
pub fn open_host() -> Result<Arc<dyn CgroupFs>, CgroupError> {
    match detect_mode(std::path::Path::new("/proc/self/mountinfo"))? {
        CgroupMode::V2 { mount } => Ok(Arc::new(v2::V2::new(mount))),
        CgroupMode::V1 { mounts } => Ok(Arc::new(v1::V1::new(mounts))),
    }
}

/// `fs` as `driver` manages it: the files directly (`cgroupfs`), or as
/// slices of systemd (`systemd`) reached on the D-Bus at `systemd_bus`
/// (`None`: the system bus, `DBUS_SYSTEM_BUS_ADDRESS` or
/// `/run/dbus/system_bus_socket`).
pub fn for_driver(
    driver: CgroupDriver,
    fs: Arc<dyn CgroupFs>,
    systemd_bus: Option<&str>,
) -> Result<Arc<dyn CgroupFs>, CgroupError> {
    match driver {
        CgroupDriver::Cgroupfs => Ok(fs),
        CgroupDriver::Systemd => {
            let units = match systemd_bus {
                Some(address) => systemd::dbus::DbusUnits::at(address)?,
                None => systemd::dbus::DbusUnits::system()?,
            };
            tracing::info!(bus = %units.address(), "cgroup driver systemd: pod and QoS cgroups are systemd slices");
            Ok(Arc::new(systemd::SystemdCgroups::new(fs, Arc::new(units))))
        }
    }
}

/// The host path of `name` under `driver` (kubelet's `CgroupManager.Name`),
/// for readers that find cgroups by path (statistics, eviction).
pub fn literal_name(driver: CgroupDriver, name: &CgroupName) -> String {
    match driver {
        CgroupDriver::Cgroupfs => name.to_cgroupfs(),
        CgroupDriver::Systemd => systemd::name::systemd_path(name),
    }
}
