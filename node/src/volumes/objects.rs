//! ConfigMaps and Secrets the node's pods reference, cached through one
//! watch per referenced object (kubelet's watch-based manager): the watch
//! asks for exactly one name with `fieldSelector=metadata.name=<name>`,
//! which is what the Node authorizer lets a node list and watch — the node
//! never lists all Secrets of a namespace.
//!
//! - A pod registers its references (`register_pod`); the first reference to
//!   an object starts its watch, the last one going away stops it.
//! - `get` waits up to one second for the watch's first list, then answers
//!   from memory (`configmap "x" not found` when the object does not exist).
//! - An immutable object stops its watch after the first successful `get`;
//!   it is never re-read.
//! - A watch not read for five sync periods (at least a minute) is paused
//!   and resumed (re-listed) by the next `get`, so objects only used by
//!   environment variables do not hold watches forever.
//! - Every change to a synced object is announced on the change channel
//!   (the volume manager rewrites volumes at once instead of waiting for
//!   the next periodic sync).

use std::collections::{BTreeSet, HashMap};
use std::fmt::Debug;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::Api;
use kube::runtime::{WatchStreamExt, watcher};
use serde::de::DeserializeOwned;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// How long `get` waits for a new watch's first list.
const SYNC_WAIT: Duration = Duration::from_secs(1);
/// Shortest idle time before a watch is paused.
const MIN_IDLE: Duration = Duration::from_secs(60);

/// A kind the cache can hold.
pub trait CachedObject:
    kube::Resource<DynamicType = (), Scope = NamespaceResourceScope>
    + Clone
    + DeserializeOwned
    + Debug
    + Send
    + Sync
    + 'static
{
    /// The resource as kubelet names it in errors (`configmap`, `secret`).
    const RESOURCE: &'static str;
    /// True when the object is marked immutable.
    fn is_immutable(&self) -> bool;
}

impl CachedObject for ConfigMap {
    const RESOURCE: &'static str = "configmap";
    fn is_immutable(&self) -> bool {
        self.immutable == Some(true)
    }
}

impl CachedObject for Secret {
    const RESOURCE: &'static str = "secret";
    fn is_immutable(&self) -> bool {
        self.immutable == Some(true)
    }
}

/// Why an object could not be read from the cache. Display texts are
/// kubelet's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ObjectError {
    /// The object does not exist.
    #[error("{resource} {name:?} not found")]
    NotFound {
        /// `configmap` or `secret`.
        resource: &'static str,
        /// Object name.
        name: String,
    },
    /// No registered pod references the object.
    #[error("object {namespace:?}/{name:?} not registered")]
    NotRegistered {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
    },
    /// The watch has not listed the object yet (API server unreachable, or
    /// the node is not allowed to read it).
    #[error("failed to sync {resource} cache: timed out waiting for the condition")]
    NotSynced {
        /// `configmap` or `secret`.
        resource: &'static str,
    },
}

impl ObjectError {
    /// True for [`ObjectError::NotFound`] (what `optional` forgives).
    pub fn is_not_found(&self) -> bool {
        matches!(self, ObjectError::NotFound { .. })
    }
}

/// An object that changed: `(resource, namespace, name)`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Changed {
    /// `configmap` or `secret`.
    pub resource: &'static str,
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
}

#[derive(Debug)]
struct Slot<K> {
    /// The watch has listed the object since it (re)started.
    synced: bool,
    /// The watch has listed the object at least once.
    seen: bool,
    object: Option<Arc<K>>,
}

impl<K> Default for Slot<K> {
    fn default() -> Self {
        Slot {
            synced: false,
            seen: false,
            object: None,
        }
    }
}

struct Item<K> {
    refs: HashMap<String, usize>,
    state: Arc<watch::Sender<Slot<K>>>,
    running: Option<CancellationToken>,
    immutable: bool,
    last_access: Instant,
}

type Key = (String, String);

struct Inner<K> {
    items: HashMap<Key, Item<K>>,
    pods: HashMap<String, (String, BTreeSet<String>)>,
    stopped: bool,
}

/// Watch-based cache of one kind of object; cheap to clone.
pub struct ObjectCache<K: CachedObject> {
    client: kube::Client,
    inner: Arc<Mutex<Inner<K>>>,
    changes: mpsc::UnboundedSender<Changed>,
    shutdown: CancellationToken,
    max_idle: Duration,
}

impl<K: CachedObject> Clone for ObjectCache<K> {
    fn clone(&self) -> Self {
        ObjectCache {
            client: self.client.clone(),
            inner: self.inner.clone(),
            changes: self.changes.clone(),
            shutdown: self.shutdown.clone(),
            max_idle: self.max_idle,
        }
    }
}

