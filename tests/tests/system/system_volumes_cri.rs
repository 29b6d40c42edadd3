//! System test of the volume manager with a real containerd (runc, bind
//! mounts into real containers): a pod mounting a configMap (whole and by
//! subPath), a secret, a downwardAPI file, a projected service account
//! token and emptyDirs reads them from inside its container (CRI exec),
//! sees a configMap update within two sync periods while the subPath copy
//! stays, and after the pod is gone nothing is mounted and its directory
//! is removed. The pod's sandbox and container are driven over CRI here;
//! the whole node role is exercised by `system_volumes_node`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::HashMap;
use std::time::Duration;

use crate::node_volumes_support::*;
use base64::Engine;
use keelson::node::volumes::MountOptions;
use keelson_cri::{RuntimeClient, api, image_spec};
use keelson_tests::containerd::Containerd;
use keelson_tests::images::BUSYBOX_IMAGE;
use keelson_tests::support::{require_root, wait_for};
use serde_json::json;

const SYNC: Duration = Duration::from_secs(2);

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn container_reads_every_volume_type() {
    if !require_root("container_reads_every_volume_type") {
        return;
    }
    let ctrd = Containerd::start().await.expect("containerd");
    let cri = ctrd.client().clone();
    let w = World::new(SYNC).await;
    w.create_config_map("app-config", &[("app.conf", "color=blue"), ("other", "x")])
        .await;
    w.create_secret("db", &[("password", b"hunter2")]).await;
    let pod = w
        .pod_with_meta(
            "reader",
            json!({"labels": {"app": "reader"}}),
            json!({
                "containers": [{"name": "app", "image": BUSYBOX_IMAGE, "command": ["sleep", "3600"],
                    "volumeMounts": [
                        {"name": "cfg", "mountPath": "/etc/app"},
                        {"name": "cfg", "mountPath": "/etc/app.conf", "subPath": "app.conf"},
                        {"name": "sec", "mountPath": "/etc/db"},
                        {"name": "info", "mountPath": "/etc/podinfo"},
                        {"name": "scratch", "mountPath": "/scratch"},
                        {"name": "mem", "mountPath": "/mem"}
                    ]}],
                "volumes": [
                    {"name": "cfg", "configMap": {"name": "app-config"}},
                    {"name": "sec", "secret": {"secretName": "db", "defaultMode": 0o400}},
                    {"name": "info", "downwardAPI": {"items": [
                        {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}}
                    ]}},
                    {"name": "scratch", "emptyDir": {}},
                    {"name": "mem", "emptyDir": {"medium": "Memory", "sizeLimit": "8Mi"}}
                ]
            }),
        )
        .await;
    let u = uid(&pod);
    w.vm.setup_pod(&pod).await.expect("volumes ready");

    // Sandbox and container with the manager's mounts.
    let sb_config = ctrd.sandbox_config("default", "reader", &u);
    let sb = cri
        .run_pod_sandbox(sb_config.clone(), "")
        .await
        .expect("sandbox");
    let spec_container = pod.spec.as_ref().unwrap().containers[0].clone();
    let mounts =
        w.vm.container_mounts(&pod, &spec_container, &MountOptions::default())
            .await
            .expect("mounts");
    // The ServiceAccount admission added the token volume and its mount.
    assert!(
        mounts
            .iter()
            .any(|m| m.container_path == "/var/run/secrets/kubernetes.io/serviceaccount"),
        "{mounts:?}"
    );
    let config = api::ContainerConfig {
        metadata: Some(api::ContainerMetadata {
            name: "app".into(),
            attempt: 0,
        }),
        image: Some(image_spec(BUSYBOX_IMAGE)),
        command: vec!["sleep".into(), "3600".into()],
        log_path: "app/0.log".into(),
        mounts,
        labels: HashMap::from([(
            "io.kubernetes.container.name".to_string(),
            "app".to_string(),
        )]),
        ..Default::default()
    };
    let id = cri
        .create_container(&sb, config, sb_config)
        .await
        .expect("create");
    cri.start_container(&id).await.expect("start");

    // Everything reads as expected from inside.
    assert_eq!(
        exec(&cri, &id, "cat /etc/app/app.conf").await.unwrap(),
        "color=blue"
    );
    assert_eq!(
        exec(&cri, &id, "cat /etc/app.conf").await.unwrap(),
        "color=blue"
    );
    assert_eq!(
        exec(&cri, &id, "cat /etc/db/password").await.unwrap(),
        "hunter2"
    );
    assert_eq!(
        exec(&cri, &id, "stat -L -c %a /etc/db/password")
            .await
            .unwrap()
            .trim(),
        "400"
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
    assert_eq!(claims["kubernetes.io"]["pod"]["uid"], json!(u));
    assert_eq!(
        exec(
            &cri,
            &id,
            "cat /var/run/secrets/kubernetes.io/serviceaccount/namespace"
        )
        .await
        .unwrap(),
        "default"
    );
    exec(&cri, &id, "echo hello > /scratch/f && echo mem > /mem/f")
        .await
        .unwrap();
    let scratch = volume_dir(&w, &pod, "kubernetes.io~empty-dir", "scratch");
    assert_eq!(read(&scratch.join("f")).unwrap(), "hello\n");
    // Read-only and tmpfs as the container sees them.
    let proc_mounts = exec(&cri, &id, "cat /proc/mounts").await.unwrap();
    let line = |path: &str| {
        proc_mounts
            .lines()
            .find(|l| l.split(' ').nth(1) == Some(path))
            .unwrap_or_else(|| panic!("{path} not mounted: {proc_mounts}"))
            .to_string()
    };
    assert!(
        line("/etc/db").starts_with("tmpfs /etc/db tmpfs ro"),
        "{}",
        line("/etc/db")
    );
    assert!(line("/etc/app").contains(" ro,"), "{}", line("/etc/app"));
    assert!(
        line("/mem").starts_with("tmpfs /mem tmpfs rw"),
        "{}",
        line("/mem")
    );
    assert!(line("/mem").contains("size=8192k"), "{}", line("/mem"));
    assert!(
        exec(&cri, &id, "echo x > /etc/app/new").await.is_err(),
        "configMap is read-only"
    );

    // An update is visible inside within two sync periods; the subPath copy stays.
    w.set_config_map("app-config", &[("app.conf", "color=green"), ("other", "x")])
        .await;
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
    assert_eq!(
        exec(&cri, &id, "cat /etc/app.conf").await.unwrap(),
        "color=blue"
    );

    // The pod goes away: container and sandbox removed, volumes torn down.
    cri.stop_container(&id, Duration::ZERO).await.expect("stop");
    cri.remove_container(&id).await.expect("remove");
    cri.stop_pod_sandbox(&sb).await.expect("stop sandbox");
    cri.remove_pod_sandbox(&sb).await.expect("remove sandbox");
    w.vm.remove_pod_dir(&u).await.expect("pod dir removed");
    assert!(
        mounts_below(w.root()).is_empty(),
        "{:?}",
        mounts_below(w.root())
    );
    assert!(!w.vm.pod_dir(&u).exists());
}
