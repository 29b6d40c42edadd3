//! CertificateSigningRequests (`certificates.k8s.io/v1`) with
//! kube-apiserver's strategy and validation
//! (`pkg/registry/certificates/certificates/strategy.go`,
//! `pkg/apis/certificates/validation/validation.go`) and the two
//! kube-controller-manager controllers a node's TLS bootstrap depends on:
//! the signer (`pkg/controller/certificates/signer/signer.go`: approved
//! requests for the `kubernetes.io/kube-apiserver-client-kubelet`,
//! `kubernetes.io/kube-apiserver-client` and `kubernetes.io/kubelet-serving`
//! signers get a certificate from the server's CA, with the signer's
//! duration and 5-minute backdating, or a `Failed` condition when the
//! request breaks the signer's rules) and, when enabled, the approver of
//! kubelet client requests (`approver/sarapprove.go`: `nodeclient` for
//! bootstrappers, `selfnodeclient` for a node renewing its own; this
//! server has no authorization, so the SubjectAccessReview always allows).
//!
//! - create: `spec.username`, `spec.groups`, `spec.uid` come from the
//!   requester; status is dropped;
//! - update: only metadata changes;
//! - `status`: the certificate and conditions other than Approved/Denied;
//! - `approval`: only Approved/Denied conditions, which cannot be removed
//!   or both be present.