impl<K: CachedObject> Debug for ObjectCache<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectCache")
            .field("resource", &K::RESOURCE)
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl<K: CachedObject> ObjectCache<K> {
    /// A cache reading through `client`; changes are sent on `changes`.
    /// `resync` is the node's sync period (the idle limit is five of them).
    pub fn new(
        client: kube::Client,
        changes: mpsc::UnboundedSender<Changed>,
        resync: Duration,
        shutdown: CancellationToken,
    ) -> ObjectCache<K> {
        ObjectCache {
            client,
            inner: Arc::new(Mutex::new(Inner {
                items: HashMap::new(),
                pods: HashMap::new(),
                stopped: false,
            })),
            changes,
            shutdown,
            max_idle: (resync * 5).max(MIN_IDLE),
        }
    }

    /// Sets the pod's references to exactly `names` in `namespace`: new
    /// ones are added before old ones are dropped, so an object referenced
    /// before and after keeps its watch.
    pub fn register_pod(&self, uid: &str, namespace: &str, names: BTreeSet<String>) {
        let mut inner = lock(&self.inner);
        for name in &names {
            self.add_reference(&mut inner, namespace, name, uid);
        }
        let prev = inner
            .pods
            .insert(uid.to_string(), (namespace.to_string(), names));
        if let Some((ns, old)) = prev {
            for name in old {
                Self::delete_reference(&mut inner, &ns, &name, uid);
            }
        }
    }

    /// Drops every reference of the pod.
    pub fn unregister_pod(&self, uid: &str) {
        let mut inner = lock(&self.inner);
        if let Some((ns, old)) = inner.pods.remove(uid) {
            for name in old {
                Self::delete_reference(&mut inner, &ns, &name, uid);
            }
        }
    }

    /// Pods (UIDs) that reference `namespace/name`.
    pub fn referencing_pods(&self, namespace: &str, name: &str) -> Vec<String> {
        let inner = lock(&self.inner);
        inner
            .items
            .get(&(namespace.to_string(), name.to_string()))
            .map(|i| i.refs.keys().cloned().collect())
            .unwrap_or_default()
    }

    fn add_reference(&self, inner: &mut Inner<K>, namespace: &str, name: &str, uid: &str) {
        let key = (namespace.to_string(), name.to_string());
        let stopped = inner.stopped;
        let item = inner.items.entry(key).or_insert_with(|| {
            let mut item = Item {
                refs: HashMap::new(),
                state: Arc::new(watch::channel(Slot::default()).0),
                running: None,
                immutable: false,
                last_access: Instant::now(),
            };
            if !stopped {
                self.start(&mut item, namespace, name);
            }
            item
        });
        *item.refs.entry(uid.to_string()).or_insert(0) += 1;
    }

    fn delete_reference(inner: &mut Inner<K>, namespace: &str, name: &str, uid: &str) {
        let key = (namespace.to_string(), name.to_string());
        let Some(item) = inner.items.get_mut(&key) else {
            return;
        };
        if let Some(n) = item.refs.get_mut(uid) {
            *n -= 1;
            if *n == 0 {
                item.refs.remove(uid);
            }
        }
        if item.refs.is_empty() {
            stop(item);
            inner.items.remove(&key);
        }
    }

    fn start(&self, item: &mut Item<K>, namespace: &str, name: &str) {
        let cancel = self.shutdown.child_token();
        item.running = Some(cancel.clone());
        let api: Api<K> = Api::namespaced(self.client.clone(), namespace);
        let task = WatchTask {
            api,
            namespace: namespace.to_string(),
            name: name.to_string(),
            state: item.state.clone(),
            changes: self.changes.clone(),
        };
        tokio::spawn(task.run(cancel));
    }

    /// The object `namespace/name`, which a registered pod must reference.
    pub async fn get(&self, namespace: &str, name: &str) -> Result<Arc<K>, ObjectError> {
        let key = (namespace.to_string(), name.to_string());
        let mut rx = {
            let mut inner = lock(&self.inner);
            let stopped = inner.stopped;
            let Some(item) = inner.items.get_mut(&key) else {
                return Err(ObjectError::NotRegistered {
                    namespace: namespace.to_string(),
                    name: name.to_string(),
                });
            };
            item.last_access = Instant::now();
            if item.running.is_none() && !item.immutable && !stopped {
                self.start(item, namespace, name);
            }
            item.state.subscribe()
        };
        let synced = tokio::time::timeout(SYNC_WAIT, rx.wait_for(|s| s.synced))
            .await
            .ok()
            .and_then(Result::ok)
            .map(|slot| slot.object.clone());
        let Some(object) = synced else {
            return Err(ObjectError::NotSynced {
                resource: K::RESOURCE,
            });
        };
        let Some(object) = object else {
            return Err(ObjectError::NotFound {
                resource: K::RESOURCE,
                name: name.to_string(),
            });
        };
        if object.is_immutable() {
            let mut inner = lock(&self.inner);
            if let Some(item) = inner.items.get_mut(&key) {
                item.immutable = true;
                if item.running.is_some() {
                    stop(item);
                    tracing::debug!(
                        resource = K::RESOURCE,
                        namespace,
                        name,
                        "stopped watching for changes: object is immutable"
                    );
                }
            }
        }
        Ok(object)
    }

    /// Pauses watches nobody read for the idle limit (kubelet's
    /// `startRecycleIdleWatch`); called every minute.
    pub fn recycle_idle(&self) {
        let now = Instant::now();
        let mut inner = lock(&self.inner);
        for ((ns, name), item) in inner.items.iter_mut() {
            let synced = item.state.borrow().synced;
            if item.running.is_some()
                && synced
                && now.duration_since(item.last_access) > self.max_idle
            {
                stop(item);
                tracing::debug!(resource = K::RESOURCE, namespace = %ns, name = %name, "not read for a long time; stopped watching for changes");
            }
        }
    }

    /// Replaces the idle limit (tests; production uses five sync periods).
    pub fn set_idle_limit(&mut self, limit: Duration) {
        self.max_idle = limit;
    }

    /// Stops every watch (shutdown).
    pub fn stop_all(&self) {
        let mut inner = lock(&self.inner);
        inner.stopped = true;
        for item in inner.items.values_mut() {
            stop(item);
        }
    }

    /// Number of watches currently running (for tests and metrics).
    pub fn running_watches(&self) -> usize {
        lock(&self.inner)
            .items
            .values()
            .filter(|i| i.running.is_some())
            .count()
    }
}

