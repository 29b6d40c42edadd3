//! The Kubernetes manifests, default configuration and container recipe in
//! `packaging/`: every object decodes into its upstream type with no unknown
//! field, the proxy ClusterRole grants exactly kube-proxy's rights (minus
//! Endpoints), the DaemonSet's pieces fit together (ConfigMap keys, mount
//! paths, probe port, image entrypoint), the configurations pass keelson's
//! own validation, the DaemonSet's kubeconfig really authenticates with a
//! ServiceAccount token file, and the real kubectl applies everything to the
//! test API server (twice: the second run changes nothing).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{ConfigMap, Container, Service, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use keelson::apiclient::{ClientSettings, build_client};
use keelson::config::{Config, ProxyMode};
use keelson_tests::support::repo_root as repo;
use keelson_tests::testapi::{StaticToken, TestApiOptions, TestApiServer};
use kube::Api;
use serde::de::DeserializeOwned;
use serde_json::Value;

/// The placeholder the ConfigMap's kubeconfig carries for the API server.
const ENDPOINT_PLACEHOLDER: &str = "https://CONTROL_PLANE_ENDPOINT:6443";
/// Where the kubelet mounts a pod's ServiceAccount credentials.
const SA_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

fn read(rel: &str) -> String {
    let p = repo().join(rel);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("reading {}: {e}", p.display()))
}

/// The documents of a YAML file, as JSON values.
fn documents(rel: &str) -> Vec<Value> {
    let text = read(rel);
    let mut out = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(&text) {
        let v: serde_yaml::Value =
            serde::Deserialize::deserialize(doc).unwrap_or_else(|e| panic!("{rel}: YAML: {e}"));
        if v.is_null() {
            continue;
        }
        out.push(serde_json::to_value(v).unwrap_or_else(|e| panic!("{rel}: to JSON: {e}")));
    }
    out
}

/// Paths present in `input` but lost by the typed round trip (unknown fields).
fn lost_fields(input: &Value, output: &Value, path: &str, out: &mut Vec<String>) {
    match (input, output) {
        (Value::Object(i), Value::Object(o)) => {
            for (k, v) in i {
                let p = format!("{path}.{k}");
                match o.get(k) {
                    Some(ov) => lost_fields(v, ov, &p, out),
                    None if v.is_null() => {}
                    None => out.push(p),
                }
            }
        }
        (Value::Array(i), Value::Array(o)) => {
            for (n, (iv, ov)) in i.iter().zip(o.iter()).enumerate() {
                lost_fields(iv, ov, &format!("{path}[{n}]"), out);
            }
        }
        (a, b) if a != b => out.push(format!("{path} ({a} became {b})")),
        _ => {}
    }
}

/// Decodes `v` as `T`, failing on any field the upstream type does not have.
fn strict<T: DeserializeOwned + serde::Serialize>(what: &str, v: &Value) -> T {
    let typed: T = serde_json::from_value(v.clone()).unwrap_or_else(|e| panic!("{what}: {e}"));
    let back = serde_json::to_value(&typed).expect("serialize");
    let mut lost = Vec::new();
    lost_fields(v, &back, "", &mut lost);
    assert!(
        lost.is_empty(),
        "{what}: fields unknown to the upstream type: {lost:?}"
    );
    typed
}

fn of_kind<'a>(docs: &'a [Value], kind: &str) -> &'a Value {
    let found: Vec<&Value> = docs.iter().filter(|d| d["kind"] == kind).collect();
    assert_eq!(found.len(), 1, "exactly one {kind} expected");
    found[0]
}

struct ProxyManifests {
    account: ServiceAccount,
    role: ClusterRole,
    binding: ClusterRoleBinding,
    config_map: ConfigMap,
    daemon_set: DaemonSet,
}

