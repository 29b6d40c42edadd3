//! The node's CSI facts in the API, as kubelet v1.36's node info manager
//! (`pkg/volume/csi/nodeinfomanager/nodeinfomanager.go`):
//!
//! - the **CSINode** named after the node, owned by the Node (an
//!   ownerReference with the Node's UID; a CSINode owned by an earlier Node
//!   of the same name is deleted and created again), created empty at start
//!   with the `storage.alpha.kubernetes.io/migrated-plugins` annotation
//!   (`InitializeCSINodeWithAnnotation`), with one `spec.drivers` entry per
//!   registered driver: `nodeID`, sorted `topologyKeys`, `allocatable.count`
//!   when the driver reports a volume limit;
//! - on the **Node**: the annotation `csi.volume.kubernetes.io/nodeid`
//!   (a JSON object driver → node ID) and the driver's topology segments as
//!   labels (a segment that contradicts an existing label is an error),
//!   written through the status subresource as kubelet's `PatchNodeStatus`.
//!
//! Each write is retried as kubelet's `updateBackoff` (4 tries, 10 ms × 5).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::storage::v1::{CSINode, CSINodeDriver, CSINodeSpec, VolumeNodeResources};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

/// The Node annotation with every driver's node ID (`annotationKeyNodeID`).
pub(crate) const NODE_ID_ANNOTATION: &str = "csi.volume.kubernetes.io/nodeid";
/// The CSINode annotation naming the in-tree plugins migrated to CSI
/// (`v1.MigratedPluginsAnnotationKey`).
pub(crate) const MIGRATED_PLUGINS_ANNOTATION: &str = "storage.alpha.kubernetes.io/migrated-plugins";
/// Every in-tree plugin kubelet v1.36 reports as migrated (all of
/// `csi_plugin.go`'s `migratedPlugins`, each always on), sorted and joined
/// as kubelet writes them.
pub(crate) const MIGRATED_PLUGINS: &str = "kubernetes.io/aws-ebs,kubernetes.io/azure-disk,kubernetes.io/azure-file,kubernetes.io/cinder,kubernetes.io/gce-pd,kubernetes.io/portworx-volume,kubernetes.io/vsphere-volume";

/// kubelet's `updateBackoff`: 4 tries, 10 ms growing ×5.
const BACKOFF_STEPS: u32 = 4;
const BACKOFF_FIRST: Duration = Duration::from_millis(10);

/// A Node change: the new node ID map and labels to set, or why not.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct NodeChange {
    /// The annotation's new value (`None`: remove the annotation).
    annotation: Option<Option<String>>,
    /// Labels to add.
    labels: BTreeMap<String, String>,
}

impl NodeChange {
    fn is_empty(&self) -> bool {
        self.annotation.is_none() && self.labels.is_empty()
    }

    /// The strategic merge patch of the Node's metadata.
    fn patch(&self) -> Value {
        let mut meta = serde_json::Map::new();
        if let Some(a) = &self.annotation {
            meta.insert("annotations".to_string(), json!({ NODE_ID_ANNOTATION: a }));
        }
        if !self.labels.is_empty() {
            meta.insert("labels".to_string(), json!(self.labels));
        }
        json!({ "metadata": meta })
    }
}

fn node_id_map(node: &Node) -> Result<BTreeMap<String, String>, String> {
    let Some(value) = node
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(NODE_ID_ANNOTATION))
        .filter(|v| !v.is_empty())
    else {
        return Ok(BTreeMap::new());
    };
    serde_json::from_str(value).map_err(|e| {
        format!(
            "failed to parse node's {NODE_ID_ANNOTATION:?} annotation value ({value:?}) err={e}"
        )
    })
}

/// `updateNodeIDInNode` + `updateTopologyLabels`: what registering
/// `driver` with `node_id` and `topology` changes on `node`.
pub(crate) fn install_change(
    node: &Node,
    driver: &str,
    node_id: &str,
    topology: &BTreeMap<String, String>,
) -> Result<NodeChange, String> {
    let mut change = NodeChange::default();
    let mut ids = node_id_map(node)?;
    if ids.get(driver).map(String::as_str) != Some(node_id) {
        ids.insert(driver.to_string(), node_id.to_string());
        change.annotation = Some(Some(
            serde_json::to_string(&ids).map_err(|e| e.to_string())?,
        ));
    }
    let labels = node.metadata.labels.clone().unwrap_or_default();
    for (k, v) in topology {
        if let Some(cur) = labels.get(k)
            && cur != v
        {
            return Err(format!(
                "detected topology value collision: driver reported {k:?}:{v:?} but existing label is {k:?}:{cur:?}"
            ));
        }
    }
    for (k, v) in topology {
        if labels.get(k) != Some(v) {
            change.labels.insert(k.clone(), v.clone());
        }
    }
    Ok(change)
}

