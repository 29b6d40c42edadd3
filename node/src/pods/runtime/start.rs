//! Starting one container (kubelet's `startContainer` and
//! `generateContainerConfig`): image, restart count, environment, mounts
//! (volumes, /etc/hosts, termination log), command expansion, resources and
//! security context, CreateContainer, StartContainer, the legacy log
//! symlink and the postStart hook.

use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Pod, Secret};
use keelson_cri::api;

use super::actions::KillReason;
use super::dns::{DnsError, pod_hostname};
use super::env::{EnvInputs, EnvironmentError, expand_command_and_args, make_environment};
use super::errors::{
    CREATE_CONTAINER_CONFIG_ERROR, CREATE_CONTAINER_ERROR, POST_START_HOOK_ERROR,
    RUN_CONTAINER_ERROR, StepError, cri_message,
};
use super::hosts::{HostsFileError, ensure_hosts_file};
use super::linux_resources::container_resources;
use super::manager::RuntimeManager;
use super::sandbox::container_logs_dir;
use super::security::{NonRootError, container_security_context, verify_run_as_non_root};
use super::status::RuntimePodStatus;
use super::sync::legacy_log_name;
use crate::pod::labels::{new_container_annotations, new_container_labels};
use crate::pod::podutil;
use crate::pods::events as reasons;
use keelson_common::events::EventType;

/// kubelet's `calcRestartCountByLogDir`: one more than the highest
/// `<n>.log` in the container's log directory (0 when none).
pub fn restart_count_from_log_dir(dir: &Path) -> i32 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let mut best = 0;
    for e in entries.flatten() {
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        let name = e.file_name().to_string_lossy().into_owned();
        let digits: String = name.chars().take_while(char::is_ascii_digit).collect();
        if digits.is_empty() || !name[digits.len()..].starts_with(".log") {
            continue;
        }
        if let Ok(n) = digits.parse::<i32>() {
            best = best.max(n.saturating_add(1));
        }
    }
    best
}

/// An ephemeral container's `targetContainerName`: where the pod does not
/// share one process namespace (pid mode CONTAINER), the container joins
/// its target's, as `generateLinuxContainerConfig`
/// (pkg/kubelet/kuberuntime/kuberuntime_container_linux.go) sets
/// `NamespaceMode_TARGET` and `TargetId`; with `shareProcessNamespace` or
/// `hostPID` the pod's mode stays.
pub fn target_process_namespace(
    mut sc: api::LinuxContainerSecurityContext,
    ns_target: Option<&str>,
) -> api::LinuxContainerSecurityContext {
    if let Some(id) = ns_target
        && let Some(ns) = sc.namespace_options.as_mut()
        && ns.pid == api::NamespaceMode::Container as i32
    {
        ns.pid = api::NamespaceMode::Target as i32;
        ns.target_id = id.to_string();
    }
    sc
}

