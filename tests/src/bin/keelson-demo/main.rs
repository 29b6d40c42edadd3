//! `keelson-demo`: the README's first command (`sudo ./scripts/demo` builds
//! and runs it). On one machine, with nothing installed on the host side:
//!
//! 1. the test API server (`keelson_tests::testapi`, the stand-in for
//!    kube-apiserver) with one token per identity: an admin for kubectl,
//!    the node (`system:node:demo-node`), kube-proxy (`system:kube-proxy`)
//!    and the controllers;
//! 2. a private containerd in a network namespace of its own
//!    (`keelson_tests::containerd`), with the demo images imported;
//! 3. the real `keelson` binary in both roles inside that namespace, each
//!    role with its own kubeconfig, pods under a demo-only cgroup;
//! 4. stand-ins for kube-scheduler and the EndpointSlice controller (the
//!    test API server runs neither);
//! 5. `kubectl apply` of `scripts/demo.d/hello.yaml`: the Pod runs, the
//!    Service answers through its ClusterIP from the node's namespace;
//! 6. an audit of what the proxy identity asked the API server for against
//!    the shipped ClusterRole (`packaging/kubernetes/proxy/rbac.yaml`);
//! 7. `kubectl logs` and `kubectl exec` of the Pod: the API server proxies
//!    them to keelson's node API (:10250) with its kubelet client
//!    certificate, which keelson's `clientCAFile` trusts.
//!
//! Then it waits for Ctrl-C (`--check`: it stops at once) and tears down in
//! order: the workload through the API (keelson terminates the Pod), keelson
//! (SIGTERM), containerd and everything it created, the API server.

mod controllers;
mod process;
mod rbac;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Parser;
use k8s_openapi::api::core::v1::{Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use keelson::apiclient::{ClientSettings, build_client};
use keelson::config::Config;
use keelson_tests::containerd::Containerd;
use keelson_tests::support::wait_for;
use keelson_tests::testapi::{StaticToken, TestApiOptions, TestApiServer};
use kube::Api;
use kube::api::ListParams;
use tokio_util::sync::CancellationToken;

use process::Keelson;

/// The demo node's name.
const NODE: &str = "demo-node";
/// The node's IP inside its namespace (TEST-NET-1, on the namespace's loopback).
const NODE_IP: &str = "192.0.2.10";
/// The Service CIDR of the test API server.
const SERVICE_CIDR: &str = "10.96.0.0/12";

const ADMIN_TOKEN: &str = "demo-admin";
const NODE_TOKEN: &str = "demo-node";
const PROXY_TOKEN: &str = "demo-proxy";
const CONTROLLERS_TOKEN: &str = "demo-controllers";
const PROXY_USER: &str = "system:kube-proxy";

/// keelson's local demo: a test API server, a private containerd and keelson
/// in both roles; runs an example Pod and Service and shows them working.
#[derive(Parser, Debug)]
#[command(name = "keelson-demo")]
struct Args {
    /// Exit (cleaning up) as soon as the Service answered, instead of
    /// waiting for Ctrl-C; exit status 0 only if everything worked.
    #[arg(long)]
    check: bool,
    /// The keelson binary (default: `keelson` next to this program).
    #[arg(long, value_name = "FILE")]
    keelson: Option<PathBuf>,
    /// The example workload applied with kubectl.
    #[arg(long, value_name = "FILE", default_value = "scripts/demo.d/hello.yaml")]
    manifests: PathBuf,
    /// Longest time each step may take, in seconds.
    #[arg(long, value_name = "SECONDS", default_value_t = 180)]
    step_timeout: u64,
}

fn main() -> ExitCode {
    let args = Args::parse();
    if !nix::unistd::geteuid().is_root() {
        eprintln!(
            "keelson-demo needs root (network namespaces, containerd, nftables): run `sudo ./scripts/demo`"
        );
        return ExitCode::from(2);
    }
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("keelson-demo: starting the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let code = rt.block_on(async move {
        let interrupt = CancellationToken::new();
        if let Err(e) = cancel_on_signals(interrupt.clone()) {
            eprintln!("keelson-demo: installing signal handlers: {e}");
            return ExitCode::FAILURE;
        }
        match demo(&args, interrupt).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("\nkeelson-demo failed: {e:#}");
                ExitCode::FAILURE
            }
        }
    });
    // The API server's and controllers' tasks end with the runtime.
    rt.shutdown_timeout(Duration::from_secs(5));
    code
}