use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use rcgen::{
    CertificateSigningRequestParams, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::authn::UserInfo;
use super::error::{ApiError, Cause, invalid_value, required};
use super::objects::{self, UpdateMode};
use super::resources;
use super::state::ApiState;
use super::store::{ChangeType, WatchFrom};
use super::util;

/// The kubelet client signer.
pub const KUBELET_CLIENT: &str = "kubernetes.io/kube-apiserver-client-kubelet";
/// The generic API server client signer.
pub const APISERVER_CLIENT: &str = "kubernetes.io/kube-apiserver-client";
/// The kubelet serving signer.
pub const KUBELET_SERVING: &str = "kubernetes.io/kubelet-serving";

const KNOWN_USAGES: &[&str] = &[
    "signing",
    "digital signature",
    "content commitment",
    "key encipherment",
    "key agreement",
    "data encipherment",
    "cert sign",
    "crl sign",
    "encipher only",
    "decipher only",
    "any",
    "server auth",
    "client auth",
    "code signing",
    "email protection",
    "s/mime",
    "ipsec end system",
    "ipsec tunnel",
    "ipsec user",
    "timestamping",
    "ocsp signing",
    "microsoft sgc",
    "netscape sgc",
];

/// Fills in who asked and drops status, as the create strategy does.
pub fn prepare_create(obj: &mut Value, user: Option<&UserInfo>) {
    let Some(o) = obj.as_object_mut() else { return };
    o.remove("status");
    let spec = o.entry("spec").or_insert_with(|| json!({}));
    if let Some(s) = spec.as_object_mut() {
        let (name, groups) = user
            .map(|u| (u.name.clone(), u.groups.clone()))
            .unwrap_or_default();
        s.insert("username".into(), json!(name));
        s.insert("groups".into(), json!(groups));
        s.insert("uid".into(), json!(""));
        s.remove("extra");
    }
}

/// The PEM request of `spec.request` (base64 in JSON), parsed.
fn request_params(obj: &Value) -> Result<CertificateSigningRequestParams, String> {
    let b64 = obj
        .pointer("/spec/request")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(b64)
        .map_err(|e| format!("{e}"))?;
    let pem = String::from_utf8(bytes).map_err(|e| format!("{e}"))?;
    CertificateSigningRequestParams::from_pem(&pem).map_err(|e| format!("{e}"))
}

/// Validation of a stored object.
pub fn validate(obj: &Value) -> Vec<Cause> {
    let mut out = Vec::new();
    if obj
        .pointer("/spec/request")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .is_empty()
    {
        out.push(required("spec.request"));
    } else if let Err(e) = request_params(obj) {
        out.push(invalid_value(
            "spec.request",
            "<request>",
            &format!("certificate request is invalid: {e}"),
        ));
    }
    let signer = obj
        .pointer("/spec/signerName")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if signer.is_empty() {
        out.push(required("spec.signerName"));
    } else if signer.split('/').count() != 2 || signer.starts_with('/') || signer.ends_with('/') {
        out.push(invalid_value(
            "spec.signerName",
            signer,
            "must be a fully qualified domain and path of the form 'example.com/signer-name'",
        ));
    }
    let usages = obj
        .pointer("/spec/usages")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if usages.is_empty() {
        out.push(required("spec.usages"));
    }
    for (i, u) in usages.iter().enumerate() {
        let s = u.as_str().unwrap_or_default();
        if !KNOWN_USAGES.contains(&s) {
            out.push(Cause {
                reason: "FieldValueNotSupported",
                message: format!("Unsupported value: \"{s}\""),
                field: format!("spec.usages[{i}]"),
            });
        }
    }
    if let Some(e) = obj
        .pointer("/spec/expirationSeconds")
        .and_then(Value::as_i64)
        && e < 600
    {
        out.push(invalid_value(
            "spec.expirationSeconds",
            &e.to_string(),
            "may not specify a duration less than 600 seconds (10 minutes)",
        ));
    }
    let conds = conditions(obj);
    let has = |t: &str| {
        conds
            .iter()
            .any(|c| c.get("type").and_then(Value::as_str) == Some(t))
    };
    if has("Approved") && has("Denied") {
        out.push(invalid_value(
            "status.conditions",
            "Approved, Denied",
            "Approved and Denied conditions are mutually exclusive",
        ));
    }
    for (i, c) in conds.iter().enumerate() {
        let t = c.get("type").and_then(Value::as_str).unwrap_or_default();
        let st = c.get("status").and_then(Value::as_str).unwrap_or_default();
        if matches!(t, "Approved" | "Denied") && st != "True" {
            out.push(invalid_value(
                &format!("status.conditions[{i}].status"),
                st,
                "must be True",
            ));
        }
    }
    out
}

fn conditions(obj: &Value) -> Vec<Value> {
    obj.pointer("/status/conditions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default()
}

fn decision(c: &Value) -> bool {
    matches!(
        c.get("type").and_then(Value::as_str),
        Some("Approved" | "Denied")
    )
}

/// Restricts an update to what its subresource may change.
pub fn prepare_update(old: &Value, new: &mut Value, mode: UpdateMode) -> Result<(), Vec<Cause>> {
    let Some(o) = new.as_object_mut() else {
        return Ok(());
    };
    if let Some(spec) = old.get("spec") {
        o.insert("spec".into(), spec.clone());
    }
    let old_conds = conditions(old);
    let mut new_conds: Vec<Value> = o
        .get("status")
        .and_then(|s| s.get("conditions"))
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let now = util::now_rfc3339();
    for c in new_conds.iter_mut() {
        if let Some(m) = c.as_object_mut() {
            if m.get("lastUpdateTime").is_none_or(Value::is_null) {
                m.insert("lastUpdateTime".into(), json!(now));
            }
            if m.get("lastTransitionTime").is_none_or(Value::is_null) {
                m.insert("lastTransitionTime".into(), json!(now));
            }
        }
    }
    match mode {
        // `resize` is a pods-only subresource: never a CSR's.
        UpdateMode::Main | UpdateMode::Resize | UpdateMode::EphemeralContainers => {
            match old.get("status") {
                Some(s) => o.insert("status".into(), s.clone()),
                None => o.remove("status"),
            };
            Ok(())
        }
        UpdateMode::Status => {
            // Approved/Denied change only through `approval`.
            let old_d: Vec<_> = old_conds.iter().filter(|c| decision(c)).cloned().collect();
            let mut kept: Vec<Value> = new_conds.into_iter().filter(|c| !decision(c)).collect();
            kept.extend(old_d);
            set_conditions(o, kept);
            Ok(())
        }
        UpdateMode::Approval => {
            for oc in old_conds.iter().filter(|c| decision(c)) {
                let t = oc.get("type").and_then(Value::as_str).unwrap_or_default();
                if !new_conds
                    .iter()
                    .any(|c| c.get("type").and_then(Value::as_str) == Some(t))
                {
                    return Err(vec![Cause {
                        reason: "FieldValueForbidden",
                        message: format!(
                            "Forbidden: updates may not remove a condition of type {t:?}"
                        ),
                        field: "status.conditions".into(),
                    }]);
                }
            }
            // Only the decision conditions come from the request; the
            // certificate and other conditions stay as stored.
            let mut next: Vec<Value> = old_conds.into_iter().filter(|c| !decision(c)).collect();
            next.extend(new_conds.into_iter().filter(decision));
            let cert = old.pointer("/status/certificate").cloned();
            let mut status = json!({"conditions": next});
            if let (Some(c), Some(s)) = (cert, status.as_object_mut()) {
                s.insert("certificate".into(), c);
            }
            o.insert("status".into(), status);
            Ok(())
        }
    }
}

fn set_conditions(o: &mut serde_json::Map<String, Value>, conds: Vec<Value>) {
    let status = o.entry("status").or_insert_with(|| json!({}));
    if let Some(s) = status.as_object_mut() {
        s.insert("conditions".into(), json!(conds));
    }
}

/// The signer and approver settings.
#[derive(Clone)]
pub struct SignerConfig {
    /// `--cluster-signing-duration`.
    pub duration: Duration,
    /// notBefore goes this far back (upstream: 5 minutes).
    pub backdate: Duration,
    /// Approve kubelet client requests as the csrapproving controller.
    pub approve_node_clients: bool,
}

/// Runs the signer (and approver) until `shutdown`.
pub fn spawn(
    state: Arc<ApiState>,
    issuer: Arc<Issuer<'static, KeyPair>>,
    cfg: SignerConfig,
    shutdown: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            let Ok(start) =
                state
                    .store
                    .watch("certificatesigningrequests", None, WatchFrom::Current)
            else {
                return;
            };
            for o in &start.initial {
                if let Ok(v) = o.value() {
                    handle(&state, &issuer, &cfg, v);
                }
            }
            let mut rx = start.rx;
            loop {
                let change = tokio::select! {
                    _ = shutdown.cancelled() => return,
                    c = rx.recv() => c,
                };
                match change {
                    Ok(c) if c.kind != ChangeType::Deleted => {
                        if let Ok(v) = c.object.value() {
                            handle(&state, &issuer, &cfg, v);
                        }
                    }
                    Ok(_) => {}
                    // Fell behind: look at everything again.
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => break,
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                }
            }
        }
    })
}

