//! The shared state of one running server.

use std::sync::Arc;
use std::time::Duration;

use super::knobs::Knobs;
use super::store::Store;
use super::tokens::TokenSigner;

/// Settings fixed at start.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// PEM of the CA that signed the serving certificate.
    pub ca_pem: String,
    /// Audiences a token is for when a TokenRequest names none.
    pub api_audiences: Vec<String>,
    /// Emulate the controllers and admission plugins of a real control
    /// plane that a node agent depends on (see tests/README.md).
    pub emulate_controllers: bool,
    /// Static bearer tokens → user names; empty = no authentication.
    pub tokens: Vec<(String, String)>,
    /// How often watches with allowWatchBookmarks get a BOOKMARK.
    pub bookmark_interval: Duration,
}

/// Everything a request handler needs.
pub struct ApiState {
    /// Objects.
    pub store: Arc<Store>,
    /// Test knobs.
    pub knobs: Knobs,
    /// Service account token signer.
    pub signer: TokenSigner,
    /// Fixed settings.
    pub config: ServerConfig,
    /// `https://host:port` of the TLS listener (for discovery documents).
    pub https_url: String,
    /// How this server reaches kubelets (`nodes/proxy`, `pods/log`, …).
    pub kubelet: super::kubelet_proxy::KubeletClient,
}
