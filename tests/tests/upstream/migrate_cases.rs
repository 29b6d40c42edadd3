//! `keelson migrate --from-kubelet --apply` and `--rollback` held to the
//! real kubelet v1.36 on the real containerd: pods the real kubelet
//! started are adopted by keelson, not restarted, and the real kubelet,
//! started again, adopts them back from keelson.
//!
//! The node first runs kubelet with its KubeletConfiguration file. Then,
//! as the migration does (agent/src/migrate/{plan,apply}.rs), kubelet is
//! stopped with SIGTERM (`systemctl stop kubelet`, which leaves the
//! containers to containerd) and keelson starts with kubelet's very files:
//! the same KubeletConfiguration, kubelet's kubeconfig (the node's
//! identity) and kubelet's root dir as overrides (the plan's
//! `Overrides { kubeconfig, root_dir }`), the node's IP and name as
//! kubeadm's flags file gives them, the proxy role off (no
//! `--replace-kube-proxy`). The rollback stops keelson and starts kubelet
//! again on the same files, as `--rollback` restarts kubelet.service.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, anyhow, ensure};
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod};
use keelson_cri::{RuntimeClient, api};
use keelson_tests::support::wait_for;
use keelson_tests::upstream::{Agents, Case, ClusterNode, Env, NodeAgent, NodeSpec, ProxyAgent};
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams, PostParams};

use crate::support::{
    brief_status, busybox_pod, create_pod, namespace, pod_condition, read_pod_cgroup, wait_pod,
    wait_pod_ready,
};

pub const CASES: &[Case] = &[Case {
    name: "migrate_adopts_kubelets_pods_and_back",
    agents: &[Agents::Keelson],
    run: |env, _| Box::pin(migrate_adopts_kubelets_pods_and_back(env)),
}];

/// The pods kubelet starts and their containers.
const KUBELETS_PODS: [(&str, &[&str]); 3] = [
    ("web", &["main"]),
    ("pair", &["first", "second"]),
    ("flaky", &["main"]),
];
/// The pod keelson starts, which kubelet adopts at the rollback.
const KEELSONS_POD: (&str, &[&str]) = ("late", &["main"]);

/// busybox running `script` as container `name`.
fn container(name: &str, script: &str) -> serde_json::Value {
    let mut c = busybox_pod(name, "", script)["spec"]["containers"][0].take();
    c["name"] = name.into();
    c
}

/// A pod bound to `node` with `containers` and `volumes`.
fn pod_json(
    name: &str,
    node: &str,
    containers: Vec<serde_json::Value>,
    volumes: serde_json::Value,
) -> serde_json::Value {
    let mut pod = busybox_pod(name, node, "");
    pod["spec"]["terminationGracePeriodSeconds"] = 2.into();
    pod["spec"]["containers"] = containers.into();
    pod["spec"]["volumes"] = volumes;
    pod
}

/// A ConfigMap volume and a readiness probe on a file the test removes
/// and puts back.
fn probed_pod(name: &str, node: &str) -> serde_json::Value {
    let mut main = container("main", "touch /tmp/ready; exec sleep 3600");
    main["volumeMounts"] = serde_json::json!([{"name": "cfg", "mountPath": "/etc/cfg"}]);
    main["readinessProbe"] = serde_json::json!({
        "exec": {"command": ["cat", "/tmp/ready"]},
        "periodSeconds": 1,
        "failureThreshold": 1,
    });
    pod_json(
        name,
        node,
        vec![main],
        serde_json::json!([{"name": "cfg", "configMap": {"name": "web-config"}}]),
    )
}

