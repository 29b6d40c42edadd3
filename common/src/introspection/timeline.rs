//! keelson's own record of what it did, for `keelson diagnose --since`: the
//! Events it recorded (before the API server's spam filter or an outage
//! could lose them) and the writes it sent to the API server with their
//! outcome. A bounded ring: the oldest records go first.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::SystemTime;

use super::types::{RecordSource, TimelineRecord};

/// Records kept (about 1 MiB at most).
pub const CAPACITY: usize = 4096;

/// The object a record is about.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ObjectKey {
    /// `Pod`, `Node`, `Service`, ...
    pub kind: String,
    /// Namespace (empty for cluster-scoped objects).
    pub namespace: String,
    /// Name.
    pub name: String,
    /// UID when known.
    pub uid: String,
    /// Field path (`spec.containers{app}`).
    pub field_path: String,
}

#[derive(Debug, Clone)]
struct Entry {
    at: SystemTime,
    source: RecordSource,
    object: ObjectKey,
    type_: String,
    reason: String,
    message: String,
}

/// The ring; cheap to clone.
#[derive(Debug, Clone)]
pub struct Timeline {
    inner: Arc<Mutex<VecDeque<Entry>>>,
    capacity: usize,
}

impl Default for Timeline {
    fn default() -> Self {
        Timeline::with_capacity(CAPACITY)
    }
}

/// Which records a reader wants.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    /// Only records at or after this time.
    pub since: Option<SystemTime>,
    /// Only this kind.
    pub kind: Option<String>,
    /// Only this namespace.
    pub namespace: Option<String>,
    /// Only this name.
    pub name: Option<String>,
    /// Only this UID (records without a UID still match by name).
    pub uid: Option<String>,
}

impl Filter {
    fn matches(&self, e: &Entry) -> bool {
        let eq = |want: &Option<String>, have: &str| want.as_deref().is_none_or(|w| w == have);
        self.since.is_none_or(|s| e.at >= s)
            && eq(&self.kind, &e.object.kind)
            && eq(&self.namespace, &e.object.namespace)
            && eq(&self.name, &e.object.name)
            && (e.object.uid.is_empty() || eq(&self.uid, &e.object.uid))
    }
}

/// RFC 3339 (UTC, seconds) of a time.
pub fn rfc3339(t: SystemTime) -> String {
    jiff::Timestamp::try_from(t)
        .map(|ts| ts.round(jiff::Unit::Millisecond).unwrap_or(ts).to_string())
        .unwrap_or_default()
}

impl Timeline {
    /// A ring holding at most `capacity` records.
    pub fn with_capacity(capacity: usize) -> Self {
        Timeline {
            inner: Arc::new(Mutex::new(VecDeque::with_capacity(capacity.min(256)))),
            capacity: capacity.max(1),
        }
    }

    /// Adds a record now.
    pub fn record(
        &self,
        source: RecordSource,
        object: ObjectKey,
        type_: &str,
        reason: &str,
        message: &str,
    ) {
        self.record_at(SystemTime::now(), source, object, type_, reason, message);
    }

    /// Adds a record at `at`.
    pub fn record_at(
        &self,
        at: SystemTime,
        source: RecordSource,
        object: ObjectKey,
        type_: &str,
        reason: &str,
        message: &str,
    ) {
        let mut ring = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        if ring.len() >= self.capacity {
            ring.pop_front();
        }
        ring.push_back(Entry {
            at,
            source,
            object,
            type_: type_.to_string(),
            reason: reason.to_string(),
            message: message.to_string(),
        });
    }

    /// The records matching `filter`, oldest first.
    pub fn query(&self, filter: &Filter) -> Vec<TimelineRecord> {
        let ring = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        ring.iter()
            .filter(|e| filter.matches(e))
            .map(|e| TimelineRecord {
                time: rfc3339(e.at),
                source: e.source,
                kind: e.object.kind.clone(),
                namespace: e.object.namespace.clone(),
                name: e.object.name.clone(),
                uid: e.object.uid.clone(),
                field_path: e.object.field_path.clone(),
                type_: e.type_.clone(),
                reason: e.reason.clone(),
                message: e.message.clone(),
                count: None,
            })
            .collect()
    }

    /// Records held.
    pub fn len(&self) -> usize {
        self.inner
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// True when nothing was recorded.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn pod(name: &str, uid: &str) -> ObjectKey {
        ObjectKey {
            kind: "Pod".into(),
            namespace: "default".into(),
            name: name.into(),
            uid: uid.into(),
            field_path: String::new(),
        }
    }

    #[test]
    fn keeps_the_newest_records_and_filters_them() {
        let t = Timeline::with_capacity(3);
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        for i in 0..5u64 {
            t.record_at(
                t0 + Duration::from_secs(i),
                RecordSource::Event,
                pod(if i % 2 == 0 { "a" } else { "b" }, "u"),
                "Normal",
                "Pulled",
                &format!("n{i}"),
            );
        }
        assert_eq!(t.len(), 3);
        let all: Vec<String> = t
            .query(&Filter::default())
            .into_iter()
            .map(|r| r.message)
            .collect();
        assert_eq!(all, ["n2", "n3", "n4"]);
        let a = t.query(&Filter {
            name: Some("a".into()),
            since: Some(t0 + Duration::from_secs(3)),
            ..Filter::default()
        });
        assert_eq!(a.len(), 1);
        assert_eq!(a[0].message, "n4");
        assert_eq!(a[0].time, "2023-11-14T22:13:24Z");
        let other_uid = t.query(&Filter {
            uid: Some("other".into()),
            ..Filter::default()
        });
        assert!(other_uid.is_empty(), "{other_uid:?}");
    }
}
