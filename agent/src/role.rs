//! What each role gets from the process: its configuration, its own API
//! client, the shared metrics registry and health registry, and the shutdown
//! signal.

use std::sync::Arc;

use prometheus::Registry;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::introspection::Introspection;
use crate::observability::Health;

/// Everything a role needs to run.
#[derive(Clone)]
pub struct RoleContext {
    /// The effective configuration.
    pub config: Arc<Config>,
    /// This node's name.
    pub node_name: String,
    /// The role's own API client (node identity, or kube-proxy identity).
    pub client: kube::Client,
    /// Metrics registry shared by both roles.
    pub registry: Registry,
    /// Health registry shared by both roles.
    pub health: Health,
    /// What `keelson diagnose` may read: each role registers its provider.
    pub introspection: Introspection,
    /// Cancelled when the process shuts down; a role stops its work and returns.
    pub shutdown: CancellationToken,
}

impl RoleContext {
    /// The node role's view: its own section of the configuration and the
    /// shared parts.
    pub fn node_context(&self) -> keelson_node::NodeContext {
        keelson_node::NodeContext {
            config: std::sync::Arc::new(self.config.node.clone()),
            node_name: self.node_name.clone(),
            client: self.client.clone(),
            registry: self.registry.clone(),
            health: self.health.clone(),
            introspection: self.introspection.clone(),
            shutdown: self.shutdown.clone(),
        }
    }
}

impl std::fmt::Debug for RoleContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RoleContext")
            .field("node_name", &self.node_name)
            .finish_non_exhaustive()
    }
}
