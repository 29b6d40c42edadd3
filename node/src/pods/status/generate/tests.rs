use super::*;
use crate::pod::hash::hash_container;
use crate::pods::runtime::status::SandboxStatus;

fn pod(v: serde_json::Value) -> Pod {
    serde_json::from_value(v).expect("pod")
}

fn app_pod(policy: &str) -> Pod {
    pod(serde_json::json!({
        "metadata": {"name": "p", "namespace": "ns", "uid": "u", "generation": 1},
        "spec": {"restartPolicy": policy, "containers": [{"name": "app", "image": "busybox"}]}
    }))
}

fn sandbox() -> SandboxStatus {
    SandboxStatus {
        id: "sb".into(),
        ready: true,
        attempt: 0,
        created_at: 1,
        ip: "10.88.0.7".into(),
        additional_ips: vec![],
        network_mode: 0,
        has_network: true,
    }
}

fn running(p: &Pod, name: &str, restarts: i32) -> ContainerStatus {
    let spec = podutil::container_spec(p, name).expect("spec");
    ContainerStatus {
        id: format!("{name}-id-{restarts}"),
        name: name.into(),
        sandbox_id: "sb".into(),
        state: ContainerState::Running,
        created_at: 100 + i64::from(restarts),
        started_at: 1_700_000_000_000_000_000,
        finished_at: 0,
        exit_code: 0,
        reason: String::new(),
        message: String::new(),
        image: "busybox".into(),
        image_ref: "sha256:abc".into(),
        hash: hash_container(spec),
        restart_count: restarts,
        container_type: String::new(),
        log_path: String::new(),
        resources: None,
        user: None,
    }
}

fn exited(p: &Pod, name: &str, restarts: i32, code: i32) -> ContainerStatus {
    ContainerStatus {
        state: ContainerState::Exited,
        exit_code: code,
        reason: if code == 0 {
            "Completed".into()
        } else {
            "Error".into()
        },
        finished_at: 1_700_000_001_000_000_000,
        ..running(p, name, restarts)
    }
}

fn generate(
    p: &Pod,
    rt: &RuntimePodStatus,
    failures: &HashMap<String, StartFailure>,
    terminal: bool,
) -> PodStatus {
    let old = p.status.clone().unwrap_or_default();
    generate_pod_status(
        p,
        rt,
        &StatusInputs {
            old: &old,
            failures,
            readiness: &NoReadinessProbes,
            host_ips: &["192.168.1.10".to_string()],
            runtime_name: "containerd",
            pod_is_terminal: terminal,
            evicted: None,
            resize_conditions: &[],
            pod_cgroup: None,
        },
    )
}

fn cond<'a>(s: &'a PodStatus, ty: &str) -> &'a PodCondition {
    s.conditions
        .as_ref()
        .and_then(|c| c.iter().find(|c| c.type_ == ty))
        .unwrap_or_else(|| panic!("no condition {ty}"))
}

#[test]
fn new_pod_is_pending_with_container_creating() {
    let p = app_pod("Always");
    let rt = RuntimePodStatus::empty("u", "p", "ns");
    let s = generate(&p, &rt, &HashMap::new(), false);
    assert_eq!(s.phase.as_deref(), Some("Pending"));
    let cs = &s.container_statuses.as_ref().expect("cs")[0];
    assert_eq!(
        cs.state
            .as_ref()
            .and_then(|st| st.waiting.as_ref())
            .and_then(|w| w.reason.as_deref()),
        Some("ContainerCreating")
    );
    assert_eq!(cs.image, "busybox");
    assert!(!cs.ready);
    assert_eq!(cond(&s, "PodReadyToStartContainers").status, "False");
    assert_eq!(cond(&s, "Initialized").status, "True");
    let ready = cond(&s, "Ready");
    assert_eq!(ready.status, "False");
    assert_eq!(ready.reason.as_deref(), Some("ContainersNotReady"));
    assert_eq!(
        ready.message.as_deref(),
        Some("containers with unready status: [app]")
    );
    assert_eq!(cond(&s, "PodScheduled").status, "True");
    assert_eq!(s.qos_class.as_deref(), Some("BestEffort"));
    assert_eq!(s.host_ip.as_deref(), Some("192.168.1.10"));
    assert_eq!(s.observed_generation, Some(1));
    let order: Vec<&str> = s
        .conditions
        .iter()
        .flatten()
        .map(|c| c.type_.as_str())
        .collect();
    assert_eq!(
        order,
        vec![
            "PodReadyToStartContainers",
            "Initialized",
            "Ready",
            "ContainersReady",
            "PodScheduled"
        ]
    );
}

