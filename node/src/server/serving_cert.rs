//! The node API's serving certificate, swappable while the server runs.
//!
//! [`ServingCertificate`] is rustls' certificate resolver: every TLS
//! handshake reads the current [`CertifiedKey`], so a new certificate (a
//! re-read `tlsCertFile`, or one the certificate manager obtained through a
//! `kubernetes.io/kubelet-serving` CSR) takes effect on the next connection
//! without a restart; open connections keep theirs. kubelet does the same
//! with `tls.Config.GetCertificate` (`pkg/kubelet/kubelet.go`, the
//! `ReloadKubeletServerCertificateFile` dynamic file manager of
//! `pkg/kubelet/certificate/kubelet.go`).
//!
//! ```
//! # fn demo(cert_pem: &[u8], key_pem: &[u8]) -> Result<(), keelson_node::server::ServerError> {
//! use keelson_node::server::ServingCertificate;
//! let serving = ServingCertificate::new();
//! serving.set_pem(cert_pem, key_pem)?;   // e.g. after a CSR was issued
//! # Ok(()) }
//! ```

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio_util::sync::CancellationToken;

use super::ServerError;

/// The certificate the node API serves; cheap to share, swappable.
#[derive(Default)]
pub struct ServingCertificate {
    current: RwLock<Option<Arc<CertifiedKey>>>,
    /// With `serverTLSBootstrap`: the certificate manager's slot, read at
    /// every handshake (an expired certificate is not served, as
    /// client-go's `Current()` returns none).
    managed: RwLock<Option<Arc<crate::certificates::CurrentCert>>>,
}

impl std::fmt::Debug for ServingCertificate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServingCertificate")
            .field("set", &self.current().is_some())
            .finish()
    }
}

impl ServingCertificate {
    /// An empty one: handshakes fail until a certificate is set (kubelet:
    /// "no serving certificate available for the kubelet").
    pub fn new() -> Arc<Self> {
        Arc::new(ServingCertificate::default())
    }

    /// Serves `key` from the next handshake on.
    pub fn set(&self, key: Arc<CertifiedKey>) {
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = Some(key);
    }

    /// Parses a PEM certificate chain (leaf first) and its private key and
    /// serves them; refuses a key that does not match the certificate.
    pub fn set_pem(&self, cert_pem: &[u8], key_pem: &[u8]) -> Result<(), ServerError> {
        self.set(Arc::new(certified_key_from_pem(cert_pem, key_pem)?));
        Ok(())
    }

    /// Serves whatever the certificate manager holds in `slot` from now on
    /// (`serverTLSBootstrap`); [`ServingCertificate::set`] no longer applies.
    pub fn follow(&self, slot: Arc<crate::certificates::CurrentCert>) {
        *self.managed.write().unwrap_or_else(|p| p.into_inner()) = Some(slot);
    }

    /// The certificate served now.
    pub fn current(&self) -> Option<Arc<CertifiedKey>> {
        if let Some(slot) = self
            .managed
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
        {
            return slot.get().map(|p| p.certified);
        }
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

impl ResolvesServerCert for ServingCertificate {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let key = self.current();
        if key.is_none() {
            // Go's server logs each such handshake ("http: TLS handshake
            // error ...: no serving certificate available for the kubelet").
            tracing::warn!(
                "node API: TLS handshake refused: no serving certificate available for the kubelet"
            );
        }
        key
    }
}

/// A [`CertifiedKey`] from PEM text.
pub fn certified_key_from_pem(
    cert_pem: &[u8],
    key_pem: &[u8],
) -> Result<CertifiedKey, ServerError> {
    let chain: Vec<CertificateDer<'static>> = rustls_pemfile::certs(&mut &cert_pem[..])
        .collect::<Result<_, _>>()
        .map_err(|e| ServerError::Certificate(format!("reading certificates: {e}")))?;
    if chain.is_empty() {
        return Err(ServerError::Certificate(
            "no CERTIFICATE block in the certificate file".into(),
        ));
    }
    let key: PrivateKeyDer<'static> = rustls_pemfile::private_key(&mut &key_pem[..])
        .map_err(|e| ServerError::Certificate(format!("reading the private key: {e}")))?
        .ok_or_else(|| ServerError::Certificate("no private key in the key file".into()))?;
    let provider = rustls::crypto::ring::default_provider();
    CertifiedKey::from_der(chain, key, &provider)
        .map_err(|e| ServerError::Certificate(format!("certificate and key: {e}")))
}

/// `rootDir/pki/kubelet.crt` and `kubelet.key`, kubelet's `--cert-dir`
/// names for its self-signed certificate.
pub fn self_signed_paths(root_dir: &Path) -> (PathBuf, PathBuf) {
    let pki = root_dir.join("pki");
    (pki.join("kubelet.crt"), pki.join("kubelet.key"))
}

/// Makes the self-signed serving certificate kubelet makes when neither
/// `tlsCertFile` nor `serverTLSBootstrap` is set
/// (`cmd/kubelet/app/server.go` `InitializeTLS`, client-go's
/// `GenerateSelfSignedCertKey`): a CA `<host>-ca@<unix time>` and a
/// serving certificate `<host>@<unix time>` signed by it, valid one year,
/// the file holding the serving certificate then the CA. SANs: the node
/// name, the host name and the node's addresses (kubelet puts only the
/// host name; the addresses let an API server reaching the node by IP
/// check the name once it trusts this CA). Returns (cert PEM, key PEM).
pub fn generate_self_signed(
    names: &[String],
    ips: &[std::net::IpAddr],
) -> Result<(String, String), ServerError> {
    use rcgen::{
        BasicConstraints, CertificateParams, DistinguishedName, DnType, IsCa, Issuer, KeyPair,
        KeyUsagePurpose, SanType,
    };
    let err = |e: rcgen::Error| ServerError::Certificate(format!("generating: {e}"));
    let host = names.first().cloned().unwrap_or_else(|| "localhost".into());
    let now = std::time::SystemTime::now();
    let stamp = now
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    let not_before = rcgen::date_time_ymd(1970, 1, 1);
    let one_year = time_plus(now, Duration::from_secs(365 * 24 * 3600));
    let ca_key = KeyPair::generate().map_err(err)?;
    let mut ca = CertificateParams::new(Vec::<String>::new()).map_err(err)?;
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, format!("{host}-ca@{stamp}"));
    ca.distinguished_name = dn;
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    ca.not_before = time_minus(now, Duration::from_secs(3600)).unwrap_or(not_before);
    ca.not_after = one_year;
    let ca_cert = ca.self_signed(&ca_key).map_err(err)?;
    let issuer = Issuer::new(ca, ca_key);

