//! Who is calling, as kubelet's delegating authenticator decides
//! (`cmd/kubelet/app/auth.go` `BuildAuthn`,
//! `k8s.io/apiserver/pkg/authentication/authenticatorfactory/delegating.go`):
//! a client certificate signed by `clientCAFile`, else a bearer token
//! checked with a TokenReview (answers cached for `cacheTTL`), else — only
//! with `anonymous.enabled` — `system:anonymous`. Authenticated users get
//! the `system:authenticated` group. A presented credential that fails
//! (bad certificate, rejected token, TokenReview error) is a 401 even with
//! anonymous access on (`unionauth.NewFailOnError`).

use std::sync::Arc;
use std::time::Duration;

use http::HeaderMap;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use kube::api::{Api, PostParams};
use rustls::pki_types::CertificateDer;
use sha2::Digest;

use super::client_ca::ClientCa;
use super::retry::with_webhook_backoff;
use super::ttl_cache::{DEFAULT_CAPACITY, TtlCache};
use super::user::User;

/// `system:anonymous`.
pub const ANONYMOUS: &str = "system:anonymous";
/// The group of every authenticated user.
pub const AUTHENTICATED_GROUP: &str = "system:authenticated";

/// How a request's credentials turned out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Authenticated {
    /// A known caller.
    User(User),
    /// No credentials and anonymous access off.
    Nobody,
    /// A credential was presented and failed (or could not be checked).
    Failed(String),
}

/// Verifies bearer tokens with TokenReview.
pub struct TokenWebhook {
    client: kube::Client,
    ttl: Duration,
    cache: TtlCache<[u8; 32], Option<User>>,
}

impl std::fmt::Debug for TokenWebhook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenWebhook")
            .field("ttl", &self.ttl)
            .finish()
    }
}

/// Why a bearer token could not be reviewed.
#[derive(Debug, thiserror::Error)]
pub enum TokenReviewError {
    /// The TokenReview could not be had.
    #[error(transparent)]
    Webhook(#[from] super::retry::WebhookError),
    /// The API server answered with an error.
    #[error("{0}")]
    Answer(String),
}

impl TokenWebhook {
    /// Through `client` (the node's identity), caching for `ttl`.
    pub fn new(client: kube::Client, ttl: Duration) -> Self {
        TokenWebhook {
            client,
            ttl,
            cache: TtlCache::new(DEFAULT_CAPACITY),
        }
    }

    /// `Ok(Some(user))` when the API server vouches for the token,
    /// `Ok(None)` when it does not, `Err` when it could not be asked.
    pub async fn review(&self, token: &str) -> Result<Option<User>, TokenReviewError> {
        let key: [u8; 32] = sha2::Sha256::digest(token.as_bytes()).into();
        if let Some(hit) = self.cache.get(&key) {
            return Ok(hit);
        }
        let api: Api<TokenReview> = Api::all(self.client.clone());
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: token.to_string(),
                audiences: None,
            },
            ..Default::default()
        };
        let answer = with_webhook_backoff("TokenReview", || {
            let api = api.clone();
            let review = review.clone();
            async move {
                tokio::time::timeout(
                    Duration::from_secs(10),
                    api.create(&PostParams::default(), &review),
                )
                .await
                .map_err(|_| super::retry::WebhookError::Timeout)?
                .map_err(super::retry::WebhookError::Api)
            }
        })
        .await?;
        let status = answer.status.unwrap_or_default();
        if let Some(e) = status.error.as_deref().filter(|e| !e.is_empty()) {
            // An answer with an error is not cached (cacheErrs=false).
            return Err(TokenReviewError::Answer(e.to_string()));
        }
        let user = if status.authenticated == Some(true) {
            let u = status.user.unwrap_or_default();
            Some(User {
                name: u.username.unwrap_or_default(),
                uid: u.uid.unwrap_or_default(),
                groups: u.groups.unwrap_or_default(),
                extra: u.extra.unwrap_or_default(),
            })
        } else {
            None
        };
        self.cache.put(key, user.clone(), self.ttl);
        Ok(user)
    }
}

/// The request authenticator.
#[derive(Debug, Default)]
pub struct Authenticator {
    /// Client certificate check (`clientCAFile`).
    pub x509: Option<Arc<ClientCa>>,
    /// Bearer tokens (`webhook.enabled`).
    pub webhook: Option<TokenWebhook>,
    /// `anonymous.enabled`.
    pub anonymous: bool,
}

