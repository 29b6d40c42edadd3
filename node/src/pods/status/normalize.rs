//! The status manager's `normalizeStatus` (`pkg/kubelet/status/status_manager.go`)
//! for termination messages: a pod's containers share 12 KiB of messages
//! (`MaxPodTerminationMessageLogLength`), so each terminated state (current
//! and last) keeps at most 12 KiB / number of containers of its message,
//! cut in bytes as kubelet cuts them ([`gofmt::cut_api_text`]).

use k8s_openapi::api::core::v1::{ContainerState, Pod, PodStatus};
use keelson_common::gofmt;

/// `MaxPodTerminationMessageLogLength`.
pub const MAX_POD_TERMINATION_MESSAGE_LENGTH: usize = 12 * 1024;

fn truncate(message: &mut Option<String>, max: usize) {
    if let Some(m) = message {
        gofmt::cut_api_text(m, max);
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

    /// Five containers share 12 KiB: 2457 bytes each. A message of `€`s
    /// read from the end of its file (starting with the last byte of one)
    /// is cut at byte 2457, inside a `€`: kubelet v1.36.2 shows two U+FFFD
    /// there (the upstream hostile_objects case), not a shorter text.
    #[test]
    fn a_cut_character_shows_as_kubelets_does() {
        let pod: Pod = serde_json::from_value(serde_json::json!({"spec": {
            "containers": [{"name": "a"}, {"name": "b"}, {"name": "c"}, {"name": "d"}, {"name": "e"}]}}))
        .expect("pod");
        let file = "€".repeat(3000).into_bytes();
        let read = gofmt::api_text(&file[file.len() - 4096..]);
        let mut status: PodStatus = serde_json::from_value(serde_json::json!({
            "containerStatuses": [
                {"name": "a", "image": "i", "imageID": "", "ready": false, "restartCount": 0,
                 "state": {"terminated": {"exitCode": 0, "message": read}}}
            ]
        }))
        .expect("status");
        normalize(&pod, &mut status);
        let c = &status.container_statuses.expect("cs")[0];
        let got = c
            .state
            .as_ref()
            .and_then(|s| s.terminated.as_ref())
            .and_then(|t| t.message.clone());
        let want = format!("\u{fffd}{}\u{fffd}\u{fffd}", "€".repeat(818));
        assert_eq!(got.as_deref(), Some(want.as_str()));
    }
}
