//! CertificateSigningRequests as client-go makes and follows them
//! (`staging/src/k8s.io/client-go/util/certificate/csr/csr.go`): an ECDSA
//! P-256 key (as the certificate manager's `generateCSR`), a PKCS#10
//! request from a template, a `certificates.k8s.io/v1` object with the
//! signer and usages, then a watch on that one object
//! (`fieldSelector=metadata.name=<name>`) until it is issued, denied or
//! failed.

use std::net::IpAddr;
use std::time::Duration;

use base64::Engine;
use futures::StreamExt;
use k8s_openapi::ByteString;
use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestSpec,
};
use kube::api::{Api, PostParams};
use kube::runtime::watcher;
use rcgen::{CertificateParams, DistinguishedName, DnType, KeyPair, PublicKeyData, SanType};
use sha2::Digest;

use super::CertError;

/// `kubernetes.io/kube-apiserver-client-kubelet`: the node's client certificate.
pub const KUBELET_CLIENT_SIGNER: &str = "kubernetes.io/kube-apiserver-client-kubelet";
/// `kubernetes.io/kubelet-serving`: the node's :10250 serving certificate.
pub const KUBELET_SERVING_SIGNER: &str = "kubernetes.io/kubelet-serving";

/// What a certificate is requested for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    /// Subject CN.
    pub common_name: String,
    /// Subject O.
    pub organizations: Vec<String>,
    /// DNS SANs.
    pub dns_names: Vec<String>,
    /// IP SANs.
    pub ip_addresses: Vec<IpAddr>,
}

impl Template {
    /// kubelet's client template: `system:node:<name>` in `system:nodes`.
    pub fn node_client(node: &str) -> Template {
        Template {
            common_name: format!("system:node:{node}"),
            organizations: vec!["system:nodes".to_string()],
            dns_names: Vec::new(),
            ip_addresses: Vec::new(),
        }
    }

    /// kubelet's serving template: the same subject, the node's host names
    /// and addresses as SANs (`pkg/kubelet/certificate/kubelet.go` `newGetTemplateFn`).
    pub fn node_serving(node: &str, dns_names: Vec<String>, ip_addresses: Vec<IpAddr>) -> Template {
        Template {
            dns_names,
            ip_addresses,
            ..Template::node_client(node)
        }
    }
}

/// A fresh key and the request made with it.
pub struct Request {
    /// The key, PEM (PKCS#8).
    pub key_pem: String,
    /// The PKCS#10 request, PEM.
    pub csr_pem: String,
    /// SubjectPublicKeyInfo, DER (names the request; checks a reused one).
    pub public_key_der: Vec<u8>,
}

/// Generates an ECDSA P-256 key and a request for `template`.
pub fn generate(template: &Template) -> Result<Request, CertError> {
    let key = KeyPair::generate().map_err(|e| CertError::Csr(format!("generating a key: {e}")))?;
    let mut params = CertificateParams::new(template.dns_names.clone())
        .map_err(|e| CertError::Csr(format!("request template: {e}")))?;
    for ip in &template.ip_addresses {
        params.subject_alt_names.push(SanType::IpAddress(*ip));
    }
    let mut dn = DistinguishedName::new();
    for o in &template.organizations {
        dn.push(DnType::OrganizationName, o.as_str());
    }
    dn.push(DnType::CommonName, template.common_name.as_str());
    params.distinguished_name = dn;
    let csr = params
        .serialize_request(&key)
        .and_then(|r| r.pem())
        .map_err(|e| CertError::Csr(format!("making the request: {e}")))?;
    Ok(Request {
        key_pem: key.serialize_pem(),
        csr_pem: csr,
        public_key_der: key.subject_public_key_info(),
    })
}

/// kubelet's usages for an ECDSA key: `digital signature` plus `client
/// auth` or `server auth` (`key encipherment` is only added for RSA keys,
/// which keelson never makes).
pub fn usages(signer: &str) -> Vec<String> {
    let purpose = if signer == KUBELET_SERVING_SIGNER {
        "server auth"
    } else {
        "client auth"
    };
    vec!["digital signature".to_string(), purpose.to_string()]
}

/// The bootstrap request's name, as kubelet's `digestedName`: SHA-512/256
/// over base64url(public key) | CN | each O | each usage, so a restart
/// while waiting finds its own request again.
pub fn digested_name(public_key_der: &[u8], template: &Template, usages: &[String]) -> String {
    let enc = |d: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(d);
    let mut h = sha2::Sha512_256::new();
    let mut write = |d: &[u8]| {
        h.update(enc(d).as_bytes());
        h.update(b"|");
    };
    write(public_key_der);
    write(template.common_name.as_bytes());
    for o in &template.organizations {
        write(o.as_bytes());
    }
    for u in usages {
        write(u.as_bytes());
    }
    format!("node-csr-{}", enc(&h.finalize()))
}

/// The object created for a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Submitted {
    /// `metadata.name`.
    pub name: String,
    /// `metadata.uid`.
    pub uid: String,
}

