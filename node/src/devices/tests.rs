//! The device manager's gRPC sides against an in-process plugin (a real
//! tonic server on a unix socket): registration through
//! `device-plugins/kubelet.sock` and through `plugins_registry`, devices
//! into capacity, Allocate, PreStartContainer, loss of the plugin.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt as _;
use keelson_cri::kubelet_api::deviceplugin::device_plugin_server::{
    DevicePlugin, DevicePluginServer,
};
use keelson_cri::kubelet_api::deviceplugin::registration_client::RegistrationClient;
use keelson_cri::kubelet_api::deviceplugin::{
    AllocateRequest, AllocateResponse, ContainerAllocateResponse, Device, DevicePluginOptions,
    Empty, ListAndWatchResponse, Mount, PreStartContainerRequest, PreStartContainerResponse,
    PreferredAllocationRequest, PreferredAllocationResponse, RegisterRequest,
};
use keelson_cri::kubelet_api::pluginregistration::registration_server::{
    Registration as PluginRegistration, RegistrationServer as PluginRegistrationServer,
};
use keelson_cri::kubelet_api::pluginregistration::{
    InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse,
};
use keelson_cri::kubelet_api::unix_channel;
use tokio::net::UnixListener;
use tokio_stream::wrappers::UnixListenerStream;
use tokio_util::sync::CancellationToken;

use super::DeviceManager;

const RESOURCE: &str = "example.com/dev";

#[derive(Clone, Default)]
struct Plugin {
    pre_start: Arc<Mutex<Vec<Vec<String>>>>,
    notified: Arc<Mutex<Vec<RegistrationStatus>>>,
    /// Ends the ListAndWatch streams (a stopping plugin's server closes
    /// them, as grpc-go's `Stop`).
    stop: CancellationToken,
}

type Stream = std::pin::Pin<
    Box<dyn futures::Stream<Item = Result<ListAndWatchResponse, tonic::Status>> + Send>,
>;

#[tonic::async_trait]
impl DevicePlugin for Plugin {
    type ListAndWatchStream = Stream;

    async fn get_device_plugin_options(
        &self,
        _: tonic::Request<Empty>,
    ) -> Result<tonic::Response<DevicePluginOptions>, tonic::Status> {
        Ok(tonic::Response::new(DevicePluginOptions {
            pre_start_required: true,
            get_preferred_allocation_available: false,
        }))
    }

    async fn list_and_watch(
        &self,
        _: tonic::Request<Empty>,
    ) -> Result<tonic::Response<Self::ListAndWatchStream>, tonic::Status> {
        let first = ListAndWatchResponse {
            devices: vec![
                Device {
                    id: "d0".into(),
                    health: "Healthy".into(),
                    topology: None,
                },
                Device {
                    id: "d1".into(),
                    health: "Unhealthy".into(),
                    topology: None,
                },
            ],
        };
        let s = futures::stream::once(async move { Ok(first) }).chain(futures::stream::pending());
        Ok(tonic::Response::new(Box::pin(s)))
    }

    async fn get_preferred_allocation(
        &self,
        _: tonic::Request<PreferredAllocationRequest>,
    ) -> Result<tonic::Response<PreferredAllocationResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("no"))
    }

    async fn allocate(
        &self,
        req: tonic::Request<AllocateRequest>,
    ) -> Result<tonic::Response<AllocateResponse>, tonic::Status> {
        let r = req.into_inner();
        Ok(tonic::Response::new(AllocateResponse {
            container_responses: r
                .container_requests
                .iter()
                .map(|c| ContainerAllocateResponse {
                    envs: [("DEVS".to_string(), c.devices_ids.join(","))].into(),
                    mounts: vec![Mount {
                        container_path: "/dev-info".into(),
                        host_path: "/tmp/dev-info".into(),
                        read_only: true,
                    }],
                    ..Default::default()
                })
                .collect(),
        }))
    }

    async fn pre_start_container(
        &self,
        req: tonic::Request<PreStartContainerRequest>,
    ) -> Result<tonic::Response<PreStartContainerResponse>, tonic::Status> {
        self.pre_start
            .lock()
            .unwrap()
            .push(req.into_inner().devices_ids);
        Ok(tonic::Response::new(PreStartContainerResponse {}))
    }
}

