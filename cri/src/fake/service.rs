//! The gRPC face of the fake runtime: RuntimeService and ImageService
//! handlers over the shared in-memory state.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use futures::Stream;
use k8s_cri::v1 as api;
use k8s_cri::v1::image_service_server::{ImageService, ImageServiceServer};
use k8s_cri::v1::runtime_service_server::{RuntimeService, RuntimeServiceServer};
use tokio_stream::StreamExt;
use tokio_stream::wrappers::BroadcastStream;
use tonic::service::Routes;
use tonic::{Request, Response, Status};

use super::state::State;
use super::{IpPool, Shared, lock};
use crate::client::{NETWORK_READY, RUNTIME_READY};
use crate::endpoint::MAX_MESSAGE_SIZE;

/// Both services over one shared state, ready to serve.
pub(crate) fn routes(shared: Arc<Shared>) -> Routes {
    let svc = FakeService(shared);
    Routes::new(
        RuntimeServiceServer::new(svc.clone())
            .max_decoding_message_size(MAX_MESSAGE_SIZE)
            .max_encoding_message_size(MAX_MESSAGE_SIZE),
    )
    .add_service(
        ImageServiceServer::new(svc)
            .max_decoding_message_size(MAX_MESSAGE_SIZE)
            .max_encoding_message_size(MAX_MESSAGE_SIZE),
    )
}

#[derive(Clone)]
struct FakeService(Arc<Shared>);

type Reply<T> = Result<Response<T>, Status>;

fn ok<T>(value: T) -> Reply<T> {
    Ok(Response::new(value))
}

fn unimplemented(method: &str) -> Status {
    Status::unimplemented(format!("fake CRI runtime does not implement {method}"))
}

impl FakeService {
    /// Logs the call, applies injected latency, returns an injected failure.
    async fn enter(&self, method: &'static str, subject: impl Into<String>) -> Result<(), Status> {
        let now = self.0.now();
        let (latency, failure) = lock(&self.0.faults).on_call(method, subject.into(), now);
        if !latency.is_zero() {
            tokio::time::sleep(latency).await;
        }
        match failure {
            Some(status) => Err(status),
            None => Ok(()),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        lock(&self.0.state)
    }

    fn image_ref(spec: &Option<api::ImageSpec>) -> String {
        spec.as_ref().map(|s| s.image.clone()).unwrap_or_default()
    }
}

type EventStream = Pin<Box<dyn Stream<Item = Result<api::ContainerEventResponse, Status>> + Send>>;

#[tonic::async_trait]
impl RuntimeService for FakeService {
    async fn version(&self, _: Request<api::VersionRequest>) -> Reply<api::VersionResponse> {
        self.enter("Version", "").await?;
        ok(api::VersionResponse {
            version: "0.1.0".to_string(),
            runtime_name: self.0.config.runtime_name.clone(),
            runtime_version: self.0.config.runtime_version.clone(),
            runtime_api_version: "v1".to_string(),
        })
    }

    async fn run_pod_sandbox(
        &self,
        request: Request<api::RunPodSandboxRequest>,
    ) -> Reply<api::RunPodSandboxResponse> {
        let req = request.into_inner();
        let name = req
            .config
            .as_ref()
            .and_then(|c| c.metadata.as_ref())
            .map(|m| format!("{}/{}", m.namespace, m.name))
            .unwrap_or_default();
        self.enter("RunPodSandbox", name).await?;
        let now = self.0.now();
        let (id, events) = self
            .state()
            .run_pod_sandbox(req.config, req.runtime_handler, now)?;
        self.0.publish(events);
        ok(api::RunPodSandboxResponse { pod_sandbox_id: id })
    }

    async fn stop_pod_sandbox(
        &self,
        request: Request<api::StopPodSandboxRequest>,
    ) -> Reply<api::StopPodSandboxResponse> {
        let id = request.into_inner().pod_sandbox_id;
        self.enter("StopPodSandbox", id.clone()).await?;
        let now = self.0.now();
        let events = self.state().stop_pod_sandbox(&id, now)?;
        self.0.publish(events);
        ok(api::StopPodSandboxResponse {})
    }

