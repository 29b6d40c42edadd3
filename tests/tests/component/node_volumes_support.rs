//! Shared by the volume component tests: a test API server, a volume
//! manager rooted in a temporary directory, and a guard that unmounts
//! everything mounted below that directory when the test ends (also when
//! it fails).

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Event, Pod, Secret};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use keelson::events::EventRecorder;
use keelson::node::volumes::mounter::{LinuxMounter, MountPoint, Mounter, mounts_under};
use keelson::node::volumes::{VolumeManager, VolumeManagerConfig};
use keelson_tests::support::wait_for;
use keelson_tests::testapi::{TestApiOptions, TestApiServer};
use kube::Api;
use kube::api::{ListParams, PostParams};
use tokio_util::sync::CancellationToken;

/// Unmounts (lazily, deepest first) everything mounted under its path on drop.
pub struct MountGuard(pub PathBuf);

impl Drop for MountGuard {
    fn drop(&mut self) {
        for p in mounts_below(&self.0).into_iter().map(|m| m.path).rev() {
            let _ = nix::mount::umount2(&p, nix::mount::MntFlags::MNT_DETACH);
        }
    }
}

/// Mount points at or below `dir`, in mount order.
pub fn mounts_below(dir: &Path) -> Vec<MountPoint> {
    LinuxMounter
        .mount_points()
        .unwrap()
        .into_iter()
        .filter(|m| m.path.starts_with(dir))
        .collect()
}

/// Paths mounted below `dir`, deepest first.
pub fn mounted_paths(dir: &Path) -> Vec<PathBuf> {
    mounts_under(&LinuxMounter.mount_points().unwrap(), dir)
}

/// One test's world. Field order is drop order: the manager stops, then
/// mounts are undone, then the directory goes.
pub struct World {
    pub shutdown: CancellationToken,
    pub vm: VolumeManager,
    pub client: kube::Client,
    pub api: TestApiServer,
    pub guard: MountGuard,
    pub root: tempfile::TempDir,
    /// Renders the metrics the manager registered.
    pub metrics: Box<dyn Fn() -> String + Send + Sync>,
}

impl Drop for World {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// The allocatable resources the tests' node reports.
pub fn allocatable() -> BTreeMap<String, Quantity> {
    BTreeMap::from([
        ("cpu".to_string(), Quantity("4".into())),
        ("memory".to_string(), Quantity("8Gi".into())),
        ("ephemeral-storage".to_string(), Quantity("100Gi".into())),
    ])
}

impl World {
    /// A world whose manager re-syncs every `sync`.
    pub async fn new(sync: Duration) -> World {
        Self::with(sync, |b| b).await
    }

    /// Same, letting the test replace parts of the manager.
    pub async fn with(
        sync: Duration,
        f: impl FnOnce(
            keelson::node::volumes::VolumeManagerBuilder,
        ) -> keelson::node::volumes::VolumeManagerBuilder,
    ) -> World {
        let root = tempfile::tempdir().unwrap();
        let guard = MountGuard(root.path().to_path_buf());
        let api = TestApiServer::start(TestApiOptions::default())
            .await
            .unwrap();
        let client = api.client().await;
        let shutdown = CancellationToken::new();
        let registry = keelson::observability::metrics::new_registry();
        let recorder = EventRecorder::start(client.clone(), "kubelet", "n1", &registry);
        let builder = VolumeManager::builder(
            VolumeManagerConfig {
                root_dir: root.path().to_path_buf(),
                sync_frequency: sync,
            },
            client.clone(),
        )
        .recorder(recorder)
        .registry(registry.clone())
        .allocatable(Arc::new(allocatable));
        let vm = f(builder).start(shutdown.clone());
        World {
            shutdown,
            vm,
            client,
            api,
            guard,
            root,
            metrics: Box::new(move || keelson::observability::metrics::render(&registry)),
        }
    }

    pub fn root(&self) -> &Path {
        self.root.path()
    }

