//! System test of volumes through the whole node role: the real `keelson`
//! binary runs in a containerd harness's namespace against the test API
//! server; a pod bound to the node mounts a configMap, a secret, a
//! downwardAPI file, a projected service account token and an emptyDir and
//! reads them from inside its container (CRI exec), sees a configMap update
//! within two sync periods, and after the pod is deleted nothing of it is
//! mounted and its directory is gone.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::node_volumes_support::{MountGuard, mounts_below};
use base64::Engine;
use k8s_openapi::api::core::v1::{ConfigMap, Event, Pod, Secret};
use keelson_cri::{RuntimeClient, api};
use keelson_tests::containerd::Containerd;
use keelson_tests::images::BUSYBOX_IMAGE;
use keelson_tests::node_harness::{BinaryNode, BinaryNodeOptions};
use keelson_tests::support::{require_root, wait_for};
use keelson_tests::testapi::{TestApiOptions, TestApiServer};
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use serde_json::json;

const SYNC: Duration = Duration::from_secs(3);

/// Stops keelson first, then unmounts what is left below its root, then
/// lets the node's directory go — in that order also when the test fails.
struct Node {
    node: Option<BinaryNode>,
    root: PathBuf,
    name: String,
}

impl Node {
    fn log_tail(&self, lines: usize) -> String {
        self.node
            .as_ref()
            .map(|n| n.log_tail(lines))
            .unwrap_or_default()
    }
}

/// containerd, the test API server and keelson on them (pod and volume
/// sync period `sync`); drop the node first.
async fn start(sync: Duration) -> (Containerd, TestApiServer, Node) {
    let ctrd = Containerd::start().await.expect("containerd");
    let api = TestApiServer::start(TestApiOptions::default())
        .await
        .expect("api");
    let node = BinaryNode::start(
        &ctrd,
        &api,
        BinaryNodeOptions {
            configure: Some(Arc::new(move |c| {
                c.node.sync_frequency =
                    keelson::config::duration::KubeDuration::from_secs(sync.as_secs());
            })),
            ..Default::default()
        },
    )
    .expect("keelson");
    let node = Node {
        name: node.node_name.clone(),
        root: node.config.node.root_dir.clone(),
        node: Some(node),
    };
    (ctrd, api, node)
}

impl Drop for Node {
    fn drop(&mut self) {
        if let Some(n) = self.node.as_mut() {
            n.stop(Duration::from_secs(10));
        }
        drop(MountGuard(self.root.clone()));
        self.node.take();
    }
}

