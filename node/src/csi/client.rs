//! A CSI v1 client for one driver's node service, as kubelet v1.36's
//! `pkg/volume/csi/csi_client.go` (`csiDriverClient`): a new connection to
//! the driver's unix socket per call (`newGrpcConn`), each call bounded by
//! the operation's deadline (`csiTimeout`, 2 min), errors as grpc-go prints
//! them (`rpc error: code = X desc = Y`).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::time::Duration;

use keelson_cri::kubelet_api::csi::node_client::NodeClient;
use keelson_cri::kubelet_api::csi::node_service_capability::rpc::Type as CapabilityType;
use keelson_cri::kubelet_api::csi::volume_capability::access_mode::Mode as AccessMode;
use keelson_cri::kubelet_api::csi::volume_capability::{
    AccessMode as AccessModeMsg, AccessType, BlockVolume, MountVolume,
};
use keelson_cri::kubelet_api::csi::{
    NodeGetCapabilitiesRequest, NodeGetInfoRequest, NodeGetVolumeStatsRequest,
    NodePublishVolumeRequest, NodeStageVolumeRequest, NodeUnpublishVolumeRequest,
    NodeUnstageVolumeRequest, VolumeCapability,
};
use keelson_cri::kubelet_api::unix_channel;
use tonic::transport::Channel;

/// kubelet's deadline of every CSI operation (`csiTimeout`).
pub(crate) const CSI_TIMEOUT: Duration = Duration::from_secs(120);

/// A failed CSI call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum CsiError {
    /// The driver answered with an error status.
    #[error("{text}")]
    Status {
        /// The gRPC code.
        code: tonic::Code,
        /// `rpc error: code = X desc = Y`.
        text: String,
    },
    /// The socket could not be dialled.
    #[error("rpc error: code = Unavailable desc = connection error: {0}")]
    Dial(String),
    /// The call did not finish within its deadline.
    #[error("rpc error: code = DeadlineExceeded desc = context deadline exceeded")]
    Deadline,
    /// A request kubelet refuses to send (`missing volume id`).
    #[error("{0}")]
    Invalid(&'static str),
}

impl CsiError {
    /// kubelet's `isFinalError`: the operation surely did not start or
    /// surely failed; `false` means it may still be in progress in the
    /// driver (Canceled, DeadlineExceeded, Unavailable, ResourceExhausted,
    /// Aborted, or no status at all).
    pub(crate) fn is_final(&self) -> bool {
        match self {
            CsiError::Status { code, .. } => !matches!(
                code,
                tonic::Code::Cancelled
                    | tonic::Code::DeadlineExceeded
                    | tonic::Code::Unavailable
                    | tonic::Code::ResourceExhausted
                    | tonic::Code::Aborted
            ),
            CsiError::Invalid(_) => true,
            CsiError::Dial(_) | CsiError::Deadline => false,
        }
    }
}

impl From<tonic::Status> for CsiError {
    fn from(s: tonic::Status) -> Self {
        CsiError::Status {
            code: s.code(),
            text: keelson_cri::go_status_text(&s),
        }
    }
}

/// What `NodeGetInfo` tells.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct NodeInfo {
    /// `node_id`.
    pub(crate) node_id: String,
    /// `max_volumes_per_node` (0: no limit).
    pub(crate) max_volumes_per_node: i64,
    /// `accessible_topology.segments`.
    pub(crate) topology: BTreeMap<String, String>,
}

/// The node capabilities kubelet asks about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct NodeCapabilities {
    /// `STAGE_UNSTAGE_VOLUME`.
    pub(crate) stage_unstage: bool,
    /// `GET_VOLUME_STATS`.
    pub(crate) volume_stats: bool,
    /// `EXPAND_VOLUME`.
    pub(crate) expand: bool,
    /// `SINGLE_NODE_MULTI_WRITER`.
    pub(crate) single_node_multi_writer: bool,
    /// `VOLUME_MOUNT_GROUP`.
    pub(crate) volume_mount_group: bool,
}

/// A PersistentVolume access mode as kubelet maps it to CSI
/// (`asCSIAccessModeV1` and, for drivers with SINGLE_NODE_MULTI_WRITER,
/// `asSingleNodeMultiWriterCapableCSIAccessModeV1`).
pub(crate) fn access_mode(mode: &str, single_node_multi_writer: bool) -> AccessMode {
    match (mode, single_node_multi_writer) {
        ("ReadWriteOnce", false) | ("ReadWriteOncePod", false) => AccessMode::SingleNodeWriter,
        ("ReadWriteOnce", true) => AccessMode::SingleNodeMultiWriter,
        ("ReadWriteOncePod", true) => AccessMode::SingleNodeSingleWriter,
        ("ReadOnlyMany", _) => AccessMode::MultiNodeReaderOnly,
        ("ReadWriteMany", _) => AccessMode::MultiNodeMultiWriter,
        _ => AccessMode::Unknown,
    }
}

