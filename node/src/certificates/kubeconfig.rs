//! The node's kubeconfig, read and written as kubelet's bootstrap does
//! (`pkg/kubelet/certificate/bootstrap/bootstrap.go`): whether it still
//! holds a usable client certificate (`isClientConfigStillValid`), which
//! certificate it names, and the kubeconfig written after a bootstrap,
//! pointing at the store's current pair file (`writeKubeconfigFromBootstrapping`).

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use base64::Engine;
use kube::config::{AuthInfo, Kubeconfig};

use super::CertError;
use super::pair::CertPair;

/// The client credentials a kubeconfig names for its current context.
#[derive(Debug, Clone, Default)]
pub struct Identity {
    /// `client-certificate` (a file).
    pub cert_file: Option<PathBuf>,
    /// `client-key` (a file).
    pub key_file: Option<PathBuf>,
    /// The certificate and key, read from the files or the `-data` fields.
    pub pair: Option<CertPair>,
    /// True when the pair came from the `-data` fields.
    pub embedded: bool,
    /// True when the user authenticates with a token (no certificate).
    pub token: bool,
}

fn kc_err(path: &Path, e: impl std::fmt::Display) -> CertError {
    CertError::Kubeconfig(format!("kubeconfig {}: {e}", path.display()))
}

/// The user of the kubeconfig's current context.
pub fn current_user(kc: &Kubeconfig) -> Option<AuthInfo> {
    let ctx_name = kc.current_context.clone()?;
    let ctx = kc
        .contexts
        .iter()
        .find(|c| c.name == ctx_name)?
        .context
        .clone()?;
    let user = ctx.user?;
    kc.auth_infos
        .iter()
        .find(|a| a.name == user)
        .and_then(|a| a.auth_info.clone())
}

/// An inline kubeconfig field that is not base64.
#[derive(Debug, thiserror::Error)]
#[error("{field}: {error}")]
struct InlineDataError {
    field: &'static str,
    error: base64::DecodeError,
}

fn decode(field: &'static str, data: &str) -> Result<String, InlineDataError> {
    base64::engine::general_purpose::STANDARD
        .decode(data.trim())
        .map_err(|error| InlineDataError { field, error })
        .map(|b| String::from_utf8_lossy(&b).to_string())
}

/// Reads the client identity of `path`'s current context.
pub fn identity(path: &Path) -> Result<Identity, CertError> {
    let kc = Kubeconfig::read_from(path).map_err(|e| kc_err(path, e))?;
    let Some(user) = current_user(&kc) else {
        return Ok(Identity::default());
    };
    let mut id = Identity {
        cert_file: user.client_certificate.clone().map(PathBuf::from),
        key_file: user.client_key.clone().map(PathBuf::from),
        token: user.token.is_some() || user.token_file.is_some(),
        ..Identity::default()
    };
    let cert_pem = match (&user.client_certificate_data, &id.cert_file) {
        (Some(d), _) => {
            id.embedded = true;
            Some(decode("client-certificate-data", d).map_err(|e| kc_err(path, e))?)
        }
        (None, Some(f)) => Some(
            std::fs::read_to_string(f)
                .map_err(|e| kc_err(path, format!("{}: {e}", f.display())))?,
        ),
        (None, None) => None,
    };
    let key_pem = match (&user.client_key_data, &id.key_file) {
        (Some(d), _) => {
            use secrecy::ExposeSecret;
            Some(decode("client-key-data", d.expose_secret()).map_err(|e| kc_err(path, e))?)
        }
        (None, Some(f)) => Some(
            std::fs::read_to_string(f)
                .map_err(|e| kc_err(path, format!("{}: {e}", f.display())))?,
        ),
        (None, None) => None,
    };
    if let (Some(c), Some(k)) = (cert_pem, key_pem) {
        id.pair = Some(CertPair::from_pem(&c, &k).map_err(|e| kc_err(path, e))?);
    }
    Ok(id)
}

/// kubelet's `isClientConfigStillValid`: the file exists, reads, names a
/// client certificate, and that certificate has not expired. Problems are
/// logged, not returned: an unusable kubeconfig is one to bootstrap again.
pub fn still_valid(path: &Path) -> bool {
    if !path.exists() {
        return false;
    }
    match identity(path) {
        Ok(Identity { pair: Some(p), .. }) if !p.leaf.expired_at(SystemTime::now()) => true,
        Ok(Identity { pair: Some(_), .. }) => {
            tracing::warn!(kubeconfig = %path.display(), "the client certificate of the kubeconfig has expired");
            false
        }
        Ok(_) => {
            tracing::warn!(kubeconfig = %path.display(), "the kubeconfig names no client certificate");
            false
        }
        Err(e) => {
            tracing::warn!(kubeconfig = %path.display(), error = %e, "unable to read the existing kubeconfig");
            false
        }
    }
}

