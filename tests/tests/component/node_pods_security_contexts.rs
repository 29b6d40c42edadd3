//! Component test: the security contexts keelson sends the runtime, read
//! back from the fake CRI's CreateContainer and RunPodSandbox requests,
//! against what kubelet v1.36 sends (pkg/kubelet/kuberuntime:
//! `helpers.go` getSeccompProfile/fieldSeccompProfile,
//! `security_context.go` determineEffectiveSecurityContext,
//! `kuberuntime_sandbox.go` generatePodSandboxLinuxConfig;
//! pkg/securitycontext defaultMaskedPaths/defaultReadonlyPaths).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use crate::node_pods_support::*;
use keelson_cri::api;
use serde_json::json;

const T: Duration = Duration::from_secs(20);

fn container(name: &str, security: serde_json::Value) -> serde_json::Value {
    json!({"name": name, "image": IMAGE, "command": ["sh", "-c", "sleep 3600"],
           "securityContext": security})
}

/// The linux security context keelson asked the runtime to create `name` with.
fn created(w: &World, name: &str) -> api::LinuxContainerSecurityContext {
    w.fake
        .container_configs()
        .into_iter()
        .find(|(c, _)| c.metadata.as_ref().is_some_and(|m| m.name == name))
        .and_then(|(c, _)| c.linux)
        .and_then(|l| l.security_context)
        .unwrap_or_else(|| panic!("no CreateContainer for {name}"))
}

fn seccomp(sc: &api::LinuxContainerSecurityContext) -> (i32, String) {
    let p = sc
        .seccomp
        .clone()
        .expect("a seccomp profile is always sent");
    (p.profile_type, p.localhost_ref)
}

const RUNTIME_DEFAULT: i32 = api::security_profile::ProfileType::RuntimeDefault as i32;
const UNCONFINED: i32 = api::security_profile::ProfileType::Unconfined as i32;
const LOCALHOST: i32 = api::security_profile::ProfileType::Localhost as i32;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn security_contexts_reach_the_runtime_as_kubelet_sends_them() {
    let w = World::new().await;
    let spec = json!({
        "terminationGracePeriodSeconds": 5,
        "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}, "runAsUser": 1000},
        "containers": [
            container("app", json!({"allowPrivilegeEscalation": false,
                                    "readOnlyRootFilesystem": true,
                                    "capabilities": {"add": ["NET_ADMIN"], "drop": ["ALL"]}})),
            container("local", json!({"seccompProfile": {"type": "Localhost",
                                                         "localhostProfile": "profiles/audit.json"},
                                      "runAsUser": 2000})),
            container("open", json!({"seccompProfile": {"type": "Unconfined"}})),
        ]
    });
    w.create_pod("sec", spec).await;
    w.wait_phase("sec", "Running", T).await;

    // The container's profile over the pod's; Localhost under
    // `<rootDir>/seccomp` (kubelet's seccompProfileRoot).
    let app = created(&w, "app");
    assert_eq!(seccomp(&app), (RUNTIME_DEFAULT, String::new()));
    let local = created(&w, "local");
    let root = w.config.root_dir.join("seccomp/profiles/audit.json");
    assert_eq!(
        seccomp(&local),
        (LOCALHOST, root.to_string_lossy().into_owned())
    );
    assert_eq!(seccomp(&created(&w, "open")).0, UNCONFINED);

    // runAsUser: the container's over the pod's.
    assert_eq!(app.run_as_user.map(|v| v.value), Some(1000));
    assert_eq!(local.run_as_user.map(|v| v.value), Some(2000));

    // allowPrivilegeEscalation false is no_new_privs; the root filesystem
    // and the capabilities as given.
    assert!(app.no_new_privs);
    assert!(!local.no_new_privs);
    assert!(app.readonly_rootfs);
    let caps = app.capabilities.clone().expect("capabilities");
    assert_eq!(caps.add_capabilities, ["NET_ADMIN"]);
    assert_eq!(caps.drop_capabilities, ["ALL"]);

    // procMount Default: /proc's sensitive paths masked or read-only.
    assert!(
        app.masked_paths.iter().any(|p| p == "/proc/kcore"),
        "{:?}",
        app.masked_paths
    );
    assert!(
        app.readonly_paths.iter().any(|p| p == "/proc/sys"),
        "{:?}",
        app.readonly_paths
    );
    assert!(!app.privileged);

    // The sandbox always runs RuntimeDefault (kubernetes#84623).
    let sandbox = w
        .fake
        .sandbox_configs()
        .into_iter()
        .find(|(c, _)| c.metadata.as_ref().is_some_and(|m| m.name == "sec"))
        .and_then(|(c, _)| c.linux)
        .and_then(|l| l.security_context)
        .expect("sandbox security context");
    let sp = sandbox.seccomp.expect("sandbox seccomp");
    assert_eq!(sp.profile_type, RUNTIME_DEFAULT);
    assert_eq!(sandbox.run_as_user.map(|v| v.value), Some(1000));

    // Nothing set and `seccompDefault` off (kubelet's default): Unconfined.
    w.create_pod("plain", busybox(json!({}))).await;
    w.wait_phase("plain", "Running", T).await;
    // `app` is in both pods: find this one by its sandbox.
    let plain_sandbox = w
        .fake
        .sandboxes()
        .into_iter()
        .find(|s| s.metadata.as_ref().is_some_and(|m| m.name == "plain"))
        .expect("plain's sandbox")
        .id;
    let plain_app = w
        .fake
        .container_configs()
        .into_iter()
        .find(|(c, sb)| {
            *sb == plain_sandbox && c.metadata.as_ref().is_some_and(|m| m.name == "app")
        })
        .and_then(|(c, _)| c.linux)
        .and_then(|l| l.security_context)
        .expect("plain's app");
    assert_eq!(seccomp(&plain_app).0, UNCONFINED);
}
