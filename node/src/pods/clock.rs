//! Wall-clock time for the pod lifecycle: the shared [`Clock`] (backoffs
//! compare container finish times from CRI with "now") and the
//! conversions between CRI timestamps, `SystemTime` and API times.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub use keelson_common::clock::{Clock, SharedClock, TokioClock, WallClock};

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

    #[test]
    fn nanos_round_trip_and_api_time_truncates() {
        let t = from_nanos(1_700_000_000_123_456_789);
        assert_eq!(to_nanos(t), 1_700_000_000_123_456_789);
        assert_eq!(to_api_time(t).0.as_second(), 1_700_000_000);
        assert_eq!(to_api_time(t).0.subsec_nanosecond(), 0);
    }
}
