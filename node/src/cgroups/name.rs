//! Driver-independent cgroup names (kubelet's `CgroupName`): a list of path
//! components, rendered for the `cgroupfs` driver as an absolute path.

use std::fmt;

/// A cgroup as a list of components below the hierarchy root, e.g.
/// `["kubepods", "burstable", "pod1234"]`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct CgroupName(Vec<String>);

impl CgroupName {
    /// The hierarchy root.
    pub fn root() -> Self {
        CgroupName(Vec::new())
    }

    /// Parses a `cgroupfs` path (`/a/b/c`, `a/b`, `/`); empty components are dropped.
    pub fn from_cgroupfs(path: &str) -> Self {
        CgroupName(
            path.split('/')
                .filter(|c| !c.is_empty())
                .map(str::to_string)
                .collect(),
        )
    }

    /// This name with one more component.
    pub fn child(&self, component: &str) -> Self {
        let mut c = self.0.clone();
        c.push(component.to_string());
        CgroupName(c)
    }

    /// The components.
    pub fn components(&self) -> &[String] {
        &self.0
    }

    /// The parent (the root's parent is the root).
    pub fn parent(&self) -> Self {
        let mut c = self.0.clone();
        c.pop();
        CgroupName(c)
    }

    /// The last component (empty for the root).
    pub fn base(&self) -> &str {
        self.0.last().map(String::as_str).unwrap_or_default()
    }

    /// True for the hierarchy root.
    pub fn is_root(&self) -> bool {
        self.0.is_empty()
    }

    /// The `cgroupfs` form: `/a/b/c` (the root is `/`).
    pub fn to_cgroupfs(&self) -> String {
        format!("/{}", self.0.join("/"))
    }

    /// The relative path below a hierarchy mount (`a/b/c`, empty for the root).
    pub fn relative(&self) -> String {
        self.0.join("/")
    }

    /// Every ancestor from the first component down to this name itself.
    pub fn lineage(&self) -> Vec<CgroupName> {
        (1..=self.0.len())
            .map(|n| CgroupName(self.0[..n].to_vec()))
            .collect()
    }
}

impl fmt::Display for CgroupName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_cgroupfs())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cgroupfs_round_trip() {
        let n = CgroupName::from_cgroupfs("/keelson-test/kubepods//burstable/");
        assert_eq!(n.components(), ["keelson-test", "kubepods", "burstable"]);
        assert_eq!(n.to_cgroupfs(), "/keelson-test/kubepods/burstable");
        assert_eq!(n.child("pod1").base(), "pod1");
        assert_eq!(n.parent().to_cgroupfs(), "/keelson-test/kubepods");
        assert_eq!(CgroupName::from_cgroupfs("/").to_cgroupfs(), "/");
        assert!(CgroupName::from_cgroupfs("/").is_root());
        assert_eq!(
            n.lineage()
                .iter()
                .map(CgroupName::to_cgroupfs)
                .collect::<Vec<_>>(),
            [
                "/keelson-test",
                "/keelson-test/kubepods",
                "/keelson-test/kubepods/burstable"
            ]
        );
    }
}
