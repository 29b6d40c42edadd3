//! The node side of CSI, as kubelet v1.36's CSI volume plugin
//! (`pkg/volume/csi/`):
//!
//! - [`handler`]: the plugin watcher's handler for `CSIPlugin`
//!   (`csi_plugin.go` `RegistrationHandler`): version check, the driver
//!   store, `NodeGetInfo`, then the CSINode entry, the Node's node ID
//!   annotation and topology labels; deregistration undoes them.
//! - [`nodeinfo`] (`nodeinfomanager/`): the CSINode and the Node's CSI
//!   facts; the CSINode is created empty at start
//!   (`InitializeCSINodeWithAnnotation`), and until then the node reports
//!   a storage error (`CSINode is not yet initialized`) as kubelet does.
//! - [`client`] (`csi_client.go`): the CSI v1 node service over the
//!   driver's unix socket.
//! - [`drivers`]: the CSIDriver objects (attachRequired, podInfoOnMount,
//!   fsGroupPolicy, volumeLifecycleModes, tokenRequests).
//! - [`version`]: which CSI versions a driver may register with.
//!
//! The volumes themselves are set up by the volume manager
//! (`volumes/csi.rs`), which asks [`Csi`] for a driver's client.

pub(crate) mod client;
pub(crate) mod drivers;
pub(crate) mod handler;
pub(crate) mod nodeinfo;
#[cfg(test)]
mod tests;
pub(crate) mod version;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::status::RuntimeState;
use client::{CSI_TIMEOUT, CsiClient};
use drivers::CsiDriverLister;
use nodeinfo::NodeInfoManager;
use version::Version;

/// kubelet's name of its CSI volume plugin (`CSIPluginName`), the prefix
/// of its messages.
pub(crate) const PLUGIN_NAME: &str = "kubernetes.io/csi";

/// A registered driver (`csi_drivers_store.go` `Driver`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Driver {
    /// Its socket.
    pub(crate) endpoint: PathBuf,
    /// The highest CSI version it supports.
    pub(crate) highest_version: Version,
}

struct Inner {
    drivers: Mutex<BTreeMap<String, Driver>>,
    nim: NodeInfoManager,
    lister: CsiDriverLister,
    node_name: String,
    client: kube::Client,
}

/// The node's CSI state: registered drivers, the CSIDriver lister and the
/// node info manager. Cheap to clone.
#[derive(Clone)]
pub struct Csi {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Csi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Csi")
            .field("node", &self.inner.node_name)
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// kubelet's `initBackoff` for the CSINode initialization: 6 tries from
/// 30 ms growing ×8 (about 140 s in all).
const INIT_STEPS: u32 = 6;
const INIT_FIRST: Duration = Duration::from_millis(30);

impl Csi {
    /// Starts the CSIDriver watch and the CSINode initialization for
    /// `node_name`. Until the CSINode is initialized `runtime` carries the
    /// storage error kubelet sets (the node is not Ready).
    pub fn start(
        client: kube::Client,
        node_name: &str,
        runtime: RuntimeState,
        stop: CancellationToken,
    ) -> Csi {
        let csi = Csi {
            inner: Arc::new(Inner {
                drivers: Mutex::new(BTreeMap::new()),
                nim: NodeInfoManager::new(client.clone(), node_name),
                lister: CsiDriverLister::start(client.clone(), stop.clone()),
                node_name: node_name.to_string(),
                client,
            }),
        };
        runtime.set_storage_state(Some("CSINode is not yet initialized".to_string()));
        let nim = csi.inner.nim.clone();
        tokio::spawn(async move {
            // kubelet first waits for the API server (and its Node), then
            // tries with `initBackoff`; where kubelet then exits to retry
            // from scratch, keelson keeps trying with the last delay.
            let mut delay = INIT_FIRST;
            let mut step = 0;
            loop {
                let result = tokio::select! {
                    _ = stop.cancelled() => return,
                    r = nim.initialize() => r,
                };
                match result {
                    Ok(()) => {
                        tracing::info!("CSINode initialized");
                        runtime.set_storage_state(None);
                        return;
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "failed to initialize CSINode");
                        runtime
                            .set_storage_state(Some(format!("failed to initialize CSINode: {e}")));
                    }
                }
                step += 1;
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(delay) => {}
                }
                if step < INIT_STEPS {
                    delay *= 8;
                }
            }
        });
        csi
    }

    /// The node's name.
    pub(crate) fn node_name(&self) -> &str {
        &self.inner.node_name
    }

    /// The API client (the node's identity).
    pub(crate) fn api_client(&self) -> kube::Client {
        self.inner.client.clone()
    }

    /// The CSIDriver lister.
    pub(crate) fn lister(&self) -> &CsiDriverLister {
        &self.inner.lister
    }

    /// The registered driver `name`.
    pub(crate) fn driver(&self, name: &str) -> Option<Driver> {
        lock(&self.inner.drivers).get(name).cloned()
    }

    /// A client of the registered driver `name` (kubelet's
    /// `newCsiDriverClient`).
    pub(crate) fn client(&self, name: &str) -> Result<CsiClient, String> {
        if name.is_empty() {
            return Err("driver name is empty".to_string());
        }
        let d = self.driver(name).ok_or_else(|| {
            format!("driver name {name} not found in the list of registered CSI drivers")
        })?;
        Ok(CsiClient::new(d.endpoint, CSI_TIMEOUT))
    }

    fn set_driver(&self, name: &str, driver: Driver) {
        lock(&self.inner.drivers).insert(name.to_string(), driver);
    }

    fn remove_driver(&self, name: &str) -> bool {
        lock(&self.inner.drivers).remove(name).is_some()
    }
}
