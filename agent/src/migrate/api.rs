//! What the migration asks of the API server, with the node's own
//! credentials (kubelet.conf; or `--kubeconfig`): kube-proxy's ConfigMap
//! (the Node authorizer lets a node read it while kube-proxy's pod runs
//! there), the node's label, the pods on the node and the Node's Ready
//! condition. Every wait polls with a deadline.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod};
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};

use super::host::Host;
use super::{MigrateError, layout};

fn api_err(what: impl std::fmt::Display, e: impl std::fmt::Display) -> MigrateError {
    MigrateError::Api(format!("{what}: {e}"))
}

/// A client from a kubeconfig on `host`, its file references (CA, client
/// certificate and key, token file) taken below the host's root as well.
pub async fn client(host: &Host, kubeconfig: &Path) -> Result<kube::Client, MigrateError> {
    let path = host.path(kubeconfig);
    let mut kc = Kubeconfig::read_from(&path).map_err(|e| api_err(path.display(), e))?;
    let rooted = |p: &mut Option<String>| {
        if let Some(v) = p.as_mut()
            && v.starts_with('/')
        {
            *v = host.path(v.as_str()).display().to_string();
        }
    };
    for c in &mut kc.clusters {
        if let Some(c) = c.cluster.as_mut() {
            rooted(&mut c.certificate_authority);
        }
    }
    for a in &mut kc.auth_infos {
        if let Some(a) = a.auth_info.as_mut() {
            rooted(&mut a.client_certificate);
            rooted(&mut a.client_key);
            rooted(&mut a.token_file);
        }
    }
    let mut cfg = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .map_err(|e| api_err(path.display(), e))?;
    cfg.connect_timeout = Some(Duration::from_secs(10));
    cfg.read_timeout = Some(Duration::from_secs(30));
    kube::Client::try_from(cfg).map_err(|e| api_err(path.display(), e))
}

/// `config.conf` of kube-system/kube-proxy.
pub async fn kube_proxy_config(client: &kube::Client) -> Result<String, MigrateError> {
    let (ns, name, key) = layout::KUBE_PROXY_CONFIGMAP;
    let cm: ConfigMap = Api::namespaced(client.clone(), ns)
        .get(name)
        .await
        .map_err(|e| api_err(format!("reading ConfigMap {ns}/{name}"), e))?;
    cm.data
        .and_then(|mut d| d.remove(key))
        .ok_or_else(|| MigrateError::Api(format!("ConfigMap {ns}/{name} has no key {key}")))
}

/// Sets (`Some`) or removes (`None`) a label of the Node.
pub async fn set_node_label(
    client: &kube::Client,
    node: &str,
    key: &str,
    value: Option<&str>,
) -> Result<(), MigrateError> {
    let patch = serde_json::json!({"metadata": {"labels": {key: value}}});
    Api::<Node>::all(client.clone())
        .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map(|_| ())
        .map_err(|e| api_err(format!("labelling Node {node}"), e))
}

/// A running container: its ID and restart count.
pub type Containers = BTreeMap<String, (String, i32)>;

/// The running containers of each pod bound to the node, by pod
/// `namespace/name` (uid checked by the caller through the name+ID pair).
pub async fn running_containers(
    client: &kube::Client,
    node: &str,
) -> Result<BTreeMap<String, Containers>, MigrateError> {
    let pods = Api::<Pod>::all(client.clone())
        .list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
        .await
        .map_err(|e| api_err(format!("listing the pods of {node}"), e))?;
    let mut out = BTreeMap::new();
    for p in pods {
        let key = format!(
            "{}/{}",
            p.metadata.namespace.clone().unwrap_or_default(),
            p.metadata.name.clone().unwrap_or_default()
        );
        let mut containers = Containers::new();
        let statuses = p.status.as_ref().map(|s| {
            s.container_statuses
                .iter()
                .flatten()
                .chain(s.init_container_statuses.iter().flatten())
                .cloned()
                .collect::<Vec<_>>()
        });
        for c in statuses.into_iter().flatten() {
            let running = c.state.as_ref().is_some_and(|s| s.running.is_some());
            if let (true, Some(id)) = (running, c.container_id.clone()) {
                containers.insert(c.name.clone(), (id, c.restart_count));
            }
        }
        if !containers.is_empty() {
            out.insert(key, containers);
        }
    }
    Ok(out)
}

/// Whether a pod of kube-proxy (label `k8s-app=kube-proxy`, kubeadm's) is
/// still bound to the node.
pub async fn kube_proxy_on_node(client: &kube::Client, node: &str) -> Result<bool, MigrateError> {
    let pods = Api::<Pod>::namespaced(client.clone(), layout::KUBE_PROXY_CONFIGMAP.0)
        .list(
            &ListParams::default()
                .fields(&format!("spec.nodeName={node}"))
                .labels("k8s-app=kube-proxy"),
        )
        .await
        .map_err(|e| api_err(format!("listing kube-proxy's pods on {node}"), e))?;
    Ok(!pods.items.is_empty())
}

/// The Node's Ready condition: (status, last heartbeat).
pub async fn node_ready(
    client: &kube::Client,
    node: &str,
) -> Result<Option<(String, Option<jiff::Timestamp>)>, MigrateError> {
    let n = Api::<Node>::all(client.clone())
        .get(node)
        .await
        .map_err(|e| api_err(format!("reading Node {node}"), e))?;
    Ok(n.status
        .and_then(|s| s.conditions)
        .into_iter()
        .flatten()
        .find(|c| c.type_ == "Ready")
        .map(|c| (c.status, c.last_heartbeat_time.map(|t| t.0))))
}

/// Polls `check` once a second until it says done or `timeout` passes;
/// `what` names the wait in the error.
pub async fn poll<F, Fut>(what: &str, timeout: Duration, mut check: F) -> Result<(), MigrateError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Option<String>, MigrateError>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let last = match check().await {
            Ok(None) => return Ok(()),
            Ok(Some(why)) => why,
            Err(e) => e.to_string(),
        };
        if tokio::time::Instant::now() >= deadline {
            return Err(MigrateError::Timeout {
                what: what.to_string(),
                last,
            });
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}
