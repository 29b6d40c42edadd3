//! The settings of the node role's HTTPS API (kubelet's server on :10250):
//! `authentication`, `authorization` and the TLS names, with
//! KubeletConfiguration's field names and defaults
//! (`staging/src/k8s.io/kubelet/config/v1beta1/types.go`,
//! `pkg/kubelet/apis/config/v1beta1/defaults.go`), and their validation
//! (`pkg/kubelet/apis/config/validation/validation.go`,
//! `cmd/kubelet/app/auth.go`).

use serde::{Deserialize, Serialize};

use super::FieldError;
use super::duration::KubeDuration;

/// `authentication`: who may call the API.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct KubeletAuthentication {
    /// Client certificates.
    pub x509: X509Authentication,
    /// Bearer tokens checked with TokenReview.
    pub webhook: WebhookAuthentication,
    /// Requests no other method authenticates.
    pub anonymous: AnonymousAuthentication,
}

/// `authentication.x509`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct X509Authentication {
    /// PEM bundle of the CAs whose client certificates authenticate
    /// (user = CommonName, groups = Organization). Re-read when it changes.
    #[serde(rename = "clientCAFile")]
    pub client_ca_file: Option<std::path::PathBuf>,
}

/// `authentication.webhook`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct WebhookAuthentication {
    /// Check bearer tokens with the TokenReview API (default true).
    pub enabled: bool,
    /// How long TokenReview answers are kept (default 2m).
    #[serde(rename = "cacheTTL")]
    pub cache_ttl: KubeDuration,
}

impl Default for WebhookAuthentication {
    fn default() -> Self {
        WebhookAuthentication {
            enabled: true,
            cache_ttl: KubeDuration::from_secs(120),
        }
    }
}

/// `authentication.anonymous`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct AnonymousAuthentication {
    /// Requests without credentials are `system:anonymous` in
    /// `system:unauthenticated` (default false: they get 401).
    pub enabled: bool,
}

/// `authorization.mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub enum AuthorizationMode {
    /// SubjectAccessReview for every request (kubelet's default).
    #[default]
    Webhook,
    /// Every authenticated request is allowed.
    AlwaysAllow,
}

/// `authorization`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct KubeletAuthorization {
    /// `Webhook` or `AlwaysAllow`.
    pub mode: AuthorizationMode,
    /// Cache settings of the webhook mode.
    pub webhook: WebhookAuthorization,
}

/// `authorization.webhook`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct WebhookAuthorization {
    /// How long an "allowed" answer is kept (default 5m).
    #[serde(rename = "cacheAuthorizedTTL")]
    pub cache_authorized_ttl: KubeDuration,
    /// How long a "denied" answer is kept (default 30s).
    #[serde(rename = "cacheUnauthorizedTTL")]
    pub cache_unauthorized_ttl: KubeDuration,
}

impl Default for WebhookAuthorization {
    fn default() -> Self {
        WebhookAuthorization {
            cache_authorized_ttl: KubeDuration::from_secs(300),
            cache_unauthorized_ttl: KubeDuration::from_secs(30),
        }
    }
}

/// A TLS protocol version keelson can offer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsVersion {
    /// TLS 1.2.
    Tls12,
    /// TLS 1.3.
    Tls13,
}

/// Reads `tlsMinVersion` (Go's names, as kubelet's `cliflag.TLSVersion`):
/// empty is the default (TLS 1.2, Go's server default). TLS 1.0 and 1.1
/// are refused: the TLS library keelson uses does not implement them.
pub fn parse_tls_min_version(name: &str) -> Result<TlsVersion, TlsSettingError> {
    match name {
        "" | "VersionTLS12" => Ok(TlsVersion::Tls12),
        "VersionTLS13" => Ok(TlsVersion::Tls13),
        "VersionTLS10" | "VersionTLS11" => Err(TlsSettingError::OldVersion(name.to_string())),
        other => Err(TlsSettingError::UnknownVersion(other.to_string())),
    }
}

