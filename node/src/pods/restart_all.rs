//! RestartAllContainersOnContainerExits (beta and on in kubelet v1.36): a
//! container restart rule with action `RestartAllContainers` restarts the
//! whole pod in place when that container exits with a matching code.
//! While the `AllContainersRestarting` condition is True, the sync kills
//! (without grace) and removes every container of the pod, the sandbox
//! stays, and the pod starts over from its first init container.
//!
//! The facts every part of the lifecycle asks about it, after upstream's
//! `pkg/kubelet/container/helpers.go` (`ShouldAllContainersRestart`,
//! `AllContainersRestartCleanedUp`), `pkg/api/v1/pod/util.go`
//! (`AllContainersCouldRestart`) and `pkg/kubelet/status/generate.go`
//! (`GenerateAllContainersRestartingCondition`).

use k8s_openapi::api::core::v1::{Pod, PodCondition, PodStatus};

use super::runtime::status::{ContainerState, RuntimePodStatus};
use crate::pod::podutil::{self, RESTART_ALL_ACTION as ACTION};

/// The pod condition type.
pub const CONDITION: &str = "AllContainersRestarting";
/// The condition's reason while the restart runs
/// (`status.RestartAllContainersStarted`).
pub const STARTED_REASON: &str = "RestartAllContainersStarted";
/// The condition's message while the restart runs.
pub const STARTED_MESSAGE: &str = "container exited with restart policy rule";
/// The reason of a container removed by the restart
/// (`kubelet.RestartingAllContainers`).
pub const RESTARTING_REASON: &str = "RestartingAllContainers";
/// The message of a container removed by the restart.
pub const REMOVED_MESSAGE: &str = "The container is removed because RestartAllContainers in place";

/// `AllContainersCouldRestart`: some init or regular container has a
/// `RestartAllContainers` rule.
pub fn could_restart(pod: &Pod) -> bool {
    podutil::init_containers(pod)
        .iter()
        .chain(podutil::containers(pod))
        .flat_map(|c| c.restart_policy_rules.iter().flatten())
        .any(|r| r.action == ACTION)
}

/// Whether `status` carries `AllContainersRestarting=True`.
pub fn condition_true(status: &PodStatus) -> bool {
    status
        .conditions
        .iter()
        .flatten()
        .any(|c| c.type_ == CONDITION && c.status == "True")
}

/// `ShouldAllContainersRestart`: the previous status says the pod is
/// restarting, or a container (newest instance in the runtime, or as the
/// previous status shows it) exited with a code its rules answer with
/// `RestartAllContainers`.
pub fn should_restart(pod: &Pod, rt: Option<&RuntimePodStatus>, api: Option<&PodStatus>) -> bool {
    if api.is_some_and(condition_true) {
        return true;
    }
    let api_terminated_code = |name: &str| -> Option<i32> {
        let api = api?;
        api.init_container_statuses
            .iter()
            .flatten()
            .chain(api.container_statuses.iter().flatten())
            .find(|s| s.name == name)
            .and_then(|s| s.state.as_ref())
            .and_then(|st| st.terminated.as_ref())
            .map(|t| t.exit_code)
    };
    podutil::init_containers(pod)
        .iter()
        .chain(podutil::containers(pod))
        .any(|c| {
            let runtime_hit = rt
                .and_then(|rt| rt.find_container(&c.name))
                .is_some_and(|s| {
                    s.state == ContainerState::Exited
                        && podutil::triggers_restart_all(c, s.exit_code)
                });
            runtime_hit
                || api_terminated_code(&c.name)
                    .is_some_and(|code| podutil::triggers_restart_all(c, code))
        })
}

/// `AllContainersRestartCleanedUp`: no init or regular container of the
/// pod is left in the runtime.
pub fn cleaned_up(pod: &Pod, rt: &RuntimePodStatus) -> bool {
    podutil::init_containers(pod)
        .iter()
        .chain(podutil::containers(pod))
        .all(|c| rt.find_container(&c.name).is_none())
}

