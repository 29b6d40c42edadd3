use std::path::PathBuf;

use super::*;
use crate::config::{CgroupDriver, KubeDuration, ProxyMode};

fn testdata(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("src/config/upstream/testdata")
        .join(name)
}

struct Files {
    dir: tempfile::TempDir,
}

impl Files {
    fn new() -> Files {
        Files {
            dir: tempfile::tempdir().expect("tempdir"),
        }
    }
    fn write(&self, name: &str, text: &str) -> PathBuf {
        let p = self.dir.path().join(name);
        std::fs::write(&p, text).expect("write");
        p
    }
}

const KUBELET_HEADER: &str =
    "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n";
const PROXY_HEADER: &str =
    "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n";

fn kubelet(body: &str) -> Result<Loaded, ConfigError> {
    let f = Files::new();
    let p = f.write(
        "config.yaml",
        &format!("{KUBELET_HEADER}failCgroupV1: false\n{body}"),
    );
    load(
        &Sources {
            kubelet_config: Some(p),
            ..Sources::default()
        },
        &Overrides {
            node_only: true,
            ..Overrides::default()
        },
    )
}

fn proxy(body: &str) -> Result<Loaded, ConfigError> {
    let f = Files::new();
    let p = f.write("kube-proxy.yaml", &format!("{PROXY_HEADER}{body}"));
    load(
        &Sources {
            proxy_config: Some(p),
            ..Sources::default()
        },
        &Overrides {
            proxy_only: true,
            ..Overrides::default()
        },
    )
}

#[test]
fn kubeadm_kubelet_file_runs_with_upstream_defaults() {
    let overrides = Overrides {
        node_only: true,
        node_name: Some("worker-1".into()),
        kubeconfig: Some("/etc/kubernetes/kubelet.conf".into()),
        ..Overrides::default()
    };
    // kubeadm writes cgroupDriver: systemd; the file is accepted as is.
    let loaded = load(
        &Sources {
            kubelet_config: Some(testdata("kubeadm-kubelet-config.yaml")),
            ..Sources::default()
        },
        &overrides,
    )
    .expect("kubeadm's file is accepted");
    let n = &loaded.config.node;
    assert_eq!(n.cgroup_driver, CgroupDriver::Systemd);
    assert_eq!(
        n.cluster_dns,
        vec!["10.96.0.10".parse::<std::net::IpAddr>().expect("ip")]
    );
    assert_eq!(n.cluster_domain, "cluster.local");
    assert_eq!(
        n.static_pod_path,
        Some(PathBuf::from("/etc/kubernetes/manifests"))
    );
    assert_eq!(
        n.container_runtime_endpoint,
        "unix:///var/run/containerd/containerd.sock"
    );
    assert_eq!(
        n.kubeconfig,
        Some(PathBuf::from("/etc/kubernetes/kubelet.conf"))
    );
    assert!(n.rotate_certificates);
    // Zero values mean upstream's defaults.
    assert_eq!(n.sync_frequency, KubeDuration::from_secs(60));
    assert_eq!(n.file_check_frequency, KubeDuration::from_secs(20));
    assert_eq!(n.node_status_update_frequency, KubeDuration::from_secs(10));
    assert_eq!(n.node_status_report_frequency, KubeDuration::from_secs(300));
    assert_eq!(n.runtime_request_timeout, KubeDuration::from_secs(120));
    assert_eq!(n.image_minimum_gc_age, KubeDuration::from_secs(120));
    assert_eq!(
        n.eviction_pressure_transition_period,
        KubeDuration::from_secs(300)
    );
    assert_eq!(
        n.eviction_hard
            .get("imagefs.inodesFree")
            .map(String::as_str),
        Some("5%")
    );
    assert_eq!(
        loaded.config.healthz_bind_address.as_deref(),
        Some("127.0.0.1:10248")
    );
    // Upstream's v1beta1 default: refuse cgroup v1 hosts.
    assert!(n.fail_cgroup_v1);
    assert!(!loaded.config.proxy.enabled);
    // The kubelet API fields set the node API, zero values defaulted.
    assert_eq!(
        n.authentication.x509.client_ca_file,
        Some(PathBuf::from("/etc/kubernetes/pki/ca.crt"))
    );
    assert!(n.authentication.webhook.enabled);
    assert!(!n.authentication.anonymous.enabled);
    assert_eq!(
        n.authentication.webhook.cache_ttl,
        KubeDuration::from_secs(120)
    );
    assert_eq!(
        n.authorization.mode,
        crate::config::kubelet_api::AuthorizationMode::Webhook
    );
    assert_eq!(
        n.authorization.webhook.cache_authorized_ttl,
        KubeDuration::from_secs(300)
    );
    assert_eq!(
        n.authorization.webhook.cache_unauthorized_ttl,
        KubeDuration::from_secs(30)
    );
    assert_eq!(
        n.streaming_connection_idle_timeout,
        KubeDuration::from_secs(4 * 3600)
    );
    assert!(
        !loaded.ignored.iter().any(|i| i.contains("authentication")),
        "authentication is read, not ignored: {:?}",
        loaded.ignored
    );
    // kubeadm writes `volumeStatsAggPeriod: 0s`: kubelet's defaulting
    // makes it one minute.
    assert_eq!(n.volume_stats_agg_period, KubeDuration::from_secs(60));
    assert!(
        !loaded
            .ignored
            .iter()
            .any(|i| i.ends_with(": volumeStatsAggPeriod")),
        "volumeStatsAggPeriod is read, not ignored: {:?}",
        loaded.ignored
    );
    for f in ["httpCheckFrequency", "memorySwap.swapBehavior"] {
        assert!(
            loaded
                .ignored
                .iter()
                .any(|i| i.ends_with(&format!(": {f}")))
                || f == "memorySwap.swapBehavior",
            "{f} not listed in {:?}",
            loaded.ignored
        );
    }
    // The effective configuration prints and reads back as a KeelsonConfiguration.
    let again = Config::from_yaml_str(&loaded.config.to_yaml()).expect("printed config parses");
    assert_eq!(again, loaded.config);
}

