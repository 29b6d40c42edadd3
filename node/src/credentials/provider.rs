//! One credential provider plugin as kubelet runs it (`pluginProvider.provide`
//! in `pkg/credentialprovider/plugin/plugin.go`):
//!
//! 1. an image none of `matchImages` matches gets nothing, without a call;
//! 2. in service account token mode (`tokenAttributes`): a pod without a
//!    service account gets nothing when `requireServiceAccount`; otherwise
//!    the ServiceAccount is read (a missing required annotation: nothing,
//!    no call), a token with the configured audience, bound to the pod, is
//!    requested (TokenRequest, through the node's token manager) and sent
//!    with the required and present optional annotations; the cache key
//!    gains the service account (and the token's hash with `cacheType:
//!    Token`);
//! 3. the cache (image, then registry, then global) answers if it can;
//! 4. otherwise the plugin runs, once for concurrent requests of one image
//!    (kubelet's singleflight); a response whose `cacheKeyType` is not
//!    `Image`, `Registry` or `Global` is refused, and in token mode with
//!    `cacheType: ServiceAccount` a password equal to the token is refused;
//! 5. the credentials are cached for `cacheDuration`, else
//!    `defaultCacheDuration` (zero: not cached).
//!
//! Any error yields no credentials from this plugin (kubelet logs it and
//! goes on: the pull then uses the other credentials, or none).

use std::collections::{BTreeMap, HashMap};
use std::fmt::Debug;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::FutureExt;
use futures::future::{BoxFuture, Shared};
use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::api::ObjectMeta;

use super::cache::{GLOBAL_KEY, KeyBuilder, ResponseCache, cache_key, registry_of};
use super::config::{CredentialProvider, TokenAttributes};
use super::docker_keyring::{Credentials, DockerConfig, Source};
use super::exec::{ExecPlugin, Response};
use super::metrics::CredentialProviderMetrics;
use super::url_match::urls_match_str;
use crate::volumes::tokens::TokenManager;

/// Reads ServiceAccounts (the API, or a test double).
pub trait ServiceAccounts: Send + Sync + Debug {
    /// The ServiceAccount `namespace/name`; the error is the API's text.
    fn get<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<ServiceAccount, String>>;
}

/// ServiceAccounts through the node's API client.
#[derive(Clone)]
pub struct ApiServiceAccounts(pub kube::Client);

impl Debug for ApiServiceAccounts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ApiServiceAccounts")
    }
}

impl ServiceAccounts for ApiServiceAccounts {
    fn get<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<ServiceAccount, String>> {
        Box::pin(async move {
            kube::Api::<ServiceAccount>::namespaced(self.0.clone(), namespace)
                .get(name)
                .await
                .map_err(|e| crate::volumes::tokens::api_message(&e))
        })
    }
}

/// Who asks: the pod whose image is pulled.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodRef {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// UID.
    pub uid: String,
    /// `spec.serviceAccountName` (empty: none).
    pub service_account: String,
}

/// What token mode needs from outside.
#[derive(Debug, Clone)]
pub struct TokenSources {
    /// ServiceAccount reads.
    pub accounts: Arc<dyn ServiceAccounts>,
    /// Token requests (cached as kubelet's token manager caches them).
    pub tokens: TokenManager,
}

type Flight = Shared<BoxFuture<'static, Result<Response, String>>>;

/// One configured plugin.
#[derive(Debug)]
pub struct PluginProvider {
    name: String,
    match_images: Vec<String>,
    default_cache_duration: Duration,
    plugin: ExecPlugin,
    token: Option<(TokenAttributes, TokenSources)>,
    cache: Mutex<ResponseCache>,
    flights: Mutex<HashMap<String, Flight>>,
    metrics: CredentialProviderMetrics,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Service account facts of one request.
struct AccountPart {
    token: String,
    annotations: BTreeMap<String, String>,
    cache_key: String,
    source: Source,
}

impl PluginProvider {
    /// A provider for `config` running `plugin`; `tokens` serve token mode.
    pub fn new(
        config: &CredentialProvider,
        plugin: ExecPlugin,
        tokens: Option<TokenSources>,
        metrics: CredentialProviderMetrics,
    ) -> Self {
        let token = match (&config.token_attributes, tokens) {
            (Some(t), Some(s)) if !t.service_account_token_audience.is_empty() => {
                Some((t.clone(), s))
            }
            _ => None,
        };
        PluginProvider {
            name: config.name.clone(),
            match_images: config.match_images.clone(),
            default_cache_duration: config
                .default_cache_duration
                .map(|d| d.length)
                .unwrap_or_default(),
            plugin,
            token,
            cache: Mutex::new(ResponseCache::default()),
            flights: Mutex::new(HashMap::new()),
            metrics,
        }
    }