fn proxy_manifests() -> ProxyManifests {
    let rbac = documents("packaging/kubernetes/proxy/rbac.yaml");
    assert_eq!(
        rbac.len(),
        3,
        "rbac.yaml: ServiceAccount, ClusterRole, ClusterRoleBinding"
    );
    let cm = documents("packaging/kubernetes/proxy/configmap.yaml");
    let ds = documents("packaging/kubernetes/proxy/daemonset.yaml");
    assert_eq!((cm.len(), ds.len()), (1, 1));
    ProxyManifests {
        account: strict("ServiceAccount", of_kind(&rbac, "ServiceAccount")),
        role: strict("ClusterRole", of_kind(&rbac, "ClusterRole")),
        binding: strict("ClusterRoleBinding", of_kind(&rbac, "ClusterRoleBinding")),
        config_map: strict("ConfigMap", &cm[0]),
        daemon_set: strict("DaemonSet", &ds[0]),
    }
}

/// (apiGroup, resource, verb) triples a set of rules grants.
fn grants(rules: &[k8s_openapi::api::rbac::v1::PolicyRule]) -> BTreeSet<(String, String, String)> {
    let mut out = BTreeSet::new();
    for r in rules {
        assert!(r.resource_names.is_none() && r.non_resource_urls.is_none());
        for g in r.api_groups.iter().flatten() {
            for res in r.resources.iter().flatten() {
                for v in &r.verbs {
                    assert!(g != "*" && res != "*" && v != "*", "no wildcards: {r:?}");
                    out.insert((g.clone(), res.clone(), v.clone()));
                }
            }
        }
    }
    out
}

fn triples(list: &[(&str, &str, &[&str])]) -> BTreeSet<(String, String, String)> {
    list.iter()
        .flat_map(|(g, r, verbs)| {
            verbs
                .iter()
                .map(move |v| (g.to_string(), r.to_string(), v.to_string()))
        })
        .collect()
}

/// Upstream's `system:node-proxier` (plugin/pkg/auth/authorizer/rbac/
/// bootstrappolicy/policy.go): list/watch services and endpoints,
/// get/list/watch nodes, events (core and events.k8s.io) create/update/patch,
/// list/watch endpointslices, and list/watch servicecidrs (behind
/// MultiCIDRServiceAllocator, on by default since it went GA in 1.33).
fn upstream_node_proxier() -> BTreeSet<(String, String, String)> {
    triples(&[
        ("", "services", &["list", "watch"]),
        ("", "endpoints", &["list", "watch"]),
        ("", "nodes", &["get", "list", "watch"]),
        ("", "events", &["create", "update", "patch"]),
        ("events.k8s.io", "events", &["create", "update", "patch"]),
        ("discovery.k8s.io", "endpointslices", &["list", "watch"]),
        ("networking.k8s.io", "servicecidrs", &["list", "watch"]),
    ])
}

fn container(ds: &DaemonSet) -> &Container {
    let spec = ds
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .expect("pod template spec");
    assert_eq!(spec.containers.len(), 1, "one container");
    &spec.containers[0]
}

fn config_from_map(cm: &ConfigMap) -> Config {
    let text = cm
        .data
        .as_ref()
        .and_then(|d| d.get("config.yaml"))
        .expect("ConfigMap key config.yaml");
    Config::from_yaml_str(text).unwrap_or_else(|e| panic!("DaemonSet configuration: {e}"))
}