#[test]
fn kubeadm_kube_proxy_file_runs_with_upstream_defaults() {
    let loaded = load(
        &Sources {
            proxy_config: Some(testdata("kubeadm-kube-proxy-config.yaml")),
            ..Sources::default()
        },
        &Overrides {
            proxy_only: true,
            ..Overrides::default()
        },
    )
    .expect("kubeadm's kube-proxy file is accepted");
    let c = &loaded.config;
    let p = &c.proxy;
    assert_eq!(p.mode, ProxyMode::Nftables);
    assert!(
        loaded.notes.iter().any(|n| n.contains("mode \"\"")),
        "{:?}",
        loaded.notes
    );
    assert_eq!(
        p.client_connection.kubeconfig,
        Some(PathBuf::from("/var/lib/kube-proxy/kubeconfig.conf"))
    );
    assert_eq!(
        (p.client_connection.qps, p.client_connection.burst),
        (5.0, 10)
    );
    assert_eq!(p.healthz_bind_address, "0.0.0.0:10256");
    assert_eq!(c.metrics_bind_address, "127.0.0.1:10249");
    assert_eq!(p.cluster_cidr, "10.244.0.0/16");
    assert_eq!(p.sync_period, KubeDuration::from_secs(30));
    assert_eq!(p.min_sync_period, KubeDuration::from_secs(1));
    assert_eq!(p.nftables.masquerade_bit, 14);
    assert_eq!((p.conntrack.max_per_core, p.conntrack.min), (32768, 131072));
    assert_eq!(
        p.conntrack.tcp_established_timeout,
        KubeDuration::from_secs(86400)
    );
    assert_eq!(
        p.conntrack.tcp_close_wait_timeout,
        KubeDuration::from_secs(3600)
    );
    assert_eq!(p.oom_score_adj, -999);
    assert!(!c.node.enabled);
}

#[test]
fn kube_proxy_zeros_leave_the_kernel_alone() {
    let loaded = proxy(
        "mode: nftables\noomScoreAdj: 0\nconntrack:\n  maxPerCore: 0\n  min: 0\n  tcpEstablishedTimeout: 0s\n  tcpCloseWaitTimeout: 0s\nnftables:\n  syncPeriod: 20s\n  minSyncPeriod: 0s\niptables:\n  syncPeriod: 7s\nhealthzBindAddress: 127.0.0.1\nmetricsBindAddress: 127.0.0.1:19249\nhostnameOverride: Node-A\nclientConnection:\n  kubeconfig: /k\n  qps: 20\n  burst: 40\n",
    )
    .expect("valid");
    let c = &loaded.config;
    let ct = &c.proxy.conntrack;
    assert_eq!((ct.max_per_core, ct.min), (0, 0));
    assert!(ct.tcp_established_timeout.get().is_zero());
    assert!(ct.tcp_close_wait_timeout.get().is_zero());
    assert_eq!(c.proxy.oom_score_adj, 0);
    // nftables mode reads nftables.*; 0s means the default.
    assert_eq!(c.proxy.sync_period, KubeDuration::from_secs(20));
    assert_eq!(c.proxy.min_sync_period, KubeDuration::from_secs(1));
    assert_eq!(c.proxy.healthz_bind_address, "127.0.0.1:10256");
    assert_eq!(c.metrics_bind_address, "127.0.0.1:19249");
    assert_eq!(c.node_name.as_deref(), Some("node-a"));
    assert_eq!(
        (
            c.proxy.client_connection.qps,
            c.proxy.client_connection.burst
        ),
        (20.0, 40)
    );
    assert!(loaded.notes.is_empty(), "{:?}", loaded.notes);
}

