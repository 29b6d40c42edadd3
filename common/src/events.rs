//! core/v1 Events as kubelet writes them (`source.component: kubelet`,
//! `source.host: <node>`), with client-go's behaviour where it matters to
//! operators and to the API server's load:
//! - identical events (same object, type, reason, message) within 10 minutes
//!   are folded into one Event whose `count` and `lastTimestamp` grow;
//! - a spam filter per involved object (a token bucket of 25, refilled one
//!   per 5 minutes) drops floods;
//! - recording never blocks the caller: events go through a bounded queue and
//!   are dropped (with a log line and a metric) when the API server is gone
//!   for long;
//! - an event may carry annotations on its own metadata, as client-go's
//!   `AnnotatedEventf` puts them (`makeEvent` in
//!   staging/src/k8s.io/client-go/tools/record/event.go). They are not part
//!   of the folding key, as there: a folded repeat keeps the first write's.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use kube::api::{Api, Patch, PatchParams, PostParams};
use prometheus::{IntCounterVec, Opts, Registry};
use tokio::sync::mpsc;
use tokio::time::Instant;

/// Event type, as the API spells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventType {
    /// `Normal`.
    Normal,
    /// `Warning`.
    Warning,
}

impl EventType {
    fn as_str(self) -> &'static str {
        match self {
            EventType::Normal => "Normal",
            EventType::Warning => "Warning",
        }
    }
}

struct Pending {
    object: ObjectReference,
    kind: EventType,
    reason: String,
    message: String,
    annotations: BTreeMap<String, String>,
}

/// Records events; cheap to clone.
#[derive(Clone)]
pub struct EventRecorder {
    tx: mpsc::Sender<Pending>,
    dropped: Option<IntCounterVec>,
    timeline: Option<crate::introspection::Timeline>,
}

impl std::fmt::Debug for EventRecorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventRecorder").finish_non_exhaustive()
    }
}

const QUEUE: usize = 1000;
const SPAM_BURST: f64 = 25.0;
const SPAM_REFILL: Duration = Duration::from_secs(300);
const DEDUP_WINDOW: Duration = Duration::from_secs(600);
const MAX_ATTEMPTS: u32 = 12;

impl EventRecorder {
    /// Starts the recorder's writer task. `component` is the event source
    /// (`kubelet` for the node role), `host` the node name.
    pub fn start(
        client: kube::Client,
        component: &str,
        host: &str,
        registry: &Registry,
    ) -> EventRecorder {
        let (tx, rx) = mpsc::channel(QUEUE);
        let dropped = IntCounterVec::new(
            Opts::new(
                "keelson_events_dropped_total",
                "Events not written to the API server, by reason (queue_full, spam_filter, api_error)",
            ),
            &["reason"],
        )
        .ok();
        if let Some(d) = &dropped {
            crate::observability::metrics::register(registry, d.clone());
        }
        let writer = Writer {
            client,
            source: EventSource {
                component: Some(component.to_string()),
                host: Some(host.to_string()),
            },
            seen: HashMap::new(),
            buckets: HashMap::new(),
            dropped: dropped.clone(),
        };
        tokio::spawn(writer.run(rx));
        EventRecorder {
            tx,
            dropped,
            timeline: None,
        }
    }

    /// Also keeps every event on `timeline` (what `keelson diagnose` shows,
    /// even when the API server never got the event).
    pub fn with_timeline(mut self, timeline: crate::introspection::Timeline) -> Self {
        self.timeline = Some(timeline);
        self
    }

    /// Queues an event about `object`. Never blocks; drops when the queue is full.
    pub fn event(
        &self,
        object: &ObjectReference,
        kind: EventType,
        reason: &str,
        message: impl Into<String>,
    ) {
        self.annotated_event(object, BTreeMap::new(), kind, reason, message);
    }

    /// [`EventRecorder::event`] with `annotations` on the Event's metadata
    /// (client-go's `AnnotatedEventf`; none are written when empty, as Go's
    /// `omitempty` leaves out an empty map).
    pub fn annotated_event(
        &self,
        object: &ObjectReference,
        annotations: BTreeMap<String, String>,
        kind: EventType,
        reason: &str,
        message: impl Into<String>,
    ) {
        let message = message.into();
        if let Some(t) = &self.timeline {
            t.record(
                crate::introspection::types::RecordSource::Event,
                crate::introspection::ObjectKey {
                    kind: object.kind.clone().unwrap_or_default(),
                    namespace: object.namespace.clone().unwrap_or_default(),
                    name: object.name.clone().unwrap_or_default(),
                    uid: object.uid.clone().unwrap_or_default(),
                    field_path: object.field_path.clone().unwrap_or_default(),
                },
                kind.as_str(),
                reason,
                &message,
            );
        }
        let p = Pending {
            object: object.clone(),
            kind,
            reason: reason.to_string(),
            message,
            annotations,
        };
        if self.tx.try_send(p).is_err() {
            count_drop(&self.dropped, "queue_full");
            tracing::warn!(reason, "event queue full; event dropped");
        }
    }
}

fn count_drop(dropped: &Option<IntCounterVec>, reason: &str) {
    if let Some(d) = dropped {
        d.with_label_values(&[reason]).inc();
    }
}