#[tonic::async_trait]
impl PluginRegistration for Plugin {
    async fn get_info(
        &self,
        _: tonic::Request<InfoRequest>,
    ) -> Result<tonic::Response<PluginInfo>, tonic::Status> {
        Ok(tonic::Response::new(PluginInfo {
            r#type: "DevicePlugin".into(),
            name: RESOURCE.into(),
            endpoint: String::new(),
            supported_versions: vec!["v1beta1".into()],
        }))
    }

    async fn notify_registration_status(
        &self,
        req: tonic::Request<RegistrationStatus>,
    ) -> Result<tonic::Response<RegistrationStatusResponse>, tonic::Status> {
        self.notified.lock().unwrap().push(req.into_inner());
        Ok(tonic::Response::new(RegistrationStatusResponse {}))
    }
}

/// Serves the plugin until `stop`, then drops its connections at once
/// (grpc-go's `Server.Stop`, which the sample device plugin calls).
fn serve(plugin: Plugin, path: &Path, stop: CancellationToken) {
    let listener = UnixListener::bind(path).unwrap();
    let server = tokio::spawn(async move {
        let _ = tonic::transport::Server::builder()
            .add_service(DevicePluginServer::new(plugin.clone()))
            .add_service(PluginRegistrationServer::new(plugin))
            .serve_with_incoming(UnixListenerStream::new(listener))
            .await;
    });
    tokio::spawn(async move {
        stop.cancelled().await;
        server.abort();
    });
}

async fn eventually<F: Fn() -> bool>(what: &str, f: F) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(tokio::time::Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn pod(
    uid: &str,
) -> (
    k8s_openapi::api::core::v1::Pod,
    k8s_openapi::api::core::v1::Container,
) {
    let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "p", "namespace": "ns", "uid": uid},
        "spec": {"containers": [{"name": "c", "resources": {"limits": {RESOURCE: "1"}}}]}
    }))
    .unwrap();
    let c = pod.spec.as_ref().unwrap().containers[0].clone();
    (pod, c)
}

