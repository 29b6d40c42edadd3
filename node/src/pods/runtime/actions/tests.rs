use std::collections::HashMap;

use super::*;
use crate::pods::runtime::status::SandboxStatus;

fn pod(v: serde_json::Value) -> Pod {
    serde_json::from_value(v).expect("pod")
}

fn simple(restart_policy: &str) -> Pod {
    pod(serde_json::json!({
        "metadata": {"name": "p", "namespace": "ns", "uid": "u"},
        "spec": {"restartPolicy": restart_policy,
                 "containers": [{"name": "app", "image": "busybox"}]}
    }))
}

fn with_inits(inits: serde_json::Value) -> Pod {
    pod(serde_json::json!({
        "metadata": {"name": "p", "namespace": "ns", "uid": "u"},
        "spec": {"initContainers": inits,
                 "containers": [{"name": "app", "image": "busybox"}]}
    }))
}

fn sandbox(ready: bool) -> SandboxStatus {
    SandboxStatus {
        id: "sb1".into(),
        ready,
        attempt: 0,
        created_at: 1,
        ip: "10.0.0.2".into(),
        additional_ips: vec![],
        network_mode: 0,
        has_network: true,
    }
}

fn container(
    pod: &Pod,
    name: &str,
    state: ContainerState,
    exit: i32,
    created: i64,
) -> ContainerStatus {
    let spec = podutil::container_spec(pod, name).expect("spec");
    ContainerStatus {
        id: format!("{name}-{created}"),
        name: name.into(),
        sandbox_id: "sb1".into(),
        state,
        created_at: created,
        started_at: created,
        finished_at: if state == ContainerState::Exited {
            created + 1
        } else {
            0
        },
        exit_code: exit,
        reason: String::new(),
        message: String::new(),
        image: "busybox".into(),
        image_ref: "sha256:x".into(),
        hash: hash_container(spec),
        restart_count: 0,
        container_type: String::new(),
        log_path: String::new(),
        resources: None,
        user: None,
    }
}

fn status(sandboxes: Vec<SandboxStatus>, containers: Vec<ContainerStatus>) -> RuntimePodStatus {
    RuntimePodStatus::new("u", "p", "ns", sandboxes, containers)
}

struct Probes(HashMap<String, (Option<ProbeState>, Option<ProbeState>)>);

impl ProbeResults for Probes {
    fn liveness(&self, id: &str) -> Option<ProbeState> {
        self.0.get(id).and_then(|p| p.0)
    }
    fn startup(&self, id: &str) -> Option<ProbeState> {
        self.0.get(id).and_then(|p| p.1)
    }
}

#[test]
fn new_pod_creates_sandbox_and_starts_everything() {
    let p = simple("Always");
    let a = compute_pod_actions(&p, &status(vec![], vec![]), &NoProbes);
    assert!(a.create_sandbox && a.kill_pod);
    assert_eq!(a.attempt, 0);
    assert_eq!(a.containers_to_start, vec![0]);
}

#[test]
fn new_pod_with_init_containers_starts_the_first_init_only() {
    let p =
        with_inits(serde_json::json!([{"name": "i1", "image": "b"}, {"name": "i2", "image": "b"}]));
    let a = compute_pod_actions(&p, &status(vec![], vec![]), &NoProbes);
    assert!(a.create_sandbox);
    assert_eq!(a.init_containers_to_start, vec![0]);
    assert!(a.containers_to_start.is_empty());
}

#[test]
fn init_containers_run_one_by_one_then_the_app() {
    let p =
        with_inits(serde_json::json!([{"name": "i1", "image": "b"}, {"name": "i2", "image": "b"}]));
    let running_i1 = status(
        vec![sandbox(true)],
        vec![container(&p, "i1", ContainerState::Running, 0, 5)],
    );
    let a = compute_pod_actions(&p, &running_i1, &NoProbes);
    assert!(a.init_containers_to_start.is_empty() && a.containers_to_start.is_empty());
    assert!(!a.kill_pod);

    let done_i1 = status(
        vec![sandbox(true)],
        vec![container(&p, "i1", ContainerState::Exited, 0, 5)],
    );
    assert_eq!(
        compute_pod_actions(&p, &done_i1, &NoProbes).init_containers_to_start,
        vec![1]
    );

    let done_all = status(
        vec![sandbox(true)],
        vec![
            container(&p, "i1", ContainerState::Exited, 0, 5),
            container(&p, "i2", ContainerState::Exited, 0, 6),
        ],
    );
    let a = compute_pod_actions(&p, &done_all, &NoProbes);
    assert!(a.init_containers_to_start.is_empty());
    assert_eq!(a.containers_to_start, vec![0]);
}

