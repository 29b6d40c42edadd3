//! Component tests of node registration and Node status: the node role
//! in-process against the test API server and the fake CRI runtime.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Event, Node, NodeCondition, NodeSpec, NodeStatus, Taint};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use keelson_cri::fake::{FakeConfig, FakeImage};
use keelson_tests::node_harness::{InProcessNode, NodeHarnessOptions, condition};
use kube::Api;
use kube::api::ListParams;

fn q(n: &Node, list: &str, res: &str) -> Option<String> {
    let s = n.status.as_ref()?;
    let m = match list {
        "capacity" => s.capacity.as_ref()?,
        _ => s.allocatable.as_ref()?,
    };
    m.get(res).map(|q| q.0.clone())
}

fn ready(n: &Node) -> Result<(), String> {
    match condition(n, "Ready") {
        Some(c) if c.status == "True" => Ok(()),
        Some(c) => Err(format!("Ready={} {:?}", c.status, c.message)),
        None => Err("no Ready condition".into()),
    }
}

fn host_cpus() -> u64 {
    let text = std::fs::read_to_string("/sys/devices/system/cpu/online").expect("cpu list");
    keelson::node::status::host::count_cpu_list(&text).expect("cpus")
}

fn host_mem_kib() -> u64 {
    let text = std::fs::read_to_string("/proc/meminfo").expect("meminfo");
    keelson::node::status::host::meminfo_field(&text, "MemTotal").expect("MemTotal") / 1024
}

