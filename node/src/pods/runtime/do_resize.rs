//! Carrying out an in-place resize (kubelet's `doPodResizeAction`,
//! `validateMemoryResizeAction`, `updatePodContainerResources`,
//! `updateContainerResources`): the pod cgroup and the containers' CRI
//! resources, memory then CPU, in an order that never lets a container's
//! limit exceed its pod's; a memory limit below current usage is refused
//! up front. CRI `UpdatePodSandboxResources` is not sent: the bindings
//! keelson uses predate it, and kubelet treats it as best effort
//! (containerd before 2.2 does not implement it).

use k8s_openapi::api::core::v1::{Container, Pod, ResourceRequirements};

use super::linux_resources::container_resources;
use super::manager::RuntimeManager;
use super::resize::{
    ContainerUpdate, ResizeActions, Resource, container_for_update, effective_limits,
};
use crate::cgroups::{CgroupError, ResourceConfig};
use crate::pod::podutil;

/// The memory of a cgroup setting, unlimited as `i64::MAX`.
fn memory_of(r: &ResourceConfig) -> i64 {
    match r.memory {
        Some(m) if m > 0 && m < (i64::MAX / 4096) * 4096 => m,
        _ => i64::MAX,
    }
}

/// Why an in-place resize failed: the `ResizePodInPlaceError` message, in
/// kubelet's words (`doPodResizeAction`, `validateMemoryResizeAction`).
#[derive(Debug, thiserror::Error)]
pub enum ResizeError {
    /// UpdateContainerResources failed.
    #[error("container {container:?} updateContainerResources failed: {error}")]
    UpdateContainer {
        /// `<runtime>://<id>`.
        container: String,
        /// The CRI error as Go's gRPC client prints it.
        error: String,
    },
    /// The sandbox's stats could not be read to check a memory decrease.
    #[error("unable to read memory usage for pod {0:?}")]
    MemoryUsage(String),
    /// A memory limit would go below what is in use.
    #[error("cannot decrease memory limits: {}", list(.0))]
    MemoryBelowUsage(Vec<String>),
    /// The pod cgroup could not be read.
    #[error("unable to get pod cgroup memory config for pod {0:?}")]
    ReadPodCgroup(String),
    /// The pod cgroup could not be written.
    #[error("failed to set pod cgroup config: {0}")]
    SetPodCgroup(CgroupError),
}

/// One reason as it is, several as Go prints a slice.
fn list(reasons: &[String]) -> String {
    match reasons {
        [one] => one.clone(),
        many => format!("[{}]", many.join(", ")),
    }
}

impl RuntimeManager {
    /// `setActuatedContainerResources`: the container's resources, limits
    /// completed from the pod level, recorded as actuated.
    pub(super) fn set_actuated_container(&self, pod: &Pod, c: &Container) {
        self.actuated
            .set_container(podutil::uid(pod), &c.name, actuated_record(pod, c));
    }

    /// `UpdateActuatedPodLevelResources`.
    pub fn set_actuated_pod_level(&self, pod: &Pod) {
        let Some(r) = podutil::spec(pod).resources.as_ref() else {
            return;
        };
        if r.requests.is_none() && r.limits.is_none() {
            return;
        }
        self.actuated
            .set_pod_level(podutil::uid(pod), Some(r.clone()));
    }

    /// `updateContainerResources`: UpdateContainerResources with the
    /// container's full linux resources, then the actuated record.
    async fn update_container_resources(
        &self,
        pod: &Pod,
        c: &Container,
        id: &str,
    ) -> Result<(), ResizeError> {
        let linux = container_resources(
            pod,
            c,
            self.settings.quota,
            self.settings.memory_capacity,
            &self.settings.linux_host,
        );
        self.metrics
            .runtime_op(
                "update_container",
                self.cri.update_container_resources(id, Some(linux)),
            )
            .await
            .map_err(|e| ResizeError::UpdateContainer {
                container: format!("{}://{id}", self.settings.runtime_name),
                error: super::errors::grpc_text(&e),
            })?;
        self.set_actuated_container(pod, c);
        Ok(())
    }

    /// `validateMemoryResizeAction`: no pod or container memory limit may
    /// go below what is in use now.
    async fn validate_memory_resize(
        &self,
        pod: &Pod,
        sandbox_id: &str,
        current: &ResourceConfig,
        desired: &ResourceConfig,
        resize: &ResizeActions,
    ) -> Result<(), ResizeError> {
        let pod_decreasing = desired
            .memory
            .is_some_and(|d| current.memory.is_none() || d < memory_of(current));
        let decreasing: Vec<(&str, i64)> = resize
            .memory
            .iter()
            .filter(|u| {
                u.desired.memory_limit != 0
                    && (u.current.memory_limit == 0
                        || u.desired.memory_limit < u.current.memory_limit)
            })
            .map(|u| (u.name.as_str(), u.desired.memory_limit))
            .collect();
        if !pod_decreasing && decreasing.is_empty() {
            return Ok(());
        }
        let stats = self
            .cri
            .pod_sandbox_stats(sandbox_id)
            .await
            .map_err(|_| ResizeError::MemoryUsage(podutil::format_pod(pod)))?;
        let linux = stats.linux.unwrap_or_default();
        let pod_usage = linux
            .memory
            .as_ref()
            .and_then(|m| m.usage_bytes.as_ref())
            .map(|v| v.value);
        let mut errs = Vec::new();
        if pod_decreasing {
            let limit = desired.memory.unwrap_or(0);
            match pod_usage {
                None => errs.push("missing pod memory usage".to_string()),
                Some(u) if u >= u64::try_from(limit).unwrap_or(0) => errs.push(format!(
                    "attempting to set pod memory limit ({limit}) below current usage ({u})"
                )),
                Some(_) => {}
            }
        }
        for cs in &linux.containers {
            let name = cs
                .attributes
                .as_ref()
                .and_then(|a| a.metadata.as_ref())
                .map(|m| m.name.as_str())
                .unwrap_or_default();
            let Some((_, limit)) = decreasing.iter().find(|(n, _)| *n == name) else {
                continue;
            };
            match cs.memory.as_ref().and_then(|m| m.usage_bytes.as_ref()) {
                None => errs.push(format!("missing container {name:?} memory usage")),
                // kubelet prints the pod's usage here.
                Some(u) if u.value >= u64::try_from(*limit).unwrap_or(0) => errs.push(format!(
                    "attempting to set container {name:?} memory limit ({limit}) below current usage ({})",
                    pod_usage.unwrap_or(0)
                )),
                Some(_) => {}
            }
        }
        if errs.is_empty() {
            Ok(())
        } else {
            Err(ResizeError::MemoryBelowUsage(errs))
        }
    }

