//! Issue 35 item 4: malformed and hostile objects that the real API
//! server accepts, on a node of the case's own. Each object's outcome is
//! what kubelet and kube-proxy v1.36.2 show (the `upstream_kube_` run
//! proves the expectations are theirs); after the corpus the node agent is
//! still alive (no panic in its log, RSS bounded) and still serving (a new
//! pod behind a new Service answers). docs/reliability.md lists the corpus.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, ensure};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use keelson_tests::images::BUSYBOX_IMAGE;
use keelson_tests::support::wait_for;
use keelson_tests::upstream::{Agents, Case, ClusterNode, Env, NodeSpec};
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use serde_json::{Value, json};

use crate::service_cases::check_service;
use crate::support::{
    busybox_pod, create_pod, events_for, http_get, namespace, wait_event, wait_pod,
};

pub const CASES: &[Case] = &[Case {
    name: "hostile_objects",
    agents: &Agents::ALL,
    run: |env, agents| Box::pin(hostile_objects(env, agents)),
}];

/// kubelet's exec probe output limit (`pkg/probe/exec/exec.go` `maxReadLength`).
const PROBE_OUTPUT_LIMIT: usize = 10 * 1024;
/// `MaxContainerTerminationMessageLength` (`pkg/kubelet/container/runtime.go`).
const CONTAINER_MESSAGE_LIMIT: usize = 4 * 1024;
/// `MaxPodTerminationMessageLogLength`, shared by the pod's containers.
const POD_MESSAGE_LIMIT: usize = 12 * 1024;
/// The API server's limit on a pod's annotations, keys and values
/// (`TotalAnnotationSizeLimitB`).
const ANNOTATIONS_LIMIT: usize = 256 * 1024;
/// The API server's limit on one EndpointSlice (`maxEndpoints`).
const SLICE_CAP: usize = 1000;
/// Endpoints of the Service spread over slices at the cap.
const ENDPOINTS: usize = 10_000;
/// Ports of the many-ports Service.
const PORTS: usize = 2000;
/// Environment variables of one container.
const ENV_VARS: usize = 10_000;
/// emptyDir volumes of one pod (beside the big ConfigMap).
const VOLUMES: usize = 100;
/// The ConfigMap's one value, just under the 1 MiB limit of its data.
const CONFIGMAP_BYTES: usize = 1024 * 1024 - 4096;
/// How much keelson's RSS (both roles, one process) may grow with the
/// corpus. Measured: 163 to 227 MiB of growth (docs/reliability.md), most
/// of it from the pod with 10,000 env entries, whose `managedFields` (one
/// entry per env entry) `k8s-openapi` parses into a `serde_json::Value`
/// tree at every read of the pod (heaptrack: a 74 MiB peak there); glibc
/// keeps most of that freed memory (`malloc_trim` gave back 93 MiB), and
/// RSS then stays flat. kubelet alone grew 76 to 86 MiB (kube-proxy is
/// another process). The bound is the worst figure with 40% to spare.
const RSS_GROWTH_BOUND_KIB: u64 = 320 * 1024;
/// How much RSS may still grow once the corpus was processed, over the
/// follow-up pods and Service (measured: 2 to 19 MiB): memory that keeps
/// growing would be a leak.
const RSS_AFTER_BOUND_KIB: u64 = 48 * 1024;
/// A text of every sort of unusual Unicode that a process' argument or
/// environment can carry: a right-to-left override, zero-width space and
/// joiner (a family emoji), combining marks, a non-character, the
/// replacement character, controls, CJK, and a line separator.
const ODD: &str = "ä\u{202e}txt.exe\u{202c} \u{200b}👩\u{200d}👩\u{200d}👧 e\u{301}\u{302} \u{fdd0}\u{fffd}\u{1}\u{7f}\t漢字\u{2028}";
/// [`ODD`] with a NUL, which JSON and the API server carry but no C
/// string (annotations, files) does.
const ODD_NUL: &str = "\u{0}nul ä\u{202e}\u{0}";

