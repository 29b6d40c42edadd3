//! kubelet's `BasicDockerKeyring` (`pkg/credentialprovider/keyring.go`):
//! registry credentials indexed by `host[/path]`, looked up for an image
//! in reverse lexicographic order of the keys (longer paths before their
//! prefixes, plain names before globs), every matching key's credentials
//! in turn; the default registry's credentials (`index.docker.io`) serve
//! Docker Hub images no key matched.

use std::collections::BTreeMap;

use super::url_match::{parse_with_scheme, urls_match_str};

/// The credentials of one docker config entry as kubelet keeps them
/// (`AuthConfig` from `Add`: user name, password and e-mail only).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Credentials {
    /// User name.
    pub username: String,
    /// Password.
    pub password: String,
    /// E-mail (deprecated; only in the credential hash).
    pub email: String,
}

/// Where credentials came from (`CredentialSource`); `None` in
/// [`Tracked`] means the node's own (accessible to every pod).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// A pull Secret of the pod.
    Secret {
        /// UID.
        uid: String,
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
    },
    /// A credential provider plugin called with the pod's service account
    /// token.
    ServiceAccount {
        /// UID.
        uid: String,
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
    },
}

/// Credentials with their source (`TrackedAuthConfig`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tracked {
    /// What a pull sends.
    pub credentials: Credentials,
    /// kubelet's `hashAuthConfig`: SHA-256 (hex) of Go's JSON of the
    /// credentials.
    pub hash: String,
    /// Where they came from (`None`: the node's).
    pub source: Option<Source>,
}

/// A docker config: location (`host[/path]`, scheme optional, globs in
/// the host) → credentials.
pub type DockerConfig = BTreeMap<String, Credentials>;

/// kubelet's default registry key.
const DEFAULT_REGISTRY_HOST: &str = "index.docker.io";

/// `BasicDockerKeyring`.
#[derive(Debug, Default, Clone)]
pub struct DockerKeyring {
    /// Keys, deduplicated and in reverse lexicographic order.
    index: Vec<String>,
    creds: BTreeMap<String, Vec<Tracked>>,
}

impl DockerKeyring {
    /// `Add`: indexes `config`'s entries; an entry whose location is not an
    /// URL is skipped with a log line, as kubelet does.
    pub fn add(&mut self, source: Option<&Source>, config: &DockerConfig) {
        for (location, entry) in config {
            let parsed = match parse_with_scheme(location) {
                Ok(p) => p,
                Err(e) => {
                    tracing::error!(entry = %location, error = %e, "entry in dockercfg invalid, ignoring");
                    continue;
                }
            };
            // "/v1/" and "/v2/" name the registry itself (docker's
            // ResolveAuthConfig).
            let mut path = parsed.path.as_str();
            if path.starts_with("/v2/") || path.starts_with("/v1/") {
                path = &path[3..];
            }
            let key = if !path.is_empty() && path != "/" {
                format!("{}{path}", parsed.host)
            } else {
                parsed.host.clone()
            };
            self.creds.entry(key.clone()).or_default().push(Tracked {
                credentials: entry.clone(),
                hash: hash_credentials(entry),
                source: source.cloned(),
            });
            self.index.push(key);
        }
        self.index.sort();
        self.index.dedup();
        self.index.reverse();
    }

    /// `Lookup`: the credentials to try for `image` (a repository name as
    /// `ParseImageName` gives it: `docker.io/library/busybox`), in order.
    pub fn lookup(&self, image: &str) -> Vec<Tracked> {
        let mut out = Vec::new();
        for key in &self.index {
            if urls_match_str(key, image).unwrap_or(false)
                && let Some(c) = self.creds.get(key)
            {
                out.extend(c.iter().cloned());
            }
        }
        if out.is_empty()
            && is_default_registry_match(image)
            && let Some(c) = self.creds.get(DEFAULT_REGISTRY_HOST)
        {
            out.extend(c.iter().cloned());
        }
        out
    }
}

