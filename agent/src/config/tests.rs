use super::*;

const HEADER: &str = "apiVersion: keelson.dev/v1alpha1\nkind: KeelsonConfiguration\n";

fn parse(body: &str) -> Result<Config, ConfigError> {
    Config::from_yaml_str(&format!("{HEADER}{body}"))
}

#[test]
fn empty_file_means_defaults() {
    let cfg = Config::from_yaml_str("").expect("defaults valid");
    assert_eq!(cfg, Config::default());
    assert_eq!(cfg.node.max_pods, 110);
    assert_eq!(cfg.node.node_lease_duration_seconds, 40);
    assert_eq!(cfg.proxy.min_sync_period, KubeDuration::from_secs(1));
    assert_eq!(cfg.proxy.mode, ProxyMode::Nftables);
}

#[test]
fn effective_config_round_trips() {
    let cfg = parse("node:\n  maxPods: 20\n  clusterDNS: [10.96.0.10]\nproxy:\n  mode: ebpf\n")
        .expect("valid");
    let again = Config::from_yaml_str(&cfg.to_yaml()).expect("printed config parses");
    assert_eq!(cfg, again);
    assert!(cfg.to_yaml().contains("nodeStatusUpdateFrequency: 10s"));
}

#[test]
fn unknown_field_names_its_path() {
    let err = parse("node:\n  maxPod: 3\n").expect_err("unknown field");
    assert_eq!(err.field_paths(), vec!["node.maxPod".to_string()]);
    assert!(err.to_string().contains("unknown field"), "{err}");
}

#[test]
fn wrong_type_names_its_path() {
    let err = parse("node:\n  maxPods: lots\n").expect_err("wrong type");
    assert_eq!(err.field_paths(), vec!["node.maxPods".to_string()]);
}

#[test]
fn negative_duration_names_its_path() {
    let err = parse("node:\n  nodeStatusUpdateFrequency: -10s\n").expect_err("negative");
    assert_eq!(
        err.field_paths(),
        vec!["node.nodeStatusUpdateFrequency".to_string()]
    );
    assert!(err.to_string().contains("negative"), "{err}");
}

#[test]
fn invalid_values_are_all_reported() {
    let err = parse(
        "node:\n  maxPods: 0\n  imageGCLowThresholdPercent: 90\n  evictionHard:\n    memory.available: 10Qi\nproxy:\n  nodePortAddresses: [bogus]\n  nftables:\n    masqueradeBit: 40\n",
    )
    .expect_err("invalid");
    let paths = err.field_paths();
    for want in [
        "node.maxPods",
        "node.imageGCLowThresholdPercent",
        "node.evictionHard[\"memory.available\"]",
        "proxy.nodePortAddresses[0]",
        "proxy.nftables.masqueradeBit",
    ] {
        assert!(
            paths.iter().any(|p| p == want),
            "missing {want} in {paths:?}"
        );
    }
}

#[test]
fn wrong_kind_is_refused() {
    let err =
        Config::from_yaml_str("apiVersion: v1\nkind: KubeletConfiguration\n").expect_err("kind");
    assert_eq!(
        err.field_paths(),
        vec!["apiVersion".to_string(), "kind".to_string()]
    );
}

#[test]
fn overrides_win() {
    let mut cfg = Config::default();
    cfg.apply_overrides(&Overrides {
        kubeconfig: Some("/tmp/kc".into()),
        node_name: Some("n1".into()),
        proxy_only: true,
        ..Overrides::default()
    })
    .expect("valid");
    assert!(!cfg.node.enabled && cfg.proxy.enabled);
    assert_eq!(cfg.effective_node_name(), "n1");
    assert_eq!(
        cfg.proxy.client_connection.kubeconfig.as_deref(),
        Some(Path::new("/tmp/kc"))
    );
    // With --proxy-only, --kubeconfig is kube-proxy's flag; otherwise kubelet's.
    assert_eq!(cfg.node.kubeconfig, None);
    let mut cfg = Config::default();
    cfg.apply_overrides(&Overrides {
        kubeconfig: Some("/tmp/node".into()),
        proxy_kubeconfig: Some("/tmp/proxy".into()),
        ..Overrides::default()
    })
    .expect("valid");
    assert_eq!(cfg.node.kubeconfig.as_deref(), Some(Path::new("/tmp/node")));
    assert_eq!(
        cfg.proxy.client_connection.kubeconfig.as_deref(),
        Some(Path::new("/tmp/proxy"))
    );
}

#[test]
fn node_name_must_be_dns() {
    let err = parse("nodeName: Bad_Name\n").expect_err("bad name");
    assert_eq!(err.field_paths(), vec!["nodeName".to_string()]);
}

