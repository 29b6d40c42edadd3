//! The node API (kubelet's :10250) through the real kube-apiserver, which
//! proxies with its `--kubelet-client-certificate` and checks the node's
//! serving certificate against `--kubelet-certificate-authority`:
//! `kubectl logs` (`--tail`, `--timestamps`, `--since`, `-f`,
//! `--previous`; across log rotations on a node of its own whose agent
//! rotates at 4 KiB), `kubectl exec` (stdin, exit codes, `-it` with the
//! terminal's size and a resize), `kubectl attach`, `kubectl
//! port-forward` with traffic, `kubectl debug --target` (an ephemeral
//! container: exec, logs, its status), `get --raw` of the stats summary and the
//! resource metrics (the pod's CPU time and memory working set against
//! its cgroup, read by the test), `/metrics/cadvisor` (a limited pod's
//! container, sandbox and pod cgroup series with cAdvisor's labels and
//! plausible figures; on a keelson node and a kubelet node at once, the
//! same families, label names, HELP and TYPE, less the documented
//! families keelson does not serve), `/configz` (`{"kubeletconfig": ...}` with the
//! fields both agents must agree on) and `/runningpods/` (a PodList of
//! what the runtime runs), and the node's own 401/403 answers. Both agents
//! declare `ExtendWebSocketsToKubelet`, so kube-apiserver proxies
//! kubectl's WebSocket exec/attach/port-forward to them unchanged; each
//! counts them in `kubelet_websocket_streaming_requests_total`.

use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, ensure};
use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use keelson::config::KubeDuration;
use keelson_tests::node_api::{
    Credentials, kubectl, kubectl_exec_tty_resize, request_on, running_pod,
    websocket_streaming_requests,
};
use keelson_tests::prom_text::{self, Exposition, Sample};
use keelson_tests::upstream::{Agents, Case, ClusterNode, Env, NodeAgent, NodeSpec, ProxyAgent};
use kube::Api;
use kube::api::PostParams;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};

use crate::support::{busybox_pod, create_pod, namespace, read_pod_cgroup, wait_pod};

pub const CASES: &[Case] = &[
    Case {
        name: "node_api_logs",
        agents: &Agents::ALL,
        run: |env, agents| Box::pin(node_api_logs(env, agents)),
    },
    Case {
        name: "node_api_logs_rotation",
        agents: &Agents::ALL,
        run: |env, agents| Box::pin(node_api_logs_rotation(env, agents)),
    },
    Case {
        name: "node_api_exec_attach_port_forward",
        agents: &Agents::ALL,
        run: |env, agents| Box::pin(node_api_exec_attach_port_forward(env, agents)),
    },
    Case {
        name: "node_api_ephemeral_debug",
        agents: &Agents::ALL,
        run: |env, agents| Box::pin(node_api_ephemeral_debug(env, agents)),
    },
    Case {
        name: "node_api_stats",
        agents: &Agents::ALL,
        run: |env, agents| Box::pin(node_api_stats(env, agents)),
    },
    Case {
        name: "node_api_cadvisor_metrics",
        agents: &Agents::ALL,
        run: |env, agents| Box::pin(node_api_cadvisor_metrics(env, agents)),
    },
    Case {
        name: "node_api_cadvisor_same_families_as_kubelet",
        agents: &[Agents::Keelson],
        run: |env, _| Box::pin(node_api_cadvisor_same_families_as_kubelet(env)),
    },
    Case {
        name: "node_api_configz_runningpods",
        agents: &Agents::ALL,
        run: |env, agents| Box::pin(node_api_configz_runningpods(env, agents)),
    },
    Case {
        name: "node_api_authn_authz",
        agents: &Agents::ALL,
        run: |env, agents| Box::pin(node_api_authn_authz(env, agents)),
    },
];

const T: Duration = Duration::from_secs(90);

async fn k(
    env: &Env,
    args: &[&str],
    input: Option<&[u8]>,
) -> anyhow::Result<keelson_tests::node_api::KubectlOutput> {
    kubectl(env.cp.admin_kubeconfig(), args, input, T)
        .await
        .map_err(|e| anyhow!(e))
}

/// Creates a busybox pod running `script` on `node` and waits until it
/// runs.
async fn run_pod(env: &Env, ns: &str, node: &str, name: &str, script: &str) -> anyhow::Result<()> {
    create_pod(&env.admin, ns, busybox_pod(name, node, script)).await?;
    running(env, ns, name).await
}

/// `kubectl logs -f <args>`: the process (killed on drop) and its lines.
fn follow_logs(
    env: &Env,
    ns: &str,
    args: &[&str],
) -> anyhow::Result<(
    tokio::process::Child,
    tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
)> {
    let mut f = tokio::process::Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(env.cp.admin_kubeconfig())
        .args(["-n", ns, "logs", "-f"])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()?;
    let out = f.stdout.take().ok_or_else(|| anyhow!("no stdout"))?;
    Ok((f, tokio::io::BufReader::new(out).lines()))
}

pub(crate) async fn running(env: &Env, ns: &str, name: &str) -> anyhow::Result<()> {
    wait_pod(&env.admin, ns, name, &format!("{name} running"), T, |p| {
        let phase = p
            .status
            .as_ref()
            .and_then(|s| s.phase.clone())
            .unwrap_or_default();
        if phase == "Running" {
            Ok(())
        } else {
            Err(phase)
        }
    })
    .await
}