/// Creates the CertificateSigningRequest (`generateName: csr-` unless a
/// name is given). With a name that already exists, the existing object is
/// reused when it asks for the same key, signer and usages (a restart while
/// waiting for approval), as client-go's `RequestCertificate`.
pub async fn submit(
    client: &kube::Client,
    request: &Request,
    name: Option<&str>,
    signer: &str,
    usages: &[String],
    expiration: Option<Duration>,
) -> Result<Submitted, CertError> {
    let api: Api<CertificateSigningRequest> = Api::all(client.clone());
    let mut csr = CertificateSigningRequest {
        spec: CertificateSigningRequestSpec {
            request: ByteString(request.csr_pem.as_bytes().to_vec()),
            signer_name: signer.to_string(),
            usages: Some(usages.to_vec()),
            expiration_seconds: expiration.map(|d| i32::try_from(d.as_secs()).unwrap_or(i32::MAX)),
            ..Default::default()
        },
        ..Default::default()
    };
    match name {
        Some(n) => csr.metadata.name = Some(n.to_string()),
        None => csr.metadata.generate_name = Some("csr-".to_string()),
    }
    let created = match api.create(&PostParams::default(), &csr).await {
        Ok(c) => c,
        Err(kube::Error::Api(s)) if s.code == 409 && name.is_some() => {
            let n = name.unwrap_or_default();
            let existing = api.get(n).await.map_err(|e| {
                CertError::Api(format!("cannot retrieve certificate signing request: {e}"))
            })?;
            ensure_compatible(&existing, request, signer, usages)?;
            tracing::info!(
                csr = n,
                "certificate signing request for this key already exists, reusing it"
            );
            existing
        }
        Err(e) => {
            return Err(CertError::Api(format!(
                "cannot create certificate signing request: {e}"
            )));
        }
    };
    let name = created.metadata.name.clone().unwrap_or_default();
    let uid = created.metadata.uid.clone().unwrap_or_default();
    Ok(Submitted { name, uid })
}

fn ensure_compatible(
    existing: &CertificateSigningRequest,
    request: &Request,
    signer: &str,
    usages: &[String],
) -> Result<(), CertError> {
    use rustls::pki_types::pem::PemObject;
    use x509_parser::prelude::FromDer;
    let der =
        rustls::pki_types::CertificateSigningRequestDer::from_pem_slice(&existing.spec.request.0)
            .map_err(|e| {
            CertError::Csr(format!(
                "retrieved csr is not compatible: cannot read its request: {e}"
            ))
        })?;
    let (_, parsed) =
        x509_parser::certification_request::X509CertificationRequest::from_der(der.as_ref())
            .map_err(|e| CertError::Csr(format!("retrieved csr is not compatible: {e}")))?;
    if parsed.certification_request_info.subject_pki.raw != request.public_key_der.as_slice() {
        return Err(CertError::Csr(
            "retrieved csr is not compatible: public key does not match".into(),
        ));
    }
    if existing.spec.signer_name != signer {
        return Err(CertError::Csr(format!(
            "retrieved csr is not compatible: signer {:?}, want {signer:?}",
            existing.spec.signer_name
        )));
    }
    if existing.spec.usages.as_deref().unwrap_or_default() != usages {
        return Err(CertError::Csr(
            "retrieved csr is not compatible: usages differ".into(),
        ));
    }
    Ok(())
}

/// Where a request stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Not approved yet.
    Pending,
    /// Approved, waiting for the signer.
    Approved,
    /// Issued: the certificate chain, PEM.
    Issued(String),
}

/// Reads a request's conditions as client-go's `WaitForCertificate`:
/// Denied and Failed are final errors; Approved with a certificate is done.
pub fn outcome(csr: &CertificateSigningRequest, uid: &str) -> Result<Outcome, CertError> {
    let name = csr.metadata.name.clone().unwrap_or_default();
    if !uid.is_empty() && csr.metadata.uid.as_deref() != Some(uid) {
        return Err(CertError::Csr(format!("csr {name:?} changed UIDs")));
    }
    let mut approved = false;
    let status = csr.status.as_ref();
    for c in status
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
    {
        let reason = c.reason.clone().unwrap_or_default();
        let message = c.message.clone().unwrap_or_default();
        match c.type_.as_str() {
            "Denied" => {
                return Err(CertError::Denied {
                    csr: name,
                    reason,
                    message,
                });
            }
            "Failed" => {
                return Err(CertError::Failed {
                    csr: name,
                    reason,
                    message,
                });
            }
            "Approved" => approved = true,
            _ => {}
        }
    }
    if !approved {
        return Ok(Outcome::Pending);
    }
    match status.and_then(|s| s.certificate.as_ref()) {
        Some(c) if !c.0.is_empty() => {
            Ok(Outcome::Issued(String::from_utf8_lossy(&c.0).to_string()))
        }
        _ => Ok(Outcome::Approved),
    }
}

