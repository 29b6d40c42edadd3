//! Shared by the pod lifecycle system tests: a private containerd, the test
//! API server, the real `keelson` binary running the node role in
//! containerd's network namespace (root and log dirs owned by the test, so
//! keelson can be killed and started again on the same state), and helpers
//! to create pods and reach them.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Event, Pod};
use keelson::config::KubeDuration;
use keelson_tests::containerd::Containerd;
use keelson_tests::images::BUSYBOX_IMAGE;
use keelson_tests::node_harness::{BinaryNode, BinaryNodeOptions, Configure};
use keelson_tests::support::wait_for;
use keelson_tests::testapi::{TestApiOptions, TestApiServer};
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The image of every pod.
pub const IMAGE: &str = BUSYBOX_IMAGE;

/// One system test's world. Field order is drop order: keelson stops
/// first, then the API server, then containerd (which removes every
/// sandbox, cgroup and the namespace), then the state directory.
pub struct SysWorld {
    pub node: Option<BinaryNode>,
    pub api: TestApiServer,
    pub admin: kube::Client,
    pub ctrd: Containerd,
    pub node_name: String,
    pub state: tempfile::TempDir,
    /// More configuration for keelson (after the world's own).
    pub extra: Option<Configure>,
}

impl Drop for SysWorld {
    fn drop(&mut self) {
        // keelson first, then the volume mounts it left for running pods
        // (the host must not keep them); the fields drop after this.
        drop(self.node.take());
        let _ = keelson::node::volumes::mounter::detach_all_below(self.state.path());
    }
}

impl SysWorld {
    /// Starts containerd, the API server and keelson.
    pub async fn start() -> SysWorld {
        Self::start_with(None).await
    }

    /// [`SysWorld::start`] with more configuration for keelson.
    pub async fn start_with(extra: Option<Configure>) -> SysWorld {
        let ctrd = Containerd::start().await.expect("containerd");
        let api = TestApiServer::start(TestApiOptions::default())
            .await
            .expect("test API server");
        let admin = api.client().await;
        let state = tempfile::Builder::new()
            .prefix("keelson-syspods-")
            .tempdir()
            .unwrap();
        let mut w = SysWorld {
            node: None,
            api,
            admin,
            ctrd,
            node_name: format!("sysnode-{}", keelson_tests::netns::unique_suffix()),
            state,
            extra,
        };
        w.start_keelson();
        w
    }

    /// Starts (again) the keelson binary on the same node name and state.
    pub fn start_keelson(&mut self) {
        let root: PathBuf = self.state.path().join("root");
        let logs: PathBuf = self.state.path().join("pod-logs/pods");
        let extra = self.extra.clone();
        let node = BinaryNode::start(
            &self.ctrd,
            &self.api,
            BinaryNodeOptions {
                node_name: self.node_name.clone(),
                configure: Some(Arc::new(move |c| {
                    c.node.root_dir = root.clone();
                    c.node.pod_logs_dir = logs.clone();
                    c.node.node_status_update_frequency = KubeDuration::from_secs(2);
                    if let Some(f) = &extra {
                        f(c);
                    }
                })),
                ..BinaryNodeOptions::default()
            },
        )
        .expect("keelson started");
        self.node = Some(node);
    }

    /// Kills keelson (SIGTERM then SIGKILL at once); pods keep running.
    pub fn kill_keelson(&mut self) -> String {
        match self.node.take() {
            Some(mut n) => {
                let tail = n.log_tail(40);
                let status = n.stop(Duration::ZERO);
                format!("{status}\n{tail}")
            }
            None => "not running".into(),
        }
    }

    /// keelson's recent log lines (for failure messages).
    pub fn log(&self) -> String {
        self.node
            .as_ref()
            .map(|n| n.log_tail(80))
            .unwrap_or_default()
    }

    /// The pods API of `default`.
    pub fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.admin.clone(), "default")
    }

    /// Creates a pod bound to this node.
    pub async fn create_pod(&self, name: &str, mut spec: serde_json::Value) -> Pod {
        spec["nodeName"] = json!(self.node_name);
        let pod: Pod = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default"},
            "spec": spec
        }))
        .unwrap();
        self.pods()
            .create(&PostParams::default(), &pod)
            .await
            .unwrap()
    }

    /// Waits until `check` accepts the pod.
    pub async fn wait_pod<T>(
        &self,
        name: &str,
        what: &str,
        timeout: Duration,
        check: impl Fn(&Pod) -> Result<T, String>,
    ) -> T {
        match wait_for(what, timeout, Duration::from_millis(100), || async {
            match self.pods().get_opt(name).await {
                Ok(Some(p)) => check(&p),
                Ok(None) => Err("pod not found".into()),
                Err(e) => Err(e.to_string()),
            }
        })
        .await
        {
            Ok(v) => v,
            Err(e) => panic!("{e}\n--- keelson log ---\n{}", self.log()),
        }
    }

    /// Waits for a phase.
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
        if let Err(e) = wait_for(
            &format!("{name} removed"),
            timeout,
            Duration::from_millis(100),
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
        {
            panic!("{e}\n--- keelson log ---\n{}", self.log());
        }
    }

    /// Deletes a pod with its own grace period.
    pub async fn delete(&self, name: &str) {
        let _ = self
            .pods()
            .delete(name, &DeleteParams::default())
            .await
            .unwrap();
    }

    /// An HTTP GET from inside containerd's namespace; returns the body.
    pub async fn http_get(&self, addr: SocketAddr) -> Result<String, String> {
        let mut conn = self
            .ctrd
            .netns()
            .tcp_connect(addr, Duration::from_secs(2))
            .map_err(|e| e.to_string())?;
        conn.write_all(b"GET / HTTP/1.0\r\nHost: pod\r\n\r\n")
            .await
            .map_err(|e| e.to_string())?;
        let mut body = String::new();
        tokio::time::timeout(Duration::from_secs(5), conn.read_to_string(&mut body))
            .await
            .map_err(|_| "read timed out".to_string())?
            .map_err(|e| e.to_string())?;
        Ok(body)
    }

    /// Runs a command in a container through CRI ExecSync (`kubectl exec`-like).
    pub async fn exec(&self, container_id: &str, cmd: &[&str]) -> i32 {
        let id = container_id.trim_start_matches("containerd://");
        self.ctrd
            .client()
            .exec_sync(
                id,
                cmd.iter().map(|s| s.to_string()).collect(),
                Duration::from_secs(10),
            )
            .await
            .expect("exec")
            .exit_code
    }

    /// Events about a pod: (reason, message).
    pub async fn events(&self, name: &str) -> Vec<(String, String)> {
        let list = Api::<Event>::namespaced(self.admin.clone(), "default")
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
                )
            })
            .collect()
    }
}

/// The status of container `name`.
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
