//! The node role checks the container runtime's cgroup driver at start:
//! it follows CRI RuntimeConfig as kubelet does, refuses a runtime that
//! reports the systemd driver (keelson implements cgroupfs only), and, with
//! a runtime that has no RuntimeConfig (containerd < 2.0), reads
//! containerd's configuration from a verbose Status and refuses a
//! mismatch, naming both drivers, instead of failing at the first sandbox.

use std::time::Duration;

use keelson_cri::api::CgroupDriver;
use keelson_cri::fake::FakeConfig;
use keelson_tests::node_harness::{InProcessNode, NodeHarnessOptions};

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
async fn a_runtime_reporting_systemd_is_refused() {
    let (node, result) = role_result(FakeConfig {
        cgroup_driver: Some(CgroupDriver::Systemd),
        ..FakeConfig::default()
    })
    .await;
    let err = result.expect_err("refused");
    assert!(
        err.contains("uses the \"systemd\" cgroup driver (CRI RuntimeConfig)"),
        "{err}"
    );
    assert!(
        node.node().await.expect("read").is_none(),
        "no Node registered"
    );
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
