//! Kubeconfig files for the upstream control plane's users, with the CA
//! and the credentials embedded (as kubeadm writes them).

use std::path::Path;

use base64::Engine;

use super::UpstreamError;
use super::pki::{CertPair, write_file};

/// How a kubeconfig's user authenticates.
#[derive(Debug, Clone)]
pub enum Credentials<'a> {
    /// A client certificate.
    Certificate(&'a CertPair),
    /// A bearer token (bootstrap or ServiceAccount token).
    Token(&'a str),
}

/// Writes a kubeconfig (mode 0600) for `server` trusting `ca_pem`.
pub fn write(
    path: &Path,
    server: &str,
    ca_pem: &str,
    user: &str,
    credentials: Credentials<'_>,
) -> Result<(), UpstreamError> {
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s.as_bytes());
    let auth = match credentials {
        Credentials::Certificate(c) => format!(
            "    client-certificate-data: {}\n    client-key-data: {}\n",
            b64(&c.cert_pem),
            b64(&c.key_pem)
        ),
        Credentials::Token(t) => format!("    token: {t}\n"),
    };
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: upstream\n  cluster:\n    server: {server}\n    certificate-authority-data: {ca}\ncontexts:\n- name: {user_name}@upstream\n  context:\n    cluster: upstream\n    user: {user_name}\ncurrent-context: {user_name}@upstream\nusers:\n- name: {user_name}\n  user:\n{auth}",
        ca = b64(ca_pem),
        user_name = sanitize(user),
    );
    write_file(path, &text, 0o600)
}

/// kubeconfig entry names: keep them plain.
fn sanitize(user: &str) -> String {
    user.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '-'
            }
        })
        .collect()
}

/// A client for a kubeconfig file.
pub async fn client(path: &Path) -> Result<kube::Client, UpstreamError> {
    let kc = kube::config::Kubeconfig::read_from(path).map_err(|e| UpstreamError::Setup {
        context: format!("reading {}", path.display()),
        message: e.to_string(),
    })?;
    let config =
        kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
            .await
            .map_err(|e| UpstreamError::Setup {
                context: format!("loading {}", path.display()),
                message: e.to_string(),
            })?;
    kube::Client::try_from(config).map_err(|e| UpstreamError::Setup {
        context: format!("client for {}", path.display()),
        message: e.to_string(),
    })
}
