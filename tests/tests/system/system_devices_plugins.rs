//! System test of device plugins and the pod-resources API through the
//! whole node role: the real `keelson` binary on a real containerd, and
//! Kubernetes' own `sample-device-plugin` (from `KEELSON_UPSTREAM_BIN`)
//! registering through `<root>/device-plugins/kubelet.sock`:
//!
//! - the node advertises `example.com/resource` (capacity and allocatable
//!   2) in its status;
//! - a pod with `limits: {example.com/resource: 1}` runs with its device:
//!   the plugin's mount of `/tmp/Dev-1` is in the container;
//! - the pod-resources API on `<root>/pod-resources/kubelet.sock` (a gRPC
//!   client here) lists the pod's container with that device, `Get`
//!   answers for the pod and `GetAllocatableResources` lists both devices;
//! - a second pod gets the other device; a restart of keelson keeps both
//!   allocations (checkpoint) and the running containers, the plugin
//!   registers again; a third pod is refused with
//!   `UnexpectedAdmissionError`;
//! - a restart of the plugin: allocatable drops to 0 while it is gone
//!   (capacity stays 2: kubelet's grace for a plugin's return) and comes
//!   back; the allocations stay.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node as ApiNode, Pod};
use keelson_cri::kubelet_api::podresources::pod_resources_lister_client::PodResourcesListerClient;
use keelson_cri::kubelet_api::podresources::{
    AllocatableResourcesRequest, GetPodResourcesRequest, ListPodResourcesRequest,
};
use keelson_cri::kubelet_api::unix_channel;
use keelson_cri::{RuntimeClient, api};
use keelson_tests::containerd::Containerd;
use keelson_tests::device_plugin::{RESOURCE, SampleDevicePlugin, binary};
use keelson_tests::images::BUSYBOX_IMAGE;
use keelson_tests::node_harness::{BinaryNode, BinaryNodeOptions};
use keelson_tests::support::{require_root, skip, wait_for};
use keelson_tests::testapi::{TestApiOptions, TestApiServer};
use kube::Api;
use kube::api::PostParams;
use serde_json::json;

const TEST: &str = "device_plugin_pod_gets_its_device_across_restarts";

async fn exec(cri: &RuntimeClient, id: &str, cmd: &str) -> Result<String, String> {
    let r = cri
        .exec_sync(
            id,
            vec!["sh".into(), "-c".into(), cmd.into()],
            Duration::from_secs(10),
        )
        .await
        .map_err(|e| e.to_string())?;
    if r.exit_code != 0 {
        return Err(format!(
            "`{cmd}` exited {}: {}",
            r.exit_code,
            String::from_utf8_lossy(&r.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&r.stdout).into_owned())
}

async fn running_container(cri: &RuntimeClient, uid: &str) -> Result<String, String> {
    let list = cri.list_containers(None).await.map_err(|e| e.to_string())?;
    list.into_iter()
        .find(|c| {
            c.labels.get("io.kubernetes.pod.uid").map(String::as_str) == Some(uid)
                && c.state == api::ContainerState::ContainerRunning as i32
        })
        .map(|c| c.id)
        .ok_or_else(|| "container not running yet".to_string())
}

/// The node's `example.com/resource` (capacity, allocatable).
async fn advertised(nodes: &Api<ApiNode>, name: &str) -> Result<(String, String), String> {
    let n = nodes.get(name).await.map_err(|e| e.to_string())?;
    let st = n.status.unwrap_or_default();
    let get = |m: Option<
        std::collections::BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>,
    >| {
        m.and_then(|m| m.get(RESOURCE).map(|q| q.0.clone()))
            .unwrap_or_default()
    };
    Ok((get(st.capacity), get(st.allocatable)))
}

async fn wait_advertised(
    nodes: &Api<ApiNode>,
    name: &str,
    want: (&str, &str),
    node: &BinaryNode,
    plugin: Option<&SampleDevicePlugin>,
) {
    wait_for(
        &format!(
            "the node advertising {RESOURCE} capacity {} allocatable {}",
            want.0, want.1
        ),
        Duration::from_secs(60),
        Duration::from_millis(300),
        || async {
            let got = advertised(nodes, name).await?;
            if got.0 == want.0 && got.1 == want.1 {
                Ok(())
            } else {
                Err(format!("node shows {got:?}"))
            }
        },
    )
    .await
    .unwrap_or_else(|e| {
        panic!(
            "{e}\nkeelson log:\n{}\nplugin log:\n{}",
            node.log_tail(80),
            plugin.map(|p| p.log()).unwrap_or_default()
        )
    });
}

fn device_pod(name: &str, node: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "nodeName": node,
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "app", "image": BUSYBOX_IMAGE,
                "command": ["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 1; done"],
                "resources": {"limits": {RESOURCE: "1"}, "requests": {RESOURCE: "1"}}}]
        }
    }))
    .unwrap()
}

