//! Which cgroup hierarchy this host runs, read from `/proc/self/mountinfo`
//! as runc and kubelet read it: the unified hierarchy when cgroup2 is
//! mounted where the v1 controllers would be, else one mount per v1
//! controller (the hybrid layout keeps cgroup2 at `.../unified` with no
//! resource controllers, which does not count).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::fs::CgroupError;

/// The v1 controllers keelson creates pod and QoS cgroups in.
pub const V1_SUBSYSTEMS: &[&str] = &[
    "cpu", "cpuacct", "cpuset", "memory", "pids", "hugetlb", "blkio", "devices", "freezer",
];

/// The host's cgroup layout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CgroupMode {
    /// One unified hierarchy mounted at `mount`.
    V2 {
        /// Where cgroup2 is mounted (usually `/sys/fs/cgroup`).
        mount: PathBuf,
    },
    /// Per-controller hierarchies.
    V1 {
        /// Controller name → its mount point.
        mounts: BTreeMap<String, PathBuf>,
    },
}

/// Reads the layout from a mountinfo file.
pub fn detect_mode(mountinfo: &Path) -> Result<CgroupMode, CgroupError> {
    let text = std::fs::read_to_string(mountinfo)
        .map_err(|e| CgroupError::io(mountinfo, "reading mountinfo", e))?;
    parse_mountinfo(&text)
}

/// Parses mountinfo text (see `proc(5)`).
pub fn parse_mountinfo(text: &str) -> Result<CgroupMode, CgroupError> {
    let mut v1: BTreeMap<String, PathBuf> = BTreeMap::new();
    let mut v2: Option<PathBuf> = None;
    for m in keelson_common::mountinfo::parse_mountinfo(text) {
        match m.fstype.as_str() {
            "cgroup2" if v2.is_none() || m.path == Path::new("/sys/fs/cgroup") => {
                v2 = Some(m.path);
            }
            "cgroup" => {
                for opt in m.options.split(',') {
                    if V1_SUBSYSTEMS.contains(&opt) {
                        v1.entry(opt.to_string()).or_insert_with(|| m.path.clone());
                    }
                }
            }
            _ => {}
        }
    }
    if v1.contains_key("cpu") && v1.contains_key("memory") {
        return Ok(CgroupMode::V1 { mounts: v1 });
    }
    match v2 {
        Some(mount) => Ok(CgroupMode::V2 { mount }),
        None => Err(CgroupError::Layout(
            "neither cgroup v1 cpu+memory controllers nor a cgroup2 mount found in mountinfo"
                .to_string(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HYBRID: &str = "\
24 30 0:22 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw
27 24 0:25 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:9 - tmpfs tmpfs ro,mode=755
28 27 0:26 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:10 - cgroup2 cgroup2 rw,nsdelegate
29 27 0:27 / /sys/fs/cgroup/systemd rw,nosuid shared:11 - cgroup cgroup rw,xattr,name=systemd
32 27 0:30 / /sys/fs/cgroup/cpu rw,nosuid shared:14 - cgroup cgroup rw,cpu
33 27 0:31 / /sys/fs/cgroup/memory rw,nosuid shared:15 - cgroup cgroup rw,memory
34 27 0:32 / /sys/fs/cgroup/pids rw,nosuid shared:16 - cgroup cgroup rw,pids
35 27 0:33 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid shared:17 - cgroup cgroup rw,cpuacct
";

    #[test]
    fn hybrid_host_is_v1_per_controller() {
        let CgroupMode::V1 { mounts } = parse_mountinfo(HYBRID).expect("parse") else {
            panic!("expected v1");
        };
        assert_eq!(mounts["cpu"], PathBuf::from("/sys/fs/cgroup/cpu"));
        assert_eq!(mounts["memory"], PathBuf::from("/sys/fs/cgroup/memory"));
        assert_eq!(
            mounts["cpuacct"],
            PathBuf::from("/sys/fs/cgroup/cpu,cpuacct")
        );
        assert!(!mounts.contains_key("systemd"));
    }

    #[test]
    fn unified_host_is_v2() {
        let text = "30 25 0:26 / /sys/fs/cgroup rw,nosuid shared:4 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot\n";
        assert_eq!(
            parse_mountinfo(text).expect("parse"),
            CgroupMode::V2 {
                mount: PathBuf::from("/sys/fs/cgroup")
            }
        );
    }

    #[test]
    fn no_cgroups_is_an_error() {
        assert!(parse_mountinfo("1 0 0:1 / / rw - ext4 /dev/sda rw\n").is_err());
    }
}
