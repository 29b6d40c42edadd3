//! Cluster DNS for the conformance cluster: `kube-dns` (shared/k8s; CoreDNS
//! cannot be built here) serving `cluster.local` on the API server's
//! address in the control plane's namespace, behind the
//! `kube-system/kube-dns` Service at the agents' `clusterDNS` address. Its
//! EndpointSlice points at that address, which every node routes to, so a
//! pod's query goes through the node's Service proxy like any other
//! ClusterIP traffic.
//!
//! kube-dns authenticates with a client certificate for the user name of
//! the `kube-system/kube-dns` ServiceAccount, which the API server's
//! bootstrap RBAC binds to `system:kube-dns` (list/watch Services and
//! Endpoints) — the rights it has as a pod in a real cluster.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Api;
use kube::api::PostParams;

use crate::support::wait_for;
use crate::upstream::UpstreamError;
use crate::upstream::control_plane::{ControlPlane, Reach};
use crate::upstream::network::API_IP;
use crate::upstream::node::{CLUSTER_DNS, CLUSTER_DOMAIN};

/// Starts kube-dns, creates its Service and EndpointSlice, and waits until
/// it answers for the `kubernetes` Service.
pub async fn start(cp: &ControlPlane, admin: &kube::Client) -> Result<(), UpstreamError> {
    let kubeconfig = cp.dir().join("kube-dns.kubeconfig");
    cp.write_kubeconfig(
        &kubeconfig,
        "system:serviceaccount:kube-system:kube-dns",
        Some("system:serviceaccounts"),
        Reach::Node,
    )?;
    let mut cmd = cp
        .net()
        .netns()
        .command(&cp.bins().path("kube-dns").display().to_string());
    cmd.args([
        format!("--kubecfg-file={}", kubeconfig.display()),
        format!("--domain={CLUSTER_DOMAIN}."),
        format!("--dns-bind-address={API_IP}"),
        "--dns-port=53".to_string(),
        "--v=1".to_string(),
    ]);
    cp.spawn_daemon("kube-dns", cmd)?;

    create(admin, service()).await?;
    create(admin, endpoint_slice()).await?;

    let ns = cp.net().netns();
    let name = format!("kubernetes.default.svc.{CLUSTER_DOMAIN}");
    wait_for(
        "kube-dns to answer for the kubernetes Service",
        Duration::from_secs(90),
        Duration::from_millis(500),
        || {
            let answer = cp
                .check_running()
                .map_err(|e| e.to_string())
                .and_then(|()| {
                    let sock = ns
                        .udp_socket(SocketAddr::from(([127, 0, 0, 1], 0)))
                        .map_err(|e| e.to_string())?;
                    Ok(sock)
                });
            let name = name.clone();
            async move {
                let sock = answer?;
                let target = SocketAddr::new(IpAddr::V4(API_IP), 53);
                sock.send_to(&query(&name, 0x6b65), target)
                    .await
                    .map_err(|e| e.to_string())?;
                let mut buf = [0u8; 512];
                let n = tokio::time::timeout(Duration::from_secs(1), sock.recv(&mut buf))
                    .await
                    .map_err(|_| "no answer".to_string())?
                    .map_err(|e| e.to_string())?;
                answers(&buf[..n], 0x6b65)
            }
        },
    )
    .await
    .map_err(|e| UpstreamError::Setup {
        context: "starting cluster DNS".into(),
        message: format!("{e}\n{}", cp.log_tails(20)),
    })
}

fn service() -> Service {
    serde_json::from_value(serde_json::json!({
        "metadata": {
            "name": "kube-dns",
            "namespace": "kube-system",
            "labels": {"k8s-app": "kube-dns", "kubernetes.io/name": "KubeDNS"},
        },
        "spec": {
            "clusterIP": CLUSTER_DNS.to_string(),
            "ports": [
                {"name": "dns", "port": 53, "protocol": "UDP", "targetPort": 53},
                {"name": "dns-tcp", "port": 53, "protocol": "TCP", "targetPort": 53},
            ],
        },
    }))
    .unwrap_or_default()
}

