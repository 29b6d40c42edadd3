//! Wall-clock time, replaceable in tests. Backoffs, token ages and probe
//! delays compare wall times that come from outside (CRI finish times, a
//! token's `exp`) with "now", so "now" comes from a [`Clock`]:
//! [`WallClock`] in production, [`TokioClock`] (wall time that follows
//! tokio's pausable clock) in tests, so a test with paused time drives
//! minutes of backoff in milliseconds.

use std::sync::Arc;
use std::time::SystemTime;

/// A source of wall-clock time.
pub trait Clock: Send + Sync + std::fmt::Debug {
    /// Now.
    fn now(&self) -> SystemTime;

    /// Now as a [`jiff::Timestamp`] (the latest one for a time jiff cannot
    /// hold).
    fn now_timestamp(&self) -> jiff::Timestamp {
        jiff::Timestamp::try_from(self.now()).unwrap_or(jiff::Timestamp::MAX)
    }
}

/// A shared clock.
pub type SharedClock = Arc<dyn Clock>;

/// The system's wall clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct WallClock;

impl Clock for WallClock {
    fn now(&self) -> SystemTime {
        SystemTime::now()
    }
}

/// Wall time = the wall time at creation + the time elapsed on tokio's
/// clock since: it follows `tokio::time::pause`/`advance` in tests and
/// ignores steps of the system clock.
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn tokio_clock_follows_paused_time() {
        let c = TokioClock::new();
        let t0 = c.now();
        tokio::time::advance(Duration::from_secs(300)).await;
        let d = c.now().duration_since(t0).expect("monotonic");
        assert_eq!(d.as_secs(), 300);
        assert_eq!(
            c.now_timestamp().as_second() - jiff::Timestamp::try_from(t0).expect("t0").as_second(),
            300
        );
    }
}