async fn node_api_logs(env: Arc<Env>, agents: Agents) -> anyhow::Result<()> {
    let node = env.node(agents).await?;
    let ns = namespace(&env.admin, "logs").await?;
    run_pod(
        &env,
        &ns,
        &node.name,
        "talker",
        "i=0; while true; do echo line $i; i=$((i+1)); sleep 0.2; done",
    )
    .await?;
    // Enough lines for --tail.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let out = k(&env, &["-n", &ns, "logs", "talker", "--tail=2"], None).await?;
    ensure!(out.ok, "{out:?}");
    let lines: Vec<&str> = out.stdout.lines().collect();
    ensure!(
        lines.len() == 2 && lines.iter().all(|l| l.starts_with("line ")),
        "{out:?}"
    );
    let out = k(
        &env,
        &["-n", &ns, "logs", "talker", "--tail=1", "--timestamps"],
        None,
    )
    .await?;
    let l = out.stdout.trim_end();
    let (ts, rest) = l.split_once(' ').ok_or_else(|| anyhow!("{out:?}"))?;
    ensure!(rest.starts_with("line "), "{out:?}");
    // RFC3339Nano, fixed width (nine fraction digits).
    ensure!(
        ts.len() == 30 && ts.as_bytes()[19] == b'.' && ts.ends_with('Z'),
        "{ts:?}"
    );
    // --since (relative): only the last second, from a log two seconds
    // old at least: line 0 is left out, and every line's time is within
    // the second before the request.
    let asked = jiff::Timestamp::now();
    let out = k(
        &env,
        &["-n", &ns, "logs", "talker", "--since=1s", "--timestamps"],
        None,
    )
    .await?;
    let answered = jiff::Timestamp::now();
    ensure!(out.ok, "{out:?}");
    let mut since = Vec::new();
    for l in out.stdout.lines() {
        let (ts, rest) = l.split_once(' ').ok_or_else(|| anyhow!("{out:?}"))?;
        let ts: jiff::Timestamp = ts.parse().map_err(|e| anyhow!("{ts:?}: {e}"))?;
        let n: u64 = rest
            .strip_prefix("line ")
            .and_then(|n| n.parse().ok())
            .ok_or_else(|| anyhow!("{l:?}"))?;
        ensure!(
            ts >= asked - jiff::SignedDuration::from_secs(1) && ts <= answered,
            "line {n} at {ts}: not within 1 s before {asked}..{answered}"
        );
        since.push(n);
    }
    // 5 lines a second; the first request came 2 s after the start.
    ensure!((1..=10).contains(&since.len()), "{out:?}");
    ensure!(since[0] > 0, "line 0 is older than 1 s: {out:?}");
    ensure!(
        since.windows(2).all(|w| w[1] == w[0] + 1),
        "not consecutive: {out:?}"
    );
    // -f: consecutive lines as they come.
    let (f, mut rd) = follow_logs(&env, &ns, &["talker", "--tail=1"])?;
    let mut prev: Option<u64> = None;
    for _ in 0..5 {
        let l = tokio::time::timeout(Duration::from_secs(20), rd.next_line())
            .await
            .map_err(|_| anyhow!("logs -f stalled"))??
            .ok_or_else(|| anyhow!("logs -f ended"))?;
        let n: u64 = l
            .strip_prefix("line ")
            .and_then(|n| n.parse().ok())
            .ok_or_else(|| anyhow!("{l:?}"))?;
        if let Some(p) = prev {
            ensure!(n == p + 1, "{p} then {n}");
        }
        prev = Some(n);
    }
    drop(rd);
    drop(f);
    // --previous: the instance before the restart.
    let mut crasher = busybox_pod(
        "crasher",
        &node.name,
        "n=$(cat /d/n 2>/dev/null || echo 0); n=$((n+1)); echo $n > /d/n; echo run $n; sleep 1; exit 3",
    );
    crasher["spec"]["volumes"] = serde_json::json!([{"name": "d", "emptyDir": {}}]);
    crasher["spec"]["containers"][0]["volumeMounts"] =
        serde_json::json!([{"name": "d", "mountPath": "/d"}]);
    create_pod(&env.admin, &ns, crasher).await?;
    let out = k(&env, &["-n", &ns, "logs", "crasher", "--previous"], None).await?;
    // Before any restart, both agents refuse with kubelet's text.
    if !out.ok {
        ensure!(
            out.stderr
                .contains("previous terminated container \"main\" in pod \"crasher\" not found"),
            "{out:?}"
        );
    }
    wait_pod(&env.admin, &ns, "crasher", "restarted", T, |p| {
        let r = p
            .status
            .as_ref()
            .and_then(|s| s.container_statuses.as_ref())
            .and_then(|c| c.first())
            .map(|c| c.restart_count)
            .unwrap_or(0);
        if r >= 1 {
            Ok(())
        } else {
            Err(format!("restarts {r}"))
        }
    })
    .await?;
    let out = k(&env, &["-n", &ns, "logs", "crasher", "--previous"], None).await?;
    ensure!(out.ok, "{out:?}");
    ensure!(out.stdout.starts_with("run "), "{out:?}");
    Ok(())
}

/// The talker's line `n`: ~60 bytes, so 4 KiB rotates every few seconds
/// at 20 lines a second.
fn talker_line(n: u64) -> String {
    format!("line {n} padding-padding-padding-padding-padding")
}

fn talker_number(l: &str) -> anyhow::Result<u64> {
    l.strip_prefix("line ")
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| anyhow!("{l:?}"))
}