fn kubelets_pods_json(node: &str) -> Vec<serde_json::Value> {
    // Two containers, the first with resources (a Burstable pod: its
    // allocated and actuated resources are in the root dir's checkpoints,
    // its containers' resources in the status), the second with a
    // liveness probe (a liveness result lost in the handover would
    // restart it).
    let mut first = container("first", "exec sleep 3600");
    first["resources"] = serde_json::json!({
        "requests": {"cpu": "50m", "memory": "32Mi"},
        "limits": {"cpu": "100m", "memory": "64Mi"},
    });
    let mut second = container("second", "exec sleep 3600");
    second["livenessProbe"] = serde_json::json!({
        "exec": {"command": ["true"]},
        "periodSeconds": 1,
    });
    // Run n (a count in its emptyDir) exits at once the first time, and
    // later when the test creates /data/exit<n>: restartCount 1 under
    // kubelet, 2 once the test lets it exit under keelson.
    let mut flaky = container(
        "main",
        "n=$(cat /data/runs 2>/dev/null || echo 0); echo $((n+1)) > /data/runs; \
         [ $n = 0 ] && exit 1; \
         while [ ! -f /data/exit$n ]; do sleep 0.2; done; exit 1",
    );
    flaky["volumeMounts"] = serde_json::json!([{"name": "data", "mountPath": "/data"}]);
    vec![
        probed_pod("web", node),
        pod_json("pair", node, vec![first, second], serde_json::json!([])),
        pod_json(
            "flaky",
            node,
            vec![flaky],
            serde_json::json!([{"name": "data", "emptyDir": {}}]),
        ),
    ]
}

/// One container instance as the runtime has it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct CriContainer {
    pod: String,
    name: String,
    state: i32,
    created_at: i64,
    attempt: u32,
    restart_count: String,
    hash: String,
}

/// The case's sandboxes and containers in containerd (by id).
#[derive(Debug, Clone, PartialEq, Eq)]
struct CriView {
    /// id → (pod name, state, created_at, attempt).
    sandboxes: BTreeMap<String, (String, i32, i64, u32)>,
    containers: BTreeMap<String, CriContainer>,
}

async fn cri_view(cri: &RuntimeClient, ns: &str) -> anyhow::Result<CriView> {
    let ours = |labels: &std::collections::HashMap<String, String>| {
        labels
            .get("io.kubernetes.pod.namespace")
            .map(String::as_str)
            == Some(ns)
    };
    let mut view = CriView {
        sandboxes: BTreeMap::new(),
        containers: BTreeMap::new(),
    };
    for s in cri.list_pod_sandbox(None).await? {
        if !ours(&s.labels) {
            continue;
        }
        let m = s.metadata.clone().unwrap_or_default();
        view.sandboxes
            .insert(s.id.clone(), (m.name, s.state, s.created_at, m.attempt));
    }
    for c in cri.list_containers(None).await? {
        if !ours(&c.labels) {
            continue;
        }
        let get = |k: &str| c.annotations.get(k).cloned().unwrap_or_default();
        view.containers.insert(
            c.id.clone(),
            CriContainer {
                pod: c
                    .labels
                    .get("io.kubernetes.pod.name")
                    .cloned()
                    .unwrap_or_default(),
                name: c
                    .metadata
                    .as_ref()
                    .map(|m| m.name.clone())
                    .unwrap_or_default(),
                state: c.state,
                created_at: c.created_at,
                attempt: c.metadata.as_ref().map_or(0, |m| m.attempt),
                restart_count: get("io.kubernetes.container.restartCount"),
                hash: get("io.kubernetes.container.hash"),
            },
        );
    }
    Ok(view)
}

/// The running container `name` of pod `pod` in `view`.
fn running_id(view: &CriView, pod: &str, name: &str) -> anyhow::Result<String> {
    view.containers
        .iter()
        .find(|(_, c)| {
            c.pod == pod
                && c.name == name
                && c.state == api::ContainerState::ContainerRunning as i32
        })
        .map(|(id, _)| id.clone())
        .ok_or_else(|| anyhow!("no running container {pod}/{name} in {view:#?}"))
}

