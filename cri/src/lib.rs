//! keelson's CRI (runtime.v1) client, and a fake runtime for tests.
//!
//! The node role drives the container runtime only through CRI over gRPC,
//! like kubelet. This crate is the only one that depends on the generated
//! bindings (`k8s-cri`); everything else uses the re-exported [`api`] types.
//!
//! # Client
//!
//! [`RuntimeClient`] (cheap to clone) talks to one `unix://` endpoint:
//!
//! | area | methods |
//! |---|---|
//! | runtime | [`version`](RuntimeClient::version), [`status`](RuntimeClient::status) / [`status_verbose`](RuntimeClient::status_verbose) (see [`RUNTIME_READY`], [`NETWORK_READY`], [`runtime_condition`]), [`update_runtime_config`](RuntimeClient::update_runtime_config) |
//! | sandboxes | [`run_pod_sandbox`](RuntimeClient::run_pod_sandbox), [`stop_pod_sandbox`](RuntimeClient::stop_pod_sandbox), [`remove_pod_sandbox`](RuntimeClient::remove_pod_sandbox), [`pod_sandbox_status`](RuntimeClient::pod_sandbox_status), [`list_pod_sandbox`](RuntimeClient::list_pod_sandbox) |
//! | containers | [`create_container`](RuntimeClient::create_container), [`start_container`](RuntimeClient::start_container), [`stop_container`](RuntimeClient::stop_container), [`remove_container`](RuntimeClient::remove_container), [`container_status`](RuntimeClient::container_status), [`list_containers`](RuntimeClient::list_containers), [`update_container_resources`](RuntimeClient::update_container_resources), [`reopen_container_log`](RuntimeClient::reopen_container_log), [`exec_sync`](RuntimeClient::exec_sync) |
//! | events | [`get_container_events`](RuntimeClient::get_container_events) → [`ContainerEventStream`] |
//! | stats | [`container_stats`](RuntimeClient::container_stats), [`list_container_stats`](RuntimeClient::list_container_stats), [`pod_sandbox_stats`](RuntimeClient::pod_sandbox_stats), [`list_pod_sandbox_stats`](RuntimeClient::list_pod_sandbox_stats) |
//! | images | [`pull_image`](RuntimeClient::pull_image), [`image_status`](RuntimeClient::image_status), [`list_images`](RuntimeClient::list_images), [`remove_image`](RuntimeClient::remove_image), [`image_fs_info`](RuntimeClient::image_fs_info) |
//!
//! Deadlines ([`ClientConfig`]): every call gets `request_timeout`
//! (kubelet's `runtimeRequestTimeout`, default 2m); StopContainer and
//! ExecSync get their own timeout on top, as kubelet does; PullImage has its
//! own, longer deadline. The event stream has none.
//!
//! Errors ([`CriError`]) fold gRPC codes into the cases the node role acts
//! on: NotFound, Unavailable, DeadlineExceeded, Unimplemented,
//! InvalidArgument, AlreadyExists, Other — each naming the CRI method.
//!
//! Reconnection is lazy: when the runtime restarts, calls in flight and
//! calls made while it is down fail with [`CriError::Unavailable`]; the next
//! call dials the socket again.
//!
//! # Fake runtime
//!
//! With the `testing` feature, [`fake::FakeRuntime`] is a real gRPC server
//! on a unix socket with in-memory state and test controls (see its docs).

mod client;
mod endpoint;
mod error;
mod events;
pub mod kubelet_api;

#[cfg(feature = "testing")]
pub mod fake;

/// The CRI runtime.v1 messages, enums and generated clients/servers.
pub use k8s_cri::v1 as api;

pub use client::{
    ClientConfig, DEFAULT_PULL_IMAGE_TIMEOUT, DEFAULT_REQUEST_TIMEOUT, ExecSyncResult,
    KUBE_RUNTIME_API_VERSION, NETWORK_READY, RUNTIME_READY, RuntimeClient, image_spec,
    runtime_condition,
};
pub use endpoint::{MAX_MESSAGE_SIZE, socket_path};
pub use error::{Code, CriError, go_code_name, go_status_text};
pub use events::ContainerEventStream;
