//! Driver-independent cgroup names in systemd's form, as kubelet converts
//! them (`pkg/kubelet/cm/cgroup_manager_linux.go` `ToSystemd`,
//! `ParseSystemdToCgroupName`, and libcontainer's `ExpandSlice`):
//!
//! ```text
//! ["kubepods", "burstable", "pod12ab-34cd"]
//!   unit:   kubepods-burstable-pod12ab_34cd.slice   ("-" inside a component becomes "_")
//!   path:   /kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod12ab_34cd.slice
//!   parent: kubepods-burstable.slice                 (the root's parent is "-.slice")
//! ```

use super::super::name::CgroupName;

/// The root slice.
pub const ROOT_SLICE: &str = "-.slice";
const SUFFIX: &str = ".slice";

fn escape(part: &str) -> String {
    part.replace('-', "_")
}

fn unescape(part: &str) -> String {
    part.replace('_', "-")
}

/// The slice unit of `name` (`a-b-c.slice`; the root is `-.slice`).
pub fn unit_name(name: &CgroupName) -> String {
    if name.is_root() {
        return ROOT_SLICE.to_string();
    }
    let parts: Vec<String> = name.components().iter().map(|c| escape(c)).collect();
    format!("{}{SUFFIX}", parts.join("-"))
}

/// The slice `name` lives in (its parent's unit), as kubelet gives
/// libcontainer's `Parent`.
pub fn parent_unit(name: &CgroupName) -> String {
    unit_name(&name.parent())
}

/// A name that is no systemd slice (libcontainer's text).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid slice name: {0}")]
pub struct InvalidSlice(pub String);

/// The cgroupfs path of a slice unit (libcontainer's `ExpandSlice`):
/// `a-b-c.slice` → `/a.slice/a-b.slice/a-b-c.slice`.
pub fn expand_slice(slice: &str) -> Result<String, InvalidSlice> {
    let invalid = || InvalidSlice(slice.to_string());
    let base = slice.strip_suffix(SUFFIX).ok_or_else(invalid)?;
    if base.is_empty() || slice.contains('/') {
        return Err(invalid());
    }
    if base == "-" {
        return Ok("/".to_string());
    }
    let mut path = String::new();
    let mut prefix = String::new();
    for component in base.split('-') {
        if component.is_empty() {
            return Err(invalid());
        }
        path.push('/');
        path.push_str(&prefix);
        path.push_str(component);
        path.push_str(SUFFIX);
        prefix.push_str(component);
        prefix.push('-');
    }
    Ok(path)
}

/// The cgroupfs path of `name` under the systemd driver (kubelet's
/// `CgroupName.ToSystemd`, what it passes to CRI as the cgroup parent).
pub fn systemd_path(name: &CgroupName) -> String {
    if name.is_root() {
        return "/".to_string();
    }
    // A name made of components is always a valid slice; an empty
    // component (impossible for a CgroupName) would give the root.
    expand_slice(&unit_name(name)).unwrap_or_else(|_| "/".to_string())
}

/// The same path as a [`CgroupName`] whose components are directory names
/// (`["a.slice", "a-b.slice"]`), for the cgroup filesystem.
pub fn directory_name(name: &CgroupName) -> CgroupName {
    CgroupName::from_cgroupfs(&systemd_path(name))
}

/// The driver-independent name of a systemd cgroup path or slice unit
/// (kubelet's `ParseSystemdToCgroupName`): only the last path element is
/// read, since it encodes the whole hierarchy.
pub fn parse(path: &str) -> CgroupName {
    let base = path.rsplit('/').next().unwrap_or_default();
    let base = base.strip_suffix(SUFFIX).unwrap_or(base);
    let mut out = CgroupName::root();
    for part in base.split('-') {
        out = out.child(&unescape(part));
    }
    out
}

/// The last component of the name a slice directory stands for
/// (`kubepods-burstable-pod12ab_34cd.slice` → `pod12ab-34cd`); `None` for
/// anything that is not a slice (scopes of containers, plain dirs).
pub fn slice_child_base(dir_name: &str) -> Option<String> {
    dir_name.strip_suffix(SUFFIX)?;
    parse(dir_name).components().last().cloned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(parts: &[&str]) -> CgroupName {
        parts.iter().fold(CgroupName::root(), |n, p| n.child(p))
    }

    #[test]
    fn names_follow_kubelet() {
        let pod = name(&["kubepods", "burstable", "pod1234-abcd-5678-efgh"]);
        assert_eq!(
            unit_name(&pod),
            "kubepods-burstable-pod1234_abcd_5678_efgh.slice"
        );
        assert_eq!(
            systemd_path(&pod),
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1234_abcd_5678_efgh.slice"
        );
        assert_eq!(parent_unit(&pod), "kubepods-burstable.slice");
        assert_eq!(parent_unit(&name(&["kubepods"])), "-.slice");
        assert_eq!(unit_name(&CgroupName::root()), "-.slice");
        assert_eq!(systemd_path(&CgroupName::root()), "/");
        assert_eq!(
            directory_name(&name(&["kubepods", "besteffort"])).components(),
            ["kubepods.slice", "kubepods-besteffort.slice"]
        );
        // A cgroup root with dashes stays one component.
        let rooted = name(&["keelson-test-1", "kubepods"]);
        assert_eq!(
            systemd_path(&rooted),
            "/keelson_test_1.slice/keelson_test_1-kubepods.slice"
        );
    }

    #[test]
    fn parse_is_the_inverse() {
        let pod = name(&["kubepods", "besteffort", "podaa-bb"]);
        assert_eq!(parse(&systemd_path(&pod)), pod);
        assert_eq!(parse("kubepods-besteffort-podaa_bb.slice"), pod);
        assert_eq!(
            slice_child_base("kubepods-besteffort-podaa_bb.slice").as_deref(),
            Some("podaa-bb")
        );
        assert_eq!(slice_child_base("cri-containerd-abc.scope"), None);
    }

    #[test]
    fn expand_slice_follows_libcontainer() {
        assert_eq!(expand_slice("-.slice").as_deref(), Ok("/"));
        assert_eq!(
            expand_slice("test-a-b.slice").as_deref(),
            Ok("/test.slice/test-a.slice/test-a-b.slice")
        );
        for bad in [
            "test--a.slice",
            "-test.slice",
            "a.scope",
            ".slice",
            "a/b.slice",
        ] {
            assert!(expand_slice(bad).is_err(), "{bad}");
        }
    }
}