#[test]
fn proxy_cluster_role_is_kube_proxys_without_endpoints() {
    let m = proxy_manifests();
    let granted = grants(&m.role.rules.clone().unwrap_or_default());
    let mut expected = upstream_node_proxier();
    expected.retain(|(_, r, _)| r != "endpoints");
    assert_eq!(
        granted, expected,
        "keelson-proxy must grant exactly system:node-proxier minus endpoints"
    );
    assert!(granted.is_subset(&upstream_node_proxier()));

    // The binding ties that role to the DaemonSet's ServiceAccount.
    assert_eq!(m.binding.role_ref.kind, "ClusterRole");
    assert_eq!(
        m.binding.role_ref.api_group.as_deref(),
        Some("rbac.authorization.k8s.io")
    );
    assert_eq!(
        Some(&m.binding.role_ref.name),
        m.role.metadata.name.as_ref()
    );
    let subjects = m.binding.subjects.clone().unwrap_or_default();
    assert_eq!(subjects.len(), 1);
    assert_eq!(subjects[0].kind, "ServiceAccount");
    assert_eq!(Some(&subjects[0].name), m.account.metadata.name.as_ref());
    assert_eq!(subjects[0].namespace, m.account.metadata.namespace);
    let pod = m
        .daemon_set
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .expect("pod spec");
    assert_eq!(pod.service_account_name, m.account.metadata.name);
    assert_eq!(
        m.daemon_set.metadata.namespace,
        m.account.metadata.namespace
    );
    assert_eq!(
        m.config_map.metadata.namespace,
        m.account.metadata.namespace
    );
}

#[test]
fn daemon_set_runs_the_proxy_role_beside_kubelet() {
    let m = proxy_manifests();
    let ds = &m.daemon_set;
    let spec = ds.spec.as_ref().expect("spec");
    let pod = spec.template.spec.as_ref().expect("pod spec");
    let labels = spec
        .template
        .metadata
        .as_ref()
        .and_then(|md| md.labels.clone())
        .unwrap_or_default();
    for (k, v) in spec.selector.match_labels.clone().unwrap_or_default() {
        assert_eq!(
            labels.get(&k),
            Some(&v),
            "selector label {k} on the template"
        );
    }
    assert_eq!(pod.host_network, Some(true));
    assert_eq!(
        pod.priority_class_name.as_deref(),
        Some("system-node-critical")
    );
    let tolerate_all =
        pod.tolerations.iter().flatten().any(|t| {
            t.operator.as_deref() == Some("Exists") && t.key.is_none() && t.effect.is_none()
        });
    assert!(tolerate_all, "tolerates every taint");

    let c = container(ds);
    let sc = c.security_context.as_ref().expect("securityContext");
    assert_ne!(
        sc.privileged,
        Some(true),
        "capabilities, not a privileged container"
    );
    let caps: BTreeSet<&str> = sc
        .capabilities
        .as_ref()
        .and_then(|c| c.add.as_ref())
        .map(|a| a.iter().map(String::as_str).collect())
        .unwrap_or_default();
    assert_eq!(caps, BTreeSet::from(["NET_ADMIN", "BPF", "SYS_ADMIN"]));

    // The command: the proxy-only binary's run, the ConfigMap's config,
    // the node's name.
    let cmd = c.command.clone().expect("command");
    assert_eq!(cmd[..2], ["/usr/local/bin/keelson-proxy", "run"]);
    assert!(cmd.contains(&"--node-name=$(NODE_NAME)".to_string()));
    let node_name = c
        .env
        .iter()
        .flatten()
        .find(|e| e.name == "NODE_NAME")
        .and_then(|e| e.value_from.as_ref())
        .and_then(|v| v.field_ref.as_ref())
        .map(|f| f.field_path.clone());
    assert_eq!(node_name.as_deref(), Some("spec.nodeName"));
    let config_arg = cmd
        .iter()
        .find_map(|a| a.strip_prefix("--config="))
        .expect("--config=FILE");
    let mount_of = |volume: &str| -> String {
        c.volume_mounts
            .iter()
            .flatten()
            .find(|vm| vm.name == volume)
            .map(|vm| vm.mount_path.clone())
            .unwrap_or_else(|| panic!("volume {volume} is mounted"))
    };
    let volume = |name: &str| {
        pod.volumes
            .iter()
            .flatten()
            .find(|v| v.name == name)
            .unwrap_or_else(|| panic!("volume {name}"))
    };
    let config_dir = mount_of("config");
    assert_eq!(
        volume("config").config_map.as_ref().map(|c| c.name.clone()),
        m.config_map.metadata.name
    );
    let data = m.config_map.data.clone().unwrap_or_default();
    let key = Path::new(config_arg)
        .strip_prefix(&config_dir)
        .expect("--config lies in the ConfigMap mount")
        .display()
        .to_string();
    assert!(data.contains_key(&key), "ConfigMap has key {key}");

    // The configuration it reads: proxy only, kubelet's ports left alone,
    // its kubeconfig in the same ConfigMap, mounts where eBPF mode looks.
    let cfg = config_from_map(&m.config_map);
    assert!(cfg.proxy.enabled && !cfg.node.enabled);
    assert_eq!(
        cfg.effective_healthz_bind_address(),
        None,
        "kubelet owns 127.0.0.1:10248"
    );
    let kubeconfig = cfg
        .proxy
        .client_connection
        .kubeconfig
        .clone()
        .expect("kubeconfig");
    let kkey = kubeconfig
        .strip_prefix(&config_dir)
        .expect("kubeconfig lies in the ConfigMap mount")
        .display()
        .to_string();
    assert!(data.contains_key(&kkey), "ConfigMap has key {kkey}");
    let bpffs = mount_of("bpffs");
    assert!(
        cfg.proxy.ebpf.bpffs_path.starts_with(&bpffs),
        "bpffsPath below the bpffs mount"
    );
    assert_eq!(
        volume("bpffs").host_path.as_ref().map(|h| h.path.as_str()),
        Some("/sys/fs/bpf")
    );
    let cgroup = cfg.proxy.ebpf.cgroup_path.clone().expect("ebpf.cgroupPath");
    assert!(
        cgroup.starts_with(mount_of("host-cgroup")),
        "cgroupPath below the host cgroup mount"
    );
    assert_eq!(
        volume("host-cgroup")
            .host_path
            .as_ref()
            .map(|h| h.path.as_str()),
        Some("/sys/fs/cgroup")
    );
    for m in c.volume_mounts.iter().flatten() {
        assert!(
            pod.volumes.iter().flatten().any(|v| v.name == m.name),
            "mount {} has a volume",
            m.name
        );
    }

    // Liveness on the proxy health server's /livez (its /healthz also fails
    // while the node is being deleted, which must not restart the proxy).
    let probe = c
        .liveness_probe
        .as_ref()
        .and_then(|p| p.http_get.as_ref())
        .expect("liveness httpGet");
    assert_eq!(probe.path.as_deref(), Some("/livez"));
    let port = cfg
        .proxy
        .healthz_bind_address
        .rsplit(':')
        .next()
        .and_then(|p| p.parse::<i32>().ok())
        .expect("proxy.healthzBindAddress has a port");
    assert_eq!(
        probe.port,
        k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(port)
    );
    assert!(
        cfg.proxy.healthz_bind_address.starts_with("0.0.0.0:"),
        "probe reaches it on the node IP"
    );
}

