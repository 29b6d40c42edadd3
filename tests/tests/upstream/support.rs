//! What the cases share: namespaces, pods from busybox, waits on API
//! state with deadlines, events, and plain HTTP over sockets opened in a
//! namespace.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, anyhow};
use k8s_openapi::api::core::v1::{Event, Namespace, Pod};
use keelson_tests::images::BUSYBOX_IMAGE;
use keelson_tests::netns::NetNs;
use keelson_tests::support::wait_for;
use keelson_tests::upstream::ClusterNode;
use kube::Api;
use kube::api::{ListParams, PostParams};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Creates a namespace with a unique name starting with `prefix`, and
/// waits for its `default` ServiceAccount (pods are refused before it) and
/// for the `kube-root-ca.crt` ConfigMap kube-controller-manager publishes
/// into it (a pod's service account token volume fails to mount, with a
/// FailedMount event, until it exists: which agent sees that depends only
/// on timing).
pub async fn namespace(client: &kube::Client, prefix: &str) -> anyhow::Result<String> {
    let name = format!("{prefix}-{}", keelson_tests::netns::unique_suffix());
    let ns: Namespace = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}
    }))?;
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .with_context(|| format!("creating namespace {name}"))?;
    let sas: Api<k8s_openapi::api::core::v1::ServiceAccount> =
        Api::namespaced(client.clone(), &name);
    wait_for(
        "the namespace's default ServiceAccount",
        Duration::from_secs(60),
        Duration::from_millis(200),
        || {
            let sas = sas.clone();
            async move {
                sas.get_opt("default")
                    .await
                    .map_err(|e| e.to_string())?
                    .map(drop)
                    .ok_or_else(|| "not yet".to_string())
            }
        },
    )
    .await?;
    let cms: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(client.clone(), &name);
    wait_for(
        "the namespace's kube-root-ca.crt ConfigMap",
        Duration::from_secs(60),
        Duration::from_millis(200),
        || {
            let cms = cms.clone();
            async move {
                cms.get_opt("kube-root-ca.crt")
                    .await
                    .map_err(|e| e.to_string())?
                    .map(drop)
                    .ok_or_else(|| "not yet".to_string())
            }
        },
    )
    .await?;
    Ok(name)
}

/// A pod bound to `node` (no scheduler runs) running `script` in busybox.
pub fn busybox_pod(name: &str, node: &str, script: &str) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {
            "nodeName": node,
            "terminationGracePeriodSeconds": 5,
            "containers": [{
                "name": "main",
                "image": BUSYBOX_IMAGE,
                "imagePullPolicy": "IfNotPresent",
                "command": ["/bin/sh", "-c", script],
            }]
        }
    })
}

/// Creates a pod from JSON.
pub async fn create_pod(
    client: &kube::Client,
    ns: &str,
    pod: serde_json::Value,
) -> anyhow::Result<Pod> {
    let pod: Pod = serde_json::from_value(pod)?;
    Api::<Pod>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &pod)
        .await
        .with_context(|| format!("creating pod {ns}/{:?}", pod.metadata.name))
}

/// Waits until `check` accepts the pod; the error names the last state seen.
pub async fn wait_pod<T, F>(
    client: &kube::Client,
    ns: &str,
    name: &str,
    what: &str,
    timeout: Duration,
    check: F,
) -> anyhow::Result<T>
where
    F: Fn(&Pod) -> Result<T, String>,
{
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let got = wait_for(what, timeout, Duration::from_millis(200), || {
        let pods = pods.clone();
        let check = &check;
        async move {
            let pod = pods
                .get_opt(name)
                .await
                .map_err(|e| e.to_string())?
                .ok_or("pod not found")?;
            check(&pod).map_err(|e| format!("{e}; status: {}", brief_status(&pod)))
        }
    })
    .await?;
    Ok(got)
}

/// Waits until the pod's Ready condition is True.
pub async fn wait_pod_ready(client: &kube::Client, ns: &str, name: &str) -> anyhow::Result<()> {
    wait_pod(client, ns, name, "Ready", Duration::from_secs(90), |p| {
        (pod_condition(p, "Ready").as_deref() == Some("True"))
            .then_some(())
            .ok_or_else(|| "not Ready".to_string())
    })
    .await
}

/// The phase, conditions and container states of a pod, in one line.
pub fn brief_status(pod: &Pod) -> String {
    let Some(s) = pod.status.as_ref() else {
        return "no status".into();
    };
    let conds: Vec<String> = s
        .conditions
        .iter()
        .flatten()
        .map(|c| format!("{}={}", c.type_, c.status))
        .collect();
    let ctrs: Vec<String> = s
        .container_statuses
        .iter()
        .flatten()
        .map(|c| {
            let state = c.state.as_ref().map_or("?".to_string(), |st| {
                if let Some(w) = &st.waiting {
                    format!("waiting({})", w.reason.clone().unwrap_or_default())
                } else if let Some(t) = &st.terminated {
                    format!(
                        "terminated({},{})",
                        t.exit_code,
                        t.reason.clone().unwrap_or_default()
                    )
                } else {
                    "running".into()
                }
            });
            format!(
                "{}:{} restarts={} ready={}",
                c.name, state, c.restart_count, c.ready
            )
        })
        .collect();
    format!(
        "phase={} conditions=[{}] containers=[{}]",
        s.phase.clone().unwrap_or_default(),
        conds.join(","),
        ctrs.join(" ")
    )
}

