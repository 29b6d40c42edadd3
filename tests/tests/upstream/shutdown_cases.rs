//! Graceful node shutdown on both agents, each talking to the same double
//! of systemd-logind on a private D-Bus (`DBUS_SYSTEM_BUS_ADDRESS`; never
//! the host's logind): the lock each takes, what the Node, its pods and a
//! new pod show when logind announces a shutdown, the lock released, and
//! a cancelled shutdown. logind's maximum delay is set above the periods,
//! so neither agent writes its drop-in into the host's /etc.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, anyhow, ensure};
use k8s_openapi::api::core::v1::{Node, Pod};
use keelson_tests::logind_double::LogindDouble;
use keelson_tests::private_bus::dbus_daemon;
use keelson_tests::support::wait_for;
use keelson_tests::upstream::{Agents, Case, Env, KeelsonFiles, NodeSpec, ProxyAgent};
use kube::Api;

use crate::support::{busybox_pod, create_pod, namespace, wait_pod, wait_pod_ready};

pub const CASES: &[Case] = &[Case {
    name: "graceful_node_shutdown",
    agents: &Agents::ALL,
    run: |env, agents| Box::pin(graceful_node_shutdown(env, agents)),
}];

const T: Duration = Duration::from_secs(90);
const MESSAGE: &str = "Pod was terminated in response to imminent node shutdown.";

fn ready(n: &Node) -> Option<(String, String)> {
    n.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready")
        .map(|c| (c.status.clone(), c.message.clone().unwrap_or_default()))
}

async fn wait_ready_is(nodes: &Api<Node>, name: &str, status: &str) -> anyhow::Result<String> {
    Ok(wait_for(
        &format!("Ready={status}"),
        T,
        Duration::from_millis(250),
        || async {
            let n = nodes.get(name).await.map_err(|e| e.to_string())?;
            match ready(&n) {
                Some((s, m)) if s == status => Ok(m),
                other => Err(format!("Ready {other:?}")),
            }
        },
    )
    .await?)
}

fn finished_at(p: &Pod) -> Option<jiff::Timestamp> {
    p.status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .first()?
        .state
        .as_ref()?
        .terminated
        .as_ref()?
        .finished_at
        .as_ref()
        .map(|t| t.0)
}

