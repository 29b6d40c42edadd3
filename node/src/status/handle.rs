//! What the rest of the node role reads from the node status manager: the
//! node's allocatable resources (downward API defaults, emptyDir memory
//! size, pod admission), the Node as last computed, and whether the Node is
//! registered. Also the trait through which the eviction manager reports
//! pressure into the node conditions.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use k8s_openapi::api::core::v1::Node;
use tokio::sync::watch;

use super::setters::PressureFlags;
use super::volumes_in_use::VolumesInUse;
use keelson_common::quantity::Quantity;

/// Reports node pressure (implemented by the eviction manager).
pub trait PressureSource: Send + Sync + 'static {
    /// Current pressure flags.
    fn pressure(&self) -> PressureFlags;
}

/// No pressure, ever (until an eviction manager is wired in).
#[derive(Debug, Clone, Copy, Default)]
pub struct NoPressure;

impl PressureSource for NoPressure {
    fn pressure(&self) -> PressureFlags {
        PressureFlags::default()
    }
}

struct Inner {
    allocatable: RwLock<BTreeMap<String, Quantity>>,
    capacity: RwLock<BTreeMap<String, Quantity>>,
    node: RwLock<Option<Node>>,
    registered: watch::Sender<bool>,
    volumes_in_use: VolumesInUse,
}

/// Read side of the node status manager; cheap to clone.
#[derive(Clone)]
pub struct NodeStatusHandle {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for NodeStatusHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeStatusHandle").finish_non_exhaustive()
    }
}

impl Default for NodeStatusHandle {
    fn default() -> Self {
        NodeStatusHandle {
            inner: Arc::new(Inner {
                allocatable: RwLock::new(BTreeMap::new()),
                capacity: RwLock::new(BTreeMap::new()),
                node: RwLock::new(None),
                registered: watch::channel(false).0,
                volumes_in_use: VolumesInUse::default(),
            }),
        }
    }
}

impl NodeStatusHandle {
    /// The node's allocatable resources as last computed.
    pub fn allocatable(&self) -> BTreeMap<String, Quantity> {
        self.inner
            .allocatable
            .read()
            .map(|a| a.clone())
            .unwrap_or_default()
    }

    /// The node's capacity as last computed.
    pub fn capacity(&self) -> BTreeMap<String, Quantity> {
        self.inner
            .capacity
            .read()
            .map(|a| a.clone())
            .unwrap_or_default()
    }

    /// [`NodeStatusHandle::allocatable`] as a shareable function (the form
    /// the volume manager takes).
    pub fn allocatable_fn(&self) -> Arc<dyn Fn() -> BTreeMap<String, Quantity> + Send + Sync> {
        let h = self.clone();
        Arc::new(move || h.allocatable())
    }

    /// The Node as last read or computed (`None` before the first sync).
    pub fn node(&self) -> Option<Node> {
        self.inner.node.read().ok().and_then(|n| n.clone())
    }

    /// The node's volumes in use (written by the volume manager, reported
    /// by the status manager).
    pub fn volumes_in_use(&self) -> &VolumesInUse {
        &self.inner.volumes_in_use
    }

    /// Whether the Node is registered.
    pub fn is_registered(&self) -> bool {
        *self.inner.registered.borrow()
    }

    /// Resolves once the Node is registered.
    pub async fn wait_registered(&self) {
        let mut rx = self.inner.registered.subscribe();
        let _ = rx.wait_for(|r| *r).await;
    }

    pub(crate) fn set_resources(
        &self,
        capacity: BTreeMap<String, Quantity>,
        allocatable: BTreeMap<String, Quantity>,
    ) {
        if let Ok(mut a) = self.inner.allocatable.write() {
            *a = allocatable;
        }
        if let Ok(mut c) = self.inner.capacity.write() {
            *c = capacity;
        }
    }

    pub(crate) fn set_node(&self, node: Node) {
        if let Ok(mut n) = self.inner.node.write() {
            *n = Some(node);
        }
    }

    pub(crate) fn set_registered(&self) {
        self.inner.registered.send_replace(true);
    }
}
