//! [`RuntimeClient`]: typed, deadline-bound calls to a CRI runtime.v1
//! runtime (RuntimeService + ImageService) over a unix socket.

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use k8s_cri::v1 as api;
use k8s_cri::v1::image_service_client::ImageServiceClient;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use tonic::transport::Channel;

use crate::endpoint::{MAX_MESSAGE_SIZE, lazy_channel, socket_path};
use crate::error::CriError;
use crate::events::ContainerEventStream;

/// kubelet's default `runtimeRequestTimeout`.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(120);

/// Default deadline of a PullImage call. kubelet sets none (a pull lasts as
/// long as it lasts); keelson bounds it so a wedged runtime cannot hold a pod
/// worker forever, and keeps it long enough for big images on slow links.
pub const DEFAULT_PULL_IMAGE_TIMEOUT: Duration = Duration::from_secs(30 * 60);

/// The CRI API version kubelet sends in VersionRequest.
pub const KUBE_RUNTIME_API_VERSION: &str = "0.1.0";

/// Condition type in [`api::RuntimeStatus`]: the runtime is up.
pub const RUNTIME_READY: &str = "RuntimeReady";
/// Condition type in [`api::RuntimeStatus`]: the pod network is ready.
pub const NETWORK_READY: &str = "NetworkReady";

/// Deadlines and dialing of a [`RuntimeClient`].
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// Deadline of every call (kubelet's `runtimeRequestTimeout`, 2m). ExecSync
    /// and StopContainer get their own timeout added on top, as in kubelet.
    pub request_timeout: Duration,
    /// Deadline of PullImage.
    pub pull_image_timeout: Duration,
    /// How long dialing the socket may take.
    pub connect_timeout: Duration,
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            pull_image_timeout: DEFAULT_PULL_IMAGE_TIMEOUT,
            connect_timeout: Duration::from_secs(10),
        }
    }
}

impl ClientConfig {
    /// The defaults with `request_timeout` set (connect timeout is capped by it).
    pub fn with_request_timeout(request_timeout: Duration) -> Self {
        let default = ClientConfig::default();
        ClientConfig {
            request_timeout,
            connect_timeout: default.connect_timeout.min(request_timeout),
            ..default
        }
    }
}

/// What ExecSync returned: the command's output and exit code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecSyncResult {
    /// Captured standard output.
    pub stdout: Vec<u8>,
    /// Captured standard error.
    pub stderr: Vec<u8>,
    /// The command's exit code (0 = success).
    pub exit_code: i32,
}

/// A CRI client for one runtime endpoint. Cloning is cheap (the clones share
/// one HTTP/2 connection) and every clone may be used concurrently.
///
/// Every call carries a deadline (see [`ClientConfig`]), both as the gRPC
/// `grpc-timeout` header (so the runtime can give up too) and as a local
/// timer (so a runtime that stops answering cannot hang the caller). When the
/// runtime restarts, calls made while it is down fail with
/// [`CriError::Unavailable`] and the next call dials again.
///
/// ```no_run
/// # async fn demo() -> Result<(), keelson_cri::CriError> {
/// use std::time::Duration;
/// let cri = keelson_cri::RuntimeClient::connect(
///     "unix:///run/containerd/containerd.sock",
///     Duration::from_secs(120),
/// )
/// .await?;
/// let version = cri.version().await?;
/// println!("{} {}", version.runtime_name, version.runtime_version);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct RuntimeClient {
    runtime: RuntimeServiceClient<Channel>,
    image: ImageServiceClient<Channel>,
    config: Arc<ClientConfig>,
    socket: Arc<PathBuf>,
}

impl RuntimeClient {
    /// Connects to `endpoint` (`unix:///path`) and checks that the runtime
    /// answers (a Version call). Fails with [`CriError::Unavailable`] when
    /// nothing listens there.
    pub async fn connect(endpoint: &str, request_timeout: Duration) -> Result<Self, CriError> {
        Self::connect_with(
            endpoint,
            ClientConfig::with_request_timeout(request_timeout),
        )
        .await
    }

    /// [`RuntimeClient::connect`] with every deadline given.
    pub async fn connect_with(endpoint: &str, config: ClientConfig) -> Result<Self, CriError> {
        let client = Self::new_lazy(endpoint, config)?;
        client.version().await?;
        Ok(client)
    }

