//! `serverTLSBootstrap`: the node API's serving certificate from the
//! cluster, as kubelet gets it (`pkg/kubelet/kubelet.go`, the
//! `serverCertificateManager`; `pkg/kubelet/certificate/kubelet.go`
//! `NewKubeletServerCertificateManager`, `newGetTemplateFn`,
//! `addressesToHostnamesAndIPs`).
//!
//! The node role's certificate manager ([`crate::certificates::manager`],
//! the one that renews the client certificate) runs a second time with
//! kubelet's serving settings:
//!
//! - signer `kubernetes.io/kubelet-serving`, subject `system:node:<name>`
//!   in `system:nodes`, usages `digital signature` + `server auth` (ECDSA
//!   key, so no `key encipherment`);
//! - SANs from the Node's `status.addresses` as last computed: `Hostname`,
//!   `InternalDNS`, `ExternalDNS` as DNS names (a `Hostname` that parses as
//!   an IP counts as an IP), `InternalIP`/`ExternalIP` as IPs. No request is
//!   made before there is at least one IP (client-go: "no template
//!   available", counted in `kubelet_server_expiration_renew_errors` and
//!   retried with back-off); a changed address list makes the current
//!   certificate stale and a new one is requested;
//! - stored as `rootDir/pki/kubelet-server-current.pem`, a link to
//!   `kubelet-server-<date>.pem`; `tlsCertFile`/`tlsPrivateKeyFile`, when
//!   set, only seed the store (kubelet's file store fallback);
//! - renewed at a random 70–90 % of its lifetime; the TLS server reads the
//!   manager's slot at every handshake, so the new certificate is served
//!   from the next connection on and open connections keep theirs.
//!
//! Nobody in the cluster approves `kubelet-serving` requests by default
//! (kube-controller-manager's approver handles only client requests): an
//! operator or an approver controller must. Until a certificate is issued,
//! every TLS handshake on :10250 fails ("no serving certificate available
//! for the kubelet"), the manager's log says what it waits for, and
//! `kubelet_certificate_manager_server_ttl_seconds` is `+Inf`.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::sync::Arc;

use k8s_openapi::api::core::v1::NodeAddress;
use tokio::task::JoinSet;

use super::{ServerError, ServingCertificate};
use crate::NodeContext;
use crate::certificates::csr::{KUBELET_SERVING_SIGNER, Template};
use crate::certificates::manager::{
    self, CertificateManager, ManagerConfig, ManagerMetrics, SingleClient,
};
use crate::certificates::{FileStore, node::cert_dir};
use crate::status::NodeStatusHandle;

/// The store's file name prefix: `kubelet-server-current.pem`.
pub const SERVER_PAIR_PREFIX: &str = "kubelet-server";

/// The serving template for `node` with `addresses`, or `None` while they
/// hold no IP (kubelet's `newGetTemplateFn` without `AllowDNSOnlyNodeCSR`).
pub fn serving_template(node: &str, addresses: &[NodeAddress]) -> Option<Template> {
    let mut dns = BTreeSet::new();
    let mut ips = BTreeSet::new();
    for a in addresses.iter().filter(|a| !a.address.is_empty()) {
        let ip = a.address.parse::<IpAddr>().ok();
        match a.type_.as_str() {
            "Hostname" => match ip {
                Some(ip) => {
                    ips.insert(ip);
                }
                None => {
                    dns.insert(a.address.clone());
                }
            },
            "InternalIP" | "ExternalIP" => {
                if let Some(ip) = ip {
                    ips.insert(ip);
                }
            }
            "InternalDNS" | "ExternalDNS" => {
                dns.insert(a.address.clone());
            }
            _ => {}
        }
    }
    if ips.is_empty() {
        return None;
    }
    Some(Template::node_serving(
        node,
        dns.into_iter().collect(),
        ips.into_iter().collect(),
    ))
}

/// Starts the serving certificate manager as a task of `tasks` and makes
/// `serving` follow it.
pub fn start(
    ctx: &NodeContext,
    status: NodeStatusHandle,
    serving: &ServingCertificate,
    tasks: &mut JoinSet<&'static str>,
) -> Result<(), ServerError> {
    let n = &ctx.config;
    let err = |e: crate::certificates::CertError| {
        ServerError::Certificate(format!("serverTLSBootstrap: {e}"))
    };
    let store = FileStore::new(
        &cert_dir(n),
        SERVER_PAIR_PREFIX,
        n.tls_cert_file.clone(),
        n.tls_private_key_file.clone(),
    )
    .map_err(err)?;
    let name = ctx.node_name.clone();
    let manager = CertificateManager::new(
        ManagerConfig {
            name: "serving",
            signer: KUBELET_SERVING_SIGNER.to_string(),
            template: Box::new(move || {
                let addresses = status
                    .node()
                    .and_then(|node| node.status)
                    .and_then(|s| s.addresses)
                    .unwrap_or_default();
                serving_template(&name, &addresses)
            }),
            store: store.clone(),
            rotate: true,
            requested_lifetime: None,
            digested_names: false,
            wait_timeout: manager::WAIT_TIMEOUT,
        },
        None,
    )
    .map_err(err)?;
    let current = manager.current();
    let manager = manager.with_metrics(ManagerMetrics::server(&ctx.registry, &current));
    serving.follow(current.clone());
    match current.get() {
        Some(p) => tracing::info!(
            certificate = %store.current_path().display(),
            expiration = ?p.leaf.not_after,
            "serving the node API with the stored serving certificate (serverTLSBootstrap)"
        ),
        None => tracing::warn!(
            signer = KUBELET_SERVING_SIGNER,
            "no serving certificate yet (serverTLSBootstrap): the node API completes no TLS handshake until a certificate signing request is approved and issued"
        ),
    }
    let (client, stop) = (ctx.client.clone(), ctx.shutdown.clone());
    tasks.spawn(async move {
        manager.run(Arc::new(SingleClient(client)), stop).await;
        "node-api-serving-certificate"
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(t: &str, a: &str) -> NodeAddress {
        NodeAddress {
            type_: t.to_string(),
            address: a.to_string(),
        }
    }

    #[test]
    fn template_from_addresses_as_kubelet() {
        assert_eq!(serving_template("n1", &[]), None);
        // A host name alone is not enough (AllowDNSOnlyNodeCSR is off).
        assert_eq!(serving_template("n1", &[addr("Hostname", "n1")]), None);
        let t = serving_template(
            "n1",
            &[
                addr("InternalIP", "10.0.0.5"),
                addr("Hostname", "n1"),
                addr("ExternalDNS", "n1.example.org"),
                addr("ExternalIP", "10.0.0.5"),
                addr("InternalIP", "not-an-ip"),
                addr("Hostname", "192.168.1.1"),
                addr("InternalDNS", ""),
            ],
        )
        .expect("template");
        assert_eq!(t.common_name, "system:node:n1");
        assert_eq!(t.organizations, ["system:nodes"]);
        assert_eq!(t.dns_names, ["n1", "n1.example.org"]);
        assert_eq!(
            t.ip_addresses,
            [
                "10.0.0.5".parse::<IpAddr>().expect("ip"),
                "192.168.1.1".parse().expect("ip")
            ]
        );
    }
}