#[test]
fn running_pod_is_ready_with_ip_and_container_id() {
    let p = app_pod("Always");
    let rt = RuntimePodStatus::new("u", "p", "ns", vec![sandbox()], vec![running(&p, "app", 0)]);
    let s = generate(&p, &rt, &HashMap::new(), false);
    assert_eq!(s.phase.as_deref(), Some("Running"));
    assert_eq!(s.pod_ip.as_deref(), Some("10.88.0.7"));
    let cs = &s.container_statuses.as_ref().expect("cs")[0];
    assert!(cs.ready);
    assert_eq!(cs.started, Some(true));
    assert_eq!(cs.container_id.as_deref(), Some("containerd://app-id-0"));
    assert_eq!(cs.image_id, "sha256:abc");
    assert_eq!(cond(&s, "Ready").status, "True");
    assert_eq!(cond(&s, "ContainersReady").status, "True");
    assert_eq!(cond(&s, "PodReadyToStartContainers").status, "True");
}

/// `toKubeContainerUser`/`convertContainerStatusUser`: the runtime's user
/// as reported; one without its Linux part is an empty `user`; none is
/// no `user`.
#[test]
fn the_runtimes_user_is_copied() {
    let p = app_pod("Always");
    let user_of = |user: Option<keelson_cri::api::ContainerUser>| {
        let c = ContainerStatus {
            user,
            ..running(&p, "app", 0)
        };
        let rt = RuntimePodStatus::new("u", "p", "ns", vec![sandbox()], vec![c]);
        let s = generate(&p, &rt, &HashMap::new(), false);
        serde_json::to_value(&s.container_statuses.expect("cs")[0].user).expect("json")
    };
    let linux = keelson_cri::api::LinuxContainerUser {
        uid: 1000,
        gid: 3000,
        supplemental_groups: vec![3000, 4000],
    };
    assert_eq!(
        user_of(Some(keelson_cri::api::ContainerUser { linux: Some(linux) })),
        serde_json::json!({"linux": {"uid": 1000, "gid": 3000, "supplementalGroups": [3000, 4000]}})
    );
    assert_eq!(
        user_of(Some(keelson_cri::api::ContainerUser { linux: None })),
        serde_json::json!({})
    );
    assert_eq!(user_of(None), serde_json::Value::Null);
}

#[test]
fn init_containers_hold_the_app_in_pod_initializing() {
    let p = pod(serde_json::json!({
        "metadata": {"name": "p", "namespace": "ns", "uid": "u"},
        "spec": {"initContainers": [{"name": "init", "image": "busybox"}],
                 "containers": [{"name": "app", "image": "busybox"}]}
    }));
    let rt = RuntimePodStatus::new(
        "u",
        "p",
        "ns",
        vec![sandbox()],
        vec![running(&p, "init", 0)],
    );
    let s = generate(&p, &rt, &HashMap::new(), false);
    assert_eq!(s.phase.as_deref(), Some("Pending"));
    let app = &s.container_statuses.as_ref().expect("cs")[0];
    assert_eq!(
        app.state
            .as_ref()
            .and_then(|st| st.waiting.as_ref())
            .and_then(|w| w.reason.as_deref()),
        Some("PodInitializing")
    );
    let init = cond(&s, "Initialized");
    assert_eq!(init.status, "False");
    assert_eq!(init.reason.as_deref(), Some("ContainersNotInitialized"));
    assert_eq!(
        init.message.as_deref(),
        Some("containers with incomplete status: [init]")
    );

    let done = RuntimePodStatus::new(
        "u",
        "p",
        "ns",
        vec![sandbox()],
        vec![exited(&p, "init", 0, 0), running(&p, "app", 0)],
    );
    let s = generate(&p, &done, &HashMap::new(), false);
    assert_eq!(s.phase.as_deref(), Some("Running"));
    assert_eq!(cond(&s, "Initialized").status, "True");
    let init_status = &s.init_container_statuses.as_ref().expect("init")[0];
    assert!(init_status.ready);
    assert_eq!(
        init_status
            .state
            .as_ref()
            .and_then(|st| st.terminated.as_ref())
            .and_then(|t| t.reason.as_deref()),
        Some("Completed")
    );
}

