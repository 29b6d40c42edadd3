//! The proxy DaemonSet of `packaging/kubernetes/proxy/` running for real
//! (system test): its manifests applied with kubectl, its pod started by
//! keelson's node role (playing the upstream kubelet it sits beside) on a
//! private containerd, from an image with the Containerfile's layout
//! (keelson-proxy at the ENTRYPOINT path, `nft`, and the shared objects
//! both load). The containerized proxy authenticates with the pod's
//! ServiceAccount token through the ConfigMap's kubeconfig, programs the
//! node's nftables table (hostNetwork), answers its liveness probe on
//! `/livez`, makes a ClusterIP work, and asks the API server for nothing its
//! ClusterRole does not grant.
//!
//! What differs from a cluster: the image is assembled by the test (no
//! registry, no musl target here: the Containerfile itself cannot be
//! built), the DaemonSet controller's one action (a pod per node) is done by
//! the test, and so is the EndpointSlice of the test Service.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use k8s_openapi::api::rbac::v1::{ClusterRole, PolicyRule};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use keelson::config::Config;
use keelson_tests::containerd::Containerd;
use keelson_tests::images::oci::{ImageConfig, write_archive};
use keelson_tests::images::rootfs::{Layout, RootFs};
use keelson_tests::support::repo_root as repo;
use keelson_tests::support::{require_root, wait_for};
use keelson_tests::testapi::{StaticToken, TestApiOptions, TestApiServer};
use kube::Api;
use kube::api::{DeleteParams, PostParams};

const NODE: &str = "ds-node";
const NODE_IP: &str = "192.0.2.10";
const ADMIN_TOKEN: &str = "ds-admin";
const NODE_TOKEN: &str = "ds-node";
const ENDPOINT_PLACEHOLDER: &str = "https://CONTROL_PLANE_ENDPOINT:6443";
const PROXY_SA: &str = "system:serviceaccount:kube-system:keelson-proxy";

fn read(rel: &str) -> String {
    std::fs::read_to_string(repo().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

fn keelson_bin() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    exe.ancestors()
        .skip(1)
        .take(3)
        .map(|d| d.join("keelson"))
        .find(|p| p.is_file())
        .expect("keelson built next to the tests (cargo build --workspace)")
}

/// The image the Containerfile describes, assembled from this host's
/// keelson-proxy build and nft: the same paths, entrypoint and command.
fn build_image(dir: &Path, name: &str) -> PathBuf {
    let proxy = keelson_bin().with_file_name("keelson-proxy");
    let mut fs = RootFs::new(Layout::Split).expect("rootfs");
    fs.host_binary("usr/local/bin/keelson-proxy", &proxy)
        .expect("keelson-proxy (cargo build --workspace --bins)");
    fs.host_binary("usr/sbin/nft", Path::new("/usr/sbin/nft"))
        .expect("nft");
    let config = ImageConfig {
        entrypoint: vec!["/usr/local/bin/keelson-proxy".into()],
        cmd: vec!["run".into(), "--config=/etc/keelson/config.yaml".into()],
        working_dir: "/".into(),
        ..Default::default()
    };
    let archive = dir.join("keelson-image.tar");
    write_archive(name, fs.finish().expect("layer"), &config, &archive).expect("archive");
    archive
}

/// keelson's node role (standing in for the kubelet beside the DaemonSet)
/// in the containerd namespace; SIGTERM then SIGKILL on drop.
struct NodeAgent {
    child: Option<Child>,
    log: PathBuf,
}

impl NodeAgent {
    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(60)..].join("\n")
    }

    fn stop(&mut self) -> Option<std::process::ExitStatus> {
        let mut child = self.child.take()?;
        if let Ok(pid) = i32::try_from(child.id()) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGTERM,
            );
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(40);
        loop {
            match child.try_wait() {
                Ok(Some(s)) => return Some(s),
                Ok(None) if std::time::Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(50))
                }
                _ => {
                    let _ = child.kill();
                    return child.wait().ok();
                }
            }
        }
    }
}

impl Drop for NodeAgent {
    fn drop(&mut self) {
        self.stop();
    }
}

fn allows(rules: &[PolicyRule], group: &str, resource: &str, verb: &str) -> bool {
    let has = |l: Option<&Vec<String>>, v: &str| l.is_some_and(|l| l.iter().any(|x| x == v));
    rules.iter().any(|r| {
        has(r.api_groups.as_ref(), group)
            && has(r.resources.as_ref(), resource)
            && r.verbs.iter().any(|x| x == verb)
    })
}

fn group_of(path: &str) -> String {
    path.strip_prefix("/apis/")
        .and_then(|rest| rest.split('/').next())
        .unwrap_or_default()
        .to_string()
}

