//! The API server the scenario is written to: the test API server started
//! in-process (default; a stand-in for kube-apiserver, see
//! `tests/README.md`) or any cluster given by a kubeconfig.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Namespace, Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;
use tokio::task::JoinHandle;

use super::error::{BenchError, Result};
use super::relay;
use super::scenario::{
    MANAGED_BY, Scenario, ServiceEntry, endpoints_patch, service_object, slice_object,
};
use crate::netns::NetNs;
use crate::testapi::{TestApiOptions, TestApiServer};

/// API writes in flight while loading the scenario.
const LOAD_CONCURRENCY: usize = 32;

/// RFC 3339 "now" for the trigger-time annotation.
pub fn now_rfc3339() -> String {
    jiff::Timestamp::now().to_string()
}

/// Writes `text` to a new file readable by its owner only (credentials).
fn write_private(path: &Path, text: &str) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| BenchError::io(format!("writing {}", path.display()), e))?;
    f.write_all(text.as_bytes())
        .map_err(|e| BenchError::io(format!("writing {}", path.display()), e))
}

enum Target {
    TestServer(Box<TestApiServer>),
    External {
        kubeconfig: serde_yaml::Value,
        dir: PathBuf,
        upstream: SocketAddr,
    },
}

/// The API server and the namespace of the scenario.
pub struct ApiTarget {
    target: Target,
    client: kube::Client,
    namespace: String,
    relays: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for ApiTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiTarget")
            .field("namespace", &self.namespace)
            .field("test_server", &self.is_test_server())
            .finish()
    }
}

impl Drop for ApiTarget {
    fn drop(&mut self) {
        for r in &self.relays {
            r.abort();
        }
    }
}

impl ApiTarget {
    /// Starts the test API server with `service_cidr`.
    pub async fn test_server(service_cidr: &str, namespace: &str) -> Result<ApiTarget> {
        let server = TestApiServer::start(TestApiOptions {
            service_cidr: service_cidr.to_string(),
            // Churn on tens of thousands of slices: keep enough history for
            // watchers that fall behind during a long sync.
            watch_history: 200_000,
            watch_buffer: 65_536,
            ..TestApiOptions::default()
        })
        .await
        .map_err(|e| BenchError::Invalid(format!("starting the test API server: {e}")))?;
        let client = server
            .try_client()
            .await
            .map_err(|e| BenchError::Invalid(format!("test API server client: {e}")))?;
        Ok(ApiTarget {
            target: Target::TestServer(Box::new(server)),
            client,
            namespace: namespace.to_string(),
            relays: Vec::new(),
        })
    }

