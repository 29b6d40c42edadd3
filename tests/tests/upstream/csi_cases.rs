//! CSI on both agents with a real CSI driver: csi-driver-host-path and
//! csi-node-driver-registrar (`keelson_tests::csi_hostpath`) registering
//! through the agent's `plugins_registry`; the same scenario on keelson and
//! on kubelet v1.36, the same outcome asserted: the CSINode and the Node's
//! CSI annotation and topology label, an inline (ephemeral) csi volume a
//! pod writes into and the driver holds, unpublished when the pod goes
//! and, for a pod removed while the agent was down, after the agent's
//! restart; and the driver's entry removed when its registrar goes.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, anyhow, ensure};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::storage::v1::{CSIDriver, CSINode};
use keelson_tests::csi_hostpath::{DRIVER, HostPathDriver, binaries};
use keelson_tests::support::wait_for;
use keelson_tests::upstream::{Agents, Case, Env, NodeSpec};
use kube::Api;
use kube::api::{DeleteParams, PostParams};

use crate::support::{busybox_pod, create_pod, namespace, wait_event, wait_pod_ready};

pub const CASES: &[Case] = &[Case {
    name: "csi_hostpath_inline",
    agents: &[Agents::Keelson, Agents::Upstream],
    run: |env, agents| Box::pin(csi_hostpath_inline(env, agents)),
}];

