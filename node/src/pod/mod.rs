//! What a Pod's spec says, read the way kubelet reads it: its containers
//! and small predicates (`podutil`), its QoS class (`qos`), its
//! resource requests and limits (`resources`), and how its sandbox and
//! containers are named on CRI (`labels`, with the container hash `hash`).
//! Below everything that handles pods (cgroups, eviction, stats,
//! admission, the workers), so each of them can ask without importing the
//! pod workers.

pub(crate) mod fnv;
pub mod hash;
pub mod labels;
pub mod podutil;
pub mod qos;
pub mod resources;