    /// Uses the cluster of `path` (current context).
    pub async fn external(path: &Path, namespace: &str) -> Result<ApiTarget> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| BenchError::io(format!("reading {}", path.display()), e))?;
        let doc: serde_yaml::Value = serde_yaml::from_str(&text)
            .map_err(|e| BenchError::Invalid(format!("{}: {e}", path.display())))?;
        let (_, host, port) = relay::current_server(&doc)?;
        let upstream = tokio::net::lookup_host((host.as_str(), port))
            .await
            .map_err(|e| BenchError::io(format!("resolving {host}"), e))?
            .next()
            .ok_or_else(|| BenchError::Invalid(format!("{host} has no address")))?;
        let kc = kube::config::Kubeconfig::from_yaml(&text)
            .map_err(|e| BenchError::Invalid(format!("{}: {e}", path.display())))?;
        let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
            .await
            .map_err(|e| BenchError::Invalid(format!("{}: {e}", path.display())))?;
        let client = kube::Client::try_from(cfg)
            .map_err(|e| BenchError::api("building the API client", e))?;
        let dir = path
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from("."));
        Ok(ApiTarget {
            target: Target::External {
                kubeconfig: doc,
                dir,
                upstream,
            },
            client,
            namespace: namespace.to_string(),
            relays: Vec::new(),
        })
    }

    /// Whether this is the in-process test API server (it speaks JSON only,
    /// so kube-proxy needs `--kube-api-content-type=application/json`).
    pub fn is_test_server(&self) -> bool {
        matches!(self.target, Target::TestServer(_))
    }

    /// The namespace of the scenario.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// Writes a kubeconfig at `path` that works from inside `ns`: the test
    /// server also serves plain HTTP on a listener in the namespace's
    /// loopback; an outside cluster is reached through a relay there.
    pub fn kubeconfig_for(&mut self, ns: &NetNs, path: &Path) -> Result<()> {
        match &self.target {
            Target::TestServer(server) => {
                let listener = ns.tcp_listener(SocketAddr::from(([127, 0, 0, 1], 0)))?;
                let port = listener
                    .local_addr()
                    .map_err(|e| BenchError::io("listener address", e))?
                    .port();
                server.serve_listener(listener);
                server
                    .write_kubeconfig_with_server(path, &format!("http://127.0.0.1:{port}"), None)
                    .map_err(|e| BenchError::Invalid(format!("writing a kubeconfig: {e}")))
            }
            Target::External {
                kubeconfig,
                dir,
                upstream,
            } => {
                let (port, task) = relay::start(ns, *upstream)?;
                self.relays.push(task);
                let doc = relay::rewrite_for_relay(kubeconfig, dir, port)?;
                let text = serde_yaml::to_string(&doc)
                    .map_err(|e| BenchError::Invalid(format!("kubeconfig: {e}")))?;
                write_private(path, &text)
            }
        }
    }

    /// Creates the namespace (an existing one is reused).
    pub async fn prepare_namespace(&self) -> Result<()> {
        let api: Api<Namespace> = Api::all(self.client.clone());
        let ns: Namespace = serde_json::from_value(json!({
            "metadata": {"name": self.namespace, "labels": {"app.kubernetes.io/managed-by": MANAGED_BY}}
        }))
        .map_err(|e| BenchError::Invalid(e.to_string()))?;
        match api.create(&PostParams::default(), &ns).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
            Err(e) => Err(BenchError::api(
                format!("creating namespace {}", self.namespace),
                e,
            )),
        }
    }

    /// Registers a Node for a contestant (kube-proxy reads its addresses):
    /// cordoned and tainted so nothing is ever scheduled on it.
    pub async fn create_node(&self, name: &str, ip: Ipv4Addr) -> Result<()> {
        let api: Api<Node> = Api::all(self.client.clone());
        let node: Node = serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {
                "kubernetes.io/hostname": name,
                "app.kubernetes.io/managed-by": MANAGED_BY
            }},
            "spec": {
                "unschedulable": true,
                "taints": [
                    {"key": "keelson.dev/bench", "effect": "NoSchedule"},
                    {"key": "keelson.dev/bench", "effect": "NoExecute"}
                ]
            }
        }))
        .map_err(|e| BenchError::Invalid(e.to_string()))?;
        match api.create(&PostParams::default(), &node).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => return Err(BenchError::api(format!("creating Node {name}"), e)),
        }
        let status = json!({"status": {"addresses": [
            {"type": "InternalIP", "address": ip.to_string()},
            {"type": "Hostname", "address": name}
        ]}});
        api.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
            .await
            .map_err(|e| BenchError::api(format!("setting Node {name} addresses"), e))?;
        Ok(())
    }

    /// Removes a Node created by [`ApiTarget::create_node`].
    pub async fn delete_node(&self, name: &str) -> Result<()> {
        let api: Api<Node> = Api::all(self.client.clone());
        match api.delete(name, &DeleteParams::default()).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(e) => Err(BenchError::api(format!("deleting Node {name}"), e)),
        }
    }

    fn services(&self) -> Api<Service> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    fn slices(&self) -> Api<EndpointSlice> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    /// Creates a Service; returns its ClusterIP.
    pub async fn create_service(&self, svc: &ServiceEntry) -> Result<Ipv4Addr> {
        let created = self
            .services()
            .create(
                &PostParams::default(),
                &service_object(svc, &self.namespace)?,
            )
            .await
            .map_err(|e| BenchError::api(format!("creating Service {}", svc.name), e))?;
        created
            .spec
            .and_then(|s| s.cluster_ip)
            .and_then(|ip| ip.parse().ok())
            .ok_or_else(|| {
                BenchError::Invalid(format!("Service {} got no IPv4 ClusterIP", svc.name))
            })
    }

    /// Creates a Service's EndpointSlice with its current endpoints.
    pub async fn create_slice(&self, svc: &ServiceEntry) -> Result<()> {
        self.slices()
            .create(
                &PostParams::default(),
                &slice_object(svc, &self.namespace, &now_rfc3339())?,
            )
            .await
            .map_err(|e| {
                BenchError::api(format!("creating EndpointSlice {}", svc.slice_name()), e)
            })?;
        Ok(())
    }

    /// Replaces the endpoints of a Service's slice (one merge patch).
    pub async fn set_endpoints(&self, svc: &ServiceEntry) -> Result<()> {
        let patch = endpoints_patch(&svc.endpoints, &now_rfc3339());
        self.slices()
            .patch(
                &svc.slice_name(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
            .map_err(|e| {
                BenchError::api(format!("updating EndpointSlice {}", svc.slice_name()), e)
            })?;
        Ok(())
    }

    /// Deletes a Service and its slice.
    pub async fn delete_service(&self, svc: &ServiceEntry) -> Result<()> {
        let dp = DeleteParams::default();
        for r in [
            self.slices()
                .delete(&svc.slice_name(), &dp)
                .await
                .map(|_| ()),
            self.services().delete(&svc.name, &dp).await.map(|_| ()),
        ] {
            match r {
                Ok(()) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(BenchError::api(format!("deleting Service {}", svc.name), e)),
            }
        }
        Ok(())
    }

    /// Creates Services `range` of the scenario (recording their
    /// ClusterIPs), then their slices.
    pub async fn load(&self, scenario: &mut Scenario, range: std::ops::Range<usize>) -> Result<()> {
        let entries: Vec<(usize, ServiceEntry)> = range
            .clone()
            .filter_map(|i| scenario.service(i).cloned().map(|s| (i, s)))
            .collect();
        let ips: Vec<(usize, Ipv4Addr)> = futures::stream::iter(entries.iter())
            .map(|(i, s)| async move { self.create_service(s).await.map(|ip| (*i, ip)) })
            .buffer_unordered(LOAD_CONCURRENCY)
            .try_collect()
            .await?;
        for (i, ip) in ips {
            scenario.set_cluster_ip(i, ip);
        }
        futures::stream::iter(entries.iter())
            .map(|(_, s)| self.create_slice(s))
            .buffer_unordered(LOAD_CONCURRENCY)
            .try_collect::<Vec<()>>()
            .await?;
        Ok(())
    }

    /// Removes what the benchmark created on an outside cluster (the
    /// namespace and the given Nodes); the test server just stops.
    pub async fn cleanup(&self, nodes: &[String]) {
        for n in nodes {
            if let Err(e) = self.delete_node(n).await {
                tracing::warn!(node = n, error = %e, "could not delete a benchmark Node");
            }
        }
        if self.is_test_server() {
            return;
        }
        let api: Api<Namespace> = Api::all(self.client.clone());
        if let Err(e) = api.delete(&self.namespace, &DeleteParams::default()).await {
            tracing::warn!(namespace = %self.namespace, error = %e, "could not delete the benchmark namespace");
        }
    }
}
