//! The node role checks the container runtime's cgroup driver at start:
//! it follows CRI RuntimeConfig as kubelet does and, with a runtime that
//! has no RuntimeConfig (containerd < 2.0), reads containerd's
//! configuration from a verbose Status and refuses a mismatch, naming both
//! drivers, instead of failing at the first sandbox.
//!
//! With the `systemd` driver the QoS and pod cgroups are transient slices
//! made over D-Bus. systemd here is a double ([`SystemdDouble`]) on a
//! private dbus-daemon the test starts, never the host's systemd: a test
//! systemd that saw the host's /run and /tmp damaged the host once.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use keelson::config::CgroupDriver as Driver;
use keelson::node::NodeOverrides;
use keelson::node::cgroups::systemd::properties::{INFINITY, PropValue};
use keelson_cri::api::CgroupDriver;
use keelson_cri::fake::FakeConfig;
use keelson_tests::node_harness::{InProcessNode, NodeHarnessOptions, condition};
use keelson_tests::support::{skip, wait_for};
use keelson_tests::systemd_double::{SystemdDouble, dbus_daemon};
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use serde_json::json;

const IMAGE: &str = "keelson.local/busybox:1";
const T: Duration = Duration::from_secs(60);
const POLL: Duration = Duration::from_millis(100);

const CONTAINERD_SYSTEMD: &str = r#"{"containerd":{"defaultRuntimeName":"runc","runtimes":{"runc":{"runtimeType":"io.containerd.runc.v2","options":{"SystemdCgroup":true}}}}}"#;