async fn hostile_objects(env: Arc<Env>, agents: Agents) -> anyhow::Result<()> {
    let node = env
        .start_node(&format!("hostile-{}", agents.name()), NodeSpec::of(agents))
        .await?;
    node.wait_ready(&env.admin).await?;
    let c = &env.admin;
    let ns = namespace(c, "hostile").await?;
    let result = run_corpus(&env, agents, &node, &ns).await;
    // Every proxy of the cluster sees the corpus' Services: it goes with
    // the case, also when the case failed.
    Api::<Namespace>::all(c.clone())
        .delete(&ns, &DeleteParams::default())
        .await?;
    result
}

async fn run_corpus(env: &Env, agents: Agents, node: &ClusterNode, ns: &str) -> anyhow::Result<()> {
    let c = &env.admin;
    let started = Instant::now();
    let rss_before = rss_kib(node)?;

    // The backend the Services below send to.
    let mut web = busybox_pod(
        "web",
        &node.name,
        "mkdir -p /www && echo web > /www/index.html && exec httpd -f -p 8080 -h /www",
    );
    web["metadata"]["labels"] = json!({"app": "hostile-web"});
    web["spec"]["containers"][0]["readinessProbe"] =
        json!({"tcpSocket": {"port": 8080}, "periodSeconds": 1});
    create_pod(c, ns, web).await?;

    let cms: Api<ConfigMap> = Api::namespaced(c.clone(), ns);
    cms.create(
        &PostParams::default(),
        &serde_json::from_value(json!({
            "metadata": {"name": "big"},
            "data": {"big": "y".repeat(CONFIGMAP_BYTES), "odd": ODD},
        }))?,
    )
    .await
    .context("creating the 1 MiB ConfigMap")?;

    let pods = corpus_pods(node, ns);
    for (name, pod) in &pods {
        create_pod(c, ns, pod.clone())
            .await
            .with_context(|| format!("the API server refused the corpus pod {name}"))?;
    }
    check_pods(c, ns).await?;
    let pods_done = started.elapsed();
    let rss_pods = rss_kib(node)?;

    let web_ip = pod_ip(c, ns, "web").await?;
    for svc in corpus_services(node) {
        Api::<Service>::namespaced(c.clone(), ns)
            .create(&PostParams::default(), &serde_json::from_value(svc)?)
            .await
            .context("creating a corpus Service")?;
    }
    for slice in corpus_slices(&web_ip) {
        Api::<EndpointSlice>::namespaced(c.clone(), ns)
            .create(&PostParams::default(), &serde_json::from_value(slice)?)
            .await
            .context("creating a corpus EndpointSlice")?;
    }
    check_services(c, ns, node).await?;
    let corpus_done = started.elapsed();
    let rss_corpus = rss_kib(node)?;

    // Still serving: a new pod behind a new Service answers.
    check_service(env, node).await?;
    node.check_running()?;
    let rss_after = rss_kib(node)?;
    eprintln!(
        "hostile corpus on {}: pods checked after {:.1}s, Services after {:.1}s; {} RSS {} KiB before, {} KiB with the pods, {} KiB with the Services, {} KiB after the follow-up Service",
        node.name,
        pods_done.as_secs_f64(),
        corpus_done.as_secs_f64(),
        agents.name(),
        rss_before,
        rss_pods,
        rss_corpus,
        rss_after
    );
    check_no_panic(node)?;
    if agents == Agents::Keelson {
        let peak = rss_corpus.max(rss_after);
        ensure!(
            peak.saturating_sub(rss_before) <= RSS_GROWTH_BOUND_KIB,
            "keelson's RSS grew from {rss_before} KiB to {peak} KiB with the corpus (bound: {RSS_GROWTH_BOUND_KIB} KiB of growth)"
        );
        ensure!(
            rss_after.saturating_sub(rss_corpus) <= RSS_AFTER_BOUND_KIB,
            "keelson's RSS went on growing after the corpus: {rss_corpus} KiB, then {rss_after} KiB (bound: {RSS_AFTER_BOUND_KIB} KiB)"
        );
    }
    Ok(())
}

/// The node agent's resident memory (keelson runs both roles in one process).
fn rss_kib(node: &ClusterNode) -> anyhow::Result<u64> {
    let pid = node
        .node_agent_pid()
        .ok_or_else(|| anyhow!("the node agent does not run"))?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .ok_or_else(|| anyhow!("no VmRSS in /proc/{pid}/status"))
}