async fn pod_resources(
    root: &Path,
) -> Result<PodResourcesListerClient<tonic::transport::Channel>, String> {
    let sock = root.join("pod-resources/kubelet.sock");
    let ch = unix_channel(&sock, Duration::from_secs(5))
        .await
        .map_err(|e| format!("dialing {}: {e:?}", sock.display()))?;
    Ok(PodResourcesListerClient::new(ch))
}

/// The devices the pod-resources API lists for `ns/name`'s container `app`.
async fn listed_devices(root: &Path, ns: &str, name: &str) -> Result<BTreeSet<String>, String> {
    let mut c = pod_resources(root).await?;
    let list = c
        .list(ListPodResourcesRequest {})
        .await
        .map_err(|e| e.to_string())?
        .into_inner();
    let pod = list
        .pod_resources
        .into_iter()
        .find(|p| p.namespace == ns && p.name == name)
        .ok_or_else(|| format!("{ns}/{name} not listed"))?;
    let mut out = BTreeSet::new();
    for c in pod.containers.iter().filter(|c| c.name == "app") {
        assert!(c.cpu_ids.is_empty() && c.memory.is_empty() && c.dynamic_resources.is_empty());
        for d in &c.devices {
            assert_eq!(d.resource_name, RESOURCE);
            out.extend(d.device_ids.iter().cloned());
        }
    }
    Ok(out)
}

struct Stack {
    // Dropped in this order: the plugin, keelson, containerd.
    plugin: Option<SampleDevicePlugin>,
    node: Option<BinaryNode>,
    _api: TestApiServer,
    _ctrd: Containerd,
}

