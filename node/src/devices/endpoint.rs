//! A connected device plugin (`pkg/kubelet/cm/devicemanager/endpoint.go`,
//! `plugin/v1beta1/client.go`): its gRPC client, its options, and when it
//! stopped. A stopped endpoint keeps its resource on the node for
//! [`STOP_GRACE_PERIOD`] (all devices unhealthy), then the resource goes.

use std::time::{Duration, Instant};

use keelson_cri::kubelet_api::deviceplugin::device_plugin_client::DevicePluginClient;
use keelson_cri::kubelet_api::deviceplugin::{
    AllocateRequest, AllocateResponse, ContainerAllocateRequest, DevicePluginOptions,
    PreStartContainerRequest,
};
use tonic::transport::Channel;

use super::DeviceError;

/// `endpointStopGracePeriod`.
pub(crate) const STOP_GRACE_PERIOD: Duration = Duration::from_secs(5 * 60);

/// `KubeletPreStartContainerRPCTimeoutInSecs`.
pub(crate) const PRE_START_TIMEOUT: Duration = Duration::from_secs(30);

/// kubelet's dial timeout for a device plugin (`dial` in client.go).
pub(crate) const DIAL_TIMEOUT: Duration = Duration::from_secs(10);

/// One resource's plugin (`endpointInfo`).
#[derive(Debug, Clone)]
pub(crate) struct Endpoint {
    /// The plugin's client; `None` for an endpoint restored from the
    /// checkpoint (`newStoppedEndpointImpl`).
    pub(crate) client: Option<DevicePluginClient<Channel>>,
    /// `GetDevicePluginOptions`' answer.
    pub(crate) options: Option<DevicePluginOptions>,
    /// When the plugin went away.
    pub(crate) stopped_at: Option<Instant>,
    /// Which connection this is (a re-registration makes a new one).
    pub(crate) generation: u64,
    /// Ends the connection's `ListAndWatch` task.
    pub(crate) stop: Option<tokio_util::sync::CancellationToken>,
}

impl Endpoint {
    /// `stopGracePeriodExpired`.
    pub(crate) fn grace_expired(&self, now: Instant) -> bool {
        self.stopped_at
            .is_some_and(|t| now.saturating_duration_since(t) > STOP_GRACE_PERIOD)
    }

    /// `allocate`: one container's devices.
    pub(crate) async fn allocate(
        &self,
        resource: &str,
        devices: Vec<String>,
    ) -> Result<AllocateResponse, DeviceError> {
        let Some(client) = self.client.clone().filter(|_| self.stopped_at.is_none()) else {
            return Err(DeviceError::EndpointStopped(resource.to_string()));
        };
        let mut client = client;
        client
            .allocate(AllocateRequest {
                container_requests: vec![ContainerAllocateRequest {
                    devices_ids: devices,
                }],
            })
            .await
            .map(tonic::Response::into_inner)
            .map_err(DeviceError::Rpc)
    }

    /// `preStartContainer`, bounded by [`PRE_START_TIMEOUT`].
    pub(crate) async fn pre_start(
        &self,
        resource: &str,
        devices: Vec<String>,
    ) -> Result<(), DeviceError> {
        let Some(mut client) = self.client.clone().filter(|_| self.stopped_at.is_none()) else {
            return Err(DeviceError::EndpointStopped(resource.to_string()));
        };
        let call = client.pre_start_container(PreStartContainerRequest {
            devices_ids: devices,
        });
        match tokio::time::timeout(PRE_START_TIMEOUT, call).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(s)) => Err(DeviceError::Rpc(s)),
            Err(_) => Err(DeviceError::PreStartTimeout),
        }
    }
}

/// A gRPC error as grpc-go prints one (`rpc error: code = X desc = Y`).
pub(crate) fn grpc_error_text(s: &tonic::Status) -> String {
    keelson_cri::go_status_text(s)
}