#[test]
fn failed_init_container_restarts_unless_never() {
    let p = with_inits(serde_json::json!([{"name": "i1", "image": "b"}]));
    let failed = status(
        vec![sandbox(true)],
        vec![container(&p, "i1", ContainerState::Exited, 1, 5)],
    );
    assert_eq!(
        compute_pod_actions(&p, &failed, &NoProbes).init_containers_to_start,
        vec![0]
    );
    let mut never = p.clone();
    if let Some(s) = never.spec.as_mut() {
        s.restart_policy = Some("Never".into());
    }
    let a = compute_pod_actions(&never, &failed, &NoProbes);
    assert!(a.kill_pod && a.init_containers_to_start.is_empty());
}

#[test]
fn restart_policies_for_an_exited_app() {
    for (policy, code, restart) in [
        ("Always", 0, true),
        ("Always", 1, true),
        ("OnFailure", 0, false),
        ("OnFailure", 2, true),
        ("Never", 1, false),
        ("Never", 0, false),
    ] {
        let p = simple(policy);
        let s = status(
            vec![sandbox(true)],
            vec![container(&p, "app", ContainerState::Exited, code, 5)],
        );
        let a = compute_pod_actions(&p, &s, &NoProbes);
        assert_eq!(
            a.containers_to_start == vec![0],
            restart,
            "{policy} exit {code}"
        );
        assert_eq!(
            a.kill_pod, !restart,
            "{policy} exit {code}: a finished pod is stopped"
        );
    }
}

#[test]
fn running_app_is_kept() {
    let p = simple("Always");
    let s = status(
        vec![sandbox(true)],
        vec![container(&p, "app", ContainerState::Running, 0, 5)],
    );
    assert_eq!(
        compute_pod_actions(&p, &s, &NoProbes),
        PodActions {
            sandbox_id: "sb1".into(),
            ..Default::default()
        }
    );
}

#[test]
fn changed_image_restarts_even_with_never() {
    let p = simple("Never");
    let mut c = container(&p, "app", ContainerState::Running, 0, 5);
    c.hash = 1;
    let a = compute_pod_actions(&p, &status(vec![sandbox(true)], vec![c]), &NoProbes);
    assert_eq!(a.containers_to_start, vec![0]);
    assert_eq!(a.containers_to_kill.len(), 1);
    assert_eq!(
        a.containers_to_kill[0].message,
        "Container app definition changed, will be restarted"
    );
}

#[test]
fn liveness_and_startup_failures_kill_with_their_reason() {
    let p = simple("Always");
    let c = container(&p, "app", ContainerState::Running, 0, 5);
    let s = status(vec![sandbox(true)], vec![c.clone()]);
    let live = Probes(HashMap::from([(
        c.id.clone(),
        (Some(ProbeState::Failure), None),
    )]));
    let a = compute_pod_actions(&p, &s, &live);
    assert_eq!(a.containers_to_kill[0].reason, KillReason::LivenessProbe);
    assert_eq!(
        a.containers_to_kill[0].message,
        "Container app failed liveness probe, will be restarted"
    );
    let startup = Probes(HashMap::from([(
        c.id.clone(),
        (Some(ProbeState::Success), Some(ProbeState::Failure)),
    )]));
    let a = compute_pod_actions(&p, &s, &startup);
    assert_eq!(a.containers_to_kill[0].reason, KillReason::StartupProbe);
    let mut never = p.clone();
    if let Some(sp) = never.spec.as_mut() {
        sp.restart_policy = Some("Never".into());
    }
    let a = compute_pod_actions(&never, &s, &live);
    assert_eq!(
        a.containers_to_kill[0].message,
        "Container app failed liveness probe"
    );
    assert!(a.containers_to_start.is_empty());
}

