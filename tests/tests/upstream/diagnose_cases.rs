//! `keelson diagnose` against the real API server, with the identities a
//! node has: the node's own (`system:node:<name>`, Node authorizer) for
//! pods and the node, kube-proxy's (`system:node-proxier`) for Services.
//! What those identities may read is enough for each chain; what they may
//! not (`list events`, `list pods`) is named with the RBAC rule that would
//! grant it. With the real kubelet and kube-proxy as the agents there is no
//! keelson daemon: diagnose says so and reads CRI and the API itself, and
//! names the same broken link (kubelet also stops at a missing ConfigMap).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, anyhow, ensure};
use k8s_openapi::api::core::v1::Service;
use keelson::config::Config;
use keelson::diagnose::report::{Mark, Report};
use keelson_tests::node_harness::keelson_bin;
use keelson_tests::upstream::{Agents, Case, ClusterNode, Env};
use kube::Api;
use kube::api::PostParams;

use crate::support::{busybox_pod, create_pod, namespace, wait_pod};

pub const CASES: &[Case] = &[Case {
    name: "diagnose_with_the_node_and_proxy_identities",
    agents: &Agents::ALL,
    run: |env, agents| Box::pin(diagnose_with_the_node_and_proxy_identities(env, agents)),
}];

/// The configuration diagnose reads: keelson's own, or (beside the real
/// kubelet and kube-proxy) one naming their kubeconfigs and containerd.
fn diagnose_config(node: &ClusterNode, agents: Agents) -> anyhow::Result<PathBuf> {
    let dir = node.dir();
    if agents == Agents::Keelson {
        return Ok(dir.join("keelson.yaml"));
    }
    let mut cfg = Config {
        node_name: Some(node.name.clone()),
        ..Config::default()
    };
    cfg.node.kubeconfig = Some(dir.join("kubelet.kubeconfig"));
    cfg.node.container_runtime_endpoint = node.containerd().endpoint();
    cfg.node.root_dir = dir.join("diagnose-root");
    cfg.node.pod_logs_dir = dir.join("pod-logs");
    cfg.node.cgroup_root = node.containerd().cgroup_parent();
    cfg.proxy.client_connection.kubeconfig = Some(dir.join("kube-proxy.kubeconfig"));
    // The thresholds the harness gives the kubelet.
    keelson_tests::node_harness::ignore_host_disk(&mut cfg);
    cfg.validate().map_err(|e| anyhow!("{e:?}"))?;
    let path = dir.join("diagnose.yaml");
    std::fs::write(&path, cfg.to_yaml())?;
    Ok(path)
}

