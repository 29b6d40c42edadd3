//! CSI PersistentVolumes on both agents with the real pieces:
//! csi-driver-host-path with its registrar on the node, csi-provisioner
//! and csi-attacher against the cluster (`keelson_tests::csi_hostpath`),
//! kube-controller-manager's PV binder, StatefulSet and attach/detach
//! controllers. The same scenario on keelson and on kubelet v1.36, the
//! same outcome asserted: a StatefulSet's volumeClaimTemplate provisioned
//! and bound, the volume attached (VolumeAttachment, the Node's
//! `volumesAttached`), reported in `volumesInUse`, staged once under
//! `plugins/kubernetes.io/csi/<driver>/<sha256(handle)>/globalmount` and
//! published into the pod; the data a pod wrote is there for the pod that
//! replaces it and across an agent restart (the pod keeps running); a pod
//! deleted while the agent is down has its volume unpublished and unstaged
//! after the restart (found on disk); after scaling to 0 the volume is
//! unpublished, unstaged, leaves `volumesInUse` and is detached (its
//! VolumeAttachment goes), both times.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, anyhow, ensure};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::{CSIDriver, StorageClass, VolumeAttachment};
use keelson_tests::csi_hostpath::{HostPathDriver, binaries, controller_binaries};
use keelson_tests::images::BUSYBOX_IMAGE;
use keelson_tests::support::wait_for;
use keelson_tests::upstream::{Agents, Case, ClusterNode, Env, NodeSpec};
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use sha2::{Digest, Sha256};

use crate::support::{namespace, pod_condition, wait_pod};

pub const CASES: &[Case] = &[Case {
    name: "csi_persistent_statefulset",
    agents: &[Agents::Keelson, Agents::Upstream],
    run: |env, agents| Box::pin(csi_persistent_statefulset(env, agents)),
}];

/// Creates `obj`, or leaves the one that is there.
async fn create<K>(api: &Api<K>, obj: serde_json::Value) -> anyhow::Result<()>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let obj: K = serde_json::from_value(obj)?;
    match api.create(&PostParams::default(), &obj).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// The StatefulSet: one replica on `node` whose container keeps the first
/// writer's pod UID in `/data/stamp` and prints what it finds there.
fn stateful_set(node: &str, class: &str) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": "data"},
        "spec": {
            "serviceName": "data",
            "replicas": 1,
            "selector": {"matchLabels": {"app": "data"}},
            "template": {
                "metadata": {"labels": {"app": "data"}},
                "spec": {
                    "nodeName": node,
                    "terminationGracePeriodSeconds": 1,
                    "containers": [{
                        "name": "main",
                        "image": BUSYBOX_IMAGE,
                        "imagePullPolicy": "IfNotPresent",
                        "env": [{"name": "POD_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}}],
                        "command": ["/bin/sh", "-c",
                            "[ -f /data/stamp ] || echo \"$POD_UID\" > /data/stamp; echo \"stamp=$(cat /data/stamp)\"; trap 'exit 0' TERM; while true; do sleep 1; done"],
                        "volumeMounts": [{"name": "www", "mountPath": "/data"}],
                    }],
                },
            },
            "volumeClaimTemplates": [{
                "metadata": {"name": "www"},
                "spec": {
                    "accessModes": ["ReadWriteOnce"],
                    "storageClassName": class,
                    "resources": {"requests": {"storage": "1Mi"}},
                },
            }],
        }
    })
}

/// The pod `data-0` once Ready (another than `not_uid`).
async fn running_pod(c: &kube::Client, ns: &str, not_uid: Option<&str>) -> anyhow::Result<Pod> {
    wait_pod(
        c,
        ns,
        "data-0",
        "data-0 Ready",
        Duration::from_secs(180),
        |p| {
            if not_uid.is_some() && p.metadata.uid.as_deref() == not_uid {
                return Err("still the old pod".to_string());
            }
            if pod_condition(p, "Ready").as_deref() == Some("True") {
                Ok(p.clone())
            } else {
                Err("not Ready".to_string())
            }
        },
    )
    .await
}

/// The stamp the pod's container printed.
async fn stamp_of(c: &kube::Client, ns: &str) -> anyhow::Result<String> {
    let pods: Api<Pod> = Api::namespaced(c.clone(), ns);
    let log = wait_for(
        "the container's stamp line",
        Duration::from_secs(30),
        Duration::from_millis(300),
        || async {
            let log = pods
                .logs("data-0", &Default::default())
                .await
                .map_err(|e| e.to_string())?;
            log.lines()
                .find_map(|l| l.strip_prefix("stamp=").map(str::to_string))
                .ok_or_else(|| format!("log {log:?}"))
        },
    )
    .await?;
    Ok(log)
}

