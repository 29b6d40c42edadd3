//! Certificates the node role gets from the cluster, as kubelet gets them:
//! TLS bootstrap (a client certificate requested with bootstrap
//! credentials through a CertificateSigningRequest), rotation before
//! expiry, and an API client whose certificate changes without a restart.
//! The same manager renews a serving certificate (`serverTLSBootstrap`).
//!
//! - [`pair`]: a certificate chain and key, parsed once.
//! - [`store`]: client-go's file store (`<prefix>-current.pem` → dated file).
//! - [`csr`]: keys, requests, and following a CertificateSigningRequest.
//! - [`manager`]: when to request, retries, installing the result.
//! - [`transport`]: the swappable client certificate and the API client.
//! - [`kubeconfig`]: reading and writing the node's kubeconfig.
//! - [`node`]: the node role's client, wired as kubelet's.

pub mod csr;
pub mod kubeconfig;
pub mod manager;
pub mod metrics;
pub mod node;
pub mod pair;
pub mod store;
pub mod transport;

use std::time::Duration;

pub use manager::{CertificateManager, ManagerConfig, RequestClients};
pub use pair::CertPair;
pub use store::FileStore;
pub use transport::{ClientCertResolver, CurrentCert, ServerCertResolver};

/// Why a certificate could not be had.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    /// PEM or X.509 data could not be read.
    #[error("{0}")]
    Parse(String),
    /// The certificate directory could not be read or written.
    #[error("certificate store: {0}")]
    Store(String),
    /// A request could not be made or does not match.
    #[error("{0}")]
    Csr(String),
    /// The API server refused or failed a request.
    #[error("{0}")]
    Api(String),
    /// No API client could be built.
    #[error("{0}")]
    Client(String),
    /// No kubeconfig was given and none could be inferred: the text says
    /// what keelson fell back on (`ClientError::Infer`).
    #[error("no kubeconfig was given, and {0}")]
    NoCredentials(String),
    /// A kubeconfig could not be read or written.
    #[error("{0}")]
    Kubeconfig(String),
    /// Someone denied the request.
    #[error("certificate signing request {csr} is denied, reason: {reason}, message: {message}")]
    Denied {
        /// Its name.
        csr: String,
        /// The condition's reason.
        reason: String,
        /// The condition's message.
        message: String,
    },
    /// The signer failed the request.
    #[error("certificate signing request {csr} failed, reason: {reason}, message: {message}")]
    Failed {
        /// Its name.
        csr: String,
        /// The condition's reason.
        reason: String,
        /// The condition's message.
        message: String,
    },
    /// Nobody approved or issued it in time.
    #[error("certificate signing request {csr} was not approved and issued within {}s", .after.as_secs())]
    Timeout {
        /// Its name.
        csr: String,
        /// How long keelson waited.
        after: Duration,
    },
    /// keelson is stopping.
    #[error("shutting down")]
    ShuttingDown,
}
