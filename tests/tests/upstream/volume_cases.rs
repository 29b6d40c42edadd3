//! PersistentVolumes on the node: `local` and `hostPath` PVs bound by
//! kube-controller-manager's PV binder to claims a pod writes and a second
//! pod reads (read-only), a generic ephemeral volume whose claim the
//! ephemeral controller creates, and a pod waiting for a claim that binds
//! only later. Pods are bound with `nodeName` (the tier runs no
//! scheduler); every PV is pre-bound with a `claimRef` so that concurrent
//! cases never take each other's volumes.

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, anyhow, ensure};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use keelson_tests::support::wait_for;
use keelson_tests::upstream::{Agents, Case, Env};
use kube::Api;
use kube::api::{DeleteParams, PostParams};

use crate::support::{busybox_pod, create_pod, namespace, wait_event, wait_pod};

pub const CASES: &[Case] = &[Case {
    name: "pod_persistent_volumes",
    agents: &Agents::ALL,
    run: |env, agents| Box::pin(pod_persistent_volumes(env, agents)),
}];

/// The group the writer pod asks for; a `local` volume gets it, a
/// `hostPath` one does not (kubelet manages ownership of the former only).
const FS_GROUP: u32 = 2345;

fn pv(
    name: &str,
    ns: &str,
    claim: &str,
    node: &str,
    source: serde_json::Value,
) -> anyhow::Result<PersistentVolume> {
    let mut spec = serde_json::json!({
        "capacity": {"storage": "1Mi"},
        "accessModes": ["ReadWriteOnce"],
        "storageClassName": "",
        "persistentVolumeReclaimPolicy": "Retain",
        "claimRef": {"namespace": ns, "name": claim},
        "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
            {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}
        ]}]}},
    });
    for (k, v) in source.as_object().ok_or_else(|| anyhow!("source"))? {
        spec[k] = v.clone();
    }
    Ok(serde_json::from_value(
        serde_json::json!({"metadata": {"name": name}, "spec": spec}),
    )?)
}

fn claim_spec() -> serde_json::Value {
    serde_json::json!({
        "accessModes": ["ReadWriteOnce"],
        "storageClassName": "",
        "resources": {"requests": {"storage": "1Mi"}},
    })
}

async fn create_claim(c: &kube::Client, ns: &str, name: &str) -> anyhow::Result<()> {
    let pvc: PersistentVolumeClaim = serde_json::from_value(
        serde_json::json!({"metadata": {"name": name}, "spec": claim_spec()}),
    )?;
    Api::<PersistentVolumeClaim>::namespaced(c.clone(), ns)
        .create(&PostParams::default(), &pvc)
        .await
        .with_context(|| format!("creating claim {ns}/{name}"))?;
    Ok(())
}

/// Waits for the pod to succeed; its termination message.
async fn succeeded(c: &kube::Client, ns: &str, name: &str) -> anyhow::Result<String> {
    wait_pod(
        c,
        ns,
        name,
        "the pod to succeed",
        Duration::from_secs(150),
        |p| {
            let st = p.status.as_ref().ok_or("no status")?;
            match st.phase.as_deref() {
                Some("Succeeded") => {}
                Some("Failed") => return Ok(Err(format!("pod failed: {st:?}"))),
                other => return Err(format!("phase {other:?}")),
            }
            Ok(Ok(st
                .container_statuses
                .iter()
                .flatten()
                .find_map(|c| c.state.as_ref()?.terminated.as_ref()?.message.clone())
                .unwrap_or_default()))
        },
    )
    .await?
    .map_err(|e| anyhow!(e))
}

fn mounts_below(dir: &Path) -> anyhow::Result<Vec<String>> {
    let table = std::fs::read_to_string("/proc/self/mountinfo")?;
    let dir = dir.display().to_string();
    Ok(table
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|p| p.starts_with(&dir))
        .map(String::from)
        .collect())
}