#[test]
fn config_map_kubeconfig_authenticates_with_the_service_account_token() {
    let m = proxy_manifests();
    let data = m.config_map.data.clone().unwrap_or_default();
    let text = data.get("kubeconfig.conf").expect("kubeconfig.conf");
    let kc = kube::config::Kubeconfig::from_yaml(text).expect("kubeconfig parses");
    let cluster = kc.clusters[0].cluster.as_ref().expect("cluster");
    assert_eq!(cluster.server.as_deref(), Some(ENDPOINT_PLACEHOLDER));
    assert_eq!(
        cluster.certificate_authority.as_deref(),
        Some(format!("{SA_DIR}/ca.crt").as_str())
    );
    let user = kc.auth_infos[0].auth_info.as_ref().expect("user");
    assert_eq!(
        user.token_file.as_deref(),
        Some(format!("{SA_DIR}/token").as_str())
    );

    // The same kubeconfig with the documented substitution, the token and
    // CA files where a pod would have them: the proxy's client authenticates
    // as the ServiceAccount and reads Services.
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let api = TestApiServer::start(TestApiOptions {
            tokens: vec![StaticToken {
                token: "sa-token".into(),
                user: "system:serviceaccount:kube-system:keelson-proxy".into(),
            }],
            ..TestApiOptions::default()
        })
        .await
        .expect("test API server");
        let dir = tempfile::tempdir().expect("tempdir");
        let sa = dir.path().join("sa");
        std::fs::create_dir_all(&sa).expect("mkdir");
        std::fs::write(sa.join("ca.crt"), api.ca_pem()).expect("ca");
        std::fs::write(sa.join("token"), "sa-token").expect("token");
        let rendered = text
            .replace(ENDPOINT_PLACEHOLDER, &api.https_url())
            .replace(SA_DIR, &sa.display().to_string());
        let path = dir.path().join("kubeconfig.conf");
        std::fs::write(&path, rendered).expect("kubeconfig");
        let client = build_client(&ClientSettings {
            kubeconfig: Some(&path),
            qps: 5.0,
            burst: 10,
            role: "proxy",
        })
        .await
        .expect("client from the DaemonSet kubeconfig");
        let services = Api::<Service>::all(client)
            .list(&Default::default())
            .await
            .expect("list services");
        assert!(
            services
                .items
                .iter()
                .any(|s| s.metadata.name.as_deref() == Some("kubernetes"))
        );
        let users: BTreeSet<String> = api
            .knobs()
            .requests()
            .into_iter()
            .filter(|r| r.resource == "services")
            .map(|r| r.user)
            .collect();
        assert_eq!(
            users,
            BTreeSet::from(["system:serviceaccount:kube-system:keelson-proxy".to_string()])
        );
    });
}