/// Why a container's config could not be generated: the
/// `CreateContainerConfigError` message, in kubelet's words
/// (`generateContainerConfig`).
#[derive(Debug, thiserror::Error)]
pub(crate) enum ContainerConfigError {
    /// The device plugins could not prepare the container's devices.
    #[error(transparent)]
    Devices(#[from] crate::devices::DeviceError),
    /// The environment could not be built.
    #[error(transparent)]
    Environment(#[from] EnvironmentError),
    /// The image's user could not be read.
    #[error("failed to get image status {image}: {error}")]
    ImageStatus {
        /// The image reference.
        image: String,
        /// Why.
        error: keelson_cri::CriError,
    },
    /// `runAsNonRoot` refuses the image's user.
    #[error(transparent)]
    NonRoot(#[from] NonRootError),
    /// The container's log directory could not be created.
    #[error("create container log directory for container {container} failed: {error}")]
    LogDir {
        /// The container.
        container: String,
        /// Why.
        error: std::io::Error,
    },
    /// The volumes' mounts could not be made.
    #[error(transparent)]
    Mounts(#[from] crate::pods::deps::PodVolumesError),
    /// The host name for /etc/hosts could not be formed.
    #[error(transparent)]
    Hostname(#[from] DnsError),
    /// /etc/hosts could not be written.
    #[error(transparent)]
    HostsFile(#[from] HostsFileError),
}

impl RuntimeManager {
    /// Starts `c` in the sandbox; returns the time spent pulling its image.
    /// `target`: the `targetContainerName` of an ephemeral container, whose
    /// process namespace `c` joins.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn start_container(
        &self,
        sandbox_id: &str,
        sandbox_config: &api::PodSandboxConfig,
        c: &Container,
        target: Option<&str>,
        pod: &Pod,
        status: &RuntimePodStatus,
        pull_secrets: &[Secret],
        pod_ip: &str,
        pod_ips: &[String],
    ) -> Result<Duration, StepError> {
        let ensured = match self
            .images
            .ensure_image_exists(pod, c, pull_secrets, Some(sandbox_config))
            .await
        {
            Ok(e) => e,
            Err(e) => {
                self.events.container(
                    pod,
                    &c.name,
                    "",
                    EventType::Warning,
                    reasons::FAILED,
                    format!("Error: {}", e.reason),
                );
                return Err(e);
            }
        };
        let restart_count = match status.find_container(&c.name) {
            Some(s) => s.restart_count + 1,
            None => restart_count_from_log_dir(&container_logs_dir(
                &self.settings.pod_logs_root,
                pod,
                &c.name,
            )),
        };
        // `getTargetID` (kuberuntime_container.go): the target must be
        // known to the runtime; its newest instance is the one joined.
        let ns_target = match target {
            None => None,
            Some(t) => match status.find_container(t) {
                Some(s) => Some(s.id.clone()),
                None => {
                    let msg = format!("unable to find target container {t}");
                    self.events.container(
                        pod,
                        &c.name,
                        "",
                        EventType::Warning,
                        reasons::FAILED,
                        format!("Error: {msg}"),
                    );
                    return Err(StepError::new(CREATE_CONTAINER_CONFIG_ERROR, msg));
                }
            },
        };
        let config = match self
            .generate_container_config(
                c,
                pod,
                restart_count,
                pod_ip,
                pod_ips,
                &ensured.image_ref,
                ns_target.as_deref(),
            )
            .await
        {
            Ok(cfg) => cfg,
            Err(msg) => {
                self.events.container(
                    pod,
                    &c.name,
                    "",
                    EventType::Warning,
                    reasons::FAILED,
                    format!("Error: {msg}"),
                );
                return Err(StepError::new(CREATE_CONTAINER_CONFIG_ERROR, msg));
            }
        };
        let log_path = config.log_path.clone();
        let id = match self
            .metrics
            .runtime_op(
                "create_container",
                self.cri
                    .create_container(sandbox_id, config, sandbox_config.clone()),
            )
            .await
        {
            Ok(id) => id,
            Err(e) => {
                let msg = cri_message(&e);
                self.events.container(
                    pod,
                    &c.name,
                    "",
                    EventType::Warning,
                    reasons::FAILED,
                    format!("Error: {msg}"),
                );
                return Err(StepError::new(CREATE_CONTAINER_ERROR, msg));
            }
        };
        // kubelet records what it gave the container (in-place resize).
        self.set_actuated_container(pod, c);
        self.events.container(
            pod,
            &c.name,
            &id,
            EventType::Normal,
            reasons::CREATED,
            // kuberuntime_container.go v1.36: the container is the event's
            // object, no longer named in the message.
            "Container created".to_string(),
        );
        if let Err(e) = self
            .metrics
            .runtime_op("start_container", self.cri.start_container(&id))
            .await
        {
            let msg = cri_message(&e);
            self.events.container(
                pod,
                &c.name,
                &id,
                EventType::Warning,
                reasons::FAILED,
                format!("Error: {msg}"),
            );
            return Err(StepError::new(RUN_CONTAINER_ERROR, msg));
        }
        self.events.container(
            pod,
            &c.name,
            &id,
            EventType::Normal,
            reasons::STARTED,
            "Container started".to_string(),
        );
        if let Some(dir) = &self.settings.legacy_log_dir {
            let target = Path::new(&sandbox_config.log_directory).join(&log_path);
            let name = legacy_log_name(podutil::name(pod), podutil::namespace(pod), &c.name, &id);
            if let Some(name) = name
                && (target.exists() || tokio::fs::metadata(&target).await.is_ok())
            {
                let link = dir.join(name);
                let _ = tokio::fs::create_dir_all(dir).await;
                if let Err(e) = tokio::fs::symlink(&target, &link).await
                    && e.kind() != std::io::ErrorKind::AlreadyExists
                {
                    tracing::warn!(path = %link.display(), error = %e, "failed to create legacy log symlink");
                }
            }
        }
        if let Some(post_start) = c.lifecycle.as_ref().and_then(|l| l.post_start.as_ref())
            && let Err(msg) = self.hooks.run(pod, c, &id, post_start, pod_ip).await
        {
            tracing::warn!(pod = %podutil::key(pod), container = %c.name, error = %msg, "postStart hook failed");
            self.events.container(
                pod,
                &c.name,
                &id,
                EventType::Warning,
                reasons::FAILED_POST_START_HOOK,
                "PostStartHook failed",
            );
            if let Err(e) = self
                .kill_container(
                    pod,
                    &id,
                    &c.name,
                    "FailedPostStartHook",
                    KillReason::FailedPostStartHook,
                    None,
                    None,
                )
                .await
            {
                tracing::warn!(pod = %podutil::key(pod), container = %c.name, error = %e, "killing container after a failed postStart hook failed");
            }
            return Err(StepError::new(POST_START_HOOK_ERROR, msg));
        }
        Ok(ensured.pulled_for)
    }

    /// kubelet's `generateContainerConfig`; the error text becomes the
    /// `CreateContainerConfigError` message. `ns_target`: the runtime id of
    /// the container whose process namespace an ephemeral container joins.
    #[allow(clippy::too_many_arguments)]
    async fn generate_container_config(
        &self,
        c: &Container,
        pod: &Pod,
        restart_count: i32,
        _pod_ip: &str,
        pod_ips: &[String],
        image_ref: &str,
        ns_target: Option<&str>,
    ) -> Result<api::ContainerConfig, ContainerConfigError> {
        // The container manager's `GetResources`: the device plugins'
        // devices, mounts, environment and annotations for this container
        // (`GetDeviceRunContainerOptions`, which calls PreStartContainer).
        let device_opts = match &self.devices {
            Some(d) => {
                let is_init = podutil::spec(pod)
                    .init_containers
                    .iter()
                    .flatten()
                    .any(|i| i.name == c.name);
                let restartable = c.restart_policy.as_deref() == Some("Always");
                d.run_container_options(pod, c, is_init, restartable)
                    .await?
                    .unwrap_or_default()
            }
            None => Default::default(),
        };
        let ns = podutil::namespace(pod);
        let links = podutil::spec(pod).enable_service_links.unwrap_or(true);
        let service_env = self.services.service_env(ns, links);
        let allocatable = (self.allocatable)();
        let env = make_environment(&EnvInputs {
            pod,
            container: c,
            pod_ips,
            host_ips: &self.settings.node_ips,
            service_env: service_env.as_ref(),
            sources: self.env.as_ref(),
            allocatable: &allocatable,
        })
        .await?;
        for m in &env.invalid_key_messages {
            self.events.pod(
                pod,
                EventType::Warning,
                reasons::INVALID_ENVIRONMENT_VARIABLE_NAMES,
                m.clone(),
            );
        }
        // The image's user, for runAsNonRoot and runAsUserName.
        let (image_uid, image_username) = match self
            .cri
            .image_status(keelson_cri::image_spec(image_ref))
            .await
        {
            Ok(Some(img)) => (img.uid.map(|u| u.value), img.username),
            Ok(None) => (None, String::new()),
            Err(error) => {
                return Err(ContainerConfigError::ImageStatus {
                    image: image_ref.to_string(),
                    error,
                });
            }
        };
        verify_run_as_non_root(pod, c, image_uid, &image_username)?;

        let (command, args) = expand_command_and_args(c, &env);
        let log_dir = container_logs_dir(&self.settings.pod_logs_root, pod, &c.name);
        tokio::fs::create_dir_all(&log_dir).await.map_err(|error| {
            ContainerConfigError::LogDir {
                container: c.name.clone(),
                error,
            }
        })?;

        let env_pairs: Vec<(String, String)> = env.vars.clone();
        // Device mounts first, then the volumes (`GenerateRunContainerOptions`).
        let mut mounts: Vec<api::Mount> = device_opts
            .mounts
            .iter()
            .map(|(container_path, host_path, readonly)| api::Mount {
                container_path: container_path.clone(),
                host_path: host_path.clone(),
                readonly: *readonly,
                ..Default::default()
            })
            .collect();
        mounts.extend(self.volumes.container_mounts(pod, c, &env_pairs).await?);
        let pod_dir = self.volumes.pod_dir(podutil::uid(pod));
        let mounts_etc_hosts = c
            .volume_mounts
            .iter()
            .flatten()
            .any(|m| m.mount_path == "/etc/hosts");
        if !pod_ips.is_empty() && !mounts_etc_hosts {
            let (hostname, domain) = pod_hostname(pod, &self.settings.dns.cluster_domain)?;
            let short = hostname.split('.').next().unwrap_or(&hostname).to_string();
            mounts.push(ensure_hosts_file(&pod_dir, pod, pod_ips, &short, &domain)?);
        }
        if let Some(path) = c
            .termination_message_path
            .as_deref()
            .filter(|p| !p.is_empty())
        {
            let dir = pod_dir.join("containers").join(&c.name);
            let file = dir.join(format!("{:08x}", rand::random::<u32>()));
            let created = async {
                tokio::fs::create_dir_all(&dir).await?;
                tokio::fs::write(&file, b"").await?;
                use std::os::unix::fs::PermissionsExt;
                tokio::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o666)).await
            }
            .await;
            match created {
                Ok(()) => mounts.push(api::Mount {
                    container_path: path.to_string(),
                    host_path: file.display().to_string(),
                    ..Default::default()
                }),
                Err(e) => {
                    tracing::warn!(path = %file.display(), error = %e, "error on creating termination-log file")
                }
            }
        }

        let resources = container_resources(
            pod,
            c,
            self.settings.quota,
            self.settings.memory_capacity,
            &self.settings.linux_host,
        );
        Ok(api::ContainerConfig {
            metadata: Some(api::ContainerMetadata {
                name: c.name.clone(),
                attempt: u32::try_from(restart_count).unwrap_or(0),
            }),
            image: Some(api::ImageSpec {
                image: image_ref.to_string(),
                user_specified_image: c.image.clone().unwrap_or_default(),
                ..Default::default()
            }),
            command,
            args,
            working_dir: c.working_dir.clone().unwrap_or_default(),
            // The devices' variables come before the container's own.
            envs: device_opts
                .envs
                .into_iter()
                .chain(env.vars)
                .map(|(key, value)| api::KeyValue { key, value })
                .collect(),
            mounts,
            devices: device_opts
                .devices
                .into_iter()
                .map(|(container_path, host_path, permissions)| api::Device {
                    container_path,
                    host_path,
                    permissions,
                })
                .collect(),
            labels: new_container_labels(c, pod),
            annotations: {
                // kubelet's own annotations win over the devices'.
                let mut a = new_container_annotations(c, pod, restart_count);
                for (k, v) in device_opts.annotations {
                    a.entry(k).or_insert(v);
                }
                a
            },
            log_path: format!("{}/{restart_count}.log", c.name),
            stdin: c.stdin.unwrap_or(false),
            stdin_once: c.stdin_once.unwrap_or(false),
            tty: c.tty.unwrap_or(false),
            linux: Some(api::LinuxContainerConfig {
                resources: Some(resources),
                security_context: Some(target_process_namespace(
                    container_security_context(pod, c, &image_username, &self.settings.seccomp),
                    ns_target,
                )),
            }),
            windows: None,
            cdi_devices: device_opts
                .cdi_devices
                .into_iter()
                .map(|name| api::CdiDevice { name })
                .collect(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ephemeral_container_joins_its_targets_process_namespace() {
        let sc = |pid: api::NamespaceMode| api::LinuxContainerSecurityContext {
            namespace_options: Some(api::NamespaceOption {
                pid: pid as i32,
                ..Default::default()
            }),
            ..Default::default()
        };
        let ns = |s: api::LinuxContainerSecurityContext| {
            let n = s.namespace_options.expect("namespaces");
            (n.pid, n.target_id)
        };
        let target = api::NamespaceMode::Target as i32;
        assert_eq!(
            ns(target_process_namespace(
                sc(api::NamespaceMode::Container),
                Some("abc")
            )),
            (target, "abc".to_string())
        );
        // No target: the container's own namespace.
        assert_eq!(
            ns(target_process_namespace(
                sc(api::NamespaceMode::Container),
                None
            ))
            .0,
            api::NamespaceMode::Container as i32
        );
        // shareProcessNamespace (POD) and hostPID (NODE) stay.
        for mode in [api::NamespaceMode::Pod, api::NamespaceMode::Node] {
            assert_eq!(
                ns(target_process_namespace(sc(mode), Some("abc"))),
                (mode as i32, String::new())
            );
        }
    }

    #[test]
    fn restart_count_from_logs() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert_eq!(restart_count_from_log_dir(&dir.path().join("missing")), 0);
        for f in ["0.log", "3.log", "2.log.20240101-000000", "x.log", "7.txt"] {
            std::fs::write(dir.path().join(f), "").expect("w");
        }
        assert_eq!(restart_count_from_log_dir(dir.path()), 4);
    }
}
