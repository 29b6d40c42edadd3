//! Small facts about a Pod object that every part of the pod lifecycle asks:
//! names as kubelet prints them, static/mirror pods, restart policies,
//! container lookups.

use k8s_openapi::api::core::v1::{Container, EphemeralContainer, Pod, PodSpec, Taint, Toleration};

/// Annotation naming where a pod came from (`api`, `file`, `http`).
pub const CONFIG_SOURCE_ANNOTATION: &str = "kubernetes.io/config.source";
/// Annotation a mirror pod carries (its value: the static pod's hash).
pub const CONFIG_MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";
/// Annotation with the hash of a static pod's manifest.
pub const CONFIG_HASH_ANNOTATION: &str = "kubernetes.io/config.hash";
/// Annotation with the time a static pod was first seen.
pub const CONFIG_SEEN_ANNOTATION: &str = "kubernetes.io/config.seen";
/// Priority from which a pod counts as critical (`scheduling.SystemCriticalPriority`).
pub const SYSTEM_CRITICAL_PRIORITY: i32 = 2_000_000_000;

/// The pod's UID (empty when missing).
pub fn uid(pod: &Pod) -> &str {
    pod.metadata.uid.as_deref().unwrap_or_default()
}

/// The pod's name.
pub fn name(pod: &Pod) -> &str {
    pod.metadata.name.as_deref().unwrap_or_default()
}

/// The pod's namespace.
pub fn namespace(pod: &Pod) -> &str {
    pod.metadata.namespace.as_deref().unwrap_or_default()
}

/// `name_namespace`, kubelet's pod full name.
pub fn full_name(pod: &Pod) -> String {
    format!("{}_{}", name(pod), namespace(pod))
}

/// `name_namespace(uid)`, how kubelet's messages name a pod (`format.Pod`).
pub fn format_pod(pod: &Pod) -> String {
    format!("{}_{}({})", name(pod), namespace(pod), uid(pod))
}

/// `namespace/name` for logs.
pub fn key(pod: &Pod) -> String {
    format!("{}/{}", namespace(pod), name(pod))
}

/// The spec, or an empty one.
pub fn spec(pod: &Pod) -> &PodSpec {
    static EMPTY: std::sync::OnceLock<PodSpec> = std::sync::OnceLock::new();
    pod.spec
        .as_ref()
        .unwrap_or_else(|| EMPTY.get_or_init(PodSpec::default))
}

fn annotation<'a>(pod: &'a Pod, key: &str) -> Option<&'a str> {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .map(String::as_str)
}

/// A pod from a static manifest (its config source is not the API).
pub fn is_static(pod: &Pod) -> bool {
    annotation(pod, CONFIG_SOURCE_ANNOTATION).is_some_and(|s| s != "api")
}

/// A mirror pod (the API's copy of a static pod).
pub fn is_mirror(pod: &Pod) -> bool {
    annotation(pod, CONFIG_MIRROR_ANNOTATION).is_some()
}

/// The mirror annotation's value (the static pod's hash).
pub fn mirror_hash(pod: &Pod) -> Option<&str> {
    annotation(pod, CONFIG_MIRROR_ANNOTATION)
}

/// The static pod's manifest hash.
pub fn config_hash(pod: &Pod) -> Option<&str> {
    annotation(pod, CONFIG_HASH_ANNOTATION)
}

/// `kubelet`'s `IsCriticalPod`: static, mirror, or priority ≥ system-critical.
pub fn is_critical(pod: &Pod) -> bool {
    is_static(pod)
        || is_mirror(pod)
        || spec(pod)
            .priority
            .is_some_and(|p| p >= SYSTEM_CRITICAL_PRIORITY)
}

/// A sidecar: an init container with `restartPolicy: Always`.
pub fn is_restartable_init(c: &Container) -> bool {
    c.restart_policy.as_deref() == Some("Always")
}

/// True when the pod has at least one sidecar.
pub fn has_restartable_init(pod: &Pod) -> bool {
    spec(pod)
        .init_containers
        .iter()
        .flatten()
        .any(is_restartable_init)
}

/// The pod's restart policy (`Always` when unset, the API default).
pub fn restart_policy(pod: &Pod) -> &str {
    spec(pod).restart_policy.as_deref().unwrap_or("Always")
}