impl Drop for Stack {
    fn drop(&mut self) {
        self.plugin.take();
        if let Some(mut n) = self.node.take() {
            n.stop(Duration::from_secs(10));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn device_plugin_pod_gets_its_device_across_restarts() {
    if !require_root(TEST) {
        return;
    }
    let bin = match binary() {
        Ok(b) => b,
        Err(reason) => {
            skip(TEST, &reason);
            return;
        }
    };
    let ctrd = Containerd::start().await.expect("containerd");
    let api = TestApiServer::start(TestApiOptions::default())
        .await
        .expect("api");
    let node = BinaryNode::start(&ctrd, &api, BinaryNodeOptions::default()).expect("keelson");
    let cri = ctrd.client().clone();
    let client = api.client().await;
    let node_name = node.node_name.clone();
    let root: PathBuf = node.config.node.root_dir.clone();
    let plugin_log = node.dir().join("sample-device-plugin.log");
    let mut stack = Stack {
        plugin: None,
        node: Some(node),
        _api: api,
        _ctrd: ctrd,
    };
    let nodes: Api<ApiNode> = Api::all(client.clone());
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    macro_rules! node {
        () => {
            stack.node.as_ref().unwrap()
        };
    }

    // keelson serves the Registration and pod-resources sockets; like
    // kubelet v1.36 it writes no device-plugins/DEPRECATION.
    wait_for(
        "device-plugins/kubelet.sock and pod-resources/kubelet.sock",
        Duration::from_secs(30),
        Duration::from_millis(100),
        || async {
            let ok = !root.join("device-plugins/DEPRECATION").exists()
                && root.join("device-plugins/kubelet.sock").exists()
                && root.join("pod-resources/kubelet.sock").exists();
            if ok {
                Ok(())
            } else {
                Err("not yet".to_string())
            }
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\nkeelson log:\n{}", node!().log_tail(60)));

    stack.plugin = Some(
        SampleDevicePlugin::start(
            &bin,
            &root.join("device-plugins"),
            &root.join("plugins_registry"),
            &plugin_log,
        )
        .expect("plugin"),
    );
    wait_advertised(
        &nodes,
        &node_name,
        ("2", "2"),
        node!(),
        stack.plugin.as_ref(),
    )
    .await;

    // The pod-resources API: both devices allocatable, nothing allocated.
    let alloc = pod_resources(&root)
        .await
        .unwrap_or_else(|e| panic!("{e}\nkeelson log:\n{}", node!().log_tail(80)))
        .get_allocatable_resources(AllocatableResourcesRequest {})
        .await
        .unwrap()
        .into_inner();
    let ids: BTreeSet<String> = alloc
        .devices
        .iter()
        .flat_map(|d| d.device_ids.iter().cloned())
        .collect();
    assert_eq!(
        ids,
        BTreeSet::from(["Dev-1".to_string(), "Dev-2".to_string()])
    );
    assert!(alloc.cpu_ids.is_empty() && alloc.memory.is_empty());

    // A pod asking for one device runs with it.
    let p1 = pods
        .create(&PostParams::default(), &device_pod("gpu-1", &node_name))
        .await
        .unwrap();
    let uid1 = p1.metadata.uid.clone().unwrap();
    let id1 = wait_for(
        "gpu-1 running",
        Duration::from_secs(60),
        Duration::from_millis(200),
        || running_container(&cri, &uid1),
    )
    .await
    .unwrap_or_else(|e| {
        panic!(
            "{e}\nkeelson log:\n{}\nplugin log:\n{}",
            node!().log_tail(80),
            stack.plugin.as_ref().map(|p| p.log()).unwrap_or_default()
        )
    });
    let devs1 = listed_devices(&root, "default", "gpu-1").await.unwrap();
    assert_eq!(devs1.len(), 1, "{devs1:?}");
    let dev1 = devs1.iter().next().cloned().unwrap();
    // The plugin's AllocateResponse mount is in the container.
    let mounts = exec(&cri, &id1, "cat /proc/mounts").await.unwrap();
    assert!(
        mounts.contains(&format!("/tmp/{dev1} ")),
        "no mount of /tmp/{dev1} in:\n{mounts}"
    );
    exec(&cri, &id1, &format!("test -f /tmp/{dev1}"))
        .await
        .unwrap();
    // Get answers for the pod; an unknown pod is an error.
    let mut c = pod_resources(&root).await.unwrap();
    let got = c
        .get(GetPodResourcesRequest {
            pod_name: "gpu-1".into(),
            pod_namespace: "default".into(),
        })
        .await
        .unwrap()
        .into_inner()
        .pod_resources
        .unwrap();
    assert_eq!(got.containers.len(), 1);
    assert_eq!(got.containers[0].devices[0].device_ids, vec![dev1.clone()]);
    let missing = c
        .get(GetPodResourcesRequest {
            pod_name: "nope".into(),
            pod_namespace: "default".into(),
        })
        .await
        .err()
        .map(|s| s.message().to_string());
    assert_eq!(
        missing.as_deref(),
        Some("pod nope in namespace default not found")
    );

    // The other device goes to a second pod.
    let p2 = pods
        .create(&PostParams::default(), &device_pod("gpu-2", &node_name))
        .await
        .unwrap();
    let uid2 = p2.metadata.uid.clone().unwrap();
    let id2 = wait_for(
        "gpu-2 running",
        Duration::from_secs(60),
        Duration::from_millis(200),
        || running_container(&cri, &uid2),
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\nkeelson log:\n{}", node!().log_tail(80)));
    let devs2 = listed_devices(&root, "default", "gpu-2").await.unwrap();
    assert_eq!(devs2.len(), 1);
    assert!(devs2.is_disjoint(&devs1), "{devs1:?} {devs2:?}");

    // keelson restarts: the checkpoint keeps the allocations, the
    // containers keep running (the pods admitted again one by one keep
    // their devices), the plugin registers again when keelson's new
    // kubelet.sock appears.
    let checkpoint =
        std::fs::read_to_string(root.join("device-plugins/kubelet_internal_checkpoint")).unwrap();
    assert!(
        checkpoint.contains(&uid1) && checkpoint.contains(&uid2),
        "{checkpoint}"
    );
    stack
        .node
        .as_mut()
        .unwrap()
        .restart(Duration::from_secs(10))
        .unwrap();
    // The plugin registers again (the Node may still show the status
    // written before the restart: ask keelson itself).
    wait_for(
        "the plugin registered again: both devices allocatable",
        Duration::from_secs(60),
        Duration::from_millis(300),
        || async {
            let mut c = pod_resources(&root).await?;
            let n = c
                .get_allocatable_resources(AllocatableResourcesRequest {})
                .await
                .map_err(|e| e.to_string())?
                .into_inner()
                .devices
                .len();
            if n == 2 {
                Ok(())
            } else {
                Err(format!("{n} devices"))
            }
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\nkeelson log:\n{}", node!().log_tail(80)));
    wait_advertised(
        &nodes,
        &node_name,
        ("2", "2"),
        node!(),
        stack.plugin.as_ref(),
    )
    .await;
    wait_for(
        "gpu-1 and gpu-2 listed with their devices after the restart",
        Duration::from_secs(30),
        Duration::from_millis(300),
        || async {
            let d1 = listed_devices(&root, "default", "gpu-1").await?;
            let d2 = listed_devices(&root, "default", "gpu-2").await?;
            if d1 == devs1 && d2 == devs2 {
                Ok(())
            } else {
                Err(format!("{d1:?} {d2:?}"))
            }
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\nkeelson log:\n{}", node!().log_tail(80)));
    assert_eq!(running_container(&cri, &uid1).await.unwrap(), id1);
    assert_eq!(running_container(&cri, &uid2).await.unwrap(), id2);

    // A third is refused: no device left.
    pods.create(&PostParams::default(), &device_pod("gpu-3", &node_name))
        .await
        .unwrap();
    let status = wait_for(
        "gpu-3 refused",
        Duration::from_secs(30),
        Duration::from_millis(200),
        || async {
            let p = pods.get("gpu-3").await.map_err(|e| e.to_string())?;
            let st = p.status.unwrap_or_default();
            if st.phase.as_deref() == Some("Failed") {
                Ok(st)
            } else {
                Err(format!("phase {:?}", st.phase))
            }
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\nkeelson log:\n{}", node!().log_tail(80)));
    assert_eq!(status.reason.as_deref(), Some("UnexpectedAdmissionError"));
    assert_eq!(
        status.message.as_deref(),
        Some(
            "Pod was rejected: Allocate failed due to requested number of devices unavailable for example.com/resource. Requested: 1, Available: 0, which is unexpected"
        )
    );

    // The plugin restarts: its devices are unhealthy while it is gone
    // (capacity kept for the grace period), then back; allocations stay.
    stack.plugin.take();
    wait_advertised(
        &nodes,
        &node_name,
        ("2", "0"),
        node!(),
        stack.plugin.as_ref(),
    )
    .await;
    stack.plugin = Some(
        SampleDevicePlugin::start(
            &bin,
            &root.join("device-plugins"),
            &root.join("plugins_registry"),
            &plugin_log,
        )
        .expect("plugin"),
    );
    wait_advertised(
        &nodes,
        &node_name,
        ("2", "2"),
        node!(),
        stack.plugin.as_ref(),
    )
    .await;
    assert_eq!(
        listed_devices(&root, "default", "gpu-1").await.unwrap(),
        devs1
    );
    assert_eq!(
        listed_devices(&root, "default", "gpu-2").await.unwrap(),
        devs2
    );
    assert_eq!(running_container(&cri, &uid1).await.unwrap(), id1);
}