async fn graceful_node_shutdown(env: Arc<Env>, agents: Agents) -> anyhow::Result<()> {
    if dbus_daemon().is_none() {
        return Err(anyhow!(
            "dbus-daemon is not installed (scripts/install-deps)"
        ));
    }
    // 20 s + 10 s asked, 60 s allowed: no drop-in is written.
    let logind = LogindDouble::start(60).await.map_err(|e| anyhow!(e))?;
    let spec = NodeSpec {
        proxy: ProxyAgent::None,
        // Both agents read the same KubeletConfiguration.
        keelson_files: KeelsonFiles::Upstream,
        kubelet: Some(Arc::new(|m| {
            m.insert("shutdownGracePeriod".into(), "30s".into());
            m.insert("shutdownGracePeriodCriticalPods".into(), "10s".into());
        })),
        agent_env: vec![(
            "DBUS_SYSTEM_BUS_ADDRESS".to_string(),
            logind.address().to_string(),
        )],
        ..NodeSpec::of(agents)
    };
    let node = env
        .start_node(&format!("shutdown-{}", agents.name()), spec)
        .await?;
    node.wait_ready(&env.admin).await?;
    let c = &env.admin;
    let nodes: Api<Node> = Api::all(c.clone());

    let lock = wait_for(
        "the inhibitor lock",
        T,
        Duration::from_millis(200),
        || async {
            match logind.inhibitors().as_slice() {
                [(args, true)] => Ok(args.clone()),
                other => Err(format!("locks: {other:?}")),
            }
        },
    )
    .await
    .with_context(|| node.log_tails(30))?;
    ensure!(
        lock == [
            "shutdown",
            "kubelet",
            "Kubelet needs time to handle node shutdown",
            "delay"
        ]
        .map(String::from),
        "lock {lock:?}"
    );
    ensure!(
        logind.kill_unit_calls().is_empty(),
        "logind reloaded: {:?}",
        logind.kill_unit_calls()
    );

    let ns = namespace(c, "shutdown").await?;
    // The plain pod takes 3 s to stop: the critical one's group starts
    // only once it is gone. The plain pod exits 0 and ends `Succeeded`
    // (without the shutdown's reason and message, as kubelet leaves it);
    // the critical one exits 1 and becomes `Failed`, reason `Terminated`.
    let mut plain = busybox_pod(
        "plain",
        &node.name,
        "trap 'sleep 3; exit 0' TERM; while true; do sleep 1; done",
    );
    plain["spec"]["terminationGracePeriodSeconds"] = 30.into();
    let mut critical = busybox_pod(
        "critical",
        &node.name,
        "trap 'exit 1' TERM; while true; do sleep 1; done",
    );
    critical["spec"]["priorityClassName"] = "system-node-critical".into();
    critical["spec"]["terminationGracePeriodSeconds"] = 30.into();
    create_pod(c, &ns, plain).await?;
    create_pod(c, &ns, critical).await?;
    wait_pod_ready(c, &ns, "plain").await?;
    wait_pod_ready(c, &ns, "critical").await?;

    logind
        .prepare_for_shutdown(true)
        .await
        .map_err(|e| anyhow!(e))?;

    let message = wait_ready_is(&nodes, &node.name, "False").await?;
    ensure!(
        message.contains("node is shutting down"),
        "Ready message {message:?}"
    );
    let mut ended = Vec::new();
    for (name, phase) in [("plain", "Succeeded"), ("critical", "Failed")] {
        let p = wait_pod(c, &ns, name, phase, T, |p: &Pod| {
            let st = p.status.as_ref().ok_or("no status")?;
            (st.phase.as_deref() == Some(phase))
                .then(|| p.clone())
                .ok_or_else(|| "not there".to_string())
        })
        .await?;
        let st = p.status.clone().unwrap_or_default();
        let want = if phase == "Failed" {
            (Some("Terminated"), Some(MESSAGE))
        } else {
            (None, None)
        };
        ensure!(
            (st.reason.as_deref(), st.message.as_deref()) == want,
            "{name}: reason {:?} message {:?}",
            st.reason,
            st.message
        );
        let dt = st
            .conditions
            .unwrap_or_default()
            .into_iter()
            .find(|c| c.type_ == "DisruptionTarget")
            .ok_or_else(|| anyhow!("{name}: no DisruptionTarget condition"))?;
        ensure!(
            dt.status == "True"
                && dt.reason.as_deref() == Some("TerminationByKubelet")
                && dt.message.as_deref() == Some(MESSAGE),
            "{name}: {dt:?}"
        );
        ended.push(finished_at(&p).ok_or_else(|| anyhow!("{name}: no finishedAt"))?);
    }
    ensure!(
        ended[1] >= ended[0],
        "the critical pod ended at {} before the plain one at {}",
        ended[1],
        ended[0]
    );
    wait_for(
        "the lock released",
        T,
        Duration::from_millis(200),
        || async {
            match logind.inhibitors().as_slice() {
                [(_, false)] => Ok(()),
                other => Err(format!("locks: {other:?}")),
            }
        },
    )
    .await?;

    // A new pod is refused while the node shuts down.
    create_pod(c, &ns, busybox_pod("late", &node.name, "sleep 600")).await?;
    let (reason, message) = wait_pod(c, &ns, "late", "refused", T, |p: &Pod| {
        let st = p.status.as_ref().ok_or("no status")?;
        (st.phase.as_deref() == Some("Failed"))
            .then(|| (st.reason.clone(), st.message.clone()))
            .ok_or_else(|| "not failed".to_string())
    })
    .await?;
    ensure!(
        reason.as_deref() == Some("NodeShutdown")
            && message.as_deref()
                == Some("Pod was rejected: Pod was rejected as the node is shutting down."),
        "reason {reason:?} message {message:?}"
    );

    // Cancelled: a new lock is asked for, Ready again. keelson holds the
    // new lock. kubelet v1.36.2 asks for it too but may close it at once:
    // `acquireInhibitLock` (pkg/kubelet/nodeshutdown/
    // nodeshutdown_manager_linux.go) closes the previous lock's descriptor
    // number, which `processShutdownEvent` already closed without clearing
    // it, and the kernel hands the new lock that same number whenever it is
    // still the lowest free one. Whether kubelet keeps its lock thus
    // depends on its descriptor table; only the request is checked for it
    // (docs/design/node-shutdown.md).
    logind
        .prepare_for_shutdown(false)
        .await
        .map_err(|e| anyhow!(e))?;
    let must_hold = agents == Agents::Keelson;
    wait_for("a new lock", T, Duration::from_millis(200), || async {
        match logind.inhibitors().as_slice() {
            [(_, false), (_, held)] if *held || !must_hold => Ok(()),
            other => Err(format!("locks: {other:?}")),
        }
    })
    .await?;
    wait_ready_is(&nodes, &node.name, "True").await?;
    Ok(())
}
