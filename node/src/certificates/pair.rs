//! A certificate chain and its private key, parsed once: the rustls
//! `CertifiedKey` used on the wire and the leaf's facts the manager needs
//! (validity, subject, names), as Go's `tls.X509KeyPair` + `Leaf`.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::sign::CertifiedKey;
use x509_parser::extensions::GeneralName;

use super::CertError;

/// What the manager reads from the leaf certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leaf {
    /// Start of validity.
    pub not_before: SystemTime,
    /// End of validity.
    pub not_after: SystemTime,
    /// Subject common name.
    pub common_name: String,
    /// Subject organizations.
    pub organizations: Vec<String>,
    /// DNS subject alternative names.
    pub dns_names: Vec<String>,
    /// IP subject alternative names.
    pub ip_addresses: Vec<IpAddr>,
}

impl Leaf {
    /// The whole validity period.
    pub fn lifetime(&self) -> Duration {
        self.not_after
            .duration_since(self.not_before)
            .unwrap_or(Duration::ZERO)
    }

    /// True once `now` is past `not_after`.
    pub fn expired_at(&self, now: SystemTime) -> bool {
        now > self.not_after
    }
}

/// A usable certificate and key.
#[derive(Clone)]
pub struct CertPair {
    /// For rustls (client or server side).
    pub certified: Arc<CertifiedKey>,
    /// The leaf's facts.
    pub leaf: Leaf,
    /// The chain, PEM (as stored).
    pub cert_pem: String,
    /// The key, PEM (as stored).
    pub key_pem: String,
}

impl std::fmt::Debug for CertPair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertPair")
            .field("leaf", &self.leaf)
            .finish_non_exhaustive()
    }
}

impl CertPair {
    /// Parses a chain and a key (both PEM; they may be the same text, as in
    /// the store's combined files).
    pub fn from_pem(cert_pem: &str, key_pem: &str) -> Result<CertPair, CertError> {
        let chain: Vec<CertificateDer<'static>> =
            CertificateDer::pem_slice_iter(cert_pem.as_bytes())
                .collect::<Result<_, _>>()
                .map_err(|e| CertError::Parse(format!("certificate PEM: {e}")))?;
        let Some(first) = chain.first() else {
            return Err(CertError::Parse("no certificate in PEM data".to_string()));
        };
        let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes())
            .map_err(|e| CertError::Parse(format!("private key PEM: {e}")))?;
        let leaf = parse_leaf(first.as_ref())?;
        let signing = rustls::crypto::ring::sign::any_supported_type(&key)
            .map_err(|e| CertError::Parse(format!("private key: {e}")))?;
        let certified = CertifiedKey::new(chain, signing);
        certified
            .keys_match()
            .map_err(|e| CertError::Parse(format!("certificate and key do not match: {e}")))?;
        Ok(CertPair {
            certified: Arc::new(certified),
            leaf,
            cert_pem: only_certificates(cert_pem),
            key_pem: only_key(key_pem),
        })
    }

    /// The chain followed by the key, as one PEM file (upstream's pair file).
    pub fn combined_pem(&self) -> String {
        format!("{}{}", self.cert_pem, self.key_pem)
    }
}

