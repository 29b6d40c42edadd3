//! `keelson-proxy`, the proxy role alone (the proxy-only DaemonSet's
//! binary), against `keelson run --proxy-only`: the same configuration
//! from the same files and flags, the same version, the proxy role's own
//! start-up errors, no `--node-only`, and none of the node role's code
//! linked in (what makes its resident text smaller).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use keelson_tests::node_harness::keelson_bin;

fn binaries() -> (PathBuf, PathBuf) {
    let keelson = keelson_bin().expect("keelson binary (cargo build --workspace --bins)");
    let proxy = keelson.with_file_name("keelson-proxy");
    assert!(
        proxy.is_file(),
        "{} missing: cargo build -p keelson --bins",
        proxy.display()
    );
    (keelson, proxy)
}

/// Runs `bin` with `args` and nothing it could find credentials in: no
/// KUBECONFIG, no in-cluster variables, a HOME without `.kube`.
fn run(bin: &Path, args: &[&str], home: &Path) -> Output {
    Command::new(bin)
        .args(args)
        .env_remove("KUBECONFIG")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("KUBERNETES_SERVICE_PORT")
        .env("HOME", home)
        .env("NO_COLOR", "1")
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", bin.display()))
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn check_config_is_keelson_run_proxy_only() {
    let (keelson, proxy) = binaries();
    let dir = tempfile::tempdir().expect("tempdir");
    // A file that enables both roles and sets a proxy field.
    let file = dir.path().join("config.yaml");
    std::fs::write(
        &file,
        "apiVersion: keelson.dev/v1alpha1\nkind: KeelsonConfiguration\nnode:\n  enabled: true\nproxy:\n  enabled: true\n  mode: ebpf\n",
    )
    .expect("write config");
    let file = file.to_str().expect("utf-8 path");
    let flags = ["--config", file, "--kubeconfig", "/etc/kp.kubeconfig"];
    let full = run(
        &keelson,
        &[&["check-config", "--proxy-only"][..], &flags].concat(),
        dir.path(),
    );
    let alone = run(
        &proxy,
        &[&["check-config"][..], &flags].concat(),
        dir.path(),
    );
    assert!(full.status.success(), "keelson: {}", text(&full.stderr));
    assert!(
        alone.status.success(),
        "keelson-proxy: {}",
        text(&alone.stderr)
    );
    assert_eq!(
        text(&alone.stdout),
        text(&full.stdout),
        "the same effective configuration"
    );
    let cfg = keelson::config::Config::from_yaml_str(&text(&alone.stdout)).expect("valid");
    assert!(
        cfg.proxy.enabled && !cfg.node.enabled,
        "the proxy role alone"
    );
    assert_eq!(cfg.proxy.mode, keelson::config::ProxyMode::Ebpf);
    assert_eq!(
        cfg.proxy.client_connection.kubeconfig.as_deref(),
        Some(Path::new("/etc/kp.kubeconfig")),
        "--kubeconfig is the proxy role's, as with --proxy-only"
    );
    // `--proxy-only` is accepted (a keelson command line works as is).
    let with_flag = run(
        &proxy,
        &[&["check-config", "--proxy-only"][..], &flags].concat(),
        dir.path(),
    );
    assert_eq!(text(&with_flag.stdout), text(&full.stdout));
}

#[test]
fn version_is_keelsons_and_node_only_is_refused() {
    let (keelson, proxy) = binaries();
    let dir = tempfile::tempdir().expect("tempdir");
    let a = run(&keelson, &["version"], dir.path());
    let b = run(&proxy, &["version"], dir.path());
    assert!(a.status.success() && b.status.success());
    assert_eq!(text(&b.stdout), text(&a.stdout));

    let refused = run(&proxy, &["run", "--node-only"], dir.path());
    assert_eq!(refused.status.code(), Some(2), "a usage error");
    assert!(
        text(&refused.stderr).contains("--node-only"),
        "names the flag: {}",
        text(&refused.stderr)
    );
    // No node-role commands either.
    for cmd in ["diagnose", "migrate"] {
        let out = run(&proxy, &[cmd], dir.path());
        assert_eq!(out.status.code(), Some(2), "{cmd}: {}", text(&out.stderr));
    }
}

#[test]
fn run_starts_the_proxy_role_and_says_what_credentials_it_lacks() {
    let (keelson, proxy) = binaries();
    let dir = tempfile::tempdir().expect("tempdir");
    let full = run(&keelson, &["run", "--proxy-only"], dir.path());
    let alone = run(&proxy, &["run"], dir.path());
    assert_eq!(alone.status.code(), Some(1), "{}", text(&alone.stderr));
    // The error line of stderr (the log goes there too).
    let error = |o: &Output| {
        text(&o.stderr)
            .lines()
            .filter(|l| l.starts_with("error: "))
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    let msg = error(&alone);
    assert_eq!(msg.len(), 1, "said once: {}", text(&alone.stderr));
    assert!(
        msg[0].starts_with("error: proxy role: no credentials: give --kubeconfig FILE"),
        "the proxy role's own error: {msg:?}"
    );
    assert_eq!(msg, error(&full), "as keelson run --proxy-only says it");
}

/// The node role's modules that only a running node role reaches (the
/// configuration's validation reaches a few functions of `pods` and
/// `server`, so those are not among them).
const NODE_ROLE_MODULES: [&str; 5] = ["certificates", "status", "lease", "eviction", "volumes"];

/// Symbols of `bin` in [`NODE_ROLE_MODULES`], in the toolchain's default
/// (legacy) mangling: `12keelson_node6status...` for a path, and
/// `keelson_node..status..` inside a generic's arguments.
fn node_role_symbols(bin: &Path) -> usize {
    let out = Command::new("nm")
        .arg(bin)
        .output()
        .unwrap_or_else(|e| panic!("nm {}: {e}", bin.display()));
    assert!(out.status.success(), "nm {}", bin.display());
    let marks: Vec<String> = NODE_ROLE_MODULES
        .iter()
        .flat_map(|m| {
            [
                format!("12keelson_node{}{m}", m.len()),
                format!("keelson_node..{m}.."),
            ]
        })
        .collect();
    text(&out.stdout)
        .lines()
        .filter(|l| marks.iter().any(|m| l.contains(m.as_str())))
        .count()
}

#[test]
fn keelson_proxy_links_none_of_the_node_roles_code() {
    let (keelson, proxy) = binaries();
    let full = node_role_symbols(&keelson);
    assert!(
        full > 100,
        "keelson holds the node role ({full} symbols of {NODE_ROLE_MODULES:?}): the check can see it"
    );
    assert_eq!(
        node_role_symbols(&proxy),
        0,
        "keelson-proxy holds none of it"
    );
    let size = |p: &Path| std::fs::metadata(p).expect("binary").len();
    assert!(
        size(&proxy) < size(&keelson),
        "keelson-proxy ({}) is smaller than keelson ({})",
        size(&proxy),
        size(&keelson)
    );
}
