//! Wall-clock time for the pod lifecycle. Backoffs compare container
//! finish times (wall clock, from CRI) with "now", so "now" must be
//! replaceable in tests: [`TokioClock`] follows tokio's (pausable) time
//! from a fixed wall-clock origin, so a test with paused time can drive
//! CrashLoopBackOff and image pull backoff through minutes in milliseconds.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A source of wall-clock time.
pub trait Clock: Send + Sync + std::fmt::Debug {
    /// Now.
    fn now(&self) -> SystemTime;
}

/// The system's wall clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct WallClock;

impl Clock for WallClock {
    fn now(&self) -> SystemTime {
        SystemTime::now()
    }
}

/// Wall time = origin + time elapsed on tokio's clock since creation.
#[derive(Debug, Clone, Copy)]
pub struct TokioClock {
    origin: SystemTime,
    start: tokio::time::Instant,
}

impl TokioClock {
    /// Starts at the current wall time.
    pub fn new() -> Self {
        TokioClock {
            origin: SystemTime::now(),
            start: tokio::time::Instant::now(),
        }
    }

    /// The wall time this clock started at.
    pub fn origin(&self) -> SystemTime {
        self.origin
    }
}

impl Default for TokioClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for TokioClock {
    fn now(&self) -> SystemTime {
        self.origin + self.start.elapsed()
    }
}

/// A shared clock.
pub type SharedClock = Arc<dyn Clock>;

/// Nanoseconds since the epoch (CRI timestamps) as a `SystemTime`.
pub fn from_nanos(nanos: i64) -> SystemTime {
    if nanos <= 0 {
        return UNIX_EPOCH;
    }
    UNIX_EPOCH + Duration::from_nanos(nanos as u64)
}

/// A `SystemTime` as nanoseconds since the epoch.
pub fn to_nanos(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// A `SystemTime` as an API `Time` (RFC 3339, second precision as the API
/// serializes it).
pub fn to_api_time(t: SystemTime) -> k8s_openapi::apimachinery::pkg::apis::meta::v1::Time {
    let secs = t
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let ts = jiff::Timestamp::from_second(i64::try_from(secs).unwrap_or(0))
        .unwrap_or(jiff::Timestamp::UNIX_EPOCH);
    k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(ts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn tokio_clock_follows_paused_time() {
        let c = TokioClock::new();
        let t0 = c.now();
        tokio::time::advance(Duration::from_secs(300)).await;
        let d = c.now().duration_since(t0).expect("monotonic");
        assert_eq!(d.as_secs(), 300);
    }

    #[test]
    fn nanos_round_trip_and_api_time_truncates() {
        let t = from_nanos(1_700_000_000_123_456_789);
        assert_eq!(to_nanos(t), 1_700_000_000_123_456_789);
        assert_eq!(to_api_time(t).0.as_second(), 1_700_000_000);
        assert_eq!(to_api_time(t).0.subsec_nanosecond(), 0);
    }
}
