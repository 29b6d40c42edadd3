//! Registry credentials from a pod's `imagePullSecrets`
//! (`kubernetes.io/dockerconfigjson` and legacy `kubernetes.io/dockercfg`),
//! matched to an image the way kubelet's keyring does: by registry host,
//! then by the longest matching repository path prefix.

use k8s_openapi::api::core::v1::Secret;
use keelson_cri::api;
use serde_json::Value;

/// The registry host of an image reference (`docker.io` for short names).
pub fn registry_host(image: &str) -> &str {
    match image.split_once('/') {
        Some((first, _)) if first.contains('.') || first.contains(':') || first == "localhost" => {
            first
        }
        _ => "docker.io",
    }
}

/// The repository path of an image (`library/busybox`, `team/app`), without tag or digest.
fn repository(image: &str) -> String {
    let host = registry_host(image);
    let rest = if image.starts_with(host) && image.len() > host.len() {
        &image[host.len() + 1..]
    } else {
        image
    };
    let rest = rest.split('@').next().unwrap_or_default();
    let rest = match rest.rfind(':') {
        Some(i) if !rest[i..].contains('/') => &rest[..i],
        _ => rest,
    };
    if host == "docker.io" && !rest.contains('/') {
        format!("library/{rest}")
    } else {
        rest.to_string()
    }
}

/// A docker config key normalized to `(host, path)`.
fn normalize_key(key: &str) -> (String, String) {
    let k = key
        .trim_start_matches("https://")
        .trim_start_matches("http://");
    let (host, path) = match k.split_once('/') {
        Some((h, p)) => (h, p.trim_end_matches('/')),
        None => (k, ""),
    };
    let host = match host {
        "index.docker.io" | "registry-1.docker.io" | "registry.hub.docker.com" => "docker.io",
        h => h,
    };
    // "https://index.docker.io/v1/" names the whole registry.
    let path = if path == "v1" || path == "v2" {
        ""
    } else {
        path
    };
    (host.to_string(), path.to_string())
}

fn entries(secret: &Secret) -> Vec<(String, Value)> {
    let data = |k: &str| {
        secret
            .data
            .as_ref()
            .and_then(|d| d.get(k))
            .map(|b| b.0.clone())
    };
    if let Some(raw) = data(".dockerconfigjson") {
        if let Ok(v) = serde_json::from_slice::<Value>(&raw)
            && let Some(auths) = v.get("auths").and_then(Value::as_object)
        {
            return auths.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        }
    } else if let Some(raw) = data(".dockercfg")
        && let Ok(Value::Object(m)) = serde_json::from_slice::<Value>(&raw)
    {
        return m.into_iter().collect();
    }
    Vec::new()
}

