//! Shared by the pod lifecycle component tests: a test API server, a fake
//! CRI runtime, a fake cgroup v2 tree and keelson's pod lifecycle
//! (`keelson::node::pods::start`) running in-process against them, plus
//! helpers to create pods and wait for their status.
//!
//! With `paused` time the lifecycle's clock follows tokio's paused clock and
//! the fake runtime's timestamps follow it too, so backoffs of minutes run
//! in milliseconds.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Event, Node, Pod};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use keelson::config::NodeConfig;
use keelson::events::EventRecorder;
use keelson::node::cgroups::v2::V2;
use keelson::node::pods::clock::{Clock, SharedClock, TokioClock, to_nanos};
use keelson::node::pods::deps::{ApiEnvSources, NoVolumes};
use keelson::node::pods::{PodsDeps, PodsHandle};
use keelson_cri::fake::{FakeConfig, FakeRuntime};
use keelson_cri::{ClientConfig, RuntimeClient};
use keelson_tests::support::wait_for;
use keelson_tests::testapi::{TestApiOptions, TestApiServer};
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams};
use serde_json::json;
use tokio_util::sync::CancellationToken;

/// The image every test pod uses (present in the fake runtime).
pub const IMAGE: &str = "keelson.local/busybox:1";

/// Edits the node settings of a world before it starts.
pub type Configure = Box<dyn Fn(&mut NodeConfig) + Send + Sync>;

/// How a world is set up.
#[derive(Default)]
pub struct Options {
    /// Follow tokio's paused clock (the test must use `start_paused`).
    pub paused: bool,
    /// Run probes.
    pub probes: bool,
    /// Fake runtime settings.
    pub fake: FakeConfig,
    /// Edits the node settings.
    pub configure: Option<Configure>,
    /// Pod admission.
    pub admit: Option<keelson::node::pods::AdmitFn>,
    /// Edits the Node's status (allocatable, features) before start.
    pub node_status: Option<NodeStatusEdit>,
    /// Edits the Node object (labels, taints) before it is created.
    pub node_object: Option<NodeStatusEdit>,
}

/// One test's world. Dropping it stops the lifecycle, the runtime and the
/// API server and removes the temporary directory.
pub struct World {
    pub stop: CancellationToken,
    pub handle: PodsHandle,
    pub admin: kube::Client,
    pub fake: Arc<FakeRuntime>,
    pub api: TestApiServer,
    pub node: String,
    pub registry: prometheus::Registry,
    pub config: NodeConfig,
    pub clock: SharedClock,
    pub dir: tempfile::TempDir,
    pub cgroup_root: PathBuf,
    pub ns: String,
    pub admit: Option<keelson::node::pods::AdmitFn>,
}

impl Drop for World {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// A plain-HTTP client of the test API server (no TLS: cheaper, and
/// well-behaved under paused time).
pub async fn http_client(api: &TestApiServer) -> kube::Client {
    let cfg = kube::Config::new(api.http_url().parse().unwrap());
    kube::Client::try_from(cfg).unwrap()
}

/// The allocatable resources the tests' node reports.
pub fn allocatable() -> BTreeMap<String, Quantity> {
    BTreeMap::from([
        ("cpu".to_string(), Quantity("4".into())),
        ("memory".to_string(), Quantity("8Gi".into())),
        ("ephemeral-storage".to_string(), Quantity("100Gi".into())),
        ("pods".to_string(), Quantity("110".into())),
    ])
}

fn allocatable_json() -> serde_json::Value {
    serde_json::to_value(allocatable()).unwrap()
}

/// Edits the Node's status (JSON) before the lifecycle starts.
pub type NodeStatusEdit = Box<dyn Fn(&mut serde_json::Value) + Send + Sync>;

#[allow(clippy::too_many_arguments)]
async fn start_lifecycle(
    admin: &kube::Client,
    fake: &FakeRuntime,
    node: &str,
    config: &NodeConfig,
    registry: &prometheus::Registry,
    cgroup_root: &std::path::Path,
    clock: SharedClock,
    probes: bool,
    admit: Option<keelson::node::pods::AdmitFn>,
    stop: CancellationToken,
) -> PodsHandle {
    let recorder = EventRecorder::start(admin.clone(), "kubelet", node, registry);
    let cri = RuntimeClient::new_lazy(
        &fake.endpoint(),
        ClientConfig::with_request_timeout(Duration::from_secs(120)),
    )
    .unwrap();
    keelson::node::pods::start(
        PodsDeps {
            client: admin.clone(),
            cri,
            node_name: node.to_string(),
            config: config.clone(),
            registry: registry.clone(),
            recorder: Some(recorder),
            volumes: Arc::new(NoVolumes::new(config.root_dir.clone())),
            env: Arc::new(ApiEnvSources::new(admin.clone())),
            allocatable: Arc::new(allocatable),
            cgroups: Some(Arc::new(V2::new(cgroup_root))),
            systemd_bus: None,
            clock: Some(clock),
            node_ips: vec!["192.168.50.1".parse().unwrap()],
            network: None,
            services: None,
            probes,
            probe_config: keelson_probes::ProbeManagerConfig {
                random_start_offset: false,
                ..Default::default()
            },
            admit,
            shutdown_admit: None,
            node: None,
            devices: None,
        },
        stop,
    )
    .await
    .unwrap()
}

impl World {
    /// Stops the pod lifecycle (as when keelson exits) and starts a new one
    /// against the same API server and runtime (as when it starts again).
    pub async fn restart(&mut self, probes: bool) {
        self.stop.cancel();
        // Let the old tasks see the cancellation.
        tokio::time::sleep(Duration::from_millis(200)).await;
        self.stop = CancellationToken::new();
        self.registry = prometheus::Registry::new();
        self.handle = start_lifecycle(
            &self.admin,
            &self.fake,
            &self.node,
            &self.config,
            &self.registry,
            &self.cgroup_root,
            self.clock.clone(),
            probes,
            self.admit.clone(),
            self.stop.clone(),
        )
        .await;
    }