/// `kubectl logs` across log rotations, on a node of its own whose agent
/// rotates at 4 KiB and checks every 3 s (kubelet's least
/// `containerLogMonitorInterval`), so the shared nodes keep the defaults.
/// Both agents: `-f` goes on past a rotation, a plain read has the
/// current file's lines up to the newest, at most `containerLogMaxFiles`
/// files stay. kubelet reads only the current file (`ReadLogs` on the
/// container's log path) and may drop the lines written between its last
/// read of the old file and its reopening; keelson reads the rotated
/// files first and the old file to its end before the new one
/// (docs/design/node-api.md, Logs): on keelson, every line from line 0,
/// none lost or repeated, followed or not.
async fn node_api_logs_rotation(env: Arc<Env>, agents: Agents) -> anyhow::Result<()> {
    let spec = NodeSpec {
        proxy: ProxyAgent::None,
        keelson: Some(Arc::new(|c| {
            c.node.container_log_max_size = "4Ki".into();
            c.node.container_log_monitor_interval = KubeDuration::from_secs(3);
        })),
        kubelet: Some(Arc::new(|m| {
            m.insert("containerLogMaxSize".into(), "4Ki".into());
            m.insert("containerLogMonitorInterval".into(), "3s".into());
        })),
        ..NodeSpec::of(agents)
    };
    let node = env
        .start_node(&format!("logrot-{}", agents.name()), spec)
        .await?;
    node.wait_ready(&env.admin).await?;
    let keelson = agents.roles().0 == NodeAgent::Keelson;
    let ns = namespace(&env.admin, "logrot").await?;
    run_pod(
        &env,
        &ns,
        &node.name,
        "talker",
        "i=0; while true; do echo \"line $i padding-padding-padding-padding-padding\"; i=$((i+1)); sleep 0.05; done",
    )
    .await?;
    let uid = Api::<Pod>::namespaced(env.admin.clone(), &ns)
        .get("talker")
        .await?
        .metadata
        .uid
        .ok_or_else(|| anyhow!("no uid"))?;
    let (follower, mut lines) = follow_logs(&env, &ns, &["talker"])?;
    let log_dir = node.dir().join(format!("pod-logs/{ns}_talker_{uid}/main"));
    let rotated = || -> Result<usize, String> {
        Ok(std::fs::read_dir(&log_dir)
            .map_err(|e| format!("{}: {e}", log_dir.display()))?
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("0.log."))
            .count())
    };
    keelson_tests::support::wait_for(
        "a rotated log file",
        T,
        Duration::from_millis(200),
        || async {
            match rotated()? {
                0 => Err("none yet".to_string()),
                _ => Ok(()),
            }
        },
    )
    .await?;
    // The newest line now, plus a margin only the new file has.
    let live = std::fs::read_to_string(log_dir.join("0.log"))?;
    let target = live
        .lines()
        .rev()
        .find_map(|l| talker_number(l.splitn(4, ' ').nth(3)?).ok())
        .unwrap_or(0)
        + 80;
    let mut expect = 0u64;
    while expect <= target {
        let l = tokio::time::timeout(Duration::from_secs(20), lines.next_line())
            .await
            .map_err(|_| anyhow!("logs -f stalled after line {expect}"))??
            .ok_or_else(|| anyhow!("logs -f ended after line {expect}"))?;
        let n = talker_number(&l)?;
        ensure!(l == talker_line(n), "{l:?}");
        if keelson {
            ensure!(n == expect, "logs -f: line {n} where {expect} was due");
        } else {
            ensure!(n >= expect, "logs -f: line {n} again after {expect}");
        }
        expect = n + 1;
    }
    drop(lines);
    drop(follower);
    // A plain read: consecutive lines up to the newest at least; from
    // line 0 on keelson (the rotated files too), from the current file's
    // first line on kubelet.
    let out = k(&env, &["-n", &ns, "logs", "talker"], None).await?;
    ensure!(out.ok, "{out:?}");
    let got: Vec<u64> = out
        .stdout
        .lines()
        .map(talker_number)
        .collect::<anyhow::Result<_>>()?;
    ensure!(
        got.windows(2).all(|w| w[1] == w[0] + 1),
        "not consecutive: {}",
        out.stdout
    );
    ensure!(
        got.last().is_some_and(|&n| n >= target),
        "the read ends before line {target}: {got:?}"
    );
    if keelson {
        ensure!(got.first() == Some(&0), "not from line 0: {got:?}");
    } else {
        ensure!(
            got.first().is_some_and(|&n| n > 0),
            "kubelet read a rotated file: {got:?}"
        );
    }
    let out = k(&env, &["-n", &ns, "logs", "talker", "--tail=3"], None).await?;
    ensure!(out.ok && out.stdout.lines().count() == 3, "{out:?}");
    // Disk use stays bounded: the live file and at most
    // containerLogMaxFiles (5) in all.
    let files = rotated().map_err(|e| anyhow!(e))? + 1;
    ensure!(files <= 5, "{files} log files");
    Ok(())
}