fn kib_text(kib: u64) -> String {
    keelson::node::status::format::canonical(
        keelson::quantity::Quantity::from_units((kib * 1024) as i64),
        keelson::node::status::format::Format::BinarySi,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_appears_with_the_right_fields() {
    let fake = FakeConfig {
        runtime_version: "v1.7.13".into(),
        ..FakeConfig::default()
    };
    let node = InProcessNode::start(NodeHarnessOptions {
        fake,
        configure: Some(Arc::new(|c| {
            c.node.max_pods = 57;
            c.node.node_status_max_images = 2;
            c.node.system_reserved.insert("cpu".into(), "500m".into());
            // A nodefs threshold the host's disk cannot reach (DiskPressure
            // would fail the test), still subtracted from allocatable.
            c.node.eviction_hard = [
                ("memory.available".to_string(), "100Mi".to_string()),
                ("nodefs.available".to_string(), "1%".to_string()),
            ]
            .into_iter()
            .collect();
        })),
        ..NodeHarnessOptions::default()
    })
    .await
    .expect("node");
    for (i, size) in [(1, 300u64), (2, 100), (3, 200)] {
        node.fake.add_image_with(FakeImage {
            id: format!("sha256:{i:064}"),
            repo_tags: vec![format!("keelson.local/img{i}:1")],
            repo_digests: vec![format!("keelson.local/img{i}@sha256:{i:064}")],
            size,
            pinned: false,
            uid: None,
            username: String::new(),
        });
    }
    let n = node
        .wait_node("node Ready", Duration::from_secs(20), |n| {
            ready(n).map(|_| n.clone())
        })
        .await
        .expect("node becomes Ready");

    // Labels and annotations of a fresh registration.
    let labels = n.metadata.labels.clone().unwrap_or_default();
    assert_eq!(labels["kubernetes.io/hostname"], node.node_name);
    assert_eq!(labels["kubernetes.io/os"], "linux");
    assert_eq!(labels["beta.kubernetes.io/os"], "linux");
    assert_eq!(labels["kubernetes.io/arch"], keelson::version::go_arch());
    assert_eq!(
        labels["beta.kubernetes.io/arch"],
        keelson::version::go_arch()
    );
    assert_eq!(
        n.metadata.annotations.clone().unwrap_or_default()["volumes.kubernetes.io/controller-managed-attach-detach"],
        "true"
    );

    // Capacity from the machine, allocatable after reservations.
    assert_eq!(q(&n, "capacity", "cpu"), Some(host_cpus().to_string()));
    assert_eq!(q(&n, "capacity", "memory"), Some(kib_text(host_mem_kib())));
    assert_eq!(q(&n, "capacity", "pods").as_deref(), Some("57"));
    let root = node.config.node.root_dir.clone();
    let fs = nix::sys::statvfs::statvfs(&root).expect("statvfs");
    let fs_bytes = fs.fragment_size() as u64 * fs.blocks() as u64;
    let eph = keelson::node::status::format::canonical(
        keelson::quantity::Quantity::from_units(fs_bytes as i64),
        keelson::node::status::format::Format::BinarySi,
    );
    assert_eq!(q(&n, "capacity", "ephemeral-storage"), Some(eph));
    assert_eq!(
        q(&n, "allocatable", "cpu"),
        Some(format!("{}m", host_cpus() * 1000 - 500))
    );
    assert_eq!(
        q(&n, "allocatable", "memory"),
        Some(kib_text(host_mem_kib() - 100 * 1024))
    );
    let eph_alloc = fs_bytes - (fs_bytes as f64 * f64::from(0.01f32)) as u64;
    let eph_alloc = keelson::node::status::format::canonical(
        keelson::quantity::Quantity::from_units(eph_alloc as i64),
        keelson::node::status::format::Format::BinarySi,
    );
    assert_eq!(q(&n, "allocatable", "ephemeral-storage"), Some(eph_alloc));
    for hp in std::fs::read_dir("/sys/kernel/mm/hugepages")
        .expect("hugepages")
        .flatten()
    {
        let kib: u64 = hp
            .file_name()
            .to_string_lossy()
            .trim_start_matches("hugepages-")
            .trim_end_matches("kB")
            .parse()
            .expect("size");
        let name = keelson::node::status::capacity::hugepage_resource_name(kib);
        assert!(q(&n, "capacity", &name).is_some(), "{name} missing");
    }

    let s = n.status.clone().expect("status");
    // Addresses.
    let addrs = s.addresses.clone().unwrap_or_default();
    assert_eq!(addrs.len(), 2, "{addrs:?}");
    assert_eq!(addrs[0].type_, "InternalIP");
    assert_eq!(
        Some(addrs[0].address.parse().expect("ip")),
        node.config.node.node_ip
    );
    assert_eq!(addrs[1].type_, "Hostname");
    assert_eq!(addrs[1].address, node.node_name);
    // Daemon endpoints: the node API's port (`node.port`).
    assert_eq!(
        s.daemon_endpoints
            .and_then(|d| d.kubelet_endpoint)
            .map(|e| e.port),
        Some(node.config.node.port)
    );
    // nodeInfo.
    let info = s.node_info.clone().expect("nodeInfo");
    assert_eq!(info.container_runtime_version, "containerd://1.7.13");
    assert_eq!(info.kubelet_version, keelson::version::KUBERNETES_VERSION);
    assert_eq!(info.operating_system, "linux");
    assert_eq!(info.architecture, keelson::version::go_arch());
    assert_eq!(
        info.boot_id,
        std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
            .expect("boot id")
            .trim()
    );
    assert_eq!(
        info.kernel_version,
        std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .expect("release")
            .trim()
    );
    assert!(!info.os_image.is_empty());
    // Images: the two largest, largest first, digests before tags.
    let images = s.images.clone().unwrap_or_default();
    let sizes: Vec<i64> = images.iter().filter_map(|i| i.size_bytes).collect();
    assert_eq!(sizes, [300, 200], "{images:?}");
    assert_eq!(
        images[0].names.clone().unwrap_or_default()[0],
        format!("keelson.local/img1@sha256:{:064}", 1)
    );
    // Conditions in kubelet's order, with kubelet's reasons.
    let conds: Vec<(String, String, String)> = s
        .conditions
        .clone()
        .unwrap_or_default()
        .into_iter()
        .map(|c| (c.type_, c.status, c.reason.unwrap_or_default()))
        .collect();
    let want = [
        ("MemoryPressure", "False", "KubeletHasSufficientMemory"),
        ("DiskPressure", "False", "KubeletHasNoDiskPressure"),
        ("PIDPressure", "False", "KubeletHasSufficientPID"),
        ("Ready", "True", "KubeletReady"),
    ];
    assert_eq!(
        conds,
        want.map(|(a, b, c)| (a.to_string(), b.to_string(), c.to_string()))
    );
    let r = condition(&n, "Ready").expect("ready");
    assert_eq!(
        r.message.as_deref(),
        Some("kubelet is posting ready status")
    );
    assert!(r.last_heartbeat_time.is_some() && r.last_transition_time.is_some());

    // kubelet's events about the node.
    let events = Api::<Event>::namespaced(node.admin.clone(), "default");
    keelson_tests::support::wait_for(
        "node events",
        Duration::from_secs(10),
        Duration::from_millis(100),
        || async {
            let list = events
                .list(&ListParams::default())
                .await
                .map_err(|e| e.to_string())?;
            let reasons: Vec<String> = list
                .items
                .iter()
                .filter(|e| e.involved_object.name.as_deref() == Some(node.node_name.as_str()))
                .filter_map(|e| e.reason.clone())
                .collect();
            // The events are posted one by one: wait for all of them.
            let want = [
                "Starting",
                "NodeHasSufficientMemory",
                "NodeHasNoDiskPressure",
            ];
            if want.iter().all(|w| reasons.iter().any(|r| r == w)) {
                Ok(reasons)
            } else {
                Err(format!("{reasons:?}"))
            }
        },
    )
    .await
    .expect("events");
    let msg = events
        .list(&ListParams::default())
        .await
        .expect("events")
        .items
        .into_iter()
        .find(|e| e.reason.as_deref() == Some("NodeHasSufficientMemory"))
        .and_then(|e| e.message)
        .expect("message");
    assert_eq!(
        msg,
        format!(
            "Node {} status is now: NodeHasSufficientMemory",
            node.node_name
        )
    );

    // The node reports its own name as kubelet does, and counts status writes.
    let metrics = keelson_tests::support::wait_for(
        "a counted status write",
        Duration::from_secs(10),
        Duration::from_millis(100),
        || async {
            let m = node.metrics_text();
            if m.contains("keelson_node_status_updates_total{result=\"written\"}") {
                Ok(m)
            } else {
                Err("no written status update counted yet".to_string())
            }
        },
    )
    .await
    .expect("metrics");
    assert!(
        metrics.contains(&format!(
            "kubelet_node_name{{node=\"{}\"}} 1",
            node.node_name
        )),
        "{metrics}"
    );
    assert!(metrics.contains("kubelet_node_startup_registration_duration_seconds"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registration_sets_configured_labels_and_taints() {
    let node = InProcessNode::start(NodeHarnessOptions {
        configure: Some(Arc::new(|c| {
            c.node
                .node_labels
                .insert("node.kubernetes.io/worker".into(), String::new());
            c.node.register_with_taints = vec![Taint {
                key: "dedicated".into(),
                value: Some("gpu".into()),
                effect: "NoSchedule".into(),
                time_added: None,
            }];
            c.node.provider_id = "keelson://test".into();
        })),
        ..NodeHarnessOptions::default()
    })
    .await
    .expect("node");
    let n = node
        .wait_node(
            "node registered",
            Duration::from_secs(20),
            |n| Ok(n.clone()),
        )
        .await
        .expect("node");
    let labels = n.metadata.labels.clone().unwrap_or_default();
    assert_eq!(
        labels.get("node.kubernetes.io/worker").map(String::as_str),
        Some("")
    );
    let spec = n.spec.clone().unwrap_or_default();
    let taints = spec.taints.unwrap_or_default();
    assert_eq!(taints.len(), 1);
    assert_eq!(taints[0].key, "dedicated");
    assert_eq!(spec.provider_id.as_deref(), Some("keelson://test"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adopts_an_existing_node_without_touching_what_others_own() {
    let opts = NodeHarnessOptions {
        configure: Some(Arc::new(|c| {
            c.node.node_status_update_frequency = keelson::config::KubeDuration::from_secs(1);
            // Taints and labels apply only to a node keelson creates.
            c.node.register_with_taints = vec![Taint {
                key: "should-not-appear".into(),
                value: None,
                effect: "NoSchedule".into(),
                time_added: None,
            }];
            c.node
                .node_labels
                .insert("only-at-creation".into(), "x".into());
        })),
        ..NodeHarnessOptions::default()
    };
    let existing = Node {
        metadata: ObjectMeta {
            name: Some(opts.node_name.clone()),
            labels: Some(BTreeMap::from([
                ("kubernetes.io/hostname".to_string(), "stale".to_string()),
                ("team".to_string(), "blue".to_string()),
                (
                    "node.kubernetes.io/exclude-from-external-load-balancers".to_string(),
                    "true".to_string(),
                ),
            ])),
            ..ObjectMeta::default()
        },
        spec: Some(NodeSpec {
            pod_cidr: Some("10.200.3.0/24".into()),
            pod_cidrs: Some(vec!["10.200.3.0/24".into()]),
            taints: Some(vec![Taint {
                key: "admin".into(),
                value: Some("x".into()),
                effect: "PreferNoSchedule".into(),
                time_added: None,
            }]),
            ..NodeSpec::default()
        }),
        status: Some(NodeStatus {
            capacity: Some(BTreeMap::from([(
                "example.com/dongle".to_string(),
                Quantity("4".into()),
            )])),
            conditions: Some(vec![NodeCondition {
                type_: "NetworkUnavailable".into(),
                status: "False".into(),
                reason: Some("RouteCreated".into()),
                message: Some("routes set up by the network controller".into()),
                ..NodeCondition::default()
            }]),
            ..NodeStatus::default()
        }),
    };
    let node = InProcessNode::start(NodeHarnessOptions {
        existing_nodes: vec![existing],
        ..opts
    })
    .await
    .expect("node");
    let uid = node
        .node()
        .await
        .expect("read")
        .and_then(|n| n.metadata.uid)
        .expect("pre-created node has a uid");
    let n = node
        .wait_node("node Ready", Duration::from_secs(20), |n| {
            ready(n)?;
            Ok(n.clone())
        })
        .await
        .expect("adopted node becomes Ready");
    assert_eq!(
        n.metadata.uid,
        Some(uid),
        "the Node was adopted, not recreated"
    );
    let labels = n.metadata.labels.clone().unwrap_or_default();
    assert_eq!(labels["kubernetes.io/hostname"], node.node_name);
    assert_eq!(labels["kubernetes.io/os"], "linux");
    assert_eq!(labels["team"], "blue");
    assert_eq!(
        labels["node.kubernetes.io/exclude-from-external-load-balancers"],
        "true"
    );
    assert!(!labels.contains_key("only-at-creation"));
    let spec = n.spec.clone().unwrap_or_default();
    assert_eq!(spec.pod_cidr.as_deref(), Some("10.200.3.0/24"));
    let taints = spec.taints.unwrap_or_default();
    assert_eq!(taints.len(), 1, "{taints:?}");
    assert_eq!(taints[0].key, "admin");
    let status = n.status.clone().unwrap_or_default();
    assert_eq!(
        status.capacity.clone().unwrap_or_default()["example.com/dongle"].0,
        "4"
    );
    assert_eq!(
        status.allocatable.clone().unwrap_or_default()["example.com/dongle"].0,
        "4"
    );
    let nu = condition(&n, "NetworkUnavailable").expect("kept");
    assert_eq!(nu.reason.as_deref(), Some("RouteCreated"));
    assert!(condition(&n, "MemoryPressure").is_some());
    // spec.podCIDRs goes to the runtime.
    keelson_tests::support::wait_for(
        "pod CIDR handed to the runtime",
        Duration::from_secs(10),
        Duration::from_millis(100),
        || async {
            let c = node.fake.pod_cidr();
            if c == "10.200.3.0/24" { Ok(()) } else { Err(c) }
        },
    )
    .await
    .expect("UpdateRuntimeConfig");
}