/// The bearer token of an `Authorization: Bearer <token>` header, or of a
/// WebSocket subprotocol `base64url.bearer.authorization.k8s.io.<token>`
/// (apiserver's websocket protocol authenticator, for browsers).
pub fn bearer_token(headers: &HeaderMap) -> Option<String> {
    if let Some(v) = headers.get(http::header::AUTHORIZATION)
        && let Ok(v) = v.to_str()
    {
        let mut parts = v.trim().splitn(2, ' ');
        if parts
            .next()
            .is_some_and(|s| s.eq_ignore_ascii_case("bearer"))
            && let Some(t) = parts.next().map(str::trim).filter(|t| !t.is_empty())
        {
            return Some(t.to_string());
        }
        return None;
    }
    const PREFIX: &str = "base64url.bearer.authorization.k8s.io.";
    for v in headers.get_all(http::header::SEC_WEBSOCKET_PROTOCOL) {
        for p in v.to_str().unwrap_or_default().split(',').map(str::trim) {
            if let Some(enc) = p.strip_prefix(PREFIX) {
                use base64::Engine;
                let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
                    .decode(enc.trim_end_matches('='))
                    .ok()?;
                return String::from_utf8(raw).ok().filter(|t| !t.is_empty());
            }
        }
    }
    None
}

fn with_authenticated_group(mut u: User) -> User {
    if u.name != ANONYMOUS && !u.groups.iter().any(|g| g == AUTHENTICATED_GROUP) {
        u.groups.push(AUTHENTICATED_GROUP.to_string());
    }
    u
}

impl Authenticator {
    /// Authenticates one request from its TLS peer chain and headers.
    pub async fn authenticate(
        &self,
        peer: Option<&[CertificateDer<'static>]>,
        headers: &HeaderMap,
    ) -> Authenticated {
        let mut errors = Vec::new();
        if let (Some(ca), Some(chain)) = (&self.x509, peer.filter(|c| !c.is_empty())) {
            match ca.authenticate(chain) {
                Ok(u) => return Authenticated::User(with_authenticated_group(u)),
                Err(e) => errors.push(e.to_string()),
            }
        }
        if let Some(webhook) = &self.webhook
            && let Some(token) = bearer_token(headers)
        {
            match webhook.review(&token).await {
                Ok(Some(u)) => return Authenticated::User(with_authenticated_group(u)),
                Ok(None) => errors.push("invalid bearer token".to_string()),
                Err(e) => errors.push(e.to_string()),
            }
        }
        if !errors.is_empty() {
            return Authenticated::Failed(errors.join(", "));
        }
        if self.anonymous {
            return Authenticated::User(User {
                name: ANONYMOUS.to_string(),
                groups: vec!["system:unauthenticated".to_string()],
                ..User::default()
            });
        }
        Authenticated::Nobody
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn bearer_tokens_from_header_and_websocket_protocol() {
        let mut h = HeaderMap::new();
        h.insert(http::header::AUTHORIZATION, "Bearer abc".parse().unwrap());
        assert_eq!(bearer_token(&h).as_deref(), Some("abc"));
        h.insert(http::header::AUTHORIZATION, "Basic abc".parse().unwrap());
        assert_eq!(bearer_token(&h), None);
        let mut h = HeaderMap::new();
        h.insert(
            http::header::SEC_WEBSOCKET_PROTOCOL,
            "v5.channel.k8s.io, base64url.bearer.authorization.k8s.io.dG9rZW4"
                .parse()
                .unwrap(),
        );
        assert_eq!(bearer_token(&h).as_deref(), Some("token"));
    }

    #[tokio::test]
    async fn anonymous_only_without_credentials() {
        let a = Authenticator {
            anonymous: true,
            ..Default::default()
        };
        match a.authenticate(None, &HeaderMap::new()).await {
            Authenticated::User(u) => {
                assert_eq!(u.name, ANONYMOUS);
                assert_eq!(u.groups, vec!["system:unauthenticated"]);
            }
            other => panic!("{other:?}"),
        }
        let off = Authenticator::default();
        assert_eq!(
            off.authenticate(None, &HeaderMap::new()).await,
            Authenticated::Nobody
        );
    }
}