#[test]
fn crash_loop_shows_waiting_reason_and_last_state() {
    let p = app_pod("Always");
    let rt = RuntimePodStatus::new(
        "u",
        "p",
        "ns",
        vec![sandbox()],
        vec![exited(&p, "app", 2, 1), exited(&p, "app", 1, 1)],
    );
    let failures = HashMap::from([(
        "app".to_string(),
        StartFailure {
            reason: "CrashLoopBackOff".into(),
            message: "back-off 20s restarting failed container=app pod=p_ns(u)".into(),
        },
    )]);
    let s = generate(&p, &rt, &failures, false);
    assert_eq!(s.phase.as_deref(), Some("Running"));
    let cs = &s.container_statuses.as_ref().expect("cs")[0];
    assert_eq!(cs.restart_count, 2);
    let w = cs
        .state
        .as_ref()
        .and_then(|st| st.waiting.as_ref())
        .expect("waiting");
    assert_eq!(w.reason.as_deref(), Some("CrashLoopBackOff"));
    assert!(
        w.message
            .as_deref()
            .is_some_and(|m| m.starts_with("back-off 20s"))
    );
    let last = cs
        .last_state
        .as_ref()
        .and_then(|l| l.terminated.as_ref())
        .expect("last");
    assert_eq!(last.exit_code, 1);
    assert_eq!(last.container_id.as_deref(), Some("containerd://app-id-2"));
}

#[test]
fn finished_pods_by_restart_policy() {
    for (policy, code, phase) in [
        ("Never", 0, "Succeeded"),
        ("Never", 1, "Failed"),
        ("OnFailure", 0, "Succeeded"),
        ("OnFailure", 1, "Running"),
        ("Always", 0, "Running"),
    ] {
        let p = app_pod(policy);
        let rt = RuntimePodStatus::new(
            "u",
            "p",
            "ns",
            vec![sandbox()],
            vec![exited(&p, "app", 0, code)],
        );
        let s = generate(&p, &rt, &HashMap::new(), false);
        assert_eq!(s.phase.as_deref(), Some(phase), "{policy} {code}");
    }
    // Terminating an Always pod: its stopped containers decide.
    let p = app_pod("Always");
    let rt = RuntimePodStatus::new("u", "p", "ns", vec![], vec![exited(&p, "app", 0, 143)]);
    assert_eq!(
        generate(&p, &rt, &HashMap::new(), true).phase.as_deref(),
        Some("Failed")
    );
    let s = generate(
        &p,
        &RuntimePodStatus::new("u", "p", "ns", vec![], vec![exited(&p, "app", 0, 0)]),
        &HashMap::new(),
        true,
    );
    assert_eq!(s.phase.as_deref(), Some("Succeeded"));
    assert_eq!(cond(&s, "Ready").reason.as_deref(), Some("PodCompleted"));
}

#[test]
fn terminal_phase_never_regresses() {
    let mut p = app_pod("Always");
    p.status = Some(PodStatus {
        phase: Some("Failed".into()),
        reason: Some("Evicted".into()),
        ..Default::default()
    });
    let rt = RuntimePodStatus::new("u", "p", "ns", vec![sandbox()], vec![running(&p, "app", 0)]);
    let s = generate(&p, &rt, &HashMap::new(), false);
    assert_eq!(s.phase.as_deref(), Some("Failed"));
    assert_eq!(s.reason.as_deref(), Some("Evicted"));
}