#[test]
fn soft_eviction_requires_grace_period() {
    let err = parse("node:\n  evictionSoft:\n    memory.available: 1Gi\n").expect_err("no grace");
    assert_eq!(
        err.field_paths(),
        vec!["node.evictionSoftGracePeriod[\"memory.available\"]".to_string()]
    );
    parse("node:\n  evictionSoft:\n    memory.available: 1Gi\n  evictionSoftGracePeriod:\n    memory.available: 1m30s\n")
        .expect("valid soft threshold");
}

#[test]
fn both_cgroup_drivers_are_valid() {
    let cfg = parse("node:\n  cgroupDriver: systemd\n").expect("systemd is valid");
    assert_eq!(cfg.node.cgroup_driver, CgroupDriver::Systemd);
    let cfg = parse("node:\n  cgroupDriver: cgroupfs\n").expect("cgroupfs is valid");
    assert_eq!(cfg.node.cgroup_driver, CgroupDriver::Cgroupfs);
    let err = parse("node:\n  cgroupDriver: docker\n").expect_err("unknown driver");
    assert!(err.to_string().contains("cgroupDriver"), "{err}");
}

#[test]
fn separate_image_service_endpoint_is_refused() {
    let err = parse("node:\n  imageServiceEndpoint: unix:///run/other.sock\n")
        .expect_err("separate image service");
    assert_eq!(
        err.field_paths(),
        vec!["node.imageServiceEndpoint".to_string()]
    );
    assert!(err.to_string().contains("not supported"), "{err}");
    // Empty or the runtime endpoint itself means "the runtime serves images".
    parse("node:\n  imageServiceEndpoint: \"\"\n").expect("empty is valid");
    parse("node:\n  containerRuntimeEndpoint: unix:///run/crio.sock\n  imageServiceEndpoint: unix:///run/crio.sock\n")
        .expect("same endpoint is valid");
}

#[test]
fn register_with_taints_keeps_the_taint_shape() {
    let cfg = parse(
        "node:\n  registerWithTaints:\n  - key: dedicated\n    value: infra\n    effect: NoSchedule\n  - key: gpu\n    effect: NoExecute\n    timeAdded: \"2026-01-02T03:04:05Z\"\n",
    )
    .expect("valid taints");
    let taints = &cfg.node.register_with_taints;
    assert_eq!(taints.len(), 2);
    assert_eq!(taints[0].key, "dedicated");
    assert_eq!(taints[0].value.as_deref(), Some("infra"));
    assert_eq!(taints[0].effect, "NoSchedule");
    assert_eq!(taints[1].value, None);
    assert!(taints[1].time_added.is_some());
    let again = Config::from_yaml_str(&cfg.to_yaml()).expect("printed config parses");
    assert_eq!(cfg, again);
}

#[test]
fn register_with_taints_refuses_unknown_item_fields() {
    let err = parse(
        "node:\n  registerWithTaints:\n  - key: dedicated\n    effect: NoSchedule\n    operator: Exists\n",
    )
    .expect_err("unknown taint field");
    assert_eq!(
        err.field_paths(),
        vec!["node.registerWithTaints[0].operator".to_string()]
    );
    assert!(err.to_string().contains("unknown field"), "{err}");
}

#[test]
fn proxy_only_leaves_kubelets_health_port_alone() {
    let mut both = Config::default();
    assert_eq!(
        both.effective_healthz_bind_address(),
        Some("127.0.0.1:10248")
    );
    both.apply_overrides(&Overrides {
        proxy_only: true,
        ..Overrides::default()
    })
    .expect("valid");
    assert_eq!(both.effective_healthz_bind_address(), None);
    assert_eq!(both.proxy.healthz_bind_address, "0.0.0.0:10256");

    let explicit =
        parse("healthzBindAddress: 127.0.0.1:10300\nnode:\n  enabled: false\n").expect("valid");
    assert_eq!(
        explicit.effective_healthz_bind_address(),
        Some("127.0.0.1:10300")
    );
    let disabled = parse("healthzBindAddress: \"\"\n").expect("valid");
    assert_eq!(disabled.effective_healthz_bind_address(), Some(""));
}

#[test]
fn housekeeping_interval_defaults_to_ten_seconds_and_is_at_least_one() {
    assert_eq!(
        Config::default().node.housekeeping_interval,
        KubeDuration::from_secs(10)
    );
    let cfg = parse("node:\n  housekeepingInterval: 2s\n").expect("valid");
    assert_eq!(cfg.node.housekeeping_interval, KubeDuration::from_secs(2));
    let err = parse("node:\n  housekeepingInterval: 500ms\n").expect_err("too short");
    assert_eq!(
        err.field_paths(),
        vec!["node.housekeepingInterval".to_string()]
    );
}