/// What the API shows of one container: id, restarts, running since.
#[derive(Debug, Clone, PartialEq, Eq)]
struct ApiContainer {
    id: String,
    restart_count: i32,
    started_at: Option<String>,
}

/// Each pod's IP and container statuses (name → what the API shows).
type ApiView = BTreeMap<String, (Option<String>, BTreeMap<String, ApiContainer>)>;

/// The case's pods as the API shows them.
async fn api_view(client: &kube::Client, ns: &str) -> anyhow::Result<ApiView> {
    let pods = Api::<Pod>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await?;
    let mut out = BTreeMap::new();
    for p in pods.items {
        let name = p.metadata.name.clone().unwrap_or_default();
        let status = p.status.clone().unwrap_or_default();
        let containers = status
            .container_statuses
            .iter()
            .flatten()
            .map(|c| {
                (
                    c.name.clone(),
                    ApiContainer {
                        id: c.container_id.clone().unwrap_or_default(),
                        restart_count: c.restart_count,
                        started_at: c
                            .state
                            .as_ref()
                            .and_then(|s| s.running.as_ref())
                            .and_then(|r| r.started_at.as_ref())
                            .map(|t| t.0.to_string()),
                    },
                )
            })
            .collect();
        out.insert(name, (status.pod_ip.clone(), containers));
    }
    Ok(out)
}

/// Every pod of `pods` Ready (so every container running and ready).
async fn wait_all_ready(env: &Env, ns: &str, pods: &[&str], what: &str) -> anyhow::Result<()> {
    for pod in pods {
        wait_pod_ready(&env.admin, ns, pod)
            .await
            .with_context(|| format!("{pod} {what}"))?;
    }
    Ok(())
}

/// The Node is Ready with a heartbeat newer than `since` (whole seconds,
/// as the migration judges it).
async fn wait_heartbeat_after(
    env: &Env,
    node: &ClusterNode,
    since: jiff::Timestamp,
) -> anyhow::Result<()> {
    let nodes: Api<Node> = Api::all(env.admin.clone());
    wait_for(
        &format!("Node {} Ready with a heartbeat after {since}", node.name),
        Duration::from_secs(60),
        Duration::from_millis(250),
        || {
            let nodes = nodes.clone();
            let name = node.name.clone();
            async move {
                let n = nodes.get(&name).await.map_err(|e| e.to_string())?;
                let ready = n
                    .status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
                    .ok_or("no Ready condition")?;
                let hb = ready
                    .last_heartbeat_time
                    .as_ref()
                    .map(|t| t.0.as_second())
                    .unwrap_or_default();
                if ready.status == "True" && hb > since.as_second() {
                    Ok(())
                } else {
                    Err(format!("Ready={} heartbeat {hb}", ready.status))
                }
            }
        },
    )
    .await?;
    Ok(())
}

/// Waits for the next whole second after `t`, the stopped agent's last
/// moment: heartbeats have whole seconds, so one newer than `t`'s second is
/// the next agent's (kubelet posts an unchanged status only every
/// `nodeStatusReportFrequency`, 5 min: a first post in `t`'s own second
/// could not be told from the stopped agent's).
async fn after_the_second_of(t: jiff::Timestamp) -> anyhow::Result<()> {
    wait_for(
        "the next second",
        Duration::from_secs(2),
        Duration::from_millis(20),
        || async {
            let now = jiff::Timestamp::now();
            if now.as_second() > t.as_second() {
                Ok(())
            } else {
                Err(format!("{now}"))
            }
        },
    )
    .await?;
    Ok(())
}

/// Runs `cmd` in a container through CRI; its stdout.
async fn exec(cri: &RuntimeClient, id: &str, cmd: &[&str]) -> anyhow::Result<String> {
    let r = cri
        .exec_sync(
            id,
            cmd.iter().map(|s| s.to_string()).collect(),
            Duration::from_secs(5),
        )
        .await?;
    ensure!(
        r.exit_code == 0,
        "{cmd:?} in {id}: exit {} {}",
        r.exit_code,
        String::from_utf8_lossy(&r.stderr)
    );
    Ok(String::from_utf8_lossy(&r.stdout).into_owned())
}