    /// The plugin's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// `provideWithCoordinates`: the credentials for `image` and, in token
    /// mode, the service account they are bound to; errors are logged and
    /// give nothing.
    pub async fn provide(&self, image: &str, pod: &PodRef) -> (DockerConfig, Option<Source>) {
        match self.try_provide(image, pod).await {
            Ok(r) => r,
            Err(e) => {
                if self.token.is_some() {
                    tracing::error!(provider = %self.name, image, pod = %format!("{}/{}", pod.namespace, pod.name), pod_uid = %pod.uid, service_account = %pod.service_account, error = %e, "failed to provide credentials for image");
                } else {
                    tracing::error!(provider = %self.name, image, error = %e, "failed to provide credentials for image");
                }
                (DockerConfig::new(), None)
            }
        }
    }

    fn is_image_allowed(&self, image: &str) -> bool {
        self.match_images
            .iter()
            .any(|m| urls_match_str(m, image).unwrap_or(false))
    }

    async fn try_provide(
        &self,
        image: &str,
        pod: &PodRef,
    ) -> Result<(DockerConfig, Option<Source>), String> {
        if !self.is_image_allowed(image) {
            return Ok((DockerConfig::new(), None));
        }
        let account = match &self.token {
            None => None,
            Some((attrs, _)) if pod.service_account.is_empty() => {
                if attrs.require_service_account.unwrap_or(true) {
                    tracing::debug!(provider = %self.name, image, "service account name is empty");
                    return Ok((DockerConfig::new(), None));
                }
                None
            }
            Some((attrs, sources)) => match self.account_part(attrs, sources, pod).await? {
                Some(a) => Some(a),
                None => return Ok((DockerConfig::new(), None)),
            },
        };
        let sa_key = account.as_ref().map(|a| a.cache_key.as_str()).unwrap_or("");
        let source = account.as_ref().map(|a| a.source.clone());
        if let Some(c) = lock(&self.cache).get(image, sa_key) {
            return Ok((c, source));
        }
        let flight_key = match &account {
            Some(a) => KeyBuilder::default()
                .push(image)
                .push(&token_hash(&a.token))
                .add_map(&a.annotations)
                .build(),
            None => image.to_string(),
        };
        let (token, annotations) = account
            .as_ref()
            .map(|a| (a.token.clone(), a.annotations.clone()))
            .unwrap_or_default();
        let response = self
            .run_once(flight_key, image, token.clone(), annotations)
            .await;
        let response = response.map_err(|e| {
            format!("failed to get credential from external registry credential provider: {e}")
        })?;
        if !token.is_empty()
            && self
                .token
                .as_ref()
                .is_some_and(|(t, _)| t.cache_type != "Token")
            && response
                .auth
                .iter()
                .flatten()
                .any(|(_, a)| a.password == token)
        {
            return Err("credential provider plugin returned the service account token as the password which is not allowed when service account cache type is not set to 'Token'".into());
        }
        let base = match response.cache_key_type.as_str() {
            "Image" => image,
            "Registry" => registry_of(image),
            "Global" => GLOBAL_KEY,
            other => {
                return Err(format!(
                    "credential provider plugin did not return a valid cacheKeyType: {other}"
                ));
            }
        };
        let config: DockerConfig = response
            .auth
            .iter()
            .flatten()
            .map(|(k, a)| {
                (
                    k.clone(),
                    Credentials {
                        username: a.username.clone(),
                        password: a.password.clone(),
                        email: String::new(),
                    },
                )
            })
            .collect();
        let ttl = match response.cache_duration {
            // Explicitly zero (or below): not cached.
            Some(d) if d.length.is_zero() || d.negative => None,
            Some(d) => Some(d.length),
            None if self.default_cache_duration.is_zero() => None,
            None => Some(self.default_cache_duration),
        };
        if let Some(ttl) = ttl {
            lock(&self.cache).put(cache_key(base, sa_key), config.clone(), ttl);
        }
        Ok((config, source))
    }

