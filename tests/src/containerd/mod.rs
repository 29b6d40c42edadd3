//! A private, real containerd for system tests and the demo.
//!
//! [`Containerd::start`] installs what is missing (Debian packages
//! containerd, runc, containernetworking-plugins, busybox-static, gcc),
//! builds the test images, and starts a containerd that shares nothing with
//! the host's:
//!
//! - its own root, state dir, socket and config under
//!   `/var/tmp/keelson-containerd/<suffix>/` (CRI plugin on, cgroupfs,
//!   `restrict_oom_score_adj = true` because root lacks CAP_SYS_RESOURCE
//!   here, sandbox netns mounts under its state dir, runc state and the
//!   host-local IPAM store under its dir, AppArmor profile loading off);
//! - its own network namespace ([`Containerd::netns`], entered with
//!   `nsenter --net` so the host's /sys and cgroup mounts stay visible):
//!   the CNI bridge `kbr0` (the pods' gateway) and the pod veths live there,
//!   so pod IPs are reachable only from that namespace;
//! - a private CNI network (bridge + host-local) named
//!   `keelson-test-<suffix>` with subnet [`ContainerdOptions::pod_cidr`];
//! - `sandbox_image` = [`PAUSE_IMAGE`], imported with [`BUSYBOX_IMAGE`]
//!   into the `k8s.io` namespace before the first sandbox.
//!
//! Pods must be given a cgroup parent under [`Containerd::cgroup_parent`]
//! (`/keelson-test-<suffix>`); [`Containerd::sandbox_config`] does that.
//!
//! Dropping the handle stops and removes every sandbox through CRI, stops
//! containerd (by PID), kills whatever of the instance still runs (shims,
//! container processes in its cgroups), unmounts everything under its dir,
//! removes its cgroups, CNI cache entries and shim sockets, the dir and the
//! namespace. A run that was killed before it could do so is cleaned up by
//! the next [`Containerd::start`] (instances whose owner process is gone).

mod cleanup;
mod config;
mod packages;

use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::Duration;

use keelson_cri::{CriError, RuntimeClient, api};

use crate::images::{self, BUSYBOX_IMAGE, ImageError, PAUSE_IMAGE};
use crate::netns::{NetNs, NetNsError};
use crate::private_systemd::SystemdEntry;

use std::sync::atomic::{AtomicU32, Ordering};

static INSTANCE_COUNTER: AtomicU32 = AtomicU32::new(0);

pub use cleanup::{
    BASE_DIR, BaseLock, CGROUP_PREFIX, Instance, cni_cache_leftovers, identity_alive, mounts_under,
    process_identity, processes_mentioning, remove_stale_instances,
};
pub use config::{Layout, cni_conflist, containerd_toml};