/// The readiness probe runs under the current agent: `pod` goes unready
/// when its `container` loses its file and Ready again when it is back.
async fn readiness_flips(
    env: &Env,
    ns: &str,
    cri: &RuntimeClient,
    pod: &str,
    container: &str,
) -> anyhow::Result<()> {
    for (cmd, want) in [("rm", "False"), ("touch", "True")] {
        exec(cri, container, &[cmd, "/tmp/ready"]).await?;
        wait_pod(
            &env.admin,
            ns,
            pod,
            &format!("{pod} Ready={want} after `{cmd} /tmp/ready`"),
            Duration::from_secs(30),
            |p| {
                (pod_condition(p, "Ready").as_deref() == Some(want))
                    .then_some(())
                    .ok_or_else(|| "not yet".to_string())
            },
        )
        .await?;
    }
    Ok(())
}

/// A ConfigMap update reaches the volume of each running container of
/// `containers`.
async fn config_map_propagates(
    env: &Env,
    ns: &str,
    cri: &RuntimeClient,
    containers: &[&str],
    value: &str,
) -> anyhow::Result<()> {
    Api::<ConfigMap>::namespaced(env.admin.clone(), ns)
        .patch(
            "web-config",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"data": {"greeting": value}})),
        )
        .await?;
    for id in containers {
        wait_for(
            &format!("the ConfigMap's {value:?} in {id}'s volume"),
            Duration::from_secs(60),
            Duration::from_millis(250),
            || async {
                let seen = exec(cri, id, &["cat", "/etc/cfg/greeting"])
                    .await
                    .map_err(|e| e.to_string())?;
                if seen == value {
                    Ok(())
                } else {
                    Err(format!("the file holds {seen:?}"))
                }
            },
        )
        .await?;
    }
    Ok(())
}

/// The runtime and the API show the very same sandboxes and containers
/// (ids, creation times, restart counts) as `before`.
async fn check_unchanged(
    env: &Env,
    ns: &str,
    cri: &RuntimeClient,
    before: &CriView,
    api_before: &ApiView,
    who: &str,
) -> anyhow::Result<()> {
    let now = cri_view(cri, ns).await?;
    // Container garbage collection may remove exited containers (kubelet
    // keeps the newest dead one per pod and name, maxPerPodContainer 1, and
    // collects at its start); nothing else may change.
    let exited = api::ContainerState::ContainerExited as i32;
    let collected = before
        .containers
        .iter()
        .filter(|(id, c)| c.state == exited && !now.containers.contains_key(*id))
        .count();
    let mut kept = before.clone();
    kept.containers
        .retain(|id, c| c.state != exited || now.containers.contains_key(id));
    ensure!(
        now == kept,
        "{who} changed the runtime's sandboxes or containers:\nbefore: {before:#?}\nnow: {now:#?}"
    );
    if collected > 0 {
        eprintln!("        ({who}: {collected} exited container(s) garbage-collected)");
    }
    let api_now = api_view(&env.admin, ns).await?;
    ensure!(
        &api_now == api_before,
        "the pods' status under {who} differs:\nbefore: {api_before:#?}\nnow: {api_now:#?}"
    );
    Ok(())
}

