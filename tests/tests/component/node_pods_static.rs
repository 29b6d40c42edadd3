//! Component tests of static pods: a manifest in `staticPodPath` runs as
//! `<name>-<node>`, gets a mirror pod in the API (owned by the Node,
//! annotated with the manifest hash) carrying its status; a deleted mirror
//! pod comes back; removing the manifest stops the pod and deletes the
//! mirror.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use crate::node_pods_support::*;
use keelson_tests::support::wait_for;
use kube::api::DeleteParams;

const T: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn static_pod_runs_with_a_mirror_pod() {
    let manifests = tempfile::tempdir().unwrap();
    let path = manifests.path().to_path_buf();
    let manifest = manifests.path().join("web.yaml");
    std::fs::write(
        &manifest,
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\n  namespace: default\nspec:\n  terminationGracePeriodSeconds: 3\n  containers:\n  - name: app\n    image: {IMAGE}\n"
        ),
    )
    .unwrap();
    let w = World::with(Options {
        configure: Some(Box::new(move |c| {
            c.static_pod_path = Some(path.clone());
            c.file_check_frequency = keelson::config::KubeDuration::from_secs(1);
        })),
        ..Default::default()
    })
    .await;
    let name = format!("web-{}", w.node);
    let mirror = w.wait_phase(&name, "Running", T).await;
    let ann = mirror.metadata.annotations.clone().unwrap();
    assert!(ann.contains_key("kubernetes.io/config.mirror"));
    assert_eq!(ann["kubernetes.io/config.source"], "file");
    assert_eq!(
        ann["kubernetes.io/config.mirror"],
        ann["kubernetes.io/config.hash"]
    );
    let owner = &mirror.metadata.owner_references.clone().unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str()),
        ("Node", w.node.as_str())
    );
    assert!(container_status(&mirror, "app").unwrap().ready);
    // The pod runs under the static pod's own UID, not the mirror's.
    let sandbox = w.fake.sandboxes().into_iter().next().unwrap();
    assert_eq!(sandbox.metadata.as_ref().unwrap().name, name);
    assert_ne!(
        sandbox.metadata.as_ref().unwrap().uid,
        mirror.metadata.uid.clone().unwrap()
    );

    // A deleted mirror pod is recreated.
    let dp = DeleteParams {
        grace_period_seconds: Some(0),
        ..Default::default()
    };
    let _ = w.pods().delete(&name, &dp).await.unwrap();
    let old_uid = mirror.metadata.uid.clone().unwrap();
    w.wait_pod(&name, "mirror recreated", T, |p| {
        if p.metadata.uid.as_deref() != Some(old_uid.as_str()) {
            Ok(())
        } else {
            Err("old mirror".into())
        }
    })
    .await;
    // The pod kept running meanwhile.
    assert!(w.fake.calls_to("StopContainer").is_empty());

    // Removing the manifest stops the pod and deletes the mirror.
    std::fs::remove_file(&manifest).unwrap();
    w.wait_gone(&name, T).await;
    wait_for(
        "static pod stopped",
        T,
        Duration::from_millis(100),
        || async {
            let running = w
                .fake
                .containers()
                .into_iter()
                .filter(|c| c.state == 1)
                .count();
            if running == 0 {
                Ok(())
            } else {
                Err(format!("{running} running"))
            }
        },
    )
    .await
    .unwrap();
}