async fn exec(cri: &RuntimeClient, id: &str, cmd: &str) -> Result<String, String> {
    let r = cri
        .exec_sync(
            id,
            vec!["sh".into(), "-c".into(), cmd.into()],
            Duration::from_secs(10),
        )
        .await
        .map_err(|e| e.to_string())?;
    if r.exit_code != 0 {
        return Err(format!(
            "`{cmd}` exited {}: {}",
            r.exit_code,
            String::from_utf8_lossy(&r.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&r.stdout).into_owned())
}

/// The running container `name` of the pod with `uid`.
async fn running_container(cri: &RuntimeClient, uid: &str, name: &str) -> Result<String, String> {
    let list = cri.list_containers(None).await.map_err(|e| e.to_string())?;
    list.into_iter()
        .find(|c| {
            c.labels.get("io.kubernetes.pod.uid").map(String::as_str) == Some(uid)
                && c.metadata.as_ref().map(|m| m.name.as_str()) == Some(name)
                && c.state == api::ContainerState::ContainerRunning as i32
        })
        .map(|c| c.id)
        .ok_or_else(|| "container not running yet".to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_reads_its_volumes_and_they_go_with_it() {
    if !require_root("pod_reads_its_volumes_and_they_go_with_it") {
        return;
    }
    let (ctrd, api, node) = start(SYNC).await;
    let cri = ctrd.client().clone();
    let client = api.client().await;
    let node_name = node.name.clone();
    let root = node.root.clone();

    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let secrets: Api<Secret> = Api::namespaced(client.clone(), "default");
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    cms.create(
        &PostParams::default(),
        &serde_json::from_value(
            json!({"metadata": {"name": "app-config"}, "data": {"app.conf": "color=blue"}}),
        )
        .unwrap(),
    )
    .await
    .unwrap();
    secrets
        .create(
            &PostParams::default(),
            &serde_json::from_value(
                json!({"metadata": {"name": "db"}, "stringData": {"password": "hunter2"}}),
            )
            .unwrap(),
        )
        .await
        .unwrap();
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "reader", "labels": {"app": "reader"}},
        "spec": {
            "nodeName": node_name,
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "app", "image": BUSYBOX_IMAGE,
                "command": ["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 1; done"],
                "volumeMounts": [
                    {"name": "cfg", "mountPath": "/etc/app"},
                    {"name": "sec", "mountPath": "/etc/db"},
                    {"name": "info", "mountPath": "/etc/podinfo"},
                    {"name": "scratch", "mountPath": "/scratch"}
                ]}],
            "volumes": [
                {"name": "cfg", "configMap": {"name": "app-config"}},
                {"name": "sec", "secret": {"secretName": "db"}},
                {"name": "info", "downwardAPI": {"items": [{"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}}]}},
                {"name": "scratch", "emptyDir": {"medium": "Memory"}}
            ]
        }
    }))
    .unwrap();
    let pod = pods.create(&PostParams::default(), &pod).await.unwrap();
    let uid = pod.metadata.uid.clone().unwrap();

    let id = wait_for(
        "the pod's container running",
        Duration::from_secs(60),
        Duration::from_millis(200),
        || running_container(&cri, &uid, "app"),
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\nkeelson log:\n{}", node.log_tail(60)));

    assert_eq!(
        exec(&cri, &id, "cat /etc/app/app.conf").await.unwrap(),
        "color=blue"
    );
    assert_eq!(
        exec(&cri, &id, "cat /etc/db/password").await.unwrap(),
        "hunter2"
    );
    assert_eq!(
        exec(&cri, &id, "cat /etc/podinfo/labels").await.unwrap(),
        "app=\"reader\""
    );
    let token = exec(
        &cri,
        &id,
        "cat /var/run/secrets/kubernetes.io/serviceaccount/token",
    )
    .await
    .unwrap();
    let claims: serde_json::Value = serde_json::from_slice(
        &base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(token.split('.').nth(1).unwrap())
            .unwrap(),
    )
    .unwrap();
    assert_eq!(claims["kubernetes.io"]["pod"]["uid"], json!(uid));
    exec(&cri, &id, "echo hi > /scratch/f && cat /scratch/f")
        .await
        .unwrap();
    let pod_dir = root.join("pods").join(&uid);
    assert!(
        mounts_below(&pod_dir).iter().any(|m| m.fstype == "tmpfs"),
        "secret, projected and Memory emptyDir volumes are tmpfs mounts"
    );

    // A configMap update is visible inside within two sync periods.
    let mut cm = cms.get("app-config").await.unwrap();
    cm.data = Some([("app.conf".to_string(), "color=green".to_string())].into());
    cms.replace("app-config", &PostParams::default(), &cm)
        .await
        .unwrap();
    wait_for(
        "configMap update inside the container",
        SYNC * 2,
        Duration::from_millis(100),
        || async {
            match exec(&cri, &id, "cat /etc/app/app.conf").await {
                Ok(s) if s == "color=green" => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await
    .unwrap();

    // The pod is deleted: its volumes are unmounted and its directory removed.
    pods.delete("reader", &DeleteParams::default())
        .await
        .unwrap();
    wait_for(
        "pod gone from the API",
        Duration::from_secs(30),
        Duration::from_millis(200),
        || async {
            match pods.get_opt("reader").await {
                Ok(None) => Ok(()),
                Ok(Some(_)) => Err("still there".into()),
                Err(e) => Err(e.to_string()),
            }
        },
    )
    .await
    .unwrap();
    wait_for(
        "pod volumes unmounted and removed",
        Duration::from_secs(30),
        Duration::from_millis(200),
        || async {
            let left = mounts_below(&pod_dir);
            if left.is_empty() && !pod_dir.exists() {
                Ok(())
            } else {
                Err(format!("mounts {left:?}, dir exists: {}", pod_dir.exists()))
            }
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\nkeelson log:\n{}", node.log_tail(60)));
    drop(node);
}

/// A ConfigMap volume whose ConfigMap does not exist yet: keelson reports
/// FailedMount, and once the ConfigMap is created the container starts at
/// the volume's next mount retry (kubelet's reconciler retries after
/// 500 ms, 1 s, 2 s, ... and WaitForAttachAndMount polls every 300 ms),
/// not after the pod worker's 10 s error backoff.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_configmap_created_after_its_pod_is_mounted_at_the_next_retry() {
    if !require_root("a_configmap_created_after_its_pod_is_mounted_at_the_next_retry") {
        return;
    }
    // kubelet's default sync period: no periodic sync comes in between.
    let (ctrd, api, node) = start(Duration::from_secs(60)).await;
    let cri = ctrd.client().clone();
    let client = api.client().await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "late"},
        "spec": {
            "nodeName": node.name,
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "app", "image": BUSYBOX_IMAGE,
                "command": ["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 1; done"],
                "volumeMounts": [{"name": "cfg", "mountPath": "/etc/app"}]}],
            "volumes": [{"name": "cfg", "configMap": {"name": "late-config"}}]
        }
    }))
    .unwrap();
    let uid = pods
        .create(&PostParams::default(), &pod)
        .await
        .unwrap()
        .metadata
        .uid
        .unwrap();
    // Two failed mounts: the pod's first syncs (and the status writes
    // they cause) are over, so only a retry can start the container.
    wait_for(
        "FailedMount for the missing ConfigMap, twice",
        Duration::from_secs(60),
        Duration::from_millis(100),
        || async {
            let list = events
                .list(&Default::default())
                .await
                .map_err(|e| e.to_string())?;
            list.items
                .iter()
                .find(|e| {
                    e.involved_object.name.as_deref() == Some("late")
                        && e.reason.as_deref() == Some("FailedMount")
                        && e.message
                            .as_deref()
                            .is_some_and(|m| m.contains("configmap \"late-config\" not found"))
                        && e.count
                            .unwrap_or(1)
                            .max(e.series.as_ref().and_then(|s| s.count).unwrap_or(0))
                            >= 2
                })
                .map(|_| ())
                .ok_or_else(|| "not two FailedMount yet".to_string())
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\nkeelson log:\n{}", node.log_tail(60)));
    cms.create(
        &PostParams::default(),
        &serde_json::from_value(
            json!({"metadata": {"name": "late-config"}, "data": {"app.conf": "late=yes"}}),
        )
        .unwrap(),
    )
    .await
    .unwrap();
    // The pod worker's error backoff is at least 10 s; the volume's next
    // retry comes within ~4 s.
    let id = wait_for(
        "the container running after its ConfigMap appeared",
        Duration::from_secs(7),
        Duration::from_millis(100),
        || running_container(&cri, &uid, "app"),
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\nkeelson log:\n{}", node.log_tail(60)));
    assert_eq!(
        exec(&cri, &id, "cat /etc/app/app.conf").await.unwrap(),
        "late=yes"
    );
    pods.delete("late", &DeleteParams::default()).await.unwrap();
    drop(node);
}