/// Each pod's status as `path=value` lines, without the conditions' times
/// (the readiness flips move them).
async fn status_lines(
    client: &kube::Client,
    ns: &str,
) -> anyhow::Result<std::collections::BTreeSet<String>> {
    fn flatten(path: &str, v: &serde_json::Value, out: &mut std::collections::BTreeSet<String>) {
        match v {
            serde_json::Value::Object(m) => {
                for (k, v) in m {
                    flatten(&format!("{path}.{k}"), v, out);
                }
            }
            serde_json::Value::Array(a) => {
                for (i, v) in a.iter().enumerate() {
                    flatten(&format!("{path}.{i}"), v, out);
                }
            }
            v => {
                out.insert(format!("{path}={v}"));
            }
        }
    }
    let pods = Api::<Pod>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await?;
    let mut out = std::collections::BTreeSet::new();
    for p in pods.items {
        let mut v = serde_json::to_value(p.status.clone().unwrap_or_default())?;
        for c in v
            .get_mut("conditions")
            .and_then(|c| c.as_array_mut())
            .into_iter()
            .flatten()
        {
            if let Some(m) = c.as_object_mut() {
                m.remove("lastTransitionTime");
                m.remove("lastProbeTime");
            }
        }
        flatten(&p.metadata.name.clone().unwrap_or_default(), &v, &mut out);
    }
    Ok(out)
}

/// What differs between two [`status_lines`].
fn status_differences(
    before: &std::collections::BTreeSet<String>,
    now: &std::collections::BTreeSet<String>,
) -> String {
    let gone: Vec<&String> = before.difference(now).collect();
    let new: Vec<&String> = now.difference(before).collect();
    if gone.is_empty() && new.is_empty() {
        return String::new();
    }
    format!("  before only: {gone:#?}\n  now only: {new:#?}")
}

/// The sandbox the log line of `pod` names is `sandbox`.
fn adoption_logged(log: &str, ns: &str, pod: &str, sandbox: &str) -> bool {
    log.lines().any(|l| {
        l.contains("adopted the pod's running sandbox and containers")
            && l.contains(&format!("{ns}/{pod}"))
            && l.contains(sandbox)
    })
}

/// Pods the real kubelet runs (a ConfigMap volume and a readiness probe;
/// two containers with resources and a liveness probe; one restarted once)
/// are adopted by keelson started as the migration starts it: the same
/// sandboxes and containers in containerd, the same container ids, restart
/// counts, start times and statuses in the API, the Node Ready with
/// keelson's heartbeat, the probes running under keelson (readiness
/// flips), a ConfigMap update reaching the volume, keelson's log naming
/// each adopted sandbox. Then keelson restarts one container (restartCount
/// 2) and starts a pod of its own, and the rollback: keelson stops, kubelet
/// starts on its files and adopts every sandbox and container, kubelet's
/// and keelson's, with the same checks.
async fn migrate_adopts_kubelets_pods_and_back(env: Arc<Env>) -> anyhow::Result<()> {
    let spec = NodeSpec {
        node: NodeAgent::Kubelet,
        proxy: ProxyAgent::None,
        // kubelet rewrites ConfigMap volumes at its periodic pod sync
        // (every syncFrequency, 1 min by default, plus jitter); keelson
        // also at once on the watch. 5 s keeps the case short.
        kubelet: Some(Arc::new(|c| {
            c.insert("syncFrequency".into(), "5s".into());
        })),
        ..NodeSpec::of(Agents::Upstream)
    };
    let node = env.start_node("migrated", spec).await?;
    let result = run(&env, &node).await;
    if result.is_err() {
        let tail = |f: &str| keelson_tests::upstream::daemon::log_tail(&node.dir().join(f), 60);
        eprintln!(
            "--- kubelet.log (tail) ---\n{}\n--- keelson.log (tail) ---\n{}",
            tail("kubelet.log"),
            tail("keelson.log")
        );
    }
    result
}

/// Elapsed time since the case began, for the progress lines.
struct Clock(std::time::Instant);

impl Clock {
    fn say(&self, what: &str) {
        eprintln!("[{:>5.1}s] {what}", self.0.elapsed().as_secs_f64());
    }
}

