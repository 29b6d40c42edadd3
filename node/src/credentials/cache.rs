//! The response cache of one credential provider (kubelet's
//! `cache.NewExpirationStore` in `pkg/credentialprovider/plugin/plugin.go`):
//! entries keyed by the image, its registry (`host[:port]`) or
//! `<global>` as the plugin's `cacheKeyType` says, each joined with the
//! service account part of the key in token mode; an entry is gone once
//! its expiry has passed, and expired entries are purged every 15 minutes.

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

use super::docker_keyring::DockerConfig;

/// The key of credentials that hold for every image (`globalCacheKey`).
pub const GLOBAL_KEY: &str = "<global>";
/// How often expired entries are dropped (`cachePurgeInterval`).
pub const PURGE_INTERVAL: Duration = Duration::from_secs(15 * 60);

/// A length-prefixed concatenation (kubelet's cryptobyte builder), so that
/// no two different tuples give one key.
#[derive(Debug, Default)]
pub struct KeyBuilder(String);

impl KeyBuilder {
    /// Adds a string.
    pub fn push(mut self, s: &str) -> Self {
        self.0.push_str(&format!("{}:{s}", s.len()));
        self
    }

    /// Adds annotations, sorted by key.
    pub fn add_map(mut self, m: &std::collections::BTreeMap<String, String>) -> Self {
        self.0.push_str(&format!("{}#", m.len()));
        for (k, v) in m {
            self = self.push(k).push(v);
        }
        self
    }

    /// The key.
    pub fn build(self) -> String {
        self.0
    }
}

/// `generateCacheKey`: the base key (image, registry or global) and the
/// service account part (empty outside token mode).
pub fn cache_key(base: &str, service_account_key: &str) -> String {
    KeyBuilder::default()
        .push(base)
        .push(service_account_key)
        .build()
}

/// `parseRegistry`: what comes before the image's first `/`.
pub fn registry_of(image: &str) -> &str {
    image.split('/').next().unwrap_or_default()
}

#[derive(Debug)]
struct Entry {
    config: DockerConfig,
    expires_at: Instant,
}

/// One provider's cache.
#[derive(Debug)]
pub struct ResponseCache {
    entries: HashMap<String, Entry>,
    last_purge: Instant,
}

impl Default for ResponseCache {
    fn default() -> Self {
        ResponseCache {
            entries: HashMap::new(),
            last_purge: Instant::now(),
        }
    }
}

impl ResponseCache {
    /// `getCachedCredentials`: the entry for the image, else its registry,
    /// else the global one.
    pub fn get(&mut self, image: &str, service_account_key: &str) -> Option<DockerConfig> {
        let now = Instant::now();
        if now > self.last_purge + PURGE_INTERVAL {
            self.entries.retain(|_, e| now <= e.expires_at);
            self.last_purge = now;
        }
        for base in [image, registry_of(image), GLOBAL_KEY] {
            let key = cache_key(base, service_account_key);
            match self.entries.get(&key) {
                Some(e) if now > e.expires_at => {
                    self.entries.remove(&key);
                }
                Some(e) => return Some(e.config.clone()),
                None => {}
            }
        }
        None
    }

    /// Stores `config` under `key` (from [`cache_key`]) for `ttl`.
    pub fn put(&mut self, key: String, config: DockerConfig, ttl: Duration) {
        self.entries.insert(
            key,
            Entry {
                config,
                expires_at: Instant::now() + ttl,
            },
        );
    }

    /// Entries held (expired ones not yet purged included).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// No entry held.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use crate::credentials::docker_keyring::Credentials;

    fn cfg(u: &str) -> DockerConfig {
        DockerConfig::from([(
            "reg.io".to_string(),
            Credentials {
                username: u.into(),
                ..Default::default()
            },
        )])
    }

    #[tokio::test(start_paused = true)]
    async fn image_then_registry_then_global_until_expiry() {
        let mut c = ResponseCache::default();
        c.put(
            cache_key("reg.io:5000", ""),
            cfg("registry"),
            Duration::from_secs(60),
        );
        assert_eq!(
            c.get("reg.io:5000/team/app", "").unwrap()["reg.io"].username,
            "registry"
        );
        assert!(
            c.get("reg.io/team/app", "").is_none(),
            "the port is part of the registry"
        );
        c.put(
            cache_key("reg.io:5000/team/app", ""),
            cfg("image"),
            Duration::from_secs(10),
        );
        assert_eq!(
            c.get("reg.io:5000/team/app", "").unwrap()["reg.io"].username,
            "image"
        );
        c.put(
            cache_key(GLOBAL_KEY, ""),
            cfg("global"),
            Duration::from_secs(300),
        );
        assert_eq!(
            c.get("other.io/x", "").unwrap()["reg.io"].username,
            "global"
        );
        // Another service account does not see these.
        assert!(c.get("other.io/x", "sa").is_none());
        tokio::time::advance(Duration::from_secs(11)).await;
        assert_eq!(
            c.get("reg.io:5000/team/app", "").unwrap()["reg.io"].username,
            "registry"
        );
        tokio::time::advance(Duration::from_secs(50)).await;
        assert_eq!(
            c.get("reg.io:5000/team/app", "").unwrap()["reg.io"].username,
            "global"
        );
        tokio::time::advance(Duration::from_secs(16 * 60)).await;
        assert!(c.get("reg.io:5000/team/app", "").is_none());
        assert!(c.is_empty(), "purged");
    }

    #[test]
    fn keys_do_not_collide() {
        assert_ne!(cache_key("ab", "c"), cache_key("a", "bc"));
    }
}
