//! Host checks kubelet makes before it starts, with kubelet's messages:
//! `failSwapOn` (`pkg/kubelet/cm/container_manager_linux.go`: swap is on
//! when `/proc/swaps` has more than its header line,
//! `pkg/kubelet/util/swap/swap_util.go`) and `failCgroupV1`
//! (`pkg/kubelet/apis/config/validation/validation_linux.go`).

use std::path::Path;

use super::cgroups::detect::{CgroupMode, detect_mode};

/// Why the node role refuses to start on this host.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PreflightError {
    /// Swap is on and `failSwapOn` is true.
    #[error(
        "running with swap on is not supported, please disable swap or set failSwapOn to false"
    )]
    SwapOn,
    /// The host uses cgroup v1 and `failCgroupV1` is true.
    #[error(
        "kubelet is configured to not run on a host using cgroup v1. cgroup v1 support is unsupported and will be removed in a future release (set failCgroupV1: false to run keelson on it)"
    )]
    CgroupV1,
}

/// True when `/proc/swaps` text lists a swap area.
pub fn swap_enabled(proc_swaps: &str) -> bool {
    proc_swaps.lines().filter(|l| !l.trim().is_empty()).count() > 1
}

/// Runs the checks the configuration asks for against this host.
pub fn check(fail_swap_on: bool, fail_cgroup_v1: bool) -> Result<(), PreflightError> {
    check_at(
        fail_swap_on,
        fail_cgroup_v1,
        Path::new("/proc/swaps"),
        Path::new("/proc/self/mountinfo"),
    )
}

fn check_at(
    fail_swap_on: bool,
    fail_cgroup_v1: bool,
    swaps: &Path,
    mountinfo: &Path,
) -> Result<(), PreflightError> {
    if fail_swap_on {
        // No /proc/swaps (a kernel without swap support): no swap.
        let text = std::fs::read_to_string(swaps).unwrap_or_default();
        if swap_enabled(&text) {
            return Err(PreflightError::SwapOn);
        }
    }
    if fail_cgroup_v1 && matches!(detect_mode(mountinfo), Ok(CgroupMode::V1 { .. })) {
        return Err(PreflightError::CgroupV1);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEADER: &str = "Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n";

    #[test]
    fn swap_is_read_from_proc_swaps() {
        assert!(!swap_enabled(HEADER));
        assert!(!swap_enabled(""));
        assert!(swap_enabled(&format!(
            "{HEADER}/swapfile  file  1048572  0  -2\n"
        )));
    }

    #[test]
    fn checks_follow_the_settings() {
        let dir = tempfile::tempdir().expect("dir");
        let swaps = dir.path().join("swaps");
        std::fs::write(&swaps, format!("{HEADER}/dev/sda2 partition 1000 0 -2\n")).expect("w");
        let mountinfo = dir.path().join("mountinfo");
        std::fs::write(
            &mountinfo,
            "30 25 0:26 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n31 25 0:27 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n",
        )
        .expect("w");
        assert_eq!(
            check_at(true, false, &swaps, &mountinfo),
            Err(PreflightError::SwapOn)
        );
        assert_eq!(
            check_at(false, true, &swaps, &mountinfo),
            Err(PreflightError::CgroupV1)
        );
        assert_eq!(check_at(false, false, &swaps, &mountinfo), Ok(()));
        std::fs::write(
            &mountinfo,
            "30 25 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n",
        )
        .expect("w");
        assert_eq!(check_at(false, true, &swaps, &mountinfo), Ok(()));
    }
}
