//! The node role's API client, wired as kubelet's
//! (`cmd/kubelet/app/server.go` `buildKubeletClientConfig`,
//! `bootstrap.LoadClientConfig`):
//!
//! - no rotation and no bootstrap kubeconfig: a plain client from the
//!   kubeconfig;
//! - a bootstrap kubeconfig and a node kubeconfig that is missing, unreadable
//!   or whose certificate expired: the server and CA come from the bootstrap
//!   kubeconfig, a certificate is requested with the bootstrap credentials
//!   (`kubernetes.io/kube-apiserver-client-kubelet`, `system:node:<name>` in
//!   `system:nodes`), stored as `rootDir/pki/keelson-client-current.pem`,
//!   and the node kubeconfig is written to point at it;
//! - otherwise, with a client certificate in the kubeconfig (a file or
//!   embedded data, which goes into the store, as kubeadm's kubeconfig
//!   does for kubelet): that certificate, renewed at 70–90 % of its
//!   lifetime when `rotateCertificates` is on;
//! - a kubeconfig that authenticates with a token has no certificate to
//!   renew: a plain client (logged).
//!
//! With a manager, the client presents the current certificate at every TLS
//! handshake and all connections are closed when it changes, so the client
//! and every clone of it keep working across rotations.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use prometheus::Registry;
use tokio_util::sync::CancellationToken;

use super::CertError;
use super::csr::{KUBELET_CLIENT_SIGNER, Template};
use super::kubeconfig;
use super::manager::{self, CertificateManager, ManagerConfig, ManagerMetrics, RequestClients};
use super::store::FileStore;
use super::transport::{ConnectionCloser, CurrentCert, RotatingClientSettings, rotating_client};
use crate::config::NodeConfig;
use keelson_common::apiclient::{self, ClientSettings};
use keelson_common::observability::{Health, ProbeKind};

/// The store's file name prefix: `keelson-client-current.pem`.
pub const CLIENT_PAIR_PREFIX: &str = "keelson-client";
/// The health check saying whether the node has a client certificate.
pub const HEALTH_CHECK: &str = "node-client-certificate";

/// Where the node's certificates live: `rootDir/pki`.
pub fn cert_dir(node: &NodeConfig) -> PathBuf {
    node.root_dir.join("pki")
}

/// The node role's client and, when certificates are managed, a way to
/// wait for the first one.
pub struct NodeClient {
    /// The API client (clones share the certificate).
    pub client: kube::Client,
    current: Option<Arc<CurrentCert>>,
}

impl NodeClient {
    /// Resolves once the client has a valid certificate (at once without a
    /// manager), or never when `shutdown` fires first (`false`).
    pub async fn ready(&self, shutdown: &CancellationToken) -> bool {
        let Some(current) = &self.current else {
            return true;
        };
        let mut changes = current.subscribe();
        loop {
            if current.get().is_some() {
                return true;
            }
            tokio::select! {
                _ = shutdown.cancelled() => return false,
                _ = changes.recv() => {}
                // An expired certificate comes back only through a change;
                // look again now and then anyway.
                _ = tokio::time::sleep(Duration::from_secs(5)) => {}
            }
        }
    }
}

struct NodeRequestClients {
    own: kube::Client,
    bootstrap: Option<kube::Client>,
}

impl RequestClients for NodeRequestClients {
    fn client(&self, have_valid_certificate: bool) -> Option<kube::Client> {
        if have_valid_certificate {
            Some(self.own.clone())
        } else {
            Some(self.bootstrap.clone().unwrap_or_else(|| self.own.clone()))
        }
    }
}

fn settings<'a>(n: &NodeConfig, kubeconfig: Option<&'a Path>) -> ClientSettings<'a> {
    ClientSettings {
        kubeconfig,
        qps: n.kube_api_qps,
        burst: u32::try_from(n.kube_api_burst).unwrap_or(1),
        role: "node",
    }
}

