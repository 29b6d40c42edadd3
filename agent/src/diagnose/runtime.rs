//! Read-only CRI lookups for diagnose: a pod's sandboxes and containers
//! (found by the pod UID label, as kubelet finds them), image presence,
//! and the runtime's own status. Only List/Status calls: nothing is
//! created, started, stopped or pulled.

use std::collections::HashMap;

use keelson_cri::{RuntimeClient, api};

use crate::node::pod::labels;

/// One sandbox of a pod.
#[derive(Debug, Clone)]
pub struct Sandbox {
    /// Its id.
    pub id: String,
    /// `SANDBOX_READY`.
    pub ready: bool,
    /// Creation time (ns since the epoch).
    pub created_at: i64,
    /// Its IP (empty for host-network pods and stopped sandboxes).
    pub ip: String,
}

/// One container instance of a pod.
#[derive(Debug, Clone)]
pub struct Instance {
    /// Its id.
    pub id: String,
    /// Container name.
    pub name: String,
    /// Attempt (restart count when it was created).
    pub attempt: u32,
    /// `CONTAINER_RUNNING`, `CONTAINER_EXITED`, ...
    pub state: String,
    /// Exit code, when exited.
    pub exit_code: i32,
    /// `OOMKilled`, `Error`, `Completed`.
    pub reason: String,
    /// Its log file.
    pub log_path: String,
    /// Finished at (ns since the epoch).
    pub finished_at: i64,
}

/// What the runtime holds for a pod.
#[derive(Debug, Clone, Default)]
pub struct PodRuntime {
    /// Sandboxes, newest first.
    pub sandboxes: Vec<Sandbox>,
    /// Container instances, newest attempt first.
    pub instances: Vec<Instance>,
}

impl PodRuntime {
    /// The newest ready sandbox.
    pub fn ready_sandbox(&self) -> Option<&Sandbox> {
        self.sandboxes.iter().find(|s| s.ready)
    }

    /// The instances of container `name`, newest first.
    pub fn of(&self, name: &str) -> impl Iterator<Item = &Instance> {
        self.instances.iter().filter(move |i| i.name == name)
    }
}

fn state_name(s: i32) -> String {
    api::ContainerState::try_from(s)
        .map(|s| s.as_str_name().to_string())
        .unwrap_or_else(|_| format!("state {s}"))
}

/// Why the container runtime gave no answer.
#[derive(Debug, Clone, thiserror::Error)]
pub enum RuntimeError {
    /// No runtime endpoint in the configuration.
    #[error("no container runtime endpoint configured")]
    NotConfigured,
    /// The runtime's call failed.
    #[error(transparent)]
    Cri(#[from] keelson_cri::CriError),
}

/// A pod's sandboxes and containers.
pub async fn pod_runtime(cri: &RuntimeClient, uid: &str) -> Result<PodRuntime, RuntimeError> {
    let by_uid: HashMap<String, String> =
        std::iter::once((labels::POD_UID.to_string(), uid.to_string())).collect();
    let sandboxes = cri
        .list_pod_sandbox(Some(api::PodSandboxFilter {
            label_selector: by_uid.clone(),
            ..Default::default()
        }))
        .await?;
    let mut out = PodRuntime::default();
    for s in sandboxes {
        let ready = s.state == api::PodSandboxState::SandboxReady as i32;
        let ip = if ready {
            cri.pod_sandbox_status(&s.id, false)
                .await
                .ok()
                .and_then(|r| r.status)
                .and_then(|st| st.network)
                .map(|n| n.ip)
                .unwrap_or_default()
        } else {
            String::new()
        };
        out.sandboxes.push(Sandbox {
            id: s.id,
            ready,
            created_at: s.created_at,
            ip,
        });
    }
    out.sandboxes
        .sort_by_key(|s| std::cmp::Reverse(s.created_at));
    let containers = cri
        .list_containers(Some(api::ContainerFilter {
            label_selector: by_uid,
            ..Default::default()
        }))
        .await?;
    for c in containers {
        let name = c
            .labels
            .get(labels::CONTAINER_NAME)
            .cloned()
            .unwrap_or_default();
        let attempt = c.metadata.as_ref().map(|m| m.attempt).unwrap_or(0);
        let status = cri
            .container_status(&c.id, false)
            .await
            .ok()
            .and_then(|r| r.status);
        out.instances.push(Instance {
            id: c.id.clone(),
            name,
            attempt,
            state: state_name(status.as_ref().map(|s| s.state).unwrap_or(c.state)),
            exit_code: status.as_ref().map(|s| s.exit_code).unwrap_or(0),
            reason: status
                .as_ref()
                .map(|s| s.reason.clone())
                .unwrap_or_default(),
            log_path: status
                .as_ref()
                .map(|s| s.log_path.clone())
                .unwrap_or_default(),
            finished_at: status.as_ref().map(|s| s.finished_at).unwrap_or(0),
        });
    }
    out.instances
        .sort_by_key(|i| (i.name.clone(), std::cmp::Reverse(i.attempt)));
    Ok(out)
}

/// Whether the runtime holds `image` (`Some(id)`) or not (`None`).
pub async fn image_present(
    cri: &RuntimeClient,
    image: &str,
) -> Result<Option<String>, RuntimeError> {
    Ok(cri
        .image_status(keelson_cri::image_spec(image))
        .await
        .map(|i| i.map(|i| i.id))?)
}