/// `kubectl debug --target` (issue 33): the ephemeral container goes in
/// through the `ephemeralcontainers` subresource, runs once in the pod's
/// sandbox in the target container's process namespace (its `ps` shows the
/// target's process as pid 1), answers exec and logs, and `kubectl debug
/// -it` attaches to a second one with a terminal; the status is in
/// `ephemeralContainerStatuses` as kubelet writes it (kubelet_pods.go
/// generateAPIPodStatus: never ready, no `started`, restart count 0), while
/// the pod's readiness stays the regular containers'.
async fn node_api_ephemeral_debug(env: Arc<Env>, agents: Agents) -> anyhow::Result<()> {
    use keelson_tests::images::BUSYBOX_IMAGE;
    let node = env.node(agents).await?;
    let ns = namespace(&env.admin, "debug").await?;
    run_pod(&env, &ns, &node.name, "app", "exec sleep 3601").await?;
    let out = k(
        &env,
        &[
            "-n",
            &ns,
            "debug",
            "app",
            "--image",
            BUSYBOX_IMAGE,
            "--image-pull-policy",
            "IfNotPresent",
            "--target",
            "main",
            "-c",
            "debugger",
            "--",
            "sh",
            "-c",
            "echo polo; exec sleep 3600",
        ],
        None,
    )
    .await?;
    ensure!(out.ok, "kubectl debug: {out:?}");
    let status = wait_pod(&env.admin, &ns, "app", "debugger running", T, |p| {
        let s = p
            .status
            .as_ref()
            .and_then(|s| s.ephemeral_container_statuses.as_ref())
            .and_then(|l| l.iter().find(|c| c.name == "debugger"))
            .ok_or("no ephemeral container status")?;
        if s.state.as_ref().is_some_and(|st| st.running.is_some()) {
            Ok(s.clone())
        } else {
            Err(format!("{s:?}"))
        }
    })
    .await?;
    ensure!(
        !status.ready && status.started.is_none() && status.restart_count == 0,
        "{status:?}"
    );
    ensure!(status.image == BUSYBOX_IMAGE, "{status:?}");
    ensure!(!status.image_id.is_empty(), "{status:?}");
    ensure!(
        status
            .container_id
            .as_deref()
            .is_some_and(|c| c.starts_with("containerd://")),
        "{status:?}"
    );
    let pod: Pod = Api::namespaced(env.admin.clone(), &ns).get("app").await?;
    ensure!(
        crate::support::pod_condition(&pod, "Ready").as_deref() == Some("True"),
        "{}",
        crate::support::brief_status(&pod)
    );
    ensure!(pod.metadata.generation == Some(2), "{:?}", pod.metadata);
    // The target's process namespace: its sleep is pid 1 here.
    let out = k(
        &env,
        &["-n", &ns, "exec", "app", "-c", "debugger", "--", "ps"],
        None,
    )
    .await?;
    ensure!(
        out.ok
            && out
                .stdout
                .lines()
                .any(|l| l.split_whitespace().next() == Some("1") && l.contains("sleep 3601")),
        "{out:?}"
    );
    let out = k(
        &env,
        &[
            "-n", &ns, "exec", "app", "-c", "debugger", "--", "echo", "marco",
        ],
        None,
    )
    .await?;
    ensure!(out.ok && out.stdout == "marco\n", "{out:?}");
    let out = k(&env, &["-n", &ns, "logs", "app", "-c", "debugger"], None).await?;
    ensure!(out.ok && out.stdout.contains("polo"), "{out:?}");
    // `kubectl debug -it`: kubectl waits for the new container to run and
    // attaches to it with a terminal (GetAttach takes the tty from the
    // ephemeral spec). The shell waits before it writes, so that kubectl
    // is attached by then; script's stdin stays open and silent.
    let cmd = format!(
        "kubectl --kubeconfig {} -n {ns} debug -it app --image {BUSYBOX_IMAGE} \
         --image-pull-policy IfNotPresent -c shell -- sh -c 'sleep 5; tty; echo val-$((6*7))'",
        env.cp.admin_kubeconfig().display()
    );
    let mut child = tokio::process::Command::new("script")
        .args(["-qfec", &cmd, "/dev/null"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let stdin = child.stdin.take();
    let out = tokio::time::timeout(T, child.wait_with_output())
        .await
        .map_err(|_| anyhow!("kubectl debug -it did not finish"))??;
    drop(stdin);
    let text = String::from_utf8_lossy(&out.stdout).replace('\r', "");
    ensure!(
        out.status.success() && text.contains("/dev/pts/") && text.contains("val-42"),
        "kubectl debug -it: {text}"
    );
    Ok(())
}

async fn node_api_exec_attach_port_forward(env: Arc<Env>, agents: Agents) -> anyhow::Result<()> {
    let node = env.node(agents).await?;
    let ns = namespace(&env.admin, "exec").await?;
    create_pod(
        &env.admin,
        &ns,
        busybox_pod(
            "web",
            &node.name,
            "mkdir -p /w; echo hi > /w/index.html; exec httpd -f -p 8080 -h /w",
        ),
    )
    .await?;
    running(&env, &ns, "web").await?;
    let out = k(
        &env,
        &[
            "-n",
            &ns,
            "exec",
            "web",
            "--",
            "sh",
            "-c",
            "echo out; exit 7",
        ],
        None,
    )
    .await?;
    ensure!(!out.ok && out.stdout == "out\n", "{out:?}");
    ensure!(
        out.stderr.contains("command terminated with exit code 7"),
        "{out:?}"
    );
    let out = k(
        &env,
        &["-n", &ns, "exec", "-i", "web", "--", "cat"],
        Some(b"from stdin\n"),
    )
    .await?;
    ensure!(out.ok && out.stdout == "from stdin\n", "{out:?}");
    // exec -it: a tty of the size of kubectl's terminal, and a resize of
    // that terminal reaches the command.
    let text = kubectl_exec_tty_resize(env.cp.admin_kubeconfig(), Some(&ns), "web", T)
        .await
        .map_err(|e| anyhow!(e))?;
    ensure!(text.contains("/dev/pts/"), "{text}");
    let sizes: Vec<&str> = text
        .lines()
        .filter_map(|l| l.trim_end_matches('\r').strip_prefix("size "))
        .collect();
    ensure!(sizes == ["40 100", "50 120"], "{text}");
    // port-forward with traffic.
    let mut pf = tokio::process::Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(env.cp.admin_kubeconfig())
        .args(["-n", &ns, "port-forward", "pod/web", ":8080"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let mut lines =
        tokio::io::BufReader::new(pf.stdout.take().ok_or_else(|| anyhow!("no stdout"))?).lines();
    let line = tokio::time::timeout(T, lines.next_line())
        .await??
        .unwrap_or_default();
    let port: u16 = line
        .split("127.0.0.1:")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|p| p.parse().ok())
        .ok_or_else(|| anyhow!("{line:?}"))?;
    let mut c = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    c.write_all(b"GET / HTTP/1.0\r\nHost: web\r\n\r\n").await?;
    let mut body = String::new();
    tokio::time::timeout(Duration::from_secs(20), c.read_to_string(&mut body)).await??;
    ensure!(body.contains(" 200 ") && body.ends_with("hi\n"), "{body:?}");
    drop(pf);
    // attach.
    let mut reader = busybox_pod("reader", &node.name, "read l; echo got $l");
    reader["spec"]["restartPolicy"] = serde_json::json!("Never");
    reader["spec"]["containers"][0]["stdin"] = serde_json::json!(true);
    reader["spec"]["containers"][0]["stdinOnce"] = serde_json::json!(true);
    create_pod(&env.admin, &ns, reader).await?;
    running(&env, &ns, "reader").await?;
    let out = k(
        &env,
        &["-n", &ns, "attach", "-i", "reader"],
        Some(b"hello\n"),
    )
    .await?;
    ensure!(out.stdout.contains("got hello"), "{out:?}");
    // All of it went over WebSocket to the node, which translated (exec,
    // attach) or tunneled (port-forward) it.
    let counts = websocket_streaming_requests(env.cp.admin_kubeconfig(), &node.name, T)
        .await
        .map_err(|e| anyhow!(e))?;
    let n = |k: &str| counts.get(k).copied().unwrap_or(0.0);
    ensure!(
        n("exec") >= 3.0 && n("attach") >= 1.0 && n("portforward") >= 1.0,
        "WebSocket streaming requests the node handled: {counts:?}"
    );
    Ok(())
}

async fn node_api_stats(env: Arc<Env>, agents: Agents) -> anyhow::Result<()> {
    let node = env.node(agents).await?;
    let ns = namespace(&env.admin, "stats").await?;
    run_pod(&env, &ns, &node.name, "busy", "while true; do :; done").await?;
    let p = Api::<Pod>::namespaced(env.admin.clone(), &ns)
        .get("busy")
        .await?;
    let cpu_now = || pod_cgroup_cpu(&node, &p).map_err(|e| anyhow!(e));
    let working_set_now = || pod_cgroup_working_set(&node, &p).map_err(|e| anyhow!(e));
    // Both agents serve the last housekeeping round (kubelet cAdvisor's
    // cache, sampled every few seconds): wait for a round whose pod CPU
    // sample (`time`, whole seconds) is later than the second the cgroup
    // was read in, so it was read after that, and before the read after
    // the answer.
    let before = cpu_now()?;
    let ws_before = working_set_now()?;
    let before_second = jiff::Timestamp::now().as_second();
    let path = format!("/api/v1/nodes/{}/proxy/stats/summary", node.name);
    let pod = keelson_tests::support::wait_for(
        "a stats round with the pod sampled after the cgroup was read",
        T,
        Duration::from_millis(500),
        || async {
            let out = k(&env, &["get", "--raw", &path], None)
                .await
                .map_err(|e| e.to_string())?;
            let s: serde_json::Value =
                serde_json::from_str(&out.stdout).map_err(|e| format!("{e}: {out:?}"))?;
            let pod = s["pods"]
                .as_array()
                .and_then(|ps| {
                    ps.iter().find(|p| {
                        p["podRef"]["name"] == "busy" && p["podRef"]["namespace"] == ns.as_str()
                    })
                })
                .cloned()
                .ok_or_else(|| "not yet".to_string())?;
            let sampled = pod["cpu"]["time"]
                .as_str()
                .and_then(|t| t.parse::<jiff::Timestamp>().ok())
                .ok_or_else(|| pod.to_string())?;
            if sampled.as_second() > before_second && pod["memory"]["workingSetBytes"].is_u64() {
                Ok(pod)
            } else {
                Err(format!("sampled at {sampled}"))
            }
        },
    )
    .await?;
    let after = cpu_now()?;
    let ws_after = working_set_now()?;
    let cpu = pod["cpu"]["usageCoreNanoSeconds"]
        .as_u64()
        .ok_or_else(|| anyhow!("{pod}"))?;
    ensure!(
        before <= cpu && cpu <= after,
        "pod CPU {cpu} ns is not the cgroup's between {before} and {after}: {pod}"
    );
    let ws = pod["memory"]["workingSetBytes"]
        .as_u64()
        .ok_or_else(|| anyhow!("{pod}"))?;
    ensure!(
        near(ws, ws_before, ws_after),
        "pod working set {ws} is not the cgroup's ({ws_before} then {ws_after}): {pod}"
    );
    ensure!(pod["containers"][0]["name"] == "main", "{pod}");
    // The resource metrics: the same figures, from the same cache.
    let path = format!("/api/v1/nodes/{}/proxy/metrics/resource", node.name);
    let out = k(&env, &["get", "--raw", &path], None).await?;
    ensure!(out.ok, "{out:?}");
    let after = cpu_now()?;
    let ws_after = working_set_now()?;
    let sample = |metric: &str| -> anyhow::Result<f64> {
        let want = format!("{metric}{{namespace=\"{ns}\",pod=\"busy\"}} ");
        out.stdout
            .lines()
            .find_map(|l| l.strip_prefix(&want))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| anyhow!("{want} missing:\n{}", out.stdout))
    };
    let v = sample("pod_cpu_usage_seconds_total")? * 1e9;
    ensure!(
        v >= before as f64 * 0.999 && v <= after as f64 * 1.001,
        "pod_cpu_usage_seconds_total {v} ns is not the cgroup's between {before} and {after}"
    );
    let v = sample("pod_memory_working_set_bytes")?;
    ensure!(
        near(v as u64, ws_before, ws_after),
        "pod_memory_working_set_bytes {v} is not the cgroup's ({ws_before} then {ws_after})"
    );
    ensure!(
        out.stdout.contains("node_memory_working_set_bytes"),
        "{}",
        out.stdout
    );
    Ok(())
}

/// `v` within the two readings of the cgroup around it, widened by 2 MiB
/// or 10 % (the memory of a busy shell loop and its pause container moves
/// by a few pages between the agent's sample and the test's reads).
fn near(v: u64, a: u64, b: u64) -> bool {
    let (lo, hi) = (a.min(b), a.max(b));
    let slack = (2 << 20).max(hi / 10);
    lo.saturating_sub(slack) <= v && v <= hi + slack
}

/// The pod cgroup's CPU time in ns: v1 `cpuacct.usage`, v2 `cpu.stat`'s
/// `usage_usec`.
fn pod_cgroup_cpu(node: &ClusterNode, p: &Pod) -> Result<u64, String> {
    let text = read_pod_cgroup(node, p, "cpuacct", "cpuacct.usage", "cpu.stat")?;
    match stat_field(&text, "usage_usec") {
        Some(us) => Ok(us * 1000),
        None => text.trim().parse().map_err(|e| format!("{text:?}: {e}")),
    }
}

/// The pod cgroup's memory working set as both agents compute it (and
/// cAdvisor): usage less the inactive file pages, v1 `memory.usage_in_bytes`
/// − `total_inactive_file`, v2 `memory.current` − `inactive_file`.
fn pod_cgroup_working_set(node: &ClusterNode, p: &Pod) -> Result<u64, String> {
    let usage = read_pod_cgroup(node, p, "memory", "memory.usage_in_bytes", "memory.current")?;
    let usage: u64 = usage
        .trim()
        .parse()
        .map_err(|e| format!("{usage:?}: {e}"))?;
    let stat = read_pod_cgroup(node, p, "memory", "memory.stat", "memory.stat")?;
    let inactive = stat_field(&stat, "total_inactive_file")
        .or_else(|| stat_field(&stat, "inactive_file"))
        .unwrap_or(0);
    Ok(usage.saturating_sub(inactive))
}

/// A `key value` line's value in a cgroup stat file.
fn stat_field(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        if k == key {
            v.trim().parse().ok()
        } else {
            None
        }
    })
}