/// Why `tlsMinVersion` or `tlsCipherSuites` is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TlsSettingError {
    /// TLS 1.0 or 1.1.
    #[error(
        "{0} is not supported: keelson serves TLS 1.2 and 1.3 only (use VersionTLS12 or VersionTLS13)"
    )]
    OldVersion(String),
    /// Not one of Go's version names.
    #[error("unknown tls version {0:?} (allowed: VersionTLS12, VersionTLS13)")]
    UnknownVersion(String),
    /// Suites keelson cannot offer, each with why.
    #[error("{}", .0.join("; "))]
    CipherSuites(Vec<String>),
}

/// The TLS 1.2 cipher suites keelson can offer, by Go's name (the names
/// `tlsCipherSuites` takes). TLS 1.3 suites are always on and not
/// configurable (as in Go); their names are accepted and have no effect.
pub const TLS12_SUITES: &[&str] = &[
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256",
];

/// TLS 1.3 suite names Go accepts in the list (and ignores).
pub const TLS13_SUITES: &[&str] = &[
    "TLS_AES_128_GCM_SHA256",
    "TLS_AES_256_GCM_SHA384",
    "TLS_CHACHA20_POLY1305_SHA256",
];

/// Go suite names kubelet accepts that keelson cannot offer (CBC, RSA key
/// exchange, RC4, 3DES): refused with a message naming them.
const UNSUPPORTED_GO_SUITES: &[&str] = &[
    "TLS_RSA_WITH_AES_128_CBC_SHA",
    "TLS_RSA_WITH_AES_256_CBC_SHA",
    "TLS_RSA_WITH_AES_128_GCM_SHA256",
    "TLS_RSA_WITH_AES_256_GCM_SHA384",
    "TLS_RSA_WITH_AES_128_CBC_SHA256",
    "TLS_RSA_WITH_3DES_EDE_CBC_SHA",
    "TLS_RSA_WITH_RC4_128_SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA256",
    "TLS_ECDHE_ECDSA_WITH_RC4_128_SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA256",
    "TLS_ECDHE_RSA_WITH_3DES_EDE_CBC_SHA",
    "TLS_ECDHE_RSA_WITH_RC4_128_SHA",
];

/// Checks `tlsCipherSuites`: every name must be one Go knows; CBC/RSA/RC4
/// suites are refused (not implemented by keelson's TLS library).
pub fn check_cipher_suites(names: &[String]) -> Result<(), TlsSettingError> {
    let mut bad = Vec::new();
    for n in names {
        if TLS12_SUITES.contains(&n.as_str()) || TLS13_SUITES.contains(&n.as_str()) {
            continue;
        }
        if UNSUPPORTED_GO_SUITES.contains(&n.as_str()) {
            bad.push(format!("{n} (not offered by keelson: CBC, RSA key exchange, RC4 and 3DES suites are not implemented)"));
        } else {
            bad.push(format!("{n} (unknown cipher suite)"));
        }
    }
    if bad.is_empty() {
        Ok(())
    } else {
        Err(TlsSettingError::CipherSuites(bad))
    }
}

