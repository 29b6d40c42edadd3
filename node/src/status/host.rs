//! Facts about the machine that go into Node status, read the way cAdvisor
//! reads them for kubelet: logical CPUs online, `MemTotal`, huge page pools,
//! machine id, system UUID, boot id, swap, kernel release, OS image, and the
//! size of the filesystem holding the root dir (`ephemeral-storage`).
//!
//! Behind the [`Host`] trait so status logic is tested with fixed figures;
//! [`RealHost`] reads procfs/sysfs/statvfs under configurable roots, so its
//! parsing is tested against a fake file tree.

use std::net::IpAddr;
use std::path::{Path, PathBuf};

/// Why a host fact could not be read.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// A file could not be read.
    #[error("reading {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A file had unexpected content.
    #[error("parsing {path}: {reason}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// What was wrong.
        reason: String,
    },
    /// A system call failed.
    #[error("{call} {path}: {source}")]
    Sys {
        /// The call (`statvfs`, `getifaddrs`).
        call: &'static str,
        /// Its argument, if any.
        path: String,
        /// The errno.
        #[source]
        source: nix::Error,
    },
}

/// One huge page pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HugePages {
    /// Page size in KiB (2048, 1048576).
    pub page_size_kib: u64,
    /// Pages in the pool (`nr_hugepages`).
    pub num_pages: u64,
}

/// cAdvisor's MachineInfo, the part kubelet uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MachineInfo {
    /// Logical CPUs online.
    pub num_cores: u64,
    /// `MemTotal` in bytes.
    pub memory_capacity: u64,
    /// Huge page pools, by size.
    pub hugepages: Vec<HugePages>,
    /// `/etc/machine-id`.
    pub machine_id: String,
    /// DMI product UUID (empty when the machine has none).
    pub system_uuid: String,
    /// `/proc/sys/kernel/random/boot_id`.
    pub boot_id: String,
    /// `SwapTotal` in bytes.
    pub swap_capacity: u64,
}

/// cAdvisor's VersionInfo, the part kubelet uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VersionInfo {
    /// `uname -r`.
    pub kernel_version: String,
    /// `PRETTY_NAME` of os-release, else `Linux`.
    pub os_image: String,
}

/// Size and free space of a filesystem (statvfs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FsStats {
    /// Total bytes.
    pub capacity: u64,
    /// Bytes available to unprivileged users.
    pub available: u64,
    /// Total inodes.
    pub inodes: u64,
    /// Free inodes.
    pub inodes_free: u64,
}

/// Where host facts come from.
pub trait Host: Send + Sync + 'static {
    /// CPU, memory, huge pages and identity of the machine.
    fn machine_info(&self) -> Result<MachineInfo, HostError>;
    /// Kernel and OS image.
    fn version_info(&self) -> Result<VersionInfo, HostError>;
    /// statvfs of the filesystem holding `path`.
    fn fs_stats(&self, path: &Path) -> Result<FsStats, HostError>;
    /// Addresses configured on the host's interfaces.
    fn interface_addresses(&self) -> Result<Vec<IpAddr>, HostError>;
}

/// Reads the real machine. Roots are configurable for tests.
#[derive(Debug, Clone)]
pub struct RealHost {
    /// procfs mount (`/proc`).
    pub proc_root: PathBuf,
    /// sysfs mount (`/sys`).
    pub sys_root: PathBuf,
    /// Where `machine-id` and `os-release` live (`/etc`).
    pub etc_root: PathBuf,
}

impl Default for RealHost {
    fn default() -> Self {
        RealHost {
            proc_root: PathBuf::from("/proc"),
            sys_root: PathBuf::from("/sys"),
            etc_root: PathBuf::from("/etc"),
        }
    }
}

fn read(path: &Path) -> Result<String, HostError> {
    std::fs::read_to_string(path).map_err(|source| HostError::Read {
        path: path.to_path_buf(),
        source,
    })
}

fn parse_err(path: &Path, reason: impl Into<String>) -> HostError {
    HostError::Parse {
        path: path.to_path_buf(),
        reason: reason.into(),
    }
}

/// Counts CPUs in a sysfs cpu list (`0-3,8,10-11`).
pub fn count_cpu_list(text: &str) -> Option<u64> {
    let mut n = 0u64;
    for part in text.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let a: u64 = a.trim().parse().ok()?;
                let b: u64 = b.trim().parse().ok()?;
                if b < a {
                    return None;
                }
                n += b - a + 1;
            }
            None => {
                part.trim().parse::<u64>().ok()?;
                n += 1;
            }
        }
    }
    Some(n)
}

