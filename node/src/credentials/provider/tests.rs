use super::*;
use crate::credentials::config::{ExecEnvVar, SignedDuration};
use crate::volumes::tokens::{TokenError, TokenRequester};
use k8s_openapi::api::authentication::v1::TokenRequestStatus;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};

/// A plugin that records each request (one line) and answers with the
/// content of `response.json`.
fn plugin(dir: &Path) -> ExecPlugin {
    let path = dir.join("rec");
    std::fs::write(
        &path,
        format!(
            "#!/bin/sh\n(cat; echo) >> {log}\ncat {resp}\n",
            log = dir.join("requests").display(),
            resp = dir.join("response.json").display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    ExecPlugin {
        name: "rec".into(),
        api_version: "credentialprovider.kubelet.k8s.io/v1".into(),
        path,
        args: vec![],
        env: vec![ExecEnvVar {
            name: "X".into(),
            value: "y".into(),
        }],
        timeout: Duration::from_secs(20),
    }
}

fn respond(dir: &Path, key_type: &str, duration: Option<&str>, password: &str) {
    let mut r = serde_json::json!({
        "kind": "CredentialProviderResponse",
        "apiVersion": "credentialprovider.kubelet.k8s.io/v1",
        "cacheKeyType": key_type,
        "auth": {"*.reg.io": {"username": "u", "password": password}},
    });
    if let Some(d) = duration {
        r["cacheDuration"] = d.into();
    }
    std::fs::write(dir.join("response.json"), r.to_string()).unwrap();
}

fn requests(dir: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(dir.join("requests"))
        .unwrap_or_default()
        .lines()
        .filter(|l| !l.is_empty())
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn config(default_cache: u64, token: Option<TokenAttributes>) -> CredentialProvider {
    CredentialProvider {
        name: "rec".into(),
        match_images: vec!["*.reg.io".into(), "other.io:5000/team".into()],
        default_cache_duration: Some(SignedDuration {
            length: Duration::from_secs(default_cache),
            negative: false,
        }),
        api_version: "credentialprovider.kubelet.k8s.io/v1".into(),
        token_attributes: token,
        ..Default::default()
    }
}

/// A provider of `config` running the recording plugin in `dir`.
fn recording(
    dir: &Path,
    config: CredentialProvider,
    sources: Option<TokenSources>,
) -> PluginProvider {
    PluginProvider::new(
        &config,
        plugin(dir),
        sources,
        CredentialProviderMetrics::unregistered(),
    )
}

fn pod(sa: &str) -> PodRef {
    PodRef {
        namespace: "ns".into(),
        name: "p".into(),
        uid: "pod-uid".into(),
        service_account: sa.into(),
    }
}

fn password(c: &DockerConfig) -> Option<&str> {
    c.get("*.reg.io").map(|a| a.password.as_str())
}

#[tokio::test]
async fn only_matching_images_reach_the_plugin() {
    let dir = tempfile::tempdir().unwrap();
    respond(dir.path(), "Image", None, "p1");
    let p = recording(dir.path(), config(0, None), None);
    let (c, src) = p.provide("a.reg.io/app", &pod("")).await;
    assert_eq!(password(&c), Some("p1"));
    assert_eq!(src, None, "node credentials, not bound to a pod");
    assert!(
        p.provide("reg.io/app", &pod("")).await.0.is_empty(),
        "one glob is one part"
    );
    assert!(
        p.provide("other.io/team/app", &pod("")).await.0.is_empty(),
        "no port"
    );
    assert!(
        !p.provide("other.io:5000/team/app", &pod(""))
            .await
            .0
            .is_empty()
    );
    let reqs = requests(dir.path());
    assert_eq!(reqs.len(), 2, "{reqs:?}");
    assert_eq!(reqs[0]["image"], "a.reg.io/app");
    assert_eq!(reqs[0]["kind"], "CredentialProviderRequest");
}

#[tokio::test]
async fn cache_key_types_and_durations() {
    let dir = tempfile::tempdir().unwrap();
    let p = recording(dir.path(), config(0, None), None);
    // defaultCacheDuration 0 and no cacheDuration: never cached.
    respond(dir.path(), "Registry", None, "p1");
    p.provide("a.reg.io/x", &pod("")).await;
    p.provide("a.reg.io/x", &pod("")).await;
    assert_eq!(requests(dir.path()).len(), 2);
    assert_eq!(p.cached(), 0);
    // cacheDuration 0: not cached either.
    respond(dir.path(), "Registry", Some("0s"), "p1");
    p.provide("a.reg.io/x", &pod("")).await;
    assert_eq!(p.cached(), 0);
    // Registry: one run for every image of the registry.
    respond(dir.path(), "Registry", Some("1h"), "p2");
    assert_eq!(
        password(&p.provide("a.reg.io/x", &pod("")).await.0),
        Some("p2")
    );
    respond(dir.path(), "Registry", Some("1h"), "p3");
    assert_eq!(
        password(&p.provide("a.reg.io/y", &pod("")).await.0),
        Some("p2")
    );
    assert_eq!(requests(dir.path()).len(), 4);
    // Image: per image; another registry runs the plugin.
    respond(dir.path(), "Image", Some("1h"), "p4");
    assert_eq!(
        password(&p.provide("b.reg.io/x", &pod("")).await.0),
        Some("p4")
    );
    respond(dir.path(), "Image", Some("1h"), "p5");
    assert_eq!(
        password(&p.provide("b.reg.io/y", &pod("")).await.0),
        Some("p5")
    );
    assert_eq!(
        password(&p.provide("b.reg.io/x", &pod("")).await.0),
        Some("p4")
    );
    assert_eq!(requests(dir.path()).len(), 6);
    // Global: every image the plugin matches.
    respond(dir.path(), "Global", Some("1h"), "p6");
    assert_eq!(
        password(&p.provide("c.reg.io/x", &pod("")).await.0),
        Some("p6")
    );
    assert_eq!(
        password(&p.provide("d.reg.io/z", &pod("")).await.0),
        Some("p6")
    );
    assert_eq!(requests(dir.path()).len(), 7);
    // (The global entry now answers for every matching image.)
    assert_eq!(
        password(&p.provide("other.io:5000/team/a", &pod("")).await.0),
        Some("p6")
    );
}

#[tokio::test]
async fn an_unknown_cache_key_type_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let p = recording(dir.path(), config(60, None), None);
    respond(dir.path(), "Pod", Some("1h"), "p7");
    assert!(p.provide("a.reg.io/x", &pod("")).await.0.is_empty());
    assert_eq!(p.cached(), 0);
}

// Real time: a plugin run waits on a child process, which paused time
// would time out at once. Expiry itself is tested in `cache` with paused
// time.
#[tokio::test]
async fn default_duration_applies_and_entries_expire() {
    let dir = tempfile::tempdir().unwrap();
    let p = recording(dir.path(), config(1, None), None);
    respond(dir.path(), "Image", None, "p1");
    p.provide("a.reg.io/x", &pod("")).await;
    p.provide("a.reg.io/x", &pod("")).await;
    assert_eq!(requests(dir.path()).len(), 1);
    assert_eq!(p.cached(), 1);
    // Past the one-second default: the entry has expired.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    p.provide("a.reg.io/x", &pod("")).await;
    assert_eq!(requests(dir.path()).len(), 2);
}

#[tokio::test]
async fn concurrent_requests_share_one_run() {
    let dir = tempfile::tempdir().unwrap();
    respond(dir.path(), "Image", Some("0s"), "p1");
    let p = recording(dir.path(), config(0, None), None);
    let who = pod("");
    let (a, b) = tokio::join!(p.provide("a.reg.io/x", &who), p.provide("a.reg.io/x", &who));
    assert_eq!(password(&a.0), Some("p1"));
    assert_eq!(password(&b.0), Some("p1"));
    assert_eq!(requests(dir.path()).len(), 1);
}

#[derive(Debug)]
struct Accounts(BTreeMap<String, String>);

impl ServiceAccounts for Accounts {
    fn get<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<ServiceAccount, String>> {
        Box::pin(async move {
            if name != "builder" {
                return Err(format!("serviceaccounts \"{name}\" not found"));
            }
            Ok(ServiceAccount {
                metadata: ObjectMeta {
                    name: Some(name.into()),
                    namespace: Some(namespace.into()),
                    uid: Some("sa-uid".into()),
                    annotations: Some(self.0.clone()),
                    ..Default::default()
                },
                ..Default::default()
            })
        })
    }
}

#[derive(Debug, Default)]
struct Issuer {
    calls: AtomicUsize,
    seen: Mutex<Vec<TokenRequest>>,
}

impl TokenRequester for Issuer {
    fn request<'a>(
        &'a self,
        _ns: &'a str,
        _sa: &'a str,
        r: &'a TokenRequest,
    ) -> BoxFuture<'a, Result<TokenRequest, TokenError>> {
        Box::pin(async move {
            let n = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
            lock(&self.seen).push(r.clone());
            let exp = jiff::Timestamp::now() + jiff::SignedDuration::from_secs(3600);
            Ok(TokenRequest {
                status: Some(TokenRequestStatus {
                    token: Some(format!("tok-{n}")),
                    expiration_timestamp: Some(Time(exp)),
                }),
                ..r.clone()
            })
        })
    }
}

