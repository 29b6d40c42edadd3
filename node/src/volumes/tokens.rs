//! Service account tokens for projected volumes, requested through the
//! TokenRequest API (`POST serviceaccounts/<name>/token`) and bound to the
//! pod, with kubelet's token manager rules:
//!
//! - tokens are cached per (service account, namespace, audiences,
//!   expirationSeconds, bound object);
//! - a cached token is refreshed once 80 % of its lifetime has passed, or
//!   once it is 24 hours old, minus a jitter of up to 10 seconds so that
//!   many pods do not ask at the same instant;
//! - when a refresh fails, the cached token is used while it is still valid;
//! - expired tokens are dropped every minute, and all tokens bound to a pod
//!   when its volumes are torn down.
//!
//! Token ages are judged by a [`Clock`] (`keelson_common::clock`).

use std::collections::HashMap;
use std::fmt::Debug;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::ServiceAccount;
use keelson_common::clock::Clock;
use kube::Api;
use kube::api::PostParams;

/// Tokens older than this are refreshed whatever their lifetime.
pub const MAX_TTL: Duration = Duration::from_secs(24 * 3600);
/// Largest random advance of a refresh.
pub const MAX_JITTER: Duration = Duration::from_secs(10);
/// How often expired tokens are dropped.
pub const GC_PERIOD: Duration = Duration::from_secs(60);

/// A failed TokenRequest; the text is the API server's message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct TokenError(pub String);

/// Who issues tokens (the API server, or a test double).
pub trait TokenRequester: Send + Sync + Debug {
    /// Asks for a token of `service_account` in `namespace`.
    fn request<'a>(
        &'a self,
        namespace: &'a str,
        service_account: &'a str,
        request: &'a TokenRequest,
    ) -> BoxFuture<'a, Result<TokenRequest, TokenError>>;
}

/// TokenRequest through the node's API client.
#[derive(Clone)]
pub struct ApiTokenRequester {
    client: kube::Client,
}

impl ApiTokenRequester {
    /// Uses `client` (the node's identity; the Node authorizer allows it for
    /// service accounts of pods bound to the node).
    pub fn new(client: kube::Client) -> ApiTokenRequester {
        ApiTokenRequester { client }
    }
}

impl Debug for ApiTokenRequester {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ApiTokenRequester")
    }
}

impl TokenRequester for ApiTokenRequester {
    fn request<'a>(
        &'a self,
        namespace: &'a str,
        service_account: &'a str,
        request: &'a TokenRequest,
    ) -> BoxFuture<'a, Result<TokenRequest, TokenError>> {
        Box::pin(async move {
            let api: Api<ServiceAccount> = Api::namespaced(self.client.clone(), namespace);
            api.create_token_request(service_account, &PostParams::default(), request)
                .await
                .map_err(|e| TokenError(api_message(&e)))
        })
    }
}

/// The API server's message for API errors, the error text otherwise.
pub fn api_message(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) if !s.message.is_empty() => s.message.clone(),
        other => other.to_string(),
    }
}

struct Cached {
    token: TokenRequest,
    pod_uid: Option<String>,
}

/// Caches and refreshes service account tokens; cheap to clone.
#[derive(Clone)]
pub struct TokenManager {
    cache: Arc<Mutex<HashMap<String, Cached>>>,
    requester: Arc<dyn TokenRequester>,
    clock: Arc<dyn Clock>,
}