fn auth_of(key: &str, v: &Value) -> api::AuthConfig {
    let s = |k: &str| {
        v.get(k)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    let mut a = api::AuthConfig {
        username: s("username"),
        password: s("password"),
        auth: s("auth"),
        server_address: key.to_string(),
        identity_token: s("identitytoken"),
        registry_token: s("registrytoken"),
    };
    if a.username.is_empty()
        && !a.auth.is_empty()
        && let Ok(decoded) =
            base64::Engine::decode(&base64::engine::general_purpose::STANDARD, &a.auth)
        && let Ok(text) = String::from_utf8(decoded)
        && let Some((u, p)) = text.split_once(':')
    {
        a.username = u.to_string();
        a.password = p.to_string();
    }
    a
}

/// kubelet's `hashAuthConfig` of a Secret's entry: SHA-256 (hex) of the
/// JSON of the username, password and email it holds.
fn credential_hash(auth: &api::AuthConfig, v: &Value) -> String {
    // In Go's field order (a JSON map would sort the keys), empty ones left
    // out (`omitempty`).
    let email = v.get("email").and_then(Value::as_str).unwrap_or_default();
    let fields: Vec<String> = [
        ("username", auth.username.as_str()),
        ("password", auth.password.as_str()),
        ("email", email),
    ]
    .into_iter()
    .filter(|(_, val)| !val.is_empty())
    .map(|(k, val)| format!("\"{k}\":{}", go_json_string(val)))
    .collect();
    let json = format!("{{{}}}", fields.join(","));
    hex::encode(<sha2::Sha256 as sha2::Digest>::digest(json.as_bytes()))
}

/// A JSON string as Go's `encoding/json` writes it (HTML characters and
/// the line/paragraph separators escaped).
fn go_json_string(s: &str) -> String {
    Value::String(s.to_string())
        .to_string()
        .replace('<', "\\u003c")
        .replace('>', "\\u003e")
        .replace('&', "\\u0026")
        .replace('\u{2028}', "\\u2028")
        .replace('\u{2029}', "\\u2029")
}

/// Credentials for an image with the Secret they came from.
#[derive(Debug, Clone)]
pub struct Tracked {
    /// What to send with the pull.
    pub auth: api::AuthConfig,
    /// The Secret (coordinates and credential hash), for the pull records.
    pub source: super::pull_records::PullSecret,
}

/// The credentials to try for `image`, best match first, each with its
/// Secret.
pub fn lookup_tracked(image: &str, secrets: &[Secret]) -> Vec<Tracked> {
    let host = registry_host(image);
    let repo = repository(image);
    let mut found: Vec<(usize, Tracked)> = Vec::new();
    for s in secrets {
        for (key, v) in entries(s) {
            let (h, path) = normalize_key(&key);
            if h != host {
                continue;
            }
            if !(path.is_empty() || repo == path || repo.starts_with(&format!("{path}/"))) {
                continue;
            }
            let auth = auth_of(&key, &v);
            let source = super::pull_records::PullSecret {
                uid: s.metadata.uid.clone().unwrap_or_default(),
                namespace: s.metadata.namespace.clone().unwrap_or_default(),
                name: s.metadata.name.clone().unwrap_or_default(),
                credential_hash: credential_hash(&auth, &v),
            };
            found.push((path.len(), Tracked { auth, source }));
        }
    }
    // Stable: equally long matches keep the pod's order of Secrets.
    found.sort_by_key(|f| std::cmp::Reverse(f.0));
    found.into_iter().map(|(_, t)| t).collect()
}

/// The credentials to try for `image`, best match first.
pub fn lookup(image: &str, secrets: &[Secret]) -> Vec<api::AuthConfig> {
    lookup_tracked(image, secrets)
        .into_iter()
        .map(|t| t.auth)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;
    use std::collections::BTreeMap;

    fn secret(json: &str) -> Secret {
        Secret {
            type_: Some("kubernetes.io/dockerconfigjson".into()),
            data: Some(BTreeMap::from([(
                ".dockerconfigjson".to_string(),
                ByteString(json.as_bytes().to_vec()),
            )])),
            ..Default::default()
        }
    }

    #[test]
    fn hosts_and_repositories() {
        assert_eq!(registry_host("busybox"), "docker.io");
        assert_eq!(registry_host("quay.io/a/b:1"), "quay.io");
        assert_eq!(registry_host("localhost:5000/x"), "localhost:5000");
        assert_eq!(repository("busybox:1"), "library/busybox");
        assert_eq!(
            repository("reg.example:5000/team/app@sha256:ab"),
            "team/app"
        );
    }

    #[test]
    fn matches_by_host_and_longest_path() {
        let s = secret(
            r#"{"auths":{
                "https://index.docker.io/v1/":{"auth":"dTE6cDE="},
                "reg.example/team":{"username":"u2","password":"p2"},
                "reg.example":{"username":"u3","password":"p3"},
                "other.example":{"username":"x","password":"y"}}}"#,
        );
        let d = lookup("busybox", std::slice::from_ref(&s));
        assert_eq!(d.len(), 1);
        assert_eq!(
            (d[0].username.as_str(), d[0].password.as_str()),
            ("u1", "p1")
        );
        let r = lookup("reg.example/team/app:1", std::slice::from_ref(&s));
        assert_eq!(
            r.iter().map(|a| a.username.as_str()).collect::<Vec<_>>(),
            vec!["u2", "u3"]
        );
        assert!(lookup("nothere.example/a", &[s]).is_empty());
    }

    #[test]
    fn tracked_credentials_name_their_secret_and_hash_as_kubelet() {
        let mut s = secret(r#"{"auths":{"reg.example":{"username":"u","password":"p"}}}"#);
        s.metadata.name = Some("pull".into());
        s.metadata.namespace = Some("ns".into());
        s.metadata.uid = Some("uid-1".into());
        let t = lookup_tracked("reg.example/app:1", &[s]);
        assert_eq!(t.len(), 1);
        assert_eq!(t[0].source.name, "pull");
        assert_eq!(t[0].source.uid, "uid-1");
        // sha256 of {"username":"u","password":"p"}, as Go's json.Marshal
        // of credentialprovider.AuthConfig writes it.
        assert_eq!(
            t[0].source.credential_hash,
            hex::encode(<sha2::Sha256 as sha2::Digest>::digest(
                br#"{"username":"u","password":"p"}"#
            ))
        );
    }
}
