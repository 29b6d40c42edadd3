//! The machine figures of `/metrics/cadvisor` (cAdvisor's machine
//! collector, `vendor/github.com/google/cadvisor/metrics/prometheus_machine.go`,
//! which kubelet registers next to the container collector in
//! `pkg/kubelet/server/server.go`): CPU topology counts from
//! `/proc/cpuinfo` as `vendor/github.com/google/cadvisor/machine/machine.go`
//! counts them, memory, swap and the machine's identity from the node
//! status's [`crate::status::Host`] reader.

use std::collections::BTreeSet;

use crate::status::host::MachineInfo;

/// What the machine collector reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Machine {
    /// Cores, memory, swap, machine ID, system UUID, boot ID.
    pub info: MachineInfo,
    /// Distinct `core id` values of `/proc/cpuinfo` (`GetPhysicalCores`).
    pub physical_cores: u64,
    /// Distinct `physical id` values (`GetSockets`).
    pub sockets: u64,
    /// Books and drawers: s390x only, 0 elsewhere (`GetBooks`,
    /// `GetDrawers`).
    pub books: u64,
    /// Drawers.
    pub drawers: u64,
    /// When read, ms since the epoch.
    pub timestamp_ms: i64,
}

/// Distinct values of `key` lines (`key\t: value`) of a `/proc/cpuinfo`
/// text (cAdvisor's `getUniqueMatchesCount`).
pub fn distinct(cpuinfo: &str, key: &str) -> u64 {
    cpuinfo
        .lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(':')?;
            (k.trim() == key).then(|| v.trim().to_string())
        })
        .collect::<BTreeSet<_>>()
        .len() as u64
}

impl Machine {
    /// From `info` and the `/proc/cpuinfo` text.
    pub fn new(info: MachineInfo, cpuinfo: &str) -> Machine {
        let s390x = cfg!(target_arch = "s390x");
        Machine {
            info,
            physical_cores: distinct(cpuinfo, "core id"),
            sockets: distinct(cpuinfo, "physical id"),
            books: if s390x {
                distinct(cpuinfo, "book id")
            } else {
                0
            },
            drawers: if s390x {
                distinct(cpuinfo, "drawer id")
            } else {
                0
            },
            timestamp_ms: jiff::Timestamp::now().as_millisecond(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_distinct_cores_and_sockets() {
        let cpuinfo = "processor\t: 0\nphysical id\t: 0\ncore id\t\t: 0\n\nprocessor\t: 1\nphysical id\t: 0\ncore id\t\t: 1\n\nprocessor\t: 2\nphysical id\t: 0\ncore id\t\t: 0\n";
        assert_eq!(distinct(cpuinfo, "core id"), 2);
        assert_eq!(distinct(cpuinfo, "physical id"), 1);
        assert_eq!(distinct(cpuinfo, "book id"), 0);
    }
}