async fn run(env: &Env, node: &ClusterNode) -> anyhow::Result<()> {
    let clock = Clock(std::time::Instant::now());
    node.wait_ready(&env.admin).await?;
    let ns = namespace(&env.admin, "migrate").await?;
    let cm: ConfigMap = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "web-config"},
        "data": {"greeting": "from kubelet's time"},
    }))?;
    Api::<ConfigMap>::namespaced(env.admin.clone(), &ns)
        .create(&PostParams::default(), &cm)
        .await?;
    for p in kubelets_pods_json(&node.name) {
        create_pod(&env.admin, &ns, p).await?;
    }
    let kubelets: Vec<&str> = KUBELETS_PODS.iter().map(|(p, _)| *p).collect();
    wait_flaky_restarts(env, &ns, 1).await?;
    wait_all_ready(env, &ns, &kubelets, "under kubelet").await?;
    let cri = node.containerd().client();
    let before = cri_view(cri, &ns).await?;
    ensure!(
        before.sandboxes.len() == KUBELETS_PODS.len(),
        "one sandbox per pod: {before:#?}"
    );
    let api_before = api_view(&env.admin, &ns).await?;
    check_ids_agree(&before, &api_before, &KUBELETS_PODS)?;
    ensure!(
        api_before["flaky"].1["main"].restart_count == 1,
        "{:?}",
        api_before["flaky"]
    );
    clock.say("kubelet runs web, pair and flaky (restarted once)");
    wait_settled_status(env, node, &ns, &kubelets).await?;
    let status_kubelet = status_lines(&env.admin, &ns).await?;

    // kubelet → keelson, as `keelson migrate --from-kubelet --apply`.
    let kubelet_stopped = node.stop_node_agent();
    let stopped = jiff::Timestamp::now();
    clock.say(&format!("kubelet stopped ({kubelet_stopped})"));
    // SIGTERM stops kubelet and leaves every container running.
    check_unchanged(env, &ns, cri, &before, &api_before, "kubelet's stop").await?;
    after_the_second_of(stopped).await?;
    node.start_node_agent_on_kubelets_files(NodeAgent::Keelson)?;
    wait_heartbeat_after(env, node, stopped).await?;
    clock.say("Node Ready with keelson's heartbeat");
    let log_path = node.dir().join("keelson.log");
    wait_for(
        "keelson's log to name every adopted sandbox",
        Duration::from_secs(60),
        Duration::from_millis(250),
        || async {
            let log = std::fs::read_to_string(&log_path).map_err(|e| e.to_string())?;
            let missing: Vec<&str> = kubelets
                .iter()
                .copied()
                .filter(|p| {
                    let sandbox = before
                        .sandboxes
                        .iter()
                        .find(|(_, s)| s.0 == *p)
                        .map(|(id, _)| id.as_str())
                        .unwrap_or("?");
                    !adoption_logged(&log, &ns, p, sandbox)
                })
                .collect();
            if missing.is_empty() {
                Ok(())
            } else {
                Err(format!("not yet for {missing:?}"))
            }
        },
    )
    .await?;
    clock.say("keelson's log names each adopted sandbox");
    let web = running_id(&before, "web", "main")?;
    readiness_flips(env, &ns, cri, "web", &web).await?;
    clock.say("web's readiness probe flips under keelson");
    config_map_propagates(env, &ns, cri, &[&web], "from keelson's time").await?;
    clock.say("a ConfigMap update reaches web's volume under keelson");
    wait_all_ready(env, &ns, &kubelets, "under keelson").await?;
    check_unchanged(env, &ns, cri, &before, &api_before, "keelson").await?;
    clock.say("keelson kept every sandbox, container, id and restart count");
    let d = status_differences(&status_kubelet, &status_lines(&env.admin, &ns).await?);
    ensure!(
        d.is_empty(),
        "keelson's statuses differ from kubelet's:\n{d}"
    );
    clock.say("keelson writes the very statuses kubelet wrote");
    node.check_running()?;
    let log = std::fs::read_to_string(&log_path)?;
    ensure!(
        !log.contains("replaces part of it"),
        "keelson replaced part of a pod:\n{}",
        log.lines()
            .filter(|l| l.contains("replaces part of it"))
            .collect::<Vec<_>>()
            .join("\n")
    );

    // What keelson creates, kubelet must adopt too: a restart (keelson's
    // restartCount annotation) and a pod of keelson's own.
    let flaky_before = running_id(&before, "flaky", "main")?;
    exec(cri, &flaky_before, &["touch", "/data/exit1"]).await?;
    create_pod(&env.admin, &ns, probed_pod(KEELSONS_POD.0, &node.name)).await?;
    wait_flaky_restarts(env, &ns, 2).await?;
    let all: Vec<&str> = kubelets.iter().copied().chain([KEELSONS_POD.0]).collect();
    wait_all_ready(env, &ns, &all, "keelson's restart and pod").await?;
    let mid = cri_view(cri, &ns).await?;
    let api_mid = api_view(&env.admin, &ns).await?;
    wait_settled_status(env, node, &ns, &all).await?;
    let status_keelson = status_lines(&env.admin, &ns).await?;
    let every: Vec<(&str, &[&str])> = KUBELETS_PODS
        .iter()
        .copied()
        .chain([KEELSONS_POD])
        .collect();
    check_ids_agree(&mid, &api_mid, &every)?;
    let flaky_now = running_id(&mid, "flaky", "main")?;
    ensure!(
        flaky_now != flaky_before && mid.containers[&flaky_now].restart_count == "2",
        "keelson's restart of flaky: {:#?}",
        mid.containers.get(&flaky_now)
    );
    clock.say("keelson restarted flaky (restartCount 2) and runs a pod of its own");

    // keelson → kubelet, as `keelson migrate --rollback`.
    let keelson_stopped = node.stop_node_agent();
    let stopped = jiff::Timestamp::now();
    clock.say(&format!("keelson stopped ({keelson_stopped})"));
    ensure!(
        keelson_stopped == "exit status: 0",
        "keelson's stop: {keelson_stopped}"
    );
    check_unchanged(env, &ns, cri, &mid, &api_mid, "keelson's stop").await?;
    after_the_second_of(stopped).await?;
    node.start_node_agent_on_kubelets_files(NodeAgent::Kubelet)?;
    wait_heartbeat_after(env, node, stopped).await?;
    clock.say("Node Ready with kubelet's heartbeat again");
    // kubelet, new to these containers, runs their readiness probes before
    // the pods are Ready again (prober_manager.go UpdatePodStatus).
    wait_all_ready(env, &ns, &all, "under kubelet again").await?;
    let late = running_id(&mid, KEELSONS_POD.0, "main")?;
    readiness_flips(env, &ns, cri, "web", &web).await?;
    readiness_flips(env, &ns, cri, KEELSONS_POD.0, &late).await?;
    clock.say("readiness probes flip under kubelet (kubelet's and keelson's containers)");
    config_map_propagates(env, &ns, cri, &[&web, &late], "from kubelet's time again").await?;
    clock.say("a ConfigMap update reaches both volumes under kubelet");
    wait_all_ready(env, &ns, &all, "under kubelet again, after the checks").await?;
    check_unchanged(env, &ns, cri, &mid, &api_mid, "kubelet after the rollback").await?;
    node.check_running().context("kubelet after the rollback")?;
    clock.say("kubelet kept every sandbox, container, id and restart count");
    let d = status_differences(&status_keelson, &status_lines(&env.admin, &ns).await?);
    ensure!(
        d.is_empty(),
        "kubelet's statuses differ from keelson's:\n{d}"
    );
    clock.say("kubelet writes the very statuses keelson wrote");
    Ok(())
}