/// Writes `path`: the bootstrap kubeconfig's server and CA, and the pair
/// file `pem` as both client certificate and key (kubelet's layout), via a
/// temporary file and a rename, mode 0600.
pub fn write_from_bootstrap(bootstrap: &Path, path: &Path, pem: &Path) -> Result<(), CertError> {
    let kc = Kubeconfig::read_from(bootstrap).map_err(|e| kc_err(bootstrap, e))?;
    let cluster = kc
        .current_context
        .as_ref()
        .and_then(|n| kc.contexts.iter().find(|c| &c.name == n))
        .and_then(|c| c.context.as_ref())
        .and_then(|c| kc.clusters.iter().find(|cl| cl.name == c.cluster))
        .and_then(|c| c.cluster.clone())
        .ok_or_else(|| kc_err(bootstrap, "no cluster for the current context"))?;
    let mut cl = serde_json::Map::new();
    if let Some(s) = &cluster.server {
        cl.insert("server".into(), s.clone().into());
    }
    if let Some(ca) = &cluster.certificate_authority {
        cl.insert("certificate-authority".into(), ca.clone().into());
    } else if let Some(d) = &cluster.certificate_authority_data {
        cl.insert("certificate-authority-data".into(), d.clone().into());
    }
    if cluster.insecure_skip_tls_verify == Some(true) {
        cl.insert("insecure-skip-tls-verify".into(), true.into());
    }
    if let Some(n) = &cluster.tls_server_name {
        cl.insert("tls-server-name".into(), n.clone().into());
    }
    let pem = pem.display().to_string();
    let doc = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "default-cluster", "cluster": cl}],
        "users": [{"name": "default-auth", "user": {"client-certificate": pem, "client-key": pem}}],
        "contexts": [{"name": "default-context", "context": {"cluster": "default-cluster", "user": "default-auth", "namespace": "default"}}],
        "current-context": "default-context",
        "preferences": {},
    });
    let text = serde_yaml::to_string(&doc).map_err(|e| kc_err(path, e))?;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| kc_err(path, e))?;
    }
    let tmp = path.with_extension("keelson-tmp");
    {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(|e| kc_err(&tmp, e))?;
        f.write_all(text.as_bytes())
            .and_then(|()| f.sync_all())
            .map_err(|e| kc_err(&tmp, e))?;
    }
    std::fs::rename(&tmp, path).map_err(|e| kc_err(path, e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::certificates::pair::tests::self_signed;

    #[test]
    fn identity_from_files_and_data() {
        let dir = tempfile::tempdir().expect("dir");
        let (c, k) = self_signed("system:node:n1", "system:nodes", 1);
        let cf = dir.path().join("c.pem");
        std::fs::write(&cf, format!("{c}{k}")).expect("w");
        let files = dir.path().join("files.kubeconfig");
        std::fs::write(
            &files,
            "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: 'https://127.0.0.1:6443'}}]\nusers: [{name: u, user: {client-certificate: c.pem, client-key: c.pem}}]\ncontexts: [{name: x, context: {cluster: c, user: u}}]\ncurrent-context: x\n",
        )
        .expect("w");
        let id = identity(&files).expect("identity");
        assert_eq!(
            id.cert_file.as_deref(),
            Some(cf.as_path()),
            "relative paths are made absolute"
        );
        assert!(!id.embedded && id.pair.is_some());
        assert!(still_valid(&files));

        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        let data = dir.path().join("data.kubeconfig");
        std::fs::write(
            &data,
            format!("apiVersion: v1\nkind: Config\nclusters: [{{name: c, cluster: {{server: 'https://127.0.0.1:6443'}}}}]\nusers: [{{name: u, user: {{client-certificate-data: {}, client-key-data: {}}}}}]\ncontexts: [{{name: x, context: {{cluster: c, user: u}}}}]\ncurrent-context: x\n", b64(&c), b64(&k)),
        )
        .expect("w");
        let id = identity(&data).expect("identity");
        assert!(id.embedded);
        assert_eq!(id.pair.expect("pair").leaf.common_name, "system:node:n1");

        let token = dir.path().join("token.kubeconfig");
        std::fs::write(
            &token,
            "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: 'https://127.0.0.1:6443'}}]\nusers: [{name: u, user: {token: abc}}]\ncontexts: [{name: x, context: {cluster: c, user: u}}]\ncurrent-context: x\n",
        )
        .expect("w");
        let id = identity(&token).expect("identity");
        assert!(id.token && id.pair.is_none());
        assert!(!still_valid(&token));
        assert!(!still_valid(&dir.path().join("missing")));
    }

    #[test]
    fn kubeconfig_written_after_bootstrap_points_at_the_pair() {
        let dir = tempfile::tempdir().expect("dir");
        std::fs::write(dir.path().join("ca.crt"), "x").expect("w");
        let boot = dir.path().join("bootstrap.kubeconfig");
        std::fs::write(
            &boot,
            "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: 'https://10.0.0.1:6443', certificate-authority: ca.crt}}]\nusers: [{name: u, user: {token: abcdef.0123456789abcdef}}]\ncontexts: [{name: x, context: {cluster: c, user: u}}]\ncurrent-context: x\n",
        )
        .expect("w");
        let out = dir.path().join("sub/kubelet.conf");
        let pem = dir.path().join("pki/keelson-client-current.pem");
        write_from_bootstrap(&boot, &out, &pem).expect("write");
        let kc = Kubeconfig::read_from(&out).expect("read back");
        let user = current_user(&kc).expect("user");
        assert_eq!(
            user.client_certificate.as_deref(),
            Some(pem.to_str().expect("utf8"))
        );
        assert_eq!(
            user.client_key.as_deref(),
            Some(pem.to_str().expect("utf8"))
        );
        assert!(user.token.is_none());
        let cl = kc.clusters[0].cluster.clone().expect("cluster");
        assert_eq!(cl.server.as_deref(), Some("https://10.0.0.1:6443"));
        let ca = dir.path().join("ca.crt");
        assert_eq!(
            cl.certificate_authority.as_deref(),
            Some(ca.to_str().expect("utf8"))
        );
    }
}