#[test]
fn kubelet_defaulting_rules() {
    let c = kubelet("nodeStatusUpdateFrequency: 20s\nmaxParallelImagePulls: 3\nkubeAPIQPS: 0\nhealthzPort: 0\nevictionHard:\n  memory.available: 200Mi\nmergeDefaultEvictionSettings: true\npodPidsLimit: -5\nresolvConf: \"\"\nstaticPodPath: manifests\n")
        .expect("valid")
        .config;
    let n = &c.node;
    assert_eq!(n.node_status_report_frequency, KubeDuration::from_secs(20));
    assert_eq!(n.node_status_update_frequency, KubeDuration::from_secs(20));
    assert!(!n.serialize_image_pulls);
    assert_eq!(n.max_parallel_image_pulls, Some(3));
    assert_eq!(n.kube_api_qps, 5.0);
    assert_eq!(
        c.healthz_bind_address.as_deref(),
        Some(""),
        "healthzPort 0 disables healthz"
    );
    assert_eq!(c.effective_healthz_bind_address(), Some(""));
    assert_eq!(
        n.eviction_hard.get("memory.available").map(String::as_str),
        Some("200Mi")
    );
    assert_eq!(
        n.eviction_hard.get("nodefs.available").map(String::as_str),
        Some("10%")
    );
    assert_eq!(n.pod_pids_limit, -1);
    assert!(n.resolv_conf.as_os_str().is_empty());
    let spp = n.static_pod_path.as_ref().expect("static pod path");
    assert!(spp.is_absolute() && spp.ends_with("manifests"), "{spp:?}");
    // Without mergeDefaultEvictionSettings, evictionHard replaces the defaults.
    let c = kubelet("evictionHard:\n  memory.available: 200Mi\n")
        .expect("valid")
        .config;
    assert_eq!(c.node.eviction_hard.len(), 1);
    // rotateCertificates is false unless asked for (v1beta1's zero value).
    assert!(!c.node.rotate_certificates);
    // serverTLSBootstrap likewise, and is honoured when set.
    assert!(!c.node.server_tls_bootstrap);
    let c = kubelet("serverTLSBootstrap: true\n").expect("valid").config;
    assert!(c.node.server_tls_bootstrap);
}

#[test]
fn pod_admission_and_image_credential_fields_are_read() {
    let c = kubelet("allowedUnsafeSysctls: [\"kernel.msg*\", net.core.somaxconn]\nimagePullCredentialsVerificationPolicy: NeverVerifyAllowlistedImages\npreloadedImagesVerificationAllowlist: [\"registry.example/app/*\"]\n")
        .expect("valid")
        .config;
    let n = &c.node;
    assert_eq!(
        n.allowed_unsafe_sysctls,
        ["kernel.msg*", "net.core.somaxconn"]
    );
    assert_eq!(
        n.image_pull_credentials_verification_policy,
        "NeverVerifyAllowlistedImages"
    );
    assert_eq!(
        n.preloaded_images_verification_allowlist,
        ["registry.example/app/*"]
    );
    // Unset or empty: kubelet's default policy.
    let c = kubelet("imagePullCredentialsVerificationPolicy: \"\"\n")
        .expect("valid")
        .config;
    assert_eq!(
        c.node.image_pull_credentials_verification_policy,
        "NeverVerifyPreloadedImages"
    );
    // The allowlist is refused with another policy, as kubelet's validation.
    assert!(kubelet("preloadedImagesVerificationAllowlist: [\"a/b\"]\n").is_err());
}