fn container_id(p: &Pod) -> Option<String> {
    p.status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .first()?
        .container_id
        .clone()
}

fn restarts(p: &Pod) -> i32 {
    p.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|c| c.first())
        .map_or(0, |c| c.restart_count)
}

fn in_use(n: &Node) -> Vec<String> {
    n.status
        .as_ref()
        .and_then(|s| s.volumes_in_use.clone())
        .unwrap_or_default()
}

fn attached(n: &Node) -> Vec<String> {
    n.status
        .as_ref()
        .and_then(|s| s.volumes_attached.as_ref())
        .map(|v| v.iter().map(|a| a.name.clone()).collect())
        .unwrap_or_default()
}

/// `<root>/plugins/kubernetes.io/csi/<driver>/<sha256(handle)>/globalmount`.
fn device_path(root: &Path, driver: &str, handle: &str) -> PathBuf {
    root.join("plugins/kubernetes.io/csi")
        .join(driver)
        .join(hex::encode(Sha256::digest(handle.as_bytes())))
        .join("globalmount")
}

fn mounted(path: &Path) -> bool {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let want = path.to_string_lossy();
    text.lines()
        .any(|l| l.split(' ').nth(4) == Some(want.as_ref()))
}

async fn scale(sets: &Api<StatefulSet>, replicas: i32) -> anyhow::Result<()> {
    sets.patch(
        "data",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"spec": {"replicas": replicas}})),
    )
    .await?;
    Ok(())
}

/// What must be true of a volume no pod on the node uses any more.
struct Released<'a> {
    nodes: &'a Api<Node>,
    node: &'a str,
    vas: &'a Api<VolumeAttachment>,
    va_name: &'a str,
    unique: &'a str,
    device: &'a Path,
}

impl Released<'_> {
    /// Waits until the pod's volume directory `vol_dir` is gone
    /// (unpublished), the device is unstaged, the volume is out of the
    /// Node's volumesInUse and volumesAttached and its VolumeAttachment is
    /// gone (detached).
    async fn wait(&self, vol_dir: &Path, what: &str) -> anyhow::Result<()> {
        let unique = self.unique.to_string();
        wait_for(
            &format!("{what} unpublished, unstaged, not in use and detached"),
            Duration::from_secs(180),
            Duration::from_millis(500),
            || async {
                if vol_dir.exists() {
                    return Err(format!("{} is still there", vol_dir.display()));
                }
                let device = self.device;
                if device.exists() || device.with_file_name("vol_data.json").exists() {
                    return Err(format!("{} is still there", device.display()));
                }
                let n = self.nodes.get(self.node).await.map_err(|e| e.to_string())?;
                if in_use(&n).contains(&unique) {
                    return Err(format!("volumesInUse {:?}", in_use(&n)));
                }
                if attached(&n).contains(&unique) {
                    return Err(format!("volumesAttached {:?}", attached(&n)));
                }
                if self
                    .vas
                    .get_opt(self.va_name)
                    .await
                    .map_err(|e| e.to_string())?
                    .is_some()
                {
                    return Err(format!("VolumeAttachment {} still there", self.va_name));
                }
                Ok(())
            },
        )
        .await?;
        Ok(())
    }
}

async fn csi_persistent_statefulset(env: Arc<Env>, agents: Agents) -> anyhow::Result<()> {
    let (plugin_bin, registrar_bin) = binaries().map_err(|e| anyhow!(e))?;
    let (provisioner_bin, attacher_bin) = controller_binaries().map_err(|e| anyhow!(e))?;
    let node = env
        .start_node(&format!("{}-csipv", agents.name()), NodeSpec::of(agents))
        .await?;
    node.wait_ready(&env.admin).await?;
    // A driver of this case's own: the provisioner and the attacher serve
    // every StorageClass and VolumeAttachment of their driver name. A
    // short name: the registrar's `<name>-reg.sock` in the agent's
    // plugins_registry must fit a unix socket path (107 bytes).
    let driver_name = format!("{}.hostpath.csi", agents.name());
    let mut driver = HostPathDriver::start_as(
        &driver_name,
        &plugin_bin,
        &registrar_bin,
        &node.name,
        node.dir(),
        &node.node_root_dir().join("plugins_registry"),
    )
    .map_err(|e| anyhow!(e))?;
    driver
        .start_controllers(
            &provisioner_bin,
            &attacher_bin,
            env.cp.admin_kubeconfig(),
            node.dir(),
        )
        .map_err(|e| anyhow!(e))?;
    let result = scenario(&env, &node, &driver).await;
    let report =
        |e: anyhow::Error| e.context(format!("{}\n{}", driver.log_tails(30), node.log_tails(60)));
    result.map_err(report)
}