/// Builds the node role's client; starts the certificate manager (until
/// `shutdown`) when certificates are managed.
pub async fn start(
    node: &NodeConfig,
    node_name: &str,
    health: &Health,
    registry: &Registry,
    shutdown: CancellationToken,
    api_log: Option<&keelson_common::introspection::ApiLog>,
) -> Result<NodeClient, CertError> {
    let plain = |kc: Option<PathBuf>| async move {
        apiclient::build_client_logged(&settings(node, kc.as_deref()), api_log)
            .await
            .map_err(|e| match e {
                apiclient::ClientError::Infer(found) => CertError::NoCredentials(found),
                e => CertError::Client(e.to_string()),
            })
    };
    let kubeconfig = node.kubeconfig.clone();
    let needs_bootstrap = match (&node.bootstrap_kubeconfig, &kubeconfig) {
        (Some(_), Some(kc)) => !kubeconfig::still_valid(kc),
        (Some(_), None) => {
            return Err(CertError::Kubeconfig(
                "node.bootstrapKubeconfig needs node.kubeconfig (or --kubeconfig): the path where the node's kubeconfig is written".into(),
            ));
        }
        (None, _) => false,
    };
    if !node.rotate_certificates && !needs_bootstrap {
        return Ok(NodeClient {
            client: plain(kubeconfig).await?,
            current: None,
        });
    }
    // The server and CA: the bootstrap kubeconfig's while bootstrapping.
    let (server_kc, identity) = if needs_bootstrap {
        let b = node.bootstrap_kubeconfig.clone().unwrap_or_default();
        tracing::info!(bootstrap_kubeconfig = %b.display(), kubeconfig = %kubeconfig.as_deref().map(|p| p.display().to_string()).unwrap_or_default(), "no valid node kubeconfig: requesting a client certificate with the bootstrap credentials");
        (b, kubeconfig::Identity::default())
    } else {
        let Some(kc) = kubeconfig.clone() else {
            // In-cluster or $KUBECONFIG: nothing keelson can rotate.
            return Ok(NodeClient {
                client: plain(None).await?,
                current: None,
            });
        };
        let id = kubeconfig::identity(&kc)?;
        if id.pair.is_none() {
            tracing::info!(kubeconfig = %kc.display(), "client certificate rotation is on, but the kubeconfig has no client certificate (token credentials): nothing to rotate");
            return Ok(NodeClient {
                client: plain(Some(kc)).await?,
                current: None,
            });
        }
        (kc, id)
    };
    let store = FileStore::new(
        &cert_dir(node),
        CLIENT_PAIR_PREFIX,
        identity.cert_file.clone().filter(|_| !identity.embedded),
        identity.key_file.clone().filter(|_| !identity.embedded),
    )?;
    let current_path = store.current_path();
    let initial = if identity.embedded {
        identity.pair.clone()
    } else {
        None
    };
    let name = node_name.to_string();
    let manager = CertificateManager::new(
        ManagerConfig {
            name: "client",
            signer: KUBELET_CLIENT_SIGNER.to_string(),
            template: Box::new(move || Some(Template::node_client(&name))),
            store,
            rotate: node.rotate_certificates,
            requested_lifetime: None,
            digested_names: needs_bootstrap,
            wait_timeout: if needs_bootstrap {
                manager::BOOTSTRAP_WAIT_TIMEOUT
            } else {
                manager::WAIT_TIMEOUT
            },
        },
        initial,
    )?;
    let current = manager.current();
    let flag = health.register_flag(HEALTH_CHECK, ProbeKind::Liveness, None);
    let manager = manager
        .with_health(flag)
        .with_metrics(ManagerMetrics::client(registry, &current));

    let kube_config = apiclient::load_config(Some(&server_kc))
        .await
        .map_err(|e| CertError::Client(e.to_string()))?;
    let (client, closer) = rotating_client(
        kube_config,
        current.clone(),
        &RotatingClientSettings {
            qps: node.kube_api_qps,
            burst: u32::try_from(node.kube_api_burst).unwrap_or(1),
            user_agent: keelson_common::version::user_agent("node"),
            connect_timeout: Duration::from_secs(10),
            api_log: api_log.cloned(),
        },
    )?;
    let bootstrap_client = match &node.bootstrap_kubeconfig {
        Some(b) => Some(plain(Some(b.clone())).await?),
        None => None,
    };
    let write_kubeconfig = needs_bootstrap.then(|| {
        (
            node.bootstrap_kubeconfig.clone().unwrap_or_default(),
            kubeconfig.clone().unwrap_or_default(),
            current_path.clone(),
        )
    });
    tokio::spawn(follow_rotations(
        current.clone(),
        closer,
        write_kubeconfig,
        shutdown.clone(),
    ));
    let clients: Arc<dyn RequestClients> = Arc::new(NodeRequestClients {
        own: client.clone(),
        bootstrap: bootstrap_client,
    });
    tokio::spawn(manager.run(clients, shutdown));
    Ok(NodeClient {
        client,
        current: Some(current),
    })
}

/// After each new certificate: close the connections made with the old
/// one, and after the first one of a bootstrap, write the node kubeconfig.
async fn follow_rotations(
    current: Arc<CurrentCert>,
    closer: ConnectionCloser,
    mut write_kubeconfig: Option<(PathBuf, PathBuf, PathBuf)>,
    shutdown: CancellationToken,
) {
    let mut changes = current.subscribe();
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            c = changes.recv() => if c.is_none() { return },
        }
        tracing::info!(
            "certificate rotation detected, shutting down client connections to start using new credentials"
        );
        closer.close_all();
        if let Some((bootstrap, kubeconfig, pem)) = write_kubeconfig.take() {
            match kubeconfig::write_from_bootstrap(&bootstrap, &kubeconfig, &pem) {
                Ok(()) => {
                    tracing::info!(kubeconfig = %kubeconfig.display(), certificate = %pem.display(), "wrote the node kubeconfig")
                }
                Err(e) => {
                    tracing::error!(error = %e, "unable to write the node kubeconfig after bootstrap; keelson goes on with the certificate in memory")
                }
            }
        }
    }
}