/// What went wrong starting the harness.
#[derive(Debug, thiserror::Error)]
pub enum HarnessError {
    /// Installing the Debian packages failed.
    #[error("installing packages: {0}")]
    Packages(String),
    /// A blocking helper task panicked or was cancelled.
    #[error("background task failed: {0}")]
    Task(String),
    /// A file operation failed.
    #[error("{context}: {source}")]
    Io {
        /// What we were doing.
        context: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// Creating the network namespace failed.
    #[error(transparent)]
    Netns(#[from] NetNsError),
    /// Building or importing an image failed.
    #[error(transparent)]
    Image(#[from] ImageError),
    /// containerd did not come up; the tail of its log is included.
    #[error("containerd did not start: {reason}\n--- containerd log (tail) ---\n{log}")]
    Startup {
        /// What was seen.
        reason: String,
        /// The end of containerd's log.
        log: String,
    },
    /// A CRI call failed.
    #[error(transparent)]
    Cri(#[from] CriError),
}

fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> HarnessError {
    let context = context.into();
    move |source| HarnessError::Io { context, source }
}

/// Settings of [`Containerd::start_with`].
#[derive(Debug, Clone)]
pub struct ContainerdOptions {
    /// The pod subnet of the bridge network (IPv4 CIDR); `.1` is the
    /// bridge (gateway).
    pub pod_cidr: String,
    /// Deadline of the harness's own CRI client.
    pub request_timeout: Duration,
    /// Run containerd inside a private systemd's namespaces with runc's
    /// `systemd` cgroup driver (`SystemdCgroup = true`); see
    /// [`crate::private_systemd`].
    pub systemd: Option<SystemdEntry>,
    /// The sandbox image instead of [`PAUSE_IMAGE`] (it must be among
    /// [`ContainerdOptions::extra_images`]).
    pub sandbox_image: Option<String>,
    /// Chain CNI's `portmap` after the bridge ([`Layout::host_ports`]).
    pub host_ports: bool,
    /// Images imported beside the test images before the first sandbox.
    pub extra_images: Vec<images::BuiltImage>,
}

impl Default for ContainerdOptions {
    fn default() -> Self {
        ContainerdOptions {
            pod_cidr: "10.244.0.0/24".to_string(),
            request_timeout: Duration::from_secs(60),
            systemd: None,
            sandbox_image: None,
            host_ports: false,
            extra_images: Vec::new(),
        }
    }
}

/// A running private containerd; everything is removed on drop.
pub struct Containerd {
    instance: Instance,
    child: Option<Child>,
    client: RuntimeClient,
    pod_cidr: String,
    systemd: Option<SystemdEntry>,
    // Dropped last: deleting the namespace removes the bridge and veths.
    netns: NetNs,
}

impl std::fmt::Debug for Containerd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Containerd")
            .field("dir", &self.instance.dir)
            .field("netns", &self.netns.name())
            .finish()
    }
}

impl Containerd {
    /// Starts a private containerd with default options.
    pub async fn start() -> Result<Containerd, HarnessError> {
        Self::start_with(ContainerdOptions::default()).await
    }

    /// Starts a private containerd.
    pub async fn start_with(options: ContainerdOptions) -> Result<Containerd, HarnessError> {
        tokio::task::spawn_blocking(packages::ensure_installed)
            .await
            .map_err(|e| HarnessError::Task(e.to_string()))?
            .map_err(HarnessError::Packages)?;
        let instance = tokio::task::spawn_blocking(register_instance)
            .await
            .map_err(|e| HarnessError::Task(e.to_string()))??;

        // From here on a failure drops `partial`, which cleans up.
        let mut partial = Partial {
            instance: instance.clone(),
            child: None,
            netns: None,
            armed: true,
        };
        let netns = NetNs::create("kctd")?;
        write(&instance.dir.join("netns"), netns.name())?;
        partial.netns = Some(netns);
        let network = instance.network();
        let layout = Layout {
            dir: &instance.dir,
            network: &network,
            pod_cidr: &options.pod_cidr,
            sandbox_image: options.sandbox_image.as_deref().unwrap_or(PAUSE_IMAGE),
            systemd_cgroup: options.systemd.is_some(),
            host_ports: options.host_ports,
        };
        for sub in [
            "root", "state", "cni", "images", "opt", "runc", "ipam", "pod-logs",
        ] {
            std::fs::create_dir_all(instance.dir.join(sub))
                .map_err(io(format!("creating {sub}")))?;
        }
        let config_path = instance.dir.join("config.toml");
        write(&config_path, &containerd_toml(&layout))?;
        write(
            &instance.dir.join("cni/10-keelson.conflist"),
            &cni_conflist(&layout),
        )?;

        let image_dir = instance.dir.join("images");
        let built = tokio::task::spawn_blocking(move || images::build_all(&image_dir))
            .await
            .map_err(|e| HarnessError::Task(e.to_string()))??;

        let log_path = instance.dir.join("containerd.log");
        let netns_ref = partial
            .netns
            .as_ref()
            .ok_or_else(|| HarnessError::Startup {
                reason: "namespace vanished".into(),
                log: String::new(),
            })?;
        partial.child = Some(spawn_containerd(
            netns_ref,
            &instance,
            options.systemd.as_ref(),
        )?);

        let client = match partial.child.as_mut() {
            Some(child) => wait_until_ready(child, &instance, &options).await?,
            None => unreachable_child(),
        };
        let socket = instance.socket();
        for image in built.iter().chain(&options.extra_images) {
            let archive = image.archive.clone();
            let socket = socket.clone();
            tokio::task::spawn_blocking(move || images::import(&archive, &socket))
                .await
                .map_err(|e| HarnessError::Task(e.to_string()))??;
        }
        let sandbox = options.sandbox_image.as_deref().unwrap_or(PAUSE_IMAGE);
        for name in [PAUSE_IMAGE, BUSYBOX_IMAGE, sandbox] {
            if client
                .image_status(keelson_cri::image_spec(name))
                .await?
                .is_none()
            {
                return Err(HarnessError::Startup {
                    reason: format!("image {name} not visible through CRI after import"),
                    log: tail(&log_path),
                });
            }
        }
        let (child, netns) = partial.disarm();
        Ok(Containerd {
            instance,
            child,
            client,
            pod_cidr: options.pod_cidr,
            systemd: options.systemd,
            netns,
        })
    }

    /// Stops containerd (SIGTERM, then SIGKILL) and leaves it down, as a
    /// crashed or stopped runtime: pods keep running in their shims, CRI
    /// calls fail. [`Containerd::restart`] starts it again.
    pub fn stop(&mut self) {
        stop_child(self.child.take());
    }

    /// Restarts containerd (SIGTERM, wait, start again on the same root,
    /// state and socket), as an upgrade or a crash-restart would. Pods keep
    /// running (their shims survive); clients reconnect on their next call.
    pub async fn restart(&mut self) -> Result<(), HarnessError> {
        stop_child(self.child.take());
        let mut child = spawn_containerd(&self.netns, &self.instance, self.systemd.as_ref())?;
        let options = ContainerdOptions {
            pod_cidr: self.pod_cidr.clone(),
            systemd: self.systemd.clone(),
            ..ContainerdOptions::default()
        };
        let ready = wait_until_ready(&mut child, &self.instance, &options).await;
        self.child = Some(child);
        ready.map(drop)
    }

    /// The containerd socket path.
    pub fn socket_path(&self) -> PathBuf {
        self.instance.socket()
    }

    /// The CRI endpoint (`unix:///...`), for keelson's config.
    pub fn endpoint(&self) -> String {
        format!("unix://{}", self.instance.socket().display())
    }

    /// A CRI client connected to this containerd.
    pub fn client(&self) -> &RuntimeClient {
        &self.client
    }

    /// The network namespace containerd (and so the CNI bridge and the pod
    /// veths) lives in. Pod IPs are reachable from here.
    pub fn netns(&self) -> &NetNs {
        &self.netns
    }

    /// The cgroup every pod of this instance must live under
    /// (`/keelson-test-<suffix>`); removed on drop.
    pub fn cgroup_parent(&self) -> String {
        self.instance.cgroup_parent()
    }

    /// The pod subnet of the bridge network.
    pub fn pod_cidr(&self) -> &str {
        &self.pod_cidr
    }

    /// The instance directory (root, state, config, log).
    pub fn dir(&self) -> &Path {
        &self.instance.dir
    }

    /// The instance (for leftover checks after drop).
    pub fn instance(&self) -> &Instance {
        &self.instance
    }

    /// containerd's log file.
    pub fn log_path(&self) -> PathBuf {
        self.instance.dir.join("containerd.log")
    }

    /// A directory for pod logs (`log_directory` of sandboxes).
    pub fn pod_log_root(&self) -> PathBuf {
        self.instance.dir.join("pod-logs")
    }

    /// Imports an OCI archive into the `k8s.io` namespace.
    pub fn import_image(&self, archive: &Path) -> Result<(), HarnessError> {
        images::import(archive, &self.instance.socket())?;
        Ok(())
    }

    /// A sandbox config for pod `namespace/name` with the given uid: cgroup
    /// parent under this instance's, log directory under its dir, and the
    /// usual kubelet labels.
    pub fn sandbox_config(&self, namespace: &str, name: &str, uid: &str) -> api::PodSandboxConfig {
        let log_directory = self
            .pod_log_root()
            .join(format!("{namespace}_{name}_{uid}"));
        let labels = [
            ("io.kubernetes.pod.name", name),
            ("io.kubernetes.pod.namespace", namespace),
            ("io.kubernetes.pod.uid", uid),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        api::PodSandboxConfig {
            metadata: Some(api::PodSandboxMetadata {
                name: name.to_string(),
                uid: uid.to_string(),
                namespace: namespace.to_string(),
                attempt: 0,
            }),
            hostname: name.to_string(),
            log_directory: log_directory.display().to_string(),
            labels,
            linux: Some(api::LinuxPodSandboxConfig {
                cgroup_parent: format!("{}/pod{uid}", self.cgroup_parent()),
                ..Default::default()
            }),
            ..Default::default()
        }
    }
}

/// Under the base lock: removes stale instances (owners gone) and creates
/// ours with its owner file, so no concurrent cleaner can take it for stale.
fn register_instance() -> Result<Instance, HarnessError> {
    let _lock = BaseLock::acquire().map_err(io(format!("locking {BASE_DIR}")))?;
    remove_stale_instances();
    let instance = loop {
        // pid + a per-process counter: unique among live processes.
        let n = INSTANCE_COUNTER.fetch_add(1, Ordering::Relaxed);
        let candidate = Instance::new(&format!("{}-{n}", std::process::id()));
        if !candidate.dir.exists() {
            break candidate;
        }
        // Same name: a leftover of an earlier process that had our pid
        // (a live owner would be us, and we never reuse a counter value).
        if !candidate.owner_alive() {
            candidate.remove_stale();
            break candidate;
        }
    };
    std::fs::create_dir_all(&instance.dir)
        .map_err(io(format!("creating {}", instance.dir.display())))?;
    let owner = cleanup::process_identity(std::process::id()).unwrap_or_default();
    write(&instance.dir.join("owner"), &owner)?;
    Ok(instance)
}

fn write(path: &Path, content: &str) -> Result<(), HarnessError> {
    std::fs::write(path, content).map_err(io(format!("writing {}", path.display())))
}

fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}

async fn wait_until_ready(
    child: &mut Child,
    instance: &Instance,
    options: &ContainerdOptions,
) -> Result<RuntimeClient, HarnessError> {
    let socket = instance.socket();
    let log_path = instance.dir.join("containerd.log");
    let endpoint = format!("unix://{}", socket.display());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let mut last = String::from("socket not there yet");
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(HarnessError::Startup {
                reason: format!("containerd exited: {status}"),
                log: tail(&log_path),
            });
        }
        if socket.exists() {
            match RuntimeClient::connect(&endpoint, options.request_timeout).await {
                Ok(client) => match client.status().await {
                    Ok(status) => {
                        let ready = |kind| {
                            keelson_cri::runtime_condition(&status, kind).is_some_and(|c| c.status)
                        };
                        if ready(keelson_cri::RUNTIME_READY) && ready(keelson_cri::NETWORK_READY) {
                            return Ok(client);
                        }
                        last = format!("not ready yet: {:?}", status.conditions);
                    }
                    Err(e) => last = e.to_string(),
                },
                Err(e) => last = e.to_string(),
            }
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(HarnessError::Startup {
                reason: format!("CRI not ready after 30s: {last}"),
                log: tail(&log_path),
            });
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A half-started instance: cleaned up on drop unless disarmed.
struct Partial {
    instance: Instance,
    child: Option<Child>,
    netns: Option<NetNs>,
    armed: bool,
}

impl Partial {
    fn disarm(mut self) -> (Option<Child>, NetNs) {
        let child = self.child.take();
        let netns = self.netns.take();
        self.armed = false;
        match netns {
            Some(ns) => (child, ns),
            // Unreachable: start() only disarms with a namespace present.
            None => unreachable_netns(),
        }
    }
}

fn unreachable_child() -> ! {
    panic!("containerd harness: containerd child missing right after spawning it")
}

/// Starts containerd with the instance's config inside `netns`, its output
/// appended to the instance's log; records its pid.
fn spawn_containerd(
    netns: &NetNs,
    instance: &Instance,
    systemd: Option<&SystemdEntry>,
) -> Result<Child, HarnessError> {
    let log_path = instance.dir.join("containerd.log");
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .map_err(io("opening containerd.log"))?;
    let log_err = log.try_clone().map_err(io("cloning log handle"))?;
    let mut command = match systemd {
        Some(entry) => entry.command(&netns.path(), "containerd"),
        None => netns.command("containerd"),
    };
    let child = command
        .arg("--config")
        .arg(instance.dir.join("config.toml"))
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(log_err)
        .spawn()
        .map_err(io("spawning containerd"))?;
    write(
        &instance.dir.join("containerd.pid"),
        &child.id().to_string(),
    )?;
    Ok(child)
}

fn unreachable_netns() -> ! {
    panic!("containerd harness: network namespace missing at the end of start")
}

impl Drop for Partial {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        stop_child(self.child.take());
        self.instance.kill_processes(Duration::from_secs(10));
        self.instance.remove_everything_else();
        // The namespace is deleted when `self.netns` drops.
    }
}

fn stop_child(child: Option<Child>) {
    let Some(mut child) = child else { return };
    if let Ok(pid) = i32::try_from(child.id()) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGTERM,
        );
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        match child.try_wait() {
            Ok(Some(_)) => return,
            Ok(None) if std::time::Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20));
            }
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return;
            }
        }
    }
}

