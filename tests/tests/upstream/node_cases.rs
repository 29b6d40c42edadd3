//! The Node and its Lease under the Node authorizer and NodeRestriction.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, ensure};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use keelson_tests::support::wait_for;
use keelson_tests::upstream::{Agents, Case, Env, KeelsonFiles, NodeSpec, ProxyAgent};
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams};

pub const CASES: &[Case] = &[
    Case {
        name: "node_registers_with_lease",
        agents: &Agents::ALL,
        run: |env, agents| Box::pin(node_registers_with_lease(env, agents)),
    },
    Case {
        name: "external_cloud_provider_leaves_the_node_to_it",
        agents: &Agents::ALL,
        run: |env, agents| Box::pin(external_cloud_provider_leaves_the_node_to_it(env, agents)),
    },
    Case {
        name: "node_status_has_kubelets_shape",
        agents: &[Agents::Keelson],
        run: |env, _| Box::pin(node_status_has_kubelets_shape(env)),
    },
];

fn host_has_swap() -> bool {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find(|l| l.starts_with("SwapTotal:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        })
        .is_some_and(|kb| kb > 0)
}

/// The Node registers (created by the node's own identity, so
/// NodeRestriction accepted every field), is Ready, reports this host's
/// facts, and its Lease is renewed.
async fn node_registers_with_lease(env: Arc<Env>, agents: Agents) -> anyhow::Result<()> {
    let node = env.node(agents).await?;
    let n = Api::<Node>::all(env.admin.clone()).get(&node.name).await?;
    let status = n.status.clone().ok_or_else(|| anyhow!("no status"))?;
    let info = status
        .node_info
        .clone()
        .ok_or_else(|| anyhow!("no nodeInfo"))?;
    ensure!(
        info.swap.is_some() == host_has_swap(),
        "nodeInfo.swap {:?}, host swap {}",
        info.swap,
        host_has_swap()
    );
    ensure!(info.operating_system == "linux" && info.architecture == "amd64");
    ensure!(
        info.container_runtime_version.starts_with("containerd://"),
        "{}",
        info.container_runtime_version
    );
    let internal: Vec<String> = status
        .addresses
        .iter()
        .flatten()
        .filter(|a| a.type_ == "InternalIP")
        .map(|a| a.address.clone())
        .collect();
    ensure!(
        internal == vec![node.ip.to_string()],
        "InternalIP {internal:?}, want {}",
        node.ip
    );
    let port = status
        .daemon_endpoints
        .as_ref()
        .and_then(|d| d.kubelet_endpoint.as_ref())
        .map(|e| e.port);
    ensure!(port == Some(10250), "daemonEndpoints {port:?}");
    let labels = n.metadata.labels.clone().unwrap_or_default();
    for (k, v) in [
        ("kubernetes.io/hostname", node.name.as_str()),
        ("kubernetes.io/os", "linux"),
        ("kubernetes.io/arch", "amd64"),
        ("beta.kubernetes.io/os", "linux"),
        ("beta.kubernetes.io/arch", "amd64"),
    ] {
        ensure!(
            labels.get(k).map(String::as_str) == Some(v),
            "label {k}: {:?}",
            labels.get(k)
        );
    }
    let types: BTreeSet<String> = status
        .conditions
        .iter()
        .flatten()
        .map(|c| c.type_.clone())
        .collect();
    for t in ["MemoryPressure", "DiskPressure", "PIDPressure", "Ready"] {
        ensure!(types.contains(t), "condition {t} missing: {types:?}");
    }

    // The Lease: held by the node, owned by the Node (set once the Node
    // exists, as kubelet's lease controller does), renewed.
    let leases: Api<Lease> = Api::namespaced(env.admin.clone(), "kube-node-lease");
    let first = wait_lease(&env.admin, &node.name).await?;
    let spec = first
        .spec
        .clone()
        .ok_or_else(|| anyhow!("lease without spec"))?;
    ensure!(spec.holder_identity.as_deref() == Some(node.name.as_str()));
    ensure!(spec.lease_duration_seconds == Some(40), "{spec:?}");
    let renewed = spec.renew_time.map(|t| t.0);
    wait_for(
        "the Lease to be renewed",
        Duration::from_secs(40),
        Duration::from_millis(500),
        || {
            let leases = leases.clone();
            let name = node.name.clone();
            async move {
                let l = leases.get(&name).await.map_err(|e| e.to_string())?;
                let now = l.spec.and_then(|s| s.renew_time).map(|t| t.0);
                if now > renewed {
                    Ok(())
                } else {
                    Err(format!("renewTime still {now:?}"))
                }
            }
        },
    )
    .await?;
    Ok(())
}

/// `--cloud-provider=external` and `providerID` in the KubeletConfiguration,
/// the agent started on the same files and flags (keelson reads kubelet's
/// own): the Node registers with the `uninitialized` taint, the provider
/// ID and the node IP in `alpha.kubernetes.io/provided-node-ip`, with the
/// node's addresses as a bootstrap; once a cloud controller manager (the
/// test, as one) sets its addresses and removes the taint, the agent's
/// status updates (every second here) keep both as the manager left them.
async fn external_cloud_provider_leaves_the_node_to_it(
    env: Arc<Env>,
    agents: Agents,
) -> anyhow::Result<()> {
    const TAINT: &str = "node.cloudprovider.kubernetes.io/uninitialized";
    const ANNOTATION: &str = "alpha.kubernetes.io/provided-node-ip";
    let name = format!("{}-cloud", agents.name());
    let provider_id = format!("external://{name}");
    let id = provider_id.clone();
    let spec = NodeSpec {
        proxy: ProxyAgent::None,
        keelson_files: KeelsonFiles::Upstream,
        kubelet: Some(Arc::new(move |c: &mut serde_yaml::Mapping| {
            c.insert("providerID".into(), id.clone().into());
            c.insert("nodeStatusUpdateFrequency".into(), "1s".into());
            c.insert("nodeStatusReportFrequency".into(), "1s".into());
        })),
        kubelet_flags: vec!["--cloud-provider=external".to_string()],
        ..NodeSpec::of(agents)
    };
    let node = env.start_node(&name, spec).await?;
    let nodes: Api<Node> = Api::all(env.admin.clone());
    let result = async {
        let n = node.wait_ready(&env.admin).await?;
        let taints = n
            .spec
            .as_ref()
            .and_then(|s| s.taints.clone())
            .unwrap_or_default();
        ensure!(
            taints.iter().any(|t| t.key == TAINT
                && t.value.as_deref() == Some("true")
                && t.effect == "NoSchedule"),
            "taints {taints:?}"
        );
        ensure!(
            n.spec.as_ref().and_then(|s| s.provider_id.as_deref()) == Some(provider_id.as_str()),
            "providerID {:?}",
            n.spec.as_ref().map(|s| &s.provider_id)
        );
        let annotation = |n: &Node| {
            n.metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(ANNOTATION).cloned())
        };
        ensure!(
            annotation(&n) == Some(node.ip.to_string()),
            "annotation {:?}",
            annotation(&n)
        );
        let addresses = |n: &Node| -> Vec<(String, String)> {
            n.status
                .as_ref()
                .and_then(|s| s.addresses.clone())
                .unwrap_or_default()
                .into_iter()
                .map(|a| (a.type_, a.address))
                .collect()
        };
        ensure!(
            addresses(&n)
                == [
                    ("InternalIP".to_string(), node.ip.to_string()),
                    ("Hostname".to_string(), node.name.clone())
                ],
            "bootstrap addresses {:?}",
            addresses(&n)
        );

        // The cloud controller manager initializes the Node.
        let cloud = vec![
            ("InternalIP".to_string(), node.ip.to_string()),
            ("ExternalIP".to_string(), "203.0.113.7".to_string()),
            (
                "Hostname".to_string(),
                format!("{}.cloud.example", node.name),
            ),
        ];
        let list: Vec<_> = cloud
            .iter()
            .map(|(t, a)| serde_json::json!({"type": t, "address": a}))
            .collect();
        nodes
            .patch_status(
                &node.name,
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({"status": {"addresses": list}})),
            )
            .await?;
        let kept: Vec<_> = taints.into_iter().filter(|t| t.key != TAINT).collect();
        nodes
            .patch(
                &node.name,
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({"spec": {"taints": kept}})),
            )
            .await?;
        let initialized = std::time::SystemTime::now();
        // Two status updates later (the heartbeat moved two seconds past
        // the manager's writes), both are as the manager left them.
        let n = wait_for(
            "two status updates after the cloud controller manager's",
            Duration::from_secs(60),
            Duration::from_millis(250),
            || async {
                let n = nodes.get(&node.name).await.map_err(|e| e.to_string())?;
                let beat = n
                    .status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
                    .and_then(|c| c.last_heartbeat_time.as_ref())
                    .map(|t| std::time::SystemTime::from(t.0));
                match beat {
                    Some(b) if b >= initialized + Duration::from_secs(2) => Ok(n),
                    other => Err(format!("heartbeat {other:?}")),
                }
            },
        )
        .await?;
        ensure!(addresses(&n) == cloud, "addresses {:?}", addresses(&n));
        let taints = n
            .spec
            .as_ref()
            .and_then(|s| s.taints.clone())
            .unwrap_or_default();
        ensure!(!taints.iter().any(|t| t.key == TAINT), "taints {taints:?}");
        ensure!(
            annotation(&n) == Some(node.ip.to_string()),
            "annotation {:?}",
            annotation(&n)
        );
        Ok(())
    }
    .await;
    drop(node);
    let _ = nodes.delete(&name, &DeleteParams::default()).await;
    result
}