async fn allocate_and_start(m: &DeviceManager, plugin: &Plugin) {
    let (p, c) = pod("u1");
    let active = BTreeSet::from(["u1".to_string()]);
    m.allocate(&p, &c, false, false, Some(&active))
        .await
        .unwrap();
    let opts = m
        .run_container_options(&p, &c, false, false)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(opts.envs, vec![("DEVS".to_string(), "d0".to_string())]);
    assert_eq!(
        opts.mounts,
        vec![("/dev-info".to_string(), "/tmp/dev-info".to_string(), true)]
    );
    assert_eq!(
        plugin.pre_start.lock().unwrap().clone(),
        vec![vec!["d0".to_string()]]
    );
    // The only healthy device is taken: a second pod is refused.
    let (p2, c2) = pod("u2");
    let active = BTreeSet::from(["u1".to_string(), "u2".to_string()]);
    assert_eq!(
        m.allocate(&p2, &c2, false, false, Some(&active))
            .await
            .err()
            .map(|e| e.to_string())
            .as_deref(),
        Some(
            "requested number of devices unavailable for example.com/dev. Requested: 1, Available: 0"
        )
    );
    // Once u1 is no longer active its device is free again.
    let active = BTreeSet::from(["u2".to_string()]);
    m.allocate(&p2, &c2, false, false, Some(&active))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registers_through_kubelet_sock() {
    let dir = tempfile::tempdir().unwrap();
    let stop = CancellationToken::new();
    let _guard = stop.clone().drop_guard();
    let m = DeviceManager::new(dir.path().join("device-plugins"));
    m.read_checkpoint(BTreeSet::new());
    super::registration::start(&m, stop.clone()).unwrap();
    let plugin = Plugin::default();
    let sock = dir.path().join("device-plugins/p.sock");
    let plugin_stop = plugin.stop.clone();
    serve(plugin.clone(), &sock, plugin_stop.clone());
    let ch = unix_channel(
        dir.path().join("device-plugins/kubelet.sock"),
        Duration::from_secs(5),
    )
    .await
    .unwrap();
    let mut reg = RegistrationClient::new(ch);
    // A bad version and a bad name are refused with kubelet's messages.
    let bad = reg
        .register(RegisterRequest {
            version: "v1alpha".into(),
            endpoint: "p.sock".into(),
            resource_name: RESOURCE.into(),
            options: None,
        })
        .await
        .err()
        .map(|s| s.message().to_string());
    assert_eq!(
        bad.as_deref(),
        Some(
            "requested API version \"v1alpha\" is not supported by kubelet. Supported version is [\"v1beta1\"]"
        )
    );
    let bad = reg
        .register(RegisterRequest {
            version: "v1beta1".into(),
            endpoint: "p.sock".into(),
            resource_name: "cpu".into(),
            options: None,
        })
        .await
        .err()
        .map(|s| s.message().to_string());
    assert_eq!(bad.as_deref(), Some("the ResourceName \"cpu\" is invalid"));
    reg.register(RegisterRequest {
        version: "v1beta1".into(),
        endpoint: "p.sock".into(),
        resource_name: RESOURCE.into(),
        options: None,
    })
    .await
    .unwrap();
    eventually("devices listed", || {
        m.capacity().capacity.get(RESOURCE) == Some(&2)
    })
    .await;
    assert_eq!(m.capacity().allocatable.get(RESOURCE), Some(&1));
    allocate_and_start(&m, &plugin).await;
    // The connection ends (here as the plugin manager's deregistration
    // ends it; a plugin's stream ending is the system test's case): its
    // devices are unhealthy, capacity kept.
    m.disconnect(RESOURCE);
    eventually("plugin lost", || {
        m.capacity().allocatable.get(RESOURCE) == Some(&0)
    })
    .await;
    assert_eq!(m.capacity().capacity.get(RESOURCE), Some(&2));
    // The checkpoint has the allocation and the resource.
    let text = std::fs::read_to_string(
        dir.path()
            .join("device-plugins/kubelet_internal_checkpoint"),
    )
    .unwrap();
    assert!(text.contains("\"PodUID\":\"u2\""), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registers_through_plugins_registry() {
    let dir = tempfile::tempdir().unwrap();
    let stop = CancellationToken::new();
    let _guard = stop.clone().drop_guard();
    let m = DeviceManager::new(dir.path().join("device-plugins"));
    m.read_checkpoint(BTreeSet::new());
    let handler: Arc<dyn crate::plugins::PluginHandler> = Arc::new(
        super::plugin_handler::DevicePluginHandler::new(m.clone(), stop.clone()),
    );
    let mut handlers = crate::plugins::Handlers::new();
    handlers.insert("DevicePlugin".into(), handler);
    crate::plugins::start(dir.path(), handlers, stop.clone()).unwrap();
    let plugin = Plugin::default();
    let sock: PathBuf = dir.path().join("plugins_registry/dp.sock");
    let plugin_stop = plugin.stop.clone();
    serve(plugin.clone(), &sock, plugin_stop.clone());
    eventually("registered", || {
        m.capacity().capacity.get(RESOURCE) == Some(&2)
    })
    .await;
    eventually("notified", || !plugin.notified.lock().unwrap().is_empty()).await;
    let n = plugin.notified.lock().unwrap()[0].clone();
    assert!(n.plugin_registered, "{n:?}");
    allocate_and_start(&m, &plugin).await;
    // The socket goes away: the plugin is deregistered.
    plugin_stop.cancel();
    std::fs::remove_file(&sock).unwrap();
    eventually("deregistered", || {
        m.capacity().allocatable.get(RESOURCE) == Some(&0)
    })
    .await;
}
