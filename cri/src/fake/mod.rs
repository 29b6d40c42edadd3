//! An in-process fake CRI runtime for tests (feature `testing`).
//!
//! [`FakeRuntime`] is a real tonic gRPC server on a unix socket that
//! implements CRI runtime.v1 `RuntimeService` and `ImageService` with
//! in-memory sandboxes, containers and images. It follows what containerd's
//! CRI plugin does where kubelet can see it: 64-hex ids (truncated ids
//! accepted), the CREATED → RUNNING → EXITED state machine, nanosecond
//! timestamps, labels and annotations echoed back, ANDed filters, sandbox
//! IPs from a CIDR (skipping the gateway `.1`), log paths joined from the
//! sandbox log directory, reserved names (a duplicate is an Unknown error),
//! NotFound for unknown ids (also for Stop; removing an unknown id
//! succeeds), containers only in READY sandboxes, no IP once a sandbox is
//! stopped, exit reasons `Completed`/`Error`/`OOMKilled`, a stop ending the
//! process by SIGTERM (143) or SIGKILL (137), the image id as `image_ref`
//! and an empty `image_id` (containerd 1.6), ListImages ignoring its filter
//! (containerd 1.6), stats only for running containers, and — as in
//! containerd ≥ 1.7, switchable off for 1.6 — CONTAINER_CREATED/STARTED/
//! STOPPED/DELETED events (also for the sandbox itself, whose id is then the
//! "container" id) carrying the sandbox and container statuses.
//! These behaviours were checked against containerd 1.6.20 by the system
//! tests in `tests/tests/system/system_cri_containerd.rs`.
//!
//! On top of that a test controls it: a [`FakeClock`], scripted container
//! exits ([`ExitScript`]) and exec results ([`ExecScript`]), per-method
//! latency and failures, readiness conditions, a registry for PullImage,
//! stats figures, a call log, and stopping/restarting the server (every
//! connection dropped, socket removed, state kept — like a containerd
//! restart).
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use keelson_cri::fake::{FakeRuntime, ExitScript};
//! use std::time::Duration;
//! let dir = tempfile::tempdir()?;
//! let fake = FakeRuntime::start(dir.path().join("cri.sock")).await?;
//! fake.add_image("keelson.local/busybox:1");
//! fake.script_exit("app", ExitScript::code(3, Duration::from_millis(50)));
//! let cri = keelson_cri::RuntimeClient::connect(&fake.endpoint(), Duration::from_secs(5)).await?;
//! # Ok(()) }
//! ```

mod clock;
mod faults;
mod images;
mod ipam;
mod script;
mod server;
mod service;
mod state;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use k8s_cri::v1 as api;
use tokio::sync::broadcast;
use tokio::task::AbortHandle;
use tonic::Code;

pub use clock::FakeClock;
pub use faults::Call;
pub use images::{FakeImage, normalize_reference};
pub use ipam::BadCidr;
pub use script::{ExecScript, ExitScript};
pub use state::{EXIT_CODE_SIGKILL, EXIT_CODE_SIGTERM, FakeUsage};

use faults::Faults;
use ipam::IpPool;
use server::Serving;
use state::{Condition, RegistryEntry, State};