fn cancel_on_signals(token: CancellationToken) -> std::io::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut int = signal(SignalKind::interrupt())?;
    let mut term = signal(SignalKind::terminate())?;
    tokio::spawn(async move {
        tokio::select! {
            _ = int.recv() => {}
            _ = term.recv() => {}
        }
        token.cancel();
    });
    Ok(())
}

fn step(n: u32, text: &str) {
    println!("\n[{n}/6] {text}");
}

/// Runs `fut` unless interrupted first.
async fn or_interrupt<T>(
    interrupt: &CancellationToken,
    fut: impl Future<Output = anyhow::Result<T>>,
) -> anyhow::Result<T> {
    tokio::select! {
        r = fut => r,
        _ = interrupt.cancelled() => bail!("interrupted"),
    }
}

fn keelson_path(args: &Args) -> anyhow::Result<PathBuf> {
    if let Some(p) = &args.keelson {
        return Ok(p.clone());
    }
    let exe = std::env::current_exe().context("locating keelson-demo")?;
    let p = exe.with_file_name("keelson");
    if !p.is_file() {
        bail!(
            "{} not found: build it (cargo build -p keelson) or pass --keelson FILE",
            p.display()
        );
    }
    Ok(p)
}

/// kubectl with the admin kubeconfig; prints the command and its output.
struct Kubectl {
    kubeconfig: PathBuf,
    cache: PathBuf,
}