impl Debug for TokenManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenManager").finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl TokenManager {
    /// A manager asking `requester`, judging age by `clock`.
    pub fn new(requester: Arc<dyn TokenRequester>, clock: Arc<dyn Clock>) -> TokenManager {
        TokenManager {
            cache: Arc::new(Mutex::new(HashMap::new())),
            requester,
            clock,
        }
    }

    /// A token for `request` (cached while fresh). When a refresh fails
    /// and the cached token has not expired, the cached token is returned.
    pub async fn get_service_account_token(
        &self,
        namespace: &str,
        name: &str,
        request: &TokenRequest,
    ) -> Result<TokenRequest, TokenError> {
        let key = cache_key(namespace, name, request);
        let cached = lock(&self.cache).get(&key).map(|c| c.token.clone());
        if let Some(c) = &cached
            && !self.requires_refresh(c)
        {
            return Ok(c.clone());
        }
        match self.requester.request(namespace, name, request).await {
            Ok(token) => {
                let pod_uid = bound_uid(request).map(String::from);
                lock(&self.cache).insert(
                    key,
                    Cached {
                        token: token.clone(),
                        pod_uid,
                    },
                );
                Ok(token)
            }
            Err(e) => match cached {
                Some(c) if !self.expired(&c) => {
                    tracing::error!(namespace, service_account = name, error = %e, "couldn't update token; using the cached one");
                    Ok(c)
                }
                _ => Err(e),
            },
        }
    }

    /// Forgets every token bound to the pod.
    pub fn delete_service_account_token(&self, pod_uid: &str) {
        lock(&self.cache).retain(|_, c| {
            let bound = bound_uid(&c.token).or(c.pod_uid.as_deref());
            bound != Some(pod_uid)
        });
    }

    /// Drops expired tokens (every [`GC_PERIOD`]).
    pub fn cleanup(&self) {
        let mut cache = lock(&self.cache);
        let expired: Vec<String> = cache
            .iter()
            .filter(|(_, c)| self.expired(&c.token))
            .map(|(k, _)| k.clone())
            .collect();
        for k in expired {
            cache.remove(&k);
        }
    }

    /// Number of cached tokens.
    pub fn len(&self) -> usize {
        lock(&self.cache).len()
    }

    /// True when no token is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn expired(&self, t: &TokenRequest) -> bool {
        match expiration(t) {
            Some(exp) => self.clock.now_timestamp() > exp,
            None => true,
        }
    }

    fn requires_refresh(&self, t: &TokenRequest) -> bool {
        let Some(secs) = t.spec.as_ref().and_then(|s| s.expiration_seconds) else {
            tracing::error!("expiration seconds was nil for token request");
            return false;
        };
        let Some(exp) = expiration(t) else {
            return true;
        };
        let now = self.clock.now_timestamp();
        let jitter = jiff::SignedDuration::from_secs(
            (rand::random::<f64>() * MAX_JITTER.as_secs_f64()) as i64,
        );
        let lifetime = jiff::SignedDuration::from_secs(secs);
        let iat = exp - lifetime;
        let max_ttl = jiff::SignedDuration::from_secs(MAX_TTL.as_secs() as i64);
        if now > iat + max_ttl - jitter {
            return true;
        }
        // Within the last 20 % of the lifetime.
        let margin = jiff::SignedDuration::from_secs(secs * 20 / 100);
        now > exp - margin - jitter
    }
}

fn expiration(t: &TokenRequest) -> Option<jiff::Timestamp> {
    t.status
        .as_ref()?
        .expiration_timestamp
        .as_ref()
        .map(|t| t.0)
}

fn bound_uid(t: &TokenRequest) -> Option<&str> {
    t.spec.as_ref()?.bound_object_ref.as_ref()?.uid.as_deref()
}