/// Locks a std mutex, recovering from poisoning (a panicking test thread
/// must not take the fake down with it). Never held across an await.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// What went wrong starting or steering the fake runtime.
#[derive(Debug, thiserror::Error)]
pub enum FakeError {
    /// Binding or removing the socket failed.
    #[error("fake CRI runtime: {context}: {source}")]
    Io {
        /// What we were doing.
        context: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The pod CIDR is not an IPv4 CIDR usable for sandbox IPs.
    #[error("fake CRI runtime: {0}")]
    BadCidr(#[from] BadCidr),
    /// The container or sandbox id is unknown.
    #[error("fake CRI runtime: no such container or sandbox {0:?}")]
    NotFound(String),
}

/// Settings of a [`FakeRuntime`].
#[derive(Debug, Clone)]
pub struct FakeConfig {
    /// `runtime_name` in Version.
    pub runtime_name: String,
    /// `runtime_version` in Version.
    pub runtime_version: String,
    /// CIDR sandbox IPs come from (until UpdateRuntimeConfig sets another).
    pub pod_cidr: String,
    /// Whether GetContainerEvents is offered (containerd ≥ 1.7) or answers
    /// Unimplemented (containerd 1.6).
    pub container_events: bool,
    /// The cgroup driver RuntimeConfig reports (`None`: RuntimeConfig
    /// answers Unimplemented, as containerd < 2.0).
    pub cgroup_driver: Option<crate::api::CgroupDriver>,
    /// `info["config"]` of a verbose Status (containerd's CRI configuration
    /// as JSON); empty: no info.
    pub status_config: String,
    /// Whether ContainerStatus carries `user` (the process's uid, gid and
    /// groups, as containerd ≥ 2.0 reports it for SupplementalGroupsPolicy):
    /// uid from `runAsUser` or the image, gid from `runAsGroup` (else 0),
    /// supplemental groups the gid then the container's
    /// `supplementalGroups`. Off: no `user`, as containerd 1.x.
    pub report_user: bool,
}

impl Default for FakeConfig {
    fn default() -> Self {
        FakeConfig {
            runtime_name: "containerd".to_string(),
            runtime_version: "keelson-fake".to_string(),
            pod_cidr: "10.88.0.0/16".to_string(),
            container_events: true,
            cgroup_driver: Some(crate::api::CgroupDriver::Cgroupfs),
            status_config: String::new(),
            report_user: false,
        }
    }
}

/// State shared by the handle and the gRPC services.
pub(crate) struct Shared {
    pub(crate) config: FakeConfig,
    pub(crate) state: Mutex<State>,
    pub(crate) faults: Mutex<Faults>,
    pub(crate) exits: Mutex<Vec<(String, ExitScript)>>,
    pub(crate) execs: Mutex<Vec<ExecScript>>,
    pub(crate) clock: FakeClock,
    pub(crate) events: broadcast::Sender<api::ContainerEventResponse>,
    pub(crate) events_supported: AtomicBool,
    pub(crate) timers: Mutex<Vec<AbortHandle>>,
}

impl Shared {
    pub(crate) fn now(&self) -> i64 {
        self.clock.now_nanos()
    }

    pub(crate) fn publish(&self, events: Vec<api::ContainerEventResponse>) {
        for event in events {
            // No subscriber is fine: events are not buffered for later ones.
            let _ = self.events.send(event);
        }
    }

    /// Ends a running container now; unknown or not running: no-op.
    pub(crate) fn exit_now(&self, id: &str, exit_code: i32, reason: Option<&str>, message: String) {
        let now = self.now();
        let events = lock(&self.state).exit_container(id, exit_code, reason, message, now);
        self.publish(events);
    }

    /// Schedules the scripted exit (if any) of a container just started.
    pub(crate) fn schedule_exit(self: &Arc<Self>, container_id: &str) {
        let name = {
            let state = lock(&self.state);
            state
                .containers
                .get(container_id)
                .and_then(|c| c.config.metadata.as_ref())
                .map(|m| m.name.clone())
                .unwrap_or_default()
        };
        let script = lock(&self.exits)
            .iter()
            .rev()
            .find(|(n, _)| *n == name)
            .map(|(_, s)| s.clone());
        let Some(script) = script else { return };
        let shared = Arc::clone(self);
        let id = container_id.to_string();
        let handle = tokio::spawn(async move {
            tokio::time::sleep(script.after).await;
            shared.exit_now(
                &id,
                script.exit_code,
                script.reason.as_deref(),
                script.message.clone(),
            );
        })
        .abort_handle();
        let mut timers = lock(&self.timers);
        timers.retain(|t| !t.is_finished());
        timers.push(handle);
    }
}

/// The fake runtime: a gRPC server on a unix socket plus the controls a
/// test uses. Dropping it stops the server and removes the socket.
pub struct FakeRuntime {
    shared: Arc<Shared>,
    path: PathBuf,
    serving: Mutex<Option<Serving>>,
}

impl std::fmt::Debug for FakeRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeRuntime")
            .field("path", &self.path)
            .finish()
    }
}

impl FakeRuntime {
    /// Starts a fake runtime with default settings listening on `path`.
    pub async fn start(path: impl AsRef<Path>) -> Result<Self, FakeError> {
        Self::start_with(path, FakeConfig::default()).await
    }

    /// Starts a fake runtime with `config` listening on `path`.
    pub async fn start_with(path: impl AsRef<Path>, config: FakeConfig) -> Result<Self, FakeError> {
        let pool = IpPool::new(&config.pod_cidr)?;
        let (events, _) = broadcast::channel(1024);
        let shared = Arc::new(Shared {
            events_supported: AtomicBool::new(config.container_events),
            state: Mutex::new(State::new(pool, config.report_user)),
            config,
            faults: Mutex::new(Faults::default()),
            exits: Mutex::new(Vec::new()),
            execs: Mutex::new(Vec::new()),
            clock: FakeClock::default(),
            events,
            timers: Mutex::new(Vec::new()),
        });
        let fake = FakeRuntime {
            shared,
            path: path.as_ref().to_path_buf(),
            serving: Mutex::new(None),
        };
        fake.resume_serving()?;
        Ok(fake)
    }