    /// One resource's container updates, in the order given (decreases
    /// first); a container no longer in the spec is skipped.
    async fn update_containers(
        &self,
        pod: &Pod,
        updates: &[ContainerUpdate],
        r: Resource,
    ) -> Result<(), ResizeError> {
        for u in updates {
            let Some(c) = podutil::container_spec(pod, &u.name) else {
                continue;
            };
            let c = container_for_update(c, u, r);
            self.update_container_resources(pod, &c, &u.container_id)
                .await?;
        }
        Ok(())
    }

    /// `doPodResizeAction`; the error is the `ResizePodInPlace` failure.
    pub(super) async fn do_pod_resize(
        &self,
        pod: &Pod,
        sandbox_id: &str,
        resize: &ResizeActions,
    ) -> Result<(), ResizeError> {
        let cg = &self.cgroups;
        let name = cg.name_of(pod);
        let desired = cg.resources_of(pod);
        let fs = cg.qos().map(|q| q.fs().clone());
        // The pod cgroup as it is now, over what it should be.
        let mut current = desired;
        if let Some(fs) = &fs {
            let read = fs.read(&name).map_err(|e| {
                tracing::warn!(pod = %podutil::key(pod), error = %e, "unable to read the pod cgroup");
                ResizeError::ReadPodCgroup(podutil::format_pod(pod))
            })?;
            current.memory = read.memory.or(current.memory);
            current.cpu_shares = read.cpu_shares.or(current.cpu_shares);
            current.cpu_quota = read.cpu_quota.or(current.cpu_quota);
            current.cpu_period = read.cpu_period.or(current.cpu_period);
        }
        if !resize.memory.is_empty() || resize.update_pod_resources {
            self.validate_memory_resize(pod, sandbox_id, &current, &desired, resize)
                .await?;
        }
        let set_pod_cgroup = |r: Resource, limit: bool| -> Result<(), ResizeError> {
            let Some(fs) = &fs else { return Ok(()) };
            let mut rc = ResourceConfig::default();
            match (r, limit) {
                (Resource::Cpu, true) => {
                    rc.cpu_quota = desired.cpu_quota;
                    rc.cpu_period = desired.cpu_period;
                }
                (Resource::Cpu, false) => rc.cpu_shares = desired.cpu_shares,
                (Resource::Memory, true) => rc.memory = desired.memory,
                (Resource::Memory, false) => return Ok(()),
            }
            fs.update(&name, &rc).map_err(ResizeError::SetPodCgroup)
        };
        let all = resize.update_pod_resources || resize.update_pod_level;
        if !resize.memory.is_empty() || all {
            let cur = memory_of(&current);
            let new = desired
                .memory
                .map_or(cur, |m| if m > 0 { m } else { i64::MAX });
            if new > cur {
                set_pod_cgroup(Resource::Memory, true)?;
            }
            self.update_containers(pod, &resize.memory, Resource::Memory)
                .await?;
            if new < cur {
                set_pod_cgroup(Resource::Memory, true)?;
            }
        }
        if !resize.cpu.is_empty() || all {
            let cur_quota = current.cpu_quota.unwrap_or(-1);
            let new_quota = desired.cpu_quota.unwrap_or(cur_quota);
            // Compared as numbers, -1 (unlimited) included, as kubelet does.
            let cur_shares = current.cpu_shares.unwrap_or(2);
            let new_shares = desired.cpu_shares.unwrap_or(cur_shares);
            if new_quota > cur_quota {
                set_pod_cgroup(Resource::Cpu, true)?;
            }
            if new_shares > cur_shares {
                set_pod_cgroup(Resource::Cpu, false)?;
            }
            self.update_containers(pod, &resize.cpu, Resource::Cpu)
                .await?;
            if new_shares < cur_shares {
                set_pod_cgroup(Resource::Cpu, false)?;
            }
            if new_quota < cur_quota {
                set_pod_cgroup(Resource::Cpu, true)?;
            }
        }
        if resize.update_pod_level {
            self.set_actuated_pod_level(pod);
        }
        Ok(())
    }
}

/// The allocated resources of a container with the pod-level limits
/// filled in (what `setActuatedContainerResources` records).
pub fn actuated_record(pod: &Pod, c: &Container) -> ResourceRequirements {
    let mut r = c.resources.clone().unwrap_or_default();
    let limits = effective_limits(podutil::spec(pod).resources.as_ref(), c.resources.as_ref());
    r.limits = (!limits.is_empty()).then_some(limits);
    r
}