/// The driver's CSIDriver object as its deployment manifests have it
/// (`deploy/kubernetes-1.34/hostpath/csi-hostpath-driverinfo.yaml`): both
/// lifecycles, pod info on mount, fsGroupPolicy File, attachRequired left
/// to its default (true; inline volumes are never attached).
async fn ensure_csidriver(c: &kube::Client) -> anyhow::Result<()> {
    let api: Api<CSIDriver> = Api::all(c.clone());
    if api.get_opt(DRIVER).await?.is_some() {
        return Ok(());
    }
    let obj: CSIDriver = serde_json::from_value(serde_json::json!({
        "apiVersion": "storage.k8s.io/v1",
        "kind": "CSIDriver",
        "metadata": {"name": DRIVER},
        "spec": {
            "podInfoOnMount": true,
            "volumeLifecycleModes": ["Persistent", "Ephemeral"],
            "fsGroupPolicy": "File",
        }
    }))?;
    match api.create(&PostParams::default(), &obj).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// A pod whose inline csi volume gets the file `file`; it then runs until
/// stopped.
fn writer_pod(name: &str, node: &str, file: &str) -> serde_json::Value {
    let mut pod = busybox_pod(
        name,
        node,
        &format!(
            "echo hello-from-pod > /data/{file}; trap 'exit 0' TERM; while true; do sleep 1; done"
        ),
    );
    pod["spec"]["terminationGracePeriodSeconds"] = 1.into();
    pod["spec"]["containers"][0]["volumeMounts"] =
        serde_json::json!([{"name": "data", "mountPath": "/data"}]);
    pod["spec"]["volumes"] = serde_json::json!([{
        "name": "data",
        "csi": {"driver": DRIVER, "volumeAttributes": {"size": "1Mi"}}
    }]);
    pod
}

/// Waits until the driver holds no file `file` and the pod's CSI volume
/// directory is gone.
async fn wait_unpublished(
    driver: &HostPathDriver,
    pod_dir: &std::path::Path,
    file: &str,
) -> anyhow::Result<()> {
    wait_for(
        "the volume unpublished",
        Duration::from_secs(90),
        Duration::from_millis(300),
        || async {
            let left = driver.files_named(file);
            if !left.is_empty() {
                return Err(format!("driver still holds {left:?}"));
            }
            let vol = pod_dir.join("volumes/kubernetes.io~csi/data");
            if vol.exists() {
                return Err(format!("{} still exists", vol.display()));
            }
            Ok(())
        },
    )
    .await?;
    Ok(())
}

fn driver_entry(n: &CSINode) -> Option<(String, Vec<String>)> {
    n.spec.drivers.iter().find(|d| d.name == DRIVER).map(|d| {
        (
            d.node_id.clone(),
            d.topology_keys.clone().unwrap_or_default(),
        )
    })
}

async fn csi_hostpath_inline(env: Arc<Env>, agents: Agents) -> anyhow::Result<()> {
    let (plugin_bin, registrar_bin) = binaries().map_err(|e| anyhow!(e))?;
    // Volume stats every 5 s (both agents), for the stats check below.
    let spec = NodeSpec {
        keelson: Some(Arc::new(|c| {
            c.node.volume_stats_agg_period = keelson::config::KubeDuration::from_secs(5);
        })),
        kubelet: Some(Arc::new(|m| {
            m.insert("volumeStatsAggPeriod".into(), "5s".into());
        })),
        ..NodeSpec::of(agents)
    };
    let node = env
        .start_node(&format!("{}-csi", agents.name()), spec)
        .await?;
    node.wait_ready(&env.admin).await?;
    let c = &env.admin;
    ensure_csidriver(c).await?;
    let csinodes: Api<CSINode> = Api::all(c.clone());
    let nodes: Api<Node> = Api::all(c.clone());

    // The agent creates its (empty) CSINode at start, owned by its Node.
    let (owner, uid) = wait_for(
        "the CSINode",
        Duration::from_secs(60),
        Duration::from_millis(300),
        || async {
            let n = csinodes
                .get_opt(&node.name)
                .await
                .map_err(|e| e.to_string())?
                .ok_or("no CSINode")?;
            let node_uid = nodes
                .get(&node.name)
                .await
                .map_err(|e| e.to_string())?
                .metadata
                .uid;
            let owner = n
                .metadata
                .owner_references
                .unwrap_or_default()
                .into_iter()
                .find(|r| r.kind == "Node")
                .map(|r| (r.name, r.uid));
            Ok::<_, String>((owner, node_uid))
        },
    )
    .await?;
    ensure!(
        owner == Some((node.name.clone(), uid.clone().unwrap_or_default())),
        "CSINode owner {owner:?}, node uid {uid:?}"
    );

    let registry = node.node_root_dir().join("plugins_registry");
    let mut driver = HostPathDriver::start(
        &plugin_bin,
        &registrar_bin,
        &node.name,
        node.dir(),
        &registry,
    )
    .map_err(|e| anyhow!(e))?;
    // Registration: the CSINode's driver entry, the node ID annotation and
    // the topology label (hostpathplugin reports topology.hostpath.csi/node).
    let entry = wait_for(
        "the driver in the CSINode",
        Duration::from_secs(60),
        Duration::from_millis(300),
        || async {
            let n = csinodes.get(&node.name).await.map_err(|e| e.to_string())?;
            driver_entry(&n).ok_or_else(|| format!("drivers {:?}", n.spec.drivers))
        },
    )
    .await
    .with_context(|| format!("{}\n{}", driver.log_tails(30), node.log_tails(40)))?;
    ensure!(
        entry
            == (
                node.name.clone(),
                vec!["topology.hostpath.csi/node".to_string()]
            ),
        "entry {entry:?}"
    );
    let n = nodes.get(&node.name).await?;
    let annotation = n
        .metadata
        .annotations
        .unwrap_or_default()
        .get("csi.volume.kubernetes.io/nodeid")
        .cloned();
    ensure!(
        annotation == Some(format!("{{\"{DRIVER}\":\"{}\"}}", node.name)),
        "annotation {annotation:?}"
    );
    let label = n
        .metadata
        .labels
        .unwrap_or_default()
        .get("topology.hostpath.csi/node")
        .cloned();
    ensure!(
        label.as_deref() == Some(node.name.as_str()),
        "label {label:?}"
    );

    // An inline csi volume: the pod writes a file the driver holds.
    let ns = namespace(c, "csi").await?;
    create_pod(c, &ns, writer_pod("inline", &node.name, "hello")).await?;
    wait_pod_ready(c, &ns, "inline")
        .await
        .with_context(|| format!("{}\n{}", driver.log_tails(30), node.log_tails(40)))?;
    let pod_uid = Api::<Pod>::namespaced(c.clone(), &ns)
        .get("inline")
        .await?
        .metadata
        .uid
        .unwrap_or_default();
    // While the pod runs its volume is published: the file it wrote is in
    // the driver's state.
    let files = wait_for(
        "the pod's file in the driver's state",
        Duration::from_secs(30),
        Duration::from_millis(200),
        || async {
            let files = driver.files_named("hello");
            if files.len() == 1 {
                Ok(files)
            } else {
                Err(format!("files named hello: {files:?}"))
            }
        },
    )
    .await?;
    let text = std::fs::read_to_string(&files[0])?;
    ensure!(text == "hello-from-pod\n", "file content {text:?}");
    // The agent's record of the volume, in kubelet's format.
    let data: std::collections::BTreeMap<String, String> =
        serde_json::from_str(&std::fs::read_to_string(
            node.node_root_dir()
                .join("pods")
                .join(&pod_uid)
                .join("volumes/kubernetes.io~csi/data/vol_data.json"),
        )?)?;
    ensure!(
        data.get("driverName").map(String::as_str) == Some(DRIVER)
            && data.get("volumeLifecycleMode").map(String::as_str) == Some("Ephemeral")
            && data.get("specVolID").map(String::as_str) == Some("data")
            && data
                .get("volumeHandle")
                .is_some_and(|h| h.starts_with("csi-") && h.len() == 68),
        "vol_data.json {data:?}"
    );

    inline_volume_stats(&env, &node.name, &ns)
        .await
        .with_context(|| format!("{}\n{}", driver.log_tails(30), node.log_tails(40)))?;

    // A driver that is not registered on the node: FailedMount in
    // kubelet's words, the pod stays ContainerCreating.
    let mut absent = busybox_pod("absent", &node.name, "sleep 3600");
    absent["spec"]["containers"][0]["volumeMounts"] =
        serde_json::json!([{"name": "data", "mountPath": "/data"}]);
    absent["spec"]["volumes"] = serde_json::json!([{
        "name": "data",
        "csi": {"driver": "absent.csi.example.com"}
    }]);
    create_pod(c, &ns, absent).await?;
    let ev = wait_event(
        c,
        &ns,
        "absent",
        "FailedMount",
        "absent.csi.example.com",
        Duration::from_secs(60),
    )
    .await?;
    ensure!(
        ev.message.as_deref()
            == Some(
                "MountVolume.SetUp failed for volume \"data\" : kubernetes.io/csi: mounter.SetUpAt failed to get CSI client: driver name absent.csi.example.com not found in the list of registered CSI drivers"
            ),
        "message {:?}",
        ev.message
    );
    Api::<Pod>::namespaced(c.clone(), &ns)
        .delete("absent", &DeleteParams::default())
        .await?;

    // The pod goes: the agent unpublishes (the driver deletes an
    // ephemeral volume at NodeUnpublishVolume) and removes the pod dir.
    Api::<Pod>::namespaced(c.clone(), &ns)
        .delete("inline", &DeleteParams::default())
        .await?;
    let pod_dir = node.node_root_dir().join("pods").join(&pod_uid);
    wait_unpublished(&driver, &pod_dir, "hello")
        .await
        .with_context(|| format!("{}\n{}", driver.log_tails(30), node.log_tails(40)))?;

    // A pod removed while the agent is down (force deletion): after the
    // restart its directory is an orphan whose CSI volume is unpublished
    // from what is on disk (vol_data.json), once the driver registered
    // again.
    create_pod(c, &ns, writer_pod("orphan", &node.name, "orphaned")).await?;
    wait_pod_ready(c, &ns, "orphan").await?;
    let orphan_uid = Api::<Pod>::namespaced(c.clone(), &ns)
        .get("orphan")
        .await?
        .metadata
        .uid
        .unwrap_or_default();
    wait_for(
        "the orphan's file",
        Duration::from_secs(30),
        Duration::from_millis(200),
        || async {
            let n = driver.files_named("orphaned").len();
            if n == 1 {
                Ok(())
            } else {
                Err(format!("{n} files"))
            }
        },
    )
    .await?;
    node.stop_node_agent();
    Api::<Pod>::namespaced(c.clone(), &ns)
        .delete(
            "orphan",
            &DeleteParams {
                grace_period_seconds: Some(0),
                ..DeleteParams::default()
            },
        )
        .await?;
    node.restart_node_agent()?;
    let orphan_dir = node.node_root_dir().join("pods").join(&orphan_uid);
    wait_unpublished(&driver, &orphan_dir, "orphaned")
        .await
        .with_context(|| format!("{}\n{}", driver.log_tails(30), node.log_tails(60)))?;

    // The registrar goes (its socket with it): the driver is deregistered.
    driver.stop_registrar();
    wait_for(
        "the driver gone from the CSINode",
        Duration::from_secs(60),
        Duration::from_millis(300),
        || async {
            let n = csinodes.get(&node.name).await.map_err(|e| e.to_string())?;
            match driver_entry(&n) {
                None => Ok(()),
                Some(e) => Err(format!("still there: {e:?}")),
            }
        },
    )
    .await
    .with_context(|| format!("{}\n{}", driver.log_tails(30), node.log_tails(40)))?;
    // kubelet removes the CSINode entry first, then the annotation.
    wait_for(
        "the node ID annotation gone",
        Duration::from_secs(30),
        Duration::from_millis(300),
        || async {
            let a = nodes
                .get(&node.name)
                .await
                .map_err(|e| e.to_string())?
                .metadata
                .annotations
                .unwrap_or_default()
                .get("csi.volume.kubernetes.io/nodeid")
                .cloned();
            match a {
                None => Ok(()),
                Some(a) => Err(format!("still there: {a}")),
            }
        },
    )
    .await?;
    drop(driver);
    Ok(())
}

/// The inline volume's figures in `/stats/summary`: the driver's
/// `NodeGetVolumeStats` (hostpathplugin has `GET_VOLUME_STATS` and
/// reports statfs of its volume's directory), all six figures, no
/// `pvcRef`; no `volumeHealthStats` without the CSIVolumeHealth gate.
async fn inline_volume_stats(env: &Env, node: &str, ns: &str) -> anyhow::Result<()> {
    let path = format!("/api/v1/nodes/{node}/proxy/stats/summary");
    let vol = wait_for(
        "the inline volume's figures in the summary",
        Duration::from_secs(90),
        Duration::from_millis(500),
        || async {
            let out = keelson_tests::node_api::kubectl(
                env.cp.admin_kubeconfig(),
                &["get", "--raw", &path],
                None,
                Duration::from_secs(30),
            )
            .await
            .map_err(|e| e.to_string())?;
            let s: serde_json::Value =
                serde_json::from_str(&out.stdout).map_err(|e| format!("{e}: {out:?}"))?;
            s["pods"]
                .as_array()
                .and_then(|ps| {
                    ps.iter()
                        .find(|p| p["podRef"]["name"] == "inline" && p["podRef"]["namespace"] == ns)
                })
                .and_then(|p| {
                    p["volume"]
                        .as_array()?
                        .iter()
                        .find(|v| v["name"] == "data")
                        .cloned()
                })
                .ok_or_else(|| "not yet".to_string())
        },
    )
    .await?;
    for f in [
        "availableBytes",
        "capacityBytes",
        "usedBytes",
        "inodesFree",
        "inodes",
        "inodesUsed",
    ] {
        ensure!(vol[f].is_u64(), "{f} of {vol}");
    }
    ensure!(
        vol["capacityBytes"].as_u64() > Some(0) && vol["inodes"].as_u64() > Some(0),
        "{vol}"
    );
    ensure!(
        vol.get("pvcRef").is_none() && vol.get("volumeHealthStats").is_none(),
        "{vol}"
    );
    Ok(())
}
