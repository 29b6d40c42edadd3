//! Services with EndpointSlices from the real EndpointSlice controller,
//! answered through ClusterIP and NodePort by the node's proxy (keelson
//! with exactly `system:node-proxier`'s rights, or kube-proxy).

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, ensure};
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use keelson_tests::netns::NetNs;
use keelson_tests::support::wait_for;
use keelson_tests::upstream::{Agents, Case, ClusterNode, Env, NodeAgent, NodeSpec, ProxyAgent};
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams};

use crate::support::{busybox_pod, create_pod, http_get, namespace, wait_pod_ready};

pub const CASES: &[Case] = &[
    Case {
        name: "service_cluster_ip_and_node_port",
        agents: &Agents::ALL,
        run: |env, agents| Box::pin(service_cluster_ip_and_node_port(env, agents)),
    },
    Case {
        name: "proxy_only_beside_real_kubelet",
        agents: &[Agents::Keelson],
        run: |env, _| Box::pin(proxy_only_beside_real_kubelet(env)),
    },
];

const WEB: &str =
    "mkdir -p /www && echo \"$HOSTNAME\" > /www/index.html && exec httpd -f -p 8080 -h /www";

/// Starts `n` web pods `web-<i>` on `node` and a NodePort Service `web`
/// selecting them; waits until they are Ready. Returns the Service.
async fn web_service(
    c: &kube::Client,
    ns: &str,
    node: &ClusterNode,
    n: usize,
) -> anyhow::Result<Service> {
    for i in 0..n {
        let name = format!("web-{i}");
        let mut pod = busybox_pod(&name, &node.name, WEB);
        pod["metadata"]["labels"] = serde_json::json!({"app": "web"});
        pod["spec"]["containers"][0]["readinessProbe"] = serde_json::json!({
            "tcpSocket": {"port": 8080}, "periodSeconds": 1,
        });
        create_pod(c, ns, pod).await?;
    }
    let svc: Service = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "web"},
        "spec": {
            "type": "NodePort",
            "selector": {"app": "web"},
            "ports": [{"name": "http", "port": 80, "targetPort": 8080}],
        }
    }))?;
    let svc = Api::<Service>::namespaced(c.clone(), ns)
        .create(&PostParams::default(), &svc)
        .await?;
    for i in 0..n {
        wait_pod_ready(c, ns, &format!("web-{i}")).await?;
    }
    Ok(svc)
}

/// Waits until the Service's EndpointSlices list exactly `want` ready
/// addresses (from the real EndpointSlice controller).
async fn wait_ready_endpoints(
    c: &kube::Client,
    ns: &str,
    want: &BTreeSet<String>,
) -> anyhow::Result<()> {
    let slices: Api<EndpointSlice> = Api::namespaced(c.clone(), ns);
    wait_for(
        "the EndpointSlices to list the ready pods",
        Duration::from_secs(60),
        Duration::from_millis(250),
        || {
            let slices = slices.clone();
            async move {
                let list = slices
                    .list(&ListParams::default().labels("kubernetes.io/service-name=web"))
                    .await
                    .map_err(|e| e.to_string())?;
                let ready: BTreeSet<String> = list
                    .items
                    .iter()
                    .flat_map(|s| s.endpoints.iter().flatten())
                    .filter(|e| e.conditions.as_ref().and_then(|c| c.ready) == Some(true))
                    .flat_map(|e| e.addresses.iter().cloned())
                    .collect();
                if &ready == want {
                    Ok(())
                } else {
                    Err(format!("ready endpoints {ready:?}"))
                }
            }
        },
    )
    .await?;
    Ok(())
}

/// Waits until GETs to `addr` from `ns` are answered by exactly the
/// backends `want` (pod names) within a round of 30 requests.
async fn wait_answers(
    ns: &NetNs,
    addr: SocketAddr,
    want: &BTreeSet<String>,
    what: &str,
) -> anyhow::Result<()> {
    wait_for(
        what,
        Duration::from_secs(60),
        Duration::from_millis(300),
        || async {
            let mut seen = BTreeSet::new();
            for _ in 0..30 {
                let body = http_get(ns, addr, "/").await.map_err(|e| e.to_string())?;
                seen.insert(body.trim().to_string());
            }
            if &seen == want {
                Ok(())
            } else {
                Err(format!("answered by {seen:?}"))
            }
        },
    )
    .await?;
    Ok(())
}