/// `removeNodeIDFromNode`: what deregistering `driver` changes on `node`
/// (topology labels stay, as kubelet leaves them).
pub(crate) fn uninstall_change(node: &Node, driver: &str) -> Result<NodeChange, String> {
    let mut ids = node_id_map(node)?;
    if ids.remove(driver).is_none() {
        return Ok(NodeChange::default());
    }
    let annotation = if ids.is_empty() {
        None
    } else {
        Some(serde_json::to_string(&ids).map_err(|e| e.to_string())?)
    };
    Ok(NodeChange {
        annotation: Some(annotation),
        labels: BTreeMap::new(),
    })
}

/// `installDriverToCSINode`: `spec.drivers` with `driver`'s entry set, or
/// `None` when nothing changes.
pub(crate) fn with_driver(
    spec: &CSINodeSpec,
    driver: &str,
    node_id: &str,
    max_volumes: i64,
    topology: &BTreeMap<String, String>,
) -> Option<Vec<CSINodeDriver>> {
    let keys: BTreeSet<&String> = topology.keys().collect();
    let mut unchanged = false;
    let mut drivers = Vec::new();
    for d in &spec.drivers {
        if d.name == driver {
            let same_keys = d.topology_keys.iter().flatten().collect::<BTreeSet<_>>() == keys;
            let count = d.allocatable.as_ref().and_then(|a| a.count);
            let same_count = if max_volumes == 0 {
                count.is_none()
            } else {
                count.map(i64::from) == Some(max_volumes)
            };
            unchanged = d.node_id == node_id && same_keys && same_count;
        } else {
            drivers.push(d.clone());
        }
    }
    if unchanged {
        return None;
    }
    let allocatable = if max_volumes > 0 {
        let count = i32::try_from(max_volumes).unwrap_or(i32::MAX);
        Some(VolumeNodeResources { count: Some(count) })
    } else {
        if max_volumes < 0 {
            tracing::error!(
                driver,
                max_volumes,
                "invalid attach limit value cannot be added to CSINode object"
            );
        }
        None
    };
    drivers.push(CSINodeDriver {
        name: driver.to_string(),
        node_id: node_id.to_string(),
        topology_keys: Some(keys.into_iter().cloned().collect()),
        allocatable,
    });
    Some(drivers)
}

/// The node info manager: writes the CSINode and the Node's CSI facts.
#[derive(Clone)]
pub(crate) struct NodeInfoManager {
    client: kube::Client,
    node_name: String,
    lock: std::sync::Arc<tokio::sync::Mutex<()>>,
}

impl NodeInfoManager {
    /// The manager of `node_name`'s CSINode.
    pub(crate) fn new(client: kube::Client, node_name: &str) -> NodeInfoManager {
        NodeInfoManager {
            client,
            node_name: node_name.to_string(),
            lock: Default::default(),
        }
    }

    fn nodes(&self) -> Api<Node> {
        Api::all(self.client.clone())
    }

    fn csi_nodes(&self) -> Api<CSINode> {
        Api::all(self.client.clone())
    }

    async fn retry<F, Fut>(&self, what: &str, mut f: F) -> Result<(), String>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<(), String>>,
    {
        let mut errors = Vec::new();
        let mut delay = BACKOFF_FIRST;
        for step in 0..BACKOFF_STEPS {
            match f().await {
                Ok(()) => return Ok(()),
                Err(e) => errors.push(e),
            }
            if step + 1 < BACKOFF_STEPS {
                tokio::time::sleep(delay).await;
                delay *= 5;
            }
        }
        Err(format!(
            "error updating {what}: timed out waiting for the condition; caused by: [{}]",
            errors.join(", ")
        ))
    }

    async fn node_uid(&self) -> Result<String, String> {
        let node = self
            .nodes()
            .get(&self.node_name)
            .await
            .map_err(|e| e.to_string())?;
        Ok(node.metadata.uid.unwrap_or_default())
    }

    /// `CreateCSINode`.
    async fn create(&self, node_uid: &str) -> Result<CSINode, String> {
        let obj = CSINode {
            metadata: ObjectMeta {
                name: Some(self.node_name.clone()),
                owner_references: Some(vec![OwnerReference {
                    api_version: "v1".to_string(),
                    kind: "Node".to_string(),
                    name: self.node_name.clone(),
                    uid: node_uid.to_string(),
                    ..Default::default()
                }]),
                annotations: Some(
                    [(
                        MIGRATED_PLUGINS_ANNOTATION.to_string(),
                        MIGRATED_PLUGINS.to_string(),
                    )]
                    .into(),
                ),
                ..Default::default()
            },
            spec: CSINodeSpec { drivers: vec![] },
        };
        self.csi_nodes()
            .create(&PostParams::default(), &obj)
            .await
            .map_err(|e| e.to_string())
    }

