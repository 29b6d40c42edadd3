//! What a Pod's spec says, read the way kubelet reads it: its containers
//! and small predicates (`podutil`), its QoS class (`qos`) and its
//! resource requests and limits (`resources`). Below everything that
//! handles pods (cgroups, eviction, admission, the workers), so each of
//! them can ask without importing the pod workers.

pub mod podutil;
pub mod qos;
pub mod resources;
