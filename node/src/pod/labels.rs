//! The CRI labels and annotations kubelet puts on sandboxes and containers,
//! with the same keys and value formats, and their reading back. They are
//! how a restarted keelson (or one taking over from a kubelet) finds which
//! pod and container a runtime object belongs to, its restart count and
//! the spec hash it was started with.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::{Container, ContainerPort, LifecycleHandler, Pod};

use super::hash::hash_label;
use crate::pod::podutil;

/// Pod name label.
pub const POD_NAME: &str = "io.kubernetes.pod.name";
/// Pod namespace label.
pub const POD_NAMESPACE: &str = "io.kubernetes.pod.namespace";
/// Pod UID label.
pub const POD_UID: &str = "io.kubernetes.pod.uid";
/// Container name label.
pub const CONTAINER_NAME: &str = "io.kubernetes.container.name";
/// Container spec hash annotation (hex).
pub const CONTAINER_HASH: &str = "io.kubernetes.container.hash";
/// Restart count annotation.
pub const CONTAINER_RESTART_COUNT: &str = "io.kubernetes.container.restartCount";
/// Termination message path annotation.
pub const CONTAINER_TERMINATION_MESSAGE_PATH: &str =
    "io.kubernetes.container.terminationMessagePath";
/// Termination message policy annotation.
pub const CONTAINER_TERMINATION_MESSAGE_POLICY: &str =
    "io.kubernetes.container.terminationMessagePolicy";
/// preStop handler (JSON) annotation.
pub const CONTAINER_PRE_STOP_HANDLER: &str = "io.kubernetes.container.preStopHandler";
/// Container ports (JSON) annotation.
pub const CONTAINER_PORTS: &str = "io.kubernetes.container.ports";
/// Container type annotation (`init`, `container`, `ephemeral`).
pub const CONTAINER_TYPE: &str = "io.kubernetes.container.type";
/// Pod deletion grace period annotation.
pub const POD_DELETION_GRACE_PERIOD: &str = "io.kubernetes.pod.deletionGracePeriod";
/// Pod termination grace period annotation.
pub const POD_TERMINATION_GRACE_PERIOD: &str = "io.kubernetes.pod.terminationGracePeriod";

/// `io.kubernetes.container.type` of init containers.
pub const TYPE_INIT: &str = "init";
/// `io.kubernetes.container.type` of regular containers.
pub const TYPE_CONTAINER: &str = "container";

/// Sandbox labels: the pod's labels plus name, namespace and UID.
pub fn new_pod_labels(pod: &Pod) -> HashMap<String, String> {
    let mut labels: HashMap<String, String> = pod
        .metadata
        .labels
        .iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    labels.insert(POD_NAME.into(), podutil::name(pod).into());
    labels.insert(POD_NAMESPACE.into(), podutil::namespace(pod).into());
    labels.insert(POD_UID.into(), podutil::uid(pod).into());
    labels
}

/// Sandbox annotations: the pod's annotations.
pub fn new_pod_annotations(pod: &Pod) -> HashMap<String, String> {
    pod.metadata
        .annotations
        .iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// Container labels: pod name, namespace, UID and container name.
pub fn new_container_labels(c: &Container, pod: &Pod) -> HashMap<String, String> {
    HashMap::from([
        (POD_NAME.to_string(), podutil::name(pod).to_string()),
        (
            POD_NAMESPACE.to_string(),
            podutil::namespace(pod).to_string(),
        ),
        (POD_UID.to_string(), podutil::uid(pod).to_string()),
        (CONTAINER_NAME.to_string(), c.name.clone()),
    ])
}

/// Container annotations: hash, restart count, termination message
/// settings, grace periods, preStop handler, ports and container type.
pub fn new_container_annotations(
    c: &Container,
    pod: &Pod,
    restart_count: i32,
) -> HashMap<String, String> {
    let mut a = HashMap::new();
    a.insert(CONTAINER_HASH.into(), hash_label(c));
    a.insert(CONTAINER_RESTART_COUNT.into(), restart_count.to_string());
    a.insert(
        CONTAINER_TERMINATION_MESSAGE_PATH.into(),
        c.termination_message_path.clone().unwrap_or_default(),
    );
    a.insert(
        CONTAINER_TERMINATION_MESSAGE_POLICY.into(),
        c.termination_message_policy.clone().unwrap_or_default(),
    );
    if let Some(g) = pod.metadata.deletion_grace_period_seconds {
        a.insert(POD_DELETION_GRACE_PERIOD.into(), g.to_string());
    }
    if let Some(g) = podutil::spec(pod).termination_grace_period_seconds {
        a.insert(POD_TERMINATION_GRACE_PERIOD.into(), g.to_string());
    }
    if let Some(pre_stop) = c.lifecycle.as_ref().and_then(|l| l.pre_stop.as_ref())
        && let Ok(json) = serde_json::to_string(pre_stop)
    {
        a.insert(CONTAINER_PRE_STOP_HANDLER.into(), json);
    }
    if let Some(ports) = c.ports.as_ref().filter(|p| !p.is_empty())
        && let Ok(json) = serde_json::to_string(ports)
    {
        a.insert(CONTAINER_PORTS.into(), json);
    }
    let kind = if podutil::is_init_container(pod, &c.name) {
        TYPE_INIT
    } else {
        TYPE_CONTAINER
    };
    a.insert(CONTAINER_TYPE.into(), kind.into());
    a
}

/// What the labels say about a container.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LabeledContainerInfo {
    /// Container name.
    pub container_name: String,
    /// Pod name.
    pub pod_name: String,
    /// Pod namespace.
    pub pod_namespace: String,
    /// Pod UID.
    pub pod_uid: String,
}