#[test]
fn default_systemd_config_is_valid_with_two_identities() {
    let cfg = Config::from_yaml_str(&read("packaging/config.yaml"))
        .expect("packaging/config.yaml is valid");
    assert!(cfg.node.enabled && cfg.proxy.enabled);
    assert_eq!(cfg.proxy.mode, ProxyMode::Nftables);
    let node = cfg.node.kubeconfig.clone().expect("node.kubeconfig");
    let proxy = cfg
        .proxy
        .client_connection
        .kubeconfig
        .clone()
        .expect("proxy kubeconfig");
    assert_ne!(node, proxy, "each role has its own identity");
    for p in [&node, &proxy] {
        assert!(
            p.starts_with("/etc/keelson"),
            "{} under /etc/keelson",
            p.display()
        );
    }
    assert_eq!(cfg.node.root_dir, Path::new("/var/lib/keelson"));
    // The same defaults as without a file, apart from what it sets on purpose.
    let defaults = Config::default();
    assert_eq!(cfg.healthz_bind_address, defaults.healthz_bind_address);
    assert_eq!(cfg.metrics_bind_address, defaults.metrics_bind_address);
    assert_eq!(
        cfg.node.container_runtime_endpoint,
        defaults.node.container_runtime_endpoint
    );

    // The unit starts keelson with this file where install.sh puts it.
    let unit = read("packaging/keelson.service");
    let exec = unit
        .lines()
        .find_map(|l| l.strip_prefix("ExecStart="))
        .expect("ExecStart");
    assert_eq!(
        exec,
        "/usr/local/bin/keelson run --config /etc/keelson/config.yaml"
    );
    for line in [
        "Type=notify",
        "Restart=always",
        "KillMode=process",
        "Delegate=yes",
        "After=network-online.target containerd.service",
        "Wants=network-online.target containerd.service",
    ] {
        assert!(
            unit.lines().any(|l| l == line),
            "keelson.service has {line}"
        );
    }
    let timeout: u64 = unit
        .lines()
        .find_map(|l| l.strip_prefix("TimeoutStopSec="))
        .and_then(|v| v.parse().ok())
        .expect("TimeoutStopSec");
    assert!(
        timeout > cfg.shutdown_timeout.get().as_secs(),
        "systemd waits longer than keelson's own shutdown"
    );
}