    let key = KeyPair::generate().map_err(err)?;
    let mut leaf = CertificateParams::new(Vec::<String>::new()).map_err(err)?;
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, format!("{host}@{stamp}"));
    leaf.distinguished_name = dn;
    for n in names {
        if let Ok(ia5) = n.clone().try_into() {
            let san = SanType::DnsName(ia5);
            if !leaf.subject_alt_names.contains(&san) {
                leaf.subject_alt_names.push(san);
            }
        }
    }
    for ip in ips {
        leaf.subject_alt_names.push(SanType::IpAddress(*ip));
    }
    leaf.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    leaf.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    leaf.not_before = time_minus(now, Duration::from_secs(3600)).unwrap_or(not_before);
    leaf.not_after = one_year;
    let cert = leaf.signed_by(&key, &issuer).map_err(err)?;
    Ok((
        format!("{}{}", cert.pem(), ca_cert.pem()),
        key.serialize_pem(),
    ))
}

fn time_plus(t: std::time::SystemTime, d: Duration) -> time::OffsetDateTime {
    time::OffsetDateTime::from(t + d)
}

fn time_minus(t: std::time::SystemTime, d: Duration) -> Option<time::OffsetDateTime> {
    t.checked_sub(d).map(time::OffsetDateTime::from)
}

/// Loads the serving certificate the configuration asks for: the files
/// when `tlsCertFile`/`tlsPrivateKeyFile` are set, else the self-signed
/// pair under `rootDir/pki/`, made (mode 0600 key) when absent or
/// unreadable, as kubelet does. Returns the files used.
pub fn load_configured(
    serving: &ServingCertificate,
    cert_file: Option<&Path>,
    key_file: Option<&Path>,
    root_dir: &Path,
    names: &[String],
    ips: &[std::net::IpAddr],
) -> Result<(PathBuf, PathBuf), ServerError> {
    let (cert, key) = match (cert_file, key_file) {
        (Some(c), Some(k)) => (c.to_path_buf(), k.to_path_buf()),
        _ => {
            let (c, k) = self_signed_paths(root_dir);
            let readable = std::fs::read(&c)
                .ok()
                .zip(std::fs::read(&k).ok())
                .is_some_and(|(c, k)| certified_key_from_pem(&c, &k).is_ok());
            if !readable {
                let (cert_pem, key_pem) = generate_self_signed(names, ips)?;
                write_private(&c, cert_pem.as_bytes(), 0o644)?;
                write_private(&k, key_pem.as_bytes(), 0o600)?;
                tracing::info!(cert = %c.display(), "made a self-signed serving certificate for the node API");
            }
            (c, k)
        }
    };
    let read = |p: &Path| {
        std::fs::read(p).map_err(|e| ServerError::Certificate(format!("{}: {e}", p.display())))
    };
    serving
        .set_pem(&read(&cert)?, &read(&key)?)
        .map_err(|e| match e {
            ServerError::Certificate(m) => {
                ServerError::Certificate(format!("{} / {}: {m}", cert.display(), key.display()))
            }
            other => other,
        })?;
    Ok((cert, key))
}

fn write_private(path: &Path, content: &[u8], mode: u32) -> Result<(), ServerError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let io = |e: std::io::Error| ServerError::Certificate(format!("{}: {e}", path.display()));
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(io)?;
    }
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(&tmp)
        .map_err(io)?;
    f.write_all(content).map_err(io)?;
    f.sync_all().map_err(io)?;
    std::fs::rename(&tmp, path).map_err(io)
}

/// Re-reads `cert`/`key` every `period` and serves them when their
/// content changed and parses (a half-written pair is kept out until it is
/// whole), as kubelet's dynamic file manager does.
pub async fn reload_files(
    serving: Arc<ServingCertificate>,
    cert: PathBuf,
    key: PathBuf,
    period: Duration,
    stop: CancellationToken,
) {
    let mut last = (std::fs::read(&cert).ok(), std::fs::read(&key).ok());
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(period) => {}
        }
        let now = (std::fs::read(&cert).ok(), std::fs::read(&key).ok());
        if now == last {
            continue;
        }
        if let (Some(c), Some(k)) = (&now.0, &now.1) {
            match serving.set_pem(c, k) {
                Ok(()) => {
                    tracing::info!(cert = %cert.display(), "serving certificate reloaded");
                    last = now;
                }
                Err(e) => {
                    tracing::warn!(cert = %cert.display(), error = %e, "invalid serving certificate and key pair; keeping the previous one")
                }
            }
        }
    }
}
