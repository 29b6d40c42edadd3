//! The plan on a fake kubeadm node: kubeadm v1.36's own files
//! (`config/upstream/testdata`) below a temporary root, and a systemctl
//! double answering for kubelet's unit.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use super::host::Host;
use super::plan::{self, PlanOptions, ProxySource};
use super::{MigrateError, backup, layout};

fn testdata(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("src/config/upstream/testdata")
        .join(name)
}

const KUBELET_CONF: &str = "apiVersion: v1\nkind: Config\nclusters:\n- name: kubernetes\n  cluster:\n    server: https://192.0.2.1:6443\n    certificate-authority-data: LS0tLQ==\ncontexts:\n- name: system:node:node-1@kubernetes\n  context:\n    cluster: kubernetes\n    user: system:node:node-1\ncurrent-context: system:node:node-1@kubernetes\nusers:\n- name: system:node:node-1\n  user:\n    client-certificate: /var/lib/kubelet/pki/kubelet-client-current.pem\n    client-key: /var/lib/kubelet/pki/kubelet-client-current.pem\n";

/// A kubeadm node's files below a temporary root.
struct Node {
    dir: tempfile::TempDir,
    host: Host,
}

impl Node {
    fn new() -> Node {
        let dir = tempfile::tempdir().expect("tempdir");
        let systemctl = dir.path().join("systemctl");
        std::fs::write(
            &systemctl,
            "#!/bin/sh\ncase \"$1 $2\" in\n  'is-enabled kubelet.service') echo enabled ;;\n  'is-active kubelet.service') echo active ;;\n  is-enabled*) echo not-found; exit 1 ;;\n  is-active*) echo inactive; exit 3 ;;\nesac\n",
        )
        .expect("write systemctl");
        std::fs::set_permissions(&systemctl, std::fs::Permissions::from_mode(0o755))
            .expect("chmod");
        let root = dir.path().join("root");
        let host = Host::new(&root, systemctl.display().to_string());
        let n = Node { dir, host };
        n.copy("kubeadm-kubelet-config.yaml", layout::KUBELET_CONFIG);
        let flags = std::fs::read_to_string(testdata("kubeadm-flags.env")).expect("flags");
        n.put(
            layout::KUBEADM_FLAGS,
            &flags.replace("--node-ip", "--hostname-override=node-1 --node-ip"),
        );
        n.put(layout::KUBELET_KUBECONFIG, KUBELET_CONF);
        n.put(
            "/var/lib/kubelet/pki/kubelet-client-2026-01-01-00-00-00.pem",
            "pem",
        );
        std::os::unix::fs::symlink(
            "/var/lib/kubelet/pki/kubelet-client-2026-01-01-00-00-00.pem",
            n.host.path(layout::KUBELET_CLIENT_CURRENT),
        )
        .expect("link");
        n
    }

    fn put(&self, host_path: &str, text: &str) {
        self.host
            .write(Path::new(host_path), text.as_bytes(), 0o644)
            .expect("write");
    }

    fn copy(&self, name: &str, host_path: &str) {
        self.put(
            host_path,
            &std::fs::read_to_string(testdata(name)).expect("testdata"),
        );
    }

    fn plan(&self, opts: &PlanOptions, proxy: ProxySource) -> plan::Plan {
        plan::build(&self.host, opts, proxy).expect("plan")
    }
}

fn node_only() -> PlanOptions {
    PlanOptions::default()
}

#[test]
fn kubeadm_node_gives_a_node_role_config_with_kubelets_identity_and_root_dir() {
    let n = Node::new();
    let p = n.plan(&node_only(), ProxySource::Unavailable("not asked".into()));
    assert!(p.refused.is_empty(), "{:?}", p.refused);
    let c = &p.config;
    assert_eq!(p.node_name, "node-1");
    assert_eq!(c.node_name.as_deref(), Some("node-1"));
    assert_eq!(
        c.node.kubeconfig.as_deref(),
        Some(Path::new(layout::KUBELET_KUBECONFIG))
    );
    assert_eq!(c.node.root_dir, PathBuf::from(layout::KUBELET_ROOT_DIR));
    assert_eq!(c.node.node_ip, Some("192.0.2.10".parse().expect("ip")));
    assert!(c.node.enabled && !c.proxy.enabled);
    assert_eq!(c.metrics_bind_address, "", "kube-proxy keeps :10249");
    let yaml = c.to_yaml();
    assert!(yaml.contains("cgroupDriver: systemd"), "{yaml}");
    assert!(
        yaml.contains("staticPodPath: /etc/kubernetes/manifests"),
        "{yaml}"
    );
    assert!(p.kubelet_unit.is_enabled() && p.kubelet_unit.is_active());
    assert!(!p.kube_proxy_unit.exists());

    let text = p.render();
    assert_eq!(
        text,
        n.plan(&node_only(), ProxySource::Unavailable("x".into()))
            .render(),
        "the report is deterministic"
    );
    for want in [
        "# The KeelsonConfiguration keelson would run with",
        "kind: KeelsonConfiguration",
        "# Differences from kubelet and kube-proxy:",
        "renews it into /var/lib/kubelet/pki/keelson-client-current.pem",
        "/var/lib/kubelet/pki/kubelet-client-current.pem",
        "# Steps of --apply:",
        "systemctl stop kubelet.service, systemctl disable kubelet.service",
        "packaging/install.sh install --enable --now",
    ] {
        assert!(text.contains(want), "missing {want:?} in:\n{text}");
    }
    assert!(!text.contains("# Refused"), "{text}");
    assert!(
        text.contains("/var/lib/kubelet/config.yaml: accepted at upstream's default value"),
        "{text}"
    );
    assert!(
        !text.contains(&n.dir.path().display().to_string()),
        "host paths, not the test root's: {text}"
    );
    // Reading changes nothing: no backup, no keelson file.
    assert!(!backup::exists(&n.host));
    assert!(!n.host.path(layout::KEELSON_CONFIG).exists());
}