/// The condition `type_` of a pod is `status`.
pub fn pod_condition(pod: &Pod, type_: &str) -> Option<String> {
    pod.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| c.status.clone())
}

/// Events about `object` in `ns`, oldest first.
pub async fn events_for(
    client: &kube::Client,
    ns: &str,
    object: &str,
) -> anyhow::Result<Vec<Event>> {
    let list = Api::<Event>::namespaced(client.clone(), ns)
        .list(&ListParams::default().fields(&format!("involvedObject.name={object}")))
        .await?;
    let mut items = list.items;
    items.sort_by_key(|e| e.last_timestamp.clone().map(|t| t.0));
    Ok(items)
}

/// Waits for an event with `reason` about `object` whose message contains
/// `contains`; returns it.
pub async fn wait_event(
    client: &kube::Client,
    ns: &str,
    object: &str,
    reason: &str,
    contains: &str,
    timeout: Duration,
) -> anyhow::Result<Event> {
    let ev = wait_for(
        &format!("event {reason} about {object}"),
        timeout,
        Duration::from_millis(250),
        || async {
            let events = events_for(client, ns, object)
                .await
                .map_err(|e| e.to_string())?;
            events
                .iter()
                .find(|e| {
                    e.reason.as_deref() == Some(reason)
                        && e.message.as_deref().unwrap_or("").contains(contains)
                })
                .cloned()
                .ok_or_else(|| {
                    let seen: Vec<String> = events
                        .iter()
                        .map(|e| {
                            format!(
                                "{}: {}",
                                e.reason.clone().unwrap_or_default(),
                                e.message.clone().unwrap_or_default()
                            )
                        })
                        .collect();
                    format!("events so far: {seen:?}")
                })
        },
    )
    .await?;
    Ok(ev)
}

/// One plain HTTP/1.0 GET over a connection opened inside `ns`; the body.
pub async fn http_get(ns: &NetNs, addr: SocketAddr, path: &str) -> anyhow::Result<String> {
    let mut conn = ns
        .tcp_connect(addr, Duration::from_secs(3))
        .map_err(|e| anyhow!("{e}"))?;
    conn.write_all(format!("GET {path} HTTP/1.0\r\nHost: test\r\n\r\n").as_bytes())
        .await?;
    let mut text = String::new();
    tokio::time::timeout(Duration::from_secs(5), conn.read_to_string(&mut text))
        .await
        .map_err(|_| anyhow!("reading from {addr} timed out"))??;
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| anyhow!("no HTTP response from {addr}: {text:?}"))?;
    if !head.starts_with("HTTP/1.") || !head.contains(" 200 ") {
        return Err(anyhow!("{addr}{path}: {head}"));
    }
    Ok(body.to_string())
}

/// The pod's cgroup relative to a hierarchy's root: kubelet's cgroupfs
/// names below the node's cgroup root
/// (`kubepods[/burstable|/besteffort]/pod<uid>`, by the pod's QoS class),
/// which keelson uses too.
pub fn pod_cgroup(node: &ClusterNode, p: &Pod) -> std::path::PathBuf {
    let uid = p.metadata.uid.clone().unwrap_or_default();
    let qos = p
        .status
        .as_ref()
        .and_then(|s| s.qos_class.clone())
        .unwrap_or_default();
    let mut rel =
        std::path::PathBuf::from(node.containerd().cgroup_parent().trim_start_matches('/'));
    rel.push("kubepods");
    match qos.as_str() {
        "Burstable" => rel.push("burstable"),
        "BestEffort" => rel.push("besteffort"),
        _ => {}
    }
    rel.push(format!("pod{uid}"));
    rel
}

/// A file of the pod's cgroup: cgroup v1's `<controller>/.../<v1_file>`,
/// else v2's `.../<v2_file>`.
pub fn read_pod_cgroup(
    node: &ClusterNode,
    p: &Pod,
    controller: &str,
    v1_file: &str,
    v2_file: &str,
) -> Result<String, String> {
    let rel = pod_cgroup(node, p);
    let root = std::path::Path::new("/sys/fs/cgroup");
    let v1 = root.join(controller).join(&rel).join(v1_file);
    let v2 = root.join(&rel).join(v2_file);
    std::fs::read_to_string(&v1)
        .or_else(|_| std::fs::read_to_string(&v2))
        .map_err(|e| format!("{} or {}: {e}", v1.display(), v2.display()))
}
