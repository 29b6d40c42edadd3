//! Client-side request rate limiting (client-go's token bucket `QPS`/`Burst`).
//! A request waits for a token before it is sent; long-running watches take
//! one token when they start, as upstream.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::{Instant, Sleep};
use tower::{Layer, Service};

/// A token bucket shared by every clone of a client.
#[derive(Debug, Clone)]
pub struct TokenBucket {
    inner: Option<Arc<Mutex<BucketState>>>,
}

#[derive(Debug)]
struct BucketState {
    qps: f64,
    burst: f64,
    tokens: f64,
    last: Instant,
}

impl TokenBucket {
    /// A bucket refilled at `qps` tokens per second holding at most `burst`
    /// (at least 1). `qps <= 0` means unlimited.
    pub fn new(qps: f32, burst: u32) -> Self {
        if qps <= 0.0 {
            return TokenBucket { inner: None };
        }
        let burst = f64::from(burst.max(1));
        TokenBucket {
            inner: Some(Arc::new(Mutex::new(BucketState {
                qps: f64::from(qps),
                burst,
                tokens: burst,
                last: Instant::now(),
            }))),
        }
    }

    /// Takes a token now, or says how long to wait for the next one.
    pub fn try_take(&self) -> Result<(), Duration> {
        let Some(inner) = &self.inner else {
            return Ok(());
        };
        let Ok(mut s) = inner.lock() else {
            return Ok(()); // a poisoned limiter must not block the node
        };
        let now = Instant::now();
        let elapsed = now.saturating_duration_since(s.last).as_secs_f64();
        s.last = now;
        s.tokens = (s.tokens + elapsed * s.qps).min(s.burst);
        if s.tokens >= 1.0 {
            s.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - s.tokens) / s.qps))
        }
    }
}

/// Tower layer applying a [`TokenBucket`].
#[derive(Debug, Clone)]
pub struct RateLimitLayer {
    bucket: TokenBucket,
}

impl RateLimitLayer {
    /// Wraps a bucket.
    pub fn new(bucket: TokenBucket) -> Self {
        RateLimitLayer { bucket }
    }
}

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimited<S>;
    fn layer(&self, inner: S) -> Self::Service {
        RateLimited {
            inner,
            bucket: self.bucket.clone(),
            wait: None,
            has_token: false,
        }
    }
}

/// The rate-limited service.
pub struct RateLimited<S> {
    inner: S,
    bucket: TokenBucket,
    wait: Option<Pin<Box<Sleep>>>,
    has_token: bool,
}

impl<S, Req> Service<Req> for RateLimited<S>
where
    S: Service<Req>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        while !self.has_token {
            if let Some(w) = self.wait.as_mut() {
                if w.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                self.wait = None;
            }
            match self.bucket.try_take() {
                Ok(()) => self.has_token = true,
                Err(d) => self.wait = Some(Box::pin(tokio::time::sleep(d))),
            }
        }
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        self.has_token = false;
        self.inner.call(req)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn bucket_allows_burst_then_rate() {
        let b = TokenBucket::new(2.0, 3);
        for _ in 0..3 {
            assert!(b.try_take().is_ok());
        }
        let wait = b.try_take().expect_err("bucket empty");
        assert!(
            wait <= Duration::from_millis(500) && wait > Duration::from_millis(400),
            "{wait:?}"
        );
        tokio::time::advance(Duration::from_millis(500)).await;
        assert!(b.try_take().is_ok());
    }

    #[test]
    fn zero_qps_is_unlimited() {
        let b = TokenBucket::new(0.0, 0);
        for _ in 0..10_000 {
            assert!(b.try_take().is_ok());
        }
    }
}
