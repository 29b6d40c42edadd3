//! Waiting for a CSI PersistentVolume to be attached before it is staged,
//! as kubelet v1.36 does with the attach/detach controller in charge of
//! attaching (keelson, as kubelet by default, marks its Node with
//! `volumes.kubernetes.io/controller-managed-attach-detach`):
//!
//! - pkg/volume/csi/csi_plugin.go (`CanAttach`, `skipAttach`,
//!   `GetVolumeName`, `getPublishContext`): a volume is attachable unless
//!   its CSIDriver says `attachRequired: false` (no CSIDriver: attachable);
//!   its unique name is `kubernetes.io/csi/<driver>^<volumeHandle>`;
//! - pkg/volume/util/operationexecutor/operation_generator.go
//!   (`GenerateVerifyControllerAttachedVolumeFunc`): the volume must first
//!   be reported in the Node's `volumesInUse`, then be listed in the Node's
//!   `status.volumesAttached` (read from the API server);
//! - pkg/volume/csi/csi_attacher.go (`WaitForAttach`,
//!   `verifyAttachmentStatus`, `getAttachmentName`): the VolumeAttachment
//!   `csi-<sha256(volumeHandle + driver + node)>` must say `attached`;
//!   its `attachmentMetadata` is the publish context of NodeStageVolume
//!   and NodePublishVolume.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::{CSIPersistentVolumeSource, Node};
use k8s_openapi::api::storage::v1::{CSIDriver, VolumeAttachment};
use kube::Api;
use sha2::{Digest, Sha256};

use super::VolumeManager;
use crate::csi::PLUGIN_NAME;

/// `getAttachmentName`: `csi-<sha256(volumeHandle + driver + node)>`, the
/// VolumeAttachment's name.
pub fn attachment_name(volume_handle: &str, driver: &str, node: &str) -> String {
    let digest = Sha256::digest(format!("{volume_handle}{driver}{node}").as_bytes());
    format!("csi-{}", hex::encode(digest))
}

/// The unique volume name kubelet reports in `volumesInUse` and the
/// attach/detach controller in `volumesAttached`.
pub fn unique_volume_name(driver: &str, volume_handle: &str) -> String {
    format!("{PLUGIN_NAME}/{driver}^{volume_handle}")
}

/// `!skipAttach`: attach is required unless the CSIDriver says otherwise.
pub(super) fn attach_required(driver: Option<&CSIDriver>) -> bool {
    driver.is_none_or(|d| d.spec.attach_required != Some(false))
}

/// `verifyAttachmentStatus`: `Ok(true)` attached, `Ok(false)` not yet,
/// `Err` when waiting is pointless (being deleted, attach error).
pub(super) fn attachment_status(va: &VolumeAttachment) -> Result<bool, String> {
    if va.metadata.deletion_timestamp.is_some() {
        return Err("volume attachment is being deleted".to_string());
    }
    let status = va.status.clone().unwrap_or_default();
    if status.attached {
        return Ok(true);
    }
    if let Some(e) = status.attach_error {
        return Err(e.message.unwrap_or_default());
    }
    Ok(false)
}

/// Whether the Node lists `unique` in `status.volumesAttached`.
pub(super) fn node_lists_attached(node: &Node, unique: &str) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.volumes_attached.as_ref())
        .is_some_and(|v| v.iter().any(|a| a.name == unique))
}

