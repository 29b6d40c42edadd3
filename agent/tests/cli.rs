//! The `keelson` command line: `version`, a usage error for conflicting
//! role flags, and `check-config` refusing what the node role cannot do.

use std::process::{Command, Output};

fn keelson(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_keelson"))
        .args(args)
        .output()
        .expect("run keelson")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn version_prints_keelson_and_kubernetes_versions() {
    let out = keelson(&["version"]);
    assert!(out.status.success(), "status {:?}", out.status);
    let stdout = text(&out.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(
        lines,
        vec![
            format!("keelson {}", keelson::version::KEELSON_VERSION),
            format!("kubernetes {}", keelson::version::KUBERNETES_VERSION),
        ],
        "stdout: {stdout}"
    );
    // What the node reports as kubeletVersion: a Kubernetes release, not keelson's.
    assert!(
        keelson::version::KUBERNETES_VERSION.starts_with("v1."),
        "{stdout}"
    );
}

#[test]
fn node_only_and_proxy_only_together_is_a_usage_error() {
    let out = keelson(&["run", "--node-only", "--proxy-only"]);
    // clap's usage errors exit with 2 before anything starts.
    assert_eq!(out.status.code(), Some(2), "status {:?}", out.status);
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("--node-only") && stderr.contains("--proxy-only"),
        "stderr: {stderr}"
    );
    assert!(stderr.contains("cannot be used with"), "stderr: {stderr}");
    assert!(out.stdout.is_empty(), "stdout: {}", text(&out.stdout));
}

#[test]
fn check_config_refuses_what_the_node_role_does_not_implement() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("config.yaml");
    std::fs::write(
        &file,
        "apiVersion: keelson.dev/v1alpha1\nkind: KeelsonConfiguration\nnode:\n  imageServiceEndpoint: unix:///run/other-image.sock\n  registerWithTaints:\n  - key: a\n    effect: NoSchedule\n",
    )
    .expect("write config");
    let out = keelson(&["check-config", file.to_str().expect("utf-8 path")]);
    assert_eq!(out.status.code(), Some(2), "status {:?}", out.status);
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("node.imageServiceEndpoint:"),
        "stderr: {stderr}"
    );
    assert!(out.stdout.is_empty(), "stdout: {}", text(&out.stdout));

    std::fs::write(
        &file,
        "apiVersion: keelson.dev/v1alpha1\nkind: KeelsonConfiguration\nnode:\n  registerWithTaints:\n  - key: a\n    effect: NoSchedule\n    toleration: x\n",
    )
    .expect("write config");
    let out = keelson(&["check-config", file.to_str().expect("utf-8 path")]);
    assert_eq!(out.status.code(), Some(2), "status {:?}", out.status);
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("node.registerWithTaints[0].toleration")
            && stderr.contains("unknown field"),
        "stderr: {stderr}"
    );
}

const TESTDATA: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/src/config/upstream/testdata");