async fn node_api_authn_authz(env: Arc<Env>, agents: Agents) -> anyhow::Result<()> {
    let node = env.node(agents).await?;
    let ns = namespace(&env.admin, "authz").await?;
    let sa: ServiceAccount =
        serde_json::from_value(serde_json::json!({"metadata": {"name": "reader"}}))?;
    let sas: Api<ServiceAccount> = Api::namespaced(env.admin.clone(), &ns);
    sas.create(&PostParams::default(), &sa).await?;
    let tr: TokenRequest = serde_json::from_value(serde_json::json!({"spec": {"audiences": []}}))?;
    let token = sas
        .create_token_request("reader", &PostParams::default(), &tr)
        .await?
        .status
        .and_then(|s| s.token)
        .ok_or_else(|| anyhow!("no token"))?;
    let addr = std::net::SocketAddr::new(node.ip.into(), 10250);
    let ask = |creds: Credentials, path: &'static str| {
        let netns = node.containerd().netns();
        let conn = netns.tcp_connect(addr, Duration::from_secs(5));
        async move {
            let conn = conn.map_err(|e| anyhow!("{e}"))?;
            request_on(conn, addr, "GET", path, &creds)
                .await
                .map_err(|e| anyhow!(e))
        }
    };
    let (code, body) = ask(Credentials::None, "/stats/summary").await?;
    ensure!(
        (code, body.as_str()) == (401, "Unauthorized"),
        "{code} {body:?}"
    );
    let (code, body) = ask(Credentials::Token(token), "/stats/summary").await?;
    let want = format!(
        "Forbidden (user=system:serviceaccount:{ns}:reader, verb=get, resource=nodes, subresource(s)=[stats])\n"
    );
    ensure!(code == 403 && body == want, "{code} {body:?}");
    // Through the API server, a user without nodes/proxy is refused there.
    let kc = node.dir().join(format!("nobody-{ns}.kubeconfig"));
    env.cp
        .write_kubeconfig(&kc, "nobody", None, keelson_tests::upstream::Reach::Host)?;
    let path = format!("/api/v1/nodes/{}/proxy/stats/summary", node.name);
    let out = kubectl(&kc, &["get", "--raw", &path], None, T)
        .await
        .map_err(|e| anyhow!(e))?;
    ensure!(!out.ok && out.stderr.contains("Forbidden"), "{out:?}");
    Ok(())
}