type DedupKey = (String, String, &'static str, String, String);

struct Seen {
    name: String,
    namespace: String,
    count: i32,
    last_write: Instant,
}

struct Bucket {
    tokens: f64,
    last: Instant,
}

struct Writer {
    client: kube::Client,
    source: EventSource,
    seen: HashMap<DedupKey, Seen>,
    buckets: HashMap<String, Bucket>,
    dropped: Option<IntCounterVec>,
}

impl Writer {
    async fn run(mut self, mut rx: mpsc::Receiver<Pending>) {
        while let Some(p) = rx.recv().await {
            self.handle(p).await;
        }
    }

    fn allow(&mut self, object_key: &str) -> bool {
        let now = Instant::now();
        let b = self
            .buckets
            .entry(object_key.to_string())
            .or_insert(Bucket {
                tokens: SPAM_BURST,
                last: now,
            });
        let refill =
            now.saturating_duration_since(b.last).as_secs_f64() / SPAM_REFILL.as_secs_f64();
        b.tokens = (b.tokens + refill).min(SPAM_BURST);
        b.last = now;
        if b.tokens >= 1.0 {
            b.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    async fn handle(&mut self, p: Pending) {
        let obj_key = format!(
            "{}/{}/{}/{}",
            p.object.kind.as_deref().unwrap_or_default(),
            p.object.namespace.as_deref().unwrap_or_default(),
            p.object.name.as_deref().unwrap_or_default(),
            p.object.uid.as_deref().unwrap_or_default()
        );
        if !self.allow(&obj_key) {
            count_drop(&self.dropped, "spam_filter");
            tracing::debug!(object = %obj_key, reason = %p.reason, "event dropped by spam filter");
            return;
        }
        let key: DedupKey = (
            obj_key.clone(),
            p.object.field_path.clone().unwrap_or_default(),
            p.kind.as_str(),
            p.reason.clone(),
            p.message.clone(),
        );
        let now = jiff::Timestamp::now();
        let namespace = p
            .object
            .namespace
            .clone()
            .unwrap_or_else(|| "default".to_string());
        let api: Api<Event> = Api::namespaced(self.client.clone(), &namespace);

        if let Some(seen) = self.seen.get_mut(&key)
            && seen.last_write.elapsed() < DEDUP_WINDOW
        {
            let count = seen.count + 1;
            let patch = serde_json::json!({
                "count": count,
                "lastTimestamp": Time(now),
            });
            let name = seen.name.clone();
            let ns = seen.namespace.clone();
            let api: Api<Event> = Api::namespaced(self.client.clone(), &ns);
            let pp = PatchParams::default();
            let body = Patch::Merge(&patch);
            match with_retries(|| api.patch(&name, &pp, &body)).await {
                Ok(_) => {
                    seen.count = count;
                    seen.last_write = Instant::now();
                    return;
                }
                Err(e) => {
                    tracing::debug!(error = %e, event = %name, "patching event failed; creating a new one");
                }
            }
        }

        let obj_name = p
            .object
            .name
            .clone()
            .unwrap_or_else(|| "unknown".to_string());
        let name = format!("{obj_name}.{:x}", now.as_nanosecond());
        let first = Time(now);
        let ev = Event {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace: Some(namespace.clone()),
                annotations: (!p.annotations.is_empty()).then(|| p.annotations.clone()),
                ..ObjectMeta::default()
            },
            involved_object: p.object.clone(),
            reason: Some(p.reason.clone()),
            message: Some(p.message.clone()),
            type_: Some(p.kind.as_str().to_string()),
            source: Some(self.source.clone()),
            count: Some(1),
            first_timestamp: Some(first.clone()),
            last_timestamp: Some(first),
            event_time: None::<MicroTime>,
            reporting_component: self.source.component.clone(),
            reporting_instance: self.source.host.clone(),
            ..Event::default()
        };
        let post = PostParams::default();
        match with_retries(|| api.create(&post, &ev)).await {
            Ok(_) => {
                self.seen.insert(
                    key,
                    Seen {
                        name,
                        namespace,
                        count: 1,
                        last_write: Instant::now(),
                    },
                );
                if self.seen.len() > 4096 {
                    self.seen
                        .retain(|_, s| s.last_write.elapsed() < DEDUP_WINDOW);
                }
            }
            Err(e) => {
                count_drop(&self.dropped, "api_error");
                tracing::warn!(error = %e, reason = %p.reason, object = %obj_key, "could not write event; dropped");
            }
        }
    }
}

async fn with_retries<T, F, Fut>(mut f: F) -> Result<T, kube::Error>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, kube::Error>>,
{
    let mut delay = Duration::from_millis(200);
    let mut attempt = 1;
    loop {
        match f().await {
            Ok(v) => return Ok(v),
            Err(kube::Error::Api(s))
                if s.code == 409 || s.code == 404 || s.code == 422 || s.code == 403 =>
            {
                return Err(kube::Error::Api(s));
            }
            Err(e) if attempt >= MAX_ATTEMPTS => return Err(e),
            Err(_) => {
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(10));
                attempt += 1;
            }
        }
    }
}

/// An `ObjectReference` to a Pod for events.
pub fn pod_ref(
    pod: &k8s_openapi::api::core::v1::Pod,
    field_path: Option<String>,
) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".to_string()),
        kind: Some("Pod".to_string()),
        name: pod.metadata.name.clone(),
        namespace: pod.metadata.namespace.clone(),
        uid: pod.metadata.uid.clone(),
        resource_version: pod.metadata.resource_version.clone(),
        field_path,
    }
}

/// An `ObjectReference` to this Node for events (kubelet uses the node name as UID).
pub fn node_ref(node_name: &str) -> ObjectReference {
    ObjectReference {
        api_version: None,
        kind: Some("Node".to_string()),
        name: Some(node_name.to_string()),
        namespace: None,
        uid: Some(node_name.to_string()),
        resource_version: None,
        field_path: None,
    }
}
