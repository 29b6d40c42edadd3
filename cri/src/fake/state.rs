//! The fake runtime's in-memory model: sandboxes, containers and images
//! with the state machine and error behaviour of containerd's CRI plugin.
//! Everything here is synchronous; the gRPC layer calls it under a lock and
//! broadcasts the events each operation returns.

use std::collections::{BTreeMap, HashMap};

use k8s_cri::v1 as api;
use tonic::Status;

use super::images::{FakeImage, normalize_reference};
use super::ipam::IpPool;
use super::script::ExecScript;

use api::{ContainerEventType as Ev, ContainerState as Cs, PodSandboxState as Ps};

/// Exit code of a process killed by SIGKILL (128 + 9), as containerd reports it.
pub const EXIT_CODE_SIGKILL: i32 = 137;
/// Exit code of a process ended by SIGTERM (128 + 15).
pub const EXIT_CODE_SIGTERM: i32 = 143;

/// A sandbox (pod) in the fake runtime.
#[derive(Debug, Clone)]
pub(crate) struct Sandbox {
    pub(crate) id: String,
    pub(crate) name: String,
    pub(crate) config: api::PodSandboxConfig,
    pub(crate) runtime_handler: String,
    pub(crate) state: Ps,
    pub(crate) created_at: i64,
    pub(crate) ip: String,
    /// The IP is still held in the pool (released when the network is torn down).
    pub(crate) ip_held: bool,
}

/// A container in the fake runtime.
#[derive(Debug, Clone)]
pub(crate) struct Container {
    pub(crate) id: String,
    pub(crate) name: String,
    pub(crate) sandbox_id: String,
    pub(crate) config: api::ContainerConfig,
    pub(crate) state: Cs,
    pub(crate) created_at: i64,
    pub(crate) started_at: i64,
    pub(crate) finished_at: i64,
    pub(crate) exit_code: i32,
    pub(crate) reason: String,
    pub(crate) message: String,
    pub(crate) image_ref: String,
    pub(crate) log_path: String,
    /// Exit code the container gives when stopped with a grace period
    /// (None: 143, the default action of SIGTERM).
    pub(crate) stop_exit_code: Option<i32>,
}

/// Usage figures a test sets for a container's stats.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FakeUsage {
    /// Cumulative CPU time in nanoseconds.
    pub cpu_usage_core_nanos: u64,
    /// Memory working set in bytes.
    pub memory_working_set_bytes: u64,
    /// Bytes used by the writable layer.
    pub writable_layer_bytes: u64,
}

/// An image a PullImage may fetch (the fake's registry).
#[derive(Debug, Clone)]
pub(crate) struct RegistryEntry {
    pub(crate) credentials: Option<(String, String)>,
    pub(crate) size: u64,
}

/// Readiness reported by Status.
#[derive(Debug, Clone)]
pub(crate) struct Condition {
    pub(crate) ready: bool,
    pub(crate) reason: String,
    pub(crate) message: String,
}

/// The whole model.
#[derive(Debug)]
pub(crate) struct State {
    pub(crate) sandboxes: BTreeMap<String, Sandbox>,
    pub(crate) containers: BTreeMap<String, Container>,
    pub(crate) images: Vec<FakeImage>,
    pub(crate) registry: HashMap<String, RegistryEntry>,
    pub(crate) pool: IpPool,
    pub(crate) usage: HashMap<String, FakeUsage>,
    pub(crate) runtime_ready: Condition,
    pub(crate) network_ready: Condition,
    pub(crate) image_fs_mountpoint: String,
    pub(crate) container_fs_mountpoint: String,
    /// Runtime handlers configured besides the default (`""`), as
    /// containerd's `plugins.cri.containerd.runtimes` (default: `runc`).
    pub(crate) runtime_handlers: std::collections::BTreeSet<String>,
    /// Reserved names (sandbox and container) → id, as containerd's registrar.
    names: HashMap<String, String>,
    /// ContainerStatus carries `user` (`FakeConfig::report_user`).
    report_user: bool,
}

