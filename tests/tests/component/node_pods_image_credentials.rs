//! Component tests of KubeletEnsureSecretPulledImages (beta, on in v1.36):
//! an image the node pulled with a pod's Secret is used by another pod only
//! with credentials that could pull it — without them the node pulls again
//! and the registry's refusal shows; an image on the node that the node did
//! not pull (preloaded) is used by any pod; the waiting message of
//! ImagePullBackOff keeps the pull's error.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use crate::node_pods_support::*;
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::PostParams;
use serde_json::json;

const PRIVATE: &str = "registry.example/team/private:1";

async fn pull_secret(w: &World, name: &str, user: &str, pass: &str) {
    let config = json!({"auths": {"registry.example": {"username": user, "password": pass}}});
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": name},
        "type": "kubernetes.io/dockerconfigjson",
        "stringData": {".dockerconfigjson": config.to_string()},
    }))
    .unwrap();
    Api::<Secret>::namespaced(w.admin.clone(), &w.ns)
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
}

fn pod_spec(secret: Option<&str>) -> serde_json::Value {
    let mut spec = json!({
        "terminationGracePeriodSeconds": 1,
        "containers": [{"name": "app", "image": PRIVATE, "imagePullPolicy": "IfNotPresent"}],
    });
    if let Some(s) = secret {
        spec["imagePullSecrets"] = json!([{"name": s}]);
    }
    spec
}

fn waiting_message(p: &k8s_openapi::api::core::v1::Pod) -> String {
    container_status(p, "app")
        .and_then(|s| s.state.as_ref()?.waiting.as_ref()?.message.clone())
        .unwrap_or_default()
}

#[tokio::test(start_paused = true)]
async fn an_image_pulled_with_a_secret_needs_credentials_that_could_pull_it() {
    let w = World::with(Options {
        paused: true,
        ..Default::default()
    })
    .await;
    w.fake.add_registry_image(PRIVATE, Some(("team", "s3cret")));
    pull_secret(&w, "good", "team", "s3cret").await;
    pull_secret(&w, "same-creds", "team", "s3cret").await;
    pull_secret(&w, "wrong", "team", "nope").await;

    // The first pod pulls with its Secret.
    w.create_pod("first", pod_spec(Some("good"))).await;
    w.wait_phase("first", "Running", Duration::from_secs(30))
        .await;
    w.wait_event(
        "first",
        "Pulled",
        "Successfully pulled image",
        Duration::from_secs(10),
    )
    .await;
    assert_eq!(w.fake.calls_to("PullImage").len(), 1);
    // The pull is on record under the root dir, as kubelet keeps it.
    let pulled = w.config.root_dir.join("image_manager/pulled");
    assert_eq!(std::fs::read_dir(&pulled).unwrap().count(), 1);

    // Without a Secret: the node pulls again, the registry refuses, the
    // image stays out of reach and its presence is not revealed.
    w.create_pod("stranger", pod_spec(None)).await;
    let p = w
        .wait_pod(
            "stranger",
            "ErrImagePull",
            Duration::from_secs(30),
            |p| match waiting_reason(p, "app").as_deref() {
                Some("ErrImagePull") => Ok(p.clone()),
                other => Err(format!("{other:?}")),
            },
        )
        .await;
    assert!(
        waiting_message(&p).contains("401 Unauthorized"),
        "{}",
        waiting_message(&p)
    );
    assert!(w.fake.calls_to("PullImage").len() >= 2);
    // The next attempt is in back-off; its message keeps the pull's error.
    let p = w
        .wait_pod(
            "stranger",
            "ImagePullBackOff",
            Duration::from_secs(60),
            |p| match waiting_reason(p, "app").as_deref() {
                Some("ImagePullBackOff") => Ok(p.clone()),
                other => Err(format!("{other:?}")),
            },
        )
        .await;
    let msg = waiting_message(&p);
    assert!(
        msg.starts_with(&format!(
            "Back-off pulling image \"{PRIVATE}\": ErrImagePull: "
        )) && msg.contains("401 Unauthorized"),
        "{msg}"
    );

    // A wrong password: pulls, and is refused too.
    w.create_pod("wrong", pod_spec(Some("wrong"))).await;
    w.wait_pod(
        "wrong",
        "ErrImagePull",
        Duration::from_secs(30),
        |p| match waiting_reason(p, "app").as_deref() {
            Some("ErrImagePull") => Ok(()),
            other => Err(format!("{other:?}")),
        },
    )
    .await;

    // Another Secret with the same credentials: no pull.
    let pulls = w.fake.calls_to("PullImage").len();
    w.create_pod("twin", pod_spec(Some("same-creds"))).await;
    w.wait_phase("twin", "Running", Duration::from_secs(30))
        .await;
    w.wait_event(
        "twin",
        "Pulled",
        "already present on machine and can be accessed by the pod",
        Duration::from_secs(10),
    )
    .await;
    assert_eq!(w.fake.calls_to("PullImage").len(), pulls);
    let m = w.metrics();
    assert!(
        m.contains("kubelet_imagemanager_image_mustpull_checks_total{result=\"mustAuthenticate\"}")
            && m.contains("kubelet_imagemanager_image_mustpull_checks_total{result=\"credentialRecordFound\"} 1"),
        "{m}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_preloaded_image_is_used_by_any_pod() {
    let w = World::new().await;
    // On the node, not pulled by it.
    w.fake.add_image(PRIVATE);
    w.create_pod("any", pod_spec(None)).await;
    w.wait_phase("any", "Running", Duration::from_secs(30))
        .await;
    w.wait_event(
        "any",
        "Pulled",
        &format!("Container image \"{PRIVATE}\" already present on machine and can be accessed by the pod"),
        Duration::from_secs(10),
    )
    .await;
    assert!(w.fake.calls_to("PullImage").is_empty());
}