/// Waits for a node's Lease, owned by its Node (kubelet's lease controller
/// sets the owner once the Node exists).
/// Waits for the node's Lease, owned by its Node.
pub(crate) async fn wait_lease(client: &kube::Client, name: &str) -> anyhow::Result<Lease> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
    let lease = wait_for(
        "the node's Lease, owned by its Node",
        Duration::from_secs(60),
        Duration::from_millis(250),
        || {
            let leases = leases.clone();
            let name = name.to_string();
            async move {
                let l = leases
                    .get_opt(&name)
                    .await
                    .map_err(|e| e.to_string())?
                    .ok_or("no Lease yet")?;
                let owners = l.metadata.owner_references.clone().unwrap_or_default();
                if owners.iter().any(|o| o.kind == "Node" && o.name == name) {
                    Ok(l)
                } else {
                    Err(format!("owner references {owners:?}"))
                }
            }
        },
    )
    .await?;
    Ok(lease)
}

/// What kubelet writes into a Node, as key sets: labels, annotations,
/// conditions (type, reason, status), addresses, capacity, allocatable,
/// nodeInfo fields that are set, and the other status fields.
fn shape(n: &Node) -> BTreeSet<String> {
    let mut s = BTreeSet::new();
    let meta = &n.metadata;
    for k in meta.labels.iter().flat_map(|l| l.keys()) {
        s.insert(format!("label {k}"));
    }
    for k in meta.annotations.iter().flat_map(|a| a.keys()) {
        s.insert(format!("annotation {k}"));
    }
    let spec = n.spec.clone().unwrap_or_default();
    for t in spec.taints.iter().flatten() {
        s.insert(format!("taint {}:{}", t.key, t.effect));
    }
    let Some(st) = &n.status else {
        return s;
    };
    for c in st.conditions.iter().flatten() {
        s.insert(format!(
            "condition {} {} {}",
            c.type_,
            c.status,
            c.reason.clone().unwrap_or_default()
        ));
    }
    for a in st.addresses.iter().flatten() {
        s.insert(format!("address {}", a.type_));
    }
    for k in st.capacity.iter().flat_map(|c| c.keys()) {
        s.insert(format!("capacity {k}"));
    }
    for k in st.allocatable.iter().flat_map(|c| c.keys()) {
        s.insert(format!("allocatable {k}"));
    }
    if let Ok(serde_json::Value::Object(info)) = serde_json::to_value(&st.node_info) {
        for (k, v) in info {
            let set = !matches!(&v, serde_json::Value::String(x) if x.is_empty()) && !v.is_null();
            s.insert(format!("nodeInfo.{k} set={set}"));
        }
    }
    if let Ok(serde_json::Value::Object(all)) = serde_json::to_value(st) {
        // declaredFeatures is compared on its own: a node declares what it
        // supports, which may be less than kubelet.
        for k in all.keys().filter(|k| *k != "declaredFeatures") {
            s.insert(format!("status.{k}"));
        }
    }
    s
}

