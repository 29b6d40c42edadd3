//! The status manager's `normalizeStatus` (`pkg/kubelet/status/status_manager.go`)
//! for termination messages: a pod's containers share 12 KiB of messages
//! (`MaxPodTerminationMessageLogLength`), so each terminated state (current
//! and last) keeps at most 12 KiB / number of containers of its message.

use k8s_openapi::api::core::v1::{ContainerState, Pod, PodStatus};

/// `MaxPodTerminationMessageLogLength`.
pub const MAX_POD_TERMINATION_MESSAGE_LENGTH: usize = 12 * 1024;

fn truncate(message: &mut Option<String>, max: usize) {
    if let Some(m) = message
        && m.len() > max
    {
        let mut cut = max;
        while !m.is_char_boundary(cut) {
            cut -= 1;
        }
        m.truncate(cut);
    }
}

fn normalize_state(s: Option<&mut ContainerState>, max: usize) {
    if let Some(t) = s.and_then(|s| s.terminated.as_mut()) {
        truncate(&mut t.message, max);
    }
}

/// Truncates the termination messages of `status` as kubelet does.
pub fn normalize(pod: &Pod, status: &mut PodStatus) {
    let spec = pod.spec.as_ref();
    let containers = spec.map_or(0, |s| {
        s.containers.len()
            + s.init_containers.as_ref().map_or(0, Vec::len)
            + s.ephemeral_containers.as_ref().map_or(0, Vec::len)
    });
    let max = MAX_POD_TERMINATION_MESSAGE_LENGTH / containers.max(1);
    for c in status
        .container_statuses
        .iter_mut()
        .flatten()
        .chain(status.init_container_statuses.iter_mut().flatten())
        .chain(status.ephemeral_container_statuses.iter_mut().flatten())
    {
        normalize_state(c.state.as_mut(), max);
        normalize_state(c.last_state.as_mut(), max);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_share_12k() {
        let pod: Pod = serde_json::from_value(serde_json::json!({"spec": {
            "containers": [{"name": "a"}, {"name": "b"}, {"name": "c"}]}}))
        .expect("pod");
        let long = "x".repeat(5000);
        let mut status: PodStatus = serde_json::from_value(serde_json::json!({
            "containerStatuses": [
                {"name": "a", "image": "i", "imageID": "", "ready": false, "restartCount": 0,
                 "state": {"terminated": {"exitCode": 1, "message": long}},
                 "lastState": {"terminated": {"exitCode": 1, "message": "short"}}}
            ]
        }))
        .expect("status");
        normalize(&pod, &mut status);
        let c = &status.container_statuses.expect("cs")[0];
        let msg = |s: &Option<ContainerState>| {
            s.as_ref()
                .and_then(|s| s.terminated.as_ref())
                .and_then(|t| t.message.clone())
                .unwrap_or_default()
        };
        assert_eq!(msg(&c.state).len(), 4096);
        assert_eq!(msg(&c.last_state), "short");
    }
}
