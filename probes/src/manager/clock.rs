//! The manager's clock. Scheduling uses tokio's `Instant` (so tests can pause
//! time); container start times come from the runtime as wall-clock times.
//! The wall clock is read as "wall time at creation + monotonic time since",
//! which follows tokio's paused clock in tests and ignores wall-clock steps.

use std::time::{Duration, SystemTime};

use tokio::time::Instant;

/// Converts between wall-clock and tokio instants.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Clock {
    wall_at_anchor: SystemTime,
    anchor: Instant,
}

impl Clock {
    pub(crate) fn new() -> Clock {
        Clock {
            wall_at_anchor: SystemTime::now(),
            anchor: Instant::now(),
        }
    }

    /// Wall-clock now.
    pub(crate) fn wall_now(&self) -> SystemTime {
        self.wall_at_anchor + self.anchor.elapsed()
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
