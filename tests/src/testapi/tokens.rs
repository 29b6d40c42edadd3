//! Service account tokens: the TokenRequest subresource issues ES256-signed
//! JWTs (ECDSA P-256 with SHA-256, key generated at start with `ring`);
//! the server also accepts them as bearer tokens and publishes the key as
//! OIDC discovery (`/.well-known/openid-configuration`, `/openid/v1/jwks`).

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use ring::rand::SystemRandom;
use ring::signature::{
    ECDSA_P256_SHA256_FIXED, ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, KeyPair,
    UnparsedPublicKey,
};
use serde_json::{Value, json};

use super::error::{ApiError, Cause};
use super::objects::{JsonReply, Target};
use super::state::ApiState;
use super::util;

/// Default token lifetime (seconds).
pub const DEFAULT_EXPIRATION: i64 = 3600;
/// Shortest lifetime a TokenRequest may ask for.
pub const MIN_EXPIRATION: i64 = 600;

/// The service account token issuer.
pub struct TokenSigner {
    key: EcdsaKeyPair,
    rng: SystemRandom,
    kid: String,
    /// `iss` claim, also the default audience.
    pub issuer: String,
}

/// An identity proven by a token.
#[derive(Debug, Clone, PartialEq)]
pub struct Identity {
    /// User name (`system:serviceaccount:ns:name` for SA tokens).
    pub user: String,
}

impl TokenSigner {
    /// Generates a fresh P-256 key.
    pub fn generate(issuer: &str) -> Result<TokenSigner, String> {
        let rng = SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng)
            .map_err(|e| format!("generating key: {e}"))?;
        let key = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng)
            .map_err(|e| format!("loading key: {e}"))?;
        use sha2::Digest;
        let kid = B64.encode(sha2::Sha256::digest(key.public_key().as_ref()));
        Ok(TokenSigner {
            key,
            rng,
            kid,
            issuer: issuer.to_string(),
        })
    }

    /// Signs claims into a compact JWS.
    pub fn sign(&self, claims: &Value) -> Result<String, ApiError> {
        let header = json!({"alg": "ES256", "kid": self.kid});
        let input = format!(
            "{}.{}",
            B64.encode(header.to_string()),
            B64.encode(claims.to_string())
        );
        let sig = self
            .key
            .sign(&self.rng, input.as_bytes())
            .map_err(|e| ApiError::internal(format!("signing token: {e}")))?;
        Ok(format!("{input}.{}", B64.encode(sig.as_ref())))
    }

    /// Verifies a token issued by this signer; returns its claims.
    pub fn verify(&self, token: &str) -> Option<Value> {
        let mut parts = token.split('.');
        let (h, p, s) = (parts.next()?, parts.next()?, parts.next()?);
        if parts.next().is_some() {
            return None;
        }
        let sig = B64.decode(s).ok()?;
        let public =
            UnparsedPublicKey::new(&ECDSA_P256_SHA256_FIXED, self.key.public_key().as_ref());
        public.verify(format!("{h}.{p}").as_bytes(), &sig).ok()?;
        let claims: Value = serde_json::from_slice(&B64.decode(p).ok()?).ok()?;
        let now = util::unix_now();
        if claims.get("iss").and_then(Value::as_str) != Some(self.issuer.as_str()) {
            return None;
        }
        if claims
            .get("exp")
            .and_then(Value::as_i64)
            .is_none_or(|e| e <= now)
        {
            return None;
        }
        if claims
            .get("nbf")
            .and_then(Value::as_i64)
            .is_some_and(|n| n > now + 60)
        {
            return None;
        }
        Some(claims)
    }

    /// The identity a valid service account token proves.
    pub fn authenticate(&self, token: &str) -> Option<Identity> {
        let claims = self.verify(token)?;
        let sub = claims.get("sub").and_then(Value::as_str)?;
        Some(Identity {
            user: sub.to_string(),
        })
    }

    /// JWKS document with the public key.
    pub fn jwks(&self) -> Value {
        let pk = self.key.public_key().as_ref();
        // Uncompressed point: 0x04 || X (32) || Y (32).
        let (x, y) = if pk.len() == 65 {
            (&pk[1..33], &pk[33..65])
        } else {
            (&pk[..0], &pk[..0])
        };
        json!({"keys": [{"use": "sig", "kty": "EC", "kid": self.kid, "crv": "P-256", "alg": "ES256",
                          "x": B64.encode(x), "y": B64.encode(y)}]})
    }

    /// OIDC discovery document.
    pub fn openid_configuration(&self, jwks_uri: &str) -> Value {
        json!({
            "issuer": self.issuer,
            "jwks_uri": jwks_uri,
            "response_types_supported": ["id_token"],
            "subject_types_supported": ["public"],
            "id_token_signing_alg_values_supported": ["ES256"]
        })
    }
}

fn invalid(name: &str, field: &str, value: &str, why: &str) -> ApiError {
    ApiError::invalid(
        "authentication.k8s.io",
        "TokenRequest",
        name,
        vec![Cause {
            reason: "FieldValueInvalid",
            message: format!("Invalid value: {value}: {why}"),
            field: field.into(),
        }],
    )
}