    /// A world with default options.
    pub async fn new() -> World {
        Self::with(Options::default()).await
    }

    /// A world set up by `opts`.
    pub async fn with(opts: Options) -> World {
        let dir = tempfile::Builder::new()
            .prefix("keelson-pods-")
            .tempdir()
            .unwrap();
        let api = TestApiServer::start(TestApiOptions::default())
            .await
            .unwrap();
        let admin = http_client(&api).await;
        let node = format!("node-{}", keelson_tests::netns::unique_suffix());
        let mut node_json = json!({
            "metadata": {"name": node, "labels": {
                "kubernetes.io/hostname": node, "kubernetes.io/os": "linux"}},
        });
        if let Some(f) = &opts.node_object {
            f(&mut node_json);
        }
        let node_obj: Node = serde_json::from_value(node_json).unwrap();
        Api::<Node>::all(admin.clone())
            .create(&PostParams::default(), &node_obj)
            .await
            .unwrap();
        // The status the node role would report: admission fits pods
        // against its allocatable.
        let mut status = json!({
            "status": {"addresses": [{"type": "InternalIP", "address": "192.168.50.1"}],
                       "capacity": allocatable_json(), "allocatable": allocatable_json()}
        });
        if let Some(f) = &opts.node_status {
            f(&mut status["status"]);
        }
        Api::<Node>::all(admin.clone())
            .patch_status(
                &node,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(&status),
            )
            .await
            .unwrap();
        let fake = Arc::new(
            FakeRuntime::start_with(dir.path().join("cri.sock"), opts.fake)
                .await
                .unwrap(),
        );
        fake.add_image(IMAGE);
        let clock: SharedClock = if opts.paused {
            let c = TokioClock::new();
            // The fake runtime stamps times with the same clock.
            fake.clock().set(to_nanos(c.now()));
            let f = fake.clone();
            tokio::spawn(async move {
                loop {
                    f.clock().set(to_nanos(c.now()));
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            });
            Arc::new(c)
        } else {
            Arc::new(keelson::node::pods::clock::WallClock)
        };
        let cgroup_root = dir.path().join("cgroup");
        std::fs::create_dir_all(&cgroup_root).unwrap();
        std::fs::write(
            cgroup_root.join("cgroup.controllers"),
            "cpuset cpu io memory pids",
        )
        .unwrap();
        let resolv = dir.path().join("resolv.conf");
        std::fs::write(&resolv, "nameserver 10.0.0.53\nsearch example.internal\n").unwrap();
        let mut config = NodeConfig {
            root_dir: dir.path().join("root"),
            pod_logs_dir: dir.path().join("logs/pods"),
            container_runtime_endpoint: fake.endpoint(),
            cluster_dns: vec!["10.96.0.10".parse().unwrap()],
            cluster_domain: "cluster.local".into(),
            resolv_conf: resolv,
            ..NodeConfig::default()
        };
        if let Some(f) = &opts.configure {
            f(&mut config);
        }
        let registry = prometheus::Registry::new();
        let stop = CancellationToken::new();
        let handle = start_lifecycle(
            &admin,
            &fake,
            &node,
            &config,
            &registry,
            &cgroup_root,
            clock.clone(),
            opts.probes,
            opts.admit.clone(),
            stop.clone(),
        )
        .await;
        World {
            stop,
            handle,
            admin,
            fake,
            api,
            node,
            registry,
            config,
            clock,
            dir,
            cgroup_root,
            ns: "default".into(),
            admit: opts.admit,
        }
    }

    /// The pods API of the test namespace.
    pub fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.admin.clone(), &self.ns)
    }