/// Waits until each pod's pod-level `status.resources` shows its pod
/// cgroup's memory limit. kubelet reads the cgroup only at a sync whose
/// previous status already said Running (kubelet_pods.go
/// convertToAPIPodLevelResourcesStatus; before, it shows the allocated
/// limits: none for a BestEffort pod, the containers' sum for a Burstable
/// one), so this is its next periodic sync; keelson, taking over Running
/// pods, reads the cgroup at once. The statuses compared across a
/// handover are then the settled ones.
async fn wait_settled_status(
    env: &Env,
    node: &ClusterNode,
    ns: &str,
    pods: &[&str],
) -> anyhow::Result<()> {
    for pod in pods {
        wait_pod(
            &env.admin,
            ns,
            pod,
            &format!("the pod cgroup's memory limit in the status.resources of {pod}"),
            Duration::from_secs(30),
            |p| {
                let cgroup = pod_cgroup_memory_limit(node, p)?;
                let shown = p
                    .status
                    .as_ref()
                    .and_then(|s| s.resources.as_ref())
                    .and_then(|r| r.limits.as_ref())
                    .and_then(|l| l.get("memory"))
                    .map(|q| q.0.clone())
                    .unwrap_or_default();
                if binary_quantity(&shown) == Some(cgroup) {
                    Ok(())
                } else {
                    Err(format!("status {shown:?}, cgroup {cgroup}"))
                }
            },
        )
        .await?;
    }
    Ok(())
}

