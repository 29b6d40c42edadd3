//! What kubelet reads of the host to complete a container's Linux
//! resources (pkg/kubelet/kuberuntime/kuberuntime_container_linux.go):
//! whether the memory controller is on cgroup v2 (`isCgroup2UnifiedMode`),
//! whether a swap controller exists (`checkSwapControllerAvailability`),
//! the host's huge page sizes (libcontainer's `HugePageSizes`) and
//! `singleProcessOOMKill`.

use std::path::Path;

/// The host facts container resources depend on.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LinuxHost {
    /// The resource controllers are on the unified hierarchy.
    pub cgroup_v2: bool,
    /// `memory.memsw.limit_in_bytes` (v1) or `memory.swap.max` (v2) exists.
    pub swap_controller: bool,
    /// Huge page sizes as CRI names them (`2MB`, `1GB`), ascending.
    pub hugepage_sizes: Vec<String>,
    /// `singleProcessOOMKill`: without it, an OOM kill on cgroup v2 takes
    /// the whole container (`memory.oom.group=1`).
    pub single_process_oom_kill: bool,
}

/// The unit list of huge page sizes (`hugePageSizeUnitList`).
const UNITS: [&str; 6] = ["B", "KB", "MB", "GB", "TB", "PB"];

/// A huge page size in bytes as CRI names it (`HugePageUnitSizeFromByteSize`):
/// `2097152` → `2MB`. `None` when it is not a whole number of the largest
/// unit it reaches.
pub fn page_size_name(mut size: u64) -> Option<String> {
    if size == 0 {
        return None;
    }
    let mut idx = 0;
    while size.is_multiple_of(1024) && idx < UNITS.len() - 1 {
        size /= 1024;
        idx += 1;
    }
    if size > 1024 && idx < UNITS.len() - 1 {
        return None;
    }
    Some(format!("{size}{}", UNITS[idx]))
}

/// The page sizes under `/sys/kernel/mm/hugepages` (`hugepages-2048kB`, ...).
pub fn hugepage_sizes(dir: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut sizes: Vec<u64> = entries
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let kb = name.strip_prefix("hugepages-")?.strip_suffix("kB")?;
            kb.parse::<u64>().ok()?.checked_mul(1024)
        })
        .collect();
    sizes.sort_unstable();
    sizes.into_iter().filter_map(page_size_name).collect()
}

impl LinuxHost {
    /// This host: `cgroup_v2` as the cgroup filesystem in use says,
    /// `single_process_oom_kill` from the configuration (`None`: kubelet's
    /// default, true on v1 and false on v2).
    pub fn detect(cgroup_v2: bool, single_process_oom_kill: Option<bool>) -> Self {
        let swap_controller = if cgroup_v2 {
            // The root has no memory.swap.max: look at our own cgroup.
            std::fs::read_to_string("/proc/self/cgroup")
                .ok()
                .and_then(|t| {
                    t.lines()
                        .find_map(|l| l.strip_prefix("0::").map(str::to_string))
                })
                .is_some_and(|own| {
                    Path::new("/sys/fs/cgroup")
                        .join(own.trim_start_matches('/'))
                        .join("memory.swap.max")
                        .exists()
                })
        } else {
            Path::new("/sys/fs/cgroup/memory/memory.memsw.limit_in_bytes").exists()
        };
        LinuxHost {
            cgroup_v2,
            swap_controller,
            hugepage_sizes: hugepage_sizes(Path::new("/sys/kernel/mm/hugepages")),
            single_process_oom_kill: single_process_oom_kill.unwrap_or(!cgroup_v2),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_sizes_are_named_as_cri_names_them() {
        assert_eq!(page_size_name(2 << 20).as_deref(), Some("2MB"));
        assert_eq!(page_size_name(1 << 30).as_deref(), Some("1GB"));
        assert_eq!(page_size_name(64 << 10).as_deref(), Some("64KB"));
        assert_eq!(page_size_name(0), None);
        // 1025 KB is not a whole number of MB and is more than 1024 KB.
        assert_eq!(page_size_name(1025 << 10), None);
    }

    #[test]
    fn sizes_are_read_from_sysfs_names() {
        let dir = tempfile::tempdir().expect("dir");
        for d in ["hugepages-1048576kB", "hugepages-2048kB", "other"] {
            std::fs::create_dir(dir.path().join(d)).expect("mkdir");
        }
        assert_eq!(hugepage_sizes(dir.path()), vec!["2MB", "1GB"]);
        assert!(hugepage_sizes(&dir.path().join("missing")).is_empty());
    }
}
