//! TLS material generated at start: a CA and a serving certificate for
//! loopback and the in-cluster names of the API, the rustls config
//! offering HTTP/2 and HTTP/1.1 and accepting (optional) client
//! certificates signed by the CA, and client certificates issued on demand
//! (CN = user, O = group, as kube-apiserver's x509 authenticator reads them).

use std::net::IpAddr;
use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, IsCa, Issuer, KeyPair, SanType,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

use super::error::TestApiError;

/// Generated certificates.
pub struct TlsMaterial {
    /// CA certificate, PEM.
    pub ca_pem: String,
    /// Server config for the TLS listener.
    pub server_config: Arc<rustls::ServerConfig>,
    /// The CA, for issuing client certificates.
    pub issuer: Issuer<'static, KeyPair>,
}

/// A client certificate issued by the CA.
pub struct ClientCert {
    /// Certificate, PEM.
    pub cert_pem: String,
    /// Private key, PEM (PKCS#8).
    pub key_pem: String,
}

/// Issues a client certificate with CN = `user` and O = `group`.
pub fn issue_client(
    issuer: &Issuer<'static, KeyPair>,
    user: &str,
    group: Option<&str>,
) -> Result<ClientCert, TestApiError> {
    issue_client_valid(issuer, user, group, None)
}

/// [`issue_client`] valid over `validity` (not before, not after) rather
/// than rcgen's default.
pub fn issue_client_valid(
    issuer: &Issuer<'static, KeyPair>,
    user: &str,
    group: Option<&str>,
    validity: Option<(time::OffsetDateTime, time::OffsetDateTime)>,
) -> Result<ClientCert, TestApiError> {
    let key = KeyPair::generate().map_err(err)?;
    let mut params = CertificateParams::new(Vec::<String>::new()).map_err(err)?;
    if let Some((not_before, not_after)) = validity {
        params.not_before = not_before;
        params.not_after = not_after;
    }
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, user);
    if let Some(g) = group {
        dn.push(DnType::OrganizationName, g);
    }
    params.distinguished_name = dn;
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
    let cert = params.signed_by(&key, issuer).map_err(err)?;
    Ok(ClientCert {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    })
}

fn err(e: impl std::fmt::Display) -> TestApiError {
    TestApiError::Tls(e.to_string())
}

/// Generates a CA and a serving certificate for `names` and `ips`.
pub fn generate(names: &[String], ips: &[IpAddr]) -> Result<TlsMaterial, TestApiError> {
    let ca_key = KeyPair::generate().map_err(err)?;
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).map_err(err)?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, "keelson-testapi-ca");
    ca_params.distinguished_name = dn;
    ca_params.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::CrlSign,
        rcgen::KeyUsagePurpose::DigitalSignature,
    ];
    let ca_cert = ca_params.self_signed(&ca_key).map_err(err)?;
    let issuer = Issuer::new(ca_params, ca_key);

    let server_key = KeyPair::generate().map_err(err)?;
    let mut params = CertificateParams::new(names.to_vec()).map_err(err)?;
    for ip in ips {
        params.subject_alt_names.push(SanType::IpAddress(*ip));
    }
    let mut sdn = DistinguishedName::new();
    sdn.push(DnType::CommonName, "kube-apiserver");
    params.distinguished_name = sdn;
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    let server_cert = params.signed_by(&server_key, &issuer).map_err(err)?;

    let chain: Vec<CertificateDer<'static>> =
        vec![server_cert.der().clone(), ca_cert.der().clone()];
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(server_key.serialize_der()));
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca_cert.der().clone()).map_err(err)?;
    let client_verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        provider.clone(),
    )
    .allow_unauthenticated()
    .build()
    .map_err(err)?;
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(err)?
        .with_client_cert_verifier(client_verifier)
        .with_single_cert(chain, key)
        .map_err(err)?;
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(TlsMaterial {
        ca_pem: ca_cert.pem(),
        server_config: Arc::new(cfg),
        issuer,
    })
}
