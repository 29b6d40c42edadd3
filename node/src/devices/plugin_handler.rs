//! Device plugins registering through `<root>/plugins_registry`
//! (`plugin/v1beta1/handler.go`): the plugin manager's handler for type
//! `DevicePlugin` (container_manager_linux.go `GetPluginRegistrationHandlers`
//! → `GetWatcherHandler`). kubelet v1.36 does not write the
//! `device-plugins/DEPRECATION` file (`GetPluginHandler`, which would, is
//! called only by its tests), so neither does keelson: plugins that look
//! for it register through `device-plugins/kubelet.sock`.

use std::path::Path;

use keelson_cri::kubelet_api::deviceplugin::SUPPORTED_VERSIONS;
use tokio_util::sync::CancellationToken;

use super::connection;
use super::manager::DeviceManager;
use super::registration::invalid_resource_name;
use crate::plugins::{BoxFuture, PluginHandler};
use crate::pod::resources::is_extended_resource;

/// The handler (`server` as a `cache.PluginHandler`).
pub(crate) struct DevicePluginHandler {
    manager: DeviceManager,
    stop: CancellationToken,
}

impl DevicePluginHandler {
    /// The handler.
    pub(crate) fn new(manager: DeviceManager, stop: CancellationToken) -> Self {
        DevicePluginHandler { manager, stop }
    }
}

impl PluginHandler for DevicePluginHandler {
    fn validate(&self, name: &str, endpoint: &str, versions: &[String]) -> Result<(), String> {
        tracing::info!(
            plugin = name,
            endpoint,
            ?versions,
            "got plugin at endpoint with versions"
        );
        if !versions
            .iter()
            .any(|v| SUPPORTED_VERSIONS.contains(&v.as_str()))
        {
            return Err(format!(
                "manager version, v1beta1, is not among plugin supported versions {}",
                go_string_list(versions)
            ));
        }
        if !is_extended_resource(name) {
            return Err(format!(
                "invalid name of device plugin socket: {}",
                invalid_resource_name(name)
            ));
        }
        Ok(())
    }

    fn register<'a>(
        &'a self,
        name: &'a str,
        endpoint: &'a str,
        _versions: &'a [String],
    ) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move {
            connection::connect(&self.manager, name, Path::new(endpoint), self.stop.clone())
                .await
                .map_err(|e| e.to_string())
        })
    }

    fn deregister(&self, name: &str, endpoint: &str) {
        tracing::info!(plugin = name, endpoint, "deregistering plugin");
        self.manager.disconnect(name);
    }
}

/// Go's `%v` of a `[]string`.
fn go_string_list(v: &[String]) -> String {
    format!("[{}]", v.join(" "))
}
