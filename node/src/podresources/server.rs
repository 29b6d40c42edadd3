//! The `PodResourcesLister` service (`server_v1.go`).

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Container, Pod};
use keelson_cri::kubelet_api::podresources::pod_resources_lister_server::{
    PodResourcesLister, PodResourcesListerServer,
};
use keelson_cri::kubelet_api::podresources::{
    AllocatableResourcesRequest, AllocatableResourcesResponse, ContainerDevices,
    ContainerResources, GetPodResourcesRequest, GetPodResourcesResponse, ListPodResourcesRequest,
    ListPodResourcesResponse, NumaNode, PodResources, TopologyInfo,
};
use tokio::net::UnixListener;
use tokio_stream::wrappers::UnixListenerStream;
use tokio_util::sync::CancellationToken;

use super::rate::{BURST, Limiter, QPS};
use crate::devices::DeviceManager;
use crate::pod::podutil;
use crate::server::PodsSlot;

/// The directory under the root dir (`config.DefaultKubeletPodResourcesDirName`).
pub const DIR_NAME: &str = "pod-resources";
/// The socket's name (`podresources.Socket` + `.sock`).
pub const SOCKET_NAME: &str = "kubelet.sock";

struct Service {
    pods: PodsSlot,
    devices: DeviceManager,
    limiter: Limiter,
}

/// resource → device → NUMA nodes, as the API lists devices.
fn container_devices(
    devs: std::collections::BTreeMap<String, std::collections::BTreeMap<String, Vec<i64>>>,
) -> Vec<ContainerDevices> {
    let mut out = Vec::new();
    for (resource, ids) in devs {
        for (id, nodes) in ids {
            // containerDevicesFromResourceDeviceInstances: one entry per
            // device, or per device and NUMA node when it has topology.
            if nodes.is_empty() {
                out.push(ContainerDevices {
                    resource_name: resource.clone(),
                    device_ids: vec![id],
                    topology: None,
                });
                continue;
            }
            for node in nodes {
                out.push(ContainerDevices {
                    resource_name: resource.clone(),
                    device_ids: vec![id.clone()],
                    topology: Some(TopologyInfo {
                        nodes: vec![NumaNode { id: node }],
                    }),
                });
            }
        }
    }
    out
}

impl Service {
    fn check_rate(&self) -> Result<(), tonic::Status> {
        if self.limiter.allow() {
            Ok(())
        } else {
            Err(tonic::Status::resource_exhausted("rejected by rate limit"))
        }
    }

    fn container_resources(&self, pod: &Pod, c: &Container) -> ContainerResources {
        ContainerResources {
            name: c.name.clone(),
            devices: container_devices(self.devices.container_devices(podutil::uid(pod), &c.name)),
            cpu_ids: Vec::new(),
            memory: Vec::new(),
            dynamic_resources: Vec::new(),
        }
    }

    fn pod_resources(&self, pod: &Pod) -> PodResources {
        let spec = podutil::spec(pod);
        let mut containers = Vec::new();
        for c in spec.init_containers.iter().flatten() {
            if c.restart_policy.as_deref() == Some("Always") {
                containers.push(self.container_resources(pod, c));
            }
        }
        for c in &spec.containers {
            containers.push(self.container_resources(pod, c));
        }
        PodResources {
            name: pod.metadata.name.clone().unwrap_or_default(),
            namespace: pod.metadata.namespace.clone().unwrap_or_default(),
            containers,
        }
    }

    fn active_pods(&self) -> Vec<Arc<Pod>> {
        self.pods
            .get()
            .map(|p| p.pods_holding_resources())
            .unwrap_or_default()
    }
}

#[tonic::async_trait]
impl PodResourcesLister for Service {
    async fn list(
        &self,
        _req: tonic::Request<ListPodResourcesRequest>,
    ) -> Result<tonic::Response<ListPodResourcesResponse>, tonic::Status> {
        self.check_rate()?;
        let pods = self.active_pods();
        let active: BTreeSet<String> = pods.iter().map(|p| podutil::uid(p).to_string()).collect();
        self.devices.update_allocated_devices(&active);
        Ok(tonic::Response::new(ListPodResourcesResponse {
            pod_resources: pods.iter().map(|p| self.pod_resources(p)).collect(),
        }))
    }

    async fn get_allocatable_resources(
        &self,
        _req: tonic::Request<AllocatableResourcesRequest>,
    ) -> Result<tonic::Response<AllocatableResourcesResponse>, tonic::Status> {
        self.check_rate()?;
        Ok(tonic::Response::new(AllocatableResourcesResponse {
            devices: container_devices(self.devices.allocatable_devices()),
            cpu_ids: Vec::new(),
            memory: Vec::new(),
        }))
    }

    async fn get(
        &self,
        req: tonic::Request<GetPodResourcesRequest>,
    ) -> Result<tonic::Response<GetPodResourcesResponse>, tonic::Status> {
        self.check_rate()?;
        let r = req.into_inner();
        let pod = self
            .pods
            .get()
            .and_then(|p| p.pod_by_name(&r.pod_namespace, &r.pod_name));
        let Some(pod) = pod else {
            return Err(tonic::Status::unknown(format!(
                "pod {} in namespace {} not found",
                r.pod_name, r.pod_namespace
            )));
        };
        Ok(tonic::Response::new(GetPodResourcesResponse {
            pod_resources: Some(self.pod_resources(&pod)),
        }))
    }
}

/// Serves the API on `<root>/pod-resources/kubelet.sock` until `stop`.
pub fn start(
    root_dir: &Path,
    pods: PodsSlot,
    devices: DeviceManager,
    stop: CancellationToken,
) -> Result<(), std::io::Error> {
    let dir = root_dir.join(DIR_NAME);
    std::fs::create_dir_all(&dir)?;
    let path = dir.join(SOCKET_NAME);
    match std::fs::remove_file(&path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let listener = UnixListener::bind(&path)?;
    let service = Service {
        pods,
        devices,
        limiter: Limiter::new(QPS, BURST),
    };
    tracing::info!(socket = %path.display(), "pod resources API listening");
    tokio::spawn(async move {
        let served = tonic::transport::Server::builder()
            .add_service(PodResourcesListerServer::new(service))
            .serve_with_incoming_shutdown(UnixListenerStream::new(listener), stop.cancelled())
            .await;
        if let Err(e) = served {
            tracing::error!(error = %e, "pod resources API stopped");
        }
    });
    Ok(())
}