fn curl(ctrd: &Containerd, url: &str) -> Result<String, String> {
    ctrd.netns()
        .exec("curl", &["-sS", "--max-time", "2", url])
        .map_err(|e| e.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_daemonset_runs_on_a_node_and_serves_cluster_ips() {
    if !require_root("proxy_daemonset_runs_on_a_node_and_serves_cluster_ips") {
        return;
    }
    let timeout = Duration::from_secs(90);
    let api = TestApiServer::start(TestApiOptions {
        tokens: vec![
            StaticToken {
                token: ADMIN_TOKEN.into(),
                user: "kubernetes-admin".into(),
            },
            StaticToken {
                token: NODE_TOKEN.into(),
                user: format!("system:node:{NODE}"),
            },
        ],
        ..TestApiOptions::default()
    })
    .await
    .expect("test API server");
    let admin = api.client().await;
    let ctrd = Containerd::start().await.expect("containerd");
    let work = tempfile::tempdir().expect("tempdir");

    // The image, under the name the DaemonSet uses.
    let ds_doc: DaemonSet =
        serde_yaml::from_str(&read("packaging/kubernetes/proxy/daemonset.yaml"))
            .expect("daemonset.yaml");
    let template = ds_doc
        .spec
        .as_ref()
        .map(|s| s.template.clone())
        .expect("template");
    let image = template
        .spec
        .as_ref()
        .and_then(|s| s.containers.first())
        .and_then(|c| c.image.clone())
        .expect("image");
    let archive = build_image(work.path(), &image);
    ctrd.import_image(&archive)
        .expect("import the keelson image");

    // The API inside the node's namespace, and the node agent.
    let listener = ctrd
        .netns()
        .tcp_listener(SocketAddr::from(([127, 0, 0, 1], 0)))
        .expect("listener in the namespace");
    let api_addr = listener.local_addr().expect("address");
    api.serve_listener(listener);
    let server = format!("http://{api_addr}");
    ctrd.netns()
        .ip(&["addr", "add", &format!("{NODE_IP}/32"), "dev", "lo"])
        .expect("node IP");
    let state = ctrd.dir().join("node-agent");
    std::fs::create_dir_all(&state).expect("mkdir");
    let node_kc = state.join("node.kubeconfig");
    api.write_kubeconfig_with_server(&node_kc, &server, Some(NODE_TOKEN))
        .expect("node kubeconfig");
    let mut cfg = Config {
        node_name: Some(NODE.into()),
        healthz_bind_address: Some("127.0.0.1:10248".into()),
        // 10249 is the proxy's (kube-proxy's) metrics port.
        metrics_bind_address: "127.0.0.1:10255".into(),
        ..Config::default()
    };
    cfg.proxy.enabled = false;
    cfg.node.kubeconfig = Some(node_kc);
    cfg.node.container_runtime_endpoint = ctrd.endpoint();
    cfg.node.root_dir = state.join("root");
    cfg.node.pod_logs_dir = state.join("pod-logs");
    cfg.node.cgroup_root = ctrd.cgroup_parent();
    cfg.node.node_ip = Some(NODE_IP.parse().expect("ip"));
    cfg.node.pod_cidr = ctrd.pod_cidr().to_string();
    keelson_tests::node_harness::ignore_host_disk(&mut cfg);
    cfg.validate().expect("node agent configuration");
    let cfg_path = state.join("config.yaml");
    std::fs::write(&cfg_path, cfg.to_yaml()).expect("write config");
    let log = work.path().join("node-agent.log");
    let out = std::fs::File::create(&log).expect("log");
    let child = ctrd
        .netns()
        .command(&keelson_bin().display().to_string())
        .args(["run", "--config"])
        .arg(&cfg_path)
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(out.try_clone().expect("log"))
        .stderr(out)
        .spawn()
        .expect("start the node agent");
    let mut agent = NodeAgent {
        child: Some(child),
        log: log.clone(),
    };

    // The manifests, as docs/install.md applies them.
    let kubectl = |args: &[&str], stdin: Option<String>| -> String {
        use std::io::Write;
        let mut c = Command::new("kubectl")
            .env("KUBECONFIG", api.kubeconfig_path())
            .arg("--cache-dir")
            .arg(work.path().join("kubectl-cache"))
            .args(args)
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("kubectl");
        if let (Some(text), Some(mut pipe)) = (stdin, c.stdin.take()) {
            pipe.write_all(text.as_bytes()).expect("stdin");
        }
        let o = c.wait_with_output().expect("kubectl output");
        assert!(
            o.status.success(),
            "kubectl {args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    kubectl(
        &[
            "apply",
            "-f",
            &repo()
                .join("packaging/kubernetes/proxy/rbac.yaml")
                .display()
                .to_string(),
        ],
        None,
    );
    let configmap =
        read("packaging/kubernetes/proxy/configmap.yaml").replace(ENDPOINT_PLACEHOLDER, &server);
    kubectl(&["apply", "-f", "-"], Some(configmap));
    kubectl(
        &[
            "apply",
            "-f",
            &repo()
                .join("packaging/kubernetes/proxy/daemonset.yaml")
                .display()
                .to_string(),
        ],
        None,
    );

    // The DaemonSet controller's part: one pod for this node.
    let ds: DaemonSet = Api::namespaced(admin.clone(), "kube-system")
        .get("keelson-proxy")
        .await
        .expect("DaemonSet");
    let mut spec = ds
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.clone())
        .expect("pod spec");
    spec.node_name = Some(NODE.into());
    let pod = Pod {
        metadata: ObjectMeta {
            generate_name: Some("keelson-proxy-".into()),
            namespace: Some("kube-system".into()),
            labels: ds
                .spec
                .as_ref()
                .and_then(|s| s.template.metadata.as_ref())
                .and_then(|m| m.labels.clone()),
            owner_references: Some(vec![OwnerReference {
                api_version: "apps/v1".into(),
                kind: "DaemonSet".into(),
                name: "keelson-proxy".into(),
                uid: ds.metadata.uid.clone().unwrap_or_default(),
                controller: Some(true),
                block_owner_deletion: Some(true),
            }]),
            ..Default::default()
        },
        spec: Some(spec),
        status: None,
    };
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "kube-system");
    let pod = pods
        .create(&PostParams::default(), &pod)
        .await
        .expect("DaemonSet pod");
    let pod_name = pod.metadata.name.clone().expect("name");

    let running = wait_for(
        "the proxy pod Running and Ready",
        timeout,
        Duration::from_millis(250),
        || {
            let pods = pods.clone();
            let name = pod_name.clone();
            async move {
                let p = pods.get(&name).await.map_err(|e| e.to_string())?;
                let st = p.status.unwrap_or_default();
                let ready = st
                    .conditions
                    .iter()
                    .flatten()
                    .any(|c| c.type_ == "Ready" && c.status == "True");
                if st.phase.as_deref() == Some("Running") && ready {
                    Ok(())
                } else {
                    Err(format!("{:?} {:?}", st.phase, st.container_statuses))
                }
            }
        },
    )
    .await;
    if let Err(e) = running {
        panic!("{e}\n--- node agent log ---\n{}", agent.log_tail());
    }

    // A workload behind a Service, its EndpointSlice written as the
    // controller would.
    kubectl(
        &[
            "apply",
            "-f",
            &repo()
                .join("scripts/demo.d/hello.yaml")
                .display()
                .to_string(),
        ],
        None,
    );
    let hello: Api<Pod> = Api::namespaced(admin.clone(), "default");
    let mut bind = serde_json::json!({"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "hello"}, "target": {"kind": "Node", "name": NODE}});
    bind["metadata"]["namespace"] = "default".into();
    hello
        .create_subresource::<_, serde_json::Value>(
            "binding",
            "hello",
            &PostParams::default(),
            &bind,
        )
        .await
        .expect("bind hello");
    let ip = wait_for(
        "pod hello Ready",
        timeout,
        Duration::from_millis(250),
        || {
            let hello = hello.clone();
            async move {
                let p = hello.get("hello").await.map_err(|e| e.to_string())?;
                let st = p.status.unwrap_or_default();
                let ready = st
                    .conditions
                    .iter()
                    .flatten()
                    .any(|c| c.type_ == "Ready" && c.status == "True");
                match st.pod_ip {
                    Some(ip) if ready => Ok(ip),
                    _ => Err(format!("{:?}", st.phase)),
                }
            }
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n--- node agent log ---\n{}", agent.log_tail()));
    let svc: Service = Api::namespaced(admin.clone(), "default")
        .get("hello")
        .await
        .expect("service");
    let mut labels = BTreeMap::new();
    labels.insert(
        "kubernetes.io/service-name".to_string(),
        "hello".to_string(),
    );
    labels.insert(
        "endpointslice.kubernetes.io/managed-by".to_string(),
        "endpointslice-controller.k8s.io".to_string(),
    );
    let slice = EndpointSlice {
        metadata: ObjectMeta {
            name: Some("hello-test".into()),
            namespace: Some("default".into()),
            labels: Some(labels),
            ..Default::default()
        },
        address_type: "IPv4".into(),
        endpoints: Some(vec![Endpoint {
            addresses: vec![ip],
            conditions: Some(EndpointConditions {
                ready: Some(true),
                serving: Some(true),
                terminating: Some(false),
            }),
            node_name: Some(NODE.into()),
            ..Default::default()
        }]),
        ports: Some(vec![EndpointPort {
            name: Some("http".into()),
            port: Some(8080),
            protocol: Some("TCP".into()),
            app_protocol: None,
        }]),
    };
    Api::<EndpointSlice>::namespaced(admin.clone(), "default")
        .create(&PostParams::default(), &slice)
        .await
        .expect("EndpointSlice");
    let cluster_ip = svc.spec.and_then(|s| s.cluster_ip).expect("ClusterIP");
    ctrd.netns()
        .ip(&["route", "replace", "10.96.0.0/12", "dev", "kbr0"])
        .expect("route the Service CIDR");
    let url = format!("http://{cluster_ip}/");
    let body = wait_for(
        "the ClusterIP to answer",
        timeout,
        Duration::from_millis(250),
        || {
            let r = curl(&ctrd, &url);
            async move { r }
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n--- node agent log ---\n{}", agent.log_tail()));
    assert!(body.contains("hello from pod hello"), "{body}");
    let table = ctrd
        .netns()
        .exec("nft", &["list", "table", "ip", "keelson"])
        .expect("keelson's table in the node namespace");
    assert!(table.contains(&cluster_ip), "{table}");

    // Liveness: the probe on /livez succeeds (the pod stays up, no restart).
    let livez = curl(&ctrd, &format!("http://{NODE_IP}:10256/livez")).expect("/livez answers");
    assert!(!livez.is_empty());
    let probed = wait_for(
        "a successful liveness probe of the proxy pod",
        timeout,
        Duration::from_millis(500),
        || {
            let r = ctrd.netns().exec(
                "curl",
                &["-sS", "--max-time", "2", "http://127.0.0.1:10255/metrics"],
            );
            let name = pod_name.clone();
            async move {
                let text = r.map_err(|e| e.to_string())?;
                let ok = text.lines().any(|l| {
                    l.starts_with("prober_probe_total")
                        && l.contains("probe_type=\"Liveness\"")
                        && l.contains("result=\"successful\"")
                        && l.contains(&format!("pod=\"{name}\""))
                });
                if ok {
                    Ok(())
                } else {
                    Err("no successful liveness probe yet".to_string())
                }
            }
        },
    )
    .await;
    if let Err(e) = probed {
        panic!("{e}\n--- node agent log ---\n{}", agent.log_tail());
    }
    let p = pods.get(&pod_name).await.expect("proxy pod");
    let restarts: i32 = p
        .status
        .and_then(|s| s.container_statuses)
        .unwrap_or_default()
        .iter()
        .map(|c| c.restart_count)
        .sum();
    assert_eq!(restarts, 0, "the proxy container was never restarted");

    // Everything the proxy's ServiceAccount asked for, against its ClusterRole.
    let role: ClusterRole = Api::all(admin.clone())
        .get("keelson-proxy")
        .await
        .expect("ClusterRole");
    let rules = role.rules.unwrap_or_default();
    let mut seen = std::collections::BTreeSet::new();
    for r in api
        .knobs()
        .requests()
        .iter()
        .filter(|r| r.user == PROXY_SA && !r.verb.is_empty())
    {
        let group = group_of(&r.path);
        let res = if r.subresource.is_empty() {
            r.resource.clone()
        } else {
            format!("{}/{}", r.resource, r.subresource)
        };
        assert!(
            allows(&rules, &group, &res, &r.verb),
            "{} {} {res} not granted to the proxy",
            r.verb,
            group
        );
        seen.insert(format!("{} {res}", r.verb));
    }
    for needed in [
        "list services",
        "watch services",
        "list endpointslices",
        "watch endpointslices",
    ] {
        assert!(
            seen.contains(needed),
            "proxy did not {needed} as its ServiceAccount: {seen:?}"
        );
    }

    // Orderly end: the pods go through the API, then the node agent stops.
    for (ns, name) in [
        ("default", "hello".to_string()),
        ("kube-system", pod_name.clone()),
    ] {
        let _ = Api::<Pod>::namespaced(admin.clone(), ns)
            .delete(&name, &DeleteParams::default())
            .await;
    }
    let status = agent.stop();
    assert!(
        status.is_some_and(|s| s.success()),
        "node agent exit: {status:?}\n{}",
        agent.log_tail()
    );
    drop(ctrd);
}