/// A new random 64-hex id (the form containerd uses).
pub(crate) fn new_id() -> String {
    let bytes: [u8; 32] = rand::random();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unknown(msg: impl Into<String>) -> Status {
    Status::unknown(msg.into())
}

fn not_found(kind: &str, id: &str) -> Status {
    Status::not_found(format!(
        "an error occurred when try to find {kind} {id:?}: not found"
    ))
}

/// Reason containerd gives an exited container (unless OOM-killed).
pub(crate) fn exit_reason(exit_code: i32) -> &'static str {
    if exit_code == 0 { "Completed" } else { "Error" }
}

/// Finds `id` in `map` by full id or unique prefix (containerd accepts
/// truncated ids).
fn resolve<'a, T>(map: &'a BTreeMap<String, T>, id: &str) -> Option<&'a str> {
    if id.is_empty() {
        return None;
    }
    if let Some((k, _)) = map.get_key_value(id) {
        return Some(k.as_str());
    }
    let mut hits = map
        .range(id.to_string()..)
        .take_while(|(k, _)| k.starts_with(id));
    match (hits.next(), hits.next()) {
        (Some((k, _)), None) => Some(k.as_str()),
        _ => None,
    }
}

fn labels_match(want: &HashMap<String, String>, have: &HashMap<String, String>) -> bool {
    want.iter().all(|(k, v)| have.get(k) == Some(v))
}

fn is_host_network(config: &api::PodSandboxConfig) -> bool {
    config
        .linux
        .as_ref()
        .and_then(|l| l.security_context.as_ref())
        .and_then(|s| s.namespace_options.as_ref())
        .is_some_and(|n| n.network == api::NamespaceMode::Node as i32)
}

impl State {
    pub(crate) fn new(pool: IpPool, report_user: bool) -> Self {
        State {
            report_user,
            sandboxes: BTreeMap::new(),
            containers: BTreeMap::new(),
            images: Vec::new(),
            registry: HashMap::new(),
            pool,
            usage: HashMap::new(),
            runtime_ready: Condition {
                ready: true,
                reason: String::new(),
                message: String::new(),
            },
            network_ready: Condition {
                ready: true,
                reason: String::new(),
                message: String::new(),
            },
            image_fs_mountpoint: "/var/lib/containerd/io.containerd.snapshotter.v1.overlayfs"
                .to_string(),
            container_fs_mountpoint: "/var/lib/containerd/io.containerd.snapshotter.v1.overlayfs"
                .to_string(),
            runtime_handlers: std::collections::BTreeSet::from(["runc".to_string()]),
            names: HashMap::new(),
        }
    }

    // ---- lookups and conversions ----

    pub(crate) fn sandbox_id(&self, id: &str) -> Result<String, Status> {
        resolve(&self.sandboxes, id)
            .map(str::to_string)
            .ok_or_else(|| not_found("sandbox", id))
    }

    pub(crate) fn container_id(&self, id: &str) -> Result<String, Status> {
        resolve(&self.containers, id)
            .map(str::to_string)
            .ok_or_else(|| not_found("container", id))
    }

    pub(crate) fn sandbox_status(&self, sb: &Sandbox) -> api::PodSandboxStatus {
        let namespace_options = sb
            .config
            .linux
            .as_ref()
            .and_then(|l| l.security_context.as_ref())
            .and_then(|s| s.namespace_options.clone());
        api::PodSandboxStatus {
            id: sb.id.clone(),
            metadata: sb.config.metadata.clone(),
            state: sb.state as i32,
            created_at: sb.created_at,
            network: Some(api::PodSandboxNetworkStatus {
                ip: sb.ip.clone(),
                additional_ips: Vec::new(),
            }),
            linux: Some(api::LinuxPodSandboxStatus {
                namespaces: Some(api::Namespace {
                    options: namespace_options,
                }),
            }),
            labels: sb.config.labels.clone(),
            annotations: sb.config.annotations.clone(),
            runtime_handler: sb.runtime_handler.clone(),
        }
    }