/// A `/proc/meminfo` field in bytes (the file says kB).
pub fn meminfo_field(text: &str, field: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let (name, rest) = line.split_once(':')?;
        if name.trim() != field {
            return None;
        }
        let mut it = rest.split_whitespace();
        let v: u64 = it.next()?.parse().ok()?;
        Some(match it.next() {
            Some("kB") => v * 1024,
            _ => v,
        })
    })
}

/// `PRETTY_NAME` of an os-release file.
pub fn os_release_pretty_name(text: &str) -> Option<String> {
    text.lines().find_map(|line| {
        let v = line.strip_prefix("PRETTY_NAME=")?;
        Some(v.trim().trim_matches('"').trim_matches('\'').to_string())
    })
}

impl RealHost {
    fn hugepages(&self) -> Vec<HugePages> {
        let dir = self.sys_root.join("kernel/mm/hugepages");
        let Ok(entries) = std::fs::read_dir(&dir) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let Some(size) = name
                .strip_prefix("hugepages-")
                .and_then(|s| s.strip_suffix("kB"))
                .and_then(|s| s.parse::<u64>().ok())
            else {
                continue;
            };
            let num_pages = std::fs::read_to_string(e.path().join("nr_hugepages"))
                .ok()
                .and_then(|t| t.trim().parse().ok())
                .unwrap_or(0);
            out.push(HugePages {
                page_size_kib: size,
                num_pages,
            });
        }
        out.sort_by_key(|h| h.page_size_kib);
        out
    }

    fn first_line(paths: &[PathBuf]) -> String {
        paths
            .iter()
            .find_map(|p| {
                std::fs::read_to_string(p)
                    .ok()
                    .map(|t| t.trim().to_string())
                    .filter(|t| !t.is_empty())
            })
            .unwrap_or_default()
    }
}

impl Host for RealHost {
    fn machine_info(&self) -> Result<MachineInfo, HostError> {
        let online = self.sys_root.join("devices/system/cpu/online");
        let num_cores = count_cpu_list(&read(&online)?)
            .filter(|n| *n > 0)
            .ok_or_else(|| parse_err(&online, "not a CPU list"))?;
        let meminfo_path = self.proc_root.join("meminfo");
        let meminfo = read(&meminfo_path)?;
        let memory_capacity = meminfo_field(&meminfo, "MemTotal")
            .ok_or_else(|| parse_err(&meminfo_path, "no MemTotal"))?;
        let swap_capacity = meminfo_field(&meminfo, "SwapTotal").unwrap_or(0);
        let boot_path = self.proc_root.join("sys/kernel/random/boot_id");
        let boot_id = read(&boot_path)?.trim().to_string();
        Ok(MachineInfo {
            num_cores,
            memory_capacity,
            hugepages: self.hugepages(),
            machine_id: Self::first_line(&[
                self.etc_root.join("machine-id"),
                PathBuf::from("/var/lib/dbus/machine-id"),
            ]),
            // cAdvisor's GetSystemUUID order (utils/sysfs/sysfs.go): DMI,
            // the PowerPC device tree, then `/etc/machine-id` (its s390x
            // path, which is what a machine without DMI ends up reporting).
            system_uuid: Self::first_line(&[
                self.sys_root.join("class/dmi/id/product_uuid"),
                self.proc_root.join("device-tree/system-id"),
                self.proc_root.join("device-tree/vm,uuid"),
                self.etc_root.join("machine-id"),
            ]),
            boot_id,
            swap_capacity,
        })
    }

    fn version_info(&self) -> Result<VersionInfo, HostError> {
        let release = self.proc_root.join("sys/kernel/osrelease");
        let kernel_version = read(&release)?.trim().to_string();
        let os_image = std::fs::read_to_string(self.etc_root.join("os-release"))
            .ok()
            .and_then(|t| os_release_pretty_name(&t))
            .unwrap_or_else(|| "Linux".to_string());
        Ok(VersionInfo {
            kernel_version,
            os_image,
        })
    }

    fn fs_stats(&self, path: &Path) -> Result<FsStats, HostError> {
        let s = nix::sys::statvfs::statvfs(path).map_err(|source| HostError::Sys {
            call: "statvfs",
            path: path.display().to_string(),
            source,
        })?;
        let frsize = s.fragment_size() as u64;
        Ok(FsStats {
            capacity: frsize.saturating_mul(s.blocks() as u64),
            available: frsize.saturating_mul(s.blocks_available() as u64),
            inodes: s.files() as u64,
            inodes_free: s.files_free() as u64,
        })
    }