#[test]
fn dead_sandbox_is_recreated_unless_never_and_ran() {
    let p = simple("Always");
    let s = status(
        vec![sandbox(false)],
        vec![container(&p, "app", ContainerState::Exited, 137, 5)],
    );
    let a = compute_pod_actions(&p, &s, &NoProbes);
    assert!(a.create_sandbox && a.kill_pod);
    assert_eq!(a.attempt, 1);
    assert_eq!(a.containers_to_start, vec![0]);
    let never = simple("Never");
    let a = compute_pod_actions(&never, &s, &NoProbes);
    assert!(!a.create_sandbox && a.kill_pod);
}

#[test]
fn sidecar_starts_next_init_and_is_restarted_when_it_exits() {
    let p = with_inits(serde_json::json!([
        {"name": "side", "image": "b", "restartPolicy": "Always"},
        {"name": "i2", "image": "b"}
    ]));
    let running = status(
        vec![sandbox(true)],
        vec![container(&p, "side", ContainerState::Running, 0, 5)],
    );
    let a = compute_pod_actions(&p, &running, &NoProbes);
    assert_eq!(a.init_containers_to_start, vec![1]);

    let all = status(
        vec![sandbox(true)],
        vec![
            container(&p, "side", ContainerState::Exited, 1, 5),
            container(&p, "i2", ContainerState::Exited, 0, 6),
            container(&p, "app", ContainerState::Running, 0, 7),
        ],
    );
    let a = compute_pod_actions(&p, &all, &NoProbes);
    assert_eq!(a.init_containers_to_start, vec![0]);
    assert!(a.containers_to_start.is_empty());
    assert!(!a.kill_pod);
}

#[test]
fn sandbox_without_ip_or_with_wrong_network_mode_is_replaced() {
    let p = simple("Always");
    let mut sb = sandbox(true);
    sb.ip.clear();
    assert!(sandbox_changed(&p, &status(vec![sb], vec![])).0);
    let mut host = simple("Always");
    if let Some(s) = host.spec.as_mut() {
        s.host_network = Some(true);
    }
    let (changed, attempt, id) = sandbox_changed(&host, &status(vec![sandbox(true)], vec![]));
    assert!(changed);
    assert_eq!(attempt, 1);
    assert!(id.is_empty());
}

fn with_container_policy(pod_policy: &str, container: serde_json::Value) -> Pod {
    let mut c = container;
    c["name"] = "app".into();
    c["image"] = "busybox".into();
    pod(serde_json::json!({
        "metadata": {"name": "p", "namespace": "ns", "uid": "u"},
        "spec": {"restartPolicy": pod_policy, "containers": [c]}
    }))
}

#[test]
fn container_restart_policy_and_rules_before_the_pods() {
    // ContainerRestartRules (beta, on in v1.36): rules in order, then the
    // container's policy, then the pod's.
    let rules = serde_json::json!({
        "restartPolicy": "Never",
        "restartPolicyRules": [
            {"action": "Restart", "exitCodes": {"operator": "In", "values": [42, 43]}},
        ]
    });
    let not_in = serde_json::json!({
        "restartPolicy": "Never",
        "restartPolicyRules": [
            {"action": "Restart", "exitCodes": {"operator": "NotIn", "values": [0]}},
        ]
    });
    for (pod_policy, spec, code, restart) in [
        ("Always", rules.clone(), 42, true),
        ("Always", rules.clone(), 1, false),
        ("Always", rules.clone(), 0, false),
        (
            "Never",
            serde_json::json!({"restartPolicy": "Always"}),
            0,
            true,
        ),
        (
            "Never",
            serde_json::json!({"restartPolicy": "OnFailure"}),
            3,
            true,
        ),
        (
            "Never",
            serde_json::json!({"restartPolicy": "OnFailure"}),
            0,
            false,
        ),
        (
            "Always",
            serde_json::json!({"restartPolicy": "Never"}),
            1,
            false,
        ),
        ("Never", not_in.clone(), 7, true),
        ("Never", not_in, 0, false),
        ("OnFailure", serde_json::json!({}), 0, false),
    ] {
        let p = with_container_policy(pod_policy, spec.clone());
        let s = status(
            vec![sandbox(true)],
            vec![container(&p, "app", ContainerState::Exited, code, 5)],
        );
        let a = compute_pod_actions(&p, &s, &NoProbes);
        assert_eq!(
            a.containers_to_start == vec![0],
            restart,
            "pod {pod_policy}, container {spec}, exit {code}"
        );
    }
}