    /// Runs the plugin, sharing one run among concurrent identical requests.
    async fn run_once(
        &self,
        key: String,
        image: &str,
        token: String,
        annotations: BTreeMap<String, String>,
    ) -> Result<Response, String> {
        let flight = {
            let mut flights = lock(&self.flights);
            flights
                .entry(key.clone())
                .or_insert_with(|| {
                    let plugin = self.plugin.clone();
                    let metrics = self.metrics.clone();
                    let image = image.to_string();
                    async move {
                        plugin
                            .exec(&image, &token, &annotations, &metrics)
                            .await
                            .map_err(|e| e.to_string())
                    }
                    .boxed()
                    .shared()
                })
                .clone()
        };
        let out = flight.clone().await;
        let mut flights = lock(&self.flights);
        if flights.get(&key).is_some_and(|f| f.ptr_eq(&flight)) {
            flights.remove(&key);
        }
        out
    }

    /// Token mode: the service account, its annotations and a token;
    /// `None` when a required annotation is missing (no call then).
    async fn account_part(
        &self,
        attrs: &TokenAttributes,
        sources: &TokenSources,
        pod: &PodRef,
    ) -> Result<Option<AccountPart>, String> {
        let sa = sources
            .accounts
            .get(&pod.namespace, &pod.service_account)
            .await
            .map_err(|e| format!("failed to get service account: {e}"))?;
        let present = sa.metadata.annotations.clone().unwrap_or_default();
        let mut annotations = BTreeMap::new();
        for k in &attrs.required_service_account_annotation_keys {
            match present.get(k) {
                Some(v) => {
                    annotations.insert(k.clone(), v.clone());
                }
                None => {
                    tracing::debug!(provider = %self.name, annotation = %k, service_account = %pod.service_account, "required annotation not found; the plugin is not called");
                    return Ok(None);
                }
            }
        }
        for k in &attrs.optional_service_account_annotation_keys {
            if let Some(v) = present.get(k) {
                annotations.insert(k.clone(), v.clone());
            }
        }
        let sa_uid = sa.metadata.uid.clone().unwrap_or_default();
        let request = TokenRequest {
            metadata: ObjectMeta {
                uid: Some(sa_uid.clone()),
                ..Default::default()
            },
            spec: Some(TokenRequestSpec {
                audiences: Some(vec![attrs.service_account_token_audience.clone()]),
                bound_object_ref: Some(BoundObjectReference {
                    api_version: Some("v1".into()),
                    kind: Some("Pod".into()),
                    name: Some(pod.name.clone()),
                    uid: Some(pod.uid.clone()),
                }),
                expiration_seconds: None,
            }),
            status: None,
        };
        let token = sources
            .tokens
            .get_service_account_token(&pod.namespace, &pod.service_account, &request)
            .await
            .map_err(|e| format!("failed to get service account token: {e}"))?
            .status
            .and_then(|s| s.token)
            .unwrap_or_default();
        let mut key = KeyBuilder::default()
            .push(&pod.namespace)
            .push(&pod.service_account)
            .push(&sa_uid)
            .add_map(&annotations);
        if attrs.cache_type == "Token" {
            key = key.push("token").push(&token_hash(&token));
        }
        Ok(Some(AccountPart {
            token,
            annotations,
            cache_key: key.build(),
            source: Source::ServiceAccount {
                uid: sa_uid,
                namespace: pod.namespace.clone(),
                name: pod.service_account.clone(),
            },
        }))
    }

    /// Cached responses (tests, introspection).
    pub fn cached(&self) -> usize {
        lock(&self.cache).len()
    }
}

/// `getHashIfNotEmpty`.
fn token_hash(token: &str) -> String {
    if token.is_empty() {
        String::new()
    } else {
        format!(
            "sha256:{}",
            hex::encode(<sha2::Sha256 as sha2::Digest>::digest(token.as_bytes()))
        )
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests;