fn has_true(obj: &Value, t: &str) -> bool {
    conditions(obj).iter().any(|c| {
        c.get("type").and_then(Value::as_str) == Some(t)
            && c.get("status").and_then(Value::as_str) == Some("True")
    })
}

fn handle(state: &ApiState, issuer: &Issuer<'static, KeyPair>, cfg: &SignerConfig, obj: Value) {
    let name = obj
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let result = if has_true(&obj, "Denied") || has_true(&obj, "Failed") {
        Ok(())
    } else if has_true(&obj, "Approved") {
        sign_if_due(state, issuer, cfg, &name, obj)
    } else if cfg.approve_node_clients {
        approve_if_node_client(state, &name, &obj)
    } else {
        Ok(())
    };
    if let Err(e) = result {
        tracing::warn!(csr = %name, error = %e.message, "test API server: CSR controller");
    }
}

/// kubelet client requests the approver recognizes: `nodeclient` (a
/// bootstrapper asks for a node) and `selfnodeclient` (the node renews).
fn approve_if_node_client(state: &ApiState, name: &str, obj: &Value) -> Result<(), ApiError> {
    if obj.pointer("/spec/signerName").and_then(Value::as_str) != Some(KUBELET_CLIENT) {
        return Ok(());
    }
    let Ok(params) = request_params(obj) else {
        return Ok(());
    };
    if validate_kubelet_client(&params, &usages(obj)).is_err() {
        return Ok(());
    }
    let cn = common_name(&params);
    let user = obj
        .pointer("/spec/username")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let groups: Vec<&str> = obj
        .pointer("/spec/groups")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let recognized = user == cn || groups.contains(&"system:bootstrappers");
    if !recognized {
        return Ok(());
    }
    let mut next = obj.clone();
    let mut conds = conditions(obj);
    conds.push(json!({
        "type": "Approved",
        "status": "True",
        "reason": "AutoApproved",
        "message": "Auto approving kubelet client certificate after SubjectAccessReview.",
    }));
    if let Some(o) = next.as_object_mut() {
        set_conditions(o, conds);
    }
    store_update(state, name, next, UpdateMode::Approval)
}

