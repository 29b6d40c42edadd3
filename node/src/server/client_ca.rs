//! Client certificates: the TLS handshake asks for one and accepts any
//! (Go's `tls.RequestClientCert`, what kubelet sets when
//! `authentication.x509.clientCAFile` is given); the x509 authenticator
//! then verifies the chain against the CA bundle, re-read when the file
//! changes (`ReloadKubeletClientCAFile`), and takes the user from the
//! subject (`k8s.io/apiserver/pkg/authentication/request/x509`:
//! CommonName → user, Organization → groups). So a certificate from an
//! unknown CA gets kubelet's 401, not a failed handshake.

use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use rustls::DigitallySignedStruct;
use rustls::client::danger::HandshakeSignatureValid;
use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls::pki_types::{CertificateDer, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use tokio_util::sync::CancellationToken;

use super::ServerError;
use super::user::User;

/// The client CA bundle, reloadable.
pub struct ClientCa {
    path: PathBuf,
    state: RwLock<(Vec<u8>, Arc<dyn ClientCertVerifier>)>,
}

impl std::fmt::Debug for ClientCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientCa")
            .field("path", &self.path)
            .finish()
    }
}

/// Why a client CA bundle cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum CaBundleError {
    /// The PEM does not read.
    #[error(transparent)]
    Pem(#[from] std::io::Error),
    /// A certificate is not a usable CA.
    #[error(transparent)]
    Certificate(#[from] rustls::Error),
    /// No certificate in the file.
    #[error("no CERTIFICATE block")]
    Empty,
    /// The verifier could not be built.
    #[error(transparent)]
    Verifier(#[from] rustls::server::VerifierBuilderError),
}

fn verifier_for(pem: &[u8]) -> Result<Arc<dyn ClientCertVerifier>, CaBundleError> {
    let mut roots = rustls::RootCertStore::empty();
    let mut n = 0;
    for c in rustls_pemfile::certs(&mut &pem[..]) {
        roots.add(c?)?;
        n += 1;
    }
    if n == 0 {
        return Err(CaBundleError::Empty);
    }
    Ok(WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        Arc::new(rustls::crypto::ring::default_provider()),
    )
    .build()?)
}

impl ClientCa {
    /// Loads the bundle (kubelet refuses to start when it cannot).
    pub fn load(path: PathBuf) -> Result<Arc<ClientCa>, ServerError> {
        let pem = std::fs::read(&path).map_err(|e| {
            ServerError::Certificate(format!(
                "unable to load client CA file {}: {e}",
                path.display()
            ))
        })?;
        let verifier = verifier_for(&pem).map_err(|e| {
            ServerError::Certificate(format!(
                "unable to load client CA file {}: {e}",
                path.display()
            ))
        })?;
        Ok(Arc::new(ClientCa {
            path,
            state: RwLock::new((pem, verifier)),
        }))
    }

    /// Verifies a presented chain (leaf first) and returns its user.
    pub fn authenticate(&self, chain: &[CertificateDer<'static>]) -> Result<User, CertAuthError> {
        let Some((leaf, intermediates)) = chain.split_first() else {
            return Err(CertAuthError::NoCertificate);
        };
        let verifier = self
            .state
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .1
            .clone();
        verifier
            .verify_client_cert(leaf, intermediates, UnixTime::now())
            .map_err(CertAuthError::Verify)?;
        user_of(leaf)
    }

    /// Re-reads the file every `period`; a bundle that does not parse is
    /// logged and the previous one kept.
    pub async fn reload(self: Arc<Self>, period: Duration, stop: CancellationToken) {
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(period) => {}
            }
            let Ok(pem) = std::fs::read(&self.path) else {
                continue;
            };
            let same = self.state.read().unwrap_or_else(|p| p.into_inner()).0 == pem;
            if same {
                continue;
            }
            match verifier_for(&pem) {
                Ok(v) => {
                    *self.state.write().unwrap_or_else(|p| p.into_inner()) = (pem, v);
                    tracing::info!(file = %self.path.display(), "client CA bundle reloaded");
                }
                Err(e) => {
                    tracing::warn!(file = %self.path.display(), error = %e, "invalid client CA bundle; keeping the previous one")
                }
            }
        }
    }
}

/// Why a client certificate gives no user.
#[derive(Debug, thiserror::Error)]
pub enum CertAuthError {
    /// The TLS peer sent no certificate.
    #[error("no client certificate")]
    NoCertificate,
    /// The chain does not lead to the client CA.
    #[error("verifying certificate: {0}")]
    Verify(rustls::Error),
    /// The leaf is not X.509 DER.
    #[error("parsing certificate: {0}")]
    Parse(String),
    /// The leaf names no user.
    #[error("certificate has no CommonName")]
    NoCommonName,
}

/// CommonName → user, each Organization → a group.
pub fn user_of(cert: &CertificateDer<'_>) -> Result<User, CertAuthError> {
    let (_, parsed) = x509_parser::parse_x509_certificate(cert.as_ref())
        .map_err(|e| CertAuthError::Parse(e.to_string()))?;
    let subject = parsed.subject();
    let name = subject
        .iter_common_name()
        .next()
        .and_then(|a| a.as_str().ok())
        .unwrap_or_default()
        .to_string();
    if name.is_empty() {
        return Err(CertAuthError::NoCommonName);
    }
    let groups = subject
        .iter_organization()
        .filter_map(|a| a.as_str().ok().map(str::to_string))
        .collect();
    Ok(User {
        name,
        uid: String::new(),
        groups,
        extra: Default::default(),
    })
}

/// Asks for a client certificate and accepts whatever is presented (the
/// chain is checked by [`ClientCa::authenticate`]); the handshake
/// signature is still verified, so the client holds the key.
#[derive(Debug)]
pub struct RequestClientCert {
    algorithms: WebPkiSupportedAlgorithms,
}

impl RequestClientCert {
    /// With ring's signature algorithms.
    pub fn new() -> Arc<Self> {
        Arc::new(RequestClientCert {
            algorithms: rustls::crypto::ring::default_provider().signature_verification_algorithms,
        })
    }
}

impl ClientCertVerifier for RequestClientCert {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        false
    }

    fn root_hint_subjects(&self) -> &[rustls::DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        Ok(ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}
