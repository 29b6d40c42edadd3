//! API clients, one per role, as upstream: the node role authenticates as
//! the node (`system:node:<name>`), the proxy role as kube-proxy. Each has its
//! own client-side rate limit (kubelet 50/100, kube-proxy 5/10) and user agent.

mod ratelimit;

use std::path::Path;
use std::time::Duration;

use http::{HeaderName, HeaderValue};
use kube::client::ClientBuilder;
use kube::config::{KubeConfigOptions, Kubeconfig};

pub use ratelimit::{RateLimitLayer, TokenBucket};

/// Why a client could not be built.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The kubeconfig file could not be read or parsed.
    #[error("reading kubeconfig {path}: {source}")]
    Kubeconfig {
        /// The file.
        path: String,
        /// The reason.
        #[source]
        source: kube::config::KubeconfigError,
    },
    /// No kubeconfig given and neither `$KUBECONFIG`/`~/.kube/config` nor the
    /// in-cluster service account works. The text says what was looked
    /// for; which flag gives the role its credentials is the caller's to say.
    #[error("no kubeconfig was given, and {0}")]
    Infer(String),
    /// The client stack could not be built (TLS material, proxy, ...).
    #[error("building API client: {0}")]
    Build(#[source] kube::Error),
}

/// Settings of one role's client.
#[derive(Debug, Clone)]
pub struct ClientSettings<'a> {
    /// Kubeconfig path; `None` infers (`$KUBECONFIG`, `~/.kube/config`, in-cluster).
    pub kubeconfig: Option<&'a Path>,
    /// Sustained requests per second (0 disables the limit).
    pub qps: f32,
    /// Burst size.
    pub burst: u32,
    /// Role name for the user agent (`node`, `proxy`).
    pub role: &'a str,
}

/// Loads the kube `Config` for a role.
pub async fn load_config(kubeconfig: Option<&Path>) -> Result<kube::Config, ClientError> {
    match kubeconfig {
        Some(path) => {
            let kc = Kubeconfig::read_from(path).map_err(|source| ClientError::Kubeconfig {
                path: path.display().to_string(),
                source,
            })?;
            kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
                .await
                .map_err(|source| ClientError::Kubeconfig {
                    path: path.display().to_string(),
                    source,
                })
        }
        None => kube::Config::infer()
            .await
            .map_err(|e| ClientError::Infer(not_inferred(&e))),
    }
}

/// Why no credentials could be inferred, said once (kube's own error
/// repeats the kubeconfig failure inside the in-cluster one): what keelson
/// fell back on and why it was unusable.
fn not_inferred(e: &kube::config::InferConfigError) -> String {
    use std::error::Error;
    let env = std::env::var_os("KUBECONFIG").filter(|v| !v.is_empty());
    let home = std::env::var_os("HOME").map(|h| Path::new(&h).join(".kube/config"));
    // The source is the kubeconfig failure; the in-cluster one is only in
    // the text.
    let failure = || {
        e.source()
            .map(crate::error_chain::error_chain)
            .unwrap_or_default()
    };
    match (&env, &home) {
        (Some(v), _) => format!(
            "$KUBECONFIG ({}) is unusable: {}",
            v.to_string_lossy(),
            failure()
        ),
        (None, Some(h)) if h.exists() => format!("{} is unusable: {}", h.display(), failure()),
        _ if std::env::var_os("KUBERNETES_SERVICE_HOST").is_some() => {
            format!("the pod's service account is unusable: {e}")
        }
        _ => "there is no $KUBECONFIG, ~/.kube/config or pod service account to fall back on"
            .to_string(),
    }
}

/// Builds a role's client: its kubeconfig, user agent, connect timeout and
/// token-bucket rate limit. Building never contacts the server; an
/// unreachable server shows up as errors of the requests (watchers retry
/// them with backoff).
pub async fn build_client(s: &ClientSettings<'_>) -> Result<kube::Client, ClientError> {
    build_client_logged(s, None).await
}

/// [`build_client`] whose requests are also counted in `log` (the daemon's
/// own request log, for `keelson diagnose`).
pub async fn build_client_logged(
    s: &ClientSettings<'_>,
    log: Option<&crate::introspection::ApiLog>,
) -> Result<kube::Client, ClientError> {
    let mut config = load_config(s.kubeconfig).await?;
    config.connect_timeout = Some(Duration::from_secs(10));
    if let Ok(v) = HeaderValue::from_str(&crate::version::user_agent(s.role)) {
        config
            .headers
            .push((HeaderName::from_static("user-agent"), v));
    }
    let builder = ClientBuilder::try_from(config).map_err(ClientError::Build)?;
    let limit = RateLimitLayer::new(TokenBucket::new(s.qps, s.burst));
    // The log sits below the rate limit: its latencies are the API
    // server's, not the client's own waiting.
    Ok(match log {
        Some(log) => builder
            .with_layer(&log.layer(s.role))
            .with_layer(&limit)
            .build(),
        None => builder.with_layer(&limit).build(),
    })
}