#[test]
fn node_rbac_binds_the_nodes_group_to_upstreams_node_role() {
    let docs = documents("packaging/kubernetes/node/rbac-without-node-authorizer.yaml");
    assert_eq!(docs.len(), 1);
    let b: ClusterRoleBinding = strict("ClusterRoleBinding", &docs[0]);
    assert_eq!(b.role_ref.name, "system:node");
    let subjects = b.subjects.unwrap_or_default();
    assert_eq!(subjects.len(), 1);
    assert_eq!(
        (subjects[0].kind.as_str(), subjects[0].name.as_str()),
        ("Group", "system:nodes")
    );
}

/// One stage of a Containerfile: its base, name and instructions.
#[derive(Debug)]
struct Stage {
    from: String,
    name: Option<String>,
    instructions: Vec<(String, String)>,
}

/// Splits a Containerfile into stages (continuation lines joined, comments dropped).
fn stages(text: &str) -> Vec<Stage> {
    let mut logical = Vec::new();
    let mut cur = String::new();
    for line in text.lines() {
        let t = line.trim();
        if t.starts_with('#') || (t.is_empty() && cur.is_empty()) {
            continue;
        }
        if let Some(head) = t.strip_suffix('\\') {
            cur.push_str(head);
            cur.push(' ');
        } else {
            cur.push_str(t);
            logical.push(std::mem::take(&mut cur));
        }
    }
    let mut out: Vec<Stage> = Vec::new();
    for l in logical {
        let (op, rest) = l.split_once(' ').unwrap_or((l.as_str(), ""));
        let op = op.to_uppercase();
        if op == "FROM" {
            let words: Vec<&str> = rest.split_whitespace().collect();
            let name = match words.as_slice() {
                [_, as_, n] if as_.eq_ignore_ascii_case("as") => Some(n.to_string()),
                [_] => None,
                other => panic!("unexpected FROM {other:?}"),
            };
            out.push(Stage {
                from: words[0].to_string(),
                name,
                instructions: Vec::new(),
            });
        } else if op == "ARG" && out.is_empty() {
            continue;
        } else {
            let stage = out.last_mut().expect("instruction before FROM");
            stage.instructions.push((op, rest.trim().to_string()));
        }
    }
    out
}

#[test]
fn containerfile_builds_a_static_keelson_proxy_with_nft_and_nothing_else() {
    let text = read("packaging/Containerfile");
    let st = stages(&text);
    assert_eq!(st.len(), 3, "build, nft and the image: {st:#?}");
    let names: Vec<&str> = st.iter().filter_map(|s| s.name.as_deref()).collect();
    let last = st.last().expect("final stage");
    assert_eq!(
        last.from, "scratch",
        "no shell, no package manager in the image"
    );
    for s in &st {
        for (op, args) in &s.instructions {
            if op == "COPY"
                && let Some(from) = args
                    .split_whitespace()
                    .find_map(|w| w.strip_prefix("--from="))
            {
                assert!(names.contains(&from), "COPY --from={from} names a stage");
            }
        }
    }
    let entry = last
        .instructions
        .iter()
        .find(|(op, _)| op == "ENTRYPOINT")
        .map(|(_, a)| serde_json::from_str::<Vec<String>>(a).expect("ENTRYPOINT in exec form"))
        .expect("ENTRYPOINT");
    let cmd = last
        .instructions
        .iter()
        .find(|(op, _)| op == "CMD")
        .map(|(_, a)| serde_json::from_str::<Vec<String>>(a).expect("CMD in exec form"))
        .expect("CMD");
    let m = proxy_manifests();
    let ds_cmd = container(&m.daemon_set).command.clone().expect("command");
    assert_eq!(
        entry,
        vec![ds_cmd[0].clone()],
        "the DaemonSet runs the image's binary"
    );
    assert_eq!(cmd[0], "run");
    assert!(
        cmd.iter().any(|a| a.starts_with("--config=")),
        "the image's command names its configuration: {cmd:?}"
    );

    // The build stage: a release build of keelson-proxy against musl,
    // with the packages the build needs (the same ones scripts/install-deps
    // installs for a host build).
    let build = st
        .iter()
        .find(|s| s.name.as_deref() == Some("build"))
        .expect("build stage");
    let runs: String = build
        .instructions
        .iter()
        .filter(|(op, _)| op == "RUN")
        .map(|(_, a)| a.as_str())
        .collect::<Vec<_>>()
        .join("\n");
    assert!(
        runs.contains("cargo build --release --locked -p keelson --bin keelson-proxy --target")
    );
    assert!(runs.contains("unknown-linux-musl"));
    let deps = read("scripts/install-deps");
    for pkg in ["protobuf-compiler", "clang", "llvm", "libbpf-dev"] {
        assert!(runs.contains(pkg), "build stage installs {pkg}");
        assert!(
            deps.contains(pkg),
            "scripts/install-deps installs {pkg} too"
        );
    }
    let nft = st
        .iter()
        .find(|s| s.name.as_deref() == Some("nft"))
        .expect("nft stage");
    assert!(nft.from.starts_with("debian:"), "nft comes from Debian");
    let ignore = read("packaging/Containerfile.dockerignore");
    assert!(
        ignore.lines().any(|l| l.trim() == "target/"),
        "the build context leaves target/ out"
    );
}

