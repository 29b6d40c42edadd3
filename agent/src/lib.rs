//! keelson: one daemon per Linux node replacing kubelet (the node role) and
//! kube-proxy (the proxy role). See DESIGN.md for the architecture.
//!
//! The binary (`keelson run`) calls [`run::run`]; tests call the roles
//! directly with a [`role::RoleContext`].

pub mod apiclient;
pub mod certificates;
pub mod config;
pub mod diagnose;
pub mod error_chain;
pub mod events;
pub mod introspection;
pub mod lifecycle;
pub mod migrate;
pub mod node;
pub mod node_ip;
pub mod observability;
pub mod proxy;
pub mod quantity;
pub mod role;
pub mod run;
pub mod strategic_patch;
pub mod version;
