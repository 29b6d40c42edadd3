//! The nftables data plane (kube-proxy's nftables mode, programmed over
//! netlink with syncs proportional to what changed).
//!
//! - [`NftablesBackend`] implements [`crate::Backend`]: tables `ip <table>`
//!   and `ip6 <table>` (default `keelson`), kube-proxy's chain/map layout
//!   ([`layout`]), per-service-port chains ([`render`]).
//! - Each sync is one atomic netlink batch carrying only the difference from
//!   what the backend last wrote ([`table`]); the kernel is read only at
//!   start (adopting a previous instance's table) and, cheaply, on the
//!   periodic verification.
//! - Messages are encoded with the `netlink-bindings` crate's nf_tables
//!   attribute pushers ([`encode`], [`expr`]); no `nft` binary, no listing of
//!   the ruleset before each change.

pub mod backend;
pub mod config;
pub mod encode;
pub mod expr;
pub mod inspect;
pub mod layout;
pub mod listing;
pub mod names;
pub mod netlink;
pub mod objects;
pub mod readback;
pub mod render;
pub mod rule;
pub mod slots;
pub mod table;
pub mod wire;

#[cfg(test)]
mod tests;

pub use backend::{NftablesBackend, TABLE_COMMENT};
pub use config::{LEGACY_SERVICE_TABLES, LocalTraffic, NftablesConfig};