/// The nft stage's collection step, run on this (Debian) host into a temp
/// dir: nft then runs chrooted there with nothing but what it copied.
#[test]
fn containerfile_nft_stage_collects_a_working_nft() {
    if !keelson_tests::support::require_root("containerfile_nft_stage_collects_a_working_nft") {
        return;
    }
    let text = read("packaging/Containerfile");
    let st = stages(&text);
    let nft = st
        .iter()
        .find(|s| s.name.as_deref() == Some("nft"))
        .expect("nft stage");
    let collect = nft
        .instructions
        .iter()
        .filter(|(op, _)| op == "RUN")
        .map(|(_, a)| a)
        .find(|a| a.contains("ldd"))
        .expect("a RUN collecting nft's libraries");
    let out = tempfile::tempdir().expect("tempdir");
    let outdir = out.path().display().to_string();
    // Only the copy: the chroot check is what this test does itself.
    let script = collect
        .split("&& chroot")
        .next()
        .expect("script")
        .replace("/out", &outdir);
    let status = std::process::Command::new("sh")
        .arg("-ec")
        .arg(&script)
        .stdin(Stdio::null())
        .status()
        .expect("sh runs");
    assert!(status.success(), "collection step failed: {script}");
    // In a fresh network namespace so the ruleset listed is not the host's.
    let run = std::process::Command::new("unshare")
        .args(["--net", "chroot", &outdir, "/usr/sbin/nft", "--version"])
        .output()
        .expect("chroot runs");
    assert!(
        run.status.success(),
        "nft in the collected tree: {}",
        String::from_utf8_lossy(&run.stderr)
    );
    assert!(String::from_utf8_lossy(&run.stdout).starts_with("nftables v"));
    let list = std::process::Command::new("unshare")
        .args([
            "--net",
            "chroot",
            &outdir,
            "/usr/sbin/nft",
            "list",
            "ruleset",
        ])
        .output()
        .expect("chroot runs");
    assert!(
        list.status.success(),
        "{}",
        String::from_utf8_lossy(&list.stderr)
    );
}

struct Kubectl {
    kubeconfig: PathBuf,
    cache: tempfile::TempDir,
}