    /// A client that dials only on its first call; for a runtime that may not
    /// be up yet. Fails only on a malformed endpoint.
    pub fn new_lazy(endpoint: &str, config: ClientConfig) -> Result<Self, CriError> {
        let path = socket_path(endpoint)?;
        let channel = lazy_channel(path.clone(), config.connect_timeout);
        let runtime = RuntimeServiceClient::new(channel.clone())
            .max_decoding_message_size(MAX_MESSAGE_SIZE)
            .max_encoding_message_size(MAX_MESSAGE_SIZE);
        let image = ImageServiceClient::new(channel)
            .max_decoding_message_size(MAX_MESSAGE_SIZE)
            .max_encoding_message_size(MAX_MESSAGE_SIZE);
        Ok(RuntimeClient {
            runtime,
            image,
            config: Arc::new(config),
            socket: Arc::new(path),
        })
    }

    /// The socket this client dials.
    pub fn socket_path(&self) -> &std::path::Path {
        &self.socket
    }

    /// The deadlines in force.
    pub fn config(&self) -> &ClientConfig {
        &self.config
    }

    /// Runs one unary call under `deadline`, mapping its status.
    async fn unary<T, Fut>(
        &self,
        method: &'static str,
        deadline: Duration,
        call: Fut,
    ) -> Result<T, CriError>
    where
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let started = tokio::time::Instant::now();
        let result = match tokio::time::timeout(deadline, call).await {
            Ok(Ok(response)) => Ok(response.into_inner()),
            Ok(Err(status)) => Err(CriError::from_status(method, &status)),
            Err(_) => Err(CriError::deadline(method, deadline)),
        };
        match &result {
            Ok(_) => tracing::trace!(method, elapsed = ?started.elapsed(), "CRI call done"),
            Err(error) => {
                tracing::debug!(method, elapsed = ?started.elapsed(), %error, "CRI call failed")
            }
        }
        result
    }

    fn request<T>(message: T, deadline: Duration) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        request.set_timeout(deadline);
        request
    }

    fn timeout(&self) -> Duration {
        self.config.request_timeout
    }

    // ---- RuntimeService: runtime ----

    /// Version: runtime name, version and CRI API version.
    pub async fn version(&self) -> Result<api::VersionResponse, CriError> {
        let t = self.timeout();
        let mut c = self.runtime.clone();
        let req = api::VersionRequest {
            version: KUBE_RUNTIME_API_VERSION.to_string(),
        };
        self.unary("Version", t, c.version(Self::request(req, t)))
            .await
    }

    /// Status: the runtime's conditions ([`RUNTIME_READY`], [`NETWORK_READY`]).
    /// A reply without a status is an error, as in kubelet.
    pub async fn status(&self) -> Result<api::RuntimeStatus, CriError> {
        self.status_verbose(false)
            .await?
            .status
            .ok_or(CriError::MissingField {
                method: "Status",
                field: "status",
            })
    }

    /// Status with `verbose` info (runtime-specific JSON in `info`) and the
    /// runtime handlers it offers.
    pub async fn status_verbose(&self, verbose: bool) -> Result<api::StatusResponse, CriError> {
        let t = self.timeout();
        let mut c = self.runtime.clone();
        let req = api::StatusRequest { verbose };
        self.unary("Status", t, c.status(Self::request(req, t)))
            .await
    }

    /// RuntimeConfig: the runtime's Linux configuration (its cgroup driver).
    /// containerd < 2.0 answers [`CriError::Unimplemented`].
    pub async fn runtime_config(&self) -> Result<api::RuntimeConfigResponse, CriError> {
        let t = self.timeout();
        let mut c = self.runtime.clone();
        self.unary(
            "RuntimeConfig",
            t,
            c.runtime_config(Self::request(api::RuntimeConfigRequest {}, t)),
        )
        .await
    }

    /// UpdateRuntimeConfig: hands the node's pod CIDR to the runtime.
    pub async fn update_runtime_config(&self, pod_cidr: &str) -> Result<(), CriError> {
        let t = self.timeout();
        let mut c = self.runtime.clone();
        let req = api::UpdateRuntimeConfigRequest {
            runtime_config: Some(api::RuntimeConfig {
                network_config: Some(api::NetworkConfig {
                    pod_cidr: pod_cidr.to_string(),
                }),
            }),
        };
        self.unary(
            "UpdateRuntimeConfig",
            t,
            c.update_runtime_config(Self::request(req, t)),
        )
        .await
        .map(drop)
    }

    // ---- RuntimeService: sandboxes ----

    /// RunPodSandbox: creates and starts a sandbox; returns its id.
    pub async fn run_pod_sandbox(
        &self,
        config: api::PodSandboxConfig,
        runtime_handler: &str,
    ) -> Result<String, CriError> {
        let t = self.timeout();
        let mut c = self.runtime.clone();
        let req = api::RunPodSandboxRequest {
            config: Some(config),
            runtime_handler: runtime_handler.to_string(),
        };
        let resp = self
            .unary("RunPodSandbox", t, c.run_pod_sandbox(Self::request(req, t)))
            .await?;
        non_empty("RunPodSandbox", "pod_sandbox_id", resp.pod_sandbox_id)
    }

    /// StopPodSandbox: stops every container of the sandbox and tears its
    /// network down.
    pub async fn stop_pod_sandbox(&self, pod_sandbox_id: &str) -> Result<(), CriError> {
        let t = self.timeout();
        let mut c = self.runtime.clone();
        let req = api::StopPodSandboxRequest {
            pod_sandbox_id: pod_sandbox_id.to_string(),
        };
        self.unary(
            "StopPodSandbox",
            t,
            c.stop_pod_sandbox(Self::request(req, t)),
        )
        .await
        .map(drop)
    }

    /// RemovePodSandbox: removes the sandbox and its containers.
    pub async fn remove_pod_sandbox(&self, pod_sandbox_id: &str) -> Result<(), CriError> {
        let t = self.timeout();
        let mut c = self.runtime.clone();
        let req = api::RemovePodSandboxRequest {
            pod_sandbox_id: pod_sandbox_id.to_string(),
        };
        self.unary(
            "RemovePodSandbox",
            t,
            c.remove_pod_sandbox(Self::request(req, t)),
        )
        .await
        .map(drop)
    }

    /// PodSandboxStatus. The reply must carry a status.
    pub async fn pod_sandbox_status(
        &self,
        pod_sandbox_id: &str,
        verbose: bool,
    ) -> Result<api::PodSandboxStatusResponse, CriError> {
        let t = self.timeout();
        let mut c = self.runtime.clone();
        let req = api::PodSandboxStatusRequest {
            pod_sandbox_id: pod_sandbox_id.to_string(),
            verbose,
        };
        let resp = self
            .unary(
                "PodSandboxStatus",
                t,
                c.pod_sandbox_status(Self::request(req, t)),
            )
            .await?;
        if resp.status.is_none() {
            return Err(CriError::MissingField {
                method: "PodSandboxStatus",
                field: "status",
            });
        }
        Ok(resp)
    }

    /// ListPodSandbox, optionally filtered (id, state, labels: ANDed).
    pub async fn list_pod_sandbox(
        &self,
        filter: Option<api::PodSandboxFilter>,
    ) -> Result<Vec<api::PodSandbox>, CriError> {
        let t = self.timeout();
        let mut c = self.runtime.clone();
        let req = api::ListPodSandboxRequest { filter };
        self.unary(
            "ListPodSandbox",
            t,
            c.list_pod_sandbox(Self::request(req, t)),
        )
        .await
        .map(|r| r.items)
    }

    // ---- RuntimeService: containers ----

    /// CreateContainer in a sandbox; returns the container id.
    pub async fn create_container(
        &self,
        pod_sandbox_id: &str,
        config: api::ContainerConfig,
        sandbox_config: api::PodSandboxConfig,
    ) -> Result<String, CriError> {
        let t = self.timeout();
        let mut c = self.runtime.clone();
        let req = api::CreateContainerRequest {
            pod_sandbox_id: pod_sandbox_id.to_string(),
            config: Some(config),
            sandbox_config: Some(sandbox_config),
        };
        let resp = self
            .unary(
                "CreateContainer",
                t,
                c.create_container(Self::request(req, t)),
            )
            .await?;
        non_empty("CreateContainer", "container_id", resp.container_id)
    }

    /// StartContainer.
    pub async fn start_container(&self, container_id: &str) -> Result<(), CriError> {
        let t = self.timeout();
        let mut c = self.runtime.clone();
        let req = api::StartContainerRequest {
            container_id: container_id.to_string(),
        };
        self.unary(
            "StartContainer",
            t,
            c.start_container(Self::request(req, t)),
        )
        .await
        .map(drop)
    }

    /// StopContainer with a grace period: the runtime sends the stop signal,
    /// waits up to `grace` and then kills. The call's deadline is the request
    /// timeout plus the grace period, as in kubelet.
    pub async fn stop_container(
        &self,
        container_id: &str,
        grace: Duration,
    ) -> Result<(), CriError> {
        let t = self.timeout() + grace;
        let mut c = self.runtime.clone();
        let req = api::StopContainerRequest {
            container_id: container_id.to_string(),
            timeout: i64::try_from(grace.as_secs()).unwrap_or(i64::MAX),
        };
        self.unary("StopContainer", t, c.stop_container(Self::request(req, t)))
            .await
            .map(drop)
    }

    /// RemoveContainer (a running container is killed first).
    pub async fn remove_container(&self, container_id: &str) -> Result<(), CriError> {
        let t = self.timeout();
        let mut c = self.runtime.clone();
        let req = api::RemoveContainerRequest {
            container_id: container_id.to_string(),
        };
        self.unary(
            "RemoveContainer",
            t,
            c.remove_container(Self::request(req, t)),
        )
        .await
        .map(drop)
    }

    /// ContainerStatus. The reply must carry a status.
    pub async fn container_status(
        &self,
        container_id: &str,
        verbose: bool,
    ) -> Result<api::ContainerStatusResponse, CriError> {
        let t = self.timeout();
        let mut c = self.runtime.clone();
        let req = api::ContainerStatusRequest {
            container_id: container_id.to_string(),
            verbose,
        };
        let resp = self
            .unary(
                "ContainerStatus",
                t,
                c.container_status(Self::request(req, t)),
            )
            .await?;
        if resp.status.is_none() {
            return Err(CriError::MissingField {
                method: "ContainerStatus",
                field: "status",
            });
        }
        Ok(resp)
    }

    /// ListContainers, optionally filtered (id, state, sandbox, labels: ANDed).
    pub async fn list_containers(
        &self,
        filter: Option<api::ContainerFilter>,
    ) -> Result<Vec<api::Container>, CriError> {
        let t = self.timeout();
        let mut c = self.runtime.clone();
        let req = api::ListContainersRequest { filter };
        self.unary(
            "ListContainers",
            t,
            c.list_containers(Self::request(req, t)),
        )
        .await
        .map(|r| r.containers)
    }

    /// UpdateContainerResources (CPU/memory limits of a running container).
    pub async fn update_container_resources(
        &self,
        container_id: &str,
        linux: Option<api::LinuxContainerResources>,
    ) -> Result<(), CriError> {
        let t = self.timeout();
        let mut c = self.runtime.clone();
        let req = api::UpdateContainerResourcesRequest {
            container_id: container_id.to_string(),
            linux,
            ..Default::default()
        };
        self.unary(
            "UpdateContainerResources",
            t,
            c.update_container_resources(Self::request(req, t)),
        )
        .await
        .map(drop)
    }

    /// ReopenContainerLog: the runtime reopens the container's log file
    /// (after kubelet-style log rotation renamed it).
    pub async fn reopen_container_log(&self, container_id: &str) -> Result<(), CriError> {
        let t = self.timeout();
        let mut c = self.runtime.clone();
        let req = api::ReopenContainerLogRequest {
            container_id: container_id.to_string(),
        };
        self.unary(
            "ReopenContainerLog",
            t,
            c.reopen_container_log(Self::request(req, t)),
        )
        .await
        .map(drop)
    }

    /// ExecSync: runs `cmd` in the container and waits for it. `timeout` is
    /// the command's own limit (zero = none); the call's deadline is the
    /// request timeout plus `timeout`, as in kubelet. A command that outlives
    /// its timeout fails with [`CriError::DeadlineExceeded`] (the probe
    /// timeout case).
    pub async fn exec_sync(
        &self,
        container_id: &str,
        cmd: Vec<String>,
        timeout: Duration,
    ) -> Result<ExecSyncResult, CriError> {
        let t = self.timeout() + timeout;
        let mut c = self.runtime.clone();
        // CRI carries whole seconds; round a sub-second timeout up so it is
        // not taken as "no timeout".
        let secs = timeout.as_secs() + u64::from(timeout.subsec_nanos() > 0);
        let req = api::ExecSyncRequest {
            container_id: container_id.to_string(),
            cmd,
            timeout: i64::try_from(secs).unwrap_or(i64::MAX),
        };
        let resp = self
            .unary("ExecSync", t, c.exec_sync(Self::request(req, t)))
            .await?;
        Ok(ExecSyncResult {
            stdout: resp.stdout,
            stderr: resp.stderr,
            exit_code: resp.exit_code,
        })
    }

    /// CheckpointContainer: the runtime writes a checkpoint of the
    /// container to `location`; `timeout` in seconds (0: the runtime's
    /// default), added to the call's deadline as kubelet does.
    pub async fn checkpoint_container(
        &self,
        container_id: &str,
        location: &str,
        timeout: i64,
    ) -> Result<(), CriError> {
        let t = self.timeout() + Duration::from_secs(u64::try_from(timeout).unwrap_or(0));
        let mut c = self.runtime.clone();
        let req = api::CheckpointContainerRequest {
            container_id: container_id.to_string(),
            location: location.to_string(),
            timeout,
        };
        self.unary(
            "CheckpointContainer",
            t,
            c.checkpoint_container(Self::request(req, t)),
        )
        .await?;
        Ok(())
    }

    /// Exec: asks the runtime's streaming server for a URL serving the
    /// command's streams (kubelet's `GetExec`); the caller proxies the
    /// client's upgraded connection to it.
    pub async fn exec(&self, req: api::ExecRequest) -> Result<String, CriError> {
        let t = self.timeout();
        let mut c = self.runtime.clone();
        let resp = self.unary("Exec", t, c.exec(Self::request(req, t))).await?;
        Ok(resp.url)
    }

    /// Attach: the URL serving a running container's streams.
    pub async fn attach(&self, req: api::AttachRequest) -> Result<String, CriError> {
        let t = self.timeout();
        let mut c = self.runtime.clone();
        let resp = self
            .unary("Attach", t, c.attach(Self::request(req, t)))
            .await?;
        Ok(resp.url)
    }

    /// PortForward: the URL serving port forwarding into a sandbox's
    /// network namespace.
    pub async fn port_forward(
        &self,
        pod_sandbox_id: &str,
        ports: Vec<i32>,
    ) -> Result<String, CriError> {
        let t = self.timeout();
        let mut c = self.runtime.clone();
        let req = api::PortForwardRequest {
            pod_sandbox_id: pod_sandbox_id.to_string(),
            port: ports,
        };
        let resp = self
            .unary("PortForward", t, c.port_forward(Self::request(req, t)))
            .await?;
        Ok(resp.url)
    }

    /// GetContainerEvents: the runtime's stream of container lifecycle
    /// events. The stream is opened when first polled and has no deadline.
    /// Errors arrive as items; a runtime without the method (containerd 1.6)
    /// yields [`CriError::Unimplemented`] as its first item, after which the
    /// stream ends, and the PLEG should fall back to relisting.
    pub fn get_container_events(&self) -> ContainerEventStream {
        ContainerEventStream::open(self.runtime.clone())
    }

    // ---- RuntimeService: stats ----

    /// ContainerStats of one container.
    pub async fn container_stats(
        &self,
        container_id: &str,
    ) -> Result<api::ContainerStats, CriError> {
        let t = self.timeout();
        let mut c = self.runtime.clone();
        let req = api::ContainerStatsRequest {
            container_id: container_id.to_string(),
        };
        self.unary(
            "ContainerStats",
            t,
            c.container_stats(Self::request(req, t)),
        )
        .await?
        .stats
        .ok_or(CriError::MissingField {
            method: "ContainerStats",
            field: "stats",
        })
    }

    /// ListContainerStats, optionally filtered.
    pub async fn list_container_stats(
        &self,
        filter: Option<api::ContainerStatsFilter>,
    ) -> Result<Vec<api::ContainerStats>, CriError> {
        let t = self.timeout();
        let mut c = self.runtime.clone();
        let req = api::ListContainerStatsRequest { filter };
        self.unary(
            "ListContainerStats",
            t,
            c.list_container_stats(Self::request(req, t)),
        )
        .await
        .map(|r| r.stats)
    }

    /// PodSandboxStats of one sandbox.
    pub async fn pod_sandbox_stats(
        &self,
        pod_sandbox_id: &str,
    ) -> Result<api::PodSandboxStats, CriError> {
        let t = self.timeout();
        let mut c = self.runtime.clone();
        let req = api::PodSandboxStatsRequest {
            pod_sandbox_id: pod_sandbox_id.to_string(),
        };
        self.unary(
            "PodSandboxStats",
            t,
            c.pod_sandbox_stats(Self::request(req, t)),
        )
        .await?
        .stats
        .ok_or(CriError::MissingField {
            method: "PodSandboxStats",
            field: "stats",
        })
    }

    /// ListPodSandboxStats, optionally filtered.
    pub async fn list_pod_sandbox_stats(
        &self,
        filter: Option<api::PodSandboxStatsFilter>,
    ) -> Result<Vec<api::PodSandboxStats>, CriError> {
        let t = self.timeout();
        let mut c = self.runtime.clone();
        let req = api::ListPodSandboxStatsRequest { filter };
        self.unary(
            "ListPodSandboxStats",
            t,
            c.list_pod_sandbox_stats(Self::request(req, t)),
        )
        .await
        .map(|r| r.stats)
    }

    // ---- ImageService ----

    /// PullImage with optional registry credentials; returns the image
    /// reference the runtime resolved (`sha256:...` for containerd).
    pub async fn pull_image(
        &self,
        image: api::ImageSpec,
        auth: Option<api::AuthConfig>,
        sandbox_config: Option<api::PodSandboxConfig>,
    ) -> Result<String, CriError> {
        let t = self.config.pull_image_timeout;
        let mut c = self.image.clone();
        let req = api::PullImageRequest {
            image: Some(image),
            auth,
            sandbox_config,
        };
        let resp = self
            .unary("PullImage", t, c.pull_image(Self::request(req, t)))
            .await?;
        non_empty("PullImage", "image_ref", resp.image_ref)
    }

    /// ImageStatus: `None` when the image is not present (CRI's way of saying
    /// so; not an error).
    pub async fn image_status(
        &self,
        image: api::ImageSpec,
    ) -> Result<Option<api::Image>, CriError> {
        let t = self.timeout();
        let mut c = self.image.clone();
        let req = api::ImageStatusRequest {
            image: Some(image),
            verbose: false,
        };
        self.unary("ImageStatus", t, c.image_status(Self::request(req, t)))
            .await
            .map(|r| r.image)
    }

    /// ListImages, optionally filtered by image reference.
    pub async fn list_images(
        &self,
        filter: Option<api::ImageFilter>,
    ) -> Result<Vec<api::Image>, CriError> {
        let t = self.timeout();
        let mut c = self.image.clone();
        let req = api::ListImagesRequest { filter };
        self.unary("ListImages", t, c.list_images(Self::request(req, t)))
            .await
            .map(|r| r.images)
    }

    /// RemoveImage (removing an absent image succeeds, as CRI requires).
    pub async fn remove_image(&self, image: api::ImageSpec) -> Result<(), CriError> {
        let t = self.timeout();
        let mut c = self.image.clone();
        let req = api::RemoveImageRequest { image: Some(image) };
        self.unary("RemoveImage", t, c.remove_image(Self::request(req, t)))
            .await
            .map(drop)
    }

    /// ImageFsInfo: usage of the filesystems holding images and writable layers.
    pub async fn image_fs_info(&self) -> Result<api::ImageFsInfoResponse, CriError> {
        let t = self.timeout();
        let mut c = self.image.clone();
        let req = api::ImageFsInfoRequest {};
        self.unary("ImageFsInfo", t, c.image_fs_info(Self::request(req, t)))
            .await
    }
}

/// Finds a condition of `kind` ([`RUNTIME_READY`], [`NETWORK_READY`]) in a
/// runtime status.
pub fn runtime_condition<'a>(
    status: &'a api::RuntimeStatus,
    kind: &str,
) -> Option<&'a api::RuntimeCondition> {
    status.conditions.iter().find(|c| c.r#type == kind)
}

/// An [`api::ImageSpec`] naming `image` (a reference or an image id).
pub fn image_spec(image: &str) -> api::ImageSpec {
    api::ImageSpec {
        image: image.to_string(),
        ..Default::default()
    }
}

fn non_empty(method: &'static str, field: &'static str, value: String) -> Result<String, CriError> {
    if value.is_empty() {
        Err(CriError::MissingField { method, field })
    } else {
        Ok(value)
    }
}