#[test]
fn extra_args_of_etc_default_kubelet_win_over_kubeadms() {
    let n = Node::new();
    n.put(
        layout::KUBELET_DEFAULTS,
        "KUBELET_EXTRA_ARGS=--node-ip=192.0.2.99 --node-labels=rack=r7\n",
    );
    let p = n.plan(&node_only(), ProxySource::Unavailable("x".into()));
    assert!(p.refused.is_empty(), "{:?}", p.refused);
    assert_eq!(
        p.config.node.node_ip,
        Some("192.0.2.99".parse().expect("ip"))
    );
    assert_eq!(
        p.config.node.node_labels.get("rack").map(String::as_str),
        Some("r7")
    );
    assert_eq!(
        p.config
            .node
            .node_labels
            .get("topology.kubernetes.io/zone")
            .map(String::as_str),
        Some("a")
    );
}

#[test]
fn replacing_kube_proxy_reads_its_configuration_and_needs_its_credentials() {
    let n = Node::new();
    let proxy_text =
        std::fs::read_to_string(testdata("kubeadm-kube-proxy-config.yaml")).expect("testdata");
    let opts = PlanOptions {
        replace_kube_proxy: true,
        proxy_kubeconfig: None,
    };
    let p = n.plan(&opts, ProxySource::ConfigMap(proxy_text.clone()));
    assert!(
        p.refused
            .iter()
            .any(|r| r.contains("--replace-kube-proxy needs --proxy-kubeconfig")),
        "{:?}",
        p.refused
    );
    let kc = n.dir.path().join("proxy.kubeconfig");
    std::fs::write(&kc, "apiVersion: v1\nkind: Config\n").expect("write");
    let opts = PlanOptions {
        replace_kube_proxy: true,
        proxy_kubeconfig: Some(kc),
    };
    let p = n.plan(&opts, ProxySource::ConfigMap(proxy_text));
    assert!(p.refused.is_empty(), "{:?}", p.refused);
    assert!(p.config.proxy.enabled);
    assert_eq!(p.config.proxy.cluster_cidr, "10.244.0.0/16");
    assert_eq!(
        p.config.proxy.client_connection.kubeconfig.as_deref(),
        Some(Path::new(layout::KEELSON_PROXY_KUBECONFIG)),
        "not the pod's /var/lib/kube-proxy/kubeconfig.conf"
    );
    let text = p.render();
    assert!(
        text.contains("label Node node-1 keelson.dev/proxy=node-agent"),
        "{text}"
    );
    // Without the ConfigMap, the plan says how to give the file.
    let p = n.plan(&opts, ProxySource::Unavailable("connection refused".into()));
    assert!(
        p.refused.iter().any(|r| r.contains("--proxy-config FILE")),
        "{:?}",
        p.refused
    );
}

#[test]
fn settings_keelson_cannot_honour_are_refused_with_their_path() {
    let n = Node::new();
    let base = std::fs::read_to_string(testdata("kubeadm-kubelet-config.yaml")).expect("testdata");
    n.put(
        layout::KUBELET_CONFIG,
        &format!("{base}cpuManagerPolicy: static\n"),
    );
    let p = n.plan(&node_only(), ProxySource::Unavailable("x".into()));
    assert!(
        p.refused
            .iter()
            .any(|r| r.contains("config.yaml") && r.contains("cpuManagerPolicy")),
        "{:?}",
        p.refused
    );
    assert!(
        p.render()
            .contains("# Refused (fix these; --apply will not run):")
    );
}

#[test]
fn a_node_without_kubelets_config_is_not_a_kubeadm_node() {
    let n = Node::new();
    std::fs::remove_file(n.host.path(layout::KUBELET_CONFIG)).expect("rm");
    assert!(matches!(
        plan::build(&n.host, &node_only(), ProxySource::Unavailable("x".into())),
        Err(MigrateError::NotKubeadm(_))
    ));
}

#[test]
fn a_missing_client_certificate_and_an_earlier_migration_are_refused() {
    let n = Node::new();
    std::fs::remove_file(n.host.path(layout::KUBELET_CLIENT_CURRENT)).expect("rm");
    backup::write(
        &n.host,
        "node-1",
        Default::default(),
        &[layout::KUBELET_CONFIG],
        None,
    )
    .expect("backup");
    let p = n.plan(&node_only(), ProxySource::Unavailable("x".into()));
    assert!(
        p.refused
            .iter()
            .any(|r| r.contains("kubelet-client-current.pem, which does not exist")),
        "{:?}",
        p.refused
    );
    assert!(
        p.refused
            .iter()
            .any(|r| r.contains("run keelson migrate --rollback first")),
        "{:?}",
        p.refused
    );
}
