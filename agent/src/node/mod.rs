//! The node role: kubelet's replacement. Registers and heartbeats the Node,
//! runs the Pods bound to it on the CRI runtime, reports their status.

pub mod cgroups;
pub mod downward;
pub mod pods;
pub mod volumes;

use crate::role::RoleContext;

/// Why the node role stopped.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// The role is not implemented yet in this build.
    #[error("node role is not available in this build yet")]
    Unavailable,
}

/// Runs the node role until `ctx.shutdown` is cancelled.
pub async fn run(ctx: RoleContext) -> Result<(), NodeError> {
    tracing::error!(node = %ctx.node_name, "node role is not available in this build yet");
    Err(NodeError::Unavailable)
}