    pub(crate) fn container_status(&self, c: &Container) -> api::ContainerStatus {
        api::ContainerStatus {
            id: c.id.clone(),
            metadata: c.config.metadata.clone(),
            state: c.state as i32,
            created_at: c.created_at,
            started_at: c.started_at,
            finished_at: c.finished_at,
            exit_code: c.exit_code,
            image: c.config.image.clone(),
            image_ref: c.image_ref.clone(),
            reason: c.reason.clone(),
            message: c.message.clone(),
            labels: c.config.labels.clone(),
            annotations: c.config.annotations.clone(),
            mounts: c.config.mounts.clone(),
            log_path: c.log_path.clone(),
            resources: c
                .config
                .linux
                .as_ref()
                .and_then(|l| l.resources.clone())
                .map(|linux| api::ContainerResources {
                    linux: Some(linux),
                    windows: None,
                }),
            // containerd 1.6 leaves image_id empty (image_ref holds the id).
            image_id: String::new(),
            user: self.report_user.then(|| self.user_of(c)),
        }
    }

    /// The user a container's process runs as, as containerd reports it.
    fn user_of(&self, c: &Container) -> api::ContainerUser {
        let sc = c
            .config
            .linux
            .as_ref()
            .and_then(|l| l.security_context.as_ref());
        let image_uid = c
            .config
            .image
            .as_ref()
            .and_then(|i| self.resolve_image(&i.image))
            .and_then(|i| i.uid);
        let uid = sc
            .and_then(|s| s.run_as_user.as_ref().map(|v| v.value))
            .or(image_uid)
            .unwrap_or(0);
        let gid = sc
            .and_then(|s| s.run_as_group.as_ref().map(|v| v.value))
            .unwrap_or(0);
        let mut groups = vec![gid];
        for g in sc
            .map(|s| s.supplemental_groups.clone())
            .unwrap_or_default()
        {
            if !groups.contains(&g) {
                groups.push(g);
            }
        }
        api::ContainerUser {
            linux: Some(api::LinuxContainerUser {
                uid,
                gid,
                supplemental_groups: groups,
            }),
        }
    }

    fn container_item(c: &Container) -> api::Container {
        api::Container {
            id: c.id.clone(),
            pod_sandbox_id: c.sandbox_id.clone(),
            metadata: c.config.metadata.clone(),
            image: c.config.image.clone(),
            image_ref: c.image_ref.clone(),
            state: c.state as i32,
            created_at: c.created_at,
            labels: c.config.labels.clone(),
            annotations: c.config.annotations.clone(),
            image_id: String::new(),
        }
    }

    /// A GetContainerEvents message about `container_id` (a container or,
    /// for sandbox events, the sandbox id) in `sandbox_id`.
    pub(crate) fn event(
        &self,
        container_id: &str,
        sandbox_id: &str,
        kind: Ev,
        now: i64,
    ) -> api::ContainerEventResponse {
        api::ContainerEventResponse {
            container_id: container_id.to_string(),
            container_event_type: kind as i32,
            created_at: now,
            pod_sandbox_status: self
                .sandboxes
                .get(sandbox_id)
                .map(|sb| self.sandbox_status(sb)),
            containers_statuses: self
                .containers
                .values()
                .filter(|c| c.sandbox_id == sandbox_id)
                .map(|c| self.container_status(c))
                .collect(),
        }
    }

    // ---- sandboxes ----

