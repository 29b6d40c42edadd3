//! The proxy role end to end: the real `keelson run --proxy-only` binary in
//! the lab's "node" namespace, talking to the test API server (served inside
//! that namespace), programs Services created through the API; traffic from
//! the client namespace follows Service and EndpointSlice changes.

use std::net::SocketAddr;
use std::process::{Child, Stdio};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, NodeAddress, NodeStatus, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use keelson_netplane::fixtures::{EndpointSpec, ServiceBuilder, SliceBuilder};
use keelson_netplane::model::Protocol;
use keelson_tests::node_harness::keelson_bin;
use keelson_tests::proxy_cases::{
    CLUSTER_CIDR, Lab, NODE_IP, NODE_NAME, NoReply, OTHER_NODE, Origin, TCP_PORT, pod_ip, pod_name,
};
use keelson_tests::support::{require_root, wait_for};
use keelson_tests::testapi::{TestApiOptions, TestApiServer};
use kube::Api;
use kube::api::{DeleteParams, PostParams};

/// Kills the keelson process (by PID) when the test ends, also on failure.
struct Process(Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn slice(pods: &[usize]) -> EndpointSlice {
    let mut s = SliceBuilder::new("default", "web", "web-abc", "IPv4").port(
        "http",
        Protocol::Tcp,
        TCP_PORT,
    );
    for p in pods {
        s = s.endpoint(EndpointSpec::ready(&pod_ip(*p).to_string()).node(OTHER_NODE));
    }
    s.build()
}

async fn pods_over(lab: &Lab, addr: SocketAddr, n: usize) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    for _ in 0..n {
        let r = lab
            .tcp(Origin::Client, addr, Duration::from_secs(2))
            .await
            .map_err(|e| format!("{e:?}"))?;
        out.push(r.pod);
    }
    out.sort();
    out.dedup();
    Ok(out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_role_programs_services_from_the_api() {
    if !require_root("proxy_role_programs_services_from_the_api") {
        return;
    }
    let lab = Lab::new(2).await.expect("lab");
    let api = TestApiServer::start(TestApiOptions {
        service_cidr: "10.96.0.0/16".into(),
        ..TestApiOptions::default()
    })
    .await
    .expect("test API server");
    // The API is also served inside the node namespace, where keelson runs.
    let listener = lab
        .node
        .tcp_listener("127.0.0.1:6443".parse().expect("addr"))
        .expect("listener in node netns");
    api.serve_listener(listener);
    let dir = tempfile::tempdir().expect("tempdir");
    let kubeconfig = dir.path().join("kubeconfig");
    api.write_kubeconfig_with_server(&kubeconfig, "http://127.0.0.1:6443", None)
        .expect("kubeconfig");
    let config = dir.path().join("keelson.yaml");
    std::fs::write(
        &config,
        format!(
            "apiVersion: keelson.dev/v1alpha1\nkind: KeelsonConfiguration\nnodeName: {NODE_NAME}\n\
             healthzBindAddress: 127.0.0.1:10248\nmetricsBindAddress: 127.0.0.1:10249\n\
             proxy:\n  clusterCIDR: {CLUSTER_CIDR}\n  minSyncPeriod: 0s\n  healthzBindAddress: 0.0.0.0:10256\n\
             \x20 ebpf:\n    bpffsPath: {}\n",
            dir.path().join("bpf").display()
        ),
    )
    .expect("config");

    let client = api.client().await;
    let nodes: Api<Node> = Api::all(client.clone());
    let node = nodes
        .create(
            &PostParams::default(),
            &Node {
                metadata: ObjectMeta {
                    name: Some(NODE_NAME.into()),
                    ..Default::default()
                },
                ..Default::default()
            },
        )
        .await
        .expect("node");
    let mut with_status = node.clone();
    with_status.status = Some(NodeStatus {
        addresses: Some(vec![NodeAddress {
            type_: "InternalIP".into(),
            address: NODE_IP.into(),
        }]),
        ..Default::default()
    });
    nodes
        .replace_status(NODE_NAME, &PostParams::default(), &with_status)
        .await
        .expect("node status");

    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), "default");
    services
        .create(
            &PostParams::default(),
            &ServiceBuilder::new("default", "web")
                .cluster_ip("10.96.0.40")
                .type_("NodePort")
                .node_port("http", Protocol::Tcp, 80, 30400)
                .build(),
        )
        .await
        .expect("service");
    slices
        .create(&PostParams::default(), &slice(&[0, 1]))
        .await
        .expect("slice");

    let host_established =
        std::fs::read_to_string("/proc/sys/net/netfilter/nf_conntrack_tcp_timeout_established")
            .map(|s| s.trim().to_string())
            .unwrap_or_default();
    let bin = keelson_bin().expect("keelson binary");
    let child = lab
        .node
        .command(&bin.to_string_lossy())
        .args(["run", "--proxy-only", "--config"])
        .arg(&config)
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("keelson runs");
    let mut process = Process(child);

    let nodeport: SocketAddr = format!("{NODE_IP}:30400").parse().expect("addr");
    wait_for(
        "the NodePort to reach both pods",
        Duration::from_secs(60),
        Duration::from_millis(200),
        || {
            let lab = &lab;
            async move {
                let seen = pods_over(lab, nodeport, 12).await?;
                if seen == vec![pod_name(0), pod_name(1)] {
                    Ok(())
                } else {
                    Err(format!("{seen:?}"))
                }
            }
        },
    )
    .await
    .expect("programmed from the API");

    // conntrack.* defaults (kube-proxy's): the TCP timeouts are set in the
    // node's namespace, the host's stay as they were.
    let sysctl = |ns: Option<&keelson_tests::netns::NetNs>, name: &str| {
        let path = format!("/proc/sys/net/netfilter/{name}");
        match ns {
            Some(ns) => ns.exec("cat", &[&path]).expect("read sysctl"),
            None => std::fs::read_to_string(&path).expect("read sysctl"),
        }
        .trim()
        .to_string()
    };
    assert_eq!(
        sysctl(Some(&lab.node), "nf_conntrack_tcp_timeout_established"),
        "86400"
    );
    assert_eq!(
        sysctl(Some(&lab.node), "nf_conntrack_tcp_timeout_close_wait"),
        "3600"
    );
    assert_eq!(
        sysctl(None, "nf_conntrack_tcp_timeout_established"),
        host_established
    );

    // kube-proxy's /healthz on healthzBindAddress.
    let healthz: SocketAddr = format!("{NODE_IP}:10256").parse().expect("addr");
    let (status, body) = lab
        .http_get(Origin::Client, healthz, "/healthz", Duration::from_secs(3))
        .await
        .expect("healthz");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"nodeEligible\": true"), "{body}");
    // Metrics with kube-proxy's names on metricsBindAddress.
    let (status, metrics) = lab
        .http_get(
            Origin::Node,
            "127.0.0.1:10249".parse().expect("addr"),
            "/metrics",
            Duration::from_secs(3),
        )
        .await
        .expect("metrics");
    assert_eq!(status, 200);
    for name in [
        "kubeproxy_sync_proxy_rules_duration_seconds_count",
        "kubeproxy_sync_proxy_rules_last_timestamp_seconds",
        "kubeproxy_sync_proxy_rules_endpoint_changes_total",
    ] {
        assert!(metrics.contains(name), "{name} missing");
    }

    // An endpoint goes: new connections follow.
    let mut one = slice(&[1]);
    let current = slices.get("web-abc").await.expect("slice");
    one.metadata.resource_version = current.metadata.resource_version;
    slices
        .replace("web-abc", &PostParams::default(), &one)
        .await
        .expect("update slice");
    wait_for(
        "only pod-1 behind the NodePort",
        Duration::from_secs(30),
        Duration::from_millis(200),
        || {
            let lab = &lab;
            async move {
                let seen = pods_over(lab, nodeport, 10).await?;
                if seen == vec![pod_name(1)] {
                    Ok(())
                } else {
                    Err(format!("{seen:?}"))
                }
            }
        },
    )
    .await
    .expect("endpoint change programmed");

    // The Service goes: the NodePort is no longer translated (the node's own
    // stack refuses the port).
    services
        .delete("web", &DeleteParams::default())
        .await
        .expect("delete service");
    wait_for(
        "the NodePort to be gone",
        Duration::from_secs(30),
        Duration::from_millis(200),
        || {
            let lab = &lab;
            async move {
                match lab
                    .tcp(Origin::Client, nodeport, Duration::from_secs(1))
                    .await
                {
                    Err(NoReply::Refused) => Ok(()),
                    other => Err(format!("{other:?}")),
                }
            }
        },
    )
    .await
    .expect("service removal programmed");

    // Like kube-proxy, a stopped keelson leaves its table in place (the
    // next start adopts it); `keelson cleanup` removes it.
    let pid = nix::unistd::Pid::from_raw(i32::try_from(process.0.id()).expect("pid"));
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).expect("SIGTERM");
    let status = process.0.wait().expect("keelson exits");
    assert!(status.success(), "keelson exited with {status}");
    let tables = lab.node.exec("nft", &["list", "tables"]).expect("nft");
    assert!(tables.contains("table ip keelson"), "{tables}");
    let cleanup = || {
        let out = lab
            .node
            .command(&bin.to_string_lossy())
            .args(["cleanup", "--config"])
            .arg(&config)
            .output()
            .expect("keelson cleanup runs");
        assert!(
            out.status.success(),
            "keelson cleanup: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    cleanup();
    let tables = lab.node.exec("nft", &["list", "tables"]).expect("nft");
    assert!(!tables.contains("keelson"), "{tables}");
    // Nothing left to remove is not an error.
    cleanup();
}