    /// `ensureNodeOwnsCSINode`: a CSINode owned by another Node (an
    /// earlier incarnation) is deleted, and the caller tries again.
    async fn ensure_owned(&self, obj: &CSINode, node_uid: &str) -> Result<(), String> {
        let mut owner = String::new();
        for r in obj.metadata.owner_references.iter().flatten() {
            if r.kind != "Node" {
                continue;
            }
            owner = r.uid.clone();
            if r.name == self.node_name && r.uid == node_uid {
                return Ok(());
            }
        }
        tracing::info!(csinode = %self.node_name, old = %owner, new = %node_uid, "existing CSINode is owned by a different node, deleting it");
        self.csi_nodes()
            .delete(&self.node_name, &DeleteParams::default())
            .await
            .map_err(|e| format!("error deleting existing CSINode {:?}: {e}", self.node_name))?;
        Err(format!(
            "CSINode {:?} was owned by different node (oldNodeID={owner:?}, newNodeID={node_uid:?}), deleted it",
            self.node_name
        ))
    }

    /// The CSINode, created when missing, owned by the current Node.
    async fn current(&self) -> Result<CSINode, String> {
        let uid = self.node_uid().await?;
        let obj = match self
            .csi_nodes()
            .get_opt(&self.node_name)
            .await
            .map_err(|e| e.to_string())?
        {
            Some(o) => o,
            None => return self.create(&uid).await,
        };
        self.ensure_owned(&obj, &uid).await?;
        Ok(obj)
    }

    /// `InitializeCSINodeWithAnnotation`: the CSINode exists, is the
    /// Node's, and carries the migrated-plugins annotation.
    pub(crate) async fn initialize(&self) -> Result<(), String> {
        self.retry("CSINode annotation", || async {
            let _g = self.lock.lock().await;
            let mut obj = self.current().await?;
            let annotations = obj
                .metadata
                .annotations
                .get_or_insert_with(Default::default);
            if annotations
                .get(MIGRATED_PLUGINS_ANNOTATION)
                .map(String::as_str)
                == Some(MIGRATED_PLUGINS)
            {
                return Ok(());
            }
            annotations.insert(
                MIGRATED_PLUGINS_ANNOTATION.to_string(),
                MIGRATED_PLUGINS.to_string(),
            );
            self.csi_nodes()
                .replace(&self.node_name, &PostParams::default(), &obj)
                .await
                .map(|_| ())
                .map_err(|e| e.to_string())
        })
        .await
    }

    async fn update_node(
        &self,
        change: impl Fn(&Node) -> Result<NodeChange, String>,
    ) -> Result<(), String> {
        self.retry("node", || async {
            let _g = self.lock.lock().await;
            let node = self
                .nodes()
                .get(&self.node_name)
                .await
                .map_err(|e| e.to_string())?;
            let c = change(&node)?;
            if c.is_empty() {
                return Ok(());
            }
            self.nodes()
                .patch_status(
                    &self.node_name,
                    &PatchParams::default(),
                    &Patch::Strategic(c.patch()),
                )
                .await
                .map(|_| ())
                .map_err(|e| e.to_string())
        })
        .await
    }

    /// `InstallCSIDriver`: the Node's annotation and labels, then the
    /// CSINode's driver entry.
    pub(crate) async fn install_driver(
        &self,
        driver: &str,
        node_id: &str,
        max_volumes: i64,
        topology: &BTreeMap<String, String>,
    ) -> Result<(), String> {
        if node_id.is_empty() {
            return Err(
                "error adding CSI driver node info: driverNodeID must not be empty".to_string(),
            );
        }
        self.update_node(|n| install_change(n, driver, node_id, topology))
            .await
            .map_err(|e| format!("error updating Node object with CSI driver node info: {e}"))?;
        self.retry("CSINode", || async {
            let _g = self.lock.lock().await;
            let mut obj = self.current().await?;
            let Some(drivers) = with_driver(&obj.spec, driver, node_id, max_volumes, topology)
            else {
                return Ok(());
            };
            obj.spec.drivers = drivers;
            self.csi_nodes()
                .replace(&self.node_name, &PostParams::default(), &obj)
                .await
                .map(|_| ())
                .map_err(|e| e.to_string())
        })
        .await
        .map_err(|e| format!("error updating CSINode object with CSI driver node info: {e}"))
    }