/// kubelet's `FindMatchingContainerRestartRule` (ContainerRestartRules,
/// beta and on in v1.36): the first of the container's
/// `restartPolicyRules` whose exit codes match, its action.
pub fn matching_restart_rule(c: &Container, exit_code: i32) -> Option<&str> {
    c.restart_policy_rules.iter().flatten().find_map(|rule| {
        let codes = rule.exit_codes.as_ref()?;
        let listed = codes.values.iter().flatten().any(|v| *v == exit_code);
        let hit = match codes.operator.as_str() {
            "In" => listed,
            "NotIn" => !listed,
            _ => false,
        };
        hit.then_some(rule.action.as_str())
    })
}

/// kubelet's `ContainerShouldRestart`: the container's restart rules,
/// then its own `restartPolicy`, then the pod's, for a container that
/// exited with `exit_code`. A matching `RestartAllContainers` rule means
/// it runs again too (RestartAllContainersOnContainerExits, on in v1.36:
/// the whole pod restarts, see `restart_all`).
pub fn container_should_restart(c: &Container, pod: &Pod, exit_code: i32) -> bool {
    if let Some(policy) = c.restart_policy.as_deref() {
        if matches!(
            matching_restart_rule(c, exit_code),
            Some("Restart" | "RestartAllContainers")
        ) {
            return true;
        }
        match policy {
            "Always" => return true,
            "OnFailure" => return exit_code != 0,
            "Never" => return false,
            _ => {}
        }
    }
    match restart_policy(pod) {
        "OnFailure" => exit_code != 0,
        "Never" => false,
        _ => true,
    }
}

/// kubelet's `IsContainerRestartable`: whether the container may ever be
/// restarted (by a rule, its own policy, or the pod's).
pub fn is_container_restartable(pod: &Pod, c: &Container) -> bool {
    match c.restart_policy.as_deref() {
        Some(policy) => {
            c.restart_policy_rules
                .iter()
                .flatten()
                .any(|r| r.action == "Restart")
                || policy != "Never"
        }
        None => restart_policy(pod) != "Never",
    }
}

/// Pods run in the host's network namespace.
pub fn is_host_network(pod: &Pod) -> bool {
    spec(pod).host_network.unwrap_or(false)
}

/// The init containers.
pub fn init_containers(pod: &Pod) -> &[Container] {
    spec(pod).init_containers.as_deref().unwrap_or_default()
}

/// The regular containers.
pub fn containers(pod: &Pod) -> &[Container] {
    &spec(pod).containers
}

/// The spec of a container (regular or init) by name.
pub fn container_spec<'a>(pod: &'a Pod, name: &str) -> Option<&'a Container> {
    containers(pod)
        .iter()
        .chain(init_containers(pod))
        .find(|c| c.name == name)
}

/// The ephemeral containers (`kubectl debug`), added to a running pod
/// through the `ephemeralcontainers` subresource.
pub fn ephemeral_containers(pod: &Pod) -> &[EphemeralContainer] {
    spec(pod)
        .ephemeral_containers
        .as_deref()
        .unwrap_or_default()
}

/// An ephemeral container as the `Container` it is to the runtime: kubelet
/// converts `EphemeralContainerCommon` to `v1.Container` (the two hold the
/// same fields; `targetContainerName` is the only addition), e.g. in
/// `ephemeralContainerStartSpec` (pkg/kubelet/kuberuntime/
/// kuberuntime_container.go) and `generateAPIPodStatus`
/// (pkg/kubelet/kubelet_pods.go). The destructuring is exhaustive so a new
/// field in either type fails the build here.
pub fn ephemeral_as_container(e: &EphemeralContainer) -> Container {
    let EphemeralContainer {
        args,
        command,
        env,
        env_from,
        image,
        image_pull_policy,
        lifecycle,
        liveness_probe,
        name,
        ports,
        readiness_probe,
        resize_policy,
        resources,
        restart_policy,
        restart_policy_rules,
        security_context,
        startup_probe,
        stdin,
        stdin_once,
        target_container_name: _,
        termination_message_path,
        termination_message_policy,
        tty,
        volume_devices,
        volume_mounts,
        working_dir,
    } = e.clone();
    Container {
        args,
        command,
        env,
        env_from,
        image,
        image_pull_policy,
        lifecycle,
        liveness_probe,
        name,
        ports,
        readiness_probe,
        resize_policy,
        resources,
        restart_policy,
        restart_policy_rules,
        security_context,
        startup_probe,
        stdin,
        stdin_once,
        termination_message_path,
        termination_message_policy,
        tty,
        volume_devices,
        volume_mounts,
        working_dir,
    }
}