/// Stops an item's watch; a mutable object's content is then considered
/// stale (the next `get` waits for a fresh list).
fn stop<K>(item: &mut Item<K>) {
    if let Some(c) = item.running.take() {
        c.cancel();
        if !item.immutable {
            item.state.send_modify(|s| s.synced = false);
        }
    }
}

struct WatchTask<K: CachedObject> {
    api: Api<K>,
    namespace: String,
    name: String,
    state: Arc<watch::Sender<Slot<K>>>,
    changes: mpsc::UnboundedSender<Changed>,
}

impl<K: CachedObject> WatchTask<K> {
    async fn run(self, cancel: CancellationToken) {
        let config = watcher::Config::default().fields(&format!("metadata.name={}", self.name));
        let stream = watcher(self.api.clone(), config).default_backoff();
        futures::pin_mut!(stream);
        let mut listing: Option<K> = None;
        let mut failures = 0u32;
        loop {
            let event = tokio::select! {
                () = cancel.cancelled() => return,
                e = stream.next() => e,
            };
            match event {
                None => return,
                Some(Ok(watcher::Event::Init)) => listing = None,
                Some(Ok(watcher::Event::InitApply(o))) => {
                    if self.matches(&o) {
                        listing = Some(o);
                    }
                }
                Some(Ok(watcher::Event::InitDone)) => {
                    failures = 0;
                    self.set(listing.take());
                }
                Some(Ok(watcher::Event::Apply(o))) => {
                    if self.matches(&o) {
                        self.set(Some(o));
                    }
                }
                Some(Ok(watcher::Event::Delete(o))) => {
                    if self.matches(&o) {
                        self.set(None);
                    }
                }
                Some(Err(e)) => {
                    failures += 1;
                    // The stream backs off and retries by itself.
                    if failures == 1 || failures.is_power_of_two() {
                        tracing::warn!(resource = K::RESOURCE, namespace = %self.namespace, name = %self.name, error = %e, failures, "watch of a referenced object failed; retrying");
                    }
                }
            }
        }
    }

    fn matches(&self, o: &K) -> bool {
        o.meta().name.as_deref() == Some(self.name.as_str())
    }

    fn set(&self, object: Option<K>) {
        let rv = |o: &Option<Arc<K>>| o.as_ref().map(|o| o.meta().resource_version.clone());
        let new = object.map(Arc::new);
        let mut changed = false;
        self.state.send_modify(|slot| {
            changed = slot.seen && rv(&slot.object) != rv(&new);
            slot.object = new;
            slot.synced = true;
            slot.seen = true;
        });
        if changed {
            let _ = self.changes.send(Changed {
                resource: K::RESOURCE,
                namespace: self.namespace.clone(),
                name: self.name.clone(),
            });
        }
    }
}