/// Stops and removes every sandbox (and so every container) through CRI,
/// on a thread of its own (drop may run inside an async runtime).
fn remove_all_pods(endpoint: String) {
    let work = move || {
        let Ok(rt) = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        else {
            return;
        };
        rt.block_on(async move {
            let Ok(cri) = RuntimeClient::connect(&endpoint, Duration::from_secs(30)).await else {
                return;
            };
            if let Ok(pods) = cri.list_pod_sandbox(None).await {
                for pod in pods {
                    if let Err(e) = cri.stop_pod_sandbox(&pod.id).await {
                        eprintln!("warning: stopping sandbox {}: {e}", pod.id);
                    }
                    if let Err(e) = cri.remove_pod_sandbox(&pod.id).await {
                        eprintln!("warning: removing sandbox {}: {e}", pod.id);
                    }
                }
            }
        });
    };
    if std::thread::spawn(work).join().is_err() {
        eprintln!("warning: CRI cleanup thread panicked");
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        remove_all_pods(self.endpoint());
        stop_child(self.child.take());
        self.instance.kill_processes(Duration::from_secs(10));
        self.instance.remove_everything_else();
        // `self.netns` drops after this, deleting the namespace.
    }
}

/// Waits (30 s at most) until container `id` has exited and returns its
/// status; panics otherwise (for tests).
pub async fn wait_container_exited(cri: &RuntimeClient, id: &str) -> api::ContainerStatus {
    crate::support::wait_for(
        "container to exit",
        Duration::from_secs(30),
        Duration::from_millis(50),
        || async {
            let st = cri
                .container_status(id, false)
                .await
                .map_err(|e| e.to_string())?
                .status
                .ok_or("no status")?;
            if st.state == api::ContainerState::ContainerExited as i32 {
                Ok(st)
            } else {
                Err(format!("state {}", st.state))
            }
        },
    )
    .await
    .expect("container exited")
}