    /// `UninstallCSIDriver`: the CSINode's entry, then the Node's annotation.
    pub(crate) async fn uninstall_driver(&self, driver: &str) -> Result<(), String> {
        self.retry("CSINode", || async {
            let _g = self.lock.lock().await;
            let Some(mut obj) = self
                .csi_nodes()
                .get_opt(&self.node_name)
                .await
                .map_err(|e| e.to_string())?
            else {
                return Ok(());
            };
            let before = obj.spec.drivers.len();
            obj.spec.drivers.retain(|d| d.name != driver);
            if obj.spec.drivers.len() == before {
                return Ok(());
            }
            self.csi_nodes()
                .replace(&self.node_name, &PostParams::default(), &obj)
                .await
                .map(|_| ())
                .map_err(|e| e.to_string())
        })
        .await
        .map_err(|e| format!("error uninstalling CSI driver from CSINode object {e}"))?;
        self.update_node(|n| uninstall_change(n, driver))
            .await
            .map_err(|e| format!("error removing CSI driver node info from Node object {e}"))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn node(annotation: Option<&str>, labels: &[(&str, &str)]) -> Node {
        let mut n = Node::default();
        if let Some(a) = annotation {
            n.metadata.annotations = Some([(NODE_ID_ANNOTATION.to_string(), a.to_string())].into());
        }
        n.metadata.labels = Some(
            labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        n
    }

    fn topo(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn install_adds_the_node_id_and_labels_once() {
        let n = node(Some(r#"{"a.example.com":"n1"}"#), &[]);
        let c = install_change(
            &n,
            "hostpath.csi.k8s.io",
            "node-1",
            &topo(&[("topology.hostpath.csi/node", "node-1")]),
        )
        .unwrap();
        assert_eq!(
            c.patch(),
            json!({"metadata": {
                "annotations": {NODE_ID_ANNOTATION: r#"{"a.example.com":"n1","hostpath.csi.k8s.io":"node-1"}"#},
                "labels": {"topology.hostpath.csi/node": "node-1"}
            }})
        );
        let done = node(
            Some(r#"{"hostpath.csi.k8s.io":"node-1"}"#),
            &[("topology.hostpath.csi/node", "node-1")],
        );
        assert!(
            install_change(
                &done,
                "hostpath.csi.k8s.io",
                "node-1",
                &topo(&[("topology.hostpath.csi/node", "node-1")])
            )
            .unwrap()
            .is_empty()
        );
    }

    #[test]
    fn install_refuses_a_topology_collision_and_a_broken_annotation() {
        let n = node(None, &[("zone", "a")]);
        assert_eq!(
            install_change(&n, "d", "id", &topo(&[("zone", "b")])).unwrap_err(),
            r#"detected topology value collision: driver reported "zone":"b" but existing label is "zone":"a""#
        );
        let bad = node(Some("{"), &[]);
        assert!(install_change(&bad, "d", "id", &topo(&[])).unwrap_err().starts_with(
            r#"failed to parse node's "csi.volume.kubernetes.io/nodeid" annotation value ("{")"#
        ));
    }

    #[test]
    fn uninstall_removes_the_entry_and_the_empty_annotation() {
        let n = node(Some(r#"{"a":"1","b":"2"}"#), &[]);
        assert_eq!(
            uninstall_change(&n, "a").unwrap().patch(),
            json!({"metadata": {"annotations": {NODE_ID_ANNOTATION: r#"{"b":"2"}"#}}})
        );
        let last = node(Some(r#"{"a":"1"}"#), &[]);
        assert_eq!(
            uninstall_change(&last, "a").unwrap().patch(),
            json!({"metadata": {"annotations": {NODE_ID_ANNOTATION: null}}})
        );
        assert!(uninstall_change(&last, "zzz").unwrap().is_empty());
    }

    #[test]
    fn csinode_driver_entry() {
        let spec = CSINodeSpec { drivers: vec![] };
        let d = with_driver(&spec, "d", "n1", 10, &topo(&[("z", "1"), ("a", "2")])).unwrap();
        assert_eq!(d.len(), 1);
        assert_eq!(d[0].topology_keys.clone().unwrap(), ["a", "z"]);
        assert_eq!(d[0].allocatable.as_ref().unwrap().count, Some(10));
        let spec = CSINodeSpec { drivers: d };
        assert!(with_driver(&spec, "d", "n1", 10, &topo(&[("z", "1"), ("a", "2")])).is_none());
        let changed = with_driver(&spec, "d", "n2", 0, &topo(&[])).unwrap();
        assert_eq!(changed[0].node_id, "n2");
        assert!(changed[0].allocatable.is_none());
        assert_eq!(
            changed[0].topology_keys.clone().unwrap(),
            Vec::<String>::new()
        );
    }
}