fn pod_ips(pods: &[Pod]) -> BTreeSet<String> {
    pods.iter()
        .filter_map(|p| p.status.as_ref()?.pod_ip.clone())
        .collect()
}

fn cluster_ip_and_node_port(svc: &Service) -> anyhow::Result<(IpAddr, u16)> {
    let spec = svc.spec.as_ref().ok_or_else(|| anyhow!("no spec"))?;
    let ip: IpAddr = spec
        .cluster_ip
        .as_deref()
        .ok_or_else(|| anyhow!("no clusterIP"))?
        .parse()?;
    let node_port = spec
        .ports
        .iter()
        .flatten()
        .find_map(|p| p.node_port)
        .ok_or_else(|| anyhow!("no nodePort"))?;
    Ok((ip, u16::try_from(node_port)?))
}

/// Two web pods behind a NodePort Service on `node`: both answer through
/// the ClusterIP and the NodePort, a deleted one stops answering.
pub async fn check_service(env: &Env, node: &ClusterNode) -> anyhow::Result<()> {
    let c = &env.admin;
    let ns = namespace(c, "svc").await?;
    let svc = web_service(c, &ns, node, 2).await?;
    let pods: Api<Pod> = Api::namespaced(c.clone(), &ns);
    let listed = pods.list(&ListParams::default().labels("app=web")).await?;
    wait_ready_endpoints(c, &ns, &pod_ips(&listed.items)).await?;
    let (cluster_ip, node_port) = cluster_ip_and_node_port(&svc)?;
    let both: BTreeSet<String> = ["web-0", "web-1"].iter().map(|s| s.to_string()).collect();
    let node_ns = node.containerd().netns();
    wait_answers(
        node_ns,
        SocketAddr::new(cluster_ip, 80),
        &both,
        "the ClusterIP to answer from both pods",
    )
    .await?;
    // NodePort, from another host (the control plane's namespace).
    wait_answers(
        env.cp.net().netns(),
        SocketAddr::new(IpAddr::V4(node.ip), node_port),
        &both,
        "the NodePort to answer from both pods",
    )
    .await?;
    // An endpoint that goes is no longer used.
    pods.delete("web-1", &DeleteParams::default()).await?;
    let one: BTreeSet<String> = ["web-0".to_string()].into();
    let remaining = pods.get("web-0").await?;
    wait_ready_endpoints(c, &ns, &pod_ips(&[remaining])).await?;
    wait_answers(
        node_ns,
        SocketAddr::new(cluster_ip, 80),
        &one,
        "the ClusterIP to drop the deleted pod",
    )
    .await?;
    Ok(())
}

async fn service_cluster_ip_and_node_port(env: Arc<Env>, agents: Agents) -> anyhow::Result<()> {
    let node = env.node(agents).await?;
    check_service(&env, &node).await
}

/// `keelson run --proxy-only` with its default configuration beside the
/// real kubelet (the DaemonSet form): both start (no port of kubelet's is
/// taken), the node is Ready, and keelson serves the Services.
async fn proxy_only_beside_real_kubelet(env: Arc<Env>) -> anyhow::Result<()> {
    let spec = NodeSpec {
        node: NodeAgent::Kubelet,
        proxy: ProxyAgent::Keelson,
        ..NodeSpec::of(Agents::Upstream)
    };
    let node = env.start_node("mixed", spec).await?;
    node.wait_ready(&env.admin).await?;
    node.check_running()?;
    ensure!(
        !std::fs::read_to_string(node.node_log().unwrap_or_default())
            .unwrap_or_default()
            .contains("address already in use"),
        "kubelet found one of its ports taken:\n{}",
        node.log_tails(30)
    );
    check_service(&env, &node).await?;
    node.check_running()?;
    Ok(())
}