/// The keys a Lease's spec has set.
fn lease_shape(l: &Lease) -> BTreeSet<String> {
    match serde_json::to_value(&l.spec) {
        Ok(serde_json::Value::Object(spec)) => spec.keys().map(|k| format!("spec.{k}")).collect(),
        _ => BTreeSet::new(),
    }
}

/// The Node once it is Ready and carries no `node.kubernetes.io/not-ready`
/// taint.
async fn wait_settled(nodes: &Api<Node>, name: &str) -> anyhow::Result<Node> {
    Ok(wait_for(
        &format!("node {name} Ready without the not-ready taint"),
        Duration::from_secs(60),
        Duration::from_millis(250),
        || async move {
            let node = nodes.get(name).await.map_err(|e| e.to_string())?;
            let ready = node
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
                .is_some_and(|c| c.status == "True");
            let tainted = node
                .spec
                .as_ref()
                .and_then(|s| s.taints.as_ref())
                .is_some_and(|t| t.iter().any(|t| t.key == "node.kubernetes.io/not-ready"));
            if ready && !tainted {
                Ok(node)
            } else {
                Err(format!("ready: {ready}, not-ready taint: {tainted}"))
            }
        },
    )
    .await?)
}

/// keelson's Node has the fields kubelet's Node has on the same machine,
/// and no others.
async fn node_status_has_kubelets_shape(env: Arc<Env>) -> anyhow::Result<()> {
    let keelson = env.node(Agents::Keelson).await?;
    let kube = env.node(Agents::Upstream).await?;
    let nodes: Api<Node> = Api::all(env.admin.clone());
    // Compared once each Node is Ready and kube-controller-manager's node
    // lifecycle controller has taken the not-ready taint off it.
    let mine_node = wait_settled(&nodes, &keelson.name).await?;
    let theirs_node = wait_settled(&nodes, &kube.name).await?;
    let declared = |n: &Node| -> BTreeSet<String> {
        n.status
            .as_ref()
            .and_then(|s| s.declared_features.clone())
            .unwrap_or_default()
            .into_iter()
            .collect()
    };
    let (mine_declared, theirs_declared) = (declared(&mine_node), declared(&theirs_node));
    ensure!(
        mine_declared.is_subset(&theirs_declared),
        "keelson declares features kubelet v1.36 does not: {:?} (kubelet: {theirs_declared:?})",
        mine_declared
            .difference(&theirs_declared)
            .collect::<Vec<_>>()
    );
    let (mine_lease, theirs_lease) = (
        lease_shape(&wait_lease(&env.admin, &keelson.name).await?),
        lease_shape(&wait_lease(&env.admin, &kube.name).await?),
    );
    ensure!(
        mine_lease == theirs_lease,
        "keelson's Lease has {mine_lease:?}, kubelet's {theirs_lease:?}"
    );
    let mine = shape(&mine_node);
    let theirs = shape(&theirs_node);
    let only_mine: Vec<&String> = mine.difference(&theirs).collect();
    let only_theirs: Vec<&String> = theirs.difference(&mine).collect();
    ensure!(
        only_mine.is_empty() && only_theirs.is_empty(),
        "keelson's Node differs from kubelet's:\n  only keelson: {only_mine:#?}\n  only kubelet: {only_theirs:#?}"
    );
    Ok(())
}