/// Reads [`LabeledContainerInfo`] (missing labels are empty).
pub fn container_info_from_labels(labels: &HashMap<String, String>) -> LabeledContainerInfo {
    let get = |k: &str| labels.get(k).cloned().unwrap_or_default();
    LabeledContainerInfo {
        container_name: get(CONTAINER_NAME),
        pod_name: get(POD_NAME),
        pod_namespace: get(POD_NAMESPACE),
        pod_uid: get(POD_UID),
    }
}

/// What the annotations say about a container.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct AnnotatedContainerInfo {
    /// Spec hash it was created with (0 when absent or unreadable).
    pub hash: u64,
    /// Restart count it was created with.
    pub restart_count: i32,
    /// Pod deletion grace period when created.
    pub pod_deletion_grace_period: Option<i64>,
    /// Pod termination grace period.
    pub pod_termination_grace_period: Option<i64>,
    /// Where the termination message is written.
    pub termination_message_path: String,
    /// `File` or `FallbackToLogsOnError`.
    pub termination_message_policy: String,
    /// The preStop handler.
    pub pre_stop: Option<LifecycleHandler>,
    /// Declared ports.
    pub ports: Vec<ContainerPort>,
    /// `init`, `container` or `ephemeral`.
    pub container_type: String,
}

/// Reads [`AnnotatedContainerInfo`]; malformed values count as absent
/// (logged), as kubelet does.
pub fn container_info_from_annotations(a: &HashMap<String, String>) -> AnnotatedContainerInfo {
    let get = |k: &str| a.get(k).cloned().unwrap_or_default();
    let hash = a
        .get(CONTAINER_HASH)
        .and_then(|v| match u64::from_str_radix(v, 16) {
            Ok(h) => Some(h),
            Err(e) => {
                tracing::warn!(value = %v, error = %e, "unreadable container hash annotation");
                None
            }
        })
        .unwrap_or(0);
    let restart_count = a
        .get(CONTAINER_RESTART_COUNT)
        .and_then(|v| v.parse::<i32>().ok())
        .unwrap_or(0);
    let int = |k: &str| a.get(k).and_then(|v| v.parse::<i64>().ok());
    AnnotatedContainerInfo {
        hash,
        restart_count,
        pod_deletion_grace_period: int(POD_DELETION_GRACE_PERIOD),
        pod_termination_grace_period: int(POD_TERMINATION_GRACE_PERIOD),
        termination_message_path: get(CONTAINER_TERMINATION_MESSAGE_PATH),
        termination_message_policy: get(CONTAINER_TERMINATION_MESSAGE_POLICY),
        pre_stop: a
            .get(CONTAINER_PRE_STOP_HANDLER)
            .and_then(|v| serde_json::from_str(v).ok()),
        ports: a
            .get(CONTAINER_PORTS)
            .and_then(|v| serde_json::from_str(v).ok())
            .unwrap_or_default(),
        container_type: get(CONTAINER_TYPE),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u", "labels": {"app": "x"}},
            "spec": {"terminationGracePeriodSeconds": 5,
                     "initContainers": [{"name": "i", "image": "busybox"}],
                     "containers": [{"name": "c", "image": "busybox",
                        "ports": [{"containerPort": 80}],
                        "terminationMessagePath": "/dev/termination-log",
                        "terminationMessagePolicy": "File",
                        "lifecycle": {"preStop": {"exec": {"command": ["sleep", "1"]}}}}]}
        }))
        .expect("pod");
        let c = &podutil::containers(&pod)[0];
        let sandbox = new_pod_labels(&pod);
        assert_eq!(sandbox["app"], "x");
        assert_eq!(sandbox[POD_UID], "u");
        let labels = new_container_labels(c, &pod);
        let info = container_info_from_labels(&labels);
        assert_eq!(info.container_name, "c");
        assert_eq!(info.pod_namespace, "ns");
        let ann = new_container_annotations(c, &pod, 3);
        assert_eq!(ann[CONTAINER_RESTART_COUNT], "3");
        assert_eq!(ann[CONTAINER_TYPE], "container");
        let back = container_info_from_annotations(&ann);
        assert_eq!(back.restart_count, 3);
        assert_eq!(back.hash, super::super::hash::hash_container(c));
        assert_eq!(back.pod_termination_grace_period, Some(5));
        assert_eq!(back.ports.len(), 1);
        assert!(back.pre_stop.and_then(|p| p.exec).is_some());
        let init = &podutil::init_containers(&pod)[0];
        assert_eq!(
            new_container_annotations(init, &pod, 0)[CONTAINER_TYPE],
            "init"
        );
    }
}
