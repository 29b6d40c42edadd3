//! The plugin watcher's handler for CSI drivers (type `CSIPlugin`), as
//! kubelet v1.36's `csi_plugin.go` `RegistrationHandler`:
//!
//! - `ValidatePlugin`: at least one 1.x version, and higher than the
//!   version of a driver already registered under the same name;
//! - `RegisterPlugin`: the driver goes into the store (so its client can be
//!   made), `NodeGetInfo` (bounded by `csiTimeout`), then the node info
//!   manager's `InstallCSIDriver`; a failure takes the driver out again;
//! - `DeRegisterPlugin`: out of the store, and `UninstallCSIDriver`.

use std::path::PathBuf;

use super::version::highest_supported;
use super::{Csi, Driver, PLUGIN_NAME};
use crate::plugins::{BoxFuture, PluginHandler};

/// The handler.
pub(crate) struct CsiPluginHandler {
    csi: Csi,
}

impl CsiPluginHandler {
    /// The handler registering drivers into `csi`.
    pub(crate) fn new(csi: Csi) -> Self {
        CsiPluginHandler { csi }
    }

    /// `validateVersions`.
    fn validate_versions(
        &self,
        caller: &str,
        name: &str,
        versions: &[String],
    ) -> Result<super::version::Version, String> {
        if versions.is_empty() {
            return Err(format!(
                "{PLUGIN_NAME}: {caller} for CSI driver {name:?} failed. Plugin returned an empty list for supported versions"
            ));
        }
        let highest = highest_supported(versions).map_err(|e| {
            format!(
                "{PLUGIN_NAME}: {caller} for CSI driver {name:?} failed. None of the versions specified {} are supported. err={e}",
                go_quoted_list(versions)
            )
        })?;
        if let Some(existing) = self.csi.driver(name)
            && existing.highest_version >= highest
        {
            return Err(format!(
                "{PLUGIN_NAME}: {caller} for CSI driver {name:?} failed. Another driver with the same name is already registered with a higher supported version: \"{}\"",
                existing.highest_version
            ));
        }
        Ok(highest)
    }

    /// `unregisterDriver` + `UninstallCSIDriver`.
    async fn unregister(&self, name: &str) -> Result<(), String> {
        self.csi.remove_driver(name);
        self.csi
            .inner
            .nim
            .uninstall_driver(name)
            .await
            .map_err(|e| format!("{PLUGIN_NAME}: Error uninstalling CSI driver: {e}"))
    }
}

impl PluginHandler for CsiPluginHandler {
    fn validate(&self, name: &str, endpoint: &str, versions: &[String]) -> Result<(), String> {
        tracing::info!(
            plugin = name,
            endpoint,
            versions = %versions.join(","),
            "trying to validate a new CSI driver"
        );
        self.validate_versions("ValidatePlugin", name, versions)
            .map(|_| ())
            .map_err(|e| {
                format!("validation failed for CSI Driver {name} at endpoint {endpoint}: {e}")
            })
    }

    fn register<'a>(
        &'a self,
        name: &'a str,
        endpoint: &'a str,
        versions: &'a [String],
    ) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move {
            tracing::info!(plugin = name, endpoint, "registering CSI driver");
            let highest = self.validate_versions("RegisterPlugin", name, versions)?;
            self.csi.set_driver(
                name,
                Driver {
                    endpoint: PathBuf::from(endpoint),
                    highest_version: highest,
                },
            );
            let info = match self.csi.client(name) {
                Ok(c) => c.node_get_info().await.map_err(|e| e.to_string()),
                Err(e) => Err(e),
            };
            let result = match info {
                Ok(info) => self
                    .csi
                    .inner
                    .nim
                    .install_driver(
                        name,
                        &info.node_id,
                        info.max_volumes_per_node,
                        &info.topology,
                    )
                    .await
                    .map(|()| info),
                Err(e) => Err(e),
            };
            match result {
                Ok(info) => {
                    tracing::info!(
                        plugin = name,
                        node_id = %info.node_id,
                        topology = ?info.topology,
                        max_volumes = info.max_volumes_per_node,
                        "CSI driver registered"
                    );
                    Ok(())
                }
                Err(e) => {
                    if let Err(u) = self.unregister(name).await {
                        tracing::error!(plugin = name, error = %u, "failed to unregister CSI driver after a failed registration");
                    }
                    Err(e)
                }
            }
        })
    }

    fn deregister(&self, name: &str, endpoint: &str) {
        tracing::info!(plugin = name, endpoint, "deregistering CSI driver");
        let handler = CsiPluginHandler {
            csi: self.csi.clone(),
        };
        let name = name.to_string();
        tokio::spawn(async move {
            if let Err(e) = handler.unregister(&name).await {
                tracing::error!(plugin = %name, error = %e, "deregistering CSI driver failed");
            }
        });
    }
}

/// Go's `%q` of a `[]string`.
fn go_quoted_list(v: &[String]) -> String {
    let q: Vec<String> = v.iter().map(|s| format!("{s:?}")).collect();
    format!("[{}]", q.join(" "))
}