async fn diagnose(
    node: &ClusterNode,
    agents: Agents,
    config: &Path,
    args: &[&str],
) -> anyhow::Result<(i32, Report)> {
    let mut cmd = node
        .containerd()
        .netns()
        .command(&keelson_bin()?.display().to_string());
    cmd.arg("diagnose")
        .arg("--config")
        .arg(config)
        .args(args)
        .args(["-o", "json"])
        .stdin(std::process::Stdio::null());
    let out = tokio::task::spawn_blocking(move || cmd.output()).await??;
    let code = out.status.code().unwrap_or(-1);
    let report: Report = serde_json::from_slice(&out.stdout).with_context(|| {
        format!(
            "keelson diagnose {args:?} (exit {code}): {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })?;
    // With KEELSON_DIAGNOSE_DOCS=DIR the text form (rendered from this
    // report, as the command renders it) goes to DIR for docs/diagnose.md.
    if let Some(dir) = std::env::var_os("KEELSON_DIAGNOSE_DOCS") {
        let dir = PathBuf::from(dir);
        std::fs::create_dir_all(&dir)?;
        let file = format!("upstream-{}-{}.txt", agents.name(), args[0]);
        std::fs::write(
            dir.join(file),
            format!(
                "$ keelson diagnose {}\n{}",
                args.join(" "),
                keelson::diagnose::render::text(&report)
            ),
        )?;
    }
    Ok((code, report))
}

fn status_of(r: &Report, id: &str) -> anyhow::Result<Mark> {
    r.link(id)
        .map(|l| l.status)
        .ok_or_else(|| anyhow!("no link {id}"))
}

async fn diagnose_with_the_node_and_proxy_identities(
    env: Arc<Env>,
    agents: Agents,
) -> anyhow::Result<()> {
    let node = env.node(agents).await?;
    let c = &env.admin;
    let ns = namespace(c, "diag").await?;
    let config = diagnose_config(&node, agents)?;

    // A pod whose ConfigMap does not exist: the node's identity may read
    // the pod and the ConfigMap it references (404), not the events.
    let mut pod = busybox_pod("no-config", &node.name, "sleep 3600");
    pod["spec"]["volumes"] = serde_json::json!([{"name": "cfg", "configMap": {"name": "absent"}}]);
    pod["spec"]["containers"][0]["volumeMounts"] =
        serde_json::json!([{"name": "cfg", "mountPath": "/etc/cfg"}]);
    create_pod(c, &ns, pod).await?;
    wait_pod(
        c,
        &ns,
        "no-config",
        "a status from the node",
        Duration::from_secs(60),
        |p| {
            p.status
                .as_ref()
                .and_then(|s| s.phase.clone())
                .ok_or_else(|| "no status".to_string())
        },
    )
    .await?;
    let (code, r) = diagnose(&node, agents, &config, &["pod", &format!("{ns}/no-config")]).await?;
    let dump = serde_json::to_string_pretty(&r)?;
    ensure!(code == 1, "exit {code}\n{dump}");
    ensure!(r.first_failure.as_deref() == Some("volumes"), "{dump}");
    ensure!(
        r.link("volumes")
            .is_some_and(|l| l.summary.contains("configmap \"absent\" not found")),
        "{dump}"
    );
    ensure!(r.daemon.running == (agents == Agents::Keelson), "{dump}");
    let events = r
        .missing_permissions
        .iter()
        .find(|m| m.resource == "events" && m.verb == "list")
        .ok_or_else(|| anyhow!("list events not named as missing\n{dump}"))?;
    ensure!(
        events.user.as_deref() == Some(&format!("system:node:{}", node.name)),
        "{dump}"
    );
    ensure!(
        events
            .rule
            .starts_with("apiGroups: [\"\"], resources: [\"events\"], verbs: [\"list\"]"),
        "{dump}"
    );
    ensure!(
        r.missing_permissions.len() == 1,
        "only events are out of reach\n{dump}"
    );

    // The node: everything its identity needs (Node, Lease, /version).
    crate::node_cases::wait_lease(c, &node.name).await?;
    let (code, r) = diagnose(&node, agents, &config, &["node"]).await?;
    let dump = serde_json::to_string_pretty(&r)?;
    for id in ["runtime", "api", "lease", "nodeReady", "certificate"] {
        ensure!(status_of(&r, id)? == Mark::Ok, "{id}\n{dump}");
    }
    ensure!(code == 0 || r.status != Mark::Failed, "{dump}");
    ensure!(r.missing_permissions.is_empty(), "{dump}");

    // A Service whose selector matches nothing, with kube-proxy's identity:
    // it may read Services, EndpointSlices and Nodes, not pods.
    let svc: Service = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "nomatch"},
        "spec": {"selector": {"app": "nothing"}, "ports": [{"name": "http", "port": 80}]}
    }))?;
    Api::<Service>::namespaced(c.clone(), &ns)
        .create(&PostParams::default(), &svc)
        .await?;
    let (code, r) = diagnose(
        &node,
        agents,
        &config,
        &["service", &format!("{ns}/nomatch")],
    )
    .await?;
    let dump = serde_json::to_string_pretty(&r)?;
    ensure!(code == 1, "exit {code}\n{dump}");
    ensure!(r.first_failure.as_deref() == Some("endpoints"), "{dump}");
    let pods = r
        .missing_permissions
        .iter()
        .find(|m| m.resource == "pods" && m.verb == "list")
        .ok_or_else(|| anyhow!("list pods not named as missing\n{dump}"))?;
    ensure!(pods.user.as_deref() == Some("system:kube-proxy"), "{dump}");
    ensure!(
        pods.rule
            .starts_with("apiGroups: [\"\"], resources: [\"pods\"], verbs: [\"list\"]"),
        "{dump}"
    );
    Ok(())
}