#[test]
fn readiness_gates_and_foreign_conditions() {
    let mut p = pod(serde_json::json!({
        "metadata": {"name": "p", "namespace": "ns", "uid": "u"},
        "spec": {"readinessGates": [{"conditionType": "example.com/lb"}],
                 "containers": [{"name": "app", "image": "busybox"}]}
    }));
    let rt = RuntimePodStatus::new("u", "p", "ns", vec![sandbox()], vec![running(&p, "app", 0)]);
    let s = generate(&p, &rt, &HashMap::new(), false);
    let ready = cond(&s, "Ready");
    assert_eq!(ready.reason.as_deref(), Some("ReadinessGatesNotReady"));
    assert_eq!(
        ready.message.as_deref(),
        Some("corresponding condition of pod readiness gate \"example.com/lb\" does not exist.")
    );
    p.status = Some(PodStatus {
        conditions: Some(vec![PodCondition {
            type_: "example.com/lb".into(),
            status: "True".into(),
            ..Default::default()
        }]),
        ..Default::default()
    });
    let s = generate(&p, &rt, &HashMap::new(), false);
    assert_eq!(cond(&s, "Ready").status, "True");
    assert_eq!(cond(&s, "example.com/lb").status, "True");
}

#[test]
fn probe_results_set_started_and_ready() {
    struct NotReady;
    impl ContainerReadiness for NotReady {
        fn started(&self, _: &str, _: &str, _: &str) -> bool {
            true
        }
        fn ready(&self, _: &str, _: &str, id: &str) -> bool {
            id != "app-id-0"
        }
    }
    let p = app_pod("Always");
    let rt = RuntimePodStatus::new("u", "p", "ns", vec![sandbox()], vec![running(&p, "app", 0)]);
    let old = PodStatus::default();
    let s = generate_pod_status(
        &p,
        &rt,
        &StatusInputs {
            old: &old,
            failures: &HashMap::new(),
            readiness: &NotReady,
            host_ips: &[],
            runtime_name: "containerd",
            pod_is_terminal: false,
            evicted: None,
            resize_conditions: &[],
            pod_cgroup: None,
        },
    );
    let cs = &s.container_statuses.as_ref().expect("cs")[0];
    assert_eq!((cs.started, cs.ready), (Some(true), false));
    assert_eq!(cond(&s, "ContainersReady").status, "False");
}

fn phase_of(p: &Pod, containers: Vec<ContainerStatus>) -> String {
    let rt = RuntimePodStatus::new("u", "p", "ns", vec![sandbox()], containers);
    generate(p, &rt, &HashMap::new(), false)
        .phase
        .unwrap_or_default()
}

#[test]
fn phase_with_container_restart_policies() {
    // ContainerRestartRules (on in v1.36): a container that will run again
    // keeps the pod Running; one that will not, with every other stopped,
    // ends it.
    let p = pod(serde_json::json!({
        "metadata": {"name": "p", "namespace": "ns", "uid": "u"},
        "spec": {"restartPolicy": "Never", "containers": [
            {"name": "app", "image": "busybox", "restartPolicy": "Always"}]}
    }));
    assert_eq!(phase_of(&p, vec![exited(&p, "app", 0, 0)]), "Running");
    let p = pod(serde_json::json!({
        "metadata": {"name": "p", "namespace": "ns", "uid": "u"},
        "spec": {"restartPolicy": "Always", "containers": [
            {"name": "app", "image": "busybox", "restartPolicy": "Never"}]}
    }));
    assert_eq!(phase_of(&p, vec![exited(&p, "app", 0, 1)]), "Failed");
    assert_eq!(phase_of(&p, vec![exited(&p, "app", 0, 0)]), "Succeeded");
    let p = pod(serde_json::json!({
        "metadata": {"name": "p", "namespace": "ns", "uid": "u"},
        "spec": {"restartPolicy": "Always", "containers": [
            {"name": "app", "image": "busybox", "restartPolicy": "Never",
             "restartPolicyRules": [{"action": "Restart", "exitCodes": {"operator": "In", "values": [42]}}]}]}
    }));
    assert_eq!(phase_of(&p, vec![exited(&p, "app", 0, 42)]), "Running");
    assert_eq!(phase_of(&p, vec![exited(&p, "app", 0, 1)]), "Failed");
}

