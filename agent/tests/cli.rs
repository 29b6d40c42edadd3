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
        "apiVersion: keelson.dev/v1alpha1\nkind: KeelsonConfiguration\nnode:\n  cgroupDriver: systemd\n  imageServiceEndpoint: unix:///run/other-image.sock\n  registerWithTaints:\n  - key: a\n    effect: NoSchedule\n",
    )
    .expect("write config");
    let out = keelson(&["check-config", file.to_str().expect("utf-8 path")]);
    assert_eq!(out.status.code(), Some(2), "status {:?}", out.status);
    let stderr = text(&out.stderr);
    assert!(stderr.contains("node.cgroupDriver:"), "stderr: {stderr}");
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
