//! The CSI client against an in-process driver (a real tonic server of
//! the `csi.v1` Node service on a unix socket): what each call sends,
//! what kubelet's client reads from the answers, and errors as grpc-go
//! prints them.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use keelson_cri::kubelet_api::csi::node_server::{Node, NodeServer};
use keelson_cri::kubelet_api::csi::node_service_capability::rpc::Type as CapType;
use keelson_cri::kubelet_api::csi::node_service_capability::{Rpc, Type as CapKind};
use keelson_cri::kubelet_api::csi::volume_capability::AccessType;
use keelson_cri::kubelet_api::csi::volume_capability::access_mode::Mode;
use keelson_cri::kubelet_api::csi::volume_usage::Unit;
use keelson_cri::kubelet_api::csi::*;
use tokio::net::UnixListener;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Request, Response, Status};

use super::client::{Access, CsiClient, CsiError, VolumeRequest, access_mode};

#[derive(Clone, Default)]
struct Driver {
    calls: Arc<Mutex<Vec<String>>>,
    published: Arc<Mutex<Vec<NodePublishVolumeRequest>>>,
    staged: Arc<Mutex<Vec<NodeStageVolumeRequest>>>,
}

#[tonic::async_trait]
impl Node for Driver {
    async fn node_stage_volume(
        &self,
        r: Request<NodeStageVolumeRequest>,
    ) -> Result<Response<NodeStageVolumeResponse>, Status> {
        self.staged.lock().unwrap().push(r.into_inner());
        Ok(Response::new(NodeStageVolumeResponse {}))
    }
    async fn node_unstage_volume(
        &self,
        r: Request<NodeUnstageVolumeRequest>,
    ) -> Result<Response<NodeUnstageVolumeResponse>, Status> {
        let r = r.into_inner();
        self.calls
            .lock()
            .unwrap()
            .push(format!("unstage {} {}", r.volume_id, r.staging_target_path));
        Ok(Response::new(NodeUnstageVolumeResponse {}))
    }
    async fn node_publish_volume(
        &self,
        r: Request<NodePublishVolumeRequest>,
    ) -> Result<Response<NodePublishVolumeResponse>, Status> {
        let r = r.into_inner();
        if r.volume_id == "broken" {
            return Err(Status::internal("no space left"));
        }
        if r.volume_id == "busy" {
            return Err(Status::aborted("operation pending"));
        }
        self.published.lock().unwrap().push(r);
        Ok(Response::new(NodePublishVolumeResponse {}))
    }
    async fn node_unpublish_volume(
        &self,
        r: Request<NodeUnpublishVolumeRequest>,
    ) -> Result<Response<NodeUnpublishVolumeResponse>, Status> {
        let r = r.into_inner();
        if r.volume_id == "gone" {
            return Err(Status::not_found("volume gone not found"));
        }
        self.calls
            .lock()
            .unwrap()
            .push(format!("unpublish {} {}", r.volume_id, r.target_path));
        Ok(Response::new(NodeUnpublishVolumeResponse {}))
    }
    async fn node_get_volume_stats(
        &self,
        r: Request<NodeGetVolumeStatsRequest>,
    ) -> Result<Response<NodeGetVolumeStatsResponse>, Status> {
        assert_eq!(r.into_inner().volume_path, "/v/mount");
        Ok(Response::new(NodeGetVolumeStatsResponse {
            usage: vec![
                VolumeUsage {
                    available: 70,
                    total: 100,
                    used: 30,
                    unit: Unit::Bytes as i32,
                },
                VolumeUsage {
                    available: 9,
                    total: 10,
                    used: 1,
                    unit: Unit::Inodes as i32,
                },
            ],
            volume_condition: Some(VolumeCondition {
                abnormal: true,
                message: "disk failing".into(),
            }),
        }))
    }
    async fn node_expand_volume(
        &self,
        _: Request<NodeExpandVolumeRequest>,
    ) -> Result<Response<NodeExpandVolumeResponse>, Status> {
        Err(Status::unimplemented("no"))
    }
    async fn node_get_capabilities(
        &self,
        _: Request<NodeGetCapabilitiesRequest>,
    ) -> Result<Response<NodeGetCapabilitiesResponse>, Status> {
        let cap = |t: CapType| NodeServiceCapability {
            r#type: Some(CapKind::Rpc(Rpc { r#type: t as i32 })),
        };
        Ok(Response::new(NodeGetCapabilitiesResponse {
            capabilities: vec![
                cap(CapType::StageUnstageVolume),
                cap(CapType::GetVolumeStats),
                cap(CapType::VolumeMountGroup),
            ],
        }))
    }
    async fn node_get_info(
        &self,
        _: Request<NodeGetInfoRequest>,
    ) -> Result<Response<NodeGetInfoResponse>, Status> {
        Ok(Response::new(NodeGetInfoResponse {
            node_id: "node-7".into(),
            max_volumes_per_node: 12,
            accessible_topology: Some(Topology {
                segments: [("topology.example.com/zone".to_string(), "z1".to_string())].into(),
            }),
        }))
    }
}

