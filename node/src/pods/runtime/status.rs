//! The runtime's view of one pod (kubelet's `kubecontainer.PodStatus`):
//! its sandboxes and containers as CRI reports them, converted once into a
//! form the sync logic and the status generator read.

use std::path::Path;
use std::time::SystemTime;

use keelson_common::gofmt;
use keelson_cri::api;

use super::log_tail::{MAX_TERMINATION_MESSAGE_LENGTH, last_log_text, read_at_most};
use crate::pod::labels::{container_info_from_annotations, container_info_from_labels};

/// A container's state as kubelet models it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ContainerState {
    /// Created, not started.
    Created,
    /// Running.
    Running,
    /// Exited.
    Exited,
    /// The runtime does not know.
    Unknown,
}

impl ContainerState {
    /// From a CRI state value.
    pub fn from_cri(state: i32) -> Self {
        match api::ContainerState::try_from(state) {
            Ok(api::ContainerState::ContainerCreated) => ContainerState::Created,
            Ok(api::ContainerState::ContainerRunning) => ContainerState::Running,
            Ok(api::ContainerState::ContainerExited) => ContainerState::Exited,
            _ => ContainerState::Unknown,
        }
    }

    /// Lower-case name, as kubelet prints it.
    pub fn as_str(self) -> &'static str {
        match self {
            ContainerState::Created => "created",
            ContainerState::Running => "running",
            ContainerState::Exited => "exited",
            ContainerState::Unknown => "unknown",
        }
    }
}

/// One container as the runtime reports it.
#[derive(Debug, Clone, PartialEq)]
pub struct ContainerStatus {
    /// The runtime's container id.
    pub id: String,
    /// The container name (from the `io.kubernetes.container.name` label).
    pub name: String,
    /// The sandbox it belongs to.
    pub sandbox_id: String,
    /// State.
    pub state: ContainerState,
    /// Creation time, ns since the epoch.
    pub created_at: i64,
    /// Start time (0 if never started).
    pub started_at: i64,
    /// Finish time (0 unless exited).
    pub finished_at: i64,
    /// Exit code (exited only).
    pub exit_code: i32,
    /// Reason of the exit (`Completed`, `Error`, `OOMKilled`).
    pub reason: String,
    /// Message of the exit, enriched with the termination message.
    pub message: String,
    /// Image name.
    pub image: String,
    /// Image reference the runtime resolved (digest or id): `imageID`.
    pub image_ref: String,
    /// Spec hash from the annotations.
    pub hash: u64,
    /// Restart count from the annotations.
    pub restart_count: i32,
    /// Annotation `io.kubernetes.container.type`.
    pub container_type: String,
    /// The runtime's log path.
    pub log_path: String,
    /// The resources the runtime reports it applied (kubelet's
    /// `toKubeContainerResources`), completed from the actuated record.
    pub resources: Option<ContainerResources>,
    /// The user the runtime runs the container's process as (`linux` may
    /// be absent: kubelet then shows an empty `user`).
    pub user: Option<api::ContainerUser>,
}

/// CPU and memory a container runs with, in API units (kubelet's
/// `kubecontainer.ContainerResources`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ContainerResources {
    /// Millicores, from `cpu.shares`.
    pub cpu_request: Option<i64>,
    /// Millicores, from quota and period.
    pub cpu_limit: Option<i64>,
    /// Bytes (only from the actuated record: the runtime has no request).
    pub memory_request: Option<i64>,
    /// Bytes.
    pub memory_limit: Option<i64>,
}

/// `SharesToMilliCPU`.
pub fn shares_to_milli_cpu(shares: i64) -> i64 {
    if shares >= 2 {
        (shares * 1000 + 1023) / 1024
    } else {
        0
    }
}

/// `QuotaToMilliCPU`.
pub fn quota_to_milli_cpu(quota: i64, period: i64) -> i64 {
    if quota == -1 || period == 0 {
        0
    } else {
        quota * 1000 / period
    }
}