#[test]
fn container_log_rotation_fields_are_read() {
    let n = kubelet("containerLogMaxSize: 50Mi\ncontainerLogMaxFiles: 3\ncontainerLogMaxWorkers: 4\ncontainerLogMonitorInterval: 30s\n")
        .expect("valid")
        .config
        .node;
    assert_eq!(n.container_log_max_size, "50Mi");
    assert_eq!(n.container_log_max_files, 3);
    assert_eq!(n.container_log_max_workers, 4);
    assert_eq!(
        n.container_log_monitor_interval,
        KubeDuration::from_secs(30)
    );
    // Empty size is v1beta1's unset (10Mi); a negative one disables rotation.
    let n = kubelet("containerLogMaxSize: \"\"\n")
        .expect("valid")
        .config
        .node;
    assert_eq!(n.container_log_max_size, "10Mi");
    assert_eq!(n.container_log_max_files, 5);
    assert_eq!(n.container_log_max_workers, 1);
    assert_eq!(
        n.container_log_monitor_interval,
        KubeDuration::from_secs(10)
    );
    assert!(kubelet("containerLogMaxSize: \"-1\"\n").is_ok());
    // The others are pointers: an explicit zero is kept and refused, with
    // the file's field names (validation.go).
    let err = kubelet("containerLogMaxFiles: 1\ncontainerLogMaxWorkers: 0\ncontainerLogMonitorInterval: 0s\ncontainerLogMaxSize: ten\n")
        .expect_err("invalid");
    let paths = err.field_paths();
    for want in [
        "containerLogMaxFiles",
        "containerLogMaxWorkers",
        "containerLogMonitorInterval",
        "containerLogMaxSize",
    ] {
        assert!(
            paths.iter().any(|p| p == want),
            "missing {want} in {paths:?}\n{err}"
        );
    }
}

#[test]
fn every_problem_of_a_file_is_reported_at_once() {
    let err = kubelet("maxPods: -3\ncpuManagerPolicy: static\nsyncFrequency: 10\nbogusField: 1\nauthentication:\n  x509:\n    clientCAFile: /ca.crt\nseccompDefault: true\nnodeLabels: {}\n")
        .expect_err("invalid");
    let paths = err.field_paths();
    for want in [
        "maxPods",
        "cpuManagerPolicy",
        "syncFrequency",
        "bogusField",
        "seccompDefault",
        "nodeLabels",
    ] {
        assert!(
            paths.iter().any(|p| p == want),
            "missing {want} in {paths:?}\n{err}"
        );
    }
    let text = err.to_string();
    assert!(text.contains("config.yaml:"), "{text}");
    assert!(text.contains("\"static\""), "{text}");
    assert!(text.contains("unknown field"), "{text}");
}

#[test]
fn proxy_modes_keelson_cannot_honour_are_refused() {
    let err =
        proxy("mode: ipvs\nbindAddress: 10.0.0.1\nenableProfiling: true\n").expect_err("invalid");
    let paths = err.field_paths();
    assert_eq!(paths, ["bindAddress", "enableProfiling", "mode"], "{err}");
}

#[test]
fn both_files_and_kubeadm_flags() {
    let f = Files::new();
    let k = f.write(
        "config.yaml",
        &format!("{KUBELET_HEADER}failCgroupV1: false\nmaxPods: 50\n"),
    );
    let p = f.write("kp.yaml", &format!("{PROXY_HEADER}mode: nftables\nclientConnection:\n  kubeconfig: /var/lib/kube-proxy/kubeconfig.conf\n"));
    let loaded = load(
        &Sources {
            kubelet_config: Some(k),
            proxy_config: Some(p),
            kubeadm_flags: Some(testdata("kubeadm-flags.env")),
            ..Sources::default()
        },
        &Overrides {
            kubeconfig: Some("/etc/kubernetes/kubelet.conf".into()),
            ..Overrides::default()
        },
    )
    .expect("valid");
    let c = &loaded.config;
    assert!(c.node.enabled && c.proxy.enabled);
    assert_eq!(c.node.max_pods, 50);
    // --kubeconfig is the node role's, as kubelet's flag.
    assert_eq!(
        c.node.kubeconfig,
        Some(PathBuf::from("/etc/kubernetes/kubelet.conf"))
    );
    assert_eq!(
        c.proxy.client_connection.kubeconfig,
        Some(PathBuf::from("/var/lib/kube-proxy/kubeconfig.conf"))
    );
    assert_eq!(c.node.node_ip, Some("192.0.2.10".parse().expect("ip")));
    assert_eq!(
        c.node
            .node_labels
            .get("topology.kubernetes.io/zone")
            .map(String::as_str),
        Some("a")
    );
}