    async fn remove_pod_sandbox(
        &self,
        request: Request<api::RemovePodSandboxRequest>,
    ) -> Reply<api::RemovePodSandboxResponse> {
        let id = request.into_inner().pod_sandbox_id;
        self.enter("RemovePodSandbox", id.clone()).await?;
        let now = self.0.now();
        let events = self.state().remove_pod_sandbox(&id, now)?;
        self.0.publish(events);
        ok(api::RemovePodSandboxResponse {})
    }

    async fn pod_sandbox_status(
        &self,
        request: Request<api::PodSandboxStatusRequest>,
    ) -> Reply<api::PodSandboxStatusResponse> {
        let req = request.into_inner();
        self.enter("PodSandboxStatus", req.pod_sandbox_id.clone())
            .await?;
        let state = self.state();
        let id = state.sandbox_id(&req.pod_sandbox_id)?;
        let status = state.sandboxes.get(&id).map(|sb| state.sandbox_status(sb));
        let mut info = std::collections::HashMap::new();
        if req.verbose {
            info.insert(
                "info".to_string(),
                format!("{{\"pid\":0,\"sandboxID\":\"{id}\"}}"),
            );
        }
        ok(api::PodSandboxStatusResponse {
            status,
            info,
            containers_statuses: Vec::new(),
            timestamp: 0,
        })
    }

    async fn list_pod_sandbox(
        &self,
        request: Request<api::ListPodSandboxRequest>,
    ) -> Reply<api::ListPodSandboxResponse> {
        self.enter("ListPodSandbox", "").await?;
        let items = self.state().list_pod_sandbox(request.into_inner().filter);
        ok(api::ListPodSandboxResponse { items })
    }

    async fn create_container(
        &self,
        request: Request<api::CreateContainerRequest>,
    ) -> Reply<api::CreateContainerResponse> {
        let req = request.into_inner();
        let name = req
            .config
            .as_ref()
            .and_then(|c| c.metadata.as_ref())
            .map(|m| m.name.clone())
            .unwrap_or_default();
        self.enter("CreateContainer", name).await?;
        let now = self.0.now();
        let (id, events) = self
            .state()
            .create_container(&req.pod_sandbox_id, req.config, now)?;
        self.0.publish(events);
        ok(api::CreateContainerResponse { container_id: id })
    }

    async fn start_container(
        &self,
        request: Request<api::StartContainerRequest>,
    ) -> Reply<api::StartContainerResponse> {
        let id = request.into_inner().container_id;
        self.enter("StartContainer", id.clone()).await?;
        let now = self.0.now();
        let (id, events) = self.state().start_container(&id, now)?;
        self.0.publish(events);
        self.0.schedule_exit(&id);
        ok(api::StartContainerResponse {})
    }

    async fn stop_container(
        &self,
        request: Request<api::StopContainerRequest>,
    ) -> Reply<api::StopContainerResponse> {
        let req = request.into_inner();
        self.enter("StopContainer", req.container_id.clone())
            .await?;
        let now = self.0.now();
        let events = self
            .state()
            .stop_container(&req.container_id, req.timeout, now)?;
        self.0.publish(events);
        ok(api::StopContainerResponse {})
    }

    async fn remove_container(
        &self,
        request: Request<api::RemoveContainerRequest>,
    ) -> Reply<api::RemoveContainerResponse> {
        let id = request.into_inner().container_id;
        self.enter("RemoveContainer", id.clone()).await?;
        let now = self.0.now();
        let events = self.state().remove_container(&id, now)?;
        self.0.publish(events);
        ok(api::RemoveContainerResponse {})
    }

    async fn list_containers(
        &self,
        request: Request<api::ListContainersRequest>,
    ) -> Reply<api::ListContainersResponse> {
        self.enter("ListContainers", "").await?;
        let containers = self.state().list_containers(request.into_inner().filter);
        ok(api::ListContainersResponse { containers })
    }

