//! CPU request/limit conversions, with kubelet's constants and bounds.

/// Smallest `cpu.shares` the kernel accepts (kubelet `MinShares`).
pub const MIN_SHARES: u64 = 2;
/// Largest `cpu.shares` (kubelet `MaxShares`).
pub const MAX_SHARES: u64 = 262_144;
/// Shares of one CPU.
pub const SHARES_PER_CPU: u64 = 1024;
/// Millicores of one CPU.
pub const MILLI_CPU_TO_CPU: u64 = 1000;
/// Smallest CFS quota in microseconds (kubelet `MinQuotaPeriod`).
pub const MIN_QUOTA_PERIOD: i64 = 1000;
/// Default CFS period in microseconds (kubelet `QuotaPeriod`).
pub const QUOTA_PERIOD: u64 = 100_000;

/// `cpu.shares` for a CPU request in millicores (kubelet `MilliCPUToShares`).
pub fn milli_cpu_to_shares(milli_cpu: i64) -> u64 {
    if milli_cpu <= 0 {
        return MIN_SHARES;
    }
    let shares = (milli_cpu as u64).saturating_mul(SHARES_PER_CPU) / MILLI_CPU_TO_CPU;
    shares.clamp(MIN_SHARES, MAX_SHARES)
}

/// CFS quota in microseconds for a CPU limit in millicores over `period`
/// (kubelet `MilliCPUToQuota`); 0 means no limit.
pub fn milli_cpu_to_quota(milli_cpu: i64, period: i64) -> i64 {
    if milli_cpu <= 0 {
        return 0;
    }
    let quota = milli_cpu.saturating_mul(period) / MILLI_CPU_TO_CPU as i64;
    quota.max(MIN_QUOTA_PERIOD)
}

/// cgroup v2 `cpu.weight` for v1 shares (the OCI runtimes' conversion:
/// 2..262144 mapped linearly onto 1..10000).
pub fn shares_to_weight(shares: u64) -> u64 {
    if shares == 0 {
        return 0;
    }
    let s = shares.clamp(MIN_SHARES, MAX_SHARES);
    1 + ((s - 2) * 9999) / 262_142
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_follow_kubelet() {
        assert_eq!(milli_cpu_to_shares(0), 2);
        assert_eq!(milli_cpu_to_shares(1), 2);
        assert_eq!(milli_cpu_to_shares(100), 102);
        assert_eq!(milli_cpu_to_shares(1000), 1024);
        assert_eq!(milli_cpu_to_shares(500), 512);
        assert_eq!(milli_cpu_to_shares(1_000_000), MAX_SHARES);
    }

    #[test]
    fn quota_follows_kubelet() {
        assert_eq!(milli_cpu_to_quota(0, 100_000), 0);
        assert_eq!(milli_cpu_to_quota(1, 100_000), 1000);
        assert_eq!(milli_cpu_to_quota(250, 100_000), 25_000);
        assert_eq!(milli_cpu_to_quota(2000, 100_000), 200_000);
    }

    #[test]
    fn weights_span_the_v2_range() {
        assert_eq!(shares_to_weight(2), 1);
        assert_eq!(shares_to_weight(1024), 39);
        assert_eq!(shares_to_weight(262_144), 10_000);
    }
}
