//! A token bucket (`golang.org/x/time/rate`, as kubelet's pod-resources
//! `LimiterUnaryServerInterceptor` uses it).

use std::sync::{Mutex, PoisonError};
use std::time::Instant;

/// `DefaultQPS`.
pub(crate) const QPS: f64 = 100.0;
/// `DefaultBurstTokens`.
pub(crate) const BURST: f64 = 10.0;

/// Tokens refilled at `qps`, at most `burst`.
#[derive(Debug)]
pub(crate) struct Limiter {
    qps: f64,
    burst: f64,
    state: Mutex<(f64, Instant)>,
}

impl Limiter {
    /// A full bucket.
    pub(crate) fn new(qps: f64, burst: f64) -> Self {
        Limiter {
            qps,
            burst,
            state: Mutex::new((burst, Instant::now())),
        }
    }

    /// `Allow`: takes a token if there is one.
    pub(crate) fn allow(&self) -> bool {
        let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let now = Instant::now();
        let elapsed = now.saturating_duration_since(s.1).as_secs_f64();
        s.0 = (s.0 + elapsed * self.qps).min(self.burst);
        s.1 = now;
        if s.0 >= 1.0 {
            s.0 -= 1.0;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allows_the_burst_then_refuses() {
        let l = Limiter::new(0.001, 3.0);
        assert!(l.allow() && l.allow() && l.allow());
        assert!(!l.allow());
    }
}
