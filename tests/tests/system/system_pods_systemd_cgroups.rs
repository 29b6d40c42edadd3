//! System test of the `systemd` cgroup driver against a real systemd
//! (Debian 12's v252, PID 1 of private namespaces with its own bus; see
//! `keelson_tests::private_systemd`), a real containerd with
//! `SystemdCgroup = true` inside the same namespaces, and the real
//! `keelson` binary with `cgroupDriver: systemd`, as on a kubeadm node:
//!
//! - keelson's QoS slices (`kubepods.slice`, `kubepods-burstable.slice`,
//!   `kubepods-besteffort.slice`) are systemd units, up;
//! - a Burstable pod's slice `kubepods-burstable-pod<uid>.slice` is up,
//!   with the pod's limits in its real cgroup files (memory limit, CPU
//!   shares from the requests, CFS quota from the limits);
//! - a Guaranteed pod's slice `kubepods-pod<uid>.slice` sits right under
//!   `kubepods.slice`, with its limits;
//! - runc put the container into `cri-containerd-<id>.scope` under the
//!   pod's slice, a systemd unit with the process in its cgroup;
//! - deleting the pod stops the scope and the slice and removes their
//!   cgroups.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use keelson_tests::containerd::{Containerd, ContainerdOptions};
use keelson_tests::images::BUSYBOX_IMAGE;
use keelson_tests::node_harness::{BinaryNode, BinaryNodeOptions};
use keelson_tests::private_systemd::{self, PrivateSystemd};
use keelson_tests::support::{require_root, skip, wait_for};
use keelson_tests::testapi::{TestApiOptions, TestApiServer};
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use serde_json::json;

const T: Duration = Duration::from_secs(90);
const POLL: Duration = Duration::from_millis(200);

fn read(path: &std::path::Path) -> Result<String, String> {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_string())
        .map_err(|e| format!("{}: {e}", path.display()))
}

fn active(systemd: &PrivateSystemd, unit: &str) -> Result<(), String> {
    let p = systemd.unit_properties(unit, &["ActiveState", "LoadState"])?;
    match p.get("ActiveState").map(String::as_str) {
        Some("active") => Ok(()),
        other => Err(format!("{unit}: ActiveState {other:?}, {p:?}")),
    }
}

/// The pod-level limits in the real cgroup files of `rel` (v1 or v2).
fn assert_limits(systemd: &PrivateSystemd, rel: &str, memory: u64, shares: u64, quota_us: u64) {
    let mem = systemd.host_cgroup_dir("memory", rel);
    let cpu = systemd.host_cgroup_dir("cpu", rel);
    if mem.join("memory.limit_in_bytes").exists() {
        assert_eq!(
            read(&mem.join("memory.limit_in_bytes")),
            Ok(memory.to_string())
        );
        assert_eq!(read(&cpu.join("cpu.shares")), Ok(shares.to_string()));
        assert_eq!(
            read(&cpu.join("cpu.cfs_quota_us")),
            Ok(quota_us.to_string())
        );
    } else {
        assert_eq!(read(&mem.join("memory.max")), Ok(memory.to_string()));
        assert_eq!(read(&cpu.join("cpu.max")), Ok(format!("{quota_us} 100000")));
    }
}

