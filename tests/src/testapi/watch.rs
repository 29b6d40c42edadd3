//! Watch streams: initial state, replay from a resourceVersion, live
//! changes filtered per watcher (an object leaving a selector is a DELETED
//! for that watcher), bookmarks, the `k8s.io/initial-events-end` bookmark
//! of streaming lists, timeouts, and 410 Gone for compacted versions.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::Stream;
use rand::Rng;
use serde_json::json;
use tokio::sync::broadcast::error::RecvError;

use super::error::ApiError;
use super::objects::{self, Filters};
use super::resources::ResourceInfo;
use super::state::ApiState;
use super::store::{Change, ChangeType, Stored, WatchFrom};
use super::table::{self, IncludeObject};
use super::util::{self, Query};

/// A validated watch request.
pub struct WatchRequest {
    /// Resource as addressed.
    pub res: &'static ResourceInfo,
    /// Namespace scope.
    pub ns: Option<String>,
    /// Selectors.
    pub filters: Filters,
    /// Starting point.
    pub from: WatchFrom,
    /// allowWatchBookmarks.
    pub bookmarks: bool,
    /// sendInitialEvents=true: end the initial events with a bookmark.
    pub initial_end_bookmark: bool,
    /// When the server ends the watch.
    pub timeout: Duration,
    /// Render objects as Tables.
    pub table: Option<IncludeObject>,
    /// Render objects as PartialObjectMetadata.
    pub metadata_only: bool,
}

impl WatchRequest {
    /// Reads and validates the watch query parameters.
    pub fn parse(
        res: &'static ResourceInfo,
        ns: Option<String>,
        name: Option<&str>,
        q: &Query,
    ) -> Result<WatchRequest, ApiError> {
        let mut q = q.clone();
        if let Some(n) = name {
            // Legacy /watch/.../<name>: a watch of one object.
            let fs = q.get("fieldSelector").cloned().unwrap_or_default();
            let extra = format!("metadata.name={n}");
            q.insert(
                "fieldSelector".into(),
                if fs.is_empty() {
                    extra
                } else {
                    format!("{fs},{extra}")
                },
            );
        }
        let filters = Filters::parse(res, &q)?;
        let rv = q.get("resourceVersion").cloned().unwrap_or_default();
        let rv_match = q.get("resourceVersionMatch").cloned().unwrap_or_default();
        let send_initial = util::flag(&q, "sendInitialEvents");
        let bookmarks = util::flag(&q, "allowWatchBookmarks").unwrap_or(false);
        if let Some(true) = send_initial {
            if rv_match != "NotOlderThan" {
                return Err(ApiError::invalid("meta.k8s.io", "ListOptions", "", vec![super::error::Cause {
                    reason: "FieldValueForbidden",
                    message: "Forbidden: sendInitialEvents is forbidden for watch unless resourceVersionMatch is set to NotOlderThan".into(),
                    field: "sendInitialEvents".into(),
                }]));
            }
            if !bookmarks {
                return Err(ApiError::invalid("meta.k8s.io", "ListOptions", "", vec![super::error::Cause {
                    reason: "FieldValueForbidden",
                    message: "Forbidden: allowWatchBookmarks must be set to true when sendInitialEvents is true".into(),
                    field: "allowWatchBookmarks".into(),
                }]));
            }
        } else if !rv_match.is_empty() && send_initial.is_none() {
            return Err(ApiError::invalid("meta.k8s.io", "ListOptions", "", vec![super::error::Cause {
                reason: "FieldValueForbidden",
                message: "Forbidden: resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided".into(),
                field: "resourceVersionMatch".into(),
            }]));
        }
        let parsed_rv =
            if rv.is_empty() || rv == "0" {
                None
            } else {
                Some(rv.parse::<u64>().map_err(|_| {
                    ApiError::bad_request(format!("invalid resource version: {rv}"))
                })?)
            };
        let from = match (send_initial, parsed_rv) {
            (Some(true), _) => WatchFrom::Current,
            (Some(false), None) => WatchFrom::Now,
            (_, Some(n)) => WatchFrom::After(n),
            (None, None) => WatchFrom::Current,
        };
        let timeout = match q.get("timeoutSeconds").filter(|t| !t.is_empty()) {
            Some(t) => Duration::from_secs(
                t.parse::<u64>()
                    .map_err(|_| ApiError::bad_request(format!("invalid timeoutSeconds: {t}")))?,
            ),
            // Upstream: a random time between the minimum request timeout
            // (1800 s) and twice that.
            None => Duration::from_secs(rand::rng().random_range(1800..3600)),
        };
        Ok(WatchRequest {
            res,
            ns,
            filters,
            from,
            bookmarks,
            initial_end_bookmark: send_initial == Some(true),
            timeout,
            table: None,
            metadata_only: false,
        })
    }
}