/// `toKubeContainerResources`: what the runtime reports (`None` when it
/// reports no cpu or memory figure).
pub fn resources_from_cri(r: Option<&api::ContainerResources>) -> Option<ContainerResources> {
    let l = r?.linux.as_ref()?;
    let cpu_limit = (l.cpu_period > 0)
        .then(|| quota_to_milli_cpu(l.cpu_quota, l.cpu_period))
        .filter(|m| *m > 0);
    let cpu_request = (l.cpu_shares > 0)
        .then(|| shares_to_milli_cpu(l.cpu_shares))
        .filter(|m| *m > 0);
    let memory_limit = (l.memory_limit_in_bytes > 0).then_some(l.memory_limit_in_bytes);
    (cpu_limit.is_some() || cpu_request.is_some() || memory_limit.is_some()).then_some(
        ContainerResources {
            cpu_request,
            cpu_limit,
            memory_request: None,
            memory_limit,
        },
    )
}

impl ContainerStatus {
    /// Converts a CRI ContainerStatus; for an exited container the
    /// termination message (file, or logs for `FallbackToLogsOnError`) is
    /// appended to the runtime's message — bounded blocking reads, so
    /// callers on the async runtime convert exited containers in
    /// `spawn_blocking` ([`reads_files`]).
    pub fn from_cri(s: &api::ContainerStatus, sandbox_id: &str) -> Self {
        let labels = container_info_from_labels(&s.labels);
        let ann = container_info_from_annotations(&s.annotations);
        let state = ContainerState::from_cri(s.state);
        let image = s
            .image
            .as_ref()
            .map(|i| {
                if i.user_specified_image.is_empty() {
                    i.image.clone()
                } else {
                    i.user_specified_image.clone()
                }
            })
            .unwrap_or_default();
        let mut out = ContainerStatus {
            id: s.id.clone(),
            name: if labels.container_name.is_empty() {
                s.metadata
                    .as_ref()
                    .map(|m| m.name.clone())
                    .unwrap_or_default()
            } else {
                labels.container_name
            },
            sandbox_id: sandbox_id.to_string(),
            state,
            created_at: s.created_at,
            started_at: if state == ContainerState::Created {
                0
            } else {
                s.started_at
            },
            finished_at: 0,
            exit_code: 0,
            reason: String::new(),
            message: String::new(),
            image,
            image_ref: s.image_ref.clone(),
            hash: ann.hash,
            restart_count: ann.restart_count,
            container_type: ann.container_type.clone(),
            log_path: s.log_path.clone(),
            resources: resources_from_cri(s.resources.as_ref()),
            user: s.user.clone(),
        };
        if state == ContainerState::Exited {
            out.reason = s.reason.clone();
            out.message = s.message.clone();
            out.exit_code = s.exit_code;
            out.finished_at = s.finished_at;
            let fallback = ann.termination_message_policy == "FallbackToLogsOnError"
                && out.exit_code != 0
                && out.reason != "ContainerCannotRun";
            let (mut text, check_logs) =
                termination_message(s, &ann.termination_message_path, fallback);
            if check_logs {
                text = last_log_text(Path::new(&s.log_path));
            }
            if !text.is_empty() {
                if !out.message.is_empty() {
                    out.message.push_str(": ");
                }
                out.message.push_str(&text);
            }
        }
        out
    }

    /// `containerd://<id>` style id as the API shows it.
    pub fn api_id(&self, runtime: &str) -> String {
        format!("{runtime}://{}", self.id)
    }
}