/// `get --raw /api/v1/nodes/<node>/proxy/<path>` as JSON.
async fn proxy_json(env: &Env, node: &str, path: &str) -> anyhow::Result<serde_json::Value> {
    let raw = format!("/api/v1/nodes/{node}/proxy/{path}");
    let out = k(env, &["get", "--raw", &raw], None).await?;
    ensure!(out.ok, "{raw}: {out:?}");
    serde_json::from_str(&out.stdout).map_err(|e| anyhow!("{raw}: {e}: {}", out.stdout))
}

async fn node_api_configz_runningpods(env: Arc<Env>, agents: Agents) -> anyhow::Result<()> {
    let node = env.node(agents).await?;
    // /configz: component-base's `{"kubeletconfig": <v1beta1
    // KubeletConfiguration>}`; the fields both agents have the same way.
    let z = proxy_json(&env, &node.name, "configz").await?;
    let top: Vec<&String> = z
        .as_object()
        .ok_or_else(|| anyhow!("{z}"))?
        .keys()
        .collect();
    ensure!(top == ["kubeletconfig"], "{z}");
    let c = &z["kubeletconfig"];
    ensure!(c["kind"] == "KubeletConfiguration", "{c}");
    ensure!(c["apiVersion"] == "kubelet.config.k8s.io/v1beta1", "{c}");
    ensure!(c["port"] == 10250, "{c}");
    ensure!(c["authentication"]["webhook"]["enabled"] == true, "{c}");
    ensure!(c["authentication"]["anonymous"]["enabled"] == false, "{c}");
    ensure!(
        c["authentication"]["x509"]["clientCAFile"].is_string(),
        "{c}"
    );
    ensure!(c["authorization"]["mode"] == "Webhook", "{c}");
    ensure!(c["enableDebuggingHandlers"] == true, "{c}");
    ensure!(
        c["readOnlyPort"].is_null() || c["readOnlyPort"] == 0,
        "the read-only port is off: {c}"
    );
    // Only KubeletConfiguration fields (a strict v1beta1 decoder takes
    // it): kubelet's flags are not in it.
    for flag in ["kubeconfig", "rootDir", "nodeIP", "nodeLabels", "enabled"] {
        ensure!(c.get(flag).is_none(), "{flag} in {c}");
    }
    // /runningpods/: the pod as the runtime runs it.
    let ns = namespace(&env.admin, "runningpods").await?;
    create_pod(
        &env.admin,
        &ns,
        busybox_pod("runner", &node.name, "sleep 3600"),
    )
    .await?;
    running(&env, &ns, "runner").await?;
    let uid = Api::<k8s_openapi::api::core::v1::Pod>::namespaced(env.admin.clone(), &ns)
        .get("runner")
        .await?
        .metadata
        .uid
        .ok_or_else(|| anyhow!("no uid"))?;
    // kubelet answers from its runtime cache (refreshed when older than
    // 2 s): the containers show once it has seen them.
    let item = keelson_tests::support::wait_for(
        "runner and its container in /runningpods/",
        T,
        Duration::from_millis(500),
        || async {
            let l = proxy_json(&env, &node.name, "runningpods/")
                .await
                .map_err(|e| e.to_string())?;
            running_pod(&l, &ns, "runner")
        },
    )
    .await?;
    // Exactly kubelet's fields: metadata name/namespace/uid, containers
    // name/image (the image the runtime runs, by ID)/resources.
    let image = item["spec"]["containers"][0]["image"].clone();
    ensure!(
        image.as_str().is_some_and(|i| i.starts_with("sha256:")),
        "{item}"
    );
    let want = serde_json::json!({
        "metadata": {"name": "runner", "namespace": ns, "uid": uid},
        "spec": {"containers": [{"name": "main", "image": image, "resources": {}}]},
        "status": {},
    });
    ensure!(item == want, "{item} is not {want}");
    Ok(())
}

/// The memory limit of the `/metrics/cadvisor` case's container.
const CADVISOR_LIMIT: u64 = 64 << 20;

/// Scrapes `/metrics/cadvisor` of `node` through the API server's node
/// proxy.
async fn cadvisor_scrape(env: &Env, node: &str) -> anyhow::Result<Exposition> {
    let path = format!("/api/v1/nodes/{node}/proxy/metrics/cadvisor");
    let out = k(env, &["get", "--raw", &path], None).await?;
    ensure!(out.ok, "{path}: {out:?}");
    prom_text::parse(&out.stdout).map_err(|e| anyhow!("{path}: {e}"))
}

