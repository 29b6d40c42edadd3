//! System test of node registration and status with real parts: the real
//! `keelson` binary, inside a private containerd's network namespace,
//! registers a Node that becomes Ready with the machine's real capacity,
//! the runtime's real version and its real images, and renews its Lease.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use keelson::config::KubeDuration;
use keelson_tests::containerd::Containerd;
use keelson_tests::images::{BUSYBOX_IMAGE, PAUSE_IMAGE};
use keelson_tests::node_harness::{BinaryNode, BinaryNodeOptions, SYSTEM_NODE_IP, condition};
use keelson_tests::support::{require_root, wait_for};
use keelson_tests::testapi::{TestApiOptions, TestApiServer};
use kube::Api;

fn mem_total_kib() -> u64 {
    let text = std::fs::read_to_string("/proc/meminfo").expect("meminfo");
    keelson::node::status::host::meminfo_field(&text, "MemTotal").expect("MemTotal") / 1024
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_node_is_ready_with_real_capacity_and_runtime_version() {
    if !require_root("a_real_node_is_ready_with_real_capacity_and_runtime_version") {
        return;
    }
    let ctrd = Containerd::start().await.expect("containerd");
    let api = TestApiServer::start(TestApiOptions::default())
        .await
        .expect("test API server");
    let admin = api.client().await;
    let mut node = BinaryNode::start(
        &ctrd,
        &api,
        BinaryNodeOptions {
            configure: Some(Arc::new(|c| {
                c.node.node_status_update_frequency = KubeDuration::from_secs(1);
            })),
            ..BinaryNodeOptions::default()
        },
    )
    .expect("keelson started");
    let nodes = Api::<Node>::all(admin.clone());
    let name = node.node_name.clone();
    let n = match wait_for(
        "the Node Ready",
        Duration::from_secs(60),
        Duration::from_millis(200),
        || async {
            let n = nodes
                .get_opt(&name)
                .await
                .map_err(|e| e.to_string())?
                .ok_or("no Node yet")?;
            match condition(&n, "Ready") {
                Some(c) if c.status == "True" => Ok(n.clone()),
                Some(c) => Err(format!("Ready={} {:?}", c.status, c.message)),
                None => Err("no Ready condition".to_string()),
            }
        },
    )
    .await
    {
        Ok(n) => n,
        Err(e) => panic!("{e}\n--- keelson log ---\n{}", node.log_tail(60)),
    };

    let status = n.status.clone().expect("status");
    // The runtime's own version, normalised as kubelet prints it.
    let v = ctrd.client().version().await.expect("CRI version");
    let want = format!(
        "{}://{}",
        v.runtime_name,
        keelson::node::status::node_info::normalize_runtime_version(&v.runtime_version)
            .expect("containerd's version parses")
    );
    let info = status.node_info.clone().expect("nodeInfo");
    assert_eq!(info.container_runtime_version, want);
    assert!(want.starts_with("containerd://1."), "{want}");
    assert_eq!(info.kubelet_version, keelson::version::KUBERNETES_VERSION);
    // Real capacity.
    let cap = status.capacity.clone().expect("capacity");
    let cpus = keelson::node::status::host::count_cpu_list(
        &std::fs::read_to_string("/sys/devices/system/cpu/online").expect("cpu list"),
    )
    .expect("cpus");
    assert_eq!(cap["cpu"].0, cpus.to_string());
    assert_eq!(
        keelson::quantity::Quantity::parse(&cap["memory"].0)
            .expect("memory")
            .value(),
        i128::from(mem_total_kib()) * 1024
    );
    assert_eq!(cap["pods"].0, "110");
    let root = &node.config.node.root_dir;
    let fs = nix::sys::statvfs::statvfs(root).expect("statvfs");
    assert_eq!(
        keelson::quantity::Quantity::parse(&cap["ephemeral-storage"].0)
            .expect("ephemeral-storage")
            .value(),
        i128::from(fs.fragment_size() as u64 * fs.blocks() as u64)
    );
    let alloc = status.allocatable.clone().expect("allocatable");
    assert_eq!(
        keelson::quantity::Quantity::parse(&alloc["memory"].0)
            .expect("memory")
            .value(),
        i128::from(mem_total_kib()) * 1024 - 100 * 1024 * 1024
    );
    // Addresses inside the namespace.
    let addrs = status.addresses.clone().unwrap_or_default();
    assert_eq!(addrs[0].type_, "InternalIP");
    assert_eq!(addrs[0].address, SYSTEM_NODE_IP.to_string());
    // The images containerd holds.
    let names: Vec<String> = status
        .images
        .clone()
        .unwrap_or_default()
        .into_iter()
        .flat_map(|i| i.names.unwrap_or_default())
        .collect();
    for want in [PAUSE_IMAGE, BUSYBOX_IMAGE] {
        assert!(
            names
                .iter()
                .any(|n| n.contains(want.trim_start_matches("docker.io/"))),
            "{want} not in {names:?}"
        );
    }
    // Network and runtime ready: the message is kubelet's.
    assert_eq!(
        condition(&n, "Ready")
            .and_then(|c| c.message.clone())
            .as_deref(),
        Some("kubelet is posting ready status")
    );

    // The Lease is renewed.
    let leases = Api::<Lease>::namespaced(admin.clone(), "kube-node-lease");
    let first = wait_for(
        "the Lease",
        Duration::from_secs(20),
        Duration::from_millis(200),
        || async {
            leases
                .get_opt(&name)
                .await
                .map_err(|e| e.to_string())?
                .and_then(|l| l.spec.and_then(|s| s.renew_time))
                .ok_or_else(|| "no Lease yet".to_string())
        },
    )
    .await
    .expect("lease");
    wait_for(
        "a Lease renewal",
        Duration::from_secs(30),
        Duration::from_millis(500),
        || async {
            let t = leases
                .get(&name)
                .await
                .map_err(|e| e.to_string())?
                .spec
                .and_then(|s| s.renew_time)
                .ok_or("no renewTime")?;
            if t.0 > first.0 {
                Ok(())
            } else {
                Err(format!("still {}", t.0))
            }
        },
    )
    .await
    .expect("renewed");

    // Metrics answer inside the namespace.
    let metrics = node.metrics(&ctrd).await.expect("metrics");
    assert!(
        metrics.contains(&format!("kubelet_node_name{{node=\"{name}\"}} 1")),
        "{metrics}"
    );

    // kubelet's /healthz checks, syncloop among them.
    let health = node
        .health(&ctrd, "/healthz?verbose")
        .await
        .expect("healthz");
    assert!(
        health.lines().next().is_some_and(|l| l.contains(" 200 ")),
        "{health}"
    );
    assert!(health.contains("[+]syncloop ok"), "{health}");

    // A clean stop on SIGTERM.
    let status = node.stop(Duration::from_secs(30));
    assert!(
        status.contains("exit status: 0"),
        "{status}\n{}",
        node.log_tail(30)
    );
}