    /// Creates a pod bound to this node from a spec (JSON), without a
    /// service account token volume.
    pub async fn create_pod(&self, name: &str, mut spec: serde_json::Value) -> Pod {
        spec["nodeName"] = json!(self.node);
        if spec.get("automountServiceAccountToken").is_none() {
            spec["automountServiceAccountToken"] = json!(false);
        }
        let pod: Pod = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": self.ns},
            "spec": spec
        }))
        .unwrap();
        self.pods()
            .create(&PostParams::default(), &pod)
            .await
            .unwrap()
    }

    /// The pod as the API has it.
    pub async fn get(&self, name: &str) -> Option<Pod> {
        self.pods().get_opt(name).await.unwrap()
    }

    /// Waits until `check` accepts the pod.
    pub async fn wait_pod<T>(
        &self,
        name: &str,
        what: &str,
        timeout: Duration,
        check: impl Fn(&Pod) -> Result<T, String>,
    ) -> T {
        wait_for(what, timeout, Duration::from_millis(20), || async {
            match self.pods().get_opt(name).await {
                Ok(Some(p)) => check(&p),
                Ok(None) => Err("pod not found".into()),
                Err(e) => Err(e.to_string()),
            }
        })
        .await
        .unwrap_or_else(|e| panic!("{e}"))
    }

    /// Waits for a pod phase.
    pub async fn wait_phase(&self, name: &str, phase: &str, timeout: Duration) -> Pod {
        self.wait_pod(name, &format!("{name} {phase}"), timeout, |p| {
            let got = p
                .status
                .as_ref()
                .and_then(|s| s.phase.clone())
                .unwrap_or_default();
            if got == phase {
                Ok(p.clone())
            } else {
                Err(format!(
                    "phase {got:?}: {}",
                    serde_json::to_string(&p.status).unwrap()
                ))
            }
        })
        .await
    }

    /// Waits until the pod is gone from the API.
    pub async fn wait_gone(&self, name: &str, timeout: Duration) {
        wait_for(
            &format!("{name} removed"),
            timeout,
            Duration::from_millis(20),
            || async {
                match self.pods().get_opt(name).await {
                    Ok(None) => Ok(()),
                    Ok(Some(p)) => Err(format!(
                        "still there: {}",
                        serde_json::to_string(&p.status).unwrap()
                    )),
                    Err(e) => Err(e.to_string()),
                }
            },
        )
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    }

    /// Deletes a pod gracefully (`grace` seconds, or the pod's own).
    pub async fn delete(&self, name: &str, grace: Option<u32>) {
        let dp = DeleteParams {
            grace_period_seconds: grace,
            ..Default::default()
        };
        let _ = self.pods().delete(name, &dp).await.unwrap();
    }

    /// Events about a pod: `(reason, message, fieldPath)` in creation order.
    pub async fn events(&self, name: &str) -> Vec<(String, String, String)> {
        let list = Api::<Event>::namespaced(self.admin.clone(), &self.ns)
            .list(&ListParams::default())
            .await
            .unwrap();
        let mut evs: Vec<&Event> = list
            .items
            .iter()
            .filter(|e| e.involved_object.name.as_deref() == Some(name))
            .collect();
        evs.sort_by_key(|e| e.metadata.creation_timestamp.clone().map(|t| t.0));
        evs.iter()
            .map(|e| {
                (
                    e.reason.clone().unwrap_or_default(),
                    e.message.clone().unwrap_or_default(),
                    e.involved_object.field_path.clone().unwrap_or_default(),
                )
            })
            .collect()
    }

    /// Waits for an event with `reason` whose message contains `text`.
    pub async fn wait_event(&self, name: &str, reason: &str, text: &str, timeout: Duration) {
        wait_for(
            &format!("event {reason} {text:?} on {name}"),
            timeout,
            Duration::from_millis(50),
            || async {
                let evs = self.events(name).await;
                if evs.iter().any(|(r, m, _)| r == reason && m.contains(text)) {
                    Ok(())
                } else {
                    Err(format!("{evs:?}"))
                }
            },
        )
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    }

    /// The metrics text.
    pub fn metrics(&self) -> String {
        keelson::observability::metrics::render(&self.registry)
    }
}

/// The status of container `name` of a pod.
pub fn container_status<'a>(
    p: &'a Pod,
    name: &str,
) -> Option<&'a k8s_openapi::api::core::v1::ContainerStatus> {
    let s = p.status.as_ref()?;
    s.container_statuses
        .iter()
        .flatten()
        .chain(s.init_container_statuses.iter().flatten())
        .find(|c| c.name == name)
}

/// The condition `ty` of a pod.
pub fn condition<'a>(p: &'a Pod, ty: &str) -> Option<&'a k8s_openapi::api::core::v1::PodCondition> {
    p.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == ty)
}

/// `waiting.reason` of a container.
pub fn waiting_reason(p: &Pod, name: &str) -> Option<String> {
    container_status(p, name)?
        .state
        .as_ref()?
        .waiting
        .as_ref()?
        .reason
        .clone()
}

/// A pod spec with one busybox container (plus `extra` merged in).
pub fn busybox(extra: serde_json::Value) -> serde_json::Value {
    let mut c = json!({"name": "app", "image": IMAGE, "command": ["sh", "-c", "sleep 3600"]});
    if let Some(o) = extra.as_object() {
        for (k, v) in o {
            c[k] = v.clone();
        }
    }
    json!({"terminationGracePeriodSeconds": 5, "containers": [c]})
}