    pub(crate) fn run_pod_sandbox(
        &mut self,
        config: Option<api::PodSandboxConfig>,
        runtime_handler: String,
        now: i64,
    ) -> Result<(String, Vec<api::ContainerEventResponse>), Status> {
        let config =
            config.ok_or_else(|| Status::invalid_argument("sandbox config is required"))?;
        let md = config
            .metadata
            .as_ref()
            .ok_or_else(|| Status::invalid_argument("sandbox config must include metadata"))?;
        if md.name.is_empty() || md.namespace.is_empty() || md.uid.is_empty() {
            return Err(Status::invalid_argument(
                "sandbox metadata must include name, namespace and uid",
            ));
        }
        let name = format!("{}_{}_{}_{}", md.name, md.namespace, md.uid, md.attempt);
        if let Some(owner) = self.names.get(&name) {
            return Err(unknown(format!(
                "failed to reserve sandbox name {name:?}: name {name:?} is reserved for {owner:?}"
            )));
        }
        if !self.runtime_ready.ready {
            return Err(unknown("runtime is not ready"));
        }
        // containerd's `getSandboxRuntime`.
        if !runtime_handler.is_empty() && !self.runtime_handlers.contains(&runtime_handler) {
            return Err(unknown(format!(
                "failed to get sandbox runtime: no runtime for {runtime_handler:?} is configured"
            )));
        }
        let (ip, ip_held) = if is_host_network(&config) {
            (String::new(), false)
        } else {
            if !self.network_ready.ready {
                return Err(unknown(format!(
                    "failed to setup network for sandbox: {}",
                    self.network_ready.message
                )));
            }
            let ip = self.pool.allocate().ok_or_else(|| {
                unknown(format!(
                    "failed to setup network for sandbox: no IP addresses available in range set {}",
                    self.pool.cidr()
                ))
            })?;
            (ip.to_string(), true)
        };
        let id = new_id();
        self.names.insert(name.clone(), id.clone());
        self.sandboxes.insert(
            id.clone(),
            Sandbox {
                id: id.clone(),
                name,
                config,
                runtime_handler,
                state: Ps::SandboxReady,
                created_at: now,
                ip,
                ip_held,
            },
        );
        // containerd reports the sandbox's own container as created+started.
        let events = vec![
            self.event(&id, &id, Ev::ContainerCreatedEvent, now),
            self.event(&id, &id, Ev::ContainerStartedEvent, now),
        ];
        Ok((id, events))
    }

    pub(crate) fn stop_pod_sandbox(
        &mut self,
        id: &str,
        now: i64,
    ) -> Result<Vec<api::ContainerEventResponse>, Status> {
        let id = self.sandbox_id(id)?;
        let mut events = Vec::new();
        let running: Vec<String> = self
            .containers
            .values()
            .filter(|c| c.sandbox_id == id && c.state == Cs::ContainerRunning)
            .map(|c| c.id.clone())
            .collect();
        for cid in running {
            // Stopping a sandbox kills its containers without grace.
            events.extend(self.exit_container(&cid, EXIT_CODE_SIGKILL, None, String::new(), now));
        }
        let Some(sb) = self.sandboxes.get_mut(&id) else {
            return Err(not_found("sandbox", &id));
        };
        let was_ready = sb.state == Ps::SandboxReady;
        sb.state = Ps::SandboxNotready;
        if sb.ip_held {
            sb.ip_held = false;
            let ip = std::mem::take(&mut sb.ip);
            self.pool.release(&ip);
        }
        // containerd reports no IP once the sandbox's network is torn down.
        sb.ip.clear();
        if was_ready {
            events.push(self.event(&id, &id, Ev::ContainerStoppedEvent, now));
        }
        Ok(events)
    }

    pub(crate) fn remove_pod_sandbox(
        &mut self,
        id: &str,
        now: i64,
    ) -> Result<Vec<api::ContainerEventResponse>, Status> {
        let Ok(id) = self.sandbox_id(id) else {
            // Removing an unknown sandbox succeeds (CRI: idempotent).
            return Ok(Vec::new());
        };
        let mut events = self.stop_pod_sandbox(&id, now)?;
        let members: Vec<String> = self
            .containers
            .values()
            .filter(|c| c.sandbox_id == id)
            .map(|c| c.id.clone())
            .collect();
        for cid in members {
            events.extend(self.remove_container(&cid, now)?);
        }
        // The event still carries the sandbox's last status.
        events.push(self.event(&id, &id, Ev::ContainerDeletedEvent, now));
        if let Some(sb) = self.sandboxes.remove(&id) {
            self.names.remove(&sb.name);
        }
        Ok(events)
    }

