//! The API client certificate of a kubeconfig: which credential the node
//! uses and when its certificate expires (kubelet renews at 70–90 % of the
//! lifetime with `rotateCertificates`; an expired certificate is refused by
//! the API server with 401 and the node goes NotReady).

use std::path::Path;
use std::time::SystemTime;

use base64::Engine as _;
use kube::config::Kubeconfig;

use crate::certificates::kubeconfig::current_user;
use crate::certificates::pair::parse_leaf;

/// What the kubeconfig authenticates with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Credential {
    /// A client certificate.
    Certificate {
        /// Where it is (`client-certificate` path or "inline").
        source: String,
        /// Its subject.
        subject: String,
        /// Valid from.
        not_before: SystemTime,
        /// Valid until.
        not_after: SystemTime,
    },
    /// A bearer token (no expiry visible here).
    Token,
    /// An exec plugin or auth provider decides.
    Plugin(String),
    /// Nothing usable.
    None,
}

/// Why the kubeconfig's credential could not be read.
#[derive(Debug, thiserror::Error)]
pub enum CredentialError {
    /// The kubeconfig does not load.
    #[error(transparent)]
    Kubeconfig(#[from] kube::config::KubeconfigError),
    /// `client-certificate-data` is not base64.
    #[error("client-certificate-data: {0}")]
    InlineData(base64::DecodeError),
    /// `client-certificate` cannot be read.
    #[error("{}: {error}", path.display())]
    File {
        /// The file.
        path: std::path::PathBuf,
        /// Why.
        error: std::io::Error,
    },
    /// The certificate is not PEM.
    #[error("{source_name}: not a PEM certificate: {error}")]
    NotPem {
        /// Where it was read.
        source_name: String,
        /// The parser's text.
        error: String,
    },
    /// The PEM holds no usable X.509 certificate.
    #[error("{source_name}: {error}")]
    Leaf {
        /// Where it was read.
        source_name: String,
        /// Why.
        error: crate::certificates::CertError,
    },
}

/// Reads the credential of the kubeconfig's current context: the user
/// the node's client picks (`certificates::kubeconfig`), its certificate
/// read as the certificate manager reads it (`certificates::pair`).
pub fn credential(kubeconfig: &Path) -> Result<Credential, CredentialError> {
    let kc = Kubeconfig::read_from(kubeconfig)?;
    let Some(auth) = current_user(&kc) else {
        return Ok(Credential::None);
    };
    let pem = if let Some(data) = &auth.client_certificate_data {
        let raw = base64::engine::general_purpose::STANDARD
            .decode(data.trim())
            .map_err(CredentialError::InlineData)?;
        Some(("inline (client-certificate-data)".to_string(), raw))
    } else if let Some(file) = &auth.client_certificate {
        // A relative path is relative to the kubeconfig, as client-go reads it.
        let p = kubeconfig
            .parent()
            .unwrap_or(Path::new("."))
            .join(Path::new(file));
        let raw = match std::fs::read(&p) {
            Ok(raw) => raw,
            Err(error) => return Err(CredentialError::File { path: p, error }),
        };
        Some((p.display().to_string(), raw))
    } else {
        None
    };
    if let Some((source, raw)) = pem {
        let (_, pem) = match x509_parser::pem::parse_x509_pem(&raw) {
            Ok(p) => p,
            Err(e) => {
                return Err(CredentialError::NotPem {
                    source_name: source,
                    error: e.to_string(),
                });
            }
        };
        let leaf = match parse_leaf(&pem.contents) {
            Ok(l) => l,
            Err(error) => {
                return Err(CredentialError::Leaf {
                    source_name: source,
                    error,
                });
            }
        };
        let subject = std::iter::once(format!("CN={}", leaf.common_name))
            .chain(leaf.organizations.iter().map(|o| format!("O={o}")))
            .collect::<Vec<_>>()
            .join(", ");
        return Ok(Credential::Certificate {
            source,
            subject,
            not_before: leaf.not_before,
            not_after: leaf.not_after,
        });
    }
    if auth.token.is_some() || auth.token_file.is_some() {
        return Ok(Credential::Token);
    }
    if let Some(e) = &auth.exec {
        return Ok(Credential::Plugin(format!(
            "exec plugin {}",
            e.command.clone().unwrap_or_default()
        )));
    }
    if auth.auth_provider.is_some() {
        return Ok(Credential::Plugin("an auth provider".into()));
    }
    Ok(Credential::None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_certificate_of_the_current_context() {
        let dir = tempfile::tempdir().expect("tmp");
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "system:node:n1");
        params.not_before = rcgen::date_time_ymd(2025, 1, 1);
        params.not_after = rcgen::date_time_ymd(2026, 1, 1);
        let key = rcgen::KeyPair::generate().expect("key");
        let cert = params.self_signed(&key).expect("cert");
        std::fs::write(dir.path().join("client.pem"), cert.pem()).expect("write");
        let kc = dir.path().join("kubeconfig");
        std::fs::write(
            &kc,
            "apiVersion: v1\nkind: Config\ncurrent-context: c\ncontexts:\n- name: c\n  context: {cluster: x, user: node}\nclusters:\n- name: x\n  cluster: {server: 'https://127.0.0.1:6443'}\nusers:\n- name: other\n  user: {token: abc}\n- name: node\n  user: {client-certificate: client.pem, client-key: client.key}\n",
        )
        .expect("write");
        match credential(&kc).expect("read") {
            Credential::Certificate {
                subject, not_after, ..
            } => {
                assert_eq!(subject, "CN=system:node:n1");
                assert_eq!(
                    not_after
                        .duration_since(SystemTime::UNIX_EPOCH)
                        .expect("time")
                        .as_secs(),
                    1_767_225_600
                );
            }
            other => panic!("{other:?}"),
        }
        std::fs::write(
            &kc,
            "apiVersion: v1\nkind: Config\ncurrent-context: c\ncontexts:\n- name: c\n  context: {cluster: x, user: u}\nclusters:\n- name: x\n  cluster: {server: 'https://127.0.0.1:6443'}\nusers:\n- name: u\n  user: {token: abc}\n",
        )
        .expect("write");
        assert_eq!(credential(&kc).expect("read"), Credential::Token);
    }
}
