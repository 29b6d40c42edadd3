//! The unit properties kubelet's systemd cgroup manager sends, through
//! libcontainer (`opencontainers/cgroups/systemd`: `v1.go`
//! `genV1ResourcesProperties`, `v2.go` `genV2ResourcesProperties`,
//! `common.go` `addCPUQuota`, the `Apply` of both managers):
//!
//! - when a slice is created: `Description`, `Wants=<parent slice>`,
//!   accounting on (`MemoryAccounting`, `CPUAccounting`,
//!   `BlockIOAccounting` on v1 / `IOAccounting` on v2, `TasksAccounting`),
//!   `DefaultDependencies=no`. No `Delegate`: systemd refuses it on slices
//!   ("Delegation not available for unit type"); the container runtime
//!   sets it on the scopes of containers it creates inside a pod's slice;
//! - resources: v1 `MemoryLimit`, `CPUShares`; v2 `MemoryMax`,
//!   `CPUWeight` (shares mapped onto 1..10000); both `CPUQuotaPerSecUSec`
//!   (rounded up to whole percents, the quota written to the cgroup
//!   follows the rounding), `CPUQuotaPeriodUSec` (systemd ≥ 242) and
//!   `TasksMax`.

use super::super::fs::ResourceConfig;
use super::super::shares::{QUOTA_PERIOD, shares_to_weight};

/// A property value, in the D-Bus types systemd expects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PropValue {
    /// `b`
    Bool(bool),
    /// `t`
    U64(u64),
    /// `s`
    Str(String),
    /// `as`
    Strs(Vec<String>),
    /// `au`
    U32s(Vec<u32>),
}

/// A unit property: name and value.
pub type Property = (String, PropValue);

/// systemd's "infinity" (`USEC_INFINITY`, `CGROUP_LIMIT_MAX`).
pub const INFINITY: u64 = u64::MAX;
/// The first systemd with `CPUQuotaPeriodUSec`.
pub const CPU_QUOTA_PERIOD_SINCE: i64 = 242;

fn prop(name: &str, v: PropValue) -> Property {
    (name.to_string(), v)
}

/// Properties of a new slice `unit` below `parent` (v2 when `unified`).
pub fn slice_start_properties(unit: &str, parent: &str, unified: bool) -> Vec<Property> {
    vec![
        prop(
            "Description",
            PropValue::Str(format!("libcontainer container {unit}")),
        ),
        prop("Wants", PropValue::Strs(vec![parent.to_string()])),
        prop("MemoryAccounting", PropValue::Bool(true)),
        prop("CPUAccounting", PropValue::Bool(true)),
        prop(
            if unified {
                "IOAccounting"
            } else {
                "BlockIOAccounting"
            },
            PropValue::Bool(true),
        ),
        prop("TasksAccounting", PropValue::Bool(true)),
        prop("DefaultDependencies", PropValue::Bool(false)),
    ]
}

