//! What happened to an object, from two sources merged in time order: the
//! daemon's own timeline (the Events it recorded, its API writes) and the
//! Events in the API (every component's; reading them needs `list events`,
//! which neither the node's nor kube-proxy's identity has: a refusal is
//! named, and the daemon's records still tell keelson's part).

use std::time::SystemTime;

use k8s_openapi::api::core::v1::Event;
use kube::api::ListParams;

use super::api::Lookup;
use super::context::Context;
use super::words;
use crate::introspection::types::{RecordSource, TimelineRecord};

/// Which object.
#[derive(Debug, Clone)]
pub struct Subject<'a> {
    /// `Pod`, `Node`, `Service`.
    pub kind: &'a str,
    /// Namespace of the object (`None` for nodes).
    pub namespace: Option<&'a str>,
    /// Name.
    pub name: &'a str,
    /// UID, when known.
    pub uid: Option<&'a str>,
}

fn event_time(e: &Event) -> Option<SystemTime> {
    e.last_timestamp
        .as_ref()
        .map(words::api_time)
        .or_else(|| e.event_time.as_ref().map(|t| SystemTime::from(t.0)))
        .or_else(|| e.first_timestamp.as_ref().map(words::api_time))
        .or_else(|| e.metadata.creation_timestamp.as_ref().map(words::api_time))
}

/// An API Event as a timeline record.
pub fn from_event(e: &Event) -> TimelineRecord {
    let o = &e.involved_object;
    TimelineRecord {
        time: event_time(e).map(words::rfc3339).unwrap_or_default(),
        source: RecordSource::ClusterEvent,
        kind: o.kind.clone().unwrap_or_default(),
        namespace: o.namespace.clone().unwrap_or_default(),
        name: o.name.clone().unwrap_or_default(),
        uid: o.uid.clone().unwrap_or_default(),
        field_path: o.field_path.clone().unwrap_or_default(),
        type_: e.type_.clone().unwrap_or_default(),
        reason: e.reason.clone().unwrap_or_default(),
        message: e.message.clone().unwrap_or_default(),
        count: e.count,
    }
}

/// Every record about `s`, oldest first; an API Event that repeats one the
/// daemon recorded itself is kept once (the daemon's copy).
pub async fn gather(ctx: &Context, s: &Subject<'_>) -> Vec<TimelineRecord> {
    let (api, daemon) = (ctx.api.as_ref(), ctx.daemon());
    let mut out: Vec<TimelineRecord> = Vec::new();
    if let Some(d) = daemon
        && let Ok(recs) = d
            .timeline(s.kind, s.namespace, s.name, "1970-01-01T00:00:00Z")
            .await
    {
        out.extend(
            recs.into_iter()
                .filter(|r| s.uid.is_none_or(|u| r.uid.is_empty() || r.uid == u)),
        );
    }
    if let Some(api) = api {
        // Node events live in the default namespace, as kubelet writes them.
        let ns = s.namespace.unwrap_or("default");
        let mut fields = format!(
            "involvedObject.kind={},involvedObject.name={}",
            s.kind, s.name
        );
        if let Some(u) = s.uid {
            fields.push_str(&format!(",involvedObject.uid={u}"));
        }
        let what = format!("the {}'s events", s.kind.to_lowercase());
        if let Lookup::Found(events) = api
            .list::<Event>(ns, &ListParams::default().fields(&fields), &what)
            .await
        {
            for e in &events {
                let r = from_event(e);
                let dup = out.iter().any(|d| {
                    d.source == RecordSource::Event
                        && d.reason == r.reason
                        && d.message == r.message
                });
                if !dup {
                    out.push(r);
                }
            }
        }
    }
    sort(&mut out);
    out
}

/// Orders records by time (parsed: RFC 3339 strings with different
/// fractions do not sort as text).
pub fn sort(recs: &mut [TimelineRecord]) {
    recs.sort_by_key(|r| words::parse_time(&r.time));
}

/// The newest record with `reason` (and a message starting with `prefix`,
/// and the container's field path when given).
pub fn latest<'a>(
    recs: &'a [TimelineRecord],
    reason: &str,
    prefix: &str,
    container: Option<&str>,
) -> Option<&'a TimelineRecord> {
    recs.iter().rev().find(|r| {
        r.reason == reason
            && r.message.starts_with(prefix)
            && container.is_none_or(|c| r.field_path.ends_with(&format!("{{{c}}}")))
    })
}

/// Records at or after `since`; a run of identical records (the same
/// event recorded on each sync) is kept once, with its count and the time
/// of the last one.
pub fn since(recs: &[TimelineRecord], since: SystemTime) -> Vec<TimelineRecord> {
    let mut out: Vec<TimelineRecord> = Vec::new();
    for r in recs
        .iter()
        .filter(|r| words::parse_time(&r.time).is_some_and(|t| t >= since))
    {
        if let Some(last) = out.last_mut()
            && last.source == r.source
            && last.reason == r.reason
            && last.message == r.message
            && last.field_path == r.field_path
        {
            last.count = Some(last.count.unwrap_or(1) + r.count.unwrap_or(1));
            last.time = r.time.clone();
            continue;
        }
        out.push(r.clone());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(time: &str, reason: &str) -> TimelineRecord {
        TimelineRecord {
            time: time.into(),
            source: RecordSource::Event,
            kind: "Pod".into(),
            namespace: "default".into(),
            name: "web".into(),
            uid: String::new(),
            field_path: "spec.containers{app}".into(),
            type_: "Warning".into(),
            reason: reason.into(),
            message: format!("{reason} message"),
            count: None,
        }
    }

    #[test]
    fn records_sort_by_time_and_repeats_fold() {
        let mut recs = vec![
            rec("2026-01-01T00:00:03.554Z", "BackOff"),
            rec("2026-01-01T00:00:03.55Z", "BackOff"),
            rec("2026-01-01T00:00:03.6Z", "BackOff"),
            rec("2026-01-01T00:00:01Z", "Started"),
            rec("2025-12-31T00:00:00Z", "Pulled"),
        ];
        sort(&mut recs);
        let out = since(
            &recs,
            words::parse_time("2026-01-01T00:00:00Z").expect("time"),
        );
        let got: Vec<(String, Option<i32>, String)> = out
            .into_iter()
            .map(|r| (r.reason, r.count, r.time))
            .collect();
        assert_eq!(
            got,
            [
                (
                    "Started".to_string(),
                    None,
                    "2026-01-01T00:00:01Z".to_string()
                ),
                (
                    "BackOff".to_string(),
                    Some(3),
                    "2026-01-01T00:00:03.6Z".to_string()
                ),
            ]
        );
    }
}