/// Watches the request until it is issued (its certificate, PEM), denied,
/// failed or deleted, or `timeout` passes. `on_change` hears each state.
pub async fn wait_for_certificate(
    client: &kube::Client,
    submitted: &Submitted,
    timeout: Duration,
    mut on_change: impl FnMut(&Outcome),
) -> Result<String, CertError> {
    let api: Api<CertificateSigningRequest> = Api::all(client.clone());
    let cfg = watcher::Config::default().fields(&format!("metadata.name={}", submitted.name));
    let mut stream = watcher::watcher(api, cfg).boxed();
    let mut last = None;
    let watch = async {
        while let Some(ev) = stream.next().await {
            let obj = match ev {
                Ok(watcher::Event::Apply(o)) | Ok(watcher::Event::InitApply(o)) => o,
                Ok(watcher::Event::Delete(_)) => {
                    return Err(CertError::Csr(format!(
                        "csr {:?} was deleted",
                        submitted.name
                    )));
                }
                Ok(_) => continue,
                Err(e) => {
                    tracing::debug!(csr = %submitted.name, error = %e, "watching the certificate signing request; retrying");
                    continue;
                }
            };
            let state = outcome(&obj, &submitted.uid)?;
            if last.as_ref() != Some(&state) {
                on_change(&state);
                last = Some(state.clone());
            }
            if let Outcome::Issued(pem) = state {
                return Ok(pem);
            }
        }
        Err(CertError::Csr(
            "watch of the certificate signing request ended".into(),
        ))
    };
    match tokio::time::timeout(timeout, watch).await {
        Ok(r) => r,
        Err(_) => Err(CertError::Timeout {
            csr: submitted.name.clone(),
            after: timeout,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::certificates::v1::{
        CertificateSigningRequestCondition, CertificateSigningRequestStatus,
    };

    #[test]
    fn request_carries_the_template() {
        let t = Template::node_serving(
            "n1",
            vec!["n1".into()],
            vec!["10.0.0.5".parse().expect("ip")],
        );
        let r = generate(&t).expect("request");
        assert!(
            r.csr_pem.starts_with("-----BEGIN CERTIFICATE REQUEST-----"),
            "{}",
            r.csr_pem
        );
        let p = rcgen::CertificateSigningRequestParams::from_pem(&r.csr_pem).expect("parse");
        let dn = format!("{:?}", p.params.distinguished_name);
        assert!(
            dn.contains("system:node:n1") && dn.contains("system:nodes"),
            "{dn}"
        );
        assert_eq!(p.params.subject_alt_names.len(), 2);
        assert!(r.key_pem.contains("PRIVATE KEY"));
    }

    #[test]
    fn digested_name_is_stable_per_key() {
        let t = Template::node_client("n1");
        let u = usages(KUBELET_CLIENT_SIGNER);
        assert_eq!(u, ["digital signature", "client auth"]);
        let a = digested_name(b"key-a", &t, &u);
        assert_eq!(a, digested_name(b"key-a", &t, &u));
        assert_ne!(a, digested_name(b"key-b", &t, &u));
        assert!(
            a.starts_with("node-csr-") && a.len() == "node-csr-".len() + 43,
            "{a}"
        );
    }

    fn csr_with(conditions: &[(&str, &str)], cert: Option<&str>) -> CertificateSigningRequest {
        let mut c = CertificateSigningRequest::default();
        c.metadata.name = Some("csr-x".into());
        c.metadata.uid = Some("u1".into());
        c.status = Some(CertificateSigningRequestStatus {
            certificate: cert.map(|s| ByteString(s.as_bytes().to_vec())),
            conditions: Some(
                conditions
                    .iter()
                    .map(|(t, r)| CertificateSigningRequestCondition {
                        type_: t.to_string(),
                        status: "True".into(),
                        reason: Some(r.to_string()),
                        message: Some(format!("{r} by test")),
                        ..Default::default()
                    })
                    .collect(),
            ),
        });
        c
    }

    #[test]
    fn conditions_are_read_as_client_go() {
        assert_eq!(
            outcome(&csr_with(&[], None), "u1").expect("ok"),
            Outcome::Pending
        );
        assert_eq!(
            outcome(&csr_with(&[("Approved", "AutoApproved")], None), "u1").expect("ok"),
            Outcome::Approved
        );
        assert_eq!(
            outcome(&csr_with(&[("Approved", "A")], Some("PEM")), "u1").expect("ok"),
            Outcome::Issued("PEM".into())
        );
        let denied = outcome(&csr_with(&[("Denied", "Nope")], None), "u1").expect_err("denied");
        assert_eq!(
            denied.to_string(),
            "certificate signing request csr-x is denied, reason: Nope, message: Nope by test"
        );
        assert!(matches!(
            outcome(
                &csr_with(&[("Failed", "SignerValidationFailure")], None),
                "u1"
            ),
            Err(CertError::Failed { .. })
        ));
        assert!(outcome(&csr_with(&[], None), "other").is_err());
    }
}