fn cache_key(namespace: &str, name: &str, r: &TokenRequest) -> String {
    let spec = r.spec.as_ref();
    let b = spec.and_then(|s| s.bound_object_ref.as_ref());
    format!(
        "{name:?}/{namespace:?}/{:?}/{:?}/{:?}/{:?}/{:?}/{:?}",
        spec.and_then(|s| s.audiences.as_ref()),
        spec.and_then(|s| s.expiration_seconds),
        b.and_then(|b| b.api_version.as_deref()),
        b.and_then(|b| b.kind.as_deref()),
        b.and_then(|b| b.name.as_deref()),
        b.and_then(|b| b.uid.as_deref()),
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use k8s_openapi::api::authentication::v1::{
        BoundObjectReference, TokenRequestSpec, TokenRequestStatus,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use keelson_common::clock::TokioClock;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    /// Issues `tok-N` tokens valid for the requested lifetime from the clock.
    #[derive(Debug)]
    struct Issuer {
        clock: TokioClock,
        calls: AtomicUsize,
        fail: AtomicBool,
    }

    impl TokenRequester for Issuer {
        fn request<'a>(
            &'a self,
            _ns: &'a str,
            _sa: &'a str,
            r: &'a TokenRequest,
        ) -> BoxFuture<'a, Result<TokenRequest, TokenError>> {
            Box::pin(async move {
                if self.fail.load(Ordering::SeqCst) {
                    return Err(TokenError("serviceaccounts \"sa\" not found".into()));
                }
                let n = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
                let spec = r.spec.clone().unwrap_or_default();
                let secs = spec.expiration_seconds.unwrap_or(3600);
                let exp = self.clock.now_timestamp() + jiff::SignedDuration::from_secs(secs);
                Ok(TokenRequest {
                    spec: Some(TokenRequestSpec {
                        expiration_seconds: Some(secs),
                        ..spec
                    }),
                    status: Some(TokenRequestStatus {
                        token: Some(format!("tok-{n}")),
                        expiration_timestamp: Some(Time(exp)),
                    }),
                    ..Default::default()
                })
            })
        }
    }

    fn request(secs: i64, uid: &str) -> TokenRequest {
        TokenRequest {
            spec: Some(TokenRequestSpec {
                audiences: None,
                expiration_seconds: Some(secs),
                bound_object_ref: Some(BoundObjectReference {
                    api_version: Some("v1".into()),
                    kind: Some("Pod".into()),
                    name: Some("p".into()),
                    uid: Some(uid.into()),
                }),
            }),
            ..Default::default()
        }
    }

    fn setup() -> (TokenManager, Arc<Issuer>) {
        let clock = TokioClock::new();
        let issuer = Arc::new(Issuer {
            clock,
            calls: AtomicUsize::new(0),
            fail: AtomicBool::new(false),
        });
        (TokenManager::new(issuer.clone(), Arc::new(clock)), issuer)
    }

    fn tok(t: &TokenRequest) -> String {
        t.status.as_ref().unwrap().token.clone().unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn refreshes_at_eighty_percent() {
        let (m, _) = setup();
        let r = request(3600, "u1");
        assert_eq!(
            tok(&m.get_service_account_token("ns", "sa", &r).await.unwrap()),
            "tok-1"
        );
        // 79 % of the lifetime minus the largest jitter: still cached.
        tokio::time::advance(Duration::from_secs(2880 - 11)).await;
        assert_eq!(
            tok(&m.get_service_account_token("ns", "sa", &r).await.unwrap()),
            "tok-1"
        );
        // Past 80 %: refreshed.
        tokio::time::advance(Duration::from_secs(12)).await;
        assert_eq!(
            tok(&m.get_service_account_token("ns", "sa", &r).await.unwrap()),
            "tok-2"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn refreshes_after_a_day_for_long_tokens() {
        let (m, _) = setup();
        let r = request(7 * 24 * 3600, "u1");
        assert_eq!(
            tok(&m.get_service_account_token("ns", "sa", &r).await.unwrap()),
            "tok-1"
        );
        tokio::time::advance(MAX_TTL - MAX_JITTER - Duration::from_secs(1)).await;
        assert_eq!(
            tok(&m.get_service_account_token("ns", "sa", &r).await.unwrap()),
            "tok-1"
        );
        tokio::time::advance(MAX_JITTER + Duration::from_secs(2)).await;
        assert_eq!(
            tok(&m.get_service_account_token("ns", "sa", &r).await.unwrap()),
            "tok-2"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn failed_refresh_keeps_a_valid_token_and_not_an_expired_one() {
        let (m, issuer) = setup();
        let r = request(600, "u1");
        m.get_service_account_token("ns", "sa", &r).await.unwrap();
        issuer.fail.store(true, Ordering::SeqCst);
        tokio::time::advance(Duration::from_secs(500)).await;
        assert_eq!(
            tok(&m.get_service_account_token("ns", "sa", &r).await.unwrap()),
            "tok-1"
        );
        tokio::time::advance(Duration::from_secs(101)).await;
        let err = m
            .get_service_account_token("ns", "sa", &r)
            .await
            .unwrap_err();
        assert_eq!(err.to_string(), "serviceaccounts \"sa\" not found");
    }

    #[tokio::test(start_paused = true)]
    async fn keys_cleanup_and_pod_deletion() {
        let (m, issuer) = setup();
        m.get_service_account_token("ns", "sa", &request(600, "u1"))
            .await
            .unwrap();
        m.get_service_account_token("ns", "sa", &request(600, "u2"))
            .await
            .unwrap();
        m.get_service_account_token("ns", "sa", &request(3600, "u2"))
            .await
            .unwrap();
        assert_eq!(issuer.calls.load(Ordering::SeqCst), 3);
        assert_eq!(m.len(), 3);
        m.delete_service_account_token("u2");
        assert_eq!(m.len(), 1);
        tokio::time::advance(Duration::from_secs(601)).await;
        m.cleanup();
        assert!(m.is_empty());
    }
}
