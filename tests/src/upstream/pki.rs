//! The cluster's certificates, made with rcgen as kubeadm would make them:
//! one CA that signs the API server's serving certificate, every client
//! certificate (CN = user, O = groups, as the x509 authenticator reads
//! them), the node agents' serving certificates (so the API server can
//! check them with `--kubelet-certificate-authority`) and, through
//! kube-controller-manager's `--cluster-signing-*` flags, approved CSRs;
//! plus the ServiceAccount token signing key pair.

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};

use super::UpstreamError;

fn tls(e: impl std::fmt::Display) -> UpstreamError {
    UpstreamError::Setup {
        context: "making certificates".into(),
        message: e.to_string(),
    }
}

/// A certificate and its private key, PEM.
#[derive(Debug, Clone)]
pub struct CertPair {
    /// Certificate, PEM.
    pub cert_pem: String,
    /// Private key, PEM (PKCS#8).
    pub key_pem: String,
}

impl CertPair {
    /// Writes `<dir>/<name>.crt` and `<dir>/<name>.key` (0600); returns
    /// both paths.
    pub fn write(&self, dir: &Path, name: &str) -> Result<(PathBuf, PathBuf), UpstreamError> {
        let crt = dir.join(format!("{name}.crt"));
        let key = dir.join(format!("{name}.key"));
        write_file(&crt, &self.cert_pem, 0o644)?;
        write_file(&key, &self.key_pem, 0o600)?;
        Ok((crt, key))
    }
}

/// Writes a file with a mode.
pub fn write_file(path: &Path, text: &str, mode: u32) -> Result<(), UpstreamError> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, text).map_err(UpstreamError::io(format!("writing {}", path.display())))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .map_err(UpstreamError::io(format!("chmod {}", path.display())))
}

/// The cluster CA.
pub struct Ca {
    cert_pem: String,
    key_pem: String,
    issuer: Issuer<'static, KeyPair>,
}

impl std::fmt::Debug for Ca {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ca").finish_non_exhaustive()
    }
}

impl Ca {
    /// A new self-signed CA named `kubernetes` (kubeadm's CN).
    pub fn new() -> Result<Ca, UpstreamError> {
        let key = KeyPair::generate().map_err(tls)?;
        let mut params = CertificateParams::new(Vec::<String>::new()).map_err(tls)?;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name = dn("kubernetes", None);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let cert = params.self_signed(&key).map_err(tls)?;
        Ok(Ca {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            issuer: Issuer::new(params, key),
        })
    }

    /// The CA certificate, PEM.
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// The CA as a pair (kube-controller-manager signs CSRs with it).
    pub fn pair(&self) -> CertPair {
        CertPair {
            cert_pem: self.cert_pem.clone(),
            key_pem: self.key_pem.clone(),
        }
    }

    /// A client certificate: CN = `user`, O = `group` (rcgen writes one
    /// value per attribute type, so one group).
    pub fn client(&self, user: &str, group: Option<&str>) -> Result<CertPair, UpstreamError> {
        let key = KeyPair::generate().map_err(tls)?;
        let mut params = CertificateParams::new(Vec::<String>::new()).map_err(tls)?;
        params.distinguished_name = dn(user, group);
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        self.sign(params, key)
    }

    /// A serving certificate for `names` and `ips`, CN = `cn`.
    pub fn server(
        &self,
        cn: &str,
        names: &[&str],
        ips: &[IpAddr],
    ) -> Result<CertPair, UpstreamError> {
        let key = KeyPair::generate().map_err(tls)?;
        let mut params =
            CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
                .map_err(tls)?;
        params
            .subject_alt_names
            .extend(ips.iter().map(|ip| SanType::IpAddress(*ip)));
        params.distinguished_name = dn(cn, None);
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        self.sign(params, key)
    }

    fn sign(&self, params: CertificateParams, key: KeyPair) -> Result<CertPair, UpstreamError> {
        let cert = params.signed_by(&key, &self.issuer).map_err(tls)?;
        Ok(CertPair {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }
}

fn dn(cn: &str, org: Option<&str>) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, cn);
    if let Some(o) = org {
        dn.push(DnType::OrganizationName, o);
    }
    dn
}

/// The ServiceAccount token key pair: private key (PKCS#8 PEM) for the
/// API server's `--service-account-signing-key-file` and the controller
/// manager, public key PEM for `--service-account-key-file`.
pub fn service_account_keys() -> Result<(String, String), UpstreamError> {
    let key = KeyPair::generate().map_err(tls)?;
    Ok((key.serialize_pem(), key.public_key_pem()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_certificate_carries_user_and_group() {
        let ca = Ca::new().expect("ca");
        let c = ca
            .client("system:node:n1", Some("system:nodes"))
            .expect("client");
        let der = rustls_pemfile::certs(&mut c.cert_pem.as_bytes())
            .next()
            .expect("one cert")
            .expect("pem");
        // The subject is DER-encoded: the names appear as bytes.
        let bytes = der.as_ref();
        for needle in ["system:node:n1", "system:nodes"] {
            assert!(
                bytes.windows(needle.len()).any(|w| w == needle.as_bytes()),
                "{needle} in the subject"
            );
        }
        assert!(c.key_pem.contains("PRIVATE KEY"));
    }
}
