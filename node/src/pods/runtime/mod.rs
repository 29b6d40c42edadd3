//! kubelet's `kuberuntime`: how a pod maps onto CRI sandboxes and
//! containers — labels, hashes, configs, the sync actions and their
//! execution, image pulls, lifecycle hooks and termination.

pub mod actions;
pub mod dns;
pub mod do_resize;
pub mod env;
pub mod errors;
pub mod hooks;
pub mod hosts;
pub mod imageref;
pub mod images;
pub mod keyring;
pub mod kill;
pub mod linux_host;
pub mod linux_resources;
pub mod log_tail;
pub mod manager;
pub mod pull_records;
pub mod resize;
pub mod runtime_class;
pub mod sandbox;
pub mod security;
pub mod service_env;
pub mod start;
pub mod status;
pub mod sync;

pub use manager::{
    AllocatableFn, NoServices, RuntimeManager, RuntimeParts, RuntimeSettings, ServiceEnv,
};
pub use sync::PodSyncResult;