    async fn container_status(
        &self,
        request: Request<api::ContainerStatusRequest>,
    ) -> Reply<api::ContainerStatusResponse> {
        let req = request.into_inner();
        self.enter("ContainerStatus", req.container_id.clone())
            .await?;
        let state = self.state();
        let id = state.container_id(&req.container_id)?;
        let status = state.containers.get(&id).map(|c| state.container_status(c));
        ok(api::ContainerStatusResponse {
            status,
            info: Default::default(),
        })
    }

    async fn update_container_resources(
        &self,
        request: Request<api::UpdateContainerResourcesRequest>,
    ) -> Reply<api::UpdateContainerResourcesResponse> {
        let req = request.into_inner();
        self.enter("UpdateContainerResources", req.container_id.clone())
            .await?;
        let mut state = self.state();
        let id = state.container_id(&req.container_id)?;
        if let (Some(c), Some(linux)) = (state.containers.get_mut(&id), req.linux) {
            c.config
                .linux
                .get_or_insert_with(Default::default)
                .resources = Some(linux);
        }
        ok(api::UpdateContainerResourcesResponse {})
    }

    async fn reopen_container_log(
        &self,
        request: Request<api::ReopenContainerLogRequest>,
    ) -> Reply<api::ReopenContainerLogResponse> {
        let id = request.into_inner().container_id;
        self.enter("ReopenContainerLog", id.clone()).await?;
        let state = self.state();
        let id = state.container_id(&id)?;
        let Some(c) = state
            .containers
            .get(&id)
            .filter(|c| c.state == api::ContainerState::ContainerRunning)
        else {
            return Err(Status::unknown("container is not running"));
        };
        // containerd closes the log and opens the path again, creating it
        // (after a rotation renamed it away).
        if !c.log_path.is_empty() {
            let path = std::path::Path::new(&c.log_path);
            if path.parent().is_some_and(|d| d.is_dir()) {
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)
                    .map_err(|e| {
                        Status::unknown(format!("failed to create and open log file: {e}"))
                    })?;
            }
        }
        ok(api::ReopenContainerLogResponse {})
    }

    async fn exec_sync(
        &self,
        request: Request<api::ExecSyncRequest>,
    ) -> Reply<api::ExecSyncResponse> {
        let req = request.into_inner();
        self.enter("ExecSync", req.container_id.clone()).await?;
        let (_, name) = self.state().exec_check(&req.container_id)?;
        let script = State::exec_lookup(&lock(&self.0.execs), &name, &req.cmd).cloned();
        let Some(script) = script else {
            // As runc answers for a binary that is not in the image.
            let first = req.cmd.first().cloned().unwrap_or_default();
            return Err(Status::unknown(format!(
                "failed to exec in container: failed to start exec: OCI runtime exec failed: exec failed: unable to start container process: exec: {first:?}: executable file not found in $PATH: unknown"
            )));
        };
        let limit = u64::try_from(req.timeout)
            .ok()
            .filter(|t| *t > 0)
            .map(Duration::from_secs);
        match limit {
            Some(limit) if script.duration > limit => {
                tokio::time::sleep(limit).await;
                Err(Status::deadline_exceeded(format!(
                    "failed to exec in container: timeout {}s exceeded: context deadline exceeded",
                    limit.as_secs()
                )))
            }
            _ => {
                if !script.duration.is_zero() {
                    tokio::time::sleep(script.duration).await;
                }
                ok(api::ExecSyncResponse {
                    stdout: script.stdout,
                    stderr: script.stderr,
                    exit_code: script.exit_code,
                })
            }
        }
    }

    async fn exec(&self, _: Request<api::ExecRequest>) -> Reply<api::ExecResponse> {
        self.enter("Exec", "").await?;
        Err(unimplemented("Exec"))
    }

    async fn attach(&self, _: Request<api::AttachRequest>) -> Reply<api::AttachResponse> {
        self.enter("Attach", "").await?;
        Err(unimplemented("Attach"))
    }

    async fn port_forward(
        &self,
        _: Request<api::PortForwardRequest>,
    ) -> Reply<api::PortForwardResponse> {
        self.enter("PortForward", "").await?;
        Err(unimplemented("PortForward"))
    }