fn pod(name: &str, node: &str, requests: serde_json::Value, limits: serde_json::Value) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "nodeName": node,
            "terminationGracePeriodSeconds": 2,
            "containers": [{
                "name": "main",
                "image": BUSYBOX_IMAGE,
                "imagePullPolicy": "Never",
                "command": ["sleep", "3600"],
                "resources": {"requests": requests, "limits": limits},
            }],
        },
    }))
    .expect("pod")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_systemd_holds_the_pod_slices_and_the_container_scopes() {
    const TEST: &str = "a_real_systemd_holds_the_pod_slices_and_the_container_scopes";
    if !require_root(TEST) {
        return;
    }
    if let Some(why) = private_systemd::unavailable() {
        skip(TEST, &why);
        return;
    }
    // Declared first, dropped last: everything else runs inside it.
    let systemd = PrivateSystemd::start().await.expect("private systemd");
    let ctrd = Containerd::start_with(ContainerdOptions {
        systemd: Some(systemd.entry()),
        ..ContainerdOptions::default()
    })
    .await
    .expect("containerd with SystemdCgroup = true");
    let api = TestApiServer::start(TestApiOptions::default())
        .await
        .expect("test API server");
    let admin = api.client().await;
    let mut node = BinaryNode::start(
        &ctrd,
        &api,
        BinaryNodeOptions {
            systemd: Some(systemd.entry()),
            ..BinaryNodeOptions::default()
        },
    )
    .expect("keelson started");
    if let Err(e) = node.wait_healthy(&ctrd, T).await {
        panic!("{e}");
    }

    // The QoS slices are systemd units.
    for unit in [
        "kubepods.slice",
        "kubepods-burstable.slice",
        "kubepods-besteffort.slice",
    ] {
        if let Err(e) = wait_for(unit, T, POLL, || async { active(&systemd, unit) }).await {
            panic!("{e}\n--- keelson log ---\n{}", node.log_tail(40));
        }
    }

    let pods = Api::<Pod>::namespaced(admin.clone(), "default");
    let burstable = pod(
        "sliced",
        &node.node_name,
        json!({"cpu": "100m", "memory": "32Mi"}),
        json!({"cpu": "500m", "memory": "64Mi"}),
    );
    let guaranteed = pod(
        "guaranteed",
        &node.node_name,
        json!({"cpu": "200m", "memory": "48Mi"}),
        json!({"cpu": "200m", "memory": "48Mi"}),
    );
    let guaranteed_uid = pods
        .create(&PostParams::default(), &guaranteed)
        .await
        .expect("create")
        .metadata
        .uid
        .expect("uid");
    let created = pods
        .create(&PostParams::default(), &burstable)
        .await
        .expect("create");
    let uid = created.metadata.uid.clone().expect("uid");
    let running = wait_for("the pod Running", T, POLL, || async {
        let p = pods.get("sliced").await.map_err(|e| e.to_string())?;
        let s = p.status.clone().unwrap_or_default();
        match s.phase.as_deref() {
            Some("Running") => Ok(p),
            other => Err(format!("phase {other:?}: {:?}", s.container_statuses)),
        }
    })
    .await;
    let running = match running {
        Ok(p) => p,
        Err(e) => panic!("{e}\n--- keelson log ---\n{}", node.log_tail(60)),
    };
    let container_id = running
        .status
        .and_then(|s| s.container_statuses)
        .and_then(|c| c.into_iter().next())
        .and_then(|c| c.container_id)
        .expect("containerID");
    let container_id = container_id
        .strip_prefix("containerd://")
        .expect("containerd:// id")
        .to_string();

    // The pod's slice: a systemd unit, with the pod's limits in its cgroup.
    let slice = format!("kubepods-burstable-pod{}.slice", uid.replace('-', "_"));
    let rel = format!("kubepods.slice/kubepods-burstable.slice/{slice}");
    active(&systemd, &slice).expect("pod slice up");
    let cg = systemd
        .unit_properties(&slice, &["ControlGroup"])
        .expect("show");
    assert_eq!(
        cg.get("ControlGroup").map(String::as_str),
        Some(format!("/{rel}").as_str())
    );
    // requests.cpu 100m → 102 shares; limits.cpu 500m → 50 ms per 100 ms.
    assert_limits(&systemd, &rel, 64 << 20, 102, 50_000);
    let memory = systemd.host_cgroup_dir("memory", &rel);
    let cpu = systemd.host_cgroup_dir("cpu", &rel);

    // A Guaranteed pod's slice sits right under kubepods.slice.
    let g_slice = format!("kubepods-pod{}.slice", guaranteed_uid.replace('-', "_"));
    let g_rel = format!("kubepods.slice/{g_slice}");
    if let Err(e) = wait_for("the Guaranteed pod's slice", T, POLL, || async {
        active(&systemd, &g_slice)
    })
    .await
    {
        panic!("{e}\n--- keelson log ---\n{}", node.log_tail(60));
    }
    assert_limits(&systemd, &g_rel, 48 << 20, 204, 20_000);

    // runc's scope for the container, under the pod's slice, with the
    // container's process in it.
    let scope = format!("cri-containerd-{container_id}.scope");
    active(&systemd, &scope).expect("container scope up");
    let scope_dir = systemd.host_cgroup_dir("memory", &format!("{rel}/{scope}"));
    let procs = read(&scope_dir.join("cgroup.procs")).expect("scope procs");
    assert!(!procs.is_empty(), "no process in {}", scope_dir.display());
    if scope_dir.join("memory.limit_in_bytes").exists() {
        assert_eq!(
            read(&scope_dir.join("memory.limit_in_bytes")),
            Ok((64u64 << 20).to_string())
        );
    }

    // Deleting the pod stops the scope and the slice; their cgroups go.
    pods.delete("sliced", &DeleteParams::default())
        .await
        .expect("delete");
    let gone = wait_for("the pod, its slice and scope gone", T, POLL, || async {
        if pods
            .get_opt("sliced")
            .await
            .map_err(|e| e.to_string())?
            .is_some()
        {
            return Err("the pod is still in the API".into());
        }
        for unit in [&slice, &scope] {
            let p = systemd.unit_properties(unit, &["ActiveState"])?;
            match p.get("ActiveState").map(String::as_str) {
                Some("inactive") | None => {}
                other => return Err(format!("{unit} still {other:?}")),
            }
        }
        if memory.exists() || cpu.exists() {
            return Err(format!("{} still there", memory.display()));
        }
        Ok(())
    })
    .await;
    if let Err(e) = gone {
        panic!("{e}\n--- keelson log ---\n{}", node.log_tail(60));
    }
    // The QoS slices stay.
    active(&systemd, "kubepods-burstable.slice").expect("burstable slice stays");
    drop(node);
    drop(ctrd);
    drop(systemd);
}