    pub(crate) fn list_pod_sandbox(
        &self,
        filter: Option<api::PodSandboxFilter>,
    ) -> Vec<api::PodSandbox> {
        let filter = filter.unwrap_or_default();
        let id = if filter.id.is_empty() {
            None
        } else {
            // An unknown id filter matches nothing.
            Some(resolve(&self.sandboxes, &filter.id).unwrap_or("\0"))
        };
        self.sandboxes
            .values()
            .filter(|sb| id.is_none_or(|id| sb.id == id))
            .filter(|sb| {
                filter
                    .state
                    .as_ref()
                    .is_none_or(|s| s.state == sb.state as i32)
            })
            .filter(|sb| labels_match(&filter.label_selector, &sb.config.labels))
            .map(|sb| api::PodSandbox {
                id: sb.id.clone(),
                metadata: sb.config.metadata.clone(),
                state: sb.state as i32,
                created_at: sb.created_at,
                labels: sb.config.labels.clone(),
                annotations: sb.config.annotations.clone(),
                runtime_handler: sb.runtime_handler.clone(),
            })
            .collect()
    }

    // ---- containers ----

    pub(crate) fn resolve_image(&self, reference: &str) -> Option<&FakeImage> {
        let normalized = normalize_reference(reference);
        self.images
            .iter()
            .find(|img| img.matches(reference) || img.matches(&normalized))
    }

    pub(crate) fn create_container(
        &mut self,
        sandbox_id: &str,
        config: Option<api::ContainerConfig>,
        now: i64,
    ) -> Result<(String, Vec<api::ContainerEventResponse>), Status> {
        let sandbox_id = self.sandbox_id(sandbox_id)?;
        let config =
            config.ok_or_else(|| Status::invalid_argument("container config is required"))?;
        let md = config
            .metadata
            .as_ref()
            .ok_or_else(|| Status::invalid_argument("container config must include metadata"))?;
        let Some(sb) = self.sandboxes.get(&sandbox_id) else {
            return Err(not_found("sandbox", &sandbox_id));
        };
        if sb.state != Ps::SandboxReady {
            return Err(Status::not_found(format!(
                "failed to get sandbox container task: no running task found: task {sandbox_id} not found: not found"
            )));
        }
        let sb_md = sb.config.metadata.clone().unwrap_or_default();
        let name = format!(
            "{}_{}_{}_{}_{}",
            md.name, sb_md.name, sb_md.namespace, sb_md.uid, md.attempt
        );
        if let Some(owner) = self.names.get(&name) {
            return Err(unknown(format!(
                "failed to reserve container name {name:?}: name {name:?} is reserved for {owner:?}"
            )));
        }
        let reference = config
            .image
            .as_ref()
            .map(|i| i.image.clone())
            .unwrap_or_default();
        let image = self.resolve_image(&reference).ok_or_else(|| {
            Status::not_found(format!("failed to resolve image {reference:?}: not found"))
        })?;
        let log_path = if config.log_path.is_empty() || sb.config.log_directory.is_empty() {
            String::new()
        } else {
            format!(
                "{}/{}",
                sb.config.log_directory.trim_end_matches('/'),
                config.log_path
            )
        };
        let id = new_id();
        let container = Container {
            id: id.clone(),
            name: name.clone(),
            sandbox_id: sandbox_id.clone(),
            state: Cs::ContainerCreated,
            created_at: now,
            started_at: 0,
            finished_at: 0,
            exit_code: 0,
            reason: String::new(),
            message: String::new(),
            image_ref: image.image_ref(),
            log_path,
            stop_exit_code: None,
            config,
        };
        self.names.insert(name, id.clone());
        self.containers.insert(id.clone(), container);
        let events = vec![self.event(&id, &sandbox_id, Ev::ContainerCreatedEvent, now)];
        Ok((id, events))
    }