    /// The CRI endpoint to give a client: `unix:///path`.
    pub fn endpoint(&self) -> String {
        format!("unix://{}", self.path.display())
    }

    /// The socket path.
    pub fn socket_path(&self) -> &Path {
        &self.path
    }

    /// The clock that stamps created/started/finished times and events.
    pub fn clock(&self) -> &FakeClock {
        &self.shared.clock
    }

    // ---- serving ----

    /// Stops answering: every connection and in-flight call (event streams
    /// included) is dropped and the socket removed. State is kept.
    pub fn stop_serving(&self) {
        lock(&self.serving).take();
    }

    /// Listens again after [`FakeRuntime::stop_serving`] (no-op if serving).
    pub fn resume_serving(&self) -> Result<(), FakeError> {
        let mut serving = lock(&self.serving);
        if serving.is_none() {
            let routes = service::routes(Arc::clone(&self.shared));
            *serving =
                Some(
                    Serving::start(&self.path, routes).map_err(|source| FakeError::Io {
                        context: format!("listening on {}", self.path.display()),
                        source,
                    })?,
                );
        }
        Ok(())
    }

    /// A runtime restart: stop serving, then serve again on the same socket
    /// with the same state (as containerd recovers its containers).
    pub fn restart(&self) -> Result<(), FakeError> {
        self.stop_serving();
        self.resume_serving()
    }

    /// Whether the server is listening.
    pub fn is_serving(&self) -> bool {
        lock(&self.serving).is_some()
    }

    // ---- faults and the call log ----

    /// Every later call of `method` (CRI name, e.g. `"ListContainers"`, or
    /// `"*"` for all) waits `latency` before it is handled; zero clears it.
    pub fn set_latency(&self, method: &str, latency: Duration) {
        lock(&self.shared.faults).set_latency(method, latency);
    }

    /// The next `times` calls of `method` (or `"*"`) fail with `code`.
    pub fn fail_next(&self, method: &str, times: u32, code: Code, message: &str) {
        lock(&self.shared.faults).fail_next(method, times, code, message);
    }

    /// Every call received so far, in order.
    pub fn calls(&self) -> Vec<Call> {
        lock(&self.shared.faults).calls()
    }

    /// The calls of one method received so far.
    pub fn calls_to(&self, method: &str) -> Vec<Call> {
        self.calls()
            .into_iter()
            .filter(|c| c.method == method)
            .collect()
    }

    /// Forgets the call log.
    pub fn clear_calls(&self) {
        lock(&self.shared.faults).clear_calls();
    }

    // ---- readiness ----

    /// Sets the RuntimeReady condition Status reports.
    pub fn set_runtime_ready(&self, ready: bool, reason: &str, message: &str) {
        lock(&self.shared.state).runtime_ready = Condition {
            ready,
            reason: reason.to_string(),
            message: message.to_string(),
        };
    }

    /// Sets the NetworkReady condition Status reports. While the network is
    /// not ready, RunPodSandbox of a pod-network sandbox fails, as with a
    /// CNI plugin that is not initialized.
    pub fn set_network_ready(&self, ready: bool, reason: &str, message: &str) {
        lock(&self.shared.state).network_ready = Condition {
            ready,
            reason: reason.to_string(),
            message: message.to_string(),
        };
    }

    /// Offer GetContainerEvents (true) or answer Unimplemented (false).
    pub fn set_container_events_supported(&self, supported: bool) {
        self.shared
            .events_supported
            .store(supported, Ordering::SeqCst);
    }

    /// The pod CIDR sandbox IPs come from now.
    pub fn pod_cidr(&self) -> String {
        lock(&self.shared.state).pool.cidr().to_string()
    }

    // ---- images ----

    /// Makes an image present (as if pulled or imported); returns its id.
    pub fn add_image(&self, reference: &str) -> String {
        lock(&self.shared.state).add_image(reference, 1024 * 1024)
    }

    /// Adds an image with every field given (references are normalized).
    pub fn add_image_with(&self, mut image: FakeImage) {
        image.repo_tags = image
            .repo_tags
            .iter()
            .map(|r| normalize_reference(r))
            .collect();
        image.repo_digests = image
            .repo_digests
            .iter()
            .map(|r| normalize_reference(r))
            .collect();
        lock(&self.shared.state).images.push(image);
    }

