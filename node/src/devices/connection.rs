//! keelson's client of one device plugin (`plugin/v1beta1/client.go` and
//! `handler.go` `connectClient`/`runClient`): dial the plugin's socket,
//! ask its options, then follow `ListAndWatch` until the stream ends, when
//! the plugin counts as disconnected.

use std::path::Path;

use keelson_cri::kubelet_api::deviceplugin::Empty;
use keelson_cri::kubelet_api::deviceplugin::device_plugin_client::DevicePluginClient;
use keelson_cri::kubelet_api::unix_channel;
use tokio_util::sync::CancellationToken;

use super::DeviceError;
use super::endpoint::{DIAL_TIMEOUT, Endpoint, grpc_error_text};
use super::manager::DeviceManager;

/// `connectClient`: connects to the plugin serving `resource` on `socket`
/// and follows its devices in a task of its own (ended by `stop`).
pub(crate) async fn connect(
    manager: &DeviceManager,
    resource: &str,
    socket: &Path,
    stop: CancellationToken,
) -> Result<(), DeviceError> {
    let channel = unix_channel(socket, DIAL_TIMEOUT)
        .await
        .map_err(DeviceError::Dial)?;
    let mut client = DevicePluginClient::new(channel);
    let options = client
        .get_device_plugin_options(Empty {})
        .await
        .map_err(DeviceError::Options)?
        .into_inner();
    let stop = stop.child_token();
    let generation = manager.plugin_connected(
        resource,
        Endpoint {
            client: Some(client.clone()),
            options: Some(options),
            stopped_at: None,
            generation: 0,
            stop: Some(stop.clone()),
        },
    );
    let manager = manager.clone();
    let resource = resource.to_string();
    tokio::spawn(async move {
        tokio::select! {
            () = stop.cancelled() => {}
            () = follow(&manager, &resource, generation, client) => {}
        }
        manager.plugin_disconnected(&resource, generation);
    });
    Ok(())
}

/// `Run`: every `ListAndWatch` answer replaces the resource's devices.
async fn follow(
    manager: &DeviceManager,
    resource: &str,
    generation: u64,
    mut client: DevicePluginClient<tonic::transport::Channel>,
) {
    let mut stream = match client.list_and_watch(Empty {}).await {
        Ok(s) => s.into_inner(),
        Err(s) => {
            tracing::error!(resource, error = %grpc_error_text(&s), "ListAndWatch ended unexpectedly for device plugin");
            return;
        }
    };
    loop {
        match stream.message().await {
            Ok(Some(resp)) => manager.devices_listed(resource, generation, resp.devices),
            Ok(None) => {
                tracing::error!(
                    resource,
                    "ListAndWatch ended unexpectedly for device plugin"
                );
                return;
            }
            Err(s) => {
                tracing::error!(resource, error = %grpc_error_text(&s), "ListAndWatch ended unexpectedly for device plugin");
                return;
            }
        }
    }
}
