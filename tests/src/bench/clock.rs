//! One clock for the benchmark process and its probe agents: the kernel's
//! `CLOCK_MONOTONIC`, read as nanoseconds. Unlike `std::time::Instant` its
//! readings can cross a process boundary, so "the API write happened at t0
//! (benchmark)" and "the first connection landed at t1 (agent)" compare.

use std::time::Duration;

use nix::time::{ClockId, clock_gettime};

/// Now, in nanoseconds of `CLOCK_MONOTONIC` (0 if the clock cannot be read,
/// which Linux never does for this clock).
pub fn mono_ns() -> u64 {
    clock_gettime(ClockId::CLOCK_MONOTONIC)
        .map(|t| {
            (t.tv_sec() as u64)
                .saturating_mul(1_000_000_000)
                .saturating_add(t.tv_nsec() as u64)
        })
        .unwrap_or(0)
}

/// `later - earlier` as a duration (zero if `later` is earlier).
pub fn since(earlier_ns: u64, later_ns: u64) -> Duration {
    Duration::from_nanos(later_ns.saturating_sub(earlier_ns))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn monotonic_and_comparable() {
        let a = mono_ns();
        std::thread::sleep(Duration::from_millis(2));
        let b = mono_ns();
        assert!(b > a);
        assert!(since(a, b) >= Duration::from_millis(2));
        assert_eq!(since(b, a), Duration::ZERO);
    }
}