impl Kubectl {
    fn run(&self, args: &[&str], stdin: Option<&str>) -> Result<String, String> {
        use std::io::Write;
        let mut child = std::process::Command::new("kubectl")
            .env("KUBECONFIG", &self.kubeconfig)
            .arg("--cache-dir")
            .arg(self.cache.path())
            .arg("--request-timeout=20s")
            .args(args)
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("kubectl: {e}"))?;
        if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
            pipe.write_all(text.as_bytes()).map_err(|e| e.to_string())?;
        }
        let out = child.wait_with_output().map_err(|e| e.to_string())?;
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        if out.status.success() {
            Ok(stdout)
        } else {
            Err(format!(
                "kubectl {args:?}: {stdout}{}",
                String::from_utf8_lossy(&out.stderr)
            ))
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_applies_every_manifest_and_a_second_apply_changes_nothing() {
    let api = TestApiServer::start(TestApiOptions::default())
        .await
        .expect("test API server");
    let k = Kubectl {
        kubeconfig: api.kubeconfig_path().to_path_buf(),
        cache: tempfile::tempdir().expect("cache"),
    };
    let dir = repo().join("packaging/kubernetes");
    let proxy_dir = dir.join("proxy").display().to_string();
    let node_rbac = dir
        .join("node/rbac-without-node-authorizer.yaml")
        .display()
        .to_string();
    let k2 = Kubectl {
        kubeconfig: k.kubeconfig.clone(),
        cache: tempfile::tempdir().expect("cache"),
    };
    let applied = tokio::task::spawn_blocking(move || {
        let first = k2.run(&["apply", "-f", &proxy_dir, "-f", &node_rbac], None)?;
        let second = k2.run(&["apply", "-f", &proxy_dir, "-f", &node_rbac], None)?;
        // The documented way to set the control plane endpoint.
        let server = k2.run(
            &[
                "config",
                "view",
                "--minify",
                "-o",
                "jsonpath={.clusters[0].cluster.server}",
            ],
            None,
        )?;
        Ok::<_, String>((first, second, server))
    })
    .await
    .expect("join");
    let (first, second, server) = applied.unwrap_or_else(|e| panic!("{e}"));
    let created: Vec<&str> = first.lines().filter(|l| l.ends_with(" created")).collect();
    assert_eq!(created.len(), 6, "every object created: {first}");
    let unchanged: Vec<&str> = second
        .lines()
        .filter(|l| l.ends_with(" unchanged"))
        .collect();
    assert_eq!(
        unchanged.len(),
        6,
        "the second apply changes nothing: {second}"
    );

    let configmap =
        read("packaging/kubernetes/proxy/configmap.yaml").replace(ENDPOINT_PLACEHOLDER, &server);
    let out = tokio::task::spawn_blocking(move || k.run(&["apply", "-f", "-"], Some(&configmap)))
        .await
        .expect("join")
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(out.contains("configmap/keelson-proxy configured"), "{out}");

    let client = api.client().await;
    let stored: DaemonSet = Api::namespaced(client.clone(), "kube-system")
        .get("keelson-proxy")
        .await
        .expect("DaemonSet stored");
    let m = proxy_manifests();
    assert_eq!(
        stored.spec.as_ref().map(|s| &s.template),
        m.daemon_set.spec.as_ref().map(|s| &s.template)
    );
    let role: ClusterRole = Api::all(client.clone())
        .get("keelson-proxy")
        .await
        .expect("ClusterRole");
    assert_eq!(role.rules, m.role.rules);
    let cm: ConfigMap = Api::namespaced(client, "kube-system")
        .get("keelson-proxy")
        .await
        .expect("ConfigMap");
    let kc = cm
        .data
        .as_ref()
        .and_then(|d| d.get("kubeconfig.conf"))
        .expect("kubeconfig.conf");
    assert!(kc.contains(&format!("server: {}", api.https_url())), "{kc}");
    // Nothing kubectl asked for was refused or unknown.
    let refused: Vec<String> = api
        .knobs()
        .requests()
        .into_iter()
        .filter(|r| r.status >= 400 && r.status != 404)
        .map(|r| format!("{} {} -> {}", r.method, r.path, r.status))
        .collect();
    assert!(refused.is_empty(), "{refused:?}");
}