    pub(crate) fn start_container(
        &mut self,
        id: &str,
        now: i64,
    ) -> Result<(String, Vec<api::ContainerEventResponse>), Status> {
        let id = self.container_id(id)?;
        let (state, sandbox_id) = match self.containers.get(&id) {
            Some(c) => (c.state, c.sandbox_id.clone()),
            None => return Err(not_found("container", &id)),
        };
        if state != Cs::ContainerCreated {
            return Err(unknown(format!(
                "failed to start container {id:?}: container is in {} state",
                state.as_str_name()
            )));
        }
        let ready = self
            .sandboxes
            .get(&sandbox_id)
            .is_some_and(|sb| sb.state == Ps::SandboxReady);
        if !ready {
            return Err(unknown(format!(
                "failed to start container {id:?}: sandbox container {sandbox_id:?} is not running"
            )));
        }
        if let Some(c) = self.containers.get_mut(&id) {
            c.state = Cs::ContainerRunning;
            c.started_at = now;
        }
        let events = vec![self.event(&id, &sandbox_id, Ev::ContainerStartedEvent, now)];
        Ok((id, events))
    }

    /// Ends a running container's process: EXITED with `exit_code` and
    /// `reason` (default by exit code). Not running: nothing happens.
    pub(crate) fn exit_container(
        &mut self,
        id: &str,
        exit_code: i32,
        reason: Option<&str>,
        message: String,
        now: i64,
    ) -> Vec<api::ContainerEventResponse> {
        let Some(c) = self.containers.get_mut(id) else {
            return Vec::new();
        };
        if c.state != Cs::ContainerRunning {
            return Vec::new();
        }
        c.state = Cs::ContainerExited;
        c.finished_at = now;
        c.exit_code = exit_code;
        c.reason = reason.unwrap_or(exit_reason(exit_code)).to_string();
        c.message = message;
        let sandbox_id = c.sandbox_id.clone();
        vec![self.event(id, &sandbox_id, Ev::ContainerStoppedEvent, now)]
    }

    pub(crate) fn stop_container(
        &mut self,
        id: &str,
        grace_secs: i64,
        now: i64,
    ) -> Result<Vec<api::ContainerEventResponse>, Status> {
        let id = self.container_id(id)?;
        let Some(c) = self.containers.get(&id) else {
            return Err(not_found("container", &id));
        };
        let code = if grace_secs > 0 {
            c.stop_exit_code.unwrap_or(EXIT_CODE_SIGTERM)
        } else {
            EXIT_CODE_SIGKILL
        };
        Ok(self.exit_container(&id, code, None, String::new(), now))
    }

    pub(crate) fn remove_container(
        &mut self,
        id: &str,
        now: i64,
    ) -> Result<Vec<api::ContainerEventResponse>, Status> {
        let Ok(id) = self.container_id(id) else {
            // Removing an unknown container succeeds, as in containerd.
            return Ok(Vec::new());
        };
        let mut events = self.exit_container(&id, EXIT_CODE_SIGKILL, None, String::new(), now);
        if let Some(c) = self.containers.remove(&id) {
            self.names.remove(&c.name);
            self.usage.remove(&id);
            events.push(self.event(&id, &c.sandbox_id, Ev::ContainerDeletedEvent, now));
        }
        Ok(events)
    }

    pub(crate) fn list_containers(
        &self,
        filter: Option<api::ContainerFilter>,
    ) -> Vec<api::Container> {
        let filter = filter.unwrap_or_default();
        let id =
            (!filter.id.is_empty()).then(|| resolve(&self.containers, &filter.id).unwrap_or("\0"));
        let sandbox = (!filter.pod_sandbox_id.is_empty())
            .then(|| resolve(&self.sandboxes, &filter.pod_sandbox_id).unwrap_or("\0"));
        self.containers
            .values()
            .filter(|c| id.is_none_or(|id| c.id == id))
            .filter(|c| sandbox.is_none_or(|s| c.sandbox_id == s))
            .filter(|c| {
                filter
                    .state
                    .as_ref()
                    .is_none_or(|s| s.state == c.state as i32)
            })
            .filter(|c| labels_match(&filter.label_selector, &c.config.labels))
            .map(Self::container_item)
            .collect()
    }

    pub(crate) fn exec_check(&self, id: &str) -> Result<(String, String), Status> {
        let id = self.container_id(id)?;
        let Some(c) = self.containers.get(&id) else {
            return Err(not_found("container", &id));
        };
        if c.state != Cs::ContainerRunning {
            return Err(unknown(format!(
                "container {id:?} is in {} state",
                c.state.as_str_name()
            )));
        }
        let name = c
            .config
            .metadata
            .as_ref()
            .map(|m| m.name.clone())
            .unwrap_or_default();
        Ok((id, name))
    }