/// How the volume is presented (`VolumeCapability.access_type`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Access {
    /// A filesystem: `fs_type`, `mount_flags`, `volume_mount_group`.
    Mount {
        /// The filesystem type ("" lets the driver choose).
        fs_type: String,
        /// Mount options.
        flags: Vec<String>,
        /// The fsGroup the driver applies (VOLUME_MOUNT_GROUP drivers).
        mount_group: Option<i64>,
    },
    /// A raw block device (`volumeMode: Block`, not supported yet).
    #[allow(dead_code)]
    Block,
}

/// The parameters of NodeStageVolume and NodePublishVolume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct VolumeRequest {
    /// `volume_id`.
    pub(crate) volume_id: String,
    /// `publish_context` (from the VolumeAttachment).
    pub(crate) publish_context: HashMap<String, String>,
    /// `volume_context` (volume attributes, pod info, tokens).
    pub(crate) volume_context: HashMap<String, String>,
    /// `secrets`.
    pub(crate) secrets: HashMap<String, String>,
    /// The access mode.
    pub(crate) access_mode: AccessMode,
    /// Mount or block.
    pub(crate) access: Access,
}

impl VolumeRequest {
    fn capability(&self) -> VolumeCapability {
        let access_type = match &self.access {
            Access::Mount {
                fs_type,
                flags,
                mount_group,
            } => AccessType::Mount(MountVolume {
                fs_type: fs_type.clone(),
                mount_flags: flags.clone(),
                volume_mount_group: mount_group.map(|g| g.to_string()).unwrap_or_default(),
            }),
            Access::Block => AccessType::Block(BlockVolume {}),
        };
        VolumeCapability {
            access_mode: Some(AccessModeMsg {
                mode: self.access_mode as i32,
            }),
            access_type: Some(access_type),
        }
    }
}

/// The client of one driver, by its socket.
#[derive(Debug, Clone)]
pub(crate) struct CsiClient {
    endpoint: PathBuf,
    timeout: Duration,
}

impl CsiClient {
    /// A client of the driver serving on `endpoint`; every call is bounded
    /// by `timeout`.
    pub(crate) fn new(endpoint: impl Into<PathBuf>, timeout: Duration) -> CsiClient {
        CsiClient {
            endpoint: endpoint.into(),
            timeout,
        }
    }

    async fn node(&self) -> Result<NodeClient<Channel>, CsiError> {
        let channel = unix_channel(self.endpoint.clone(), self.timeout)
            .await
            .map_err(|e| CsiError::Dial(format!("{}: {e}", self.endpoint.display())))?;
        Ok(NodeClient::new(channel))
    }

    async fn bounded<T>(
        &self,
        f: impl std::future::Future<Output = Result<T, CsiError>>,
    ) -> Result<T, CsiError> {
        tokio::time::timeout(self.timeout, f)
            .await
            .unwrap_or(Err(CsiError::Deadline))
    }

    /// `NodeGetInfo`.
    pub(crate) async fn node_get_info(&self) -> Result<NodeInfo, CsiError> {
        self.bounded(async {
            let r = self
                .node()
                .await?
                .node_get_info(NodeGetInfoRequest {})
                .await?
                .into_inner();
            Ok(NodeInfo {
                node_id: r.node_id,
                max_volumes_per_node: r.max_volumes_per_node,
                topology: r
                    .accessible_topology
                    .map(|t| t.segments.into_iter().collect())
                    .unwrap_or_default(),
            })
        })
        .await
    }

