//! The eBPF data plane (`proxy.mode: ebpf`): socket-level load balancing.
//!
//! cgroup v2 `sock_addr` programs (`ebpf/src/sock_lb.c`, built by
//! `netplane/build.rs` and embedded in the binary) translate a ClusterIP to
//! a backend when a socket connects or sends, and back when it receives or
//! asks for its peer — no per-packet NAT, no conntrack entry for
//! east-west traffic. This module loads them with aya, pins links and maps
//! under bpffs so a restarted keelson keeps traffic flowing and reuses the
//! maps, and keeps the maps equal to the model writing only what changed.
//!
//! - [`check_support`]: can this kernel/node run it (for the fallback
//!   decision at start).
//! - [`ebpf_mode_backend`]: what the wiring calls for `proxy.mode: ebpf`
//!   (support check, fallback to nftables when configured).
//! - [`EbpfBackend`]: the [`crate::Backend`] of `proxy.mode: ebpf` (socket
//!   LB + the nftables backend for north-south).
//! - [`SocketLb`]: the socket LB alone (start, apply, diagnostics).
//! - [`cleanup`]: detach and unpin everything (`keelson` uninstall).
//! - [`inspect`]: read one service port's entries back and compare them
//!   with the model (`keelson diagnose service`), from
//!   [`pinned_service_maps`].
//!
//! Which path serves what is written down in docs/design/ebpf.md.

#![allow(clippy::cast_possible_truncation)]

mod backend;
mod error;
mod fs;
pub mod inspect;
mod layout;
mod lb;
mod maps;
mod object;
mod pinlock;
mod render;
mod sizes;
mod sync;

pub use backend::{EbpfBackend, ebpf_mode_backend};
pub use error::EbpfError;
pub use fs::{cgroup2_root, ensure_bpffs, is_bpffs, is_cgroup2};
pub use layout::LbService;
pub use layout::{
    AFFINITY_KIND_CLIENT, AFFINITY_KIND_UDP_FLOW, AffinityEntry, Frontend, L4Proto, RevNatEntry,
};
pub use lb::{
    EbpfConfig, MIN_KERNEL, PinnedLinkInfo, SocketLb, check_support, cleanup, live_link_ids,
    pinned_links, pinned_revnat_entries, pinned_service_maps, pins_in_use, service_maps_dir,
};
pub use maps::{FakeMaps, KernelMaps, LbMap, LbMaps, MapsError};
pub use pinlock::PIN_LOCK_WAIT;
pub use render::{changes_of, desired_of, frontend_of, service_of};
pub use sizes::{MIN_SIZES, MapSizes};
pub use sync::{SyncError, SyncErrors, SyncStats, Syncer};