async fn role_result(fake: FakeConfig) -> (InProcessNode, Result<(), String>) {
    let mut node = InProcessNode::start(NodeHarnessOptions {
        fake,
        ..NodeHarnessOptions::default()
    })
    .await
    .expect("node");
    // A role that starts keeps running; one that refuses ends at once.
    let ended = tokio::time::timeout(Duration::from_secs(20), node.wait_stopped()).await;
    let result = match ended {
        Ok(r) => r,
        Err(_) => Ok(()),
    };
    (node, result)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn containerd_without_runtime_config_is_checked_through_its_configuration() {
    let (_node, result) = role_result(FakeConfig {
        cgroup_driver: None,
        status_config: CONTAINERD_SYSTEMD.to_string(),
        ..FakeConfig::default()
    })
    .await;
    let err = result.expect_err("mismatch");
    assert!(
        err.contains("keelson is configured with \"cgroupfs\" (node.cgroupDriver) but the container runtime uses \"systemd\""),
        "{err}"
    );
    assert!(err.contains("set node.cgroupDriver: systemd"), "{err}");
    // The same runtime with SystemdCgroup = false runs.
    let (node, result) = role_result(FakeConfig {
        cgroup_driver: None,
        status_config: CONTAINERD_SYSTEMD.replace("true", "false"),
        ..FakeConfig::default()
    })
    .await;
    assert_eq!(result, Ok(()));
    node.wait_node("the Node registered", Duration::from_secs(30), |_| Ok(()))
        .await
        .expect("registered");
}

/// What a test of the systemd driver runs against.
struct SystemdWorld {
    _dir: tempfile::TempDir,
    /// The fake cgroup v2 tree the double makes the slices' directories in.
    tree: PathBuf,
    double: SystemdDouble,
}

/// A fake cgroup v2 tree and the double of systemd making its slices
/// there; `None` (the test skipped) without dbus-daemon.
async fn systemd_world(test: &str) -> Option<SystemdWorld> {
    if dbus_daemon().is_none() {
        skip(test, "dbus-daemon is not installed (scripts/install-deps)");
        return None;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let tree = dir.path().join("cgroup");
    std::fs::create_dir_all(&tree).expect("tree");
    std::fs::write(tree.join("cgroup.controllers"), "cpuset cpu io memory pids").expect("w");
    let double = SystemdDouble::start(Some(tree.clone()))
        .await
        .expect("systemd double");
    Some(SystemdWorld {
        _dir: dir,
        tree,
        double,
    })
}

async fn start_systemd_node(
    tree: &Path,
    double: &SystemdDouble,
    configured: Driver,
) -> InProcessNode {
    let node = InProcessNode::start(NodeHarnessOptions {
        configure: Some(Arc::new(move |c| {
            c.node.cgroup_driver = configured;
            c.node.pod_pids_limit = 128;
        })),
        fake: FakeConfig {
            cgroup_driver: Some(CgroupDriver::Systemd),
            ..FakeConfig::default()
        },
        overrides: NodeOverrides {
            pods_cgroups: Some(Arc::new(keelson::node::cgroups::v2::V2::new(tree))),
            systemd_bus: Some(double.address().to_string()),
            ..NodeOverrides::default()
        },
        ..NodeHarnessOptions::default()
    })
    .await
    .expect("node");
    node.fake.add_image(IMAGE);
    node
}

fn prop(double: &SystemdDouble, unit: &str, name: &str) -> Option<PropValue> {
    double.property(unit, name)
}

async fn wait_units(double: &SystemdDouble, units: &[&str]) {
    wait_for("the slices", T, POLL, || async {
        let up = double.units();
        match units.iter().find(|u| !up.iter().any(|x| x == *u)) {
            None => Ok(()),
            Some(missing) => Err(format!("{missing} not up; up: {up:?}")),
        }
    })
    .await
    .expect("slices");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn systemd_driver_makes_qos_and_pod_slices_over_dbus() {
    let Some(SystemdWorld { _dir, tree, double }) =
        systemd_world("systemd_driver_makes_qos_and_pod_slices_over_dbus").await
    else {
        return;
    };
    let node = start_systemd_node(&tree, &double, Driver::Systemd).await;

    // The QoS slices, as kubelet's QOSContainerManager makes them.
    wait_units(
        &double,
        &[
            "kubepods.slice",
            "kubepods-burstable.slice",
            "kubepods-besteffort.slice",
        ],
    )
    .await;
    assert_eq!(
        prop(&double, "kubepods.slice", "Wants"),
        Some(PropValue::Strs(vec!["-.slice".into()]))
    );
    assert_eq!(
        prop(&double, "kubepods-burstable.slice", "Wants"),
        Some(PropValue::Strs(vec!["kubepods.slice".into()]))
    );
    for unit in ["kubepods.slice", "kubepods-besteffort.slice"] {
        assert_eq!(
            prop(&double, unit, "DefaultDependencies"),
            Some(PropValue::Bool(false)),
            "{unit}"
        );
        assert_eq!(
            prop(&double, unit, "MemoryAccounting"),
            Some(PropValue::Bool(true)),
            "{unit}"
        );
    }
    // Node allocatable on kubepods (a v2 tree: MemoryMax, CPUWeight).
    assert!(
        matches!(prop(&double, "kubepods.slice", "MemoryMax"), Some(PropValue::U64(m)) if m > 0 && m < INFINITY),
        "{:?}",
        prop(&double, "kubepods.slice", "MemoryMax")
    );
    assert!(matches!(
        prop(&double, "kubepods.slice", "CPUWeight"),
        Some(PropValue::U64(_))
    ));
    // BestEffort: 2 shares, weight 1 (set right after the unit starts:
    // waited for, not read once).
    wait_for("the BestEffort slice's CPUWeight", T, POLL, || async {
        match prop(&double, "kubepods-besteffort.slice", "CPUWeight") {
            Some(PropValue::U64(1)) => Ok(()),
            other => Err(format!("CPUWeight {other:?}")),
        }
    })
    .await
    .expect("BestEffort CPUWeight 1");
    assert!(
        tree.join("kubepods.slice/kubepods-besteffort.slice")
            .is_dir()
    );

    // A Burstable pod: 100m requested, 500m and 64Mi limit.
    let pods: Api<Pod> = Api::namespaced(node.admin.clone(), "default");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "sliced"},
        "spec": {"nodeName": node.node_name, "containers": [{
            "name": "app", "image": IMAGE,
            "resources": {"requests": {"cpu": "100m", "memory": "32Mi"},
                          "limits": {"cpu": "500m", "memory": "64Mi"}}
        }]}
    }))
    .expect("pod");
    let created = pods
        .create(&PostParams::default(), &pod)
        .await
        .expect("create");
    let uid = created.metadata.uid.clone().expect("uid");
    let unit = format!("kubepods-burstable-pod{}.slice", uid.replace('-', "_"));
    let parent = format!("/kubepods.slice/kubepods-burstable.slice/{unit}");
    let sandbox_parent = wait_for("the sandbox", T, POLL, || async {
        node.fake
            .sandbox_configs()
            .into_iter()
            .map(|(config, _handler)| config)
            .find(|c| c.metadata.as_ref().is_some_and(|m| m.uid == uid))
            .and_then(|c| c.linux)
            .map(|l| l.cgroup_parent)
            .ok_or_else(|| "no sandbox".to_string())
    })
    .await
    .expect("sandbox");
    // The runtime gets the systemd form of the pod's cgroup.
    assert_eq!(sandbox_parent, parent);
    assert!(double.units().contains(&unit), "{:?}", double.units());
    assert_eq!(
        prop(&double, &unit, "Wants"),
        Some(PropValue::Strs(vec!["kubepods-burstable.slice".into()]))
    );
    assert_eq!(
        prop(&double, &unit, "MemoryMax"),
        Some(PropValue::U64(64 << 20))
    );
    // 100m: 102 shares, weight 4.
    assert_eq!(prop(&double, &unit, "CPUWeight"), Some(PropValue::U64(4)));
    assert_eq!(
        prop(&double, &unit, "CPUQuotaPerSecUSec"),
        Some(PropValue::U64(500_000))
    );
    assert_eq!(
        prop(&double, &unit, "CPUQuotaPeriodUSec"),
        Some(PropValue::U64(100_000))
    );
    assert_eq!(prop(&double, &unit, "TasksMax"), Some(PropValue::U64(128)));
    // The same limits in the slice's cgroup files.
    let cg = tree.join(parent.trim_start_matches('/'));
    assert_eq!(
        std::fs::read_to_string(cg.join("cpu.max")).expect("cpu.max"),
        "50000 100000"
    );
    assert_eq!(
        std::fs::read_to_string(cg.join("memory.max")).expect("memory.max"),
        (64u64 << 20).to_string()
    );

    // The pod goes: its slice is stopped and its cgroup removed.
    pods.delete("sliced", &DeleteParams::default().grace_period(0))
        .await
        .expect("delete");
    wait_for("the pod's slice to go", T, POLL, || async {
        if double.units().contains(&unit) {
            return Err("slice still up".into());
        }
        if cg.exists() {
            return Err(format!("{} still there", cg.display()));
        }
        Ok(())
    })
    .await
    .expect("slice stopped");
    let calls = double.calls();
    assert!(
        calls
            .iter()
            .any(|c| c.method == "StopUnit" && c.unit == unit),
        "{calls:?}"
    );
    // The QoS slices stay.
    assert!(
        double
            .units()
            .iter()
            .any(|u| u == "kubepods-burstable.slice")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runtime_reporting_systemd_is_followed() {
    let Some(SystemdWorld { _dir, tree, double }) =
        systemd_world("a_runtime_reporting_systemd_is_followed").await
    else {
        return;
    };
    // Configured cgroupfs; the runtime says systemd (CRI RuntimeConfig)
    // and kubelet ≥ 1.34 follows the runtime.
    let node = start_systemd_node(&tree, &double, Driver::Cgroupfs).await;
    wait_units(&double, &["kubepods.slice", "kubepods-besteffort.slice"]).await;
    node.wait_node("the Node registered", T, |_| Ok(()))
        .await
        .expect("registered");
    assert!(!tree.join("kubepods").exists(), "no cgroupfs-form cgroups");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_systemd_makes_the_node_not_ready_naming_it() {
    // The harness's own bus for the systemd driver: nobody listens there.
    let node = InProcessNode::start(NodeHarnessOptions {
        configure: Some(Arc::new(|c| {
            c.node.cgroup_driver = Driver::Systemd;
            c.node.node_status_update_frequency = keelson::config::KubeDuration::from_secs(1);
        })),
        fake: FakeConfig {
            cgroup_driver: Some(CgroupDriver::Systemd),
            ..FakeConfig::default()
        },
        ..NodeHarnessOptions::default()
    })
    .await
    .expect("node");
    let message = node
        .wait_node("Ready=False naming systemd", T, |n| {
            match condition(n, "Ready") {
                Some(c) if c.status == "False" => {
                    let m = c.message.clone().unwrap_or_default();
                    if m.contains("cannot reach systemd over D-Bus") {
                        Ok(m)
                    } else {
                        Err(format!("Ready=False: {m}"))
                    }
                }
                Some(c) => Err(format!("Ready={} ({:?})", c.status, c.message)),
                None => Err("no Ready condition".into()),
            }
        })
        .await
        .expect("not ready");
    assert!(message.contains("pod lifecycle"), "{message}");
    assert!(message.contains("no-systemd-bus"), "{message}");
}