#[test]
fn restricted_node_labels_are_refused_at_start() {
    let f = Files::new();
    let flags = f.write(
        "flags.env",
        "KUBELET_KUBEADM_ARGS=\"--node-labels=node-role.kubernetes.io/worker=\"\n",
    );
    let err = load(
        &Sources {
            kubeadm_flags: Some(flags.clone()),
            ..Sources::default()
        },
        &Overrides::default(),
    )
    .expect_err("refused");
    let text = err.to_string();
    assert!(text.contains(&flags.display().to_string()), "{text}");
    assert!(text.contains("node-role.kubernetes.io/worker"), "{text}");
}

#[test]
fn mismatched_node_names_are_refused() {
    let f = Files::new();
    let p = f.write(
        "kp.yaml",
        &format!("{PROXY_HEADER}hostnameOverride: other\n"),
    );
    let flags = f.write(
        "flags.env",
        "KUBELET_KUBEADM_ARGS=--hostname-override=node-1\n",
    );
    let err = load(
        &Sources {
            proxy_config: Some(p.clone()),
            kubeadm_flags: Some(flags),
            ..Sources::default()
        },
        &Overrides::default(),
    )
    .expect_err("mismatch");
    assert_eq!(err.field_paths(), ["hostnameOverride"]);
    // --node-name wins over both, as a command-line flag.
    let ok = load(
        &Sources {
            proxy_config: Some(p),
            ..Sources::default()
        },
        &Overrides {
            node_name: Some("node-1".into()),
            proxy_only: true,
            ..Overrides::default()
        },
    )
    .expect("valid");
    assert_eq!(ok.config.node_name.as_deref(), Some("node-1"));
}

#[test]
fn keelson_configuration_below_upstream_files() {
    let f = Files::new();
    let kc = f.write(
        "keelson.yaml",
        "apiVersion: keelson.dev/v1alpha1\nkind: KeelsonConfiguration\nnode:\n  maxPods: 20\n  rootDir: /var/lib/keelson-x\nproxy:\n  mode: ebpf\n",
    );
    let k = f.write(
        "config.yaml",
        &format!("{KUBELET_HEADER}failCgroupV1: false\nmaxPods: 30\n"),
    );
    let loaded = load(
        &Sources {
            config: Some(kc),
            kubelet_config: Some(k),
            ..Sources::default()
        },
        &Overrides::default(),
    )
    .expect("valid");
    assert_eq!(
        loaded.config.node.max_pods, 30,
        "the kubelet file's value wins"
    );
    assert_eq!(
        loaded.config.node.root_dir,
        PathBuf::from("/var/lib/keelson-x")
    );
    assert_eq!(loaded.config.proxy.mode, ProxyMode::Ebpf);
}

#[test]
fn kubelet_api_fields_set_the_node_api() {
    let loaded = kubelet(
        "address: 10.0.0.5\nport: 10260\nreadOnlyPort: 10255\ntlsCertFile: pki/serving.crt\ntlsPrivateKeyFile: pki/serving.key\ntlsMinVersion: VersionTLS13\nenableDebuggingHandlers: false\nstreamingConnectionIdleTimeout: 5m\nauthentication:\n  anonymous:\n    enabled: true\n  webhook:\n    enabled: false\n    cacheTTL: 10s\nauthorization:\n  mode: AlwaysAllow\n",
    )
    .expect("valid");
    let n = &loaded.config.node;
    assert_eq!(n.address, "10.0.0.5");
    assert_eq!(n.port, 10260);
    assert_eq!(n.read_only_port, 10255);
    // Relative paths are relative to the file's directory.
    let cert = n.tls_cert_file.as_ref().expect("tlsCertFile");
    assert!(
        cert.is_absolute() && cert.ends_with("pki/serving.crt"),
        "{cert:?}"
    );
    assert_eq!(n.tls_min_version, "VersionTLS13");
    assert!(!n.enable_debugging_handlers);
    assert_eq!(
        n.streaming_connection_idle_timeout,
        KubeDuration::from_secs(300)
    );
    assert!(n.authentication.anonymous.enabled);
    assert!(!n.authentication.webhook.enabled);
    assert_eq!(
        n.authentication.webhook.cache_ttl,
        KubeDuration::from_secs(10)
    );
    assert_eq!(
        n.authorization.mode,
        crate::config::kubelet_api::AuthorizationMode::AlwaysAllow
    );

    // What keelson cannot honour is refused with its path.
    let err =
        kubelet("enableServer: false\nauthorization:\n  mode: Node\n  webhook:\n    bogus: 1\n")
            .expect_err("refused");
    let paths = err.field_paths();
    for want in [
        "enableServer",
        "authorization.mode",
        "authorization.webhook.bogus",
    ] {
        assert!(
            paths.iter().any(|p| p == want),
            "missing {want} in {paths:?}\n{err}"
        );
    }
}
