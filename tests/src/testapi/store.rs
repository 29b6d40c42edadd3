//! Storage: every object as serialized JSON, one global monotonically
//! increasing resourceVersion, a bounded per-resource change history for
//! watches (older resourceVersions answer 410 Gone) and a broadcast channel
//! per resource for live watchers.
//!
//! All writes run inside [`Store::write`] under one lock, so a resourceVersion
//! order is a total order and a watcher that subscribes under the lock never
//! misses or duplicates a change.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, RwLock};

use bytes::Bytes;
use serde_json::Value;
use tokio::sync::broadcast;

use super::allocator::Allocator;
use super::error::ApiError;
use super::fields;
use super::resources::{self, RESOURCES};

/// One stored object.
#[derive(Debug)]
pub struct Stored {
    /// Its resourceVersion.
    pub rv: u64,
    /// Namespace ("" when cluster scoped).
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Serialized JSON, exactly what a GET returns.
    pub bytes: Bytes,
    /// metadata.labels.
    pub labels: BTreeMap<String, String>,
    /// Selectable field values (beyond name/namespace).
    pub fields: Vec<(&'static str, String)>,
}

impl Stored {
    /// The object as a JSON value.
    pub fn value(&self) -> Result<Value, ApiError> {
        serde_json::from_slice(&self.bytes)
            .map_err(|e| ApiError::internal(format!("stored object does not parse: {e}")))
    }

    /// A field label's value (`metadata.name`, `spec.nodeName`, ...).
    pub fn field(&self, label: &str) -> String {
        match label {
            "metadata.name" => self.name.clone(),
            "metadata.namespace" => self.namespace.clone(),
            _ => self
                .fields
                .iter()
                .find(|(l, _)| *l == label)
                .map(|(_, v)| v.clone())
                .unwrap_or_default(),
        }
    }
}

/// Watch event type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangeType {
    /// Object created.
    Added,
    /// Object changed.
    Modified,
    /// Object removed (the object is its last state, with the deletion's RV).
    Deleted,
}

/// One change, as recorded in the history and broadcast to watchers.
#[derive(Debug)]
pub struct Change {
    /// resourceVersion of the change.
    pub rv: u64,
    /// What happened.
    pub kind: ChangeType,
    /// The object after the change (for Deleted: last state at the delete RV).
    pub object: Arc<Stored>,
    /// The object before the change (None for Added).
    pub previous: Option<Arc<Stored>>,
}

type Key = (String, String);

struct Table {
    objects: BTreeMap<Key, Arc<Stored>>,
    history: VecDeque<Arc<Change>>,
    /// Changes with rv <= this may be missing from `history`.
    compacted_rv: u64,
    tx: broadcast::Sender<Arc<Change>>,
}

struct Inner {
    rv: u64,
    tables: HashMap<&'static str, Table>,
    alloc: Allocator,
}

/// The object store.
pub struct Store {
    inner: RwLock<Inner>,
    history_size: usize,
}

/// A list result (one page).
pub struct ListPage {
    /// Matching objects, in key order.
    pub items: Vec<Arc<Stored>>,
    /// The list's resourceVersion.
    pub rv: u64,
    /// Key of the last returned item when more remain.
    pub next: Option<Key>,
    /// How many matching items remain after this page.
    pub remaining: usize,
}

/// Where a watch starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WatchFrom {
    /// Send the current state as ADDED events first, then follow.
    Current,
    /// Replay changes after this RV, then follow.
    After(u64),
    /// Follow from now, no initial events.
    Now,
}

/// What a watch is started with.
pub struct WatchStart {
    /// Objects to send as ADDED first (current state), key order.
    pub initial: Vec<Arc<Stored>>,
    /// Changes to replay after the start RV.
    pub replay: Vec<Arc<Change>>,
    /// Live changes after `rv`.
    pub rx: broadcast::Receiver<Arc<Change>>,
    /// The RV at which the watch was started.
    pub rv: u64,
}