/// Validates the API's settings of `node:` (paths relative to `node.`).
pub fn validate(n: &super::NodeConfig, errs: &mut Vec<FieldError>) {
    let port_ok = |p: i32| (1..=65535).contains(&p);
    if !port_ok(n.port) {
        errs.push(FieldError::new(
            "node.port",
            format!("{} must be between 1 and 65535, inclusive", n.port),
        ));
    }
    if n.read_only_port != 0 && !port_ok(n.read_only_port) {
        errs.push(FieldError::new(
            "node.readOnlyPort",
            format!(
                "{} must be between 0 and 65535, inclusive",
                n.read_only_port
            ),
        ));
    }
    if n.address.parse::<std::net::IpAddr>().is_err() {
        errs.push(FieldError::new(
            "node.address",
            format!("{:?} is not an IP address", n.address),
        ));
    }
    if n.tls_cert_file.is_some() != n.tls_private_key_file.is_some() {
        errs.push(FieldError::new(
            "node.tlsCertFile",
            "tlsCertFile and tlsPrivateKeyFile must be set together",
        ));
    }
    if let Err(e) = parse_tls_min_version(&n.tls_min_version) {
        errs.push(FieldError::new("node.tlsMinVersion", e));
    }
    if let Err(e) = check_cipher_suites(&n.tls_cipher_suites) {
        errs.push(FieldError::new("node.tlsCipherSuites", e));
    }
    if !n.tls_cipher_suites.is_empty()
        && !n
            .tls_cipher_suites
            .iter()
            .any(|s| TLS12_SUITES.contains(&s.as_str()))
        && parse_tls_min_version(&n.tls_min_version).ok() == Some(TlsVersion::Tls12)
    {
        errs.push(FieldError::new(
            "node.tlsCipherSuites",
            "names no TLS 1.2 suite: TLS 1.2 clients could not connect (set tlsMinVersion: VersionTLS13 instead)",
        ));
    }
    if n.container_log_max_files <= 1 {
        errs.push(FieldError::new(
            "node.containerLogMaxFiles",
            format!("{} must be greater than 1", n.container_log_max_files),
        ));
    }
    if n.container_log_max_workers < 1 {
        errs.push(FieldError::new(
            "node.containerLogMaxWorkers",
            format!(
                "{} must be greater than or equal to 1",
                n.container_log_max_workers
            ),
        ));
    }
    if n.container_log_monitor_interval.get() < std::time::Duration::from_secs(3) {
        errs.push(FieldError::new(
            "node.containerLogMonitorInterval",
            "must be a positive time duration greater than or equal to 3s",
        ));
    }
    if n.housekeeping_interval.get() < crate::stats::cpu_rate::MIN_RATE_WINDOW {
        errs.push(FieldError::new(
            "node.housekeepingInterval",
            "must be at least 1s (CPU rates are taken between samples at least 1s apart)",
        ));
    }
    if n.volume_stats_agg_period.get().is_zero() {
        errs.push(FieldError::new(
            "node.volumeStatsAggPeriod",
            "must be a positive duration such as \"1m\" (kubelet's default)",
        ));
    }
    match keelson_common::quantity::Quantity::parse(&n.container_log_max_size) {
        Ok(q) if i64::try_from(q.value()).is_err() => errs.push(FieldError::new(
            "node.containerLogMaxSize",
            "invalid max log size",
        )),
        Ok(_) => {}
        Err(e) => errs.push(FieldError::new(
            "node.containerLogMaxSize",
            format!("{:?}: {e}", n.container_log_max_size),
        )),
    }
}

/// `containerLogMaxSize` in bytes (validated at load); negative disables
/// rotation, as kubelet's log manager.
pub fn container_log_max_size_bytes(text: &str) -> i64 {
    keelson_common::quantity::Quantity::parse(text)
        .ok()
        .and_then(|q| i64::try_from(q.value()).ok())
        .unwrap_or(10 * 1024 * 1024)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn tls_versions_follow_go_names() {
        assert_eq!(parse_tls_min_version("").ok(), Some(TlsVersion::Tls12));
        assert_eq!(
            parse_tls_min_version("VersionTLS13").ok(),
            Some(TlsVersion::Tls13)
        );
        assert!(
            parse_tls_min_version("VersionTLS10")
                .unwrap_err()
                .to_string()
                .contains("not supported")
        );
        assert!(
            parse_tls_min_version("TLS12")
                .unwrap_err()
                .to_string()
                .contains("unknown")
        );
    }

    #[test]
    fn cipher_suites_name_what_is_refused() {
        assert!(check_cipher_suites(&["TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256".into()]).is_ok());
        assert!(check_cipher_suites(&["TLS_AES_128_GCM_SHA256".into()]).is_ok());
        let e = check_cipher_suites(&["TLS_RSA_WITH_AES_128_CBC_SHA".into(), "NOPE".into()])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("TLS_RSA_WITH_AES_128_CBC_SHA (not offered"),
            "{e}"
        );
        assert!(e.contains("NOPE (unknown"), "{e}");
    }
}