#[test]
fn a_new_sandbox_skips_succeeded_containers_that_run_once() {
    // Pod Always, container OnFailure: a succeeded container stays done
    // when the sandbox is recreated.
    let p = with_container_policy("Always", serde_json::json!({"restartPolicy": "OnFailure"}));
    let s = status(
        vec![sandbox(false)],
        vec![container(&p, "app", ContainerState::Exited, 0, 5)],
    );
    let a = compute_pod_actions(&p, &s, &NoProbes);
    assert!(a.containers_to_start.is_empty());
    assert!(!a.create_sandbox, "nothing to start: no new sandbox");
}

#[test]
fn a_probe_kill_follows_the_containers_policy() {
    let p = with_container_policy("Always", serde_json::json!({"restartPolicy": "Never"}));
    let c = container(&p, "app", ContainerState::Running, 0, 5);
    let s = status(vec![sandbox(true)], vec![c.clone()]);
    let live = Probes(HashMap::from([(
        c.id.clone(),
        (Some(ProbeState::Failure), None),
    )]));
    let a = compute_pod_actions(&p, &s, &live);
    assert_eq!(
        a.containers_to_kill[0].message,
        "Container app failed liveness probe"
    );
    assert!(a.containers_to_start.is_empty());
    let p = with_container_policy("Never", serde_json::json!({"restartPolicy": "Always"}));
    let a = compute_pod_actions(&p, &s, &live);
    assert_eq!(a.containers_to_start, vec![0]);
}

#[test]
fn a_failed_init_container_follows_its_own_policy() {
    let p = pod(serde_json::json!({
        "metadata": {"name": "p", "namespace": "ns", "uid": "u"},
        "spec": {"restartPolicy": "Always",
                 "initContainers": [{"name": "i1", "image": "b", "restartPolicy": "Never"}],
                 "containers": [{"name": "app", "image": "busybox"}]}
    }));
    let failed = status(
        vec![sandbox(true)],
        vec![container(&p, "i1", ContainerState::Exited, 1, 5)],
    );
    let a = compute_pod_actions(&p, &failed, &NoProbes);
    assert!(a.kill_pod && a.init_containers_to_start.is_empty());
    let p = pod(serde_json::json!({
        "metadata": {"name": "p", "namespace": "ns", "uid": "u"},
        "spec": {"restartPolicy": "Never",
                 "initContainers": [{"name": "i1", "image": "b", "restartPolicy": "OnFailure"}],
                 "containers": [{"name": "app", "image": "busybox"}]}
    }));
    let failed = status(
        vec![sandbox(true)],
        vec![container(&p, "i1", ContainerState::Exited, 1, 5)],
    );
    assert_eq!(
        compute_pod_actions(&p, &failed, &NoProbes).init_containers_to_start,
        vec![0]
    );
}

/// init, a sidecar, `src` (restarts the whole pod on 42) and `app`.
fn restart_all_pod() -> Pod {
    pod(serde_json::json!({
        "metadata": {"name": "p", "namespace": "ns", "uid": "u"},
        "spec": {"restartPolicy": "Never",
                 "initContainers": [{"name": "init", "image": "b"},
                                    {"name": "side", "image": "b", "restartPolicy": "Always"}],
                 "containers": [
                    {"name": "src", "image": "b", "restartPolicy": "Never",
                     "restartPolicyRules": [{"action": "RestartAllContainers",
                                             "exitCodes": {"operator": "In", "values": [42]}}]},
                    {"name": "app", "image": "b"}]}
    }))
}

fn reset(id: &str, name: &str, kill: bool) -> ResetInfo {
    ResetInfo {
        container_id: id.into(),
        name: name.into(),
        kill,
    }
}

#[test]
fn restart_all_containers_kills_and_removes_everything_sources_last() {
    let p = restart_all_pod();
    let rt = status(
        vec![sandbox(true)],
        vec![
            container(&p, "app", ContainerState::Running, 0, 9),
            container(&p, "src", ContainerState::Exited, 42, 8),
            container(&p, "side", ContainerState::Running, 0, 7),
            // An older instance of the sidecar is removed too.
            container(&p, "side", ContainerState::Exited, 1, 6),
            container(&p, "init", ContainerState::Exited, 0, 5),
        ],
    );
    let a = compute_pod_actions_with(&p, &rt, &NoProbes, None, true);
    assert_eq!(
        a.containers_to_reset,
        vec![
            // Regular containers, then init containers (in spec order,
            // every instance), then the container that exited 42.
            reset("app-9", "app", true),
            reset("init-5", "init", false),
            reset("side-7", "side", true),
            reset("side-6", "side", false),
            reset("src-8", "src", false),
        ]
    );
    // Nothing else happens in that sync: the sandbox stays, nothing starts.
    assert!(!a.kill_pod && !a.create_sandbox);
    assert!(a.containers_to_kill.is_empty());
    assert!(a.init_containers_to_start.is_empty() && a.containers_to_start.is_empty());
}