/// `check-config` with kubeadm's own files prints the effective
/// KeelsonConfiguration, lists the upstream fields accepted at their
/// default on stderr; kubeadm's `cgroupDriver: systemd` is kept.
#[test]
fn check_config_reads_kubeadms_files() {
    let dir = tempfile::tempdir().expect("dir");
    let kubelet = std::fs::read_to_string(format!("{TESTDATA}/kubeadm-kubelet-config.yaml"))
        .expect("kubeadm kubelet config");
    let kubelet_file = dir.path().join("config.yaml");
    std::fs::write(
        &kubelet_file,
        kubelet.replace(
            "cgroupDriver: systemd",
            "cgroupDriver: systemd\nfailCgroupV1: false",
        ),
    )
    .expect("write");
    let proxy = format!("{TESTDATA}/kubeadm-kube-proxy-config.yaml");
    let flags = format!("{TESTDATA}/kubeadm-flags.env");
    let out = keelson(&[
        "check-config",
        "--kubelet-config",
        &kubelet_file.display().to_string(),
        "--proxy-config",
        &proxy,
        "--kubeadm-flags",
        &flags,
        "--kubeconfig",
        "/etc/kubernetes/kubelet.conf",
    ]);
    let stdout = text(&out.stdout);
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "stderr: {stderr}");
    let printed = keelson::config::Config::from_yaml_str(&stdout)
        .expect("the output is a KeelsonConfiguration");
    assert_eq!(printed.node.cluster_domain, "cluster.local");
    assert_eq!(
        printed.node.cgroup_driver,
        keelson::config::CgroupDriver::Systemd
    );
    assert_eq!(printed.proxy.cluster_cidr, "10.244.0.0/16");
    assert_eq!(
        printed.node.node_ip,
        Some("192.0.2.10".parse().expect("ip"))
    );
    assert!(
        stderr.contains("warning: accepted with upstream's default value")
            && stderr.contains("httpCheckFrequency"),
        "{stderr}"
    );
    assert!(
        stderr.contains("note:") && stderr.contains("mode \"\""),
        "{stderr}"
    );
}

/// `keelson run` with both roles and only the node's kubeconfig: one line
/// naming the missing setting and why the node's does not do, with no
/// `$KUBECONFIG`, `~/.kube/config` or pod to fall back on (the child's
/// environment has none of them). It fails before serving or touching
/// anything: the node's client is built without contacting the server.
#[test]
fn run_without_proxy_credentials_names_the_missing_setting_once() {
    let dir = tempfile::tempdir().expect("dir");
    let config = dir.path().join("config.yaml");
    std::fs::write(
        &config,
        "apiVersion: keelson.dev/v1alpha1\nkind: KeelsonConfiguration\n",
    )
    .expect("write config");
    let node_kubeconfig = dir.path().join("node.kubeconfig");
    std::fs::write(
        &node_kubeconfig,
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:1\ncontexts:\n- name: c\n  context:\n    cluster: c\n    user: node\ncurrent-context: c\nusers:\n- name: node\n  user:\n    token: t\n",
    )
    .expect("write kubeconfig");
    let home = dir.path().join("home");
    std::fs::create_dir(&home).expect("home");
    let out = Command::new(env!("CARGO_BIN_EXE_keelson"))
        .args(["run", "--config"])
        .arg(&config)
        .arg("--kubeconfig")
        .arg(&node_kubeconfig)
        .env_remove("KUBECONFIG")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("KUBERNETES_SERVICE_PORT")
        .env("HOME", &home)
        .env("RUST_LOG", "off")
        .output()
        .expect("run keelson");
    assert_eq!(out.status.code(), Some(1), "status {:?}", out.status);
    assert_eq!(
        text(&out.stderr),
        format!(
            "error: proxy role: no credentials: give --proxy-kubeconfig FILE (or proxy.clientConnection.kubeconfig) with kube-proxy's rights; the node's kubeconfig {} is not used for the proxy role, as a node's rights do not cover the Services and EndpointSlices it watches; there is no $KUBECONFIG, ~/.kube/config or pod service account to fall back on\n",
            node_kubeconfig.display()
        )
    );

    // With the proxy role alone, --kubeconfig is the proxy's.
    let out = Command::new(env!("CARGO_BIN_EXE_keelson"))
        .args(["run", "--proxy-only", "--config"])
        .arg(&config)
        .env_remove("KUBECONFIG")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("KUBERNETES_SERVICE_PORT")
        .env("HOME", &home)
        .env("RUST_LOG", "off")
        .output()
        .expect("run keelson");
    assert_eq!(out.status.code(), Some(1), "status {:?}", out.status);
    assert_eq!(
        text(&out.stderr),
        "error: proxy role: no credentials: give --kubeconfig FILE (or proxy.clientConnection.kubeconfig) with kube-proxy's rights; there is no $KUBECONFIG, ~/.kube/config or pod service account to fall back on\n"
    );
}