/// No agent's log records a panic (Rust's `panicked at`, Go's
/// `Observed a panic` / `panic:`).
fn check_no_panic(node: &ClusterNode) -> anyhow::Result<()> {
    for log in [node.node_log(), node.proxy_log()].into_iter().flatten() {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if let Some(line) = text.lines().find(|l| {
            l.contains("panicked") || l.contains("Observed a panic") || l.starts_with("panic:")
        }) {
            return Err(anyhow!("{}: {line}", log.display()));
        }
    }
    Ok(())
}

async fn pod_ip(c: &kube::Client, ns: &str, name: &str) -> anyhow::Result<String> {
    Api::<Pod>::namespaced(c.clone(), ns)
        .get(name)
        .await?
        .status
        .and_then(|s| s.pod_ip)
        .ok_or_else(|| anyhow!("{name} has no IP"))
}

/// A text of `bytes` bytes or a little more, repeating `unit`.
fn repeat_to(unit: &str, bytes: usize) -> String {
    unit.repeat(bytes.div_ceil(unit.len()))
}

/// The termination messages of the `messages` pod: one per container, each
/// larger than 4 KiB, in characters of 1 to 4 bytes so that kubelet's byte
/// cuts (the file's last 4 KiB, then the pod's 12 KiB shared by five
/// containers) land inside a character.
fn messages() -> Vec<String> {
    vec![
        (0..2000).map(|i| format!("line {i}\n")).collect(),
        repeat_to("€", 9000),
        repeat_to("é", 9001),
        format!("x{}", repeat_to("👩\u{200d}👧", 9000)),
        format!("short {ODD}"),
    ]
}

/// How the API server shows a termination message kubelet cut from a
/// file's bytes: the last 4 KiB, then the first 12 KiB / containers of
/// those; kubelet sends the bytes as they are (protobuf), and the API
/// server's JSON encoder shows each byte that is not part of valid UTF-8
/// as U+FFFD (Go's `encoding/json`: `utf8.DecodeRuneInString` takes one
/// byte of an invalid sequence at a time).
fn expected_message(text: &str, containers: usize) -> String {
    let b = text.as_bytes();
    let tail = &b[b.len().saturating_sub(CONTAINER_MESSAGE_LIMIT)..];
    let cut = &tail[..tail.len().min(POD_MESSAGE_LIMIT / containers)];
    go_json_text(cut)
}

/// Go's `encoding/json` rendering of a byte string: valid UTF-8 as it is,
/// every other byte as U+FFFD.
fn go_json_text(mut b: &[u8]) -> String {
    let mut out = String::new();
    loop {
        match std::str::from_utf8(b) {
            Ok(s) => {
                out.push_str(s);
                return out;
            }
            Err(e) => {
                let (valid, rest) = b.split_at(e.valid_up_to());
                out.push_str(std::str::from_utf8(valid).unwrap_or_default());
                out.push('\u{fffd}');
                b = &rest[1..];
            }
        }
    }
}

/// A script that runs `checks` (which call `fail <what>` on a mismatch:
/// it becomes the termination message), then marks the container ready
/// for [`READY_AFTER_CHECKS`] and sleeps.
fn checked(checks: &str) -> String {
    format!(
        "fail() {{ printf '%s' \"$1\" > /dev/termination-log; exit 7; }}; {checks}; touch /tmp/checked; exec sleep 3600"
    )
}

/// Ready once [`checked`]'s checks passed.
static READY_AFTER_CHECKS: std::sync::LazyLock<Value> = std::sync::LazyLock::new(
    || json!({"exec": {"command": ["test", "-e", "/tmp/checked"]}, "periodSeconds": 1}),
);

fn container(name: &str, script: &str) -> Value {
    json!({
        "name": name,
        "image": BUSYBOX_IMAGE,
        "imagePullPolicy": "IfNotPresent",
        "command": ["/bin/sh", "-c", script],
    })
}