#[test]
fn after_the_restart_the_pod_starts_over_from_its_first_init_container() {
    let p = restart_all_pod();
    let a = compute_pod_actions_with(
        &p,
        &status(vec![sandbox(true)], vec![]),
        &NoProbes,
        None,
        false,
    );
    assert!(!a.create_sandbox && !a.kill_pod);
    assert_eq!(a.init_containers_to_start, vec![0]);
    assert!(a.containers_to_start.is_empty() && a.containers_to_reset.is_empty());
}

#[test]
fn an_exit_the_rule_does_not_match_follows_the_containers_policy() {
    let p = restart_all_pod();
    let rt = |code| {
        status(
            vec![sandbox(true)],
            vec![
                container(&p, "app", ContainerState::Running, 0, 9),
                container(&p, "src", ContainerState::Exited, code, 8),
                container(&p, "side", ContainerState::Running, 0, 7),
                container(&p, "init", ContainerState::Exited, 0, 5),
            ],
        )
    };
    // Exit 1: `restartPolicy: Never`, nothing to do.
    let a = compute_pod_actions(&p, &rt(1), &NoProbes);
    assert!(a.containers_to_start.is_empty() && a.containers_to_reset.is_empty());
    assert!(!a.kill_pod);
    // Exit 42 counts as a container that runs again (kubelet's
    // `ContainerShouldRestart`), though the sync that sees it resets the
    // pod instead.
    assert!(should_container_be_restarted(
        &podutil::containers(&p)[0],
        &p,
        &rt(42)
    ));
}

/// `computePodActions` (kuberuntime_manager.go v1.36): an ephemeral
/// container starts once, in the existing sandbox, even while init
/// containers run; never in a sandbox being created; never again once the
/// runtime has it, whatever its state.
#[test]
fn ephemeral_containers_start_once_in_the_existing_sandbox() {
    let mut p = with_inits(serde_json::json!([{"name": "i1", "image": "b"}]));
    let dbg = |name: &str| serde_json::json!({"name": name, "image": "busybox"});
    if let Some(s) = p.spec.as_mut() {
        s.ephemeral_containers = Some(vec![
            serde_json::from_value(dbg("dbg")).expect("ec"),
            serde_json::from_value(dbg("dbg2")).expect("ec"),
        ]);
    }
    // A new sandbox: not yet.
    let a = compute_pod_actions(&p, &status(vec![], vec![]), &NoProbes);
    assert!(a.create_sandbox && a.ephemeral_containers_to_start.is_empty());

    // Init container still running: both start.
    let i1 = container(&p, "i1", ContainerState::Running, 0, 5);
    let a = compute_pod_actions(
        &p,
        &status(vec![sandbox(true)], vec![i1.clone()]),
        &NoProbes,
    );
    assert_eq!(a.ephemeral_containers_to_start, vec![0, 1]);
    assert!(a.init_containers_to_start.is_empty() && !a.kill_pod);

    // One exited (code 1, pod policy Always), the other running: neither
    // starts again.
    let mut exited = i1.clone();
    exited.name = "dbg".into();
    exited.id = "dbg-7".into();
    exited.state = ContainerState::Exited;
    exited.exit_code = 1;
    let mut running = i1.clone();
    running.name = "dbg2".into();
    running.id = "dbg2-8".into();
    let app = container(&p, "app", ContainerState::Running, 0, 9);
    let mut done = container(&p, "i1", ContainerState::Exited, 0, 5);
    done.finished_at = 6;
    let a = compute_pod_actions(
        &p,
        &status(vec![sandbox(true)], vec![app, running, exited, done]),
        &NoProbes,
    );
    assert!(a.ephemeral_containers_to_start.is_empty(), "{a:?}");
    assert!(a.containers_to_start.is_empty() && a.containers_to_kill.is_empty() && !a.kill_pod);
}
