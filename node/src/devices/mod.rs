//! Device plugins, as kubelet v1.36's device manager runs them
//! (`pkg/kubelet/cm/devicemanager/`):
//!
//! - plugins register through the v1beta1 Registration service on
//!   `<root>/device-plugins/kubelet.sock` ([`registration`]) or through
//!   `<root>/plugins_registry` ([`plugin_handler`], a handler of
//!   [`crate::plugins`]);
//! - keelson connects to each plugin ([`connection`]): options, then
//!   `ListAndWatch`; devices and their health become the node's extended
//!   resources ([`manager::DeviceManager::capacity`]: unhealthy devices in
//!   capacity only; a plugin gone leaves its devices unhealthy for 5
//!   minutes, then capacity 0);
//! - at admission each container's devices are chosen and the plugin's
//!   `Allocate` asked; a failure refuses the pod with
//!   `UnexpectedAdmissionError` ("Allocate failed due to ..., which is
//!   unexpected"); at container start `PreStartContainer` (when the plugin
//!   asks for it) and the answer's devices, mounts, environment,
//!   annotations and CDI devices go into the CRI container config;
//! - allocations survive restarts in kubelet's checkpoint format
//!   ([`checkpoint`]).
//!
//! Not implemented: topology hints and `GetPreferredAllocation` (no
//! topology manager: devices are taken in ID order), the device health in
//! `containerStatuses[].allocatedResourcesStatus` (ResourceHealthStatus,
//! alpha), DRA-backed extended resources.

pub(crate) mod checkpoint;
pub(crate) mod connection;
pub(crate) mod endpoint;
pub(crate) mod manager;
pub(crate) mod plugin_handler;
pub(crate) mod pod_devices;
pub(crate) mod registration;

#[cfg(test)]
mod tests;

/// Why devices could not be allocated or prepared for a container, in
/// kubelet's words (`pkg/kubelet/cm/devicemanager/manager.go`); admission
/// shows it in `UnexpectedAdmissionError`, a container start in
/// `CreateContainerConfigError`.
#[derive(Debug, thiserror::Error)]
pub(crate) enum DeviceError {
    /// The plugin's socket could not be dialled.
    #[error("failed to dial device plugin: {0}")]
    Dial(tonic::transport::Error),
    /// GetDevicePluginOptions failed.
    #[error("failed to get device plugin options: {}", endpoint::grpc_error_text(.0))]
    Options(tonic::Status),
    /// The plugin's endpoint is stopped.
    #[error("endpoint {0} has been stopped")]
    EndpointStopped(String),
    /// The plugin answered an error.
    #[error("{}", endpoint::grpc_error_text(.0))]
    Rpc(tonic::Status),
    /// PreStartContainer took too long.
    #[error("rpc error: code = DeadlineExceeded desc = context deadline exceeded")]
    PreStartTimeout,
    /// PreStartContainer failed.
    #[error("device plugin PreStartContainer rpc failed with err: {0}")]
    PreStart(Box<DeviceError>),
    /// No plugin serves the resource any more.
    #[error("unknown Device Plugin {0}")]
    UnknownPlugin(String),
    /// The plugin's Allocate answer has no container.
    #[error("no containers return in allocation response")]
    NoContainerResponse,
    /// A container asks for another number of devices than it holds.
    #[error(
        "pod {uid:?} container {container:?} changed request for resource {resource:?} from {from} to {to}"
    )]
    RequestChanged {
        /// Pod UID.
        uid: String,
        /// Container.
        container: String,
        /// Resource.
        resource: String,
        /// Devices held.
        from: usize,
        /// Devices asked for.
        to: usize,
    },
    /// No plugin ever registered the resource.
    #[error("cannot allocate unregistered device {0}")]
    Unregistered(String),
    /// Every device of the resource is unhealthy.
    #[error("no healthy devices present; cannot allocate unhealthy devices {0}")]
    NoHealthy(String),
    /// Devices held by the container became unhealthy.
    #[error(
        "previously allocated devices are no longer healthy; cannot allocate unhealthy devices {0}"
    )]
    NoLongerHealthy(String),
    /// Too few free devices.
    #[error(
        "requested number of devices unavailable for {resource}. Requested: {requested}, Available: {available}"
    )]
    Unavailable {
        /// Resource.
        resource: String,
        /// Devices asked for.
        requested: usize,
        /// Devices free.
        available: usize,
    },
    /// A registered resource has no endpoint.
    #[error("endpoint not found in cache for a registered resource: {0}")]
    EndpointNotCached(String),
    /// The container's devices are not in the cache.
    #[error(
        "no devices found allocated in local cache for pod {uid}, container {container}, resource {resource}"
    )]
    NotAllocated {
        /// Pod UID.
        uid: String,
        /// Container.
        container: String,
        /// Resource.
        resource: String,
    },
}

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

pub use manager::{DeviceCapacity, DeviceManager};
pub use pod_devices::RunContainerOptions;
pub use registration::RegistrationError;

/// The device plugin directory under the root dir.
pub const DIR_NAME: &str = "device-plugins";

/// `(pod UID, container name)` of every running container the runtime
/// reports (kubelet's `buildContainerMapAndRunningSetFromRuntime`).
pub(crate) async fn running_containers(
    cri: &keelson_cri::RuntimeClient,
) -> BTreeSet<(String, String)> {
    let filter = keelson_cri::api::ContainerFilter {
        state: Some(keelson_cri::api::ContainerStateValue {
            state: keelson_cri::api::ContainerState::ContainerRunning as i32,
        }),
        ..Default::default()
    };
    let listed = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        cri.list_containers(Some(filter)),
    )
    .await;
    match listed {
        Err(_) => {
            tracing::warn!("listing running containers for the device manager timed out");
            BTreeSet::new()
        }
        Ok(Ok(list)) => list
            .into_iter()
            .filter_map(|c| {
                let uid = c.labels.get("io.kubernetes.pod.uid")?.clone();
                let name = c.labels.get("io.kubernetes.container.name")?.clone();
                Some((uid, name))
            })
            .collect(),
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "listing running containers for the device manager failed");
            BTreeSet::new()
        }
    }
}

/// Starts the device manager: reads the checkpoint, serves the
/// Registration socket, and returns the plugin manager's handler for
/// device plugins.
pub(crate) async fn start(
    manager: &DeviceManager,
    cri: &keelson_cri::RuntimeClient,
    stop: CancellationToken,
) -> Result<Arc<dyn crate::plugins::PluginHandler>, RegistrationError> {
    let running = running_containers(cri).await;
    manager.read_checkpoint(running);
    registration::start(manager, stop.clone())?;
    Ok(Arc::new(plugin_handler::DevicePluginHandler::new(
        manager.clone(),
        stop,
    )))
}

/// `<root>/device-plugins`.
pub fn dir(root_dir: &Path) -> std::path::PathBuf {
    root_dir.join(DIR_NAME)
}