    /// `NodeGetCapabilities`, folded into the ones kubelet asks about.
    pub(crate) async fn node_get_capabilities(&self) -> Result<NodeCapabilities, CsiError> {
        use keelson_cri::kubelet_api::csi::node_service_capability::Type as CapKind;
        self.bounded(async {
            let r = self
                .node()
                .await?
                .node_get_capabilities(NodeGetCapabilitiesRequest {})
                .await?
                .into_inner();
            let mut caps = NodeCapabilities::default();
            for c in r.capabilities {
                let Some(CapKind::Rpc(rpc)) = c.r#type else {
                    continue;
                };
                match CapabilityType::try_from(rpc.r#type) {
                    Ok(CapabilityType::StageUnstageVolume) => caps.stage_unstage = true,
                    Ok(CapabilityType::GetVolumeStats) => caps.volume_stats = true,
                    Ok(CapabilityType::ExpandVolume) => caps.expand = true,
                    Ok(CapabilityType::SingleNodeMultiWriter) => {
                        caps.single_node_multi_writer = true
                    }
                    Ok(CapabilityType::VolumeMountGroup) => caps.volume_mount_group = true,
                    _ => {}
                }
            }
            Ok(caps)
        })
        .await
    }

    /// `NodeStageVolume` to `staging_path` (the volume's globalmount).
    pub(crate) async fn node_stage_volume(
        &self,
        req: &VolumeRequest,
        staging_path: &Path,
    ) -> Result<(), CsiError> {
        if req.volume_id.is_empty() {
            return Err(CsiError::Invalid("missing volume id"));
        }
        let msg = NodeStageVolumeRequest {
            volume_id: req.volume_id.clone(),
            publish_context: req.publish_context.clone(),
            staging_target_path: staging_path.to_string_lossy().into_owned(),
            volume_capability: Some(req.capability()),
            secrets: req.secrets.clone(),
            volume_context: req.volume_context.clone(),
        };
        self.bounded(async {
            self.node().await?.node_stage_volume(msg).await?;
            Ok(())
        })
        .await
    }

    /// `NodeUnstageVolume`.
    pub(crate) async fn node_unstage_volume(
        &self,
        volume_id: &str,
        staging_path: &Path,
    ) -> Result<(), CsiError> {
        if volume_id.is_empty() {
            return Err(CsiError::Invalid("missing volume id"));
        }
        let msg = NodeUnstageVolumeRequest {
            volume_id: volume_id.to_string(),
            staging_target_path: staging_path.to_string_lossy().into_owned(),
        };
        self.bounded(async {
            self.node().await?.node_unstage_volume(msg).await?;
            Ok(())
        })
        .await
    }

    /// `NodePublishVolume` to `target` (`<pod>/volumes/kubernetes.io~csi/<vol>/mount`),
    /// from `staging` when the volume was staged.
    pub(crate) async fn node_publish_volume(
        &self,
        req: &VolumeRequest,
        staging: Option<&Path>,
        target: &Path,
        read_only: bool,
    ) -> Result<(), CsiError> {
        if req.volume_id.is_empty() {
            return Err(CsiError::Invalid("missing volume id"));
        }
        let msg = NodePublishVolumeRequest {
            volume_id: req.volume_id.clone(),
            publish_context: req.publish_context.clone(),
            staging_target_path: staging
                .map(|p| p.to_string_lossy().into_owned())
                .unwrap_or_default(),
            target_path: target.to_string_lossy().into_owned(),
            volume_capability: Some(req.capability()),
            readonly: read_only,
            secrets: req.secrets.clone(),
            volume_context: req.volume_context.clone(),
        };
        self.bounded(async {
            self.node().await?.node_publish_volume(msg).await?;
            Ok(())
        })
        .await
    }

    /// `NodeUnpublishVolume`.
    pub(crate) async fn node_unpublish_volume(
        &self,
        volume_id: &str,
        target: &Path,
    ) -> Result<(), CsiError> {
        if volume_id.is_empty() {
            return Err(CsiError::Invalid("missing volume id"));
        }
        let msg = NodeUnpublishVolumeRequest {
            volume_id: volume_id.to_string(),
            target_path: target.to_string_lossy().into_owned(),
        };
        self.bounded(async {
            self.node().await?.node_unpublish_volume(msg).await?;
            Ok(())
        })
        .await
    }

    /// `NodeGetVolumeStats`: (bytes used, bytes total, inodes used, inodes
    /// total) as far as the driver reports them.
    pub(crate) async fn node_get_volume_stats(
        &self,
        volume_id: &str,
        volume_path: &Path,
    ) -> Result<VolumeStats, CsiError> {
        use keelson_cri::kubelet_api::csi::volume_usage::Unit;
        let msg = NodeGetVolumeStatsRequest {
            volume_id: volume_id.to_string(),
            volume_path: volume_path.to_string_lossy().into_owned(),
            staging_target_path: String::new(),
        };
        self.bounded(async {
            let r = self
                .node()
                .await?
                .node_get_volume_stats(msg)
                .await?
                .into_inner();
            let mut stats = VolumeStats {
                any_usage: !r.usage.is_empty(),
                ..Default::default()
            };
            for u in r.usage {
                let usage = Usage {
                    available: u.available,
                    total: u.total,
                    used: u.used,
                };
                match Unit::try_from(u.unit) {
                    Ok(Unit::Bytes) => stats.bytes = Some(usage),
                    Ok(Unit::Inodes) => stats.inodes = Some(usage),
                    _ => {}
                }
            }
            stats.abnormal = r.volume_condition.filter(|c| c.abnormal).map(|c| c.message);
            Ok(stats)
        })
        .await
    }
}

/// One `VolumeUsage`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Usage {
    /// `available`.
    pub(crate) available: i64,
    /// `total`.
    pub(crate) total: i64,
    /// `used`.
    pub(crate) used: i64,
}

/// What `NodeGetVolumeStats` reports.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct VolumeStats {
    /// Usage in bytes.
    pub(crate) bytes: Option<Usage>,
    /// Usage in inodes.
    pub(crate) inodes: Option<Usage>,
    /// The answer has usage entries (of any unit): kubelet refuses one
    /// without.
    pub(crate) any_usage: bool,
    /// The volume condition's message when the driver reports it abnormal.
    pub(crate) abnormal: Option<String>,
}