    // ---- stats ----

    fn stats_of(&self, c: &Container, now: i64) -> api::ContainerStats {
        let usage = self.usage.get(&c.id).copied().unwrap_or_default();
        api::ContainerStats {
            attributes: Some(api::ContainerAttributes {
                id: c.id.clone(),
                metadata: c.config.metadata.clone(),
                labels: c.config.labels.clone(),
                annotations: c.config.annotations.clone(),
            }),
            cpu: Some(api::CpuUsage {
                timestamp: now,
                usage_core_nano_seconds: Some(api::UInt64Value {
                    value: usage.cpu_usage_core_nanos,
                }),
                usage_nano_cores: None,
            }),
            memory: Some(api::MemoryUsage {
                timestamp: now,
                working_set_bytes: Some(api::UInt64Value {
                    value: usage.memory_working_set_bytes,
                }),
                usage_bytes: Some(api::UInt64Value {
                    value: usage.memory_working_set_bytes,
                }),
                ..Default::default()
            }),
            writable_layer: Some(api::FilesystemUsage {
                timestamp: now,
                fs_id: Some(api::FilesystemIdentifier {
                    mountpoint: self.container_fs_mountpoint.clone(),
                }),
                used_bytes: Some(api::UInt64Value {
                    value: usage.writable_layer_bytes,
                }),
                inodes_used: Some(api::UInt64Value { value: 0 }),
            }),
            swap: None,
        }
    }

    pub(crate) fn container_stats(
        &self,
        id: &str,
        now: i64,
    ) -> Result<api::ContainerStats, Status> {
        let id = self.container_id(id)?;
        match self.containers.get(&id) {
            Some(c) if c.state == Cs::ContainerRunning => Ok(self.stats_of(c, now)),
            Some(_) => Err(unknown(format!(
                "failed to get container {id:?} metrics: unexpected metrics response: []"
            ))),
            None => Err(not_found("container", &id)),
        }
    }

    /// Stats of running containers matching the filter (containerd reports
    /// metrics only for running tasks).
    pub(crate) fn list_container_stats(
        &self,
        filter: Option<api::ContainerStatsFilter>,
        now: i64,
    ) -> Vec<api::ContainerStats> {
        let filter = filter.unwrap_or_default();
        let list = self.list_containers(Some(api::ContainerFilter {
            id: filter.id,
            state: Some(api::ContainerStateValue {
                state: Cs::ContainerRunning as i32,
            }),
            pod_sandbox_id: filter.pod_sandbox_id,
            label_selector: filter.label_selector,
        }));
        list.iter()
            .filter_map(|item| self.containers.get(&item.id))
            .map(|c| self.stats_of(c, now))
            .collect()
    }

    pub(crate) fn pod_sandbox_stats(
        &self,
        id: &str,
        now: i64,
    ) -> Result<api::PodSandboxStats, Status> {
        let id = self.sandbox_id(id)?;
        let Some(sb) = self.sandboxes.get(&id) else {
            return Err(not_found("sandbox", &id));
        };
        if sb.state != Ps::SandboxReady {
            return Err(unknown(format!(
                "sandbox {id:?} is not running: no metrics"
            )));
        }
        let containers = self.list_container_stats(
            Some(api::ContainerStatsFilter {
                pod_sandbox_id: id.clone(),
                ..Default::default()
            }),
            now,
        );
        let sum = |f: fn(&api::ContainerStats) -> u64| containers.iter().map(f).sum::<u64>();
        let cpu = sum(|c| {
            c.cpu
                .as_ref()
                .and_then(|u| u.usage_core_nano_seconds.as_ref())
                .map_or(0, |v| v.value)
        });
        let mem = sum(|c| {
            c.memory
                .as_ref()
                .and_then(|u| u.working_set_bytes.as_ref())
                .map_or(0, |v| v.value)
        });
        Ok(api::PodSandboxStats {
            attributes: Some(api::PodSandboxAttributes {
                id: sb.id.clone(),
                metadata: sb.config.metadata.clone(),
                labels: sb.config.labels.clone(),
                annotations: sb.config.annotations.clone(),
            }),
            linux: Some(api::LinuxPodSandboxStats {
                cpu: Some(api::CpuUsage {
                    timestamp: now,
                    usage_core_nano_seconds: Some(api::UInt64Value { value: cpu }),
                    usage_nano_cores: None,
                }),
                memory: Some(api::MemoryUsage {
                    timestamp: now,
                    working_set_bytes: Some(api::UInt64Value { value: mem }),
                    usage_bytes: Some(api::UInt64Value { value: mem }),
                    ..Default::default()
                }),
                network: None,
                process: Some(api::ProcessUsage {
                    timestamp: now,
                    process_count: Some(api::UInt64Value {
                        value: containers.len() as u64,
                    }),
                }),
                containers,
            }),
            windows: None,
        })
    }

