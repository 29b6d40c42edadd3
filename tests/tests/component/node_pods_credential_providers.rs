//! Component tests of kubelet's credential provider plugins
//! (`--image-credential-provider-config`, `--image-credential-provider-bin-dir`):
//! a real executable speaking the exec protocol (a shell script that
//! records each CredentialProviderRequest) gives the credentials a private
//! image in the fake runtime's registry needs; without them the registry
//! refuses the pull. The response cache spares the plugin further runs, a
//! failing plugin leaves the pull anonymous (and refused), and in service
//! account token mode the plugin gets a token bound to the pod with the
//! configured audience and the account's annotations.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::time::Duration;

use crate::node_pods_support::*;
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::Api;
use kube::api::PostParams;
use serde_json::json;

const PRIVATE: &str = "registry.example/team/private:1";
const OTHER: &str = "registry.example/team/other:2";

/// A plugin dir with `recorder` (records requests, answers with
/// `response.json`) and its configuration.
struct Plugin {
    dir: tempfile::TempDir,
}

impl Plugin {
    fn new(config: serde_json::Value) -> Plugin {
        let dir = tempfile::tempdir().unwrap();
        let script = format!(
            "#!/bin/sh\n\
             # Records the request (one line) and the arguments, then answers.\n\
             (cat; echo) >> {dir}/requests\n\
             echo \"$@ $PLUGIN_MODE\" >> {dir}/args\n\
             if [ -f {dir}/fail ]; then echo 'no credentials for you' >&2; exit 1; fi\n\
             cat {dir}/response.json\n",
            dir = dir.path().display()
        );
        let bin = dir.path().join("bin");
        std::fs::create_dir(&bin).unwrap();
        std::fs::write(bin.join("recorder"), script).unwrap();
        std::fs::set_permissions(bin.join("recorder"), std::fs::Permissions::from_mode(0o755))
            .unwrap();
        std::fs::write(
            dir.path().join("config.yaml"),
            serde_yaml::to_string(&config).unwrap(),
        )
        .unwrap();
        Plugin { dir }
    }

    fn respond(&self, password: &str, key_type: &str, cache_duration: &str) {
        let r = json!({
            "kind": "CredentialProviderResponse",
            "apiVersion": "credentialprovider.kubelet.k8s.io/v1",
            "cacheKeyType": key_type,
            "cacheDuration": cache_duration,
            "auth": {"*.example": {"username": "team", "password": password}},
        });
        std::fs::write(self.dir.path().join("response.json"), r.to_string()).unwrap();
    }