fn usages(obj: &Value) -> Vec<String> {
    obj.pointer("/spec/usages")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|u| u.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

fn common_name(p: &CertificateSigningRequestParams) -> String {
    p.params
        .distinguished_name
        .get(&rcgen::DnType::CommonName)
        .map(dn_text)
        .unwrap_or_default()
}

fn dn_text(v: &rcgen::DnValue) -> String {
    match v {
        rcgen::DnValue::Utf8String(s) => s.clone(),
        rcgen::DnValue::PrintableString(s) => s.as_str().to_string(),
        rcgen::DnValue::Ia5String(s) => s.as_str().to_string(),
        rcgen::DnValue::TeletexString(s) => s.as_str().to_string(),
        rcgen::DnValue::BmpString(_) | rcgen::DnValue::UniversalString(_) => String::new(),
        _ => String::new(),
    }
}

fn organizations(p: &CertificateSigningRequestParams) -> Vec<String> {
    p.params
        .distinguished_name
        .iter()
        .filter(|(t, _)| **t == rcgen::DnType::OrganizationName)
        .map(|(_, v)| dn_text(v))
        .collect()
}

fn usages_within(usages: &[String], allowed: &[&str], needed: &str) -> Result<(), String> {
    for u in usages {
        if !allowed.contains(&u.as_str()) {
            return Err(format!(
                "usage {u:?} is not allowed, allowed usages: {allowed:?}"
            ));
        }
    }
    if !usages.iter().any(|u| u == needed) {
        return Err(format!("missing required usage {needed:?}"));
    }
    Ok(())
}

/// The subject both kubelet signers require: `system:node:*` in `system:nodes`.
fn node_subject(p: &CertificateSigningRequestParams) -> Result<(), String> {
    if organizations(p) != ["system:nodes"] {
        return Err("organization must be [\"system:nodes\"]".into());
    }
    if !common_name(p).starts_with("system:node:") {
        return Err("common name must begin with \"system:node:\"".into());
    }
    Ok(())
}

/// `certificates.ValidateKubeletClientCSR`.
fn validate_kubelet_client(
    p: &CertificateSigningRequestParams,
    usages: &[String],
) -> Result<(), String> {
    node_subject(p)?;
    if !p.params.subject_alt_names.is_empty() {
        return Err("DNS, email, IP and URI subjectAltNames are not allowed".into());
    }
    usages_within(
        usages,
        &["digital signature", "key encipherment", "client auth"],
        "client auth",
    )
}

/// `certificates.ValidateKubeletServingCSR`.
fn validate_kubelet_serving(
    p: &CertificateSigningRequestParams,
    usages: &[String],
) -> Result<(), String> {
    node_subject(p)?;
    let sans = &p.params.subject_alt_names;
    if sans
        .iter()
        .any(|s| matches!(s, SanType::Rfc822Name(_) | SanType::URI(_)))
    {
        return Err("email and URI subjectAltNames are not allowed".into());
    }
    if !sans
        .iter()
        .any(|s| matches!(s, SanType::DnsName(_) | SanType::IpAddress(_)))
    {
        return Err("at least one DNS or IP subjectAltName is required".into());
    }
    usages_within(
        usages,
        &["digital signature", "key encipherment", "server auth"],
        "server auth",
    )
}

fn sign_if_due(
    state: &ApiState,
    issuer: &Issuer<'static, KeyPair>,
    cfg: &SignerConfig,
    name: &str,
    obj: Value,
) -> Result<(), ApiError> {
    let issued = obj
        .pointer("/status/certificate")
        .and_then(Value::as_str)
        .is_some_and(|c| !c.is_empty());
    let signer = obj
        .pointer("/spec/signerName")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if issued || !matches!(signer, KUBELET_CLIENT | APISERVER_CLIENT | KUBELET_SERVING) {
        return Ok(());
    }
    let usages = usages(&obj);
    let params = request_params(&obj)
        .map_err(|e| ApiError::internal(format!("unable to parse csr {name:?}: {e}")))?;
    let checked = match signer {
        KUBELET_CLIENT => validate_kubelet_client(&params, &usages),
        KUBELET_SERVING => validate_kubelet_serving(&params, &usages),
        _ => usages_within(&usages, KNOWN_USAGES, "client auth"),
    };
    let mut next = obj.clone();
    match checked {
        Err(why) => {
            let mut conds = conditions(&obj);
            conds.push(json!({
                "type": "Failed",
                "status": "True",
                "reason": "SignerValidationFailure",
                "message": why,
                "lastUpdateTime": util::now_rfc3339(),
            }));
            if let Some(o) = next.as_object_mut() {
                set_conditions(o, conds);
            }
        }
        Ok(()) => {
            let requested = obj
                .pointer("/spec/expirationSeconds")
                .and_then(Value::as_i64)
                .map(|s| Duration::from_secs(u64::try_from(s).unwrap_or(0)));
            let ttl = match requested {
                None => cfg.duration,
                Some(d) => d
                    .clamp(
                        Duration::from_secs(600),
                        cfg.duration.max(Duration::from_secs(600)),
                    )
                    .min(cfg.duration),
            };
            let pem = sign(issuer, params, &usages, ttl, cfg.backdate)?;
            let b64 = base64::engine::general_purpose::STANDARD.encode(pem);
            if let Some(s) = next
                .as_object_mut()
                .map(|o| o.entry("status").or_insert_with(|| json!({})))
                .and_then(Value::as_object_mut)
            {
                s.insert("certificate".into(), json!(b64));
            }
        }
    }
    store_update(state, name, next, UpdateMode::Status)
}

/// Signs as `PermissiveSigningPolicy`: the request's subject and SANs, the
/// requested usages, notBefore = now − backdate, notAfter = now + ttl
/// (short-lived, under 8 h) or now + ttl − backdate.
fn sign(
    issuer: &Issuer<'static, KeyPair>,
    mut req: CertificateSigningRequestParams,
    usages: &[String],
    ttl: Duration,
    backdate: Duration,
) -> Result<String, ApiError> {
    let now = time::OffsetDateTime::now_utc();
    let td = |d: Duration| time::Duration::seconds(i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
    let p = &mut req.params;
    p.not_before = now - td(backdate);
    p.not_after = if ttl < Duration::from_secs(8 * 3600) {
        now + td(ttl)
    } else {
        now + td(ttl) - td(backdate)
    };
    p.is_ca = IsCa::ExplicitNoCa;
    p.key_usages = usages
        .iter()
        .filter_map(|u| match u.as_str() {
            "signing" | "digital signature" => Some(KeyUsagePurpose::DigitalSignature),
            "content commitment" => Some(KeyUsagePurpose::ContentCommitment),
            "key encipherment" => Some(KeyUsagePurpose::KeyEncipherment),
            "key agreement" => Some(KeyUsagePurpose::KeyAgreement),
            "data encipherment" => Some(KeyUsagePurpose::DataEncipherment),
            "cert sign" => Some(KeyUsagePurpose::KeyCertSign),
            "crl sign" => Some(KeyUsagePurpose::CrlSign),
            _ => None,
        })
        .collect();
    p.extended_key_usages = usages
        .iter()
        .filter_map(|u| match u.as_str() {
            "server auth" => Some(ExtendedKeyUsagePurpose::ServerAuth),
            "client auth" => Some(ExtendedKeyUsagePurpose::ClientAuth),
            "code signing" => Some(ExtendedKeyUsagePurpose::CodeSigning),
            "email protection" | "s/mime" => Some(ExtendedKeyUsagePurpose::EmailProtection),
            "timestamping" => Some(ExtendedKeyUsagePurpose::TimeStamping),
            "ocsp signing" => Some(ExtendedKeyUsagePurpose::OcspSigning),
            "any" => Some(ExtendedKeyUsagePurpose::Any),
            _ => None,
        })
        .collect();
    let cert = req
        .signed_by(issuer)
        .map_err(|e| ApiError::internal(format!("signing: {e}")))?;
    Ok(cert.pem())
}

fn store_update(
    state: &ApiState,
    name: &str,
    next: Value,
    mode: UpdateMode,
) -> Result<(), ApiError> {
    let Some(res) = resources::find("certificates.k8s.io", "v1", "certificatesigningrequests")
    else {
        return Ok(());
    };
    state.store.write(|txn| {
        let Some(old) = txn.get(res.storage, "", name) else {
            return Ok(());
        };
        objects::update_in(state, txn, res, &old, next, mode, false).map(|_| ())
    })
}