    /// Creates a pod in `default` bound to node `n1` from a JSON spec.
    pub async fn pod(&self, name: &str, spec: serde_json::Value) -> Pod {
        self.pod_with_meta(name, serde_json::json!({}), spec).await
    }

    /// Same, with extra metadata (labels, annotations).
    pub async fn pod_with_meta(
        &self,
        name: &str,
        meta: serde_json::Value,
        spec: serde_json::Value,
    ) -> Pod {
        let mut spec = spec;
        spec["nodeName"] = "n1".into();
        let mut metadata = meta;
        metadata["name"] = name.into();
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec
        }))
        .unwrap();
        self.pods()
            .create(&PostParams::default(), &pod)
            .await
            .unwrap()
    }

    pub fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), "default")
    }

    pub fn config_maps(&self) -> Api<ConfigMap> {
        Api::namespaced(self.client.clone(), "default")
    }

    pub fn secrets(&self) -> Api<Secret> {
        Api::namespaced(self.client.clone(), "default")
    }

    pub async fn create_config_map(&self, name: &str, data: &[(&str, &str)]) -> ConfigMap {
        let cm = ConfigMap {
            metadata: kube::api::ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            data: Some(
                data.iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            ..Default::default()
        };
        self.config_maps()
            .create(&PostParams::default(), &cm)
            .await
            .unwrap()
    }

    pub async fn set_config_map(&self, name: &str, data: &[(&str, &str)]) {
        let mut cm = self.config_maps().get(name).await.unwrap();
        cm.data = Some(
            data.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        self.config_maps()
            .replace(name, &PostParams::default(), &cm)
            .await
            .unwrap();
    }

    pub async fn create_secret(&self, name: &str, data: &[(&str, &[u8])]) -> Secret {
        let s = Secret {
            metadata: kube::api::ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            data: Some(
                data.iter()
                    .map(|(k, v)| (k.to_string(), k8s_openapi::ByteString(v.to_vec())))
                    .collect(),
            ),
            ..Default::default()
        };
        self.secrets()
            .create(&PostParams::default(), &s)
            .await
            .unwrap()
    }

    /// Waits until an event with `reason` whose message contains `needle`
    /// is recorded for the pod; returns its message.
    pub async fn wait_event(&self, pod: &str, reason: &str, needle: &str) -> String {
        let api: Api<Event> = Api::namespaced(self.client.clone(), "default");
        wait_for(
            &format!("event {reason} on {pod} containing {needle:?}"),
            Duration::from_secs(10),
            Duration::from_millis(50),
            || {
                let api = api.clone();
                async move {
                    let list = api
                        .list(&ListParams::default())
                        .await
                        .map_err(|e| e.to_string())?;
                    let msgs: Vec<String> = list
                        .items
                        .iter()
                        .filter(|e| e.involved_object.name.as_deref() == Some(pod))
                        .filter(|e| e.reason.as_deref() == Some(reason))
                        .filter_map(|e| e.message.clone())
                        .collect();
                    msgs.iter()
                        .find(|m| m.contains(needle))
                        .cloned()
                        .ok_or_else(|| format!("events seen: {msgs:?}"))
                }
            },
        )
        .await
        .unwrap()
    }
}

/// The volume directory `<root>/pods/<uid>/volumes/<plugin>/<name>`.
pub fn volume_dir(w: &World, pod: &Pod, plugin: &str, name: &str) -> PathBuf {
    w.vm.layout()
        .volume_dir(pod.metadata.uid.as_deref().unwrap(), plugin, name)
}

pub fn uid(pod: &Pod) -> String {
    pod.metadata.uid.clone().unwrap()
}

/// Permission bits of `p` (following symlinks).
pub fn mode(p: &Path) -> u32 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(p).unwrap().mode() & 0o7777
}

/// Reads a file to a string, or the error text.
pub fn read(p: &Path) -> Result<String, String> {
    std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()))
}