    fn requests(&self) -> Vec<serde_json::Value> {
        std::fs::read_to_string(self.dir.path().join("requests"))
            .unwrap_or_default()
            .lines()
            .filter(|l| !l.is_empty())
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    fn paths(&self) -> (PathBuf, PathBuf) {
        (
            self.dir.path().join("config.yaml"),
            self.dir.path().join("bin"),
        )
    }
}

fn provider(extra: serde_json::Value) -> serde_json::Value {
    let mut p = json!({
        "name": "recorder",
        "matchImages": ["*.example", "other.io:5000"],
        "defaultCacheDuration": "1m",
        "apiVersion": "credentialprovider.kubelet.k8s.io/v1",
        "args": ["get-credentials"],
        "env": [{"name": "PLUGIN_MODE", "value": "test"}],
    });
    if let serde_json::Value::Object(m) = extra {
        for (k, v) in m {
            p[k] = v;
        }
    }
    json!({
        "apiVersion": "kubelet.config.k8s.io/v1",
        "kind": "CredentialProviderConfig",
        "providers": [p],
    })
}

async fn world_with(plugin: &Plugin) -> World {
    let (config, bin) = plugin.paths();
    World::with(Options {
        configure: Some(Box::new(move |c| {
            c.image_credential_provider_config = Some(config.clone());
            c.image_credential_provider_bin_dir = Some(bin.clone());
        })),
        ..Default::default()
    })
    .await
}

fn pod_spec(image: &str, policy: &str) -> serde_json::Value {
    json!({
        "terminationGracePeriodSeconds": 1,
        "containers": [{"name": "app", "image": image, "imagePullPolicy": policy}],
    })
}

fn metric(w: &World, name: &str) -> f64 {
    use prometheus::proto::MetricType;
    w.registry
        .gather()
        .iter()
        .filter(|f| f.name() == name)
        .map(|f| {
            let kind = f.get_field_type();
            f.get_metric()
                .iter()
                .map(|m| match kind {
                    MetricType::COUNTER => m.get_counter().value(),
                    MetricType::HISTOGRAM => m.get_histogram().get_sample_count() as f64,
                    _ => m.get_gauge().value(),
                })
                .sum::<f64>()
        })
        .sum()
}

async fn wait_err_image_pull(w: &World, pod: &str) -> String {
    let p = w
        .wait_pod(
            pod,
            "ErrImagePull",
            Duration::from_secs(30),
            |p| match waiting_reason(p, "app").as_deref() {
                Some("ErrImagePull") => Ok(p.clone()),
                other => Err(format!("{other:?}")),
            },
        )
        .await;
    container_status(&p, "app")
        .and_then(|s| s.state.as_ref()?.waiting.as_ref()?.message.clone())
        .unwrap_or_default()
}

#[tokio::test]
async fn a_plugin_supplies_the_credentials_a_private_image_needs() {
    let plugin = Plugin::new(provider(json!({})));
    plugin.respond("s3cret", "Registry", "5m");
    let w = world_with(&plugin).await;
    w.fake.add_registry_image(PRIVATE, Some(("team", "s3cret")));
    w.fake.add_registry_image(OTHER, Some(("team", "s3cret")));

    // No imagePullSecrets: the plugin's credentials pull the image.
    w.create_pod("first", pod_spec(PRIVATE, "IfNotPresent"))
        .await;
    w.wait_phase("first", "Running", Duration::from_secs(30))
        .await;
    let reqs = plugin.requests();
    assert_eq!(reqs.len(), 1, "{reqs:?}");
    assert_eq!(
        reqs[0],
        json!({
            "kind": "CredentialProviderRequest",
            "apiVersion": "credentialprovider.kubelet.k8s.io/v1",
            "image": "registry.example/team/private",
        })
    );
    let args = std::fs::read_to_string(plugin.dir.path().join("args")).unwrap();
    assert_eq!(args, "get-credentials test\n");
    assert_eq!(
        metric(&w, "kubelet_credential_provider_plugin_duration"),
        1.0
    );
    assert_eq!(metric(&w, "kubelet_credential_provider_config_info"), 1.0);

    // The response is cached by registry: another image of the registry
    // (pulled: Always) needs no further run.
    w.create_pod("second", pod_spec(OTHER, "Always")).await;
    w.wait_phase("second", "Running", Duration::from_secs(30))
        .await;
    assert_eq!(plugin.requests().len(), 1);
    assert_eq!(w.fake.calls_to("PullImage").len(), 2);

    // The node's credentials pulled PRIVATE: any pod may use it, and the
    // plugin is not asked.
    w.create_pod("third", pod_spec(PRIVATE, "IfNotPresent"))
        .await;
    w.wait_phase("third", "Running", Duration::from_secs(30))
        .await;
    assert_eq!(plugin.requests().len(), 1);
    assert_eq!(w.fake.calls_to("PullImage").len(), 2);
}

#[tokio::test]
async fn without_the_plugin_credentials_the_pull_is_refused() {
    let plugin = Plugin::new(provider(json!({})));
    // Wrong credentials (not cached): the registry refuses.
    plugin.respond("wrong", "Image", "0s");
    let w = world_with(&plugin).await;
    w.fake.add_registry_image(PRIVATE, Some(("team", "s3cret")));
    w.create_pod("wrong", pod_spec(PRIVATE, "IfNotPresent"))
        .await;
    let msg = wait_err_image_pull(&w, "wrong").await;
    assert!(msg.contains("401 Unauthorized"), "{msg}");

    // A failing plugin: no credentials, the pull goes out anonymously and
    // is refused; the failure is counted.
    std::fs::write(plugin.dir.path().join("fail"), "").unwrap();
    w.create_pod("failing", pod_spec(PRIVATE, "IfNotPresent"))
        .await;
    let msg = wait_err_image_pull(&w, "failing").await;
    assert!(msg.contains("401 Unauthorized"), "{msg}");
    assert!(metric(&w, "kubelet_credential_provider_plugin_errors_total") >= 1.0);

    // An image the plugin does not match is pulled without asking it
    // (the pods above keep retrying, so only this image's requests count).
    w.fake.add_registry_image("public.io/app:1", None);
    w.create_pod("public", pod_spec("public.io/app:1", "IfNotPresent"))
        .await;
    w.wait_phase("public", "Running", Duration::from_secs(30))
        .await;
    assert!(
        plugin
            .requests()
            .iter()
            .all(|r| r["image"] != "public.io/app"),
        "{:?}",
        plugin.requests()
    );
}

#[tokio::test]
async fn token_mode_sends_a_token_bound_to_the_pod() {
    let plugin = Plugin::new(provider(json!({
        "tokenAttributes": {
            "serviceAccountTokenAudience": "registry.example",
            "requireServiceAccount": true,
            "requiredServiceAccountAnnotationKeys": ["registry.example/role"],
            "cacheType": "ServiceAccount",
        },
    })));
    plugin.respond("s3cret", "Registry", "5m");
    let w = world_with(&plugin).await;
    w.fake.add_registry_image(PRIVATE, Some(("team", "s3cret")));
    let sa: ServiceAccount = serde_json::from_value(json!({
        "metadata": {"name": "builder", "annotations": {"registry.example/role": "puller"}},
    }))
    .unwrap();
    Api::<ServiceAccount>::namespaced(w.admin.clone(), &w.ns)
        .create(&PostParams::default(), &sa)
        .await
        .unwrap();
    let plain: ServiceAccount =
        serde_json::from_value(json!({"metadata": {"name": "plain"}})).unwrap();
    Api::<ServiceAccount>::namespaced(w.admin.clone(), &w.ns)
        .create(&PostParams::default(), &plain)
        .await
        .unwrap();

    // An account without the required annotation: the plugin is not
    // called, the pull is anonymous and refused.
    let mut spec = pod_spec(PRIVATE, "IfNotPresent");
    spec["serviceAccountName"] = json!("plain");
    w.create_pod("plain", spec).await;
    let msg = wait_err_image_pull(&w, "plain").await;
    assert!(msg.contains("401 Unauthorized"), "{msg}");
    assert!(plugin.requests().is_empty());

    let mut spec = pod_spec(PRIVATE, "IfNotPresent");
    spec["serviceAccountName"] = json!("builder");
    w.create_pod("built", spec).await;
    w.wait_phase("built", "Running", Duration::from_secs(30))
        .await;
    let reqs = plugin.requests();
    assert_eq!(reqs.len(), 1, "{reqs:?}");
    assert_eq!(reqs[0]["image"], "registry.example/team/private");
    assert_eq!(
        reqs[0]["serviceAccountAnnotations"],
        json!({"registry.example/role": "puller"})
    );
    let token = reqs[0]["serviceAccountToken"].as_str().unwrap();
    let claims = jwt_claims(token);
    assert_eq!(claims["aud"], json!(["registry.example"]), "{claims}");
    let pod = w.get("built").await.unwrap();
    assert_eq!(
        claims["kubernetes.io"]["pod"]["uid"].as_str(),
        pod.metadata.uid.as_deref(),
        "{claims}"
    );
    assert_eq!(claims["kubernetes.io"]["serviceaccount"]["name"], "builder");
}

/// The claims of a JWT (not verified: the test API server issued it).
fn jwt_claims(token: &str) -> serde_json::Value {
    let part = token.split('.').nth(1).unwrap();
    let bytes =
        base64::Engine::decode(&base64::engine::general_purpose::URL_SAFE_NO_PAD, part).unwrap();
    serde_json::from_slice(&bytes).unwrap()
}

/// Runs `keelson check-config` with the plugin's two flags.
fn check_config(plugin: &Plugin) -> std::process::Output {
    let bin = keelson_tests::node_harness::keelson_bin().expect("built keelson binary");
    let (config, dir) = plugin.paths();
    std::process::Command::new(&bin)
        .args(["check-config", "--image-credential-provider-config"])
        .arg(&config)
        .arg("--image-credential-provider-bin-dir")
        .arg(&dir)
        .output()
        .unwrap()
}

/// `keelson check-config` runs the checks the node role runs at start and
/// says what is wrong in kubelet's words, once.
#[test]
fn check_config_refuses_a_bad_plugin_configuration() {
    let plugin = Plugin::new(provider(
        json!({"defaultCacheDuration": "-1m", "name": "a b"}),
    ));
    let out = check_config(&plugin);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr).trim(),
        "error: failed to register CRI auth plugins: failed to validate credential provider config: [providers.name: Invalid value: \"a b\": provider name cannot contain spaces, providers.defaultCacheDuration: Invalid value: \"-1m0s\": must be greater than or equal to 0]"
    );

    // A valid configuration whose executable is missing.
    let plugin = Plugin::new(provider(json!({"name": "missing"})));
    let out = check_config(&plugin);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr).trim(),
        format!(
            "error: failed to register CRI auth plugins: plugin binary executable {} did not exist",
            plugin.paths().1.join("missing").display()
        )
    );

    // A good one passes and shows in the effective configuration.
    let plugin = Plugin::new(provider(json!({})));
    let out = check_config(&plugin);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let yaml = String::from_utf8_lossy(&out.stdout);
    assert!(
        yaml.contains(&format!(
            "imageCredentialProviderConfig: {}",
            plugin.paths().0.display()
        )),
        "{yaml}"
    );
}