fn endpoint_slice() -> EndpointSlice {
    serde_json::from_value(serde_json::json!({
        "metadata": {
            "name": "kube-dns-cluster",
            "namespace": "kube-system",
            "labels": {
                "kubernetes.io/service-name": "kube-dns",
                "endpointslice.kubernetes.io/managed-by": "keelson-conformance",
            },
        },
        "addressType": "IPv4",
        "endpoints": [{
            "addresses": [API_IP.to_string()],
            "conditions": {"ready": true, "serving": true, "terminating": false},
        }],
        "ports": [
            {"name": "dns", "port": 53, "protocol": "UDP"},
            {"name": "dns-tcp", "port": 53, "protocol": "TCP"},
        ],
    }))
    .unwrap_or_default()
}

async fn create<K>(admin: &kube::Client, obj: K) -> Result<(), UpstreamError>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::Serialize
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
    K::DynamicType: Default,
{
    let api: Api<K> = Api::namespaced(admin.clone(), "kube-system");
    api.create(&PostParams::default(), &obj)
        .await
        .map(drop)
        .map_err(|e| UpstreamError::Setup {
            context: format!(
                "creating kube-system/{}",
                obj.meta().name.as_deref().unwrap_or_default()
            ),
            message: e.to_string(),
        })
}

/// A DNS query (RFC 1035) for the A record of `name`, recursion desired.
fn query(name: &str, id: u16) -> Vec<u8> {
    let mut q = Vec::with_capacity(12 + name.len() + 6);
    q.extend_from_slice(&id.to_be_bytes());
    q.extend_from_slice(&[0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0]);
    for label in name.split('.').filter(|l| !l.is_empty()) {
        q.push(label.len() as u8);
        q.extend_from_slice(label.as_bytes());
    }
    q.extend_from_slice(&[0, 0, 1, 0, 1]);
    q
}

/// `Ok` when `reply` answers query `id` with no error and at least one record.
fn answers(reply: &[u8], id: u16) -> Result<(), String> {
    if reply.len() < 12 {
        return Err(format!("short reply ({} bytes)", reply.len()));
    }
    if reply[..2] != id.to_be_bytes() {
        return Err("reply to another query".into());
    }
    let rcode = reply[3] & 0x0f;
    let ancount = u16::from_be_bytes([reply[6], reply[7]]);
    match (rcode, ancount) {
        (0, n) if n > 0 => Ok(()),
        (rcode, n) => Err(format!("rcode {rcode}, {n} answers")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_encodes_labels_type_a_class_in() {
        let q = query("a.bc.", 7);
        assert_eq!(
            q,
            [
                0, 7, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 1, b'a', 2, b'b', b'c', 0, 0, 1, 0, 1
            ]
        );
    }

    #[test]
    fn answers_needs_the_same_id_no_error_and_a_record() {
        let mut reply = vec![0, 7, 0x81, 0x80, 0, 1, 0, 1, 0, 0, 0, 0];
        assert!(answers(&reply, 7).is_ok());
        assert!(answers(&reply, 8).is_err());
        reply[3] = 0x83; // NXDOMAIN
        assert!(answers(&reply, 7).is_err());
        reply[3] = 0x80;
        reply[7] = 0;
        assert!(answers(&reply, 7).is_err());
        assert!(answers(&reply[..5], 7).is_err());
    }

    #[test]
    fn service_and_slice_name_the_cluster_dns_address() {
        let svc = service();
        assert_eq!(
            svc.spec.and_then(|s| s.cluster_ip).as_deref(),
            Some("10.96.0.10")
        );
        let slice = endpoint_slice();
        assert_eq!(
            slice
                .endpoints
                .iter()
                .flatten()
                .next()
                .map(|e| e.addresses.clone()),
            Some(vec![API_IP.to_string()])
        );
        assert_eq!(
            slice.metadata.labels.unwrap_or_default()["kubernetes.io/service-name"],
            "kube-dns"
        );
    }
}