/// Runs a busy pod with a memory and CPU limit on `node` and waits until
/// the node's `/metrics/cadvisor` has its container; returns the pod's
/// container ID (without the runtime prefix), UID and the scrape.
async fn cadvisor_pod(
    env: &Env,
    node: &ClusterNode,
    ns: &str,
) -> anyhow::Result<(String, String, Exposition)> {
    let mut pod = busybox_pod("cadv", &node.name, "while true; do :; done");
    pod["spec"]["containers"][0]["resources"] = serde_json::json!({
        "limits": {"memory": CADVISOR_LIMIT.to_string(), "cpu": "500m"},
    });
    create_pod(&env.admin, ns, pod).await?;
    running(env, ns, "cadv").await?;
    let p = Api::<Pod>::namespaced(env.admin.clone(), ns)
        .get("cadv")
        .await?;
    let uid = p.metadata.uid.clone().unwrap_or_default();
    let id = p
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|c| c.first())
        .and_then(|c| c.container_id.clone())
        .and_then(|id| id.split_once("://").map(|(_, id)| id.to_string()))
        .ok_or_else(|| anyhow!("no container ID: {:?}", p.status))?;
    // Both agents serve their last housekeeping round: wait for one that
    // has used CPU in the container and in the pod cgroup (cAdvisor
    // writes no usage series while a cgroup's CPU time is 0, and kubelet's
    // first sample of a pod cgroup is taken as it is created).
    let scrape = keelson_tests::support::wait_for(
        "the pod's container and cgroup with CPU time in /metrics/cadvisor",
        T,
        Duration::from_millis(500),
        || async {
            let e = cadvisor_scrape(env, &node.name)
                .await
                .map_err(|e| e.to_string())?;
            let cpu = |container: &str, name_empty: bool| {
                e.find(
                    "container_cpu_usage_seconds_total",
                    &[("namespace", ns), ("pod", "cadv"), ("container", container)],
                )
                .iter()
                .any(|s| s.label("name").is_empty() == name_empty)
            };
            if cpu("main", false) && cpu("", true) {
                Ok(e)
            } else {
                Err("not yet".to_string())
            }
        },
    )
    .await?;
    Ok((id, uid, scrape))
}

/// `/metrics/cadvisor`: the pod's container and sandbox series with
/// cAdvisor's labels (`container`, `id` = the cgroup, `image`, `name` =
/// the container ID, `namespace`, `pod`) and plausible figures (working
/// set above 0 and below the limit, the limit itself, a CPU counter that
/// grows between scrapes), the pod sandbox's network, the machine
/// families, and HELP/TYPE for every family.
async fn node_api_cadvisor_metrics(env: Arc<Env>, agents: Agents) -> anyhow::Result<()> {
    let node = env.node(agents).await?;
    let ns = namespace(&env.admin, "cadvisor").await?;
    let (id, uid, first) = cadvisor_pod(&env, &node, &ns).await?;
    let text = || format!("{:#?}", first.samples);
    let main = [
        ("namespace", ns.as_str()),
        ("pod", "cadv"),
        ("container", "main"),
    ];
    let one = |e: &Exposition, name: &str, with: &[(&str, &str)]| -> anyhow::Result<Sample> {
        match e.find(name, with).as_slice() {
            [s] => Ok((*s).clone()),
            other => Err(anyhow!("{name} {with:?}: {other:#?}")),
        }
    };
    let ws = one(&first, "container_memory_working_set_bytes", &main)?;
    // The cgroup of the container, under the pod's (cgroupfs or systemd
    // names), and its ID as `name`.
    ensure!(
        ws.label("name") == id,
        "name is not the container ID {id}: {ws:?}"
    );
    let uid_systemd = uid.replace('-', "_");
    ensure!(
        ws.label("id").contains(&id)
            && (ws.label("id").contains(&format!("pod{uid}"))
                || ws.label("id").contains(&format!("pod{uid_systemd}"))),
        "id is not the container's cgroup under pod {uid}: {ws:?}"
    );
    ensure!(!ws.label("image").is_empty(), "no image: {ws:?}");
    ensure!(
        ws.value > 0.0 && ws.value < CADVISOR_LIMIT as f64,
        "working set {} not in (0, {CADVISOR_LIMIT}): {ws:?}",
        ws.value
    );
    let limit = one(&first, "container_spec_memory_limit_bytes", &main)?;
    ensure!(limit.value == CADVISOR_LIMIT as f64, "{limit:?}");
    let quota = one(&first, "container_spec_cpu_quota", &main)?;
    let period = one(&first, "container_spec_cpu_period", &main)?;
    ensure!(
        quota.value / period.value == 0.5,
        "quota {quota:?} / period {period:?} is not 500m"
    );
    for name in [
        "container_memory_usage_bytes",
        "container_memory_rss",
        "container_memory_cache",
        "container_last_seen",
        "container_start_time_seconds",
    ] {
        one(&first, name, &main)?;
    }
    let usage = one(&first, "container_memory_usage_bytes", &main)?;
    ensure!(
        usage.value >= ws.value,
        "usage {usage:?} < working set {ws:?}"
    );
    let start = one(&first, "container_start_time_seconds", &main)?;
    let now = jiff::Timestamp::now().as_second() as f64;
    ensure!(
        start.value > now - 600.0 && start.value <= now,
        "start time {start:?} not in the last 10 minutes"
    );
    // The pod cgroup: labelled with the pod, no container.
    let pod_cg = first
        .find(
            "container_memory_working_set_bytes",
            &[("namespace", &ns), ("pod", "cadv"), ("container", "")],
        )
        .into_iter()
        .find(|s| s.label("name").is_empty())
        .ok_or_else(|| anyhow!("no pod cgroup series: {}", text()))?
        .clone();
    ensure!(pod_cg.label("image").is_empty(), "pod cgroup {pod_cg:?}");
    // The sandbox: its own network namespace, counted on eth0.
    let rx = first.find(
        "container_network_receive_bytes_total",
        &[("namespace", &ns), ("pod", "cadv"), ("interface", "eth0")],
    );
    ensure!(
        rx.len() == 1 && !rx[0].label("name").is_empty() && rx[0].label("name") != id,
        "the sandbox's eth0 counters: {rx:#?}"
    );
    for name in ["machine_cpu_cores", "machine_memory_bytes"] {
        let m = one(&first, name, &[])?;
        ensure!(m.value > 0.0, "{m:?}");
    }
    // Every family has HELP and TYPE.
    for s in &first.samples {
        ensure!(
            first.help.contains_key(&s.name) && first.kind.contains_key(&s.name),
            "{} has no HELP/TYPE",
            s.name
        );
    }
    // The CPU counter grows between housekeeping rounds.
    let cpu = |e: &Exposition| -> anyhow::Result<f64> {
        let mut with = main.to_vec();
        with.push(("cpu", "total"));
        Ok(one(e, "container_cpu_usage_seconds_total", &with)?.value)
    };
    let c0 = cpu(&first)?;
    keelson_tests::support::wait_for(
        "container_cpu_usage_seconds_total to grow",
        T,
        Duration::from_millis(500),
        || async {
            let e = cadvisor_scrape(&env, &node.name)
                .await
                .map_err(|e| e.to_string())?;
            let c1 = cpu(&e).map_err(|e| e.to_string())?;
            if c1 > c0 {
                Ok(())
            } else {
                Err(format!("{c1} <= {c0}"))
            }
        },
    )
    .await?;
    Ok(())
}

