//! Volume statistics (issue 32) as kubelet v1.36 reports them, on a node
//! of its own whose agent measures volumes every 5 s
//! (`volumeStatsAggPeriod`, both agents), so the shared nodes keep the
//! default minute: a pod with a claim bound to a `local` PV, an
//! emptyDir, an inline hostPath and the API server's projected
//! service-account volume writes known amounts; `/stats/summary` through
//! the API server's node proxy lists the volumes kubelet lists (hostPath
//! has no figures: `MetricsNil`), the claim with its `pvcRef`, all six
//! figures, the emptyDir counted in `ephemeral-storage` and the PV not;
//! `/metrics` has the seven-minus-one `kubelet_volume_stats_*` series for
//! the claim only, with kubelet's labels, help texts and types.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, anyhow, ensure};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use keelson::config::KubeDuration;
use keelson_tests::node_api::kubectl;
use keelson_tests::prom_text;
use keelson_tests::support::wait_for;
use keelson_tests::upstream::{Agents, Case, Env, NodeSpec, ProxyAgent};
use kube::Api;
use kube::api::PostParams;

use crate::support::{busybox_pod, create_pod, namespace, wait_pod};

pub const CASES: &[Case] = &[Case {
    name: "volume_stats_summary_and_metrics",
    agents: &Agents::ALL,
    run: |env, agents| Box::pin(volume_stats_summary_and_metrics(env, agents)),
}];

const T: Duration = Duration::from_secs(120);
/// What the pod writes on the claim and on the emptyDir.
const PV_BYTES: u64 = 1024 * 1024;
const SCRATCH_BYTES: u64 = 512 * 1024;

/// The six figures kubelet always fills.
const FIGURES: [&str; 6] = [
    "availableBytes",
    "capacityBytes",
    "usedBytes",
    "inodesFree",
    "inodes",
    "inodesUsed",
];

/// kubelet's help texts (`pkg/kubelet/metrics/collectors/volume_stats.go`).
const GAUGES: [(&str, &str); 6] = [
    ("capacity_bytes", "[ALPHA] Capacity in bytes of the volume"),
    (
        "available_bytes",
        "[ALPHA] Number of available bytes in the volume",
    ),
    ("used_bytes", "[ALPHA] Number of used bytes in the volume"),
    ("inodes", "[ALPHA] Maximum number of inodes in the volume"),
    ("inodes_free", "[ALPHA] Number of free inodes in the volume"),
    ("inodes_used", "[ALPHA] Number of used inodes in the volume"),
];

fn figure(v: &serde_json::Value, key: &str) -> Result<u64, String> {
    v[key].as_u64().ok_or_else(|| format!("no {key} in {v}"))
}

async fn raw(env: &Env, path: &str) -> Result<String, String> {
    let out = kubectl(env.cp.admin_kubeconfig(), &["get", "--raw", path], None, T)
        .await
        .map_err(|e| e.to_string())?;
    if !out.ok {
        return Err(format!("{path}: {out:?}"));
    }
    Ok(out.stdout)
}