async fn pod_persistent_volumes(env: Arc<Env>, agents: Agents) -> anyhow::Result<()> {
    let node = env.node(agents).await?;
    let c = &env.admin;
    let ns = namespace(c, "pv").await?;
    let base = node.dir().join(format!("pv-{ns}"));
    let local_dir = base.join("local");
    let host_dir = base.join("host");
    let eph_dir = base.join("eph");
    for d in [&local_dir, &eph_dir] {
        std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
    }
    let pvs: Api<PersistentVolume> = Api::all(c.clone());
    let path = |p: &Path| p.display().to_string();
    let volumes = [
        pv(
            &format!("{ns}-local"),
            &ns,
            "local",
            &node.name,
            serde_json::json!({"local": {"path": path(&local_dir)}}),
        )?,
        pv(
            &format!("{ns}-host"),
            &ns,
            "host",
            &node.name,
            serde_json::json!({"hostPath": {"path": path(&host_dir), "type": "DirectoryOrCreate"}}),
        )?,
        pv(
            &format!("{ns}-eph"),
            &ns,
            "eph-scratch",
            &node.name,
            serde_json::json!({"hostPath": {"path": path(&eph_dir), "type": "Directory"}}),
        )?,
    ];
    for v in &volumes {
        pvs.create(&PostParams::default(), v).await?;
    }
    let result = async {
        create_claim(c, &ns, "local").await?;
        create_claim(c, &ns, "host").await?;

        // A writer: both claims read-write, fsGroup set.
        let mut writer = busybox_pod(
            "writer",
            &node.name,
            "echo local-data > /l/file && echo host-data > /h/file",
        );
        writer["spec"]["restartPolicy"] = "Never".into();
        writer["spec"]["securityContext"] = serde_json::json!({"fsGroup": FS_GROUP});
        writer["spec"]["volumes"] = serde_json::json!([
            {"name": "l", "persistentVolumeClaim": {"claimName": "local"}},
            {"name": "h", "persistentVolumeClaim": {"claimName": "host"}},
        ]);
        writer["spec"]["containers"][0]["volumeMounts"] = serde_json::json!([
            {"name": "l", "mountPath": "/l"},
            {"name": "h", "mountPath": "/h"},
        ]);
        let writer = create_pod(c, &ns, writer).await?;
        succeeded(c, &ns, "writer").await?;
        ensure!(
            std::fs::read_to_string(local_dir.join("file"))? == "local-data\n",
            "the writer's file is in the local PV's directory"
        );
        ensure!(std::fs::read_to_string(host_dir.join("file"))? == "host-data\n");
        let gid = |p: &Path| std::fs::metadata(p).map(|m| m.gid());
        ensure!(
            gid(&local_dir)? == FS_GROUP && gid(&local_dir.join("file"))? == FS_GROUP,
            "fsGroup applied to the local volume: gid {}",
            gid(&local_dir)?
        );
        ensure!(
            std::fs::metadata(&local_dir)?.mode() & 0o2000 != 0,
            "setgid on the local volume's root"
        );
        ensure!(
            gid(&host_dir)? != FS_GROUP,
            "no fsGroup on a hostPath volume"
        );

        // The writer deleted: its volumes are unmounted.
        let pods: Api<Pod> = Api::namespaced(c.clone(), &ns);
        pods.delete("writer", &DeleteParams::default()).await?;
        wait_for(
            "the writer pod to be gone",
            Duration::from_secs(90),
            Duration::from_millis(250),
            || async {
                match pods.get_opt("writer").await {
                    Ok(None) => Ok(()),
                    Ok(Some(_)) => Err("still there".to_string()),
                    Err(e) => Err(e.to_string()),
                }
            },
        )
        .await?;
        let writer_dir = node
            .node_root_dir()
            .join("pods")
            .join(writer.metadata.uid.clone().unwrap_or_default());
        // kubelet may let the API object go before its unmounts finish.
        wait_for(
            "the writer's volumes to be unmounted",
            Duration::from_secs(30),
            Duration::from_millis(250),
            || async {
                let left = mounts_below(&writer_dir).map_err(|e| e.to_string())?;
                left.is_empty()
                    .then_some(())
                    .ok_or_else(|| format!("mounts left: {left:?}"))
            },
        )
        .await?;

        // A reader: the local claim read-only.
        let mut reader = busybox_pod(
            "reader",
            &node.name,
            "{ echo \"local=$(cat /l/file)\"; echo \"host=$(cat /h/file)\"; \
             if touch /l/new 2>/dev/null; then echo ro=writable; else echo ro=refused; fi; \
             } > /dev/termination-log",
        );
        reader["spec"]["restartPolicy"] = "Never".into();
        reader["spec"]["volumes"] = serde_json::json!([
            {"name": "l", "persistentVolumeClaim": {"claimName": "local", "readOnly": true}},
            {"name": "h", "persistentVolumeClaim": {"claimName": "host"}},
        ]);
        reader["spec"]["containers"][0]["volumeMounts"] = serde_json::json!([
            {"name": "l", "mountPath": "/l"},
            {"name": "h", "mountPath": "/h"},
        ]);
        create_pod(c, &ns, reader).await?;
        let message = succeeded(c, &ns, "reader").await?;
        for want in ["local=local-data", "host=host-data", "ro=refused"] {
            ensure!(message.contains(want), "{want:?} not in {message:?}");
        }

        // A generic ephemeral volume: the claim `eph-scratch` is created by
        // the ephemeral controller and bound to the pre-bound PV.
        let mut eph = busybox_pod("eph", &node.name, "echo eph-data > /s/file");
        eph["spec"]["restartPolicy"] = "Never".into();
        eph["spec"]["volumes"] = serde_json::json!([
            {"name": "scratch", "ephemeral": {"volumeClaimTemplate": {"spec": claim_spec()}}},
        ]);
        eph["spec"]["containers"][0]["volumeMounts"] =
            serde_json::json!([{"name": "scratch", "mountPath": "/s"}]);
        create_pod(c, &ns, eph).await?;
        succeeded(c, &ns, "eph").await?;
        ensure!(std::fs::read_to_string(eph_dir.join("file"))? == "eph-data\n");

        // A claim with no volume yet: the pod waits in ContainerCreating
        // with kubelet's FailedMount event, and starts once it binds.
        create_claim(c, &ns, "late").await?;
        let mut waiter = busybox_pod("waiter", &node.name, "echo late-data > /d/file");
        waiter["spec"]["restartPolicy"] = "Never".into();
        waiter["spec"]["volumes"] =
            serde_json::json!([{"name": "data", "persistentVolumeClaim": {"claimName": "late"}}]);
        waiter["spec"]["containers"][0]["volumeMounts"] =
            serde_json::json!([{"name": "data", "mountPath": "/d"}]);
        create_pod(c, &ns, waiter).await?;
        let ev = wait_event(
            c,
            &ns,
            "waiter",
            "FailedMount",
            &format!("failed to process volumes=[data]: error processing PVC {ns}/late: PVC is not bound"),
            Duration::from_secs(90),
        )
        .await?;
        let text = ev.message.unwrap_or_default();
        ensure!(
            text.starts_with("Unable to attach or mount volumes: unmounted volumes=["),
            "{text}"
        );
        wait_pod(
            c,
            &ns,
            "waiter",
            "ContainerCreating",
            Duration::from_secs(30),
            |p| {
                let st = p.status.as_ref().ok_or("no status")?;
                let reason = st
                    .container_statuses
                    .iter()
                    .flatten()
                    .find_map(|c| c.state.as_ref()?.waiting.as_ref()?.reason.clone());
                (st.phase.as_deref() == Some("Pending")
                    && reason.as_deref() == Some("ContainerCreating"))
                .then_some(())
                .ok_or_else(|| format!("phase {:?}, waiting reason {reason:?}", st.phase))
            },
        )
        .await?;
        let late_dir = base.join("late");
        pvs.create(
            &PostParams::default(),
            &pv(
                &format!("{ns}-late"),
                &ns,
                "late",
                &node.name,
                serde_json::json!({"hostPath": {"path": path(&late_dir), "type": "DirectoryOrCreate"}}),
            )?,
        )
        .await?;
        succeeded(c, &ns, "waiter").await?;
        ensure!(std::fs::read_to_string(late_dir.join("file"))? == "late-data\n");
        anyhow::Ok(())
    }
    .await;
    // The PVs are cluster-wide: remove them and their claims whatever
    // happened (best effort; the namespace stays, as every case's does).
    let _ = Api::<PersistentVolumeClaim>::namespaced(c.clone(), &ns)
        .delete_collection(&DeleteParams::default(), &Default::default())
        .await;
    for name in ["local", "host", "eph", "late"] {
        let _ = pvs
            .delete(&format!("{ns}-{name}"), &DeleteParams::default())
            .await;
    }
    result
}