/// Reads the leaf's validity, subject and names.
pub fn parse_leaf(der: &[u8]) -> Result<Leaf, CertError> {
    let (_, cert) = x509_parser::parse_x509_certificate(der)
        .map_err(|e| CertError::Parse(format!("certificate: {e}")))?;
    let to_time = |t: i64| -> SystemTime {
        if t >= 0 {
            SystemTime::UNIX_EPOCH + Duration::from_secs(t as u64)
        } else {
            SystemTime::UNIX_EPOCH
        }
    };
    let v = cert.validity();
    let subject = cert.subject();
    let common_name = subject
        .iter_common_name()
        .next()
        .and_then(|a| a.as_str().ok())
        .unwrap_or_default()
        .to_string();
    let organizations = subject
        .iter_organization()
        .filter_map(|a| a.as_str().ok().map(str::to_string))
        .collect();
    let mut dns_names = Vec::new();
    let mut ip_addresses = Vec::new();
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for name in &san.value.general_names {
            match name {
                GeneralName::DNSName(d) => dns_names.push(d.to_string()),
                GeneralName::IPAddress(b) => match b.len() {
                    4 => {
                        let a: [u8; 4] = [b[0], b[1], b[2], b[3]];
                        ip_addresses.push(IpAddr::from(a));
                    }
                    16 => {
                        let mut a = [0u8; 16];
                        a.copy_from_slice(b);
                        ip_addresses.push(IpAddr::from(a));
                    }
                    _ => {}
                },
                _ => {}
            }
        }
    }
    Ok(Leaf {
        not_before: to_time(v.not_before.timestamp()),
        not_after: to_time(v.not_after.timestamp()),
        common_name,
        organizations,
        dns_names,
        ip_addresses,
    })
}

fn blocks(pem: &str, keep: impl Fn(&str) -> bool) -> String {
    let mut out = String::new();
    let mut inside: Option<bool> = None;
    for line in pem.lines() {
        let t = line.trim();
        if let Some(label) = t.strip_prefix("-----BEGIN ") {
            inside = Some(keep(label.trim_end_matches('-')));
        }
        if inside == Some(true) {
            out.push_str(t);
            out.push('\n');
        }
        if t.starts_with("-----END ") {
            inside = None;
        }
    }
    out
}

fn only_certificates(pem: &str) -> String {
    blocks(pem, |label| label == "CERTIFICATE")
}

fn only_key(pem: &str) -> String {
    blocks(pem, |label| label.ends_with("PRIVATE KEY"))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use rcgen::{CertificateParams, DistinguishedName, DnType, KeyPair, SanType};

    /// A self-signed pair for tests: (cert PEM, key PEM).
    pub(crate) fn self_signed(cn: &str, org: &str, days: i64) -> (String, String) {
        let key = KeyPair::generate().expect("key");
        let mut p = CertificateParams::new(vec!["node-1".to_string()]).expect("params");
        p.subject_alt_names
            .push(SanType::IpAddress("10.0.0.5".parse().expect("ip")));
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, cn);
        dn.push(DnType::OrganizationName, org);
        p.distinguished_name = dn;
        let now = time::OffsetDateTime::now_utc();
        p.not_before = now - time::Duration::hours(1);
        p.not_after = now + time::Duration::days(days);
        let cert = p.self_signed(&key).expect("sign");
        (cert.pem(), key.serialize_pem())
    }

    #[test]
    fn pair_is_parsed_with_its_leaf() {
        let (c, k) = self_signed("system:node:n1", "system:nodes", 2);
        let pair = CertPair::from_pem(&c, &k).expect("pair");
        assert_eq!(pair.leaf.common_name, "system:node:n1");
        assert_eq!(pair.leaf.organizations, ["system:nodes"]);
        assert_eq!(pair.leaf.dns_names, ["node-1"]);
        assert_eq!(
            pair.leaf.ip_addresses,
            ["10.0.0.5".parse::<IpAddr>().expect("ip")]
        );
        let life = pair.leaf.lifetime().as_secs();
        assert!((2 * 86400..2 * 86400 + 3700).contains(&life), "{life}");
        // The combined file parses back to the same pair.
        let combined = pair.combined_pem();
        let again = CertPair::from_pem(&combined, &combined).expect("combined");
        assert_eq!(again.leaf, pair.leaf);
    }

    #[test]
    fn mismatched_key_is_refused() {
        let (c, _) = self_signed("a", "b", 1);
        let (_, k) = self_signed("a", "b", 1);
        let err = CertPair::from_pem(&c, &k).expect_err("mismatch");
        assert!(err.to_string().contains("do not match"), "{err}");
    }
}