async fn volume_stats_summary_and_metrics(env: Arc<Env>, agents: Agents) -> anyhow::Result<()> {
    let spec = NodeSpec {
        proxy: ProxyAgent::None,
        keelson: Some(Arc::new(|c| {
            c.node.volume_stats_agg_period = KubeDuration::from_secs(5);
        })),
        kubelet: Some(Arc::new(|m| {
            m.insert("volumeStatsAggPeriod".into(), "5s".into());
        })),
        ..NodeSpec::of(agents)
    };
    let node = env
        .start_node(&format!("vstats-{}", agents.name()), spec)
        .await?;
    node.wait_ready(&env.admin).await?;
    let c = &env.admin;
    let ns = namespace(c, "vstats").await?;
    let local_dir = node.dir().join(format!("vstats-{ns}/local"));
    let host_dir = node.dir().join(format!("vstats-{ns}/host"));
    for d in [&local_dir, &host_dir] {
        std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
    }
    let pv: PersistentVolume = serde_json::from_value(serde_json::json!({
        "metadata": {"name": format!("{ns}-data")},
        "spec": {
            "capacity": {"storage": "10Mi"},
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": "",
            "persistentVolumeReclaimPolicy": "Retain",
            "claimRef": {"namespace": ns, "name": "data"},
            "local": {"path": local_dir.display().to_string()},
            "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "kubernetes.io/hostname", "operator": "In", "values": [node.name]}
            ]}]}},
        }
    }))?;
    let pvs: Api<PersistentVolume> = Api::all(c.clone());
    pvs.create(&PostParams::default(), &pv).await?;
    let result = async {
        let pvc: PersistentVolumeClaim = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "data"},
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "storageClassName": "",
                "resources": {"requests": {"storage": "10Mi"}},
            }
        }))?;
        Api::<PersistentVolumeClaim>::namespaced(c.clone(), &ns)
            .create(&PostParams::default(), &pvc)
            .await?;
        let mut pod = busybox_pod(
            "writer",
            &node.name,
            &format!(
                "dd if=/dev/urandom of=/data/blob bs=1024 count={} && \
                 dd if=/dev/urandom of=/scratch/blob bs=1024 count={} && \
                 sync && touch /scratch/done && sleep 3600",
                PV_BYTES / 1024,
                SCRATCH_BYTES / 1024
            ),
        );
        pod["spec"]["volumes"] = serde_json::json!([
            {"name": "data", "persistentVolumeClaim": {"claimName": "data"}},
            {"name": "scratch", "emptyDir": {}},
            {"name": "host", "hostPath": {"path": host_dir.display().to_string(), "type": "Directory"}},
        ]);
        pod["spec"]["containers"][0]["volumeMounts"] = serde_json::json!([
            {"name": "data", "mountPath": "/data"},
            {"name": "scratch", "mountPath": "/scratch"},
            {"name": "host", "mountPath": "/host"},
        ]);
        create_pod(c, &ns, pod).await?;
        wait_pod(c, &ns, "writer", "the writer to run", T, |p| {
            match p.status.as_ref().and_then(|s| s.phase.as_deref()) {
                Some("Running") => Ok(()),
                other => Err(format!("phase {other:?}")),
            }
        })
        .await?;

        // The summary: wait for a measurement taken after the writes.
        let summary = format!("/api/v1/nodes/{}/proxy/stats/summary", node.name);
        let pod = wait_for(
            "the writer's volumes measured after its writes",
            T,
            Duration::from_millis(500),
            || async {
                let s: serde_json::Value = serde_json::from_str(&raw(&env, &summary).await?)
                    .map_err(|e| e.to_string())?;
                let pod = s["pods"]
                    .as_array()
                    .and_then(|ps| {
                        ps.iter().find(|p| {
                            p["podRef"]["name"] == "writer" && p["podRef"]["namespace"] == ns.as_str()
                        })
                    })
                    .cloned()
                    .ok_or("the pod is not in the summary yet")?;
                let vols = pod["volume"].as_array().cloned().unwrap_or_default();
                let used = |name: &str| {
                    vols.iter()
                        .find(|v| v["name"] == name)
                        .and_then(|v| v["usedBytes"].as_u64())
                };
                match used("scratch") {
                    Some(u) if u >= SCRATCH_BYTES && used("data").is_some() => Ok(pod),
                    _ => Err(format!("volumes so far: {}", pod["volume"])),
                }
            },
        )
        .await?;
        let vols = pod["volume"]
            .as_array()
            .ok_or_else(|| anyhow!("no volumes: {pod}"))?;
        let mut names: Vec<&str> = vols.iter().filter_map(|v| v["name"].as_str()).collect();
        names.sort();
        // hostPath has no figures; the API server adds the projected
        // service-account volume `kube-api-access-<x>`.
        ensure!(
            names.len() == 3
                && names[0] == "data"
                && names[1].starts_with("kube-api-access-")
                && names[2] == "scratch",
            "volumes {names:?}: {pod}"
        );
        let by_name = |n: &str| {
            vols.iter()
                .find(|v| v["name"] == n)
                .ok_or_else(|| anyhow!("no {n}"))
        };
        for v in vols {
            for f in FIGURES {
                figure(v, f).map_err(|e| anyhow!(e))?;
            }
            ensure!(
                v["time"].as_str().is_some_and(|t| t.parse::<jiff::Timestamp>().is_ok()),
                "time of {v}"
            );
            ensure!(v.get("volumeHealthStats").is_none(), "health without the gate: {v}");
        }
        let data = by_name("data")?;
        ensure!(
            data["pvcRef"] == serde_json::json!({"name": "data", "namespace": ns}),
            "pvcRef of the claim: {data}"
        );
        // A local PV: statfs of its filesystem.
        let f = |v: &serde_json::Value, k: &str| figure(v, k).map_err(|e| anyhow!(e));
        ensure!(f(data, "usedBytes")? >= PV_BYTES, "{data}");
        ensure!(f(data, "capacityBytes")? >= f(data, "usedBytes")?, "{data}");
        ensure!(
            f(data, "inodesUsed")? + f(data, "inodesFree")? == f(data, "inodes")?,
            "statfs inodes: {data}"
        );
        let scratch = by_name("scratch")?;
        ensure!(scratch.get("pvcRef").is_none(), "{scratch}");
        // du: the blob and the marker, at least.
        ensure!(f(scratch, "inodesUsed")? >= 3, "{scratch}");
        for n in &names[1..] {
            ensure!(by_name(n)?.get("pvcRef").is_none(), "{n} has a pvcRef");
        }
        // The emptyDir counts in ephemeral-storage, the PV does not (its
        // figure is its whole filesystem's, the node's).
        let eph = f(&pod["ephemeral-storage"], "usedBytes")?;
        ensure!(
            eph >= f(scratch, "usedBytes")? && eph < f(data, "usedBytes")?,
            "ephemeral-storage {eph} with scratch {} and data {}",
            f(scratch, "usedBytes")?,
            f(data, "usedBytes")?
        );

        // /metrics: the claim's series, nothing for the other volumes.
        let metrics = format!("/api/v1/nodes/{}/proxy/metrics", node.name);
        let text = raw(&env, &metrics).await.map_err(|e| anyhow!(e))?;
        let exp = prom_text::parse(&text).map_err(|e| anyhow!(e))?;
        let claim = [("namespace", ns.as_str()), ("persistentvolumeclaim", "data")];
        for (g, help) in GAUGES {
            let name = format!("kubelet_volume_stats_{g}");
            ensure!(
                exp.help.get(&name).map(String::as_str) == Some(help),
                "help of {name}: {:?}",
                exp.help.get(&name)
            );
            ensure!(
                exp.kind.get(&name).map(String::as_str) == Some("gauge"),
                "type of {name}"
            );
            let mine = exp.find(&name, &claim);
            ensure!(mine.len() == 1, "{name} for the claim: {mine:?}");
            ensure!(
                mine[0].labels.len() == 2,
                "labels of {name}: {:?}",
                mine[0].labels
            );
            let in_ns = exp.find(&name, &[("namespace", ns.as_str())]);
            ensure!(in_ns.len() == 1, "{name} in {ns}: {in_ns:?}");
        }
        let cap = exp.find("kubelet_volume_stats_capacity_bytes", &claim)[0].value;
        ensure!(
            cap == f(data, "capacityBytes")? as f64,
            "capacity {cap} vs the summary's {data}"
        );
        let used = exp.find("kubelet_volume_stats_used_bytes", &claim)[0].value;
        ensure!(used >= PV_BYTES as f64, "used {used}");
        ensure!(
            exp.find(
                "kubelet_volume_stats_health_status_abnormal",
                &[("namespace", ns.as_str())]
            )
            .is_empty(),
            "health series without the gate"
        );
        anyhow::Ok(())
    }
    .await;
    let _ = pvs.delete(&format!("{ns}-data"), &Default::default()).await;
    result
}