fn parse_labels(obj: &Value) -> BTreeMap<String, String> {
    obj.pointer("/metadata/labels")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
                .collect()
        })
        .unwrap_or_default()
}

/// Namespace and name of an object.
pub fn key_of(obj: &Value) -> Key {
    let s = |p: &str| {
        obj.pointer(p)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    (s("/metadata/namespace"), s("/metadata/name"))
}

/// A write transaction; every mutation gets the next resourceVersion.
pub struct Txn<'a> {
    inner: &'a mut Inner,
    history_size: usize,
}

impl Txn<'_> {
    /// The current global resourceVersion.
    pub fn rv(&self) -> u64 {
        self.inner.rv
    }

    /// Reads one object.
    pub fn get(&self, storage: &str, ns: &str, name: &str) -> Option<Arc<Stored>> {
        self.inner
            .tables
            .get(storage)?
            .objects
            .get(&(ns.to_string(), name.to_string()))
            .cloned()
    }

    /// All objects of a storage key, optionally in one namespace.
    pub fn list(&self, storage: &str, ns: Option<&str>) -> Vec<Arc<Stored>> {
        let Some(t) = self.inner.tables.get(storage) else {
            return Vec::new();
        };
        match ns {
            Some(ns) => t
                .objects
                .range((ns.to_string(), String::new())..)
                .take_while(|((n, _), _)| n == ns)
                .map(|(_, v)| v.clone())
                .collect(),
            None => t.objects.values().cloned().collect(),
        }
    }

    /// Cluster IP / node port allocations.
    pub fn alloc(&mut self) -> &mut Allocator {
        &mut self.inner.alloc
    }

    fn make(&self, storage: &str, mut obj: Value, rv: u64) -> Result<Arc<Stored>, ApiError> {
        let res = resources::canonical(storage)
            .ok_or_else(|| ApiError::internal(format!("unknown storage {storage}")))?;
        if let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.insert("resourceVersion".into(), Value::String(rv.to_string()));
        }
        let (namespace, name) = key_of(&obj);
        let bytes = serde_json::to_vec(&obj)
            .map_err(|e| ApiError::internal(format!("serializing: {e}")))?;
        Ok(Arc::new(Stored {
            rv,
            namespace,
            name,
            labels: parse_labels(&obj),
            fields: fields::extract(res, &obj),
            bytes: Bytes::from(bytes),
        }))
    }

    fn record(&mut self, storage: &str, change: Change) -> Result<(), ApiError> {
        let history_size = self.history_size;
        let table = self
            .inner
            .tables
            .get_mut(storage)
            .ok_or_else(|| ApiError::internal(format!("unknown storage {storage}")))?;
        let change = Arc::new(change);
        table.history.push_back(change.clone());
        while table.history.len() > history_size {
            if let Some(old) = table.history.pop_front() {
                table.compacted_rv = old.rv;
            }
        }
        // No receivers is fine.
        let _ = table.tx.send(change);
        Ok(())
    }

    fn track_alloc(
        &mut self,
        storage: &str,
        stored: &Stored,
        deleted: bool,
    ) -> Result<(), ApiError> {
        if storage != "services" {
            return Ok(());
        }
        let key = (stored.namespace.clone(), stored.name.clone());
        if deleted {
            self.inner.alloc.release_service(&key);
        } else {
            let v = stored.value()?;
            self.inner.alloc.set_service(key, &v);
        }
        Ok(())
    }

    /// Stores a new object (caller checked it does not exist).
    pub fn create(&mut self, storage: &str, obj: Value) -> Result<Arc<Stored>, ApiError> {
        let rv = self.inner.rv + 1;
        let stored = self.make(storage, obj, rv)?;
        self.inner.rv = rv;
        let table = self
            .inner
            .tables
            .get_mut(storage)
            .ok_or_else(|| ApiError::internal(format!("unknown storage {storage}")))?;
        table.objects.insert(
            (stored.namespace.clone(), stored.name.clone()),
            stored.clone(),
        );
        self.track_alloc(storage, &stored, false)?;
        self.record(
            storage,
            Change {
                rv,
                kind: ChangeType::Added,
                object: stored.clone(),
                previous: None,
            },
        )?;
        Ok(stored)
    }

    /// Replaces an existing object.
    pub fn update(&mut self, storage: &str, obj: Value) -> Result<Arc<Stored>, ApiError> {
        let rv = self.inner.rv + 1;
        let stored = self.make(storage, obj, rv)?;
        self.inner.rv = rv;
        let table = self
            .inner
            .tables
            .get_mut(storage)
            .ok_or_else(|| ApiError::internal(format!("unknown storage {storage}")))?;
        let previous = table.objects.insert(
            (stored.namespace.clone(), stored.name.clone()),
            stored.clone(),
        );
        self.track_alloc(storage, &stored, false)?;
        self.record(
            storage,
            Change {
                rv,
                kind: if previous.is_some() {
                    ChangeType::Modified
                } else {
                    ChangeType::Added
                },
                object: stored.clone(),
                previous,
            },
        )?;
        Ok(stored)
    }

    /// Removes an object; returns its last state stamped with the delete RV.
    pub fn remove(
        &mut self,
        storage: &str,
        ns: &str,
        name: &str,
    ) -> Result<Option<Arc<Stored>>, ApiError> {
        let Some(previous) = self.get(storage, ns, name) else {
            return Ok(None);
        };
        let rv = self.inner.rv + 1;
        let last = self.make(storage, previous.value()?, rv)?;
        self.inner.rv = rv;
        if let Some(t) = self.inner.tables.get_mut(storage) {
            t.objects.remove(&(ns.to_string(), name.to_string()));
        }
        self.track_alloc(storage, &last, true)?;
        self.record(
            storage,
            Change {
                rv,
                kind: ChangeType::Deleted,
                object: last.clone(),
                previous: Some(previous),
            },
        )?;
        Ok(Some(last))
    }
}