async fn scenario(env: &Env, node: &ClusterNode, driver: &HostPathDriver) -> anyhow::Result<()> {
    let c = &env.admin;
    let driver_name = driver.name().to_string();
    // The CSIDriver as the driver's manifests have it (attachRequired
    // defaulted: true).
    create(
        &Api::<CSIDriver>::all(c.clone()),
        serde_json::json!({
            "apiVersion": "storage.k8s.io/v1",
            "kind": "CSIDriver",
            "metadata": {"name": driver_name},
            "spec": {
                "podInfoOnMount": true,
                "volumeLifecycleModes": ["Persistent", "Ephemeral"],
                "fsGroupPolicy": "File",
            }
        }),
    )
    .await?;
    let class = format!("csipv-{}", node.name);
    create(
        &Api::<StorageClass>::all(c.clone()),
        serde_json::json!({
            "apiVersion": "storage.k8s.io/v1",
            "kind": "StorageClass",
            "metadata": {"name": class},
            "provisioner": driver_name,
            "reclaimPolicy": "Delete",
            "volumeBindingMode": "Immediate",
        }),
    )
    .await?;
    let ns = namespace(c, "csipv").await?;
    let sets: Api<StatefulSet> = Api::namespaced(c.clone(), &ns);
    create(&sets, stateful_set(&node.name, &class)).await?;

    // The first pod: claim provisioned and bound, volume attached,
    // in use, staged once and published.
    let first = running_pod(c, &ns, None).await?;
    let first_uid = first.metadata.uid.clone().unwrap_or_default();
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(c.clone(), &ns);
    let claim = claims.get("www-data-0").await?;
    let pv_name = claim
        .spec
        .and_then(|s| s.volume_name)
        .ok_or_else(|| anyhow!("claim www-data-0 has no volume"))?;
    let pv = Api::<PersistentVolume>::all(c.clone())
        .get(&pv_name)
        .await?;
    let handle = pv
        .spec
        .and_then(|s| s.csi)
        .map(|s| s.volume_handle)
        .ok_or_else(|| anyhow!("PV {pv_name} is no CSI volume"))?;
    let unique = format!("kubernetes.io/csi/{driver_name}^{handle}");
    let va_name = format!(
        "csi-{}",
        hex::encode(Sha256::digest(
            format!("{handle}{driver_name}{}", node.name).as_bytes()
        ))
    );
    let vas: Api<VolumeAttachment> = Api::all(c.clone());
    let va = vas.get(&va_name).await?;
    ensure!(
        va.status.as_ref().is_some_and(|s| s.attached),
        "VolumeAttachment {va_name} not attached: {:?}",
        va.status
    );
    let nodes: Api<Node> = Api::all(c.clone());
    let n = nodes.get(&node.name).await?;
    ensure!(
        in_use(&n) == vec![unique.clone()] && attached(&n).contains(&unique),
        "volumesInUse {:?}, volumesAttached {:?}",
        in_use(&n),
        attached(&n)
    );
    let root = node.node_root_dir();
    let device = device_path(&root, &driver_name, &handle);
    let device_data: BTreeMap<String, String> = serde_json::from_str(
        &std::fs::read_to_string(device.with_file_name("vol_data.json"))
            .with_context(|| format!("the staged device's data beside {}", device.display()))?,
    )?;
    ensure!(
        device_data.get("volumeHandle") == Some(&handle)
            && device_data.get("driverName") == Some(&driver_name),
        "device vol_data.json {device_data:?}"
    );
    let vol_dir = |uid: &str| {
        root.join("pods")
            .join(uid)
            .join("volumes/kubernetes.io~csi")
            .join(&pv_name)
    };
    let data: BTreeMap<String, String> = serde_json::from_str(&std::fs::read_to_string(
        vol_dir(&first_uid).join("vol_data.json"),
    )?)?;
    ensure!(
        data.get("volumeLifecycleMode").map(String::as_str) == Some("Persistent")
            && data.get("specVolID") == Some(&pv_name)
            && data.get("volumeHandle") == Some(&handle)
            && data.get("driverName") == Some(&driver_name)
            && data.get("attachmentID") == Some(&va_name),
        "pod vol_data.json {data:?}"
    );
    ensure!(
        mounted(&vol_dir(&first_uid).join("mount")),
        "the pod's volume is not mounted"
    );
    let stamp = stamp_of(c, &ns).await?;
    ensure!(stamp == first_uid, "first pod found stamp {stamp:?}");

    // The pod goes, the StatefulSet makes a new one: same claim, same data.
    Api::<Pod>::namespaced(c.clone(), &ns)
        .delete("data-0", &DeleteParams::default())
        .await?;
    let second = running_pod(c, &ns, Some(&first_uid)).await?;
    let second_uid = second.metadata.uid.clone().unwrap_or_default();
    let stamp = stamp_of(c, &ns).await?;
    ensure!(
        stamp == first_uid,
        "the replacement pod found stamp {stamp:?}, not the first pod's {first_uid}"
    );
    ensure!(
        !vol_dir(&first_uid).exists(),
        "the first pod's volume directory is still there"
    );

    // The agent restarts: the pod keeps running on its volume, and the
    // volume stays in use once the agent reports status again.
    let before = container_id(&second);
    // Heartbeats are whole seconds: one in the restart's second counts.
    let restarted_at = jiff::Timestamp::from_second(jiff::Timestamp::now().as_second())?;
    node.restart_node_agent()?;
    wait_for(
        "a node status written after the restart, with the volume in use",
        Duration::from_secs(120),
        Duration::from_millis(500),
        || async {
            let n = nodes.get(&node.name).await.map_err(|e| e.to_string())?;
            let beat = n
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"))
                .and_then(|c| c.last_heartbeat_time.clone())
                .map(|t| t.0);
            if beat.is_none_or(|b| b < restarted_at) {
                return Err(format!("Ready heartbeat {beat:?}"));
            }
            if in_use(&n) != vec![unique.clone()] {
                return Err(format!("volumesInUse {:?}", in_use(&n)));
            }
            Ok(())
        },
    )
    .await?;
    let after = running_pod(c, &ns, None).await?;
    ensure!(
        after.metadata.uid.as_deref() == Some(second_uid.as_str())
            && container_id(&after) == before
            && restarts(&after) == 0,
        "the pod was touched by the restart: {:?} {:?} restarts {}",
        after.metadata.uid,
        container_id(&after),
        restarts(&after)
    );
    ensure!(
        mounted(&vol_dir(&second_uid).join("mount")),
        "the pod's volume is no longer mounted after the restart"
    );
    ensure!(
        driver.files_named("stamp").len() == 1,
        "stamp files in the driver: {:?}",
        driver.files_named("stamp")
    );

    // The pod goes while the agent is down (scaled to 0, force-deleted):
    // after the restart its volume is found on disk, unpublished and
    // unstaged, leaves volumesInUse and is detached.
    let pods: Api<Pod> = Api::namespaced(c.clone(), &ns);
    node.stop_node_agent();
    scale(&sets, 0).await?;
    pods.delete(
        "data-0",
        &DeleteParams {
            grace_period_seconds: Some(0),
            ..DeleteParams::default()
        },
    )
    .await?;
    node.restart_node_agent()?;
    let released = Released {
        nodes: &nodes,
        node: &node.name,
        vas: &vas,
        va_name: &va_name,
        unique: &unique,
        device: &device,
    };
    released
        .wait(&vol_dir(&second_uid), "the orphaned pod's volume")
        .await?;

    // Back to one replica: the data is there; scaled to 0 with the agent
    // up: unpublished, unstaged, out of volumesInUse, detached.
    scale(&sets, 1).await?;
    let third = running_pod(c, &ns, Some(&second_uid)).await?;
    let third_uid = third.metadata.uid.clone().unwrap_or_default();
    let stamp = stamp_of(c, &ns).await?;
    ensure!(
        stamp == first_uid,
        "the pod after the scale-up found stamp {stamp:?}, not the first pod's {first_uid}"
    );
    scale(&sets, 0).await?;
    released
        .wait(&vol_dir(&third_uid), "the scaled-down pod's volume")
        .await?;
    // The data stays with the claim (the driver still holds it).
    ensure!(
        driver.files_named("stamp").len() == 1,
        "stamp files in the driver after the scale-down: {:?}",
        driver.files_named("stamp")
    );

    // Clean up: the claim (reclaim policy Delete), the set, the class.
    sets.delete("data", &DeleteParams::default()).await?;
    claims
        .delete("www-data-0", &DeleteParams::default())
        .await?;
    wait_for(
        "the PV deleted",
        Duration::from_secs(60),
        Duration::from_millis(500),
        || async {
            match Api::<PersistentVolume>::all(c.clone())
                .get_opt(&pv_name)
                .await
                .map_err(|e| e.to_string())?
            {
                None => Ok(()),
                Some(_) => Err(format!("PV {pv_name} still there")),
            }
        },
    )
    .await?;
    Api::<StorageClass>::all(c.clone())
        .delete(&class, &DeleteParams::default())
        .await?;
    Api::<CSIDriver>::all(c.clone())
        .delete(&driver_name, &DeleteParams::default())
        .await?;
    Ok(())
}
