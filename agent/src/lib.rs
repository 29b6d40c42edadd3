//! keelson: one daemon per Linux node replacing kubelet (the node role) and
//! kube-proxy (the proxy role). See DESIGN.md for the architecture.
//!
//! This crate is the wiring: the command line ([`cli`], [`commands`]), the
//! configuration file, [`run::run`] starting the roles, the proxy role, and
//! the commands (`diagnose`, `migrate`, ...). Two binaries: `keelson` (every
//! role) and `keelson-proxy` (the proxy role alone, without the node
//! role's code; [`node_role`]). The node role is the crate `keelson-node`;
//! what both roles share is `keelson-common`. Tests call the roles directly
//! with a [`role::RoleContext`].

pub mod cli;
pub mod commands;
pub mod config;
pub mod diagnose;
pub mod logging;
pub mod migrate;
pub mod node_role;
pub mod proxy;
pub mod role;
pub mod run;

// The node role and the shared parts under their old paths, so
// `keelson::node::...` and `keelson::events::...` keep naming the same items.
pub use keelson_common::{
    apiclient, error_chain, events, introspection, lifecycle, observability, quantity,
    strategic_patch, version,
};
pub use keelson_node as node;
pub use keelson_node::certificates;