#[test]
fn phase_with_an_init_container_policy() {
    // Pod Never, init container OnFailure: a failed init container is
    // retried, the pod stays Pending.
    let p = pod(serde_json::json!({
        "metadata": {"name": "p", "namespace": "ns", "uid": "u"},
        "spec": {"restartPolicy": "Never",
                 "initContainers": [{"name": "i1", "image": "b", "restartPolicy": "OnFailure"}],
                 "containers": [{"name": "app", "image": "busybox"}]}
    }));
    assert_eq!(phase_of(&p, vec![exited(&p, "i1", 0, 1)]), "Pending");
    // Pod Always, init container Never: a failure ends the pod.
    let p = pod(serde_json::json!({
        "metadata": {"name": "p", "namespace": "ns", "uid": "u"},
        "spec": {"restartPolicy": "Always",
                 "initContainers": [{"name": "i1", "image": "b", "restartPolicy": "Never"}],
                 "containers": [{"name": "app", "image": "busybox"}]}
    }));
    assert_eq!(phase_of(&p, vec![exited(&p, "i1", 0, 1)]), "Failed");
}

#[test]
fn a_pod_re_running_init_containers_in_a_new_sandbox_is_pending() {
    // v1.36 getPhase: a regular init container still to run means Pending,
    // even after the app ran in an earlier sandbox.
    let p = pod(serde_json::json!({
        "metadata": {"name": "p", "namespace": "ns", "uid": "u"},
        "spec": {"restartPolicy": "Always",
                 "initContainers": [{"name": "i1", "image": "b"}],
                 "containers": [{"name": "app", "image": "busybox"}]}
    }));
    let mut old_app = exited(&p, "app", 0, 137);
    old_app.sandbox_id = "old".into();
    let mut old_sb = sandbox();
    old_sb.id = "old".into();
    old_sb.ready = false;
    old_sb.created_at = 0;
    let mut init = running(&p, "i1", 1);
    init.created_at = 500;
    let rt = RuntimePodStatus::new("u", "p", "ns", vec![sandbox(), old_sb], vec![init, old_app]);
    assert!(!has_any_active_regular_container(&p, &rt));
    let s = generate(&p, &rt, &HashMap::new(), false);
    assert_eq!(s.phase.as_deref(), Some("Pending"));
}

/// init, a sidecar, `src` (restarts the whole pod on 42) and `app`.
fn restart_all_pod() -> Pod {
    pod(serde_json::json!({
        "metadata": {"name": "p", "namespace": "ns", "uid": "u", "generation": 1},
        "spec": {"restartPolicy": "Never",
                 "initContainers": [{"name": "init", "image": "busybox"},
                                    {"name": "side", "image": "busybox", "restartPolicy": "Always"}],
                 "containers": [
                    {"name": "src", "image": "busybox", "restartPolicy": "Never",
                     "restartPolicyRules": [{"action": "RestartAllContainers",
                                             "exitCodes": {"operator": "In", "values": [42]}}]},
                    {"name": "app", "image": "busybox"}]}
    }))
}

/// The status generated from `containers`, with `previous` as the last
/// status (kubelet's status manager cache).
fn next_status(
    p: &Pod,
    previous: Option<PodStatus>,
    containers: Vec<ContainerStatus>,
) -> PodStatus {
    let mut p = p.clone();
    p.status = previous;
    let rt = RuntimePodStatus::new("u", "p", "ns", vec![sandbox()], containers);
    generate(&p, &rt, &HashMap::new(), false)
}

fn all_statuses(s: &PodStatus) -> Vec<&ApiContainerStatus> {
    s.init_container_statuses
        .iter()
        .flatten()
        .chain(s.container_statuses.iter().flatten())
        .collect()
}

fn status_named<'a>(s: &'a PodStatus, name: &str) -> &'a ApiContainerStatus {
    all_statuses(s)
        .into_iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no status of {name}"))
}

/// A container instance created after the restart (new id, the runtime's
/// restart count starts again at 0).
fn fresh(c: ContainerStatus) -> ContainerStatus {
    ContainerStatus {
        id: format!("{}-new", c.name),
        created_at: 1_000,
        ..c
    }
}

