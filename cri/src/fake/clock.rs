//! The fake runtime's clock: wall time by default, or frozen and stepped by
//! the test, so timestamps (created/started/finished) are predictable.

use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::lock;

#[derive(Debug, Clone, Copy)]
enum Mode {
    /// Wall time plus an offset (nanoseconds).
    Real { offset: i64 },
    /// A fixed instant (nanoseconds since the epoch).
    Frozen { now: i64 },
}

/// A controllable clock in nanoseconds since the Unix epoch (the unit of
/// every CRI timestamp).
#[derive(Debug)]
pub struct FakeClock {
    mode: Mutex<Mode>,
}

impl Default for FakeClock {
    fn default() -> Self {
        FakeClock {
            mode: Mutex::new(Mode::Real { offset: 0 }),
        }
    }
}

fn wall_nanos() -> i64 {
    let d = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO);
    i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)
}

fn nanos(d: Duration) -> i64 {
    i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)
}

impl FakeClock {
    /// The current time in nanoseconds since the epoch.
    pub fn now_nanos(&self) -> i64 {
        match *lock(&self.mode) {
            Mode::Real { offset } => wall_nanos().saturating_add(offset),
            Mode::Frozen { now } => now,
        }
    }

    /// Freezes the clock at `nanos` since the epoch.
    pub fn set(&self, nanos_since_epoch: i64) {
        *lock(&self.mode) = Mode::Frozen {
            now: nanos_since_epoch,
        };
    }

    /// Freezes the clock where it is now.
    pub fn freeze(&self) {
        let now = self.now_nanos();
        self.set(now);
    }

    /// Moves the clock forward by `d` (frozen or not).
    pub fn advance(&self, d: Duration) {
        let mut mode = lock(&self.mode);
        *mode = match *mode {
            Mode::Real { offset } => Mode::Real {
                offset: offset.saturating_add(nanos(d)),
            },
            Mode::Frozen { now } => Mode::Frozen {
                now: now.saturating_add(nanos(d)),
            },
        };
    }

    /// Lets the clock run with wall time again, from where it stands.
    pub fn resume(&self) {
        let now = self.now_nanos();
        *lock(&self.mode) = Mode::Real {
            offset: now - wall_nanos(),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frozen_clock_moves_only_when_advanced() {
        let c = FakeClock::default();
        c.set(1_000);
        assert_eq!(c.now_nanos(), 1_000);
        c.advance(Duration::from_nanos(500));
        assert_eq!(c.now_nanos(), 1_500);
        c.resume();
        let later = c.now_nanos();
        assert!((1_500..1_500 + 1_000_000_000).contains(&later), "{later}");
    }

    #[test]
    fn real_clock_follows_wall_time_with_offset() {
        let c = FakeClock::default();
        c.advance(Duration::from_secs(3600));
        let diff = c.now_nanos() - wall_nanos();
        assert!(diff > 3_599_000_000_000, "{diff}");
    }
}