/// The spec of an ephemeral container by name, as a `Container`.
pub fn ephemeral_container_spec(pod: &Pod, name: &str) -> Option<Container> {
    ephemeral_containers(pod)
        .iter()
        .find(|e| e.name == name)
        .map(ephemeral_as_container)
}

/// True when `name` is an init container of the pod.
pub fn is_init_container(pod: &Pod, name: &str) -> bool {
    init_containers(pod).iter().any(|c| c.name == name)
}

/// The deletion grace period if the pod is being deleted.
pub fn deletion_grace(pod: &Pod) -> Option<i64> {
    pod.metadata
        .deletion_timestamp
        .as_ref()
        .map(|_| pod.metadata.deletion_grace_period_seconds.unwrap_or(0))
}

/// The pod's `terminationGracePeriodSeconds` (API default 30).
pub fn termination_grace(pod: &Pod) -> i64 {
    spec(pod).termination_grace_period_seconds.unwrap_or(30)
}

/// The phase in the pod's status (empty if none).
pub fn phase(pod: &Pod) -> &str {
    pod.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or_default()
}

/// Succeeded or Failed.
pub fn is_terminal_phase(phase: &str) -> bool {
    phase == "Succeeded" || phase == "Failed"
}

/// The rule action (`ContainerRestartRuleActionRestartAllContainers`).
pub const RESTART_ALL_ACTION: &str = "RestartAllContainers";

/// Whether this exit of `c` (with `exit_code`) triggers a restart of the
/// whole pod: its first matching rule says `RestartAllContainers`.
pub fn triggers_restart_all(c: &Container, exit_code: i32) -> bool {
    matching_restart_rule(c, exit_code) == Some(RESTART_ALL_ACTION)
}

/// `Toleration.ToleratesTaint` (comparison operators are an alpha gate,
/// off in v1.36: `Lt`/`Gt` tolerate nothing).
pub fn tolerates(t: &Toleration, taint: &Taint) -> bool {
    if t.effect
        .as_deref()
        .is_some_and(|e| !e.is_empty() && e != taint.effect)
    {
        return false;
    }
    if t.key
        .as_deref()
        .is_some_and(|k| !k.is_empty() && k != taint.key)
    {
        return false;
    }
    match t.operator.as_deref().unwrap_or_default() {
        "" | "Equal" => {
            t.value.as_deref().unwrap_or_default() == taint.value.as_deref().unwrap_or_default()
        }
        "Exists" => true,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(v: serde_json::Value) -> Pod {
        serde_json::from_value(v).expect("pod")
    }

    #[test]
    fn names_and_sources() {
        let p = pod(serde_json::json!({
            "metadata": {"name": "web", "namespace": "default", "uid": "u1",
                         "annotations": {"kubernetes.io/config.source": "file"}},
            "spec": {"containers": [{"name": "a"}], "initContainers": [{"name": "s", "restartPolicy": "Always"}]}
        }));
        assert_eq!(full_name(&p), "web_default");
        assert_eq!(format_pod(&p), "web_default(u1)");
        assert!(is_static(&p) && !is_mirror(&p) && is_critical(&p));
        assert!(has_restartable_init(&p));
        assert_eq!(restart_policy(&p), "Always");
        assert!(container_spec(&p, "s").is_some() && is_init_container(&p, "s"));
        assert!(ephemeral_containers(&p).is_empty());
        let e = pod(serde_json::json!({
            "metadata": {"name": "web"},
            "spec": {"containers": [{"name": "a"}], "ephemeralContainers": [
                {"name": "dbg", "image": "busybox", "stdin": true, "tty": true,
                 "targetContainerName": "a", "env": [{"name": "K", "value": "v"}]}]}
        }));
        let c = ephemeral_container_spec(&e, "dbg").expect("ephemeral");
        assert_eq!(c.image.as_deref(), Some("busybox"));
        assert_eq!((c.stdin, c.tty), (Some(true), Some(true)));
        assert_eq!(c.env.expect("env")[0].value.as_deref(), Some("v"));
        assert!(ephemeral_container_spec(&e, "a").is_none());
        assert!(
            container_spec(&e, "dbg").is_none(),
            "only regular and init containers"
        );
        assert_eq!(termination_grace(&p), 30);
    }
}