/// The corpus' pods, by name.
fn corpus_pods(node: &ClusterNode, ns: &str) -> Vec<(String, Value)> {
    let mut out = Vec::new();
    let pod = |name: &str, containers: Vec<Value>| {
        let mut p = busybox_pod(name, &node.name, "");
        p["metadata"]["labels"] = json!({"hostile": "corpus"});
        p["spec"]["containers"] = Value::Array(containers);
        p
    };

    // Annotations just under the API server's 256 KiB, in unusual Unicode,
    // also given to the container through a downward API file; the same
    // Unicode in an argument the container compares with an env value.
    let mut annotations = serde_json::Map::new();
    let value = repeat_to(&format!("{ODD}{ODD_NUL}"), 9000);
    let mut total = 0;
    for i in 0.. {
        let key = format!("hostile.example.com/a{i}");
        if total + key.len() + value.len() > ANNOTATIONS_LIMIT - 1024 {
            break;
        }
        total += key.len() + value.len();
        annotations.insert(key, Value::String(value.clone()));
    }
    let mut p = pod(
        "annotations",
        vec![json!({
            "name": "main",
            "image": BUSYBOX_IMAGE,
            "imagePullPolicy": "IfNotPresent",
            "command": ["/bin/sh", "-c",
                checked("[ \"$1\" = \"$ODD\" ] || fail \"arg: $1\"; [ $(wc -c < /podinfo/annotations) -gt 200000 ] || fail \"annotations: $(wc -c < /podinfo/annotations)\""),
                "sh", ODD],
            "env": [{"name": "ODD", "value": ODD}],
            "volumeMounts": [{"name": "podinfo", "mountPath": "/podinfo"}],
            "readinessProbe": READY_AFTER_CHECKS.clone(),
        })],
    );
    p["metadata"]["annotations"] = Value::Object(annotations);
    p["spec"]["volumes"] = json!([{"name": "podinfo", "downwardAPI": {"items": [
        {"path": "annotations", "fieldRef": {"fieldPath": "metadata.annotations"}}]}}]);
    out.push(("annotations".to_string(), p));

    // 10,000 environment variables: names as relaxed validation allows
    // them (any printable ASCII but '='), Unicode values, a $(VAR)
    // reference and an escaped one (the command is expanded too: its
    // `$$(E_9)` is the literal `$(E_9)`).
    let mut envs: Vec<Value> = (0..ENV_VARS - 5)
        .map(|i| json!({"name": format!("E_{i}"), "value": format!("v{i}-{ODD}")}))
        .collect();
    envs.push(json!({"name": "odd name.with-dots:and spaces!", "value": ODD}));
    envs.push(json!({"name": "1STARTS_WITH_DIGIT", "value": ""}));
    envs.push(json!({"name": "REF", "value": "<$(E_9)>"}));
    envs.push(json!({"name": "ESCAPED", "value": "$$(E_9)"}));
    let last = ENV_VARS - 6;
    let script = format!(
        "[ \"$E_{last}\" = \"v{last}-$ODD_CHECK\" ] || fail \"E_{last}: $E_{last}\"; [ \"$REF\" = \"<v9-$ODD_CHECK>\" ] || fail \"REF: $REF\"; [ \"$ESCAPED\" = '$$(E_9)' ] || fail \"ESCAPED: $ESCAPED\""
    );
    let mut ctr = container("main", &checked(&script));
    ctr["readinessProbe"] = READY_AFTER_CHECKS.clone();
    envs.insert(0, json!({"name": "ODD_CHECK", "value": ODD}));
    ctr["env"] = Value::Array(envs);
    out.push(("env".to_string(), pod("env", vec![ctr])));

    // Exec readiness probes that print 4 MiB and fail: one in ASCII, one
    // in 3-byte characters after two ASCII ones (10 KiB cuts a character
    // after its first two bytes).
    let probe = |name: &str, ch: &str| {
        let mut ctr = container(name, "exec sleep 3600");
        ctr["readinessProbe"] = json!({
            "exec": {"command": ["/bin/sh", "-c",
                format!("i=0; s={ch}; while [ $i -lt 20 ]; do s=$s$s; i=$((i+1)); done; (printf xx; while :; do printf %s $s; done) | head -c 4194304; exit 1")]},
            "periodSeconds": 5, "timeoutSeconds": 20, "failureThreshold": 1,
        });
        ctr
    };
    out.push((
        "probe-output".to_string(),
        pod(
            "probe-output",
            vec![probe("ascii", "x"), probe("euro", "€")],
        ),
    ));

    // Five containers whose termination messages exceed 4 KiB each and
    // the pod's 12 KiB together.
    let ctrs = messages()
        .into_iter()
        .enumerate()
        .map(|(i, m)| {
            let mut ctr = container(&format!("m{i}"), "printf %s \"$TM\" > /dev/termination-log");
            ctr["env"] = json!([{"name": "TM", "value": m}]);
            ctr
        })
        .collect();
    let mut p = pod("messages", ctrs);
    p["spec"]["restartPolicy"] = "Never".into();
    out.push(("messages".to_string(), p));

    // An argument over the kernel's 128 KiB per argument: execve fails.
    let mut p = pod(
        "long-arg",
        vec![json!({
            "name": "main",
            "image": BUSYBOX_IMAGE,
            "imagePullPolicy": "IfNotPresent",
            "command": ["/bin/sh", "-c", "exit 0", "sh", "z".repeat(200 * 1024)],
        })],
    );
    p["spec"]["restartPolicy"] = "Never".into();
    out.push(("long-arg".to_string(), p));

    // A NUL in an environment value: the API server takes it, no process'
    // environment can hold it.
    let mut ctr = container("main", "exit 0");
    ctr["env"] = json!([{"name": "NUL", "value": ODD_NUL}]);
    let mut p = pod("nul-env", vec![ctr]);
    p["spec"]["restartPolicy"] = "Never".into();
    out.push(("nul-env".to_string(), p));

    // 100 emptyDir volumes and the 1 MiB ConfigMap.
    let mut mounts: Vec<Value> = (0..VOLUMES)
        .map(|i| json!({"name": format!("v{i}"), "mountPath": format!("/v/{i}")}))
        .collect();
    mounts.push(json!({"name": "big", "mountPath": "/cm"}));
    let mut volumes: Vec<Value> = (0..VOLUMES)
        .map(|i| json!({"name": format!("v{i}"), "emptyDir": {}}))
        .collect();
    volumes.push(json!({"name": "big", "configMap": {"name": "big"}}));
    let last_vol = VOLUMES - 1;
    let mut ctr = container(
        "main",
        &checked(&format!(
            "[ $(wc -c < /cm/big) -eq {CONFIGMAP_BYTES} ] || fail \"big: $(wc -c < /cm/big)\"; [ \"$(cat /cm/odd)\" = \"$ODD\" ] || fail \"odd: $(cat /cm/odd)\"; [ -d /v/{last_vol} ] || fail \"no /v/{last_vol}\""
        )),
    );
    ctr["readinessProbe"] = READY_AFTER_CHECKS.clone();
    ctr["volumeMounts"] = Value::Array(mounts);
    ctr["env"] = json!([{"name": "ODD", "value": ODD}]);
    let mut p = pod("volumes", vec![ctr]);
    p["spec"]["volumes"] = Value::Array(volumes);
    out.push(("volumes".to_string(), p));

    // Names at the limits. A pod name of 253 characters: the API server
    // takes it, but /var/log/pods/<ns>_<name>_<uid> is longer than a file
    // name may be. The longest name that fits, with a 63-character
    // container name: its hostname is the name cut to 63 characters and
    // trimmed of trailing '-' and '.'.
    let long = long_name();
    out.push((
        long.clone(),
        pod(&long, vec![container("main", "exec sleep 3600")]),
    ));
    let name = fitting_name(ns);
    let mut ctr = container(
        &"c".repeat(63),
        &checked(&format!(
            "[ \"$(hostname)\" = \"{}\" ] || fail \"hostname: $(hostname)\"",
            "h".repeat(62)
        )),
    );
    ctr["readinessProbe"] = READY_AFTER_CHECKS.clone();
    let mut p = pod(&name, vec![ctr]);
    p["metadata"]["labels"] =
        json!({"app": "l".repeat(63), "hostile.example.com/long": "v".repeat(63)});
    out.push(("fits".to_string(), p));
    for (_, p) in &mut out {
        // The namespace's Services would add their variables (2,000 ports:
        // 14,000 of them) to every container as they come.
        p["spec"]["enableServiceLinks"] = false.into();
    }
    out
}

