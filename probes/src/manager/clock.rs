//! The manager's clock. Scheduling uses tokio's `Instant` (so tests can pause
//! time); container start times come from the runtime as wall-clock times,
//! read against `keelson_common::clock::TokioClock` (wall time at creation +
//! tokio time since: it follows tokio's paused clock in tests and ignores
//! wall-clock steps).

use std::time::{Duration, SystemTime};

use keelson_common::clock::TokioClock;
use tokio::time::Instant;

/// Converts between wall-clock and tokio instants.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Clock(TokioClock);

impl Clock {
    pub(crate) fn new() -> Clock {
        Clock(TokioClock::new())
    }

    /// Wall-clock now.
    pub(crate) fn wall_now(&self) -> SystemTime {
        keelson_common::clock::Clock::now(&self.0)
    }

    /// The instant `delay` after wall time `since` (now, if that is past).
    pub(crate) fn instant_after(&self, since: SystemTime, delay: Duration) -> Instant {
        let elapsed = self
            .wall_now()
            .duration_since(since)
            .unwrap_or(Duration::ZERO);
        Instant::now() + delay.saturating_sub(elapsed)
    }
}