fn token_mode(
    cache_type: &str,
    require: bool,
    annotations: &[(&str, &str)],
) -> (TokenAttributes, TokenSources, Arc<Issuer>) {
    let attrs = TokenAttributes {
        service_account_token_audience: "registry-aud".into(),
        cache_type: cache_type.into(),
        require_service_account: Some(require),
        required_service_account_annotation_keys: vec!["reg.io/role".into()],
        optional_service_account_annotation_keys: vec!["reg.io/opt".into(), "reg.io/absent".into()],
    };
    let issuer = Arc::new(Issuer::default());
    let sources = TokenSources {
        accounts: Arc::new(Accounts(
            annotations
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        )),
        tokens: TokenManager::new(issuer.clone(), Arc::new(keelson_common::clock::WallClock)),
    };
    (attrs, sources, issuer)
}

#[tokio::test]
async fn token_mode_sends_a_bound_token_and_the_annotations() {
    let dir = tempfile::tempdir().unwrap();
    respond(dir.path(), "Registry", Some("1h"), "registry-secret");
    let (attrs, sources, issuer) = token_mode(
        "ServiceAccount",
        true,
        &[
            ("reg.io/role", "puller"),
            ("reg.io/opt", "o"),
            ("other", "x"),
        ],
    );
    let p = recording(dir.path(), config(0, Some(attrs)), Some(sources));
    let (c, src) = p.provide("a.reg.io/x", &pod("builder")).await;
    assert_eq!(password(&c), Some("registry-secret"));
    assert_eq!(
        src,
        Some(Source::ServiceAccount {
            uid: "sa-uid".into(),
            namespace: "ns".into(),
            name: "builder".into()
        })
    );
    let reqs = requests(dir.path());
    assert_eq!(reqs[0]["serviceAccountToken"], "tok-1");
    assert_eq!(
        reqs[0]["serviceAccountAnnotations"],
        serde_json::json!({"reg.io/role": "puller", "reg.io/opt": "o"})
    );
    // The TokenRequest: the audience, bound to the pod, for the account's UID.
    let tr = lock(&issuer.seen)[0].clone();
    let spec = tr.spec.unwrap();
    assert_eq!(spec.audiences, Some(vec!["registry-aud".to_string()]));
    let bound = spec.bound_object_ref.unwrap();
    assert_eq!(
        (
            bound.kind.as_deref(),
            bound.name.as_deref(),
            bound.uid.as_deref()
        ),
        (Some("Pod"), Some("p"), Some("pod-uid"))
    );
    assert_eq!(tr.metadata.uid.as_deref(), Some("sa-uid"));
    // Cached per service account: the same account does not run it again.
    p.provide("a.reg.io/y", &pod("builder")).await;
    assert_eq!(requests(dir.path()).len(), 1);
}