    fn interface_addresses(&self) -> Result<Vec<IpAddr>, HostError> {
        let addrs = nix::ifaddrs::getifaddrs().map_err(|source| HostError::Sys {
            call: "getifaddrs",
            path: String::new(),
            source,
        })?;
        Ok(addrs
            .filter_map(|a| {
                let addr = a.address?;
                if let Some(v4) = addr.as_sockaddr_in() {
                    return Some(IpAddr::V4(v4.ip()));
                }
                addr.as_sockaddr_in6().map(|v6| IpAddr::V6(v6.ip()))
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists() {
        assert_eq!(count_cpu_list("0-1\n"), Some(2));
        assert_eq!(count_cpu_list("0-3,8,10-11"), Some(7));
        assert_eq!(count_cpu_list("0"), Some(1));
        assert_eq!(count_cpu_list("3-1"), None);
        assert_eq!(count_cpu_list("x"), None);
    }

    #[test]
    fn meminfo_in_bytes() {
        let t =
            "MemTotal:       24574176 kB\nMemFree: 1 kB\nSwapTotal:  0 kB\nHugePages_Total: 0\n";
        assert_eq!(meminfo_field(t, "MemTotal"), Some(24_574_176 * 1024));
        assert_eq!(meminfo_field(t, "SwapTotal"), Some(0));
        assert_eq!(meminfo_field(t, "HugePages_Total"), Some(0));
        assert_eq!(meminfo_field(t, "Nope"), None);
    }

    #[test]
    fn reads_a_fake_tree() {
        let root = tempfile::tempdir().expect("tempdir");
        let w = |rel: &str, text: &str| {
            let p = root.path().join(rel);
            std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
            std::fs::write(p, text).expect("write");
        };
        w("sys/devices/system/cpu/online", "0-3\n");
        w("proc/meminfo", "MemTotal: 2048 kB\nSwapTotal: 1024 kB\n");
        w("proc/sys/kernel/random/boot_id", "b00t\n");
        w("proc/sys/kernel/osrelease", "6.1.0-test\n");
        w("etc/machine-id", "m1\n");
        w(
            "etc/os-release",
            "NAME=x\nPRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\n",
        );
        w("sys/class/dmi/id/product_uuid", "U-U-I-D\n");
        w(
            "sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages",
            "4\n",
        );
        w(
            "sys/kernel/mm/hugepages/hugepages-1048576kB/nr_hugepages",
            "0\n",
        );
        let host = RealHost {
            proc_root: root.path().join("proc"),
            sys_root: root.path().join("sys"),
            etc_root: root.path().join("etc"),
        };
        let m = host.machine_info().expect("machine info");
        assert_eq!(
            m,
            MachineInfo {
                num_cores: 4,
                memory_capacity: 2048 * 1024,
                hugepages: vec![
                    HugePages {
                        page_size_kib: 2048,
                        num_pages: 4
                    },
                    HugePages {
                        page_size_kib: 1_048_576,
                        num_pages: 0
                    },
                ],
                machine_id: "m1".into(),
                system_uuid: "U-U-I-D".into(),
                boot_id: "b00t".into(),
                swap_capacity: 1024 * 1024,
            }
        );
        // No DMI (a VM without it): cAdvisor ends at /etc/machine-id.
        std::fs::remove_file(root.path().join("sys/class/dmi/id/product_uuid")).expect("rm");
        let m = host.machine_info().expect("machine info");
        assert_eq!(m.system_uuid, "m1");
        let v = host.version_info().expect("version info");
        assert_eq!(v.kernel_version, "6.1.0-test");
        assert_eq!(v.os_image, "Debian GNU/Linux 12 (bookworm)");
        let fs = host.fs_stats(root.path()).expect("statvfs");
        assert!(fs.capacity > 0 && fs.capacity >= fs.available, "{fs:?}");
    }

    #[test]
    fn missing_files_are_errors_naming_the_file() {
        let host = RealHost {
            proc_root: PathBuf::from("/nonexistent/proc"),
            sys_root: PathBuf::from("/nonexistent/sys"),
            etc_root: PathBuf::from("/nonexistent/etc"),
        };
        let e = host.machine_info().expect_err("must fail");
        assert!(
            e.to_string()
                .contains("/nonexistent/sys/devices/system/cpu/online"),
            "{e}"
        );
    }
}
