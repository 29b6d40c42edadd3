//! The Node admission checks against (kubelet's `GetCachedNode`): the
//! node's own object as a watch on `metadata.name=<node>` last saw it
//! (kubelet's node informer, which the Node authorizer allows), read again
//! from the API when only node affinity failed (`getNodeSync`), and before
//! the Node exists, a stand-in with the default labels and the node's own
//! allocatable (`initialNode`).

use std::collections::BTreeMap;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use futures::StreamExt;
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::{Node, NodeStatus};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as ApiQuantity;
use kube::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use tokio_util::sync::CancellationToken;

/// How long a synchronous read of the Node may take before the cached
/// copy is used (a hung API server must not hold admission).
const FETCH_TIMEOUT: Duration = Duration::from_secs(10);

/// Where admission reads the Node from.
pub trait NodeSource: Send + Sync {
    /// The Node as last seen (`None` before it exists).
    fn cached(&self) -> Option<Node>;
    /// The Node read now from the API (`None` when it cannot be read).
    fn fetch(&self) -> BoxFuture<'_, Option<Node>>;
    /// Resolves once the Node was listed (kubelet waits for this before
    /// it watches its pods, so the first admissions see the Node).
    fn synced(&self) -> BoxFuture<'_, ()> {
        Box::pin(async {})
    }
}

/// The Node through a watch of this one object.
#[derive(Clone)]
pub struct ApiNodeSource {
    api: Api<Node>,
    name: String,
    cache: Arc<RwLock<Option<Node>>>,
    listed: tokio::sync::watch::Sender<bool>,
}

impl std::fmt::Debug for ApiNodeSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiNodeSource")
            .field("name", &self.name)
            .finish()
    }
}

impl ApiNodeSource {
    /// Starts watching node `name`; the watch stops with `stop`.
    pub fn start(client: kube::Client, name: &str, stop: CancellationToken) -> Arc<Self> {
        let src = Arc::new(ApiNodeSource {
            api: Api::all(client),
            name: name.to_string(),
            cache: Arc::default(),
            listed: tokio::sync::watch::channel(false).0,
        });
        let watch = src.clone();
        tokio::spawn(async move {
            let config =
                watcher::Config::default().fields(&format!("metadata.name={}", watch.name));
            let mut stream = watcher::watcher(watch.api.clone(), config)
                .default_backoff()
                .boxed();
            loop {
                let item = tokio::select! {
                    _ = stop.cancelled() => return,
                    item = stream.next() => item,
                };
                match item {
                    None => return,
                    Some(Ok(Event::Apply(n) | Event::InitApply(n))) => watch.store(Some(n)),
                    Some(Ok(Event::Delete(_))) => watch.store(None),
                    Some(Ok(Event::InitDone)) => {
                        watch.listed.send_replace(true);
                    }
                    Some(Ok(Event::Init)) => {}
                    Some(Err(e)) => {
                        tracing::debug!(error = %e, "watching this node's Node object failed; retrying")
                    }
                }
            }
        });
        src
    }

    fn store(&self, node: Option<Node>) {
        *self.cache.write().unwrap_or_else(PoisonError::into_inner) = node;
    }
}

impl NodeSource for ApiNodeSource {
    fn cached(&self) -> Option<Node> {
        self.cache
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn synced(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            let mut rx = self.listed.subscribe();
            let _ = rx.wait_for(|l| *l).await;
        })
    }

    fn fetch(&self) -> BoxFuture<'_, Option<Node>> {
        Box::pin(async move {
            match tokio::time::timeout(FETCH_TIMEOUT, self.api.get_opt(&self.name)).await {
                Ok(Ok(Some(n))) => {
                    self.store(Some(n.clone()));
                    Some(n)
                }
                Ok(Ok(None)) => None,
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, "failed to read this node's Node object");
                    None
                }
                Err(_) => {
                    tracing::warn!("reading this node's Node object timed out");
                    None
                }
            }
        })
    }
}

/// kubelet's `initialNode`: the default labels and the node's own
/// capacity figures, for admission before the Node exists.
pub fn initial_node(name: &str, allocatable: BTreeMap<String, ApiQuantity>, max_pods: i32) -> Node {
    let mut allocatable = allocatable;
    allocatable
        .entry("pods".into())
        .or_insert_with(|| ApiQuantity(max_pods.to_string()));
    let labels = BTreeMap::from([
        ("kubernetes.io/hostname".to_string(), name.to_string()),
        ("kubernetes.io/os".to_string(), "linux".to_string()),
        (
            "kubernetes.io/arch".to_string(),
            keelson_common::version::go_arch().to_string(),
        ),
    ]);
    Node {
        metadata: kube::api::ObjectMeta {
            name: Some(name.to_string()),
            labels: Some(labels),
            ..Default::default()
        },
        status: Some(NodeStatus {
            capacity: Some(allocatable.clone()),
            allocatable: Some(allocatable),
            ..Default::default()
        }),
        ..Default::default()
    }
}