#[tokio::test]
async fn token_mode_skips_pods_it_cannot_serve() {
    let dir = tempfile::tempdir().unwrap();
    respond(dir.path(), "Registry", Some("1h"), "x");
    // No required annotation on the account: no call.
    let (attrs, sources, _) = token_mode("ServiceAccount", true, &[]);
    let p = recording(dir.path(), config(0, Some(attrs)), Some(sources));
    assert!(p.provide("a.reg.io/x", &pod("builder")).await.0.is_empty());
    // A pod without a service account while one is required: no call.
    assert!(p.provide("a.reg.io/x", &pod("")).await.0.is_empty());
    // A missing account: an error, no credentials.
    assert!(p.provide("a.reg.io/x", &pod("ghost")).await.0.is_empty());
    assert!(requests(dir.path()).is_empty());
    // requireServiceAccount false: called without a token.
    let (mut attrs, sources, _) = token_mode("ServiceAccount", false, &[]);
    attrs.required_service_account_annotation_keys.clear();
    let p = recording(dir.path(), config(0, Some(attrs)), Some(sources));
    let (c, src) = p.provide("a.reg.io/x", &pod("")).await;
    assert!(!c.is_empty());
    assert_eq!(src, None);
    assert!(requests(dir.path())[0].get("serviceAccountToken").is_none());
}

#[tokio::test]
async fn an_echoed_token_is_refused_unless_cache_type_is_token() {
    let dir = tempfile::tempdir().unwrap();
    respond(dir.path(), "Image", Some("1h"), "tok-1");
    let (attrs, sources, _) = token_mode("ServiceAccount", true, &[("reg.io/role", "r")]);
    let p = recording(dir.path(), config(0, Some(attrs)), Some(sources));
    assert!(p.provide("a.reg.io/x", &pod("builder")).await.0.is_empty());
    let (attrs, sources, _) = token_mode("Token", true, &[("reg.io/role", "r")]);
    let p = recording(dir.path(), config(0, Some(attrs)), Some(sources));
    assert_eq!(
        password(&p.provide("a.reg.io/x", &pod("builder")).await.0),
        Some("tok-1")
    );
}