/// The resource properties for `r`, and `r` with the CPU quota as systemd
/// will apply it (rounded up to a whole percent of a CPU), to be written
/// to the cgroup files too. `systemd_version` is -1 when unknown.
pub fn resource_properties(
    r: &ResourceConfig,
    unified: bool,
    systemd_version: i64,
) -> (Vec<Property>, ResourceConfig) {
    let mut out = Vec::new();
    let mut applied = *r;
    if let Some(m) = r.memory.filter(|m| *m != 0) {
        // Negative (no limit) becomes systemd's infinity, as Go's uint64().
        let v = u64::try_from(m).unwrap_or(INFINITY);
        out.push(prop(
            if unified { "MemoryMax" } else { "MemoryLimit" },
            PropValue::U64(v),
        ));
    }
    if let Some(s) = r.cpu_shares.filter(|s| *s != 0) {
        if unified {
            out.push(prop("CPUWeight", PropValue::U64(shares_to_weight(s))));
        } else {
            out.push(prop("CPUShares", PropValue::U64(s)));
        }
    }
    let period = r.cpu_period.unwrap_or(0);
    let mut quota = r.cpu_quota.unwrap_or(0);
    if period != 0 {
        if systemd_version >= CPU_QUOTA_PERIOD_SINCE {
            out.push(prop("CPUQuotaPeriodUSec", PropValue::U64(period)));
        } else {
            tracing::debug!(
                systemd_version,
                "systemd too old for CPUQuotaPeriodUSec; the period is written to the cgroup only"
            );
        }
    }
    if quota != 0 || period != 0 {
        let mut per_sec = INFINITY;
        if quota > 0 {
            let p = if period == 0 { QUOTA_PERIOD } else { period };
            let q = u64::try_from(quota).unwrap_or(0);
            per_sec = q.saturating_mul(1_000_000) / p;
            if !per_sec.is_multiple_of(10_000) {
                per_sec = (per_sec / 10_000 + 1) * 10_000;
                quota = i64::try_from(per_sec.saturating_mul(p) / 1_000_000).unwrap_or(i64::MAX);
                applied.cpu_quota = Some(quota);
            }
        }
        out.push(prop("CPUQuotaPerSecUSec", PropValue::U64(per_sec)));
    }
    if let Some(limit) = r.pids_limit {
        let v = match limit {
            l if l < 0 => INFINITY,
            // systemd refuses TasksMax=0.
            0 => 1,
            l => l as u64,
        };
        out.push(prop("TasksMax", PropValue::U64(v)));
    }
    (out, applied)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn get<'a>(props: &'a [Property], name: &str) -> Option<&'a PropValue> {
        props.iter().find(|(n, _)| n == name).map(|(_, v)| v)
    }

    #[test]
    fn v1_properties() {
        let r = ResourceConfig {
            cpu_shares: Some(512),
            cpu_quota: Some(50_000),
            cpu_period: Some(100_000),
            memory: Some(64 << 20),
            pids_limit: Some(0),
        };
        let (p, applied) = resource_properties(&r, false, 252);
        assert_eq!(get(&p, "CPUShares"), Some(&PropValue::U64(512)));
        assert_eq!(get(&p, "MemoryLimit"), Some(&PropValue::U64(64 << 20)));
        assert_eq!(
            get(&p, "CPUQuotaPeriodUSec"),
            Some(&PropValue::U64(100_000))
        );
        assert_eq!(
            get(&p, "CPUQuotaPerSecUSec"),
            Some(&PropValue::U64(500_000))
        );
        assert_eq!(get(&p, "TasksMax"), Some(&PropValue::U64(1)));
        assert_eq!(get(&p, "CPUWeight"), None);
        assert_eq!(applied, r);
    }

    #[test]
    fn v2_properties_and_quota_rounding() {
        let r = ResourceConfig {
            cpu_shares: Some(1024),
            // 25m CPU: 2500 µs per 100 ms = 25 ms per second, rounded up to 30.
            cpu_quota: Some(2500),
            cpu_period: Some(100_000),
            memory: Some(-1),
            pids_limit: Some(-1),
        };
        let (p, applied) = resource_properties(&r, true, 241);
        assert_eq!(get(&p, "CPUWeight"), Some(&PropValue::U64(39)));
        assert_eq!(get(&p, "MemoryMax"), Some(&PropValue::U64(INFINITY)));
        assert_eq!(get(&p, "CPUQuotaPeriodUSec"), None, "systemd < 242");
        assert_eq!(get(&p, "CPUQuotaPerSecUSec"), Some(&PropValue::U64(30_000)));
        assert_eq!(get(&p, "TasksMax"), Some(&PropValue::U64(INFINITY)));
        assert_eq!(applied.cpu_quota, Some(3000));
    }

    #[test]
    fn no_limit_is_infinity_and_unset_is_absent() {
        let r = ResourceConfig {
            cpu_shares: Some(2),
            cpu_quota: Some(-1),
            cpu_period: Some(100_000),
            ..Default::default()
        };
        let (p, _) = resource_properties(&r, false, 252);
        assert_eq!(
            get(&p, "CPUQuotaPerSecUSec"),
            Some(&PropValue::U64(INFINITY))
        );
        assert_eq!(get(&p, "MemoryLimit"), None);
        assert_eq!(get(&p, "TasksMax"), None);
        let (p, _) = resource_properties(&ResourceConfig::default(), false, 252);
        assert!(p.is_empty());
    }

    #[test]
    fn start_properties_have_no_delegate() {
        let p = slice_start_properties("kubepods.slice", "-.slice", false);
        assert_eq!(
            get(&p, "Wants"),
            Some(&PropValue::Strs(vec!["-.slice".into()]))
        );
        assert_eq!(get(&p, "BlockIOAccounting"), Some(&PropValue::Bool(true)));
        assert_eq!(
            get(&p, "DefaultDependencies"),
            Some(&PropValue::Bool(false))
        );
        assert_eq!(get(&p, "Delegate"), None);
        let p = slice_start_properties("kubepods.slice", "-.slice", true);
        assert_eq!(get(&p, "IOAccounting"), Some(&PropValue::Bool(true)));
    }
}