/// POST serviceaccounts/<name>/token.
pub fn token_request(
    state: &ApiState,
    t: &Target<'_>,
    body: &Value,
) -> Result<JsonReply, ApiError> {
    let ns = t.ns.unwrap_or_default();
    let name = t.name.unwrap_or_default();
    let sa = state
        .store
        .get("serviceaccounts", ns, name)
        .ok_or_else(|| ApiError::not_found("", "serviceaccounts", name))?
        .value()?;
    let spec = body.get("spec").cloned().unwrap_or_else(|| json!({}));
    let exp_secs = spec
        .get("expirationSeconds")
        .and_then(Value::as_i64)
        .unwrap_or(DEFAULT_EXPIRATION);
    if exp_secs < MIN_EXPIRATION {
        return Err(invalid(
            name,
            "spec.expirationSeconds",
            &exp_secs.to_string(),
            "may not specify a duration less than 10 minutes",
        ));
    }
    if exp_secs > 1 << 32 {
        return Err(invalid(
            name,
            "spec.expirationSeconds",
            &exp_secs.to_string(),
            "may not specify a duration larger than 2^32 seconds",
        ));
    }
    let audiences: Vec<String> = match spec.get("audiences").and_then(Value::as_array) {
        Some(a) if !a.is_empty() => a
            .iter()
            .filter_map(|v| v.as_str().map(String::from))
            .collect(),
        _ => state.config.api_audiences.clone(),
    };
    let now = util::unix_now();
    let exp = now + exp_secs;
    let mut k8s = json!({
        "namespace": ns,
        "serviceaccount": {"name": name, "uid": sa.pointer("/metadata/uid").cloned().unwrap_or(json!(""))}
    });
    let bound = spec.get("boundObjectRef").filter(|b| !b.is_null()).cloned();
    if let Some(b) = &bound {
        let kind = b.get("kind").and_then(Value::as_str).unwrap_or_default();
        let bname = b.get("name").and_then(Value::as_str).unwrap_or_default();
        let buid = b.get("uid").and_then(Value::as_str).unwrap_or_default();
        let (storage, plural, claim, cluster) = match kind {
            "Pod" => ("pods", "pods", "pod", false),
            "Secret" => ("secrets", "secrets", "secret", false),
            "Node" => ("nodes", "nodes", "node", true),
            other => {
                return Err(invalid(
                    name,
                    "spec.boundObjectRef.kind",
                    &format!("\"{other}\""),
                    "supported values: \"Pod\", \"Secret\", \"Node\"",
                ));
            }
        };
        let obj = state
            .store
            .get(storage, if cluster { "" } else { ns }, bname)
            .ok_or_else(|| ApiError::not_found("", plural, bname))?
            .value()?;
        let uid = obj
            .pointer("/metadata/uid")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        if !buid.is_empty() && buid != uid {
            return Err(ApiError::conflict(
                "",
                plural,
                bname,
                &format!(
                    "the UID in the bound object reference ({buid}) does not match the UID in record. The object might have been deleted and then recreated"
                ),
            ));
        }
        k8s[claim] = json!({"name": bname, "uid": uid});
        if kind == "Pod"
            && let Some(node) = obj
                .pointer("/spec/nodeName")
                .and_then(Value::as_str)
                .filter(|n| !n.is_empty())
        {
            let node_uid = state
                .store
                .get("nodes", "", node)
                .and_then(|n| n.value().ok())
                .and_then(|n| {
                    n.pointer("/metadata/uid")
                        .and_then(Value::as_str)
                        .map(String::from)
                })
                .unwrap_or_default();
            k8s["node"] = json!({"name": node, "uid": node_uid});
        }
    }
    let claims = json!({
        "aud": audiences,
        "exp": exp,
        "iat": now,
        "iss": state.signer.issuer,
        "jti": util::new_uid(),
        "kubernetes.io": k8s,
        "nbf": now,
        "sub": format!("system:serviceaccount:{ns}:{name}"),
    });
    let token = state.signer.sign(&claims)?;
    let mut out_spec = json!({"audiences": audiences, "expirationSeconds": exp_secs});
    if let Some(b) = bound {
        out_spec["boundObjectRef"] = b;
    }
    let expiration = jiff::Timestamp::from_second(exp)
        .map(|t| t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
        .unwrap_or_default();
    Ok(JsonReply::value(
        201,
        &json!({
            "kind": "TokenRequest",
            "apiVersion": "authentication.k8s.io/v1",
            "metadata": {"name": name, "namespace": ns, "creationTimestamp": util::now_rfc3339()},
            "spec": out_spec,
            "status": {"token": token, "expirationTimestamp": expiration}
        }),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sign_verify_and_reject_tampering() {
        let s = TokenSigner::generate("https://kubernetes.default.svc.cluster.local").expect("key");
        let now = util::unix_now();
        let claims = json!({"iss": s.issuer, "sub": "system:serviceaccount:a:b", "exp": now + 600, "nbf": now});
        let tok = s.sign(&claims).expect("sign");
        assert_eq!(
            s.authenticate(&tok).map(|i| i.user),
            Some("system:serviceaccount:a:b".into())
        );
        let mut bad = tok.clone();
        bad.push('A');
        assert!(s.verify(&bad).is_none());
        let expired = s
            .sign(&json!({"iss": s.issuer, "sub": "x", "exp": now - 1}))
            .expect("sign");
        assert!(s.verify(&expired).is_none());
        let other = TokenSigner::generate(&s.issuer).expect("key");
        assert!(other.verify(&tok).is_none());
        assert_eq!(s.jwks()["keys"][0]["crv"], "P-256");
    }
}