/// `GenerateAllContainersRestartingCondition` (kubelet adds it only to
/// pods that [`could_restart`]; it carries no `observedGeneration`).
pub fn condition(pod: &Pod, rt: &RuntimePodStatus, old: &PodStatus, phase: &str) -> PodCondition {
    let (status, reason, message) = match phase {
        "Succeeded" => ("False", Some("PodCompleted"), None),
        "Failed" => ("False", Some("PodFailed"), None),
        _ if !should_restart(pod, Some(rt), Some(old)) || cleaned_up(pod, rt) => {
            ("False", None, None)
        }
        _ => ("True", Some(STARTED_REASON), Some(STARTED_MESSAGE)),
    };
    PodCondition {
        type_: CONDITION.to_string(),
        status: status.to_string(),
        reason: reason.map(str::to_string),
        message: message.map(str::to_string),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pods::runtime::status::ContainerStatus;

    fn pod() -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u"},
            "spec": {"restartPolicy": "Never", "containers": [
                {"name": "src", "image": "b", "restartPolicy": "Never",
                 "restartPolicyRules": [{"action": "RestartAllContainers",
                                         "exitCodes": {"operator": "In", "values": [42]}}]},
                {"name": "app", "image": "b"}]}
        }))
        .expect("pod")
    }

    fn exited(name: &str, code: i32) -> ContainerStatus {
        ContainerStatus {
            id: format!("{name}-id"),
            name: name.into(),
            sandbox_id: "sb".into(),
            state: ContainerState::Exited,
            created_at: 1,
            started_at: 1,
            finished_at: 2,
            exit_code: code,
            reason: String::new(),
            message: String::new(),
            image: "b".into(),
            image_ref: "sha256:b".into(),
            hash: 0,
            restart_count: 0,
            container_type: String::new(),
            log_path: String::new(),
            resources: None,
            user: None,
        }
    }

    fn rt(containers: Vec<ContainerStatus>) -> RuntimePodStatus {
        RuntimePodStatus::new("u", "p", "ns", vec![], containers)
    }

    #[test]
    fn a_matching_exit_triggers_the_restart_until_everything_is_removed() {
        let p = pod();
        assert!(could_restart(&p));
        let old = PodStatus::default();
        assert!(!should_restart(
            &p,
            Some(&rt(vec![exited("src", 1)])),
            Some(&old)
        ));
        let hit = rt(vec![exited("src", 42)]);
        assert!(should_restart(&p, Some(&hit), Some(&old)));
        let c = condition(&p, &hit, &old, "Running");
        assert_eq!(
            (c.status.as_str(), c.reason.as_deref(), c.message.as_deref()),
            ("True", Some(STARTED_REASON), Some(STARTED_MESSAGE))
        );
        assert_eq!(c.observed_generation, None);
        // Once the condition is True, the previous status alone keeps the
        // restart going; it ends when no container is left.
        let old = PodStatus {
            conditions: Some(vec![c]),
            ..Default::default()
        };
        assert!(should_restart(&p, Some(&rt(vec![])), Some(&old)));
        let done = condition(&p, &rt(vec![]), &old, "Running");
        assert_eq!((done.status.as_str(), done.reason), ("False", None));
        // A terminal pod never restarts.
        let failed = condition(&p, &hit, &PodStatus::default(), "Failed");
        assert_eq!(failed.reason.as_deref(), Some("PodFailed"));
    }

    #[test]
    fn the_previous_status_counts_as_kubelet_reads_it() {
        let p = pod();
        let old: PodStatus = serde_json::from_value(serde_json::json!({
            "containerStatuses": [{"name": "src", "image": "b", "imageID": "", "ready": false,
                                   "restartCount": 0,
                                   "state": {"terminated": {"exitCode": 42}}}]
        }))
        .expect("status");
        assert!(should_restart(&p, None, Some(&old)));
        assert!(!should_restart(&p, None, None));
    }
}
