//! The credentials kubelet tries for an image pull
//! (`makeLookupPullCredentialsFunc` in `pkg/kubelet/images/image_manager.go`,
//! `pkg/credentialprovider/secrets/secrets.go`): the pod's pull Secrets
//! (`kubernetes.io/dockerconfigjson` with `.dockerconfigjson`, legacy
//! `kubernetes.io/dockercfg` with `.dockercfg`) first, then the credential
//! provider plugins' (`crate::credentials`), each group ordered by
//! kubelet's keyring for the image's repository (`docker.io/library/busybox`
//! for `busybox`). kubelet also reads a node-wide docker `config.json`
//! (from its root dir, the working directory or `$HOME/.docker`) between
//! the two; keelson reads none.

use k8s_openapi::api::core::v1::Secret;
use keelson_cri::api;
use serde_json::Value;

use crate::credentials::CredentialProviders;
use crate::credentials::docker_keyring::{Credentials, DockerConfig, DockerKeyring, Source};
use crate::credentials::provider::PodRef;

fn entries(secret: &Secret) -> Option<Vec<(String, Value)>> {
    let data = |k: &str| {
        secret
            .data
            .as_ref()
            .and_then(|d| d.get(k))
            .map(|b| b.0.clone())
            .filter(|b| !b.is_empty())
    };
    let type_ = secret.type_.as_deref().unwrap_or_default();
    if type_ == "kubernetes.io/dockerconfigjson"
        && let Some(raw) = data(".dockerconfigjson")
    {
        let v = serde_json::from_slice::<Value>(&raw).ok()?;
        let auths = v.get("auths").and_then(Value::as_object);
        return Some(
            auths
                .map(|a| a.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
                .unwrap_or_default(),
        );
    }
    if type_ == "kubernetes.io/dockercfg"
        && let Some(raw) = data(".dockercfg")
        && let Ok(Value::Object(m)) = serde_json::from_slice::<Value>(&raw)
    {
        return Some(m.into_iter().collect());
    }
    None
}

/// A docker config entry (`DockerConfigEntry.UnmarshalJSON`): `auth`, when
/// present, holds `user:password` and wins over the plain fields.
fn credentials_of(v: &Value) -> Credentials {
    let s = |k: &str| {
        v.get(k)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    let mut c = Credentials {
        username: s("username"),
        password: s("password"),
        email: s("email"),
    };
    let auth = s("auth");
    if !auth.is_empty()
        && let Ok(decoded) =
            base64::Engine::decode(&base64::engine::general_purpose::STANDARD, &auth)
        && let Ok(text) = String::from_utf8(decoded)
        && let Some((u, p)) = text.split_once(':')
    {
        c.username = u.to_string();
        c.password = p.to_string();
    }
    c
}

/// `secretsToTrackedDockerConfigs`: the keyring of the pod's pull Secrets.
fn secrets_keyring(secrets: &[Secret]) -> DockerKeyring {
    let mut keyring = DockerKeyring::default();
    for s in secrets {
        let Some(entries) = entries(s) else {
            continue;
        };
        let config: DockerConfig = entries
            .iter()
            .map(|(k, v)| (k.clone(), credentials_of(v)))
            .collect();
        let source = Source::Secret {
            uid: s.metadata.uid.clone().unwrap_or_default(),
            namespace: s.metadata.namespace.clone().unwrap_or_default(),
            name: s.metadata.name.clone().unwrap_or_default(),
        };
        keyring.add(Some(&source), &config);
    }
    keyring
}

/// Credentials for an image with where they came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tracked {
    /// What to send with the pull (user name and password, as kubelet
    /// sends them).
    pub auth: api::AuthConfig,
    /// kubelet's `hashAuthConfig` of the credentials.
    pub hash: String,
    /// A pull Secret, a service account (token-mode plugins), or `None`
    /// for the node's own (plugins without a token).
    pub source: Option<Source>,
}

impl From<crate::credentials::docker_keyring::Tracked> for Tracked {
    fn from(t: crate::credentials::docker_keyring::Tracked) -> Self {
        Tracked {
            auth: api::AuthConfig {
                username: t.credentials.username,
                password: t.credentials.password,
                ..Default::default()
            },
            hash: t.hash,
            source: t.source,
        }
    }
}

/// The credentials to try for `repository` (see
/// [`super::imageref::repository_name`]), in kubelet's order.
pub async fn lookup_tracked(
    repository: &str,
    secrets: &[Secret],
    providers: &CredentialProviders,
    pod: &PodRef,
) -> Vec<Tracked> {
    let mut out: Vec<Tracked> = secrets_keyring(secrets)
        .lookup(repository)
        .into_iter()
        .map(Tracked::from)
        .collect();
    out.extend(
        providers
            .lookup(repository, pod)
            .await
            .into_iter()
            .map(Tracked::from),
    );
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
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

    async fn lookup(image: &str, secrets: &[Secret]) -> Vec<Tracked> {
        let repo = crate::pods::runtime::imageref::repository_name(image).unwrap();
        lookup_tracked(
            &repo,
            secrets,
            &CredentialProviders::none(),
            &PodRef::default(),
        )
        .await
    }

    fn users(t: &[Tracked]) -> Vec<&str> {
        t.iter().map(|t| t.auth.username.as_str()).collect()
    }

    #[tokio::test]
    async fn matches_as_kubelet_keyring() {
        let s = secret(
            r#"{"auths":{
                "https://index.docker.io/v1/":{"auth":"dTE6cDE="},
                "reg.example/team":{"username":"u2","password":"p2"},
                "reg.example":{"username":"u3","password":"p3"},
                "*.example":{"username":"u4","password":"p4"},
                "other.example:5000":{"username":"x","password":"y"}}}"#,
        );
        let d = lookup("busybox", std::slice::from_ref(&s)).await;
        assert_eq!(users(&d), ["u1"]);
        assert_eq!(d[0].auth.password, "p1");
        assert!(
            d[0].auth.server_address.is_empty(),
            "kubelet sends user and password only"
        );
        assert_eq!(
            users(&lookup("reg.example/team/app:1", std::slice::from_ref(&s)).await),
            ["u2", "u3", "u4"]
        );
        assert_eq!(
            users(&lookup("other.example/a", std::slice::from_ref(&s)).await),
            ["u4"]
        );
        assert_eq!(
            users(&lookup("other.example:5000/a", std::slice::from_ref(&s)).await),
            ["x"]
        );
        assert!(
            lookup("nothere.io/a", std::slice::from_ref(&s))
                .await
                .is_empty()
        );
        // A Secret of another type is not read.
        let mut opaque = s.clone();
        opaque.type_ = Some("Opaque".into());
        assert!(lookup("reg.example/team/app:1", &[opaque]).await.is_empty());
    }

    #[tokio::test]
    async fn tracked_credentials_name_their_secret_and_hash_as_kubelet() {
        let mut s = secret(r#"{"auths":{"reg.example":{"username":"u","password":"p"}}}"#);
        s.metadata.name = Some("pull".into());
        s.metadata.namespace = Some("ns".into());
        s.metadata.uid = Some("uid-1".into());
        let t = lookup("reg.example/app:1", &[s]).await;
        assert_eq!(t.len(), 1);
        assert_eq!(
            t[0].source,
            Some(Source::Secret {
                uid: "uid-1".into(),
                namespace: "ns".into(),
                name: "pull".into()
            })
        );
        // sha256 of {"username":"u","password":"p"}, as Go's json.Marshal
        // of credentialprovider.AuthConfig writes it.
        assert_eq!(
            t[0].hash,
            hex::encode(<sha2::Sha256 as sha2::Digest>::digest(
                br#"{"username":"u","password":"p"}"#
            ))
        );
    }
}