/// The families kubelet serves at `/metrics/cadvisor` that keelson does
/// not (docs/metrics.md says why).
const CADVISOR_NOT_SERVED: &[&str] = &[
    "cadvisor_version_info",
    "container_blkio_device_usage_total",
    "container_cpu_load_average_10s",
    "container_cpu_load_d_average_10s",
    "container_tasks_state",
    "container_fs_inodes_free",
    "container_fs_inodes_total",
    "container_fs_limit_bytes",
    "container_fs_usage_bytes",
    "container_fs_io_current",
    "container_fs_io_time_seconds_total",
    "container_fs_io_time_weighted_seconds_total",
    "container_fs_read_seconds_total",
    "container_fs_reads_bytes_total",
    "container_fs_reads_merged_total",
    "container_fs_reads_total",
    "container_fs_sector_reads_total",
    "container_fs_sector_writes_total",
    "container_fs_write_seconds_total",
    "container_fs_writes_bytes_total",
    "container_fs_writes_merged_total",
    "container_fs_writes_total",
    "container_fs_io_cost_usage_seconds_total",
    "container_fs_io_cost_wait_seconds_total",
    "container_fs_io_cost_indebt_seconds_total",
    "container_fs_io_cost_indelay_seconds_total",
    "machine_nvm_capacity",
    "machine_nvm_avg_power_budget_watts",
    "machine_dimm_count",
    "machine_dimm_capacity_bytes",
    "machine_cpu_cache_capacity_bytes",
    "machine_thread_siblings_count",
    "machine_node_memory_capacity_bytes",
    "machine_node_hugepages_count",
    "machine_node_distance",
];

/// Family → the label names of its series for one workload (`with`).
fn cadvisor_shape(
    e: &Exposition,
    keep: impl Fn(&Sample) -> bool,
) -> std::collections::BTreeMap<String, std::collections::BTreeSet<Vec<String>>> {
    let mut out: std::collections::BTreeMap<_, std::collections::BTreeSet<_>> = Default::default();
    for s in e.samples.iter().filter(|s| keep(s)) {
        if CADVISOR_NOT_SERVED.contains(&s.name.as_str()) {
            continue;
        }
        out.entry(s.name.clone())
            .or_default()
            .insert(s.labels.keys().cloned().collect::<Vec<_>>());
    }
    out
}

/// The same pod on a keelson node and on a kubelet node: the container's,
/// the sandbox's and the pod cgroup's series have the same families with
/// the same label names, the machine families are the same, and every
/// family both serve has the same HELP and TYPE. What kubelet serves and
/// keelson does not is the documented list above, and nothing else.
async fn node_api_cadvisor_same_families_as_kubelet(env: Arc<Env>) -> anyhow::Result<()> {
    let keelson = env.node(Agents::Keelson).await?;
    let kube = env.node(Agents::Upstream).await?;
    let ns_k = namespace(&env.admin, "cadvisor-k").await?;
    let ns_u = namespace(&env.admin, "cadvisor-u").await?;
    let ((_, _, mine), (_, _, theirs)) = tokio::try_join!(
        cadvisor_pod(&env, &keelson, &ns_k),
        cadvisor_pod(&env, &kube, &ns_u)
    )?;
    // Which series of a scrape belong to one part of the pod (or to the
    // machine).
    fn part(what: &str, s: &Sample, ns: &str) -> bool {
        let pod = s.label("namespace") == ns && s.label("pod") == "cadv";
        let (container, name) = (s.label("container"), s.label("name"));
        match what {
            "the container" => pod && container == "main",
            "the sandbox" => pod && container.is_empty() && !name.is_empty(),
            "the pod cgroup" => pod && container.is_empty() && name.is_empty(),
            _ => s.name.starts_with("machine_"),
        }
    }
    for what in [
        "the container",
        "the sandbox",
        "the pod cgroup",
        "the machine",
    ] {
        let a = cadvisor_shape(&mine, |s| part(what, s, &ns_k));
        let b = cadvisor_shape(&theirs, |s| part(what, s, &ns_u));
        ensure!(
            !b.is_empty() && a == b,
            "{what}: keelson's series differ from kubelet's:\n  keelson: {a:#?}\n  kubelet: {b:#?}"
        );
    }
    let families =
        |e: &Exposition| -> std::collections::BTreeSet<String> { e.kind.keys().cloned().collect() };
    let (fa, fb) = (families(&mine), families(&theirs));
    let only_kubelet: Vec<&String> = fb
        .difference(&fa)
        .filter(|f| !CADVISOR_NOT_SERVED.contains(&f.as_str()))
        .collect();
    let only_keelson: Vec<&String> = fa.difference(&fb).collect();
    ensure!(
        only_kubelet.is_empty() && only_keelson.is_empty(),
        "families only kubelet serves: {only_kubelet:?}; only keelson: {only_keelson:?}"
    );
    for f in fa.intersection(&fb) {
        ensure!(
            mine.help.get(f) == theirs.help.get(f) && mine.kind.get(f) == theirs.kind.get(f),
            "{f}: keelson {:?} {:?}, kubelet {:?} {:?}",
            mine.help.get(f),
            mine.kind.get(f),
            theirs.help.get(f),
            theirs.kind.get(f)
        );
    }
    Ok(())
}