impl Store {
    /// An empty store keeping `history_size` changes per resource.
    pub fn new(history_size: usize, watch_buffer: usize) -> Store {
        let mut tables = HashMap::new();
        for r in RESOURCES {
            tables.entry(r.storage).or_insert_with(|| Table {
                objects: BTreeMap::new(),
                history: VecDeque::new(),
                compacted_rv: 0,
                tx: broadcast::channel(watch_buffer.max(16)).0,
            });
        }
        Store {
            inner: RwLock::new(Inner {
                rv: 1,
                tables,
                alloc: Allocator::default(),
            }),
            history_size: history_size.max(1),
        }
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Inner> {
        self.inner.read().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `f` as one write transaction.
    pub fn write<T>(
        &self,
        f: impl FnOnce(&mut Txn<'_>) -> Result<T, ApiError>,
    ) -> Result<T, ApiError> {
        let mut guard = self.inner.write().unwrap_or_else(|p| p.into_inner());
        let mut txn = Txn {
            inner: &mut guard,
            history_size: self.history_size,
        };
        f(&mut txn)
    }

    /// Configures the service IP range.
    pub fn set_service_cidr(&self, cidr: ipnet::IpNet) {
        let mut guard = self.inner.write().unwrap_or_else(|p| p.into_inner());
        guard.alloc.set_cidr(cidr);
    }

    /// The current global resourceVersion.
    pub fn rv(&self) -> u64 {
        self.read().rv
    }

    /// Reads one object.
    pub fn get(&self, storage: &str, ns: &str, name: &str) -> Option<Arc<Stored>> {
        self.read()
            .tables
            .get(storage)?
            .objects
            .get(&(ns.to_string(), name.to_string()))
            .cloned()
    }

    /// Every object of a storage key, as JSON (small tables: RBAC objects).
    pub fn get_all(&self, storage: &str) -> Vec<serde_json::Value> {
        self.read()
            .tables
            .get(storage)
            .map(|t| {
                t.objects
                    .values()
                    .filter_map(|o| serde_json::from_slice(&o.bytes).ok())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Number of objects stored in all resources.
    pub fn object_count(&self) -> usize {
        self.read().tables.values().map(|t| t.objects.len()).sum()
    }

    /// Lists one page: objects of `storage` (in `ns` if given) matching
    /// `keep`, after key `after`, at most `limit` (0 = all), as of `at_rv`
    /// (None = now). A snapshot older than the history answers 410.
    pub fn list(
        &self,
        storage: &str,
        ns: Option<&str>,
        keep: &dyn Fn(&Stored) -> bool,
        after: Option<&Key>,
        limit: usize,
        at_rv: Option<u64>,
    ) -> Result<ListPage, ApiError> {
        let guard = self.read();
        let table = guard
            .tables
            .get(storage)
            .ok_or_else(|| ApiError::internal(format!("unknown storage {storage}")))?;
        let current = guard.rv;
        let rv = at_rv.unwrap_or(current);
        let snapshot;
        if rv < current && rv < table.compacted_rv {
            return Err(ApiError::expired(format!(
                "The resourceVersion for the provided list is too old. (requested {rv}, oldest available {})",
                table.compacted_rv
            )));
        }
        let objects = if rv >= current || table.history.back().is_none_or(|c| c.rv <= rv) {
            &table.objects
        } else {
            let mut m = table.objects.clone();
            for c in table.history.iter().rev().take_while(|c| c.rv > rv) {
                let key = (c.object.namespace.clone(), c.object.name.clone());
                match (&c.kind, &c.previous) {
                    (ChangeType::Added, _) => {
                        m.remove(&key);
                    }
                    (_, Some(prev)) => {
                        m.insert(key, prev.clone());
                    }
                    (_, None) => {}
                }
            }
            snapshot = m;
            &snapshot
        };
        let lower = match (after, ns) {
            (Some(k), _) => std::ops::Bound::Excluded(k.clone()),
            (None, Some(ns)) => std::ops::Bound::Included((ns.to_string(), String::new())),
            (None, None) => std::ops::Bound::Unbounded,
        };
        let mut items = Vec::new();
        let mut next = None;
        let mut remaining = 0usize;
        for ((ons, _), obj) in objects.range((lower, std::ops::Bound::Unbounded)) {
            if let Some(ns) = ns
                && ons != ns
            {
                break;
            }
            if !keep(obj) {
                continue;
            }
            if limit > 0 && items.len() >= limit {
                remaining += 1;
                continue;
            }
            items.push(obj.clone());
        }
        if remaining > 0
            && let Some(last) = items.last()
        {
            next = Some((last.namespace.clone(), last.name.clone()));
        }
        Ok(ListPage {
            items,
            rv,
            next,
            remaining,
        })
    }

    /// Starts a watch on `storage`. Returns 410 (as an error) when `from`
    /// is older than the retained history.
    pub fn watch(
        &self,
        storage: &str,
        ns: Option<&str>,
        from: WatchFrom,
    ) -> Result<WatchStart, ApiError> {
        let guard = self.read();
        let table = guard
            .tables
            .get(storage)
            .ok_or_else(|| ApiError::internal(format!("unknown storage {storage}")))?;
        let rx = table.tx.subscribe();
        let current = guard.rv;
        let in_ns = |o: &Arc<Stored>| ns.is_none_or(|n| o.namespace == n);
        match from {
            WatchFrom::Current => Ok(WatchStart {
                initial: table
                    .objects
                    .values()
                    .filter(|o| in_ns(o))
                    .cloned()
                    .collect(),
                replay: Vec::new(),
                rx,
                rv: current,
            }),
            WatchFrom::Now => Ok(WatchStart {
                initial: Vec::new(),
                replay: Vec::new(),
                rx,
                rv: current,
            }),
            WatchFrom::After(rv) => {
                if rv < table.compacted_rv {
                    return Err(ApiError::expired(format!(
                        "too old resource version: {rv} ({})",
                        table.compacted_rv
                    )));
                }
                if rv > current {
                    return Err(ApiError::timeout(format!(
                        "Too large resource version: {rv}, current: {current}"
                    )));
                }
                let start = table.history.partition_point(|c| c.rv <= rv);
                Ok(WatchStart {
                    initial: Vec::new(),
                    replay: table.history.range(start..).cloned().collect(),
                    rx,
                    rv: current,
                })
            }
        }
    }

    /// Forgets all history: every resourceVersion handed out so far answers
    /// 410 Gone to watches and consistent lists (the compaction knob). The
    /// global resourceVersion advances by one so that even the latest RV a
    /// client holds is compacted.
    pub fn compact(&self) -> u64 {
        let mut guard = self.inner.write().unwrap_or_else(|p| p.into_inner());
        guard.rv += 1;
        let rv = guard.rv;
        for t in guard.tables.values_mut() {
            t.history.clear();
            t.compacted_rv = rv;
        }
        rv
    }

    /// The RV below which history is gone for `storage`.
    pub fn compacted_rv(&self, storage: &str) -> u64 {
        self.read()
            .tables
            .get(storage)
            .map(|t| t.compacted_rv)
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn cm(name: &str, v: &str) -> Value {
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": "default"}, "data": {"v": v}})
    }

    #[test]
    fn rv_grows_and_history_bounds() {
        let s = Store::new(2, 16);
        let r0 = s.rv();
        s.write(|t| t.create("configmaps", cm("a", "1")))
            .expect("create");
        s.write(|t| t.update("configmaps", cm("a", "2")))
            .expect("update");
        s.write(|t| t.update("configmaps", cm("a", "3")))
            .expect("update");
        assert_eq!(s.rv(), r0 + 3);
        // history holds only the last two changes
        assert!(s.watch("configmaps", None, WatchFrom::After(r0)).is_err());
        let w = s
            .watch("configmaps", None, WatchFrom::After(r0 + 1))
            .expect("watch");
        assert_eq!(w.replay.len(), 2);
    }

    #[test]
    fn list_at_older_rv_rebuilds_snapshot() {
        let s = Store::new(100, 16);
        s.write(|t| t.create("configmaps", cm("a", "1")))
            .expect("create");
        let rv_a = s.rv();
        s.write(|t| t.create("configmaps", cm("b", "1")))
            .expect("create");
        s.write(|t| t.update("configmaps", cm("a", "2")))
            .expect("update");
        s.write(|t| t.remove("configmaps", "default", "a"))
            .expect("remove");
        let now = s
            .list("configmaps", None, &|_| true, None, 0, None)
            .expect("list");
        assert_eq!(now.items.len(), 1);
        let old = s
            .list("configmaps", None, &|_| true, None, 0, Some(rv_a))
            .expect("list");
        assert_eq!(old.items.len(), 1);
        assert_eq!(old.items[0].name, "a");
        assert_eq!(old.items[0].rv, rv_a);
        s.compact();
        assert!(
            s.list("configmaps", None, &|_| true, None, 0, Some(rv_a))
                .is_err()
        );
    }

    #[test]
    fn pages() {
        let s = Store::new(100, 16);
        for i in 0..5 {
            s.write(|t| t.create("configmaps", cm(&format!("c{i}"), "1")))
                .expect("create");
        }
        let p = s
            .list("configmaps", Some("default"), &|_| true, None, 2, None)
            .expect("list");
        assert_eq!(p.items.len(), 2);
        assert_eq!(p.remaining, 3);
        let p2 = s
            .list(
                "configmaps",
                Some("default"),
                &|_| true,
                p.next.as_ref(),
                2,
                None,
            )
            .expect("list");
        assert_eq!(p2.items[0].name, "c2");
    }
}