    async fn container_stats(
        &self,
        request: Request<api::ContainerStatsRequest>,
    ) -> Reply<api::ContainerStatsResponse> {
        let id = request.into_inner().container_id;
        self.enter("ContainerStats", id.clone()).await?;
        let now = self.0.now();
        let stats = self.state().container_stats(&id, now)?;
        ok(api::ContainerStatsResponse { stats: Some(stats) })
    }

    async fn list_container_stats(
        &self,
        request: Request<api::ListContainerStatsRequest>,
    ) -> Reply<api::ListContainerStatsResponse> {
        self.enter("ListContainerStats", "").await?;
        let now = self.0.now();
        let stats = self
            .state()
            .list_container_stats(request.into_inner().filter, now);
        ok(api::ListContainerStatsResponse { stats })
    }

    async fn pod_sandbox_stats(
        &self,
        request: Request<api::PodSandboxStatsRequest>,
    ) -> Reply<api::PodSandboxStatsResponse> {
        let id = request.into_inner().pod_sandbox_id;
        self.enter("PodSandboxStats", id.clone()).await?;
        let now = self.0.now();
        let stats = self.state().pod_sandbox_stats(&id, now)?;
        ok(api::PodSandboxStatsResponse { stats: Some(stats) })
    }

    async fn list_pod_sandbox_stats(
        &self,
        request: Request<api::ListPodSandboxStatsRequest>,
    ) -> Reply<api::ListPodSandboxStatsResponse> {
        self.enter("ListPodSandboxStats", "").await?;
        let now = self.0.now();
        let stats = self
            .state()
            .list_pod_sandbox_stats(request.into_inner().filter, now);
        ok(api::ListPodSandboxStatsResponse { stats })
    }

    async fn update_runtime_config(
        &self,
        request: Request<api::UpdateRuntimeConfigRequest>,
    ) -> Reply<api::UpdateRuntimeConfigResponse> {
        let cidr = request
            .into_inner()
            .runtime_config
            .and_then(|c| c.network_config)
            .map(|n| n.pod_cidr)
            .unwrap_or_default();
        self.enter("UpdateRuntimeConfig", cidr.clone()).await?;
        if !cidr.is_empty() {
            let mut state = self.state();
            if state.pool.cidr() != cidr {
                state.pool =
                    IpPool::new(&cidr).map_err(|e| Status::invalid_argument(e.to_string()))?;
            }
        }
        ok(api::UpdateRuntimeConfigResponse {})
    }

    async fn status(&self, req: Request<api::StatusRequest>) -> Reply<api::StatusResponse> {
        self.enter("Status", "").await?;
        let mut info = std::collections::HashMap::new();
        if req.get_ref().verbose && !self.0.config.status_config.is_empty() {
            info.insert("config".to_string(), self.0.config.status_config.clone());
        }
        let state = self.state();
        let cond = |kind: &str, c: &super::state::Condition| api::RuntimeCondition {
            r#type: kind.to_string(),
            status: c.ready,
            reason: c.reason.clone(),
            message: c.message.clone(),
        };
        ok(api::StatusResponse {
            status: Some(api::RuntimeStatus {
                conditions: vec![
                    cond(RUNTIME_READY, &state.runtime_ready),
                    cond(NETWORK_READY, &state.network_ready),
                ],
            }),
            info,
            // containerd 1.6 reports neither handlers nor features.
            runtime_handlers: Vec::new(),
            features: None,
        })
    }

    async fn checkpoint_container(
        &self,
        _: Request<api::CheckpointContainerRequest>,
    ) -> Reply<api::CheckpointContainerResponse> {
        self.enter("CheckpointContainer", "").await?;
        Err(unimplemented("CheckpointContainer"))
    }

    type GetContainerEventsStream = EventStream;

