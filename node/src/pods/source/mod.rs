//! Where pods come from: the API (pods bound to this node), static pod
//! manifests, and the Services behind environment variables; plus the
//! mirror pods that stand for static pods in the API.

pub mod api;
pub mod defaults;
pub mod file;
pub mod mirror;
pub mod services;

use k8s_openapi::api::core::v1::Pod;

/// A change reported by a source.
#[derive(Debug, Clone)]
pub enum SourceEvent {
    /// A pod was added or changed.
    Upsert(Pod),
    /// A pod is gone from its source.
    Remove(Pod),
    /// The API source listed every pod once.
    ApiSynced,
    /// The static pod directory was read once (or is not configured).
    StaticSynced,
}