    pub(crate) fn list_pod_sandbox_stats(
        &self,
        filter: Option<api::PodSandboxStatsFilter>,
        now: i64,
    ) -> Vec<api::PodSandboxStats> {
        let filter = filter.unwrap_or_default();
        self.list_pod_sandbox(Some(api::PodSandboxFilter {
            id: filter.id,
            state: Some(api::PodSandboxStateValue {
                state: Ps::SandboxReady as i32,
            }),
            label_selector: filter.label_selector,
        }))
        .iter()
        .filter_map(|sb| self.pod_sandbox_stats(&sb.id, now).ok())
        .collect()
    }

    // ---- images ----

    /// Adds (or returns) an image by reference; returns its id.
    pub(crate) fn add_image(&mut self, reference: &str, size: u64) -> String {
        let normalized = normalize_reference(reference);
        if let Some(img) = self.resolve_image(&normalized) {
            return img.id.clone();
        }
        let id = format!("sha256:{}", new_id());
        let (repo_tags, repo_digests) = if normalized.contains('@') {
            (Vec::new(), vec![normalized])
        } else {
            (vec![normalized], Vec::new())
        };
        self.images.push(FakeImage {
            id: id.clone(),
            repo_tags,
            repo_digests,
            size,
            pinned: false,
            uid: None,
            username: String::new(),
        });
        id
    }

    pub(crate) fn pull_image(
        &mut self,
        reference: &str,
        auth: Option<&api::AuthConfig>,
    ) -> Result<String, Status> {
        if reference.is_empty() {
            return Err(Status::invalid_argument("image reference is required"));
        }
        let normalized = normalize_reference(reference);
        let Some(entry) = self.registry.get(&normalized).cloned() else {
            return Err(Status::not_found(format!(
                "failed to pull and unpack image {normalized:?}: failed to resolve reference {normalized:?}: {normalized}: not found"
            )));
        };
        if let Some((user, pass)) = &entry.credentials {
            let ok = auth.is_some_and(|a| &a.username == user && &a.password == pass);
            if !ok {
                return Err(unknown(format!(
                    "failed to pull and unpack image {normalized:?}: failed to resolve reference {normalized:?}: pulling from host failed with status code [manifests]: 401 Unauthorized"
                )));
            }
        }
        Ok(self.add_image(&normalized, entry.size))
    }

    pub(crate) fn remove_image(&mut self, reference: &str) {
        let normalized = normalize_reference(reference);
        self.images
            .retain(|img| !(img.matches(reference) || img.matches(&normalized)));
    }

    pub(crate) fn exec_lookup<'a>(
        scripts: &'a [ExecScript],
        container_name: &str,
        cmd: &[String],
    ) -> Option<&'a ExecScript> {
        scripts
            .iter()
            .rev()
            .find(|s| s.cmd == cmd && s.container.as_deref() == Some(container_name))
            .or_else(|| {
                scripts
                    .iter()
                    .rev()
                    .find(|s| s.cmd == cmd && s.container.is_none())
            })
    }
}
