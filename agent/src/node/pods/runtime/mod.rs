//! kubelet's `kuberuntime`: how a pod maps onto CRI sandboxes and
//! containers — labels, hashes, configs, the sync actions and their
//! execution, image pulls, lifecycle hooks and termination.

pub mod actions;
pub mod hash;
pub mod labels;
pub mod status;