fn serve(path: &Path) -> Driver {
    let driver = Driver::default();
    let listener = UnixListener::bind(path).unwrap();
    let d = driver.clone();
    tokio::spawn(async move {
        let _ = tonic::transport::Server::builder()
            .add_service(NodeServer::new(d))
            .serve_with_incoming(UnixListenerStream::new(listener))
            .await;
    });
    driver
}

fn request(id: &str) -> VolumeRequest {
    VolumeRequest {
        volume_id: id.into(),
        publish_context: HashMap::from([("dev".into(), "/dev/x".into())]),
        volume_context: HashMap::from([("csi.storage.k8s.io/ephemeral".into(), "true".into())]),
        secrets: HashMap::new(),
        access_mode: access_mode("ReadWriteOnce", false),
        access: Access::Mount {
            fs_type: "ext4".into(),
            flags: vec!["noatime".into()],
            mount_group: Some(2000),
        },
    }
}

#[tokio::test]
async fn client_speaks_csi_v1() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("csi.sock");
    let driver = serve(&sock);
    let client = CsiClient::new(&sock, Duration::from_secs(5));

    let info = client.node_get_info().await.unwrap();
    assert_eq!(info.node_id, "node-7");
    assert_eq!(info.max_volumes_per_node, 12);
    assert_eq!(info.topology["topology.example.com/zone"], "z1");

    let caps = client.node_get_capabilities().await.unwrap();
    assert!(caps.stage_unstage && caps.volume_stats && caps.volume_mount_group);
    assert!(!caps.expand && !caps.single_node_multi_writer);

    client
        .node_stage_volume(&request("v1"), Path::new("/g/globalmount"))
        .await
        .unwrap();
    client
        .node_publish_volume(
            &request("v1"),
            Some(Path::new("/g/globalmount")),
            Path::new("/p/mount"),
            true,
        )
        .await
        .unwrap();
    let p = driver.published.lock().unwrap()[0].clone();
    assert_eq!(p.target_path, "/p/mount");
    assert_eq!(p.staging_target_path, "/g/globalmount");
    assert!(p.readonly);
    assert_eq!(p.publish_context["dev"], "/dev/x");
    let cap = p.volume_capability.unwrap();
    assert_eq!(cap.access_mode.unwrap().mode, Mode::SingleNodeWriter as i32);
    match cap.access_type.unwrap() {
        AccessType::Mount(m) => {
            assert_eq!(m.fs_type, "ext4");
            assert_eq!(m.mount_flags, ["noatime"]);
            assert_eq!(m.volume_mount_group, "2000");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        driver.staged.lock().unwrap()[0].staging_target_path,
        "/g/globalmount"
    );

    client
        .node_unpublish_volume("v1", Path::new("/p/mount"))
        .await
        .unwrap();
    client
        .node_unstage_volume("v1", Path::new("/g/globalmount"))
        .await
        .unwrap();
    assert_eq!(
        *driver.calls.lock().unwrap(),
        ["unpublish v1 /p/mount", "unstage v1 /g/globalmount"]
    );

    let stats = client
        .node_get_volume_stats("v1", Path::new("/v/mount"))
        .await
        .unwrap();
    assert_eq!(stats.bytes.unwrap().used, 30);
    assert_eq!(stats.inodes.unwrap().total, 10);
    assert_eq!(stats.abnormal.as_deref(), Some("disk failing"));
}

#[tokio::test]
async fn errors_read_as_kubelets() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("csi.sock");
    serve(&sock);
    let client = CsiClient::new(&sock, Duration::from_secs(5));
    let e = client
        .node_publish_volume(&request("broken"), None, Path::new("/p"), false)
        .await
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "rpc error: code = Internal desc = no space left"
    );
    assert!(e.is_final());
    let e = client
        .node_publish_volume(&request("busy"), None, Path::new("/p"), false)
        .await
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "rpc error: code = Aborted desc = operation pending"
    );
    assert!(!e.is_final(), "Aborted may still be in progress");
    assert_eq!(
        client
            .node_unpublish_volume("", Path::new("/p"))
            .await
            .unwrap_err(),
        CsiError::Invalid("missing volume id")
    );
    // No driver on the socket: not final (kubelet retries).
    let none = CsiClient::new(dir.path().join("absent.sock"), Duration::from_secs(1));
    let e = none.node_get_info().await.unwrap_err();
    assert!(!e.is_final());
    assert!(
        e.to_string().starts_with("rpc error: code = Unavailable"),
        "{e}"
    );
}

#[test]
fn access_modes_as_kubelet_maps_them() {
    assert_eq!(access_mode("ReadWriteOnce", false), Mode::SingleNodeWriter);
    assert_eq!(
        access_mode("ReadWriteOnce", true),
        Mode::SingleNodeMultiWriter
    );
    assert_eq!(
        access_mode("ReadWriteOncePod", false),
        Mode::SingleNodeWriter
    );
    assert_eq!(
        access_mode("ReadWriteOncePod", true),
        Mode::SingleNodeSingleWriter
    );
    assert_eq!(access_mode("ReadOnlyMany", true), Mode::MultiNodeReaderOnly);
    assert_eq!(
        access_mode("ReadWriteMany", false),
        Mode::MultiNodeMultiWriter
    );
    assert_eq!(access_mode("Other", false), Mode::Unknown);
}
