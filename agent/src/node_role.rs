//! The node roles [`crate::run::run`] can start ([`NodeRole`]), chosen by
//! the binary: `keelson` runs [`Kubelet`], `keelson-proxy` [`NoNodeRole`]. A binary
//! that never names [`Kubelet`] never reaches the node role's code, so the
//! linker leaves it out (the proxy-only DaemonSet's smaller binary,
//! docs/design/build.md).

use crate::role::RoleContext;
use crate::run::{NodeRole, NodeStart, RoleError, RunError};

/// How the node role gets credentials.
const NODE_CREDENTIALS: &str = "--kubeconfig FILE (or node.kubeconfig) with the node's credentials, or --bootstrap-kubeconfig FILE to request them";

/// kubelet's role (keelson-node), with its certificate wiring
/// (`certificates::node`: bootstrap and rotation).
pub struct Kubelet(keelson_node::certificates::node::NodeClient);

impl NodeRole for Kubelet {
    async fn start(s: NodeStart<'_>) -> Result<Self, RunError> {
        keelson_node::certificates::node::start(
            &s.config.node,
            s.node_name,
            s.health,
            s.registry,
            s.shutdown,
            Some(s.introspection.api_log()),
        )
        .await
        .map(Kubelet)
        .map_err(|e| match e {
            keelson_node::certificates::CertError::NoCredentials(found) => {
                RunError::NoCredentials {
                    role: "node",
                    how: NODE_CREDENTIALS.to_string(),
                    found,
                }
            }
            e => RunError::Credentials(crate::error_chain::error_chain(&e)),
        })
    }

    fn client(&self) -> kube::Client {
        self.0.client.clone()
    }

    async fn run(self, ctx: RoleContext) -> Result<(), RoleError> {
        // A bootstrapping node starts once it has its certificate.
        if !self.0.ready(&ctx.shutdown).await {
            return Ok(());
        }
        keelson_node::run(ctx.node_context())
            .await
            .map_err(RoleError::from)
    }
}

/// No node role: `keelson-proxy`. Its configuration always has the node
/// role off (`--proxy-only` is implied); should one turn it on anyway,
/// the start fails with [`RunError::NoNodeRole`].
#[derive(Debug)]
pub enum NoNodeRole {}

impl NodeRole for NoNodeRole {
    async fn start(_: NodeStart<'_>) -> Result<Self, RunError> {
        Err(RunError::NoNodeRole)
    }

    fn client(&self) -> kube::Client {
        match *self {}
    }

    async fn run(self, _: RoleContext) -> Result<(), RoleError> {
        match self {}
    }
}