impl VolumeManager {
    /// Until the volume is attached to this node: the publish context of
    /// an attached (or not attachable) volume, or why it is not usable
    /// yet. Marks the volume in use for pod `uid` first.
    pub(super) async fn wait_for_csi_attach(
        &self,
        uid: &str,
        src: &CSIPersistentVolumeSource,
    ) -> Result<HashMap<String, String>, String> {
        let Some(csi) = self.inner.csi.clone() else {
            return Err(format!("{PLUGIN_NAME}: CSI is not enabled on this node"));
        };
        let driver = csi.lister().get(&src.driver).await.map_err(|e| {
            format!("{PLUGIN_NAME}: failed to check whether attach is required: {e}")
        })?;
        if !attach_required(driver.as_deref()) {
            return Ok(HashMap::new());
        }
        let unique = unique_volume_name(&src.driver, &src.volume_handle);
        let in_use = &self.inner.in_use;
        in_use.add_desired(uid, &unique);
        if !in_use.is_reported(&unique) {
            return Err(
                "Volume has not been added to the list of VolumesInUse in the node's volume status"
                    .to_string(),
            );
        }
        let node_name = csi.node_name().to_string();
        let node = Api::<Node>::all(csi.api_client())
            .get(&node_name)
            .await
            .map_err(|e| {
                format!(
                    "VerifyControllerAttachedVolume failed fetching node from API server: {}",
                    super::tokens::api_message(&e)
                )
            })?;
        if !node_lists_attached(&node, &unique) {
            return Err(format!(
                "Volume not attached according to node status: volume {unique} is not yet in node's status"
            ));
        }
        in_use.add_attached(&unique);
        let id = attachment_name(&src.volume_handle, &src.driver, &node_name);
        let handle = &src.volume_handle;
        let va = Api::<VolumeAttachment>::all(csi.api_client())
            .get(&id)
            .await
            .map_err(|e| {
                format!(
                    "MountVolume.WaitForAttach failed: volume {handle} has GET error for volume attachment {id}: {}",
                    super::tokens::api_message(&e)
                )
            })?;
        match attachment_status(&va) {
            Ok(true) => Ok(va
                .status
                .and_then(|s| s.attachment_metadata)
                .unwrap_or_default()
                .into_iter()
                .collect()),
            Ok(false) => Err(format!(
                "MountVolume.WaitForAttach failed: volume {handle} is not attached for volume attachment {id}"
            )),
            Err(e) => Err(format!("MountVolume.WaitForAttach failed: {e}")),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use k8s_openapi::api::storage::v1::{CSIDriverSpec, VolumeAttachmentStatus, VolumeError};

    #[test]
    fn names_as_kubelet() {
        assert_eq!(
            attachment_name("h", "d", "n"),
            format!("csi-{}", hex::encode(Sha256::digest(b"hdn")))
        );
        assert_eq!(
            unique_volume_name("hostpath.csi.k8s.io", "v1"),
            "kubernetes.io/csi/hostpath.csi.k8s.io^v1"
        );
    }

    #[test]
    fn attach_required_unless_the_driver_says_no() {
        let d = |a: Option<bool>| CSIDriver {
            spec: CSIDriverSpec {
                attach_required: a,
                ..Default::default()
            },
            ..Default::default()
        };
        assert!(attach_required(None));
        assert!(attach_required(Some(&d(None))));
        assert!(attach_required(Some(&d(Some(true)))));
        assert!(!attach_required(Some(&d(Some(false)))));
    }

    #[test]
    fn attachment_states() {
        let va = |attached: bool, err: Option<&str>| VolumeAttachment {
            status: Some(VolumeAttachmentStatus {
                attached,
                attach_error: err.map(|m| VolumeError {
                    message: Some(m.to_string()),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(attachment_status(&va(true, None)), Ok(true));
        assert_eq!(attachment_status(&va(false, None)), Ok(false));
        assert_eq!(
            attachment_status(&va(false, Some("no such disk"))),
            Err("no such disk".to_string())
        );
        let mut deleting = va(true, None);
        deleting.metadata.deletion_timestamp = Some(
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(jiff::Timestamp::UNIX_EPOCH),
        );
        assert_eq!(
            attachment_status(&deleting),
            Err("volume attachment is being deleted".to_string())
        );
        let node: Node = serde_json::from_value(serde_json::json!({
            "status": {"volumesAttached": [{"name": "kubernetes.io/csi/d^h", "devicePath": ""}]}
        }))
        .unwrap();
        assert!(node_lists_attached(&node, "kubernetes.io/csi/d^h"));
        assert!(!node_lists_attached(&node, "kubernetes.io/csi/d^x"));
    }
}