/// `isDefaultRegistryMatch`: does `image` pull from Docker Hub?
fn is_default_registry_match(image: &str) -> bool {
    let (first, rest) = match image.split_once('/') {
        Some((f, r)) => (f, Some(r)),
        None => (image, None),
    };
    if first.is_empty() {
        return false;
    }
    if rest.is_none() || first == "docker.io" || first == "index.docker.io" {
        return true;
    }
    !first.contains(['.', ':'])
}

/// kubelet's `hashAuthConfig`: SHA-256 (hex) of `json.Marshal` of the
/// `AuthConfig` (Go's field order, empty fields left out).
pub fn hash_credentials(c: &Credentials) -> String {
    let fields: Vec<String> = [
        ("username", c.username.as_str()),
        ("password", c.password.as_str()),
        ("email", c.email.as_str()),
    ]
    .into_iter()
    .filter(|(_, v)| !v.is_empty())
    .map(|(k, v)| format!("\"{k}\":{}", go_json_string(v)))
    .collect();
    let json = format!("{{{}}}", fields.join(","));
    hex::encode(<sha2::Sha256 as sha2::Digest>::digest(json.as_bytes()))
}

/// A JSON string as Go's `encoding/json` writes it (HTML characters and
/// the line/paragraph separators escaped).
fn go_json_string(s: &str) -> String {
    serde_json::Value::String(s.to_string())
        .to_string()
        .replace('<', "\\u003c")
        .replace('>', "\\u003e")
        .replace('&', "\\u0026")
        .replace('\u{2028}', "\\u2028")
        .replace('\u{2029}', "\\u2029")
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    fn creds(u: &str) -> Credentials {
        Credentials {
            username: u.into(),
            password: "p".into(),
            email: String::new(),
        }
    }

    fn names(t: &[Tracked]) -> Vec<&str> {
        t.iter().map(|t| t.credentials.username.as_str()).collect()
    }

    #[test]
    fn reverse_order_puts_longer_paths_and_plain_names_first() {
        let mut k = DockerKeyring::default();
        k.add(
            None,
            &DockerConfig::from([
                ("quay.io".into(), creds("host")),
                ("quay.io/coreos".into(), creds("path")),
                ("*.quay.io".into(), creds("glob")),
                ("https://other.io/v2/".into(), creds("other")),
            ]),
        );
        assert_eq!(names(&k.lookup("quay.io/coreos/etcd")), ["path", "host"]);
        assert_eq!(names(&k.lookup("eu.quay.io/app")), ["glob"]);
        assert_eq!(names(&k.lookup("other.io/app")), ["other"]);
        assert!(k.lookup("nothere.io/app").is_empty());
    }

    #[test]
    fn docker_hub_falls_back_to_the_default_registry_key() {
        let mut k = DockerKeyring::default();
        k.add(
            None,
            &DockerConfig::from([("https://index.docker.io/v1/".into(), creds("hub"))]),
        );
        assert_eq!(names(&k.lookup("docker.io/library/busybox")), ["hub"]);
        assert_eq!(names(&k.lookup("team/app")), ["hub"]);
        assert!(k.lookup("reg.example/team/app").is_empty());
    }

    #[test]
    fn sources_and_hashes_are_kept() {
        let mut k = DockerKeyring::default();
        let src = Source::Secret {
            uid: "u".into(),
            namespace: "ns".into(),
            name: "pull".into(),
        };
        k.add(
            Some(&src),
            &DockerConfig::from([("reg.example".into(), creds("a"))]),
        );
        let t = k.lookup("reg.example/app");
        assert_eq!(t[0].source, Some(src));
        assert_eq!(
            t[0].hash,
            hex::encode(<sha2::Sha256 as sha2::Digest>::digest(
                br#"{"username":"a","password":"p"}"#
            ))
        );
    }
}
