//! Who is calling, as kube-apiserver's authenticators say: a static or
//! service account token, else the TLS client certificate (x509
//! authenticator: user = CN, groups = O, checked against the CA at the
//! handshake and for expiry on every request, so a connection opened with
//! a certificate that has since expired gets 401), else anonymous.

use std::time::{Duration, SystemTime};

use http::HeaderMap;

use super::error::ApiError;
use super::state::ApiState;

/// An authenticated user and its groups (what CertificateSigningRequests
/// record in `spec.username` / `spec.groups`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserInfo {
    /// User name.
    pub name: String,
    /// Groups, `system:authenticated` included for authenticated users.
    pub groups: Vec<String>,
}

impl UserInfo {
    fn anonymous() -> UserInfo {
        UserInfo {
            name: "system:anonymous".into(),
            groups: vec!["system:unauthenticated".into()],
        }
    }
}

/// The identity a TLS client certificate proves.
#[derive(Debug, Clone)]
pub struct PeerCert {
    /// CN and O.
    pub user: UserInfo,
    /// End of validity.
    pub not_after: SystemTime,
}

/// Reads CN, O and the end of validity of a client certificate the TLS
/// layer verified against the CA.
pub fn peer_cert(der: &[u8]) -> Option<PeerCert> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let name = cert
        .subject()
        .iter_common_name()
        .next()
        .and_then(|a| a.as_str().ok())?
        .to_string();
    let mut groups: Vec<String> = cert
        .subject()
        .iter_organization()
        .filter_map(|a| a.as_str().ok().map(str::to_string))
        .collect();
    groups.push("system:authenticated".into());
    let ts = cert.validity().not_after.timestamp();
    let not_after = SystemTime::UNIX_EPOCH + Duration::from_secs(u64::try_from(ts).unwrap_or(0));
    Some(PeerCert {
        user: UserInfo { name, groups },
        not_after,
    })
}

/// Groups of a token user, as upstream's authenticators give them: nodes
/// (`system:nodes`), bootstrap tokens (`system:bootstrappers`, and kubeadm's
/// `system:bootstrappers:kubeadm:default-node-token`), service accounts
/// (`system:serviceaccounts`, `system:serviceaccounts:<ns>`).
pub fn token_groups(user: &str) -> Vec<String> {
    let mut g = Vec::new();
    if user.starts_with("system:node:") {
        g.push("system:nodes".to_string());
    } else if user.starts_with("system:bootstrap:") {
        g.push("system:bootstrappers".to_string());
        g.push("system:bootstrappers:kubeadm:default-node-token".to_string());
    } else if let Some(rest) = user.strip_prefix("system:serviceaccount:") {
        g.push("system:serviceaccounts".to_string());
        if let Some((ns, _)) = rest.split_once(':') {
            g.push(format!("system:serviceaccounts:{ns}"));
        }
    }
    g.push("system:authenticated".to_string());
    g
}

fn header(headers: &HeaderMap, name: http::header::HeaderName) -> String {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string()
}

/// Who is calling: a bearer token, else the TLS client certificate, else
/// anonymous; 401 when tokens are configured and none of these proves who,
/// and for a client certificate that has expired.
pub fn authenticate(
    state: &ApiState,
    headers: &HeaderMap,
    path: &str,
    peer: Option<&PeerCert>,
) -> Result<UserInfo, ApiError> {
    let bearer = header(headers, http::header::AUTHORIZATION);
    let token = bearer
        .strip_prefix("Bearer ")
        .map(str::trim)
        .unwrap_or_default();
    if !token.is_empty() {
        if let Some((_, user)) = state.config.tokens.iter().find(|(t, _)| t == token) {
            return Ok(UserInfo {
                name: user.clone(),
                groups: token_groups(user),
            });
        }
        if let Some(id) = state.signer.authenticate(token) {
            return Ok(UserInfo {
                groups: token_groups(&id.user),
                name: id.user,
            });
        }
        if !state.config.tokens.is_empty() {
            return Err(ApiError::unauthorized());
        }
    }
    if let Some(p) = peer {
        if SystemTime::now() > p.not_after {
            // x509: certificate has expired or is not yet valid.
            return Err(ApiError::unauthorized());
        }
        return Ok(p.user.clone());
    }
    if state.config.tokens.is_empty() {
        return Ok(UserInfo::anonymous());
    }
    // Public endpoints stay reachable without credentials, as upstream's
    // system:public-info-viewer and service-account-issuer-discovery roles allow.
    let public = matches!(
        path,
        "/version" | "/.well-known/openid-configuration" | "/openid/v1/jwks"
    ) || ["/healthz", "/livez", "/readyz"]
        .iter()
        .any(|p| path.starts_with(p));
    if public {
        Ok(UserInfo::anonymous())
    } else {
        Err(ApiError::unauthorized())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_users_get_upstream_groups() {
        assert_eq!(
            token_groups("system:node:n1"),
            ["system:nodes", "system:authenticated"]
        );
        assert!(
            token_groups("system:bootstrap:abcdef").contains(&"system:bootstrappers".to_string())
        );
        assert_eq!(
            token_groups("system:serviceaccount:kube-system:x"),
            [
                "system:serviceaccounts",
                "system:serviceaccounts:kube-system",
                "system:authenticated"
            ]
        );
    }
}
