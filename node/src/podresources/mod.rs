//! The pod-resources API v1 on `<root>/pod-resources/kubelet.sock`, as
//! kubelet v1.36 serves it (`pkg/kubelet/apis/podresources/server_v1.go`,
//! `constants.go`, `pkg/kubelet/server/server.go`
//! `ListenAndServePodResources`): `List` (the active pods, with their
//! regular containers and restartable init containers), `Get` (one pod by
//! namespace and name; KubeletPodResourcesGet is GA in v1.36) and
//! `GetAllocatableResources`, each with the containers' devices.
//!
//! keelson has no CPU manager, no memory manager and no DRA, so `cpu_ids`,
//! `memory` and `dynamic_resources` are always empty (kubelet with the
//! `none` CPU and memory manager policies answers the same for CPUs and
//! memory). Requests are rate limited as kubelet's (100 per second, burst
//! 10: `ResourceExhausted` "rejected by rate limit").

mod rate;
mod server;

pub use server::{DIR_NAME, SOCKET_NAME, start};
