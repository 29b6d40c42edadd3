//! Pod and QoS cgroups, as kubelet's container manager creates them with the
//! `cgroupfs` driver:
//!
//! ```text
//! <cgroupRoot>/kubepods                      node allocatable; Guaranteed pods
//! <cgroupRoot>/kubepods/burstable            cpu shares = Σ burstable requests
//! <cgroupRoot>/kubepods/besteffort           cpu shares = 2
//! <cgroupRoot>/kubepods/<qos>/pod<uid>        the pod's own limits
//! ```
//!
//! The container runtime creates each container's cgroup under the pod's
//! (the pod cgroup is the sandbox's `cgroup_parent`).
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
pub mod v1;
pub mod v2;

pub use detect::{CgroupMode, detect_mode};
pub use fs::{CgroupError, CgroupFs, ResourceConfig};
pub use name::CgroupName;
pub use pod::PodCgroups;
pub use qos::QosCgroups;
pub use resources::resource_config_for_pod;

use std::sync::Arc;

/// Opens the cgroup filesystem of this host: v2 when `/sys/fs/cgroup` is the
/// unified hierarchy, else v1 with each controller's own mount.
pub fn open_host() -> Result<Arc<dyn CgroupFs>, CgroupError> {
    match detect_mode(std::path::Path::new("/proc/self/mountinfo"))? {
        CgroupMode::V2 { mount } => Ok(Arc::new(v2::V2::new(mount))),
        CgroupMode::V1 { mounts } => Ok(Arc::new(v1::V1::new(mounts))),
    }
}