fn event_line(ty: &str, object: &[u8]) -> Bytes {
    let mut out = Vec::with_capacity(object.len() + 32);
    out.extend_from_slice(b"{\"type\":\"");
    out.extend_from_slice(ty.as_bytes());
    out.extend_from_slice(b"\",\"object\":");
    out.extend_from_slice(object);
    out.extend_from_slice(b"}\n");
    Bytes::from(out)
}

/// The ERROR event carrying a Status.
pub fn error_line(e: &ApiError) -> Bytes {
    event_line("ERROR", e.to_status().to_string().as_bytes())
}

fn bookmark_line(res: &ResourceInfo, rv: u64, initial_end: bool) -> Bytes {
    let mut meta = json!({"resourceVersion": rv.to_string(), "creationTimestamp": null});
    if initial_end {
        meta["annotations"] = json!({"k8s.io/initial-events-end": "true"});
    }
    let obj = json!({"kind": res.kind, "apiVersion": res.api_version(), "metadata": meta});
    event_line("BOOKMARK", obj.to_string().as_bytes())
}

fn render(req: &WatchRequest, ty: &str, obj: &Stored) -> Option<Bytes> {
    if req.metadata_only {
        let v = obj.value().ok()?;
        let p = json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                       "metadata": v.get("metadata").cloned().unwrap_or(json!({}))});
        return Some(event_line(ty, p.to_string().as_bytes()));
    }
    match req.table {
        None => objects::present(req.res, obj)
            .ok()
            .map(|b| event_line(ty, &b)),
        Some(include) => {
            let v = objects::present_value(req.res, obj).ok()?;
            let t = table::table(
                req.res,
                &[v],
                json!({"resourceVersion": obj.rv.to_string()}),
                include,
            );
            Some(event_line(ty, t.to_string().as_bytes()))
        }
    }
}

fn in_scope(req: &WatchRequest, o: &Stored) -> bool {
    req.ns.as_deref().is_none_or(|n| n == o.namespace) && req.filters.matches(o)
}

/// The event (if any) a change is for this watcher.
fn for_watcher(req: &WatchRequest, c: &Change) -> Option<Bytes> {
    let now = in_scope(req, &c.object);
    let before = c.previous.as_ref().is_some_and(|p| in_scope(req, p));
    match c.kind {
        ChangeType::Added if now => render(req, "ADDED", &c.object),
        ChangeType::Modified if now && before => render(req, "MODIFIED", &c.object),
        ChangeType::Modified if now => render(req, "ADDED", &c.object),
        ChangeType::Modified if before => render(req, "DELETED", &c.object),
        ChangeType::Deleted if before => render(req, "DELETED", &c.object),
        _ => None,
    }
}

/// Starts the watch; the stream yields newline-delimited JSON events.
pub fn stream(
    state: Arc<ApiState>,
    req: WatchRequest,
) -> impl Stream<Item = Bytes> + Send + 'static {
    async_stream::stream! {
        let _guard = state.knobs.watch_guard();
        let mut drop_rx = state.knobs.drop_rx();
        drop_rx.borrow_and_update();
        let from = req.from;
        let start = match state.store.watch(req.res.storage, req.ns.as_deref(), from) {
            Ok(s) => s,
            Err(e) => {
                yield error_line(&e);
                return;
            }
        };
        let mut rx = start.rx;
        for obj in &start.initial {
            if req.filters.matches(obj)
                && let Some(line) = render(&req, "ADDED", obj)
            {
                yield line;
            }
        }
        let mut last_rv = start.rv;
        if req.initial_end_bookmark {
            yield bookmark_line(req.res, start.rv, true);
        }
        for c in &start.replay {
            if let Some(line) = for_watcher(&req, c) {
                yield line;
            }
        }
        let deadline = tokio::time::sleep(req.timeout);
        tokio::pin!(deadline);
        let period = state.config.bookmark_interval.max(Duration::from_millis(10));
        let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
        loop {
            tokio::select! {
                _ = &mut deadline => {
                    if req.bookmarks {
                        yield bookmark_line(req.res, last_rv, false);
                    }
                    break;
                }
                _ = drop_rx.changed() => break,
                _ = ticker.tick(), if req.bookmarks => {
                    yield bookmark_line(req.res, last_rv, false);
                }
                r = rx.recv() => match r {
                    Ok(c) => {
                        last_rv = c.rv;
                        if let Some(line) = for_watcher(&req, &c) {
                            yield line;
                        }
                    }
                    // A watcher too slow for the buffer is closed, as
                    // upstream closes slow watchers; clients re-watch.
                    Err(RecvError::Lagged(_)) | Err(RecvError::Closed) => break,
                },
            }
        }
    }
}
