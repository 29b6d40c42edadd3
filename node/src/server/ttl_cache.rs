//! A small expiring map for the TokenReview and SubjectAccessReview
//! answers (apiserver's `cache.New` / the webhook authorizer's LRU with
//! separate TTLs). Bounded: beyond `capacity` entries the expired ones are
//! dropped, then the oldest.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Mutex;

use tokio::time::{Duration, Instant};

/// Entries kept at most (upstream's webhook caches hold 1024–4096).
pub const DEFAULT_CAPACITY: usize = 4096;

/// An expiring map.
#[derive(Debug)]
pub struct TtlCache<K, V> {
    entries: Mutex<HashMap<K, (V, Instant)>>,
    capacity: usize,
}

impl<K: Eq + Hash + Clone, V: Clone> TtlCache<K, V> {
    /// An empty cache.
    pub fn new(capacity: usize) -> Self {
        TtlCache {
            entries: Mutex::new(HashMap::new()),
            capacity: capacity.max(1),
        }
    }

    /// The value, if present and not expired.
    pub fn get(&self, k: &K) -> Option<V> {
        let mut m = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        match m.get(k) {
            Some((v, until)) if *until > Instant::now() => Some(v.clone()),
            Some(_) => {
                m.remove(k);
                None
            }
            None => None,
        }
    }

    /// Keeps `v` for `ttl` (a zero TTL keeps nothing).
    pub fn put(&self, k: K, v: V, ttl: Duration) {
        if ttl.is_zero() {
            return;
        }
        let now = Instant::now();
        let mut m = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        if m.len() >= self.capacity {
            m.retain(|_, (_, until)| *until > now);
            if m.len() >= self.capacity
                && let Some(oldest) = m
                    .iter()
                    .min_by_key(|(_, (_, u))| *u)
                    .map(|(k, _)| k.clone())
            {
                m.remove(&oldest);
            }
        }
        m.insert(k, (v, now + ttl));
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::panic)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn entries_expire_and_capacity_holds() {
        let c = TtlCache::new(2);
        c.put("a", 1, Duration::from_secs(10));
        c.put("b", 2, Duration::from_secs(20));
        c.put("z", 0, Duration::ZERO);
        assert_eq!(c.get(&"z"), None);
        tokio::time::advance(Duration::from_secs(11)).await;
        assert_eq!(c.get(&"a"), None);
        assert_eq!(c.get(&"b"), Some(2));
        c.put("c", 3, Duration::from_secs(5));
        c.put("d", 4, Duration::from_secs(5));
        // "c" expires first of the entries kept, so it went when "d" came.
        assert_eq!(c.get(&"d"), Some(4));
        assert_eq!(c.get(&"b"), Some(2));
        assert_eq!(c.get(&"c"), None);
    }
}
