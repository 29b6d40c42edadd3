//! Component tests of the volume manager against the test API server, with
//! real mounts (tmpfs, hugetlbfs, bind) below a temporary root: every
//! volume type and mode, optional vs required sources, container mounts,
//! teardown and orphan cleanup, environment lookups.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::HashSet;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::node_volumes_support::*;
use base64::Engine;
use k8s_openapi::api::core::v1::{ConfigMapKeySelector, EnvFromSource, SecretKeySelector};
use keelson::node::volumes::mounter::{LinuxMounter, Mounter};
use keelson::node::volumes::{MountOptions, VolumeError};
use keelson_cri::api::MountPropagation;
use keelson_tests::support::{require_root, wait_for};
use kube::api::{Patch, PatchParams};
use serde_json::json;

const SYNC: Duration = Duration::from_secs(2);

fn container(mounts: serde_json::Value) -> serde_json::Value {
    json!({"name": "app", "image": "busybox", "volumeMounts": mounts})
}

fn jwt_claims(token: &str) -> serde_json::Value {
    let payload = token.split('.').nth(1).expect("JWT payload");
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload)
        .expect("base64");
    serde_json::from_slice(&bytes).expect("claims")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_map_and_secret_volumes() {
    if !require_root("config_map_and_secret_volumes") {
        return;
    }
    let w = World::new(SYNC).await;
    w.create_config_map("app", &[("a.conf", "alpha"), ("b.conf", "beta")])
        .await;
    w.create_secret("creds", &[("user", b"admin"), ("pass", b"s3cret")])
        .await;
    let pod = w
        .pod(
            "cm",
            json!({
                "containers": [container(json!([
                    {"name": "cfg", "mountPath": "/etc/app"},
                    {"name": "sec", "mountPath": "/etc/creds"}
                ]))],
                "volumes": [
                    {"name": "cfg", "configMap": {"name": "app", "defaultMode": 0o640,
                        "items": [{"key": "a.conf", "path": "conf/a"}, {"key": "b.conf", "path": "b", "mode": 0o600}]}},
                    {"name": "sec", "secret": {"secretName": "creds", "defaultMode": 0o400}}
                ]
            }),
        )
        .await;
    w.vm.setup_pod(&pod).await.unwrap();

    let cfg = volume_dir(&w, &pod, "kubernetes.io~configmap", "cfg");
    assert_eq!(read(&cfg.join("conf/a")).unwrap(), "alpha");
    assert_eq!(read(&cfg.join("b")).unwrap(), "beta");
    assert_eq!(mode(&cfg.join("conf/a")), 0o640);
    assert_eq!(mode(&cfg.join("b")), 0o600);
    // kubelet's layout: visible names are symlinks into ..data.
    assert_eq!(
        std::fs::read_link(cfg.join("conf")).unwrap(),
        PathBuf::from("..data/conf")
    );
    let data = std::fs::read_link(cfg.join("..data")).unwrap();
    assert!(data.to_string_lossy().starts_with(".."), "{data:?}");
    assert_eq!(mode(&cfg) & 0o777, 0o777);
    let mounts = mounts_below(w.root());
    assert!(
        !mounts.iter().any(|m| m.path == cfg),
        "configMap volumes live on disk"
    );

    let sec = volume_dir(&w, &pod, "kubernetes.io~secret", "sec");
    assert_eq!(read(&sec.join("pass")).unwrap(), "s3cret");
    assert_eq!(mode(&sec.join("user")), 0o400);
    let tmpfs = mounts
        .iter()
        .find(|m| m.path == sec)
        .expect("secret volume is a mount");
    assert_eq!(tmpfs.fstype, "tmpfs");
    // Sized by the node's allocatable memory (no pod limit): 8Gi.
    assert!(tmpfs.options.contains("size=8388608k"), "{}", tmpfs.options);

    // An update reaches the volume well within a sync period (watch).
    w.set_config_map("app", &[("a.conf", "ALPHA"), ("b.conf", "beta")])
        .await;
    wait_for(
        "configMap update in the volume",
        SYNC,
        Duration::from_millis(20),
        || async {
            match read(&cfg.join("conf/a")) {
                Ok(s) if s == "ALPHA" => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await
    .unwrap();
    // Only one data directory remains.
    // The old data directory goes right after the swap.
    wait_for(
        "one data directory",
        SYNC,
        Duration::from_millis(20),
        || async {
            let n = std::fs::read_dir(&cfg)
                .map_err(|e| e.to_string())?
                .filter_map(|e| e.ok())
                .filter(|e| {
                    let n = e.file_name().to_string_lossy().into_owned();
                    n.starts_with("..") && n != "..data"
                })
                .count();
            if n == 1 {
                Ok(())
            } else {
                Err(format!("{n} data directories"))
            }
        },
    )
    .await
    .unwrap();

    // kubelet's metric names.
    let text = (w.metrics)();
    for line in [
        "volume_manager_total_volumes{plugin_name=\"kubernetes.io/configmap\",state=\"actual_state_of_world\"} 1",
        "volume_manager_total_volumes{plugin_name=\"kubernetes.io/secret\",state=\"desired_state_of_world\"} 1",
        "storage_operation_duration_seconds_count{migrated=\"false\",operation_name=\"volume_mount\",status=\"success\",volume_plugin=\"kubernetes.io/secret\"}",
    ] {
        assert!(text.contains(line), "{line} missing in\n{text}");
    }

    w.vm.teardown_pod(&uid(&pod)).await.unwrap();
    assert!(mounts_below(w.root()).is_empty(), "tmpfs unmounted");
    let text = (w.metrics)();
    assert!(
        text.contains("storage_operation_duration_seconds_count{migrated=\"false\",operation_name=\"volume_unmount\",status=\"success\",volume_plugin=\"kubernetes.io/configmap\"} 1"),
        "{text}"
    );
    assert!(
        !text.contains("volume_manager_total_volumes{plugin_name=\"kubernetes.io/configmap\""),
        "{text}"
    );
    assert!(!cfg.exists() && !sec.exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_sources_optional_and_required() {
    if !require_root("missing_sources_optional_and_required") {
        return;
    }
    let w = World::new(SYNC).await;
    let pod = w
        .pod(
            "missing",
            json!({
                "containers": [container(json!([
                    {"name": "req", "mountPath": "/req"},
                    {"name": "opt", "mountPath": "/opt"},
                    {"name": "optkey", "mountPath": "/optkey"}
                ]))],
                "volumes": [
                    {"name": "req", "configMap": {"name": "later"}},
                    {"name": "opt", "secret": {"secretName": "nope", "optional": true}},
                    {"name": "optkey", "configMap": {"name": "kube-root-ca.crt", "optional": true,
                        "items": [{"key": "absent", "path": "x"}]}}
                ]
            }),
        )
        .await;
    let err = w.vm.setup_pod(&pod).await.unwrap_err();
    match &err {
        VolumeError::NotReady { unmounted, .. } => assert_eq!(unmounted, &vec!["req".to_string()]),
        other => panic!("unexpected {other:?}"),
    }
    assert_eq!(
        err.to_string(),
        "unmounted volumes=[req], unattached volumes=[], failed to process volumes=[]: MountVolume.SetUp failed for volume \"req\" : configmap \"later\" not found"
    );
    w.wait_event(
        "missing",
        "FailedMount",
        "MountVolume.SetUp failed for volume \"req\" : configmap \"later\" not found",
    )
    .await;
    // The optional ones are mounted, empty.
    let opt = volume_dir(&w, &pod, "kubernetes.io~secret", "opt");
    assert!(std::fs::read_link(opt.join("..data")).is_ok());
    let optkey = volume_dir(&w, &pod, "kubernetes.io~configmap", "optkey");
    assert!(!optkey.join("x").exists());

    // The object appears: the watch sees it and the volume is set up
    // without waiting for the retry backoff.
    w.create_config_map("later", &[("k", "v")]).await;
    let req = volume_dir(&w, &pod, "kubernetes.io~configmap", "req");
    wait_for(
        "required configMap mounted",
        Duration::from_secs(5),
        Duration::from_millis(20),
        || async { read(&req.join("k")) },
    )
    .await
    .unwrap();
    w.vm.setup_pod(&pod).await.unwrap();

    // A required key that does not exist.
    let bad = w
        .pod(
            "badkey",
            json!({
                "containers": [container(json!([{"name": "c", "mountPath": "/c"}]))],
                "volumes": [{"name": "c", "configMap": {"name": "later", "items": [{"key": "zz", "path": "z"}]}}]
            }),
        )
        .await;
    let err = w.vm.setup_pod(&bad).await.unwrap_err();
    assert!(
        err.to_string().ends_with("MountVolume.SetUp failed for volume \"c\" : configmap references non-existent config key: zz"),
        "{err}"
    );
    // Nothing half-made is left for the failed volume.
    assert!(!volume_dir(&w, &bad, "kubernetes.io~configmap", "c").exists());
    w.vm.teardown_pod(&uid(&pod)).await.unwrap();
    w.vm.teardown_pod(&uid(&bad)).await.unwrap();
    assert!(mounts_below(w.root()).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn downward_api_volume_follows_the_pod() {
    if !require_root("downward_api_volume_follows_the_pod") {
        return;
    }
    let w = World::new(SYNC).await;
    let pod = w
        .pod_with_meta(
            "dw",
            json!({"labels": {"app": "web", "tier": "front"}, "annotations": {"note": "a \"quoted\"\nline"}}),
            json!({
                "containers": [{"name": "app", "image": "busybox",
                    "resources": {"limits": {"memory": "64Mi"}, "requests": {"cpu": "250m", "memory": "64Mi"}},
                    "volumeMounts": [{"name": "info", "mountPath": "/info"}]}],
                "volumes": [{"name": "info", "downwardAPI": {"items": [
                    {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}},
                    {"path": "annotations", "fieldRef": {"fieldPath": "metadata.annotations"}},
                    {"path": "name", "fieldRef": {"fieldPath": "metadata.name"}},
                    {"path": "ns", "fieldRef": {"fieldPath": "metadata.namespace"}},
                    {"path": "uid", "fieldRef": {"fieldPath": "metadata.uid"}},
                    {"path": "tier", "fieldRef": {"fieldPath": "metadata.labels['tier']"}},
                    {"path": "mem", "mode": 0o600, "resourceFieldRef": {"containerName": "app", "resource": "limits.memory", "divisor": "1Mi"}},
                    {"path": "cpu", "resourceFieldRef": {"containerName": "app", "resource": "limits.cpu"}},
                    {"path": "cpu-req", "resourceFieldRef": {"containerName": "app", "resource": "requests.cpu", "divisor": "1m"}}
                ]}}]
            }),
        )
        .await;
    w.vm.setup_pod(&pod).await.unwrap();
    let d = volume_dir(&w, &pod, "kubernetes.io~downward-api", "info");
    assert_eq!(
        mounts_below(w.root())
            .iter()
            .find(|m| m.path == d)
            .map(|m| m.fstype.clone()),
        Some("tmpfs".to_string()),
        "downwardAPI volumes live on tmpfs, as kubelet's"
    );
    assert_eq!(
        read(&d.join("labels")).unwrap(),
        "app=\"web\"\ntier=\"front\""
    );
    assert_eq!(
        read(&d.join("annotations")).unwrap(),
        "note=\"a \\\"quoted\\\"\\nline\""
    );
    assert_eq!(read(&d.join("name")).unwrap(), "dw");
    assert_eq!(read(&d.join("ns")).unwrap(), "default");
    assert_eq!(read(&d.join("uid")).unwrap(), uid(&pod));
    assert_eq!(read(&d.join("tier")).unwrap(), "front");
    assert_eq!(read(&d.join("mem")).unwrap(), "64");
    assert_eq!(mode(&d.join("mem")), 0o600);
    assert_eq!(mode(&d.join("name")), 0o644);
    // No CPU limit: the node's allocatable CPU.
    assert_eq!(read(&d.join("cpu")).unwrap(), "4");
    assert_eq!(read(&d.join("cpu-req")).unwrap(), "250");

    // Labels change: the next sync with the updated pod rewrites the file.
    let patched = w
        .pods()
        .patch(
            "dw",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"tier": "back"}}})),
        )
        .await
        .unwrap();
    w.vm.setup_pod(&patched).await.unwrap();
    assert_eq!(
        read(&d.join("labels")).unwrap(),
        "app=\"web\"\ntier=\"back\""
    );
    assert_eq!(read(&d.join("tier")).unwrap(), "back");
    w.vm.remove_pod_dir(&uid(&pod)).await.unwrap();
    assert!(!w.vm.pod_dir(&uid(&pod)).exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn projected_volumes_with_bound_tokens() {
    if !require_root("projected_volumes_with_bound_tokens") {
        return;
    }
    let w = World::new(SYNC).await;
    w.create_config_map("proj-cm", &[("setting", "on")]).await;
    w.create_secret("proj-s", &[("key", b"k3y")]).await;
    // The ServiceAccount admission adds the kube-api-access volume and its
    // mount, as on a real cluster.
    let pod = w
        .pod(
            "proj",
            json!({
                "securityContext": {"fsGroup": 2345},
                "containers": [container(json!([{"name": "mix", "mountPath": "/mix"}]))],
                "volumes": [{"name": "mix", "projected": {"sources": [
                    {"configMap": {"name": "proj-cm"}},
                    {"secret": {"name": "proj-s", "items": [{"key": "key", "path": "s/key"}]}},
                    {"downwardAPI": {"items": [{"path": "pod", "fieldRef": {"fieldPath": "metadata.name"}}]}},
                    {"serviceAccountToken": {"path": "vault-token", "audience": "vault", "expirationSeconds": 600}},
                    {"clusterTrustBundle": {"signerName": "example.com/signer", "path": "ca.pem", "optional": true,
                        "labelSelector": {}}}
                ]}}]
            }),
        )
        .await;
    let access = pod
        .spec
        .as_ref()
        .unwrap()
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name.starts_with("kube-api-access-"))
        .expect("admission added the token volume")
        .name
        .clone();
    w.vm.setup_pod(&pod).await.unwrap();

    let sa = volume_dir(&w, &pod, "kubernetes.io~projected", &access);
    let token = read(&sa.join("token")).unwrap();
    let claims = jwt_claims(&token);
    assert_eq!(claims["kubernetes.io"]["pod"]["uid"], json!(uid(&pod)));
    assert_eq!(claims["kubernetes.io"]["pod"]["name"], json!("proj"));
    assert_eq!(
        claims["sub"],
        json!("system:serviceaccount:default:default")
    );
    assert_eq!(read(&sa.join("namespace")).unwrap(), "default");
    assert!(
        read(&sa.join("ca.crt"))
            .unwrap()
            .contains("BEGIN CERTIFICATE")
    );
    // fsGroup: token 0600 widened to 0640 and group-owned; the tmpfs root
    // keeps its sticky bit and gains setgid.
    assert_eq!(mode(&sa.join("token")), 0o640);
    assert_eq!(std::fs::metadata(sa.join("token")).unwrap().gid(), 2345);
    assert_eq!(mode(&sa.join("namespace")), 0o644);
    let mounts = mounts_below(w.root());
    assert_eq!(
        mounts
            .iter()
            .find(|m| m.path == sa)
            .map(|m| m.fstype.as_str()),
        Some("tmpfs")
    );

    let mix = volume_dir(&w, &pod, "kubernetes.io~projected", "mix");
    assert_eq!(read(&mix.join("setting")).unwrap(), "on");
    assert_eq!(read(&mix.join("s/key")).unwrap(), "k3y");
    assert_eq!(read(&mix.join("pod")).unwrap(), "proj");
    assert!(!mix.join("ca.pem").exists());
    let vault = jwt_claims(&read(&mix.join("vault-token")).unwrap());
    assert_eq!(vault["aud"], json!(["vault"]));
    assert_eq!(
        vault["exp"].as_i64().unwrap() - vault["iat"].as_i64().unwrap(),
        600
    );
    w.wait_event("proj", "ClusterTrustBundleSkipped", "example.com/signer")
        .await;

    // A required ClusterTrustBundle source fails the volume clearly.
    let strict = w
        .pod(
            "strict",
            json!({
                "containers": [container(json!([{"name": "b", "mountPath": "/b"}]))],
                "volumes": [{"name": "b", "projected": {"sources": [
                    {"clusterTrustBundle": {"name": "bundle", "path": "ca.pem"}}
                ]}}]
            }),
        )
        .await;
    let err = w.vm.setup_pod(&strict).await.unwrap_err().to_string();
    assert!(
        err.contains("keelson does not project ClusterTrustBundles"),
        "{err}"
    );

    w.vm.teardown_pod(&uid(&pod)).await.unwrap();
    w.vm.teardown_pod(&uid(&strict)).await.unwrap();
    assert!(mounts_below(w.root()).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_dir_media_and_fs_group() {
    if !require_root("empty_dir_media_and_fs_group") {
        return;
    }
    let w = World::new(SYNC).await;
    let pod = w
        .pod(
            "ed",
            json!({
                "securityContext": {"fsGroup": 3000},
                "containers": [{"name": "app", "image": "busybox",
                    "resources": {"limits": {"memory": "64Mi", "hugepages-2Mi": "4Mi"}, "requests": {"memory": "64Mi", "hugepages-2Mi": "4Mi"}},
                    "volumeMounts": [
                        {"name": "disk", "mountPath": "/d"}, {"name": "mem", "mountPath": "/m"},
                        {"name": "small", "mountPath": "/s"}, {"name": "huge", "mountPath": "/h"}
                    ]}],
                "volumes": [
                    {"name": "disk", "emptyDir": {}},
                    {"name": "mem", "emptyDir": {"medium": "Memory"}},
                    {"name": "small", "emptyDir": {"medium": "Memory", "sizeLimit": "16Mi"}},
                    {"name": "huge", "emptyDir": {"medium": "HugePages"}}
                ]
            }),
        )
        .await;
    w.vm.setup_pod(&pod).await.unwrap();
    let dir = |n: &str| volume_dir(&w, &pod, "kubernetes.io~empty-dir", n);
    let mounts = mounts_below(w.root());
    let fs = |p: &Path| mounts.iter().find(|m| m.path == p).cloned();

    assert!(fs(&dir("disk")).is_none());
    // 0777 plus fsGroup's setgid; group-owned.
    assert_eq!(mode(&dir("disk")), 0o2777);
    assert_eq!(std::fs::metadata(dir("disk")).unwrap().gid(), 3000);
    // Memory: sized by the pod's memory limit, then by sizeLimit.
    let mem = fs(&dir("mem")).expect("tmpfs");
    assert_eq!(mem.fstype, "tmpfs");
    assert!(mem.options.contains("size=65536k"), "{}", mem.options);
    // Memory-backed volumes never swap (tmpfs noswap, kernel 6.4+).
    let release = nix::sys::utsname::uname()
        .unwrap()
        .release()
        .to_string_lossy()
        .into_owned();
    let mut v = release.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    if (v.next().unwrap_or(0), v.next().unwrap_or(0)) >= (6, 4) {
        assert!(mem.options.contains("noswap"), "{}", mem.options);
    }
    let small = fs(&dir("small")).expect("tmpfs");
    assert!(small.options.contains("size=16384k"), "{}", small.options);
    let huge = fs(&dir("huge")).expect("hugetlbfs");
    assert_eq!(huge.fstype, "hugetlbfs");
    assert!(huge.options.contains("pagesize=2M"), "{}", huge.options);
    // Data written survives a re-sync (no remount of emptyDirs).
    std::fs::write(dir("mem").join("f"), "x").unwrap();
    w.vm.setup_pod(&pod).await.unwrap();
    assert_eq!(read(&dir("mem").join("f")).unwrap(), "x");
    assert_eq!(mounts_below(w.root()).len(), mounts.len());

    w.vm.teardown_pod(&uid(&pod)).await.unwrap();
    assert!(mounts_below(w.root()).is_empty());
    assert!(!dir("disk").exists() && !dir("mem").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_path_types_and_container_mounts() {
    if !require_root("host_path_types_and_container_mounts") {
        return;
    }
    let w = World::new(SYNC).await;
    let host = tempfile::tempdir().unwrap();
    let h = |p: &str| host.path().join(p).to_string_lossy().into_owned();
    std::fs::write(host.path().join("file"), "f").unwrap();
    w.create_config_map("mounted", &[("app.conf", "v1"), ("other", "o")])
        .await;
    let pod = w
        .pod(
            "hp",
            json!({
                "containers": [{"name": "app", "image": "busybox", "volumeMounts": [
                    {"name": "created", "mountPath": "/data", "mountPropagation": "HostToContainer"},
                    {"name": "file", "mountPath": "/f", "readOnly": true},
                    {"name": "cfg", "mountPath": "/etc/app.conf", "subPath": "app.conf"},
                    {"name": "cfg", "mountPath": "/etc/cfg"},
                    {"name": "scratch", "mountPath": "/logs", "subPathExpr": "logs/$(POD_NAME)"},
                    {"name": "scratch", "mountPath": "/bi", "mountPropagation": "Bidirectional",
                        "readOnly": true}
                ]}],
                "volumes": [
                    {"name": "created", "hostPath": {"path": h("new/dir"), "type": "DirectoryOrCreate"}},
                    {"name": "file", "hostPath": {"path": h("file"), "type": "File"}},
                    {"name": "cfg", "configMap": {"name": "mounted"}},
                    {"name": "scratch", "emptyDir": {}}
                ]
            }),
        )
        .await;
    w.vm.setup_pod(&pod).await.unwrap();
    assert!(host.path().join("new/dir").is_dir());
    let c = pod.spec.as_ref().unwrap().containers[0].clone();
    let env = vec![("POD_NAME".to_string(), "hp".to_string())];
    let opts = MountOptions {
        env: &env,
        runtime_supports_rro: false,
    };
    let mounts = w.vm.container_mounts(&pod, &c, &opts).await.unwrap();
    let by_path = |p: &str| {
        mounts
            .iter()
            .find(|m| m.container_path == p)
            .cloned()
            .unwrap()
    };
    let data = by_path("/data");
    assert_eq!(data.host_path, h("new/dir"));
    assert_eq!(
        data.propagation,
        MountPropagation::PropagationHostToContainer as i32
    );
    assert!(!data.readonly);
    assert!(!data.selinux_relabel, "hostPath is never relabeled");
    assert!(by_path("/f").readonly);
    let cfg = by_path("/etc/cfg");
    assert!(cfg.readonly, "configMap volumes are always read-only");
    assert_eq!(cfg.propagation, MountPropagation::PropagationPrivate as i32);
    let bi = by_path("/bi");
    assert_eq!(
        bi.propagation,
        MountPropagation::PropagationBidirectional as i32
    );

    // subPath: a bind of the current file under volume-subpaths.
    let sub = by_path("/etc/app.conf");
    let pod_dir = w.vm.pod_dir(&uid(&pod));
    assert_eq!(
        PathBuf::from(&sub.host_path),
        pod_dir.join("volume-subpaths/cfg/app/2")
    );
    assert_eq!(read(Path::new(&sub.host_path)).unwrap(), "v1");
    assert!(sub.readonly);
    let logs = by_path("/logs");
    assert_eq!(
        PathBuf::from(&logs.host_path),
        pod_dir.join("volume-subpaths/scratch/app/4")
    );
    let scratch = volume_dir(&w, &pod, "kubernetes.io~empty-dir", "scratch");
    assert!(
        scratch.join("logs/hp").is_dir(),
        "subPath directory created"
    );
    std::fs::write(Path::new(&logs.host_path).join("x.log"), "line").unwrap();
    assert_eq!(read(&scratch.join("logs/hp/x.log")).unwrap(), "line");

    // A configMap update reaches the volume but not the subPath bind.
    w.set_config_map("mounted", &[("app.conf", "v2"), ("other", "o")])
        .await;
    let vol = volume_dir(&w, &pod, "kubernetes.io~configmap", "cfg");
    wait_for(
        "volume updated",
        SYNC,
        Duration::from_millis(20),
        || async {
            match read(&vol.join("app.conf")) {
                Ok(s) if s == "v2" => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await
    .unwrap();
    assert_eq!(read(Path::new(&sub.host_path)).unwrap(), "v1");
    // A new container (restart) gets the current file.
    let again = w.vm.container_mounts(&pod, &c, &opts).await.unwrap();
    let sub2 = again
        .iter()
        .find(|m| m.container_path == "/etc/app.conf")
        .unwrap();
    assert_eq!(read(Path::new(&sub2.host_path)).unwrap(), "v2");

    // Errors: missing subPathExpr variable, escaping subPath.
    let err =
        w.vm.container_mounts(&pod, &c, &MountOptions::default())
            .await
            .unwrap_err();
    assert_eq!(err.to_string(), "missing value for POD_NAME");

    // hostPath type mismatch.
    let bad = w
        .pod(
            "hpbad",
            json!({
                "containers": [container(json!([{"name": "x", "mountPath": "/x"}]))],
                "volumes": [{"name": "x", "hostPath": {"path": h("file"), "type": "Directory"}}]
            }),
        )
        .await;
    let err = w.vm.setup_pod(&bad).await.unwrap_err().to_string();
    assert!(
        err.ends_with(&format!(
            "hostPath type check failed: {} is not a directory",
            h("file")
        )),
        "{err}"
    );

    w.vm.teardown_pod(&uid(&pod)).await.unwrap();
    w.vm.teardown_pod(&uid(&bad)).await.unwrap();
    let left = mounts_below(w.root());
    assert!(left.is_empty(), "subPath binds unmounted: {left:?}");
    assert!(
        host.path().join("new/dir").is_dir(),
        "hostPath content is never removed"
    );
    assert_eq!(read(&host.path().join("file")).unwrap(), "f");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orphaned_pod_dirs_are_removed_at_start() {
    if !require_root("orphaned_pod_dirs_are_removed_at_start") {
        return;
    }
    let w = World::new(SYNC).await;
    // A previous keelson left a pod with a tmpfs volume and a subPath bind.
    let orphan = w.vm.pod_dir("0000-orphan");
    let sec = orphan.join("volumes/kubernetes.io~secret/tok");
    std::fs::create_dir_all(&sec).unwrap();
    LinuxMounter.mount_fs("tmpfs", &sec, "tmpfs", &[]).unwrap();
    std::fs::write(sec.join("token"), "t").unwrap();
    let bind = orphan.join("volume-subpaths/tok/app/0");
    std::fs::create_dir_all(bind.parent().unwrap()).unwrap();
    std::fs::write(&bind, "").unwrap();
    LinuxMounter.bind(&sec.join("token"), &bind).unwrap();
    let keep = w.vm.pod_dir("1111-active");
    std::fs::create_dir_all(keep.join("volumes")).unwrap();

    let active: HashSet<String> = ["1111-active".to_string()].into();
    assert_eq!(w.vm.cleanup_orphans(&active).await.unwrap(), 1);
    assert!(!orphan.exists());
    assert!(keep.exists());
    assert!(mounts_below(w.root()).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn environment_lookups() {
    if !require_root("environment_lookups") {
        return;
    }
    let w = World::new(SYNC).await;
    w.create_config_map("env-cm", &[("A", "1"), ("B", "2")])
        .await;
    w.create_secret("env-s", &[("PASS", b"pw")]).await;
    let pod = w
        .pod(
            "env",
            json!({"containers": [{"name": "app", "image": "busybox",
                "env": [
                    {"name": "X", "valueFrom": {"configMapKeyRef": {"name": "env-cm", "key": "A"}}},
                    {"name": "Y", "valueFrom": {"secretKeyRef": {"name": "env-s", "key": "PASS"}}},
                    {"name": "Z", "valueFrom": {"configMapKeyRef": {"name": "gone", "key": "A", "optional": true}}}
                ],
                "envFrom": [{"configMapRef": {"name": "env-cm"}, "prefix": "CM_"}, {"secretRef": {"name": "gone-s", "optional": true}}]
            }]}),
        )
        .await;
    w.vm.register_pod(&pod);
    let cm_sel = |name: &str, key: &str, optional: bool| ConfigMapKeySelector {
        name: name.into(),
        key: key.into(),
        optional: Some(optional),
    };
    let s_sel = |name: &str, key: &str, optional: bool| SecretKeySelector {
        name: name.into(),
        key: key.into(),
        optional: Some(optional),
    };
    assert_eq!(
        w.vm.env_config_map_key("default", &cm_sel("env-cm", "A", false))
            .await
            .unwrap(),
        Some("1".into())
    );
    assert_eq!(
        w.vm.env_secret_key("default", &s_sel("env-s", "PASS", false))
            .await
            .unwrap(),
        Some("pw".into())
    );
    assert_eq!(
        w.vm.env_config_map_key("default", &cm_sel("gone", "A", true))
            .await
            .unwrap(),
        None
    );
    assert_eq!(
        w.vm.env_config_map_key("default", &cm_sel("env-cm", "Q", true))
            .await
            .unwrap(),
        None
    );
    assert_eq!(
        w.vm.env_config_map_key("default", &cm_sel("env-cm", "Q", false))
            .await
            .unwrap_err()
            .to_string(),
        "couldn't find key Q in ConfigMap default/env-cm"
    );
    assert_eq!(
        w.vm.env_secret_key("default", &s_sel("env-s", "Q", false))
            .await
            .unwrap_err()
            .to_string(),
        "couldn't find key Q in Secret default/env-s"
    );
    assert_eq!(
        w.vm.env_config_map_key("default", &cm_sel("gone", "A", false))
            .await
            .unwrap_err()
            .to_string(),
        "configmap \"gone\" not found"
    );
    let from: EnvFromSource =
        serde_json::from_value(json!({"configMapRef": {"name": "env-cm"}, "prefix": "CM_"}))
            .unwrap();
    assert_eq!(
        w.vm.env_from("default", &from).await.unwrap(),
        vec![
            ("CM_A".to_string(), "1".to_string()),
            ("CM_B".to_string(), "2".to_string())
        ]
    );
    let gone: EnvFromSource =
        serde_json::from_value(json!({"secretRef": {"name": "gone-s", "optional": true}})).unwrap();
    assert!(w.vm.env_from("default", &gone).await.unwrap().is_empty());
    // Not referenced by any registered pod: the node may not read it.
    w.create_config_map("unreferenced", &[("A", "1")]).await;
    assert_eq!(
        w.vm.env_config_map_key("default", &cm_sel("unreferenced", "A", false))
            .await
            .unwrap_err()
            .to_string(),
        "object \"default\"/\"unreferenced\" not registered"
    );
}