/// The pod cgroup's memory limit in bytes: cgroup v1's
/// `memory.limit_in_bytes` or v2's `memory.max` (`max` as `i64::MAX`).
fn pod_cgroup_memory_limit(node: &ClusterNode, p: &Pod) -> Result<i64, String> {
    let text = read_pod_cgroup(node, p, "memory", "memory.limit_in_bytes", "memory.max")?;
    match text.trim() {
        "max" => Ok(i64::MAX),
        n => n.parse().map_err(|e| format!("{n:?}: {e}")),
    }
}

/// A memory quantity as apimachinery writes it (`64Mi`,
/// `9007199254740988Ki`, plain bytes) in bytes.
fn binary_quantity(q: &str) -> Option<i64> {
    let (digits, unit) = match q.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => q.split_at(i),
        None => (q, ""),
    };
    let shift = match unit {
        "" => 0,
        "Ki" => 10,
        "Mi" => 20,
        "Gi" => 30,
        "Ti" => 40,
        "Pi" => 50,
        "Ei" => 60,
        _ => return None,
    };
    digits.parse::<i64>().ok()?.checked_mul(1_i64 << shift)
}

/// flaky's container has restarted `count` times and is running.
async fn wait_flaky_restarts(env: &Env, ns: &str, count: i32) -> anyhow::Result<()> {
    wait_pod(
        &env.admin,
        ns,
        "flaky",
        &format!("flaky restarted {count} times and running"),
        Duration::from_secs(60),
        |p| {
            let s = p
                .status
                .as_ref()
                .and_then(|s| s.container_statuses.as_ref())
                .and_then(|cs| cs.first())
                .ok_or("no container status")?;
            let running = s.state.as_ref().is_some_and(|st| st.running.is_some());
            (s.restart_count == count && running && s.ready)
                .then_some(())
                .ok_or_else(|| brief_status(p))
        },
    )
    .await?;
    Ok(())
}

/// The API's container ids are the running containers of the runtime.
fn check_ids_agree(view: &CriView, api: &ApiView, pods: &[(&str, &[&str])]) -> anyhow::Result<()> {
    for (pod, containers) in pods {
        for c in *containers {
            let id = running_id(view, pod, c)?;
            let shown = api
                .get(*pod)
                .and_then(|(_, cs)| cs.get(*c))
                .ok_or_else(|| anyhow!("no status of {pod}/{c}"))?;
            ensure!(
                shown.id == format!("containerd://{id}"),
                "{pod}/{c}: the API shows {} for running {id}",
                shown.id
            );
        }
    }
    Ok(())
}