    /// Lets PullImage fetch `reference`, requiring `credentials`
    /// (username, password) if given.
    pub fn add_registry_image(&self, reference: &str, credentials: Option<(&str, &str)>) {
        lock(&self.shared.state).registry.insert(
            normalize_reference(reference),
            RegistryEntry {
                credentials: credentials.map(|(u, p)| (u.to_string(), p.to_string())),
                size: 2 * 1024 * 1024,
            },
        );
    }

    /// The images present.
    pub fn images(&self) -> Vec<FakeImage> {
        lock(&self.shared.state).images.clone()
    }

    /// Where ImageFsInfo says images (and ContainerStats writable layers) live.
    pub fn set_image_fs_mountpoint(&self, mountpoint: &str) {
        let mut state = lock(&self.shared.state);
        state.image_fs_mountpoint = mountpoint.to_string();
        state.container_fs_mountpoint = mountpoint.to_string();
    }

    // ---- scripts ----

    /// Every container named `container_name` (metadata name, any attempt)
    /// started from now on exits as `script` says. A later script for the
    /// same name wins.
    pub fn script_exit(&self, container_name: &str, script: ExitScript) {
        lock(&self.shared.exits).push((container_name.to_string(), script));
    }

    /// Ends a running container's process now with `exit_code` and `reason`
    /// (`None`: Completed/Error by exit code).
    pub fn exit_container(
        &self,
        id: &str,
        exit_code: i32,
        reason: Option<&str>,
    ) -> Result<(), FakeError> {
        let id = lock(&self.shared.state)
            .container_id(id)
            .map_err(|_| FakeError::NotFound(id.to_string()))?;
        self.shared.exit_now(&id, exit_code, reason, String::new());
        Ok(())
    }

    /// The exit code the container reports when StopContainer ends it
    /// within its grace period (default 143, SIGTERM's).
    pub fn set_stop_exit_code(&self, id: &str, exit_code: i32) -> Result<(), FakeError> {
        let mut state = lock(&self.shared.state);
        let full = state
            .container_id(id)
            .map_err(|_| FakeError::NotFound(id.to_string()))?;
        if let Some(c) = state.containers.get_mut(&full) {
            c.stop_exit_code = Some(exit_code);
        }
        Ok(())
    }

    /// What ExecSync answers for a command (later scripts win; a script for
    /// a named container wins over one for any container). A command without
    /// a script fails the way runc fails for a binary not in the image: an
    /// Unknown error, not an exit code.
    pub fn script_exec(&self, script: ExecScript) {
        lock(&self.shared.execs).push(script);
    }

    /// Usage figures reported by the stats calls for a container.
    pub fn set_usage(&self, container_id: &str, usage: FakeUsage) -> Result<(), FakeError> {
        let mut state = lock(&self.shared.state);
        let full = state
            .container_id(container_id)
            .map_err(|_| FakeError::NotFound(container_id.to_string()))?;
        state.usage.insert(full, usage);
        Ok(())
    }

    /// Configures one more runtime handler (containerd's
    /// `runtimes.<name>`); RunPodSandbox with any other non-empty handler
    /// fails as containerd's does.
    pub fn add_runtime_handler(&self, name: &str) {
        lock(&self.shared.state)
            .runtime_handlers
            .insert(name.to_string());
    }

    // ---- inspection ----

    /// The config and runtime handler each sandbox was created with.
    pub fn sandbox_configs(&self) -> Vec<(api::PodSandboxConfig, String)> {
        let state = lock(&self.shared.state);
        state
            .sandboxes
            .values()
            .map(|sb| (sb.config.clone(), sb.runtime_handler.clone()))
            .collect()
    }

    /// The config each container was created with (CreateContainer's
    /// request), with its sandbox id.
    pub fn container_configs(&self) -> Vec<(api::ContainerConfig, String)> {
        let state = lock(&self.shared.state);
        state
            .containers
            .values()
            .map(|c| (c.config.clone(), c.sandbox_id.clone()))
            .collect()
    }

    /// Status of every sandbox, as PodSandboxStatus would report it.
    pub fn sandboxes(&self) -> Vec<api::PodSandboxStatus> {
        let state = lock(&self.shared.state);
        state
            .sandboxes
            .values()
            .map(|sb| state.sandbox_status(sb))
            .collect()
    }

    /// Status of every container, as ContainerStatus would report it.
    pub fn containers(&self) -> Vec<api::ContainerStatus> {
        let state = lock(&self.shared.state);
        state
            .containers
            .values()
            .map(|c| state.container_status(c))
            .collect()
    }
}

impl Drop for FakeRuntime {
    fn drop(&mut self) {
        for timer in lock(&self.shared.timers).drain(..) {
            timer.abort();
        }
        self.stop_serving();
    }
}