    async fn get_container_events(
        &self,
        _: Request<api::GetEventsRequest>,
    ) -> Reply<Self::GetContainerEventsStream> {
        self.enter("GetContainerEvents", "").await?;
        if !self.0.events_supported.load(Ordering::SeqCst) {
            return Err(Status::unimplemented(
                "unknown method GetContainerEvents for service runtime.v1.RuntimeService",
            ));
        }
        let stream = BroadcastStream::new(self.0.events.subscribe()).map(|item| {
            item.map_err(|lagged| {
                Status::resource_exhausted(format!("event consumer too slow: {lagged}"))
            })
        });
        Ok(Response::new(Box::pin(stream)))
    }

    async fn list_metric_descriptors(
        &self,
        _: Request<api::ListMetricDescriptorsRequest>,
    ) -> Reply<api::ListMetricDescriptorsResponse> {
        self.enter("ListMetricDescriptors", "").await?;
        Err(unimplemented("ListMetricDescriptors"))
    }

    async fn list_pod_sandbox_metrics(
        &self,
        _: Request<api::ListPodSandboxMetricsRequest>,
    ) -> Reply<api::ListPodSandboxMetricsResponse> {
        self.enter("ListPodSandboxMetrics", "").await?;
        Err(unimplemented("ListPodSandboxMetrics"))
    }

    async fn runtime_config(
        &self,
        _: Request<api::RuntimeConfigRequest>,
    ) -> Reply<api::RuntimeConfigResponse> {
        self.enter("RuntimeConfig", "").await?;
        match self.0.config.cgroup_driver {
            Some(d) => ok(api::RuntimeConfigResponse {
                linux: Some(api::LinuxRuntimeConfiguration {
                    cgroup_driver: d as i32,
                }),
            }),
            None => Err(unimplemented("RuntimeConfig")),
        }
    }
}

#[tonic::async_trait]
impl ImageService for FakeService {
    async fn list_images(
        &self,
        _: Request<api::ListImagesRequest>,
    ) -> Reply<api::ListImagesResponse> {
        self.enter("ListImages", "").await?;
        // containerd 1.6 ignores the filter; so does the fake.
        let images = self.state().images.iter().map(|i| i.to_api()).collect();
        ok(api::ListImagesResponse { images })
    }

    async fn image_status(
        &self,
        request: Request<api::ImageStatusRequest>,
    ) -> Reply<api::ImageStatusResponse> {
        let reference = Self::image_ref(&request.into_inner().image);
        self.enter("ImageStatus", reference.clone()).await?;
        let image = self.state().resolve_image(&reference).map(|i| i.to_api());
        ok(api::ImageStatusResponse {
            image,
            info: Default::default(),
        })
    }

    async fn pull_image(
        &self,
        request: Request<api::PullImageRequest>,
    ) -> Reply<api::PullImageResponse> {
        let req = request.into_inner();
        let reference = Self::image_ref(&req.image);
        self.enter("PullImage", reference.clone()).await?;
        let image_ref = self.state().pull_image(&reference, req.auth.as_ref())?;
        ok(api::PullImageResponse { image_ref })
    }

    async fn remove_image(
        &self,
        request: Request<api::RemoveImageRequest>,
    ) -> Reply<api::RemoveImageResponse> {
        let reference = Self::image_ref(&request.into_inner().image);
        self.enter("RemoveImage", reference.clone()).await?;
        self.state().remove_image(&reference);
        ok(api::RemoveImageResponse {})
    }

    async fn image_fs_info(
        &self,
        _: Request<api::ImageFsInfoRequest>,
    ) -> Reply<api::ImageFsInfoResponse> {
        self.enter("ImageFsInfo", "").await?;
        let state = self.state();
        let used: u64 = state.images.iter().map(|i| i.size).sum();
        ok(api::ImageFsInfoResponse {
            image_filesystems: vec![api::FilesystemUsage {
                timestamp: self.0.now(),
                fs_id: Some(api::FilesystemIdentifier {
                    mountpoint: state.image_fs_mountpoint.clone(),
                }),
                used_bytes: Some(api::UInt64Value { value: used }),
                inodes_used: Some(api::UInt64Value {
                    value: state.images.len() as u64,
                }),
            }],
            container_filesystems: Vec::new(),
        })
    }
}