/// A pod name of 253 characters, the API server's limit.
fn long_name() -> String {
    format!("{}.{}", "a".repeat(126), "b".repeat(126))
}

/// The longest pod name whose log directory name
/// (`<namespace>_<name>_<uid>`) is a valid file name; its first 63
/// characters end in a '.'.
fn fitting_name(ns: &str) -> String {
    let fits = 255 - 36 - 2 - ns.len();
    format!("{}.{}", "h".repeat(62), "k".repeat(fits - 63))
}

/// The corpus' Services.
fn corpus_services(node: &ClusterNode) -> Vec<Value> {
    // 2,000 ports (TCP, and UDP where the number is even), all to the web
    // pod's 8080, with names of every allowed shape.
    let mut ports = Vec::new();
    for i in 1..=PORTS {
        let name = match i {
            1 => "a".to_string(),
            2 => "0-starts-with-digit".to_string(),
            3 => format!("n{}", "-".repeat(61) + "z"),
            _ => format!("p-{i}"),
        };
        ports.push(json!({"name": name, "port": i, "targetPort": 8080, "protocol": "TCP"}));
        if i % 2 == 0 && i <= 200 {
            ports.push(
                json!({"name": format!("u-{i}"), "port": i, "targetPort": 8080, "protocol": "UDP"}),
            );
        }
    }
    vec![
        json!({"metadata": {"name": "many-ports"}, "spec": {
            "selector": {"app": "hostile-web"}, "ports": ports}}),
        json!({"metadata": {"name": "many-endpoints"}, "spec": {
            "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}}),
        json!({"metadata": {"name": "odd-slices"}, "spec": {
            "ipFamilyPolicy": "PreferDualStack",
            "ports": [{"name": "x", "port": 80, "targetPort": 8080},
                      {"name": "y".repeat(63), "port": 81, "targetPort": 8080, "protocol": "UDP"}]}}),
        json!({"metadata": {"name": "external"}, "spec": {
            "type": "LoadBalancer",
            "selector": {"app": "hostile-web"},
            "externalIPs": [node.ip.to_string(), "2001:db8::10"],
            // kube-proxy trims the spaces that validation lets through.
            "loadBalancerSourceRanges": [" 10.99.0.0/16 ", "2001:db8::/32", "0.0.0.0/0"],
            "ports": [{"name": "http", "port": 8081, "targetPort": 8080}]}}),
    ]
}

fn endpoint(ip: &str, ready: bool) -> Value {
    json!({"addresses": [ip], "conditions": {"ready": ready}})
}

fn slice(name: &str, service: &str, family: &str, port: u16, endpoints: Vec<Value>) -> Value {
    json!({
        "metadata": {"name": name, "labels": {
            "kubernetes.io/service-name": service,
            "endpointslice.kubernetes.io/managed-by": "hostile.example.com"}},
        "addressType": family,
        "ports": [{"name": if service == "odd-slices" { "x" } else { "http" }, "port": port, "protocol": "TCP"}],
        "endpoints": endpoints,
    })
}

/// The corpus' EndpointSlices: 10,000 endpoints at the cap of 1,000 per
/// slice for one Service; for another, the web pod beside slices the
/// proxy must leave alone (IPv6 and FQDN on an IPv4 node), the web pod
/// again in a second slice, and endpoints of odd but accepted addresses
/// (multicast, broadcast, the TEST-NET) that are not ready.
fn corpus_slices(web_ip: &str) -> Vec<Value> {
    let mut out = Vec::new();
    for s in 0..ENDPOINTS / SLICE_CAP {
        let eps = (0..SLICE_CAP)
            .map(|i| {
                let n = s * SLICE_CAP + i;
                endpoint(&format!("10.250.{}.{}", n / 250, n % 250 + 1), true)
            })
            .collect();
        out.push(slice(
            &format!("many-endpoints-{s}"),
            "many-endpoints",
            "IPv4",
            8080,
            eps,
        ));
    }
    out.push(slice(
        "odd-slices-v4",
        "odd-slices",
        "IPv4",
        8080,
        vec![
            endpoint(web_ip, true),
            endpoint("224.0.1.1", false),
            endpoint("255.255.255.255", false),
            endpoint("192.0.2.1", false),
        ],
    ));
    out.push(slice(
        "odd-slices-dup",
        "odd-slices",
        "IPv4",
        8080,
        vec![endpoint(web_ip, true)],
    ));
    out.push(slice(
        "odd-slices-v6",
        "odd-slices",
        "IPv6",
        8080,
        vec![endpoint("fd00::1", true), endpoint("2001:db8::1", true)],
    ));
    out.push(slice(
        "odd-slices-fqdn",
        "odd-slices",
        "FQDN",
        8080,
        vec![endpoint("example.com", true)],
    ));
    out
}

fn terminated(p: &Pod, container: &str) -> Option<(String, i32, String)> {
    let s = p
        .status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .iter()
        .find(|s| s.name == container)?;
    let t = s.state.as_ref()?.terminated.as_ref()?;
    Some((
        t.reason.clone().unwrap_or_default(),
        t.exit_code,
        t.message.clone().unwrap_or_default(),
    ))
}

/// Waits until the pod's checks passed (Ready) without a restart; a
/// failed check's message is in the error.
async fn ready_after_checks(c: &kube::Client, ns: &str, name: &str) -> anyhow::Result<()> {
    wait_pod(c, ns, name, "checks passed", Duration::from_secs(90), |p| {
        let s = p
            .status
            .as_ref()
            .and_then(|s| s.container_statuses.as_ref());
        let first = s.and_then(|s| s.first()).ok_or("no container status")?;
        if first.restart_count > 0 || first.state.as_ref().is_some_and(|s| s.terminated.is_some()) {
            let t = first
                .last_state
                .as_ref()
                .and_then(|s| s.terminated.as_ref())
                .or_else(|| first.state.as_ref().and_then(|s| s.terminated.as_ref()));
            return Err(format!(
                "a check failed: {:?}",
                t.and_then(|t| t.message.clone())
            ));
        }
        first
            .ready
            .then_some(())
            .ok_or_else(|| "not ready".to_string())
    })
    .await
}

/// What each pod shows, as kubelet shows it.
async fn check_pods(c: &kube::Client, ns: &str) -> anyhow::Result<()> {
    for name in ["web", "annotations", "env", "volumes", &fitting_name(ns)] {
        ready_after_checks(c, ns, name).await?;
    }

    // The probe output as kubelet keeps it: its first 10 KiB.
    for ch in ["x", "€"] {
        let output = format!("xx{}", ch.repeat(PROBE_OUTPUT_LIMIT));
        let output = go_json_text(&output.as_bytes()[..PROBE_OUTPUT_LIMIT]);
        let want = format!("Readiness probe failed: {output}");
        let ev = wait_event(
            c,
            ns,
            "probe-output",
            "Unhealthy",
            &want.chars().take(60).collect::<String>(),
            Duration::from_secs(90),
        )
        .await?;
        let got = ev.message.unwrap_or_default();
        ensure!(
            got == want,
            "probe output event of {} bytes (want {}): {:?}...{:?}",
            got.len(),
            want.len(),
            &got[..got.len().min(60)],
            got.chars().rev().take(20).collect::<String>()
        );
    }

    // Termination messages: each the last 4 KiB of its file, cut to the
    // pod's 12 KiB shared by its five containers, bytes kept as written.
    let texts = messages();
    let n = texts.len();
    let p = wait_pod(
        c,
        ns,
        "messages",
        "all containers terminated",
        Duration::from_secs(90),
        |p| {
            (0..n)
                .all(|i| terminated(p, &format!("m{i}")).is_some())
                .then(|| p.clone())
                .ok_or_else(|| "running".to_string())
        },
    )
    .await?;
    for (i, text) in texts.iter().enumerate() {
        let (reason, code, message) =
            terminated(&p, &format!("m{i}")).ok_or_else(|| anyhow!("m{i} not terminated"))?;
        let want = expected_message(text, n);
        ensure!(
            reason == "Completed" && code == 0 && message == want,
            "container m{i}: {reason} {code}, message of {} bytes {:?}..{:?}; want {} bytes {:?}..{:?}",
            message.len(),
            message.chars().take(12).collect::<String>(),
            message.chars().rev().take(12).collect::<String>(),
            want.len(),
            want.chars().take(12).collect::<String>(),
            want.chars().rev().take(12).collect::<String>(),
        );
    }

    // The argument the kernel refuses: runc's init process fails its
    // execve after the container started, exit code 1, no message.
    wait_pod(
        c,
        ns,
        "long-arg",
        "exit code 1",
        Duration::from_secs(90),
        |p| match terminated(p, "main") {
            Some((r, 1, m)) if r == "Error" && m.is_empty() => Ok(()),
            other => Err(format!("{other:?}")),
        },
    )
    .await?;

    // A NUL in an env value: runc refuses to create the container.
    wait_pod(
        c,
        ns,
        "nul-env",
        "StartError",
        Duration::from_secs(90),
        |p| match terminated(p, "main") {
            Some((r, 128, m))
                if r == "StartError"
                    && m.contains("environment variable value can't contain null") =>
            {
                Ok(())
            }
            other => Err(format!("{other:?}")),
        },
    )
    .await?;

    // The 253-character name: no sandbox, the log directory's error in
    // the event, the pod stays Pending.
    let long = long_name();
    let ev = wait_event(
        c,
        ns,
        &long,
        "FailedCreatePodSandBox",
        "file name too long",
        Duration::from_secs(60),
    )
    .await?;
    let msg = ev.message.unwrap_or_default();
    ensure!(
        msg.starts_with("Failed to create pod sandbox: mkdir ")
            && msg.contains(&format!("/{ns}_{long}_"))
            && msg.ends_with(": file name too long"),
        "event: {msg}"
    );
    let phase = Api::<Pod>::namespaced(c.clone(), ns)
        .get(&long)
        .await?
        .status
        .and_then(|s| s.phase)
        .unwrap_or_default();
    ensure!(phase == "Pending", "the pod with the long name is {phase}");
    // No warning about the 10,000 entries (a readiness failure before the
    // checks ran is timing, not the environment).
    let events = events_for(c, ns, "env").await?;
    ensure!(
        !events
            .iter()
            .any(|e| e.type_.as_deref() == Some("Warning")
                && e.reason.as_deref() != Some("Unhealthy")),
        "warnings about the env pod: {:?}",
        events.iter().map(|e| e.message.clone()).collect::<Vec<_>>()
    );
    Ok(())
}

/// GETs to `addr` from the node, all answered by the web pod.
async fn answers(node: &ClusterNode, addr: SocketAddr, what: &str) -> anyhow::Result<()> {
    wait_for(
        what,
        Duration::from_secs(60),
        Duration::from_millis(300),
        || async {
            for _ in 0..10 {
                let body = http_get(node.containerd().netns(), addr, "/")
                    .await
                    .map_err(|e| e.to_string())?;
                if body.trim() != "web" {
                    return Err(format!("answered {body:?}"));
                }
            }
            Ok(())
        },
    )
    .await?;
    Ok(())
}

/// What the proxy does with the Services: the many-ports Service answers
/// on its last port, the odd slices' Service only from the web pod, the
/// external IP (the node's own) from the web pod.
async fn check_services(c: &kube::Client, ns: &str, node: &ClusterNode) -> anyhow::Result<()> {
    let svcs: Api<Service> = Api::namespaced(c.clone(), ns);
    let ip = |s: Service| -> anyhow::Result<IpAddr> {
        Ok(s.spec
            .and_then(|s| s.cluster_ip)
            .ok_or_else(|| anyhow!("no clusterIP"))?
            .parse()?)
    };
    let many = ip(svcs.get("many-ports").await?)?;
    answers(
        node,
        SocketAddr::new(many, PORTS as u16),
        "the last of 2,000 ports",
    )
    .await?;
    answers(
        node,
        SocketAddr::new(many, 3),
        "the port with the 63-character name",
    )
    .await?;
    let odd = ip(svcs.get("odd-slices").await?)?;
    answers(node, SocketAddr::new(odd, 80), "the Service of odd slices").await?;
    answers(
        node,
        SocketAddr::new(IpAddr::V4(node.ip), 8081),
        "the external IP",
    )
    .await?;
    Ok(())
}