impl Kubectl {
    async fn run(&self, args: &[&str], show: bool) -> anyhow::Result<String> {
        if show {
            println!("    $ kubectl {}", args.join(" "));
        }
        let out = tokio::process::Command::new("kubectl")
            .env("KUBECONFIG", &self.kubeconfig)
            .arg("--cache-dir")
            .arg(&self.cache)
            .arg("--request-timeout=20s")
            .args(args)
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output()
            .await
            .context("running kubectl")?;
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        if show {
            for l in stdout.lines() {
                println!("    {l}");
            }
        }
        if !out.status.success() {
            bail!(
                "kubectl {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(stdout)
    }
}

/// Everything that runs; dropped in reverse order of creation on any exit.
struct Running {
    keelson: Keelson,
    controllers: CancellationToken,
    _stop_controllers: tokio_util::sync::DropGuard,
    ctrd: Containerd,
    api: TestApiServer,
    admin: kube::Client,
    kubectl: Kubectl,
    dir: tempfile::TempDir,
}

async fn demo(args: &Args, interrupt: CancellationToken) -> anyhow::Result<()> {
    let timeout = Duration::from_secs(args.step_timeout);
    let bin = keelson_path(args)?;
    let manifests = std::fs::canonicalize(&args.manifests)
        .with_context(|| format!("example manifests {}", args.manifests.display()))?;
    println!(
        "keelson demo: keelson in both roles (kubelet + kube-proxy) against a test API server and a private containerd."
    );
    println!(
        "Nothing on the host changes: containerd, the pods and keelson's nftables table live in a network namespace of their own."
    );

    let started = Instant::now();
    let mut run = or_interrupt(&interrupt, start_everything(&bin, timeout)).await?;
    let result = match or_interrupt(&interrupt, show_workload(&run, &manifests, timeout)).await {
        Ok(svc) => or_interrupt(&interrupt, show_node_api(&run))
            .await
            .map(|()| svc),
        Err(e) => Err(e),
    };
    let outcome = match result {
        Ok(svc) => {
            println!(
                "\nEverything works ({:.0?} from the start).",
                started.elapsed()
            );
            if args.check {
                Ok(())
            } else {
                try_it(&run, &svc);
                interrupt.cancelled().await;
                println!("\nCtrl-C: stopping.");
                Ok(())
            }
        }
        Err(e) => {
            if !interrupt.is_cancelled() {
                diagnose(&mut run).await;
            }
            Err(e)
        }
    };
    teardown(run, &manifests).await;
    outcome
}

async fn start_everything(bin: &Path, timeout: Duration) -> anyhow::Result<Running> {
    step(
        1,
        "test API server (a stand-in for kube-apiserver; never for real use)",
    );
    let dir = tempfile::Builder::new()
        .prefix("keelson-demo-")
        .tempdir()
        .context("temp dir")?;
    let token = |token: &str, user: &str| StaticToken {
        token: token.into(),
        user: user.into(),
    };
    let kubeconfig = dir.path().join("admin.kubeconfig");
    let api = TestApiServer::start(TestApiOptions {
        // The first token is the one in the admin kubeconfig.
        tokens: vec![
            token(ADMIN_TOKEN, "kubernetes-admin"),
            token(NODE_TOKEN, &format!("system:node:{NODE}")),
            token(PROXY_TOKEN, PROXY_USER),
            token(CONTROLLERS_TOKEN, "system:kube-controller-manager"),
        ],
        kubeconfig_path: Some(kubeconfig.clone()),
        service_cidr: SERVICE_CIDR.into(),
        ..TestApiOptions::default()
    })
    .await
    .context("starting the test API server")?;
    println!(
        "    {}  (kubeconfig {})",
        api.https_url(),
        kubeconfig.display()
    );
    let admin = api.try_client().await.context("admin client")?;

    step(
        2,
        "private containerd (own dirs, own network namespace; images built locally, no registry)",
    );
    let ctrd = Containerd::start().await.context("starting containerd")?;
    println!(
        "    network namespace {}, pod network {}, containerd state in {}",
        ctrd.netns().name(),
        ctrd.pod_cidr(),
        ctrd.dir().display()
    );

    step(
        3,
        "keelson run: node role (kubelet) and proxy role (kube-proxy), each with its own identity",
    );
    // The API server is reached from the node's namespace through a plain
    // HTTP listener created there.
    let listener = ctrd
        .netns()
        .tcp_listener(SocketAddr::from(([127, 0, 0, 1], 0)))
        .context("listening in the node namespace")?;
    let api_addr = listener.local_addr().context("listener address")?;
    api.serve_listener(listener);
    ctrd.netns()
        .ip(&["addr", "add", &format!("{NODE_IP}/32"), "dev", "lo"])
        .context("adding the node IP")?;
    let state = ctrd.dir().join("keelson");
    std::fs::create_dir_all(&state).context("keelson dir")?;
    let server = format!("http://{api_addr}");
    let node_kc = state.join("node.kubeconfig");
    let proxy_kc = state.join("proxy.kubeconfig");
    api.write_kubeconfig_with_server(&node_kc, &server, Some(NODE_TOKEN))
        .context("node kubeconfig")?;
    api.write_kubeconfig_with_server(&proxy_kc, &server, Some(PROXY_TOKEN))
        .context("proxy kubeconfig")?;
    let mut cfg = Config {
        node_name: Some(NODE.into()),
        ..Config::default()
    };
    cfg.node.kubeconfig = Some(node_kc);
    cfg.node.container_runtime_endpoint = ctrd.endpoint();
    // Below containerd's instance dir: removed (and unmounted) with it.
    cfg.node.root_dir = state.join("root");
    cfg.node.pod_logs_dir = state.join("pod-logs");
    cfg.node.cgroup_root = ctrd.cgroup_parent();
    cfg.node.node_ip = Some(NODE_IP.parse().context("node IP")?);
    cfg.node.pod_cidr = ctrd.pod_cidr().to_string();
    cfg.node.cluster_domain = "cluster.local".into();
    // The demo shares the host's disk: a nearly full disk must not evict
    // its pod.
    keelson_tests::node_harness::ignore_host_disk(&mut cfg);
    cfg.proxy.client_connection.kubeconfig = Some(proxy_kc);
    cfg.proxy.cluster_cidr = ctrd.pod_cidr().to_string();
    // The node API trusts the API server's kubelet client certificate; the
    // API server reaches it inside the node's namespace.
    let client_ca = state.join("kubelet-client-ca.crt");
    std::fs::write(&client_ca, api.kubelet_client_ca_pem()).context("client CA")?;
    cfg.node.authentication.x509.client_ca_file = Some(client_ca);
    let ns_name = ctrd.netns().name().to_string();
    api.set_node_dialer(std::sync::Arc::new(move |addr| {
        let ns = ns_name.clone();
        Box::pin(async move {
            tokio::task::spawn_blocking(move || {
                keelson_tests::netns::connect_in(&ns, addr, Duration::from_secs(5))
            })
            .await
            .map_err(std::io::Error::other)?
        })
    }));
    cfg.validate()
        .map_err(|e| anyhow::anyhow!("demo configuration: {e:?}"))?;
    let config_path = state.join("config.yaml");
    std::fs::write(&config_path, cfg.to_yaml()).context("writing the configuration")?;
    let log = dir.path().join("keelson.log");
    let mut keelson =
        Keelson::start(ctrd.netns(), bin, &config_path, &log).context("starting keelson")?;
    println!(
        "    pid {}, config {}, log {}",
        keelson.pid().unwrap_or_default(),
        config_path.display(),
        log.display()
    );
    let ready = wait_for(
        "the Node to be Ready",
        timeout,
        Duration::from_millis(250),
        || {
            let admin = admin.clone();
            let exited = keelson.exited();
            async move {
                if let Some(status) = exited {
                    return Err(format!("keelson exited: {status}"));
                }
                let node = Api::<Node>::all(admin)
                    .get_opt(NODE)
                    .await
                    .map_err(|e| e.to_string())?;
                let node = node.ok_or("no Node yet")?;
                let ready = node
                    .status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"))
                    .map(|c| (c.status.clone(), c.message.clone().unwrap_or_default()));
                match ready {
                    Some((s, _)) if s == "True" => Ok(()),
                    Some((s, m)) => Err(format!("Ready={s}: {m}")),
                    None => Err("no Ready condition yet".into()),
                }
            }
        },
    )
    .await;
    if let Err(e) = ready {
        bail!("{e}\n--- keelson log (tail) ---\n{}", keelson.log_tail(40));
    }
    let kubectl = Kubectl {
        kubeconfig,
        cache: dir.path().join("kubectl-cache"),
    };
    kubectl.run(&["get", "nodes", "-o", "wide"], true).await?;

    let controllers = CancellationToken::new();
    let ctl_kc = dir.path().join("controllers.kubeconfig");
    api.write_kubeconfig(&ctl_kc, Some(CONTROLLERS_TOKEN))
        .context("controllers kubeconfig")?;
    let ctl_client = build_client(&ClientSettings {
        kubeconfig: Some(&ctl_kc),
        qps: 20.0,
        burst: 30,
        role: "demo-controllers",
    })
    .await
    .context("controllers client")?;
    tokio::spawn(controllers::run(
        ctl_client,
        NODE.into(),
        controllers.clone(),
    ));
    Ok(Running {
        keelson,
        _stop_controllers: controllers.clone().drop_guard(),
        controllers,
        ctrd,
        api,
        admin,
        kubectl,
        dir,
    })
}

/// What the demo shows working: the Service's ClusterIP address and port.
struct Shown {
    cluster_ip: String,
    port: i32,
}

async fn show_workload(
    run: &Running,
    manifests: &Path,
    timeout: Duration,
) -> anyhow::Result<Shown> {
    step(
        4,
        "kubectl apply: a busybox httpd Pod and a ClusterIP Service",
    );
    let file = manifests.display().to_string();
    run.kubectl.run(&["apply", "-f", &file], true).await?;

    step(
        5,
        "the Pod runs on containerd, started and probed by keelson's node role",
    );
    let pods: Api<Pod> = Api::namespaced(run.admin.clone(), "default");
    wait_for(
        "pod default/hello to be Running and Ready",
        timeout,
        Duration::from_millis(250),
        || {
            let pods = pods.clone();
            async move {
                let pod = pods
                    .get_opt("hello")
                    .await
                    .map_err(|e| e.to_string())?
                    .ok_or("no pod")?;
                let status = pod.status.unwrap_or_default();
                let ready = status
                    .conditions
                    .iter()
                    .flatten()
                    .any(|c| c.type_ == "Ready" && c.status == "True");
                if status.phase.as_deref() == Some("Running") && ready {
                    Ok(())
                } else {
                    let waiting: Vec<String> = status
                        .container_statuses
                        .iter()
                        .flatten()
                        .filter_map(|c| c.state.as_ref()?.waiting.as_ref()?.reason.clone())
                        .collect();
                    Err(format!(
                        "phase {:?}, ready {ready}, waiting {waiting:?}",
                        status.phase
                    ))
                }
            }
        },
    )
    .await?;
    run.kubectl
        .run(&["get", "pods", "-o", "wide"], true)
        .await?;

    step(
        6,
        "the Service answers through its ClusterIP (nftables rules of keelson's proxy role)",
    );
    let svc = Api::<Service>::namespaced(run.admin.clone(), "default")
        .get("hello")
        .await
        .context("reading Service default/hello")?;
    let spec = svc.spec.unwrap_or_default();
    let cluster_ip = spec
        .cluster_ip
        .clone()
        .context("Service has no ClusterIP")?;
    let port = spec
        .ports
        .iter()
        .flatten()
        .next()
        .map(|p| p.port)
        .context("Service has no port")?;
    let slices: Api<EndpointSlice> = Api::namespaced(run.admin.clone(), "default");
    wait_for(
        "a ready endpoint for default/hello",
        timeout,
        Duration::from_millis(250),
        || {
            let slices = slices.clone();
            async move {
                let list = slices
                    .list(&ListParams::default().labels("kubernetes.io/service-name=hello"))
                    .await
                    .map_err(|e| e.to_string())?;
                let ready = list
                    .items
                    .iter()
                    .flat_map(|s| s.endpoints.iter().flatten())
                    .any(|e| e.conditions.as_ref().and_then(|c| c.ready) == Some(true));
                if ready {
                    Ok(())
                } else {
                    Err(format!("{} slice(s), none ready", list.items.len()))
                }
            }
        },
    )
    .await?;
    run.kubectl
        .run(&["get", "services,endpointslices", "-o", "wide"], true)
        .await?;
    // The demo node has no uplink: route the Service CIDR to the pod bridge,
    // where a real node would use its default route.
    run.ctrd
        .netns()
        .ip(&["route", "replace", SERVICE_CIDR, "dev", "kbr0"])
        .context("routing the Service CIDR in the node namespace")?;
    let url = format!("http://{cluster_ip}:{port}/");
    println!(
        "    $ nsenter --net={} curl -sS {url}",
        run.ctrd.netns().path().display()
    );
    let body = wait_for(
        "the Service to answer on its ClusterIP",
        timeout,
        Duration::from_millis(250),
        || {
            let cmd = run
                .ctrd
                .netns()
                .exec("curl", &["-sS", "--max-time", "2", &url]);
            async move {
                let body = cmd.map_err(|e| e.to_string())?;
                if body.contains("hello from pod hello") {
                    Ok(body)
                } else {
                    Err(format!("unexpected answer {body:?}"))
                }
            }
        },
    )
    .await?;
    println!("    {}", body.trim());

    // What the proxy identity did, against the ClusterRole shipped for it.
    let rules = rbac::proxy_rules().map_err(|e| anyhow::anyhow!(e))?;
    let (seen, denied) = rbac::audit(&run.api.knobs().requests(), PROXY_USER, &rules);
    if !denied.is_empty() {
        bail!(
            "the proxy role made requests packaging/kubernetes/proxy/rbac.yaml does not allow: {denied:?}"
        );
    }
    if seen.is_empty() {
        bail!("the proxy role made no API request as {PROXY_USER}");
    }
    println!(
        "    the proxy role ({PROXY_USER}) asked the API server only for what packaging/kubernetes/proxy/rbac.yaml grants: {}",
        seen.into_iter().collect::<Vec<_>>().join(", ")
    );
    Ok(Shown { cluster_ip, port })
}

/// Step 7: kubectl logs and exec through the API server to the node API.
async fn show_node_api(run: &Running) -> anyhow::Result<()> {
    step(
        7,
        "kubectl logs and exec: the API server proxies them to keelson's node API (:10250)",
    );
    let logs = run.kubectl.run(&["logs", "hello"], true).await?;
    if !logs.contains("serving /tmp/www") {
        bail!("kubectl logs hello printed {logs:?}");
    }
    let out = run
        .kubectl
        .run(&["exec", "hello", "--", "cat", "/tmp/www/index.html"], true)
        .await?;
    if !out.contains("hello from pod hello") {
        bail!("kubectl exec printed {out:?}");
    }
    Ok(())
}

fn try_it(run: &Running, svc: &Shown) {
    println!("\nTry it yourself (in another shell, as root):");
    println!("    export KUBECONFIG={}", run.kubectl.kubeconfig.display());
    println!("    kubectl get pods,services,endpointslices -o wide");
    println!("    kubectl get events");
    println!("    kubectl logs -f hello");
    println!("    kubectl exec -it hello -- sh");
    println!(
        "    nsenter --net={} curl http://{}:{}/",
        run.ctrd.netns().path().display(),
        svc.cluster_ip,
        svc.port
    );
    println!(
        "    nsenter --net={} nft list ruleset",
        run.ctrd.netns().path().display()
    );
    println!(
        "    nsenter --net={} curl -s 127.0.0.1:10249/metrics | grep kubeproxy",
        run.ctrd.netns().path().display()
    );
    println!(
        "    tail -f {}",
        run.dir.path().join("keelson.log").display()
    );
    println!("Press Ctrl-C to stop and remove everything.");
}

async fn diagnose(run: &mut Running) {
    eprintln!("\n--- diagnostics ---");
    if let Some(status) = run.keelson.exited() {
        eprintln!("keelson exited: {status}");
    }
    for args in [
        ["get", "pods,services,endpointslices", "-A", "-o", "wide"],
        ["get", "events", "-A", "-o", "wide"],
    ] {
        match run.kubectl.run(&args, false).await {
            Ok(out) => eprintln!("$ kubectl {}\n{out}", args.join(" ")),
            Err(e) => eprintln!("{e}"),
        }
    }
    eprintln!("--- keelson log (tail) ---\n{}", run.keelson.log_tail(60));
}

async fn teardown(mut run: Running, manifests: &Path) {
    println!("\nStopping:");
    let file = manifests.display().to_string();
    // A second Ctrl-C from here on is ignored: the steps below are what
    // leaves the machine clean.
    match run
        .kubectl
        .run(
            &["delete", "-f", &file, "--wait=false", "--ignore-not-found"],
            false,
        )
        .await
    {
        Ok(_) => {
            let deleting = Instant::now();
            let pods: Api<Pod> = Api::namespaced(run.admin.clone(), "default");
            let gone = wait_for(
                "pod default/hello to be gone",
                Duration::from_secs(60),
                Duration::from_millis(250),
                || {
                    let pods = pods.clone();
                    async move {
                        match pods.get_opt("hello").await.map_err(|e| e.to_string())? {
                            None => Ok(()),
                            Some(_) => Err("still there".to_string()),
                        }
                    }
                },
            )
            .await;
            match gone {
                Ok(()) => println!(
                    "    workload deleted; keelson stopped the Pod and removed it from the API ({:.1?})",
                    deleting.elapsed()
                ),
                Err(e) => println!("    {e}"),
            }
        }
        Err(e) => println!("    {e}"),
    }
    run.controllers.cancel();
    let (status, took) = run.keelson.stop(Duration::from_secs(45));
    println!("    keelson stopped ({status}, {took:.1?})");
    let dir = run.dir.path().to_path_buf();
    let Running {
        ctrd,
        api,
        dir: tmp,
        ..
    } = run;
    let netns = ctrd.netns().name().to_string();
    let cleaned = tokio::task::spawn_blocking(move || drop(ctrd)).await;
    match cleaned {
        Ok(()) => println!(
            "    containerd stopped; its pods, mounts, cgroups and namespace {netns} removed"
        ),
        Err(e) => println!("    containerd cleanup failed: {e}"),
    }
    api.stop();
    drop(api);
    drop(tmp);
    println!("    test API server stopped; {} removed", dir.display());
}