/// Reads the termination message file through the container's mount of
/// `path` (at most 4 KiB, from its end); says whether the logs should be
/// read instead. Blocking file I/O.
fn termination_message(s: &api::ContainerStatus, path: &str, fallback: bool) -> (String, bool) {
    if path.is_empty() {
        return (String::new(), fallback);
    }
    for m in &s.mounts {
        if m.container_path != path {
            continue;
        }
        return match read_at_most(Path::new(&m.host_path), MAX_TERMINATION_MESSAGE_LENGTH) {
            Ok(data) => {
                let empty = data.is_empty();
                (gofmt::api_text(&data), fallback && empty)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => (String::new(), fallback),
            Err(e) => (
                format!("Error on reading termination log {}: {e}", m.host_path),
                false,
            ),
        };
    }
    (String::new(), fallback)
}

/// Whether converting this CRI status reads files (an exited container's
/// termination message or log tail).
pub fn reads_files(s: &api::ContainerStatus) -> bool {
    ContainerState::from_cri(s.state) == ContainerState::Exited
}

/// A sandbox as the runtime reports it.
#[derive(Debug, Clone, PartialEq)]
pub struct SandboxStatus {
    /// Sandbox id.
    pub id: String,
    /// Ready (running) or not.
    pub ready: bool,
    /// Creation attempt (metadata.attempt).
    pub attempt: u32,
    /// Creation time (ns).
    pub created_at: i64,
    /// Primary IP.
    pub ip: String,
    /// More IPs.
    pub additional_ips: Vec<String>,
    /// Network namespace mode (CRI `NamespaceMode`: 0 POD, 2 NODE).
    pub network_mode: i32,
    /// Whether the network status is present at all.
    pub has_network: bool,
}

impl SandboxStatus {
    /// Converts a CRI PodSandboxStatus.
    pub fn from_cri(s: &api::PodSandboxStatus) -> Self {
        SandboxStatus {
            id: s.id.clone(),
            ready: s.state == api::PodSandboxState::SandboxReady as i32,
            attempt: s.metadata.as_ref().map(|m| m.attempt).unwrap_or(0),
            created_at: s.created_at,
            ip: s.network.as_ref().map(|n| n.ip.clone()).unwrap_or_default(),
            additional_ips: s
                .network
                .as_ref()
                .map(|n| n.additional_ips.iter().map(|i| i.ip.clone()).collect())
                .unwrap_or_default(),
            network_mode: s
                .linux
                .as_ref()
                .and_then(|l| l.namespaces.as_ref())
                .and_then(|n| n.options.as_ref())
                .map(|o| o.network)
                .unwrap_or(0),
            has_network: s.network.is_some(),
        }
    }
}

/// The runtime's view of one pod.
#[derive(Debug, Clone, PartialEq)]
pub struct RuntimePodStatus {
    /// Pod UID.
    pub uid: String,
    /// Pod name.
    pub name: String,
    /// Pod namespace.
    pub namespace: String,
    /// IPs of the newest ready sandbox.
    pub ips: Vec<String>,
    /// Sandboxes, newest first.
    pub sandboxes: Vec<SandboxStatus>,
    /// Containers, newest first.
    pub containers: Vec<ContainerStatus>,
    /// When the runtime was asked.
    pub timestamp: SystemTime,
}

impl RuntimePodStatus {
    /// An empty status (nothing in the runtime).
    pub fn empty(uid: &str, name: &str, namespace: &str) -> Self {
        RuntimePodStatus {
            uid: uid.to_string(),
            name: name.to_string(),
            namespace: namespace.to_string(),
            ips: Vec::new(),
            sandboxes: Vec::new(),
            containers: Vec::new(),
            timestamp: SystemTime::now(),
        }
    }

    /// Builds one from CRI statuses, sorting newest first and taking IPs
    /// from the newest sandbox when it is ready.
    pub fn new(
        uid: &str,
        name: &str,
        namespace: &str,
        mut sandboxes: Vec<SandboxStatus>,
        mut containers: Vec<ContainerStatus>,
    ) -> Self {
        // Creation times can tie (a coarse runtime clock, two creations in
        // one tick); the later attempt is then the newer one, so a new
        // container never reuses the name (attempt) of an existing one.
        sandboxes.sort_by_key(|s| std::cmp::Reverse((s.created_at, s.attempt)));
        containers.sort_by_key(|c| std::cmp::Reverse((c.created_at, c.restart_count)));
        let ips = match sandboxes.first() {
            Some(s) if s.ready && !s.ip.is_empty() => {
                let mut v = vec![s.ip.clone()];
                v.extend(s.additional_ips.iter().cloned());
                v
            }
            _ => Vec::new(),
        };
        RuntimePodStatus {
            uid: uid.to_string(),
            name: name.to_string(),
            namespace: namespace.to_string(),
            ips,
            sandboxes,
            containers,
            timestamp: SystemTime::now(),
        }
    }

    /// The newest container of that name.
    pub fn find_container(&self, name: &str) -> Option<&ContainerStatus> {
        self.containers.iter().find(|c| c.name == name)
    }

    /// Every container of that name, newest first.
    pub fn containers_named<'a>(
        &'a self,
        name: &'a str,
    ) -> impl Iterator<Item = &'a ContainerStatus> {
        self.containers.iter().filter(move |c| c.name == name)
    }

    /// Containers that are running (or in an unknown state that may be).
    pub fn running(&self) -> impl Iterator<Item = &ContainerStatus> {
        self.containers
            .iter()
            .filter(|c| matches!(c.state, ContainerState::Running | ContainerState::Unknown))
    }

    /// True when no container runs and no sandbox is ready.
    pub fn is_stopped(&self) -> bool {
        self.running().next().is_none() && !self.sandboxes.iter().any(|s| s.ready)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn exited_container_gets_its_termination_message() {
        let dir = tempfile::tempdir().expect("tempdir");
        let msg = dir.path().join("msg");
        std::fs::write(&msg, "bye").expect("w");
        let s = api::ContainerStatus {
            id: "c1".into(),
            state: api::ContainerState::ContainerExited as i32,
            exit_code: 3,
            reason: "Error".into(),
            started_at: 10,
            finished_at: 20,
            labels: HashMap::from([(crate::pod::labels::CONTAINER_NAME.into(), "app".into())]),
            annotations: HashMap::from([
                (
                    crate::pod::labels::CONTAINER_RESTART_COUNT.into(),
                    "2".into(),
                ),
                (
                    crate::pod::labels::CONTAINER_TERMINATION_MESSAGE_PATH.into(),
                    "/dev/termination-log".into(),
                ),
            ]),
            mounts: vec![api::Mount {
                container_path: "/dev/termination-log".into(),
                host_path: msg.display().to_string(),
                ..Default::default()
            }],
            ..Default::default()
        };
        let c = ContainerStatus::from_cri(&s, "sb");
        assert_eq!(c.name, "app");
        assert_eq!(c.restart_count, 2);
        assert_eq!(c.message, "bye");
        assert_eq!(c.exit_code, 3);
        assert_eq!(c.state, ContainerState::Exited);
    }

    #[test]
    fn newest_first_and_ips_from_a_ready_sandbox() {
        let sb = |id: &str, at: i64, ready: bool| SandboxStatus {
            id: id.into(),
            ready,
            attempt: 0,
            created_at: at,
            ip: format!("10.0.0.{at}"),
            additional_ips: vec![],
            network_mode: 0,
            has_network: true,
        };
        let s = RuntimePodStatus::new(
            "u",
            "p",
            "n",
            vec![sb("old", 1, false), sb("new", 2, true)],
            vec![],
        );
        assert_eq!(s.sandboxes[0].id, "new");
        assert_eq!(s.ips, vec!["10.0.0.2".to_string()]);
    }

    #[test]
    fn equal_creation_times_put_the_later_attempt_first() {
        let c = |id: &str, restarts: &str| {
            let s = api::ContainerStatus {
                id: id.into(),
                state: api::ContainerState::ContainerCreated as i32,
                created_at: 5,
                labels: HashMap::from([(crate::pod::labels::CONTAINER_NAME.into(), "app".into())]),
                annotations: HashMap::from([(
                    crate::pod::labels::CONTAINER_RESTART_COUNT.into(),
                    restarts.into(),
                )]),
                ..Default::default()
            };
            ContainerStatus::from_cri(&s, "sb")
        };
        for order in [
            vec![c("a0", "0"), c("a1", "1")],
            vec![c("a1", "1"), c("a0", "0")],
        ] {
            let s = RuntimePodStatus::new("u", "p", "n", vec![], order);
            assert_eq!(s.find_container("app").map(|c| c.id.as_str()), Some("a1"));
        }
    }
}
