//! client-go's `flowcontrol.Backoff` as kubelet uses it for CrashLoopBackOff
//! and image pulls: per-key delays starting at 10 s, doubling up to 5 min,
//! forgotten once the key has been quiet for twice the maximum (so a
//! container that ran fine for 10 minutes starts over at 10 s).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use super::clock::SharedClock;

/// kubelet's `backOffPeriod`: the first delay.
pub const INITIAL: Duration = Duration::from_secs(10);
/// kubelet's `MaxContainerBackOff`: the longest delay.
pub const MAX: Duration = Duration::from_secs(300);

#[derive(Debug, Clone, Copy)]
struct Entry {
    backoff: Duration,
    last_update: SystemTime,
}

/// Per-key exponential backoff.
#[derive(Debug)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    clock: SharedClock,
    entries: Mutex<HashMap<String, Entry>>,
}

fn since(later: SystemTime, earlier: SystemTime) -> Duration {
    later.duration_since(earlier).unwrap_or(Duration::ZERO)
}

impl Backoff {
    /// A backoff from `initial` doubling to `max`.
    pub fn new(initial: Duration, max: Duration, clock: SharedClock) -> Self {
        Backoff {
            initial,
            max,
            clock,
            entries: Mutex::new(HashMap::new()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        self.entries
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// `hasExpired`: the key was last updated more than 2×max before `event`.
    fn expired(&self, event: SystemTime, last_update: SystemTime) -> bool {
        since(event, last_update) > self.max * 2
    }

    /// The clock's now.
    pub fn now(&self) -> SystemTime {
        self.clock.now()
    }

    /// The current delay of `key` (zero when unknown).
    pub fn get(&self, key: &str) -> Duration {
        self.lock()
            .get(key)
            .map(|e| e.backoff)
            .unwrap_or(Duration::ZERO)
    }

    /// `Next`: starts the key at the initial delay (also when it expired
    /// relative to `event`), else doubles it up to the maximum.
    pub fn next(&self, key: &str, event: SystemTime) {
        let now = self.clock.now();
        let mut entries = self.lock();
        let backoff = match entries.get(key) {
            Some(e) if !self.expired(event, e.last_update) => (e.backoff * 2).min(self.max),
            _ => self.initial,
        };
        entries.insert(
            key.to_string(),
            Entry {
                backoff,
                last_update: now,
            },
        );
    }

    /// `IsInBackOffSince`: less than the current delay has passed since
    /// `event` (e.g. the container's finish time).
    pub fn is_in_backoff_since(&self, key: &str, event: SystemTime) -> bool {
        let entries = self.lock();
        let Some(e) = entries.get(key) else {
            return false;
        };
        if self.expired(event, e.last_update) {
            return false;
        }
        since(self.clock.now(), event) < e.backoff
    }

    /// When the backoff of `key` relative to `event` ends (if it is active).
    pub fn expires_at(&self, key: &str, event: SystemTime) -> Option<SystemTime> {
        let entries = self.lock();
        let e = entries.get(key)?;
        if self.expired(event, e.last_update) {
            return None;
        }
        Some(event + e.backoff)
    }

    /// `IsInBackOffSinceUpdate`: less than the current delay has passed
    /// since the key was last updated (image pulls).
    pub fn is_in_backoff_since_update(&self, key: &str, event: SystemTime) -> bool {
        let entries = self.lock();
        let Some(e) = entries.get(key) else {
            return false;
        };
        if self.expired(event, e.last_update) {
            return false;
        }
        since(event, e.last_update) < e.backoff
    }

    /// When the since-update backoff of `key` ends.
    pub fn update_expires_at(&self, key: &str) -> Option<SystemTime> {
        self.lock().get(key).map(|e| e.last_update + e.backoff)
    }

    /// Forgets `key`.
    pub fn reset(&self, key: &str) {
        self.lock().remove(key);
    }

    /// `GC`: forgets keys not updated for 2×max.
    pub fn gc(&self) {
        let now = self.clock.now();
        let max2 = self.max * 2;
        self.lock().retain(|_, e| since(now, e.last_update) <= max2);
    }

    /// Number of keys held.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// True when no key is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::super::clock::Clock;
    use super::*;
    use std::sync::Arc;

    #[derive(Debug)]
    struct Manual(Mutex<SystemTime>);
    impl Clock for Manual {
        fn now(&self) -> SystemTime {
            *self.0.lock().expect("lock")
        }
    }
    impl Manual {
        fn advance(&self, d: Duration) {
            let mut t = self.0.lock().expect("lock");
            *t += d;
        }
    }

    #[test]
    fn crash_loop_delays_double_to_five_minutes() {
        let clock = Arc::new(Manual(Mutex::new(
            SystemTime::UNIX_EPOCH + Duration::from_secs(1000),
        )));
        let b = Backoff::new(INITIAL, MAX, clock.clone());
        let mut delays = Vec::new();
        for _ in 0..7 {
            // The container just exited; the sync checks, then restarts.
            let finished = clock.now();
            if b.is_in_backoff_since("k", finished) {
                clock.advance(b.get("k"));
                assert!(!b.is_in_backoff_since("k", finished));
            }
            b.next("k", finished);
            delays.push(b.get("k").as_secs());
        }
        assert_eq!(delays, vec![10, 20, 40, 80, 160, 300, 300]);
    }

    #[test]
    fn ten_quiet_minutes_reset_the_delay() {
        let clock = Arc::new(Manual(Mutex::new(
            SystemTime::UNIX_EPOCH + Duration::from_secs(1000),
        )));
        let b = Backoff::new(INITIAL, MAX, clock.clone());
        b.next("k", clock.now());
        b.next("k", clock.now());
        assert_eq!(b.get("k"), Duration::from_secs(20));
        clock.advance(Duration::from_secs(601));
        let finished = clock.now();
        assert!(!b.is_in_backoff_since("k", finished));
        b.next("k", finished);
        assert_eq!(b.get("k"), INITIAL);
    }

    #[test]
    fn since_update_and_gc() {
        let clock = Arc::new(Manual(Mutex::new(
            SystemTime::UNIX_EPOCH + Duration::from_secs(1000),
        )));
        let b = Backoff::new(INITIAL, MAX, clock.clone());
        b.next("img", clock.now());
        assert!(b.is_in_backoff_since_update("img", clock.now()));
        clock.advance(Duration::from_secs(10));
        assert!(!b.is_in_backoff_since_update("img", clock.now()));
        clock.advance(Duration::from_secs(600));
        b.gc();
        assert!(b.is_empty());
    }
}