#[test]
fn restart_all_containers_status_sequence() {
    let p = restart_all_pod();
    let running_all = |p: &Pod| {
        vec![
            running(p, "app", 0),
            running(p, "src", 0),
            running(p, "side", 0),
            exited(p, "init", 0, 0),
        ]
    };
    let before = next_status(&p, None, running_all(&p));
    assert_eq!(before.phase.as_deref(), Some("Running"));
    let c = cond(&before, "AllContainersRestarting");
    assert_eq!((c.status.as_str(), c.reason.as_deref()), ("False", None));
    assert_eq!(c.observed_generation, None);
    assert_eq!(cond(&before, "Initialized").status, "True");

    // `src` exits 42: the condition turns True, the pod stays Running.
    let exit = vec![
        running(&p, "app", 0),
        exited(&p, "src", 0, 42),
        running(&p, "side", 0),
        exited(&p, "init", 0, 0),
    ];
    let marked = next_status(&p, Some(before), exit);
    let c = cond(&marked, "AllContainersRestarting");
    assert_eq!(c.status, "True");
    assert_eq!(c.reason.as_deref(), Some("RestartAllContainersStarted"));
    assert_eq!(
        c.message.as_deref(),
        Some("container exited with restart policy rule")
    );
    assert_eq!(marked.phase.as_deref(), Some("Running"));

    // Every container removed: waiting with kubelet's words, one restart
    // more each, the condition False again, the pod still Running and
    // still Initialized.
    let removed = next_status(&p, Some(marked), vec![]);
    assert_eq!(removed.phase.as_deref(), Some("Running"));
    assert_eq!(cond(&removed, "AllContainersRestarting").status, "False");
    assert_eq!(cond(&removed, "Initialized").status, "True");
    assert_eq!(cond(&removed, "Ready").status, "False");
    for s in all_statuses(&removed) {
        let w = s
            .state
            .as_ref()
            .and_then(|st| st.waiting.as_ref())
            .unwrap_or_else(|| panic!("{} not waiting", s.name));
        assert_eq!(w.reason.as_deref(), Some("RestartingAllContainers"));
        assert_eq!(
            w.message.as_deref(),
            Some("The container is removed because RestartAllContainers in place")
        );
        let last = last_terminated(s).expect("last state");
        assert_eq!(
            (last.exit_code, last.reason.as_deref()),
            (137, Some("RestartingAllContainers"))
        );
        assert_eq!(s.restart_count, 1, "{}", s.name);
    }

    // The init container runs again: Pending while it runs, the restart
    // count kept although the runtime's starts at 0.
    let init_again = next_status(&p, Some(removed), vec![fresh(running(&p, "init", 0))]);
    assert_eq!(init_again.phase.as_deref(), Some("Pending"));
    assert_eq!(cond(&init_again, "Initialized").status, "True");
    let init = status_named(&init_again, "init");
    assert_eq!(init.restart_count, 1);
    assert_eq!(
        last_terminated(init).and_then(|t| t.reason.as_deref()),
        Some("RestartingAllContainers")
    );

    // Everything runs again with one restart each.
    let again: Vec<ContainerStatus> = running_all(&p).into_iter().map(fresh).collect();
    let after = next_status(&p, Some(init_again), again);
    assert_eq!(after.phase.as_deref(), Some("Running"));
    assert_eq!(cond(&after, "AllContainersRestarting").status, "False");
    for s in all_statuses(&after) {
        assert_eq!(s.restart_count, 1, "{}", s.name);
        assert!(
            s.container_id
                .as_deref()
                .is_some_and(|id| id.ends_with("-new"))
        );
    }
}

#[test]
fn an_exit_the_rule_does_not_match_follows_the_containers_policy() {
    let p = restart_all_pod();
    let s = next_status(
        &p,
        None,
        vec![
            running(&p, "app", 0),
            exited(&p, "src", 0, 1),
            running(&p, "side", 0),
            exited(&p, "init", 0, 0),
        ],
    );
    assert_eq!(s.phase.as_deref(), Some("Running"));
    assert_eq!(cond(&s, "AllContainersRestarting").status, "False");
    let src = status_named(&s, "src");
    assert_eq!(
        src.state
            .as_ref()
            .and_then(|st| st.terminated.as_ref())
            .map(|t| t.exit_code),
        Some(1)
    );
    // Only `src` left and it will not run again: the pod failed.
    let all_done = vec![
        exited(&p, "src", 0, 1),
        exited(&p, "app", 0, 0),
        exited(&p, "side", 0, 137),
        exited(&p, "init", 0, 0),
    ];
    assert_eq!(phase_of(&p, all_done), "Failed");
    // A pod without such a rule gets no AllContainersRestarting condition.
    let plain = next_status(&app_pod("Always"), None, vec![]);
    assert!(
        plain
            .conditions
            .iter()
            .flatten()
            .all(|c| c.type_ != "AllContainersRestarting")
    );
}
