//! The generic verbs on stored objects: get, list, create, update, patch,
//! delete and deletecollection, with the metadata rules every resource
//! shares (uid, creationTimestamp, resourceVersion preconditions,
//! generation, finalizers, no-op updates) and the per-kind hooks.

use std::sync::Arc;

use bytes::Bytes;
use serde_json::{Map, Value, json};

use super::error::{ApiError, Cause};
use super::events;
use super::patch::{self, PatchType};
use super::resources::{self, ResourceInfo};
use super::selectors::{FieldSelector, LabelSelector};
use super::state::ApiState;
use super::store::{Stored, Txn};
use super::util::{self, Query};
use super::{admission, defaults, namespaces, pods, schema, services, validation};

/// A JSON answer: HTTP code and body.
pub struct JsonReply {
    /// HTTP status.
    pub code: u16,
    /// Body.
    pub body: Bytes,
    /// Warnings for `Warning: 299` headers.
    pub warnings: Vec<String>,
}

impl JsonReply {
    /// An answer with a code and body, no warnings.
    pub fn new(code: u16, body: Bytes) -> JsonReply {
        JsonReply {
            code,
            body,
            warnings: Vec::new(),
        }
    }
    fn ok(body: Bytes) -> JsonReply {
        JsonReply::new(200, body)
    }
    fn created(body: Bytes) -> JsonReply {
        JsonReply::new(201, body)
    }
    /// Serializes a value.
    pub fn value(code: u16, v: &Value) -> JsonReply {
        JsonReply::new(code, Bytes::from(serde_json::to_vec(v).unwrap_or_default()))
    }
    fn warn(mut self, w: Vec<String>) -> JsonReply {
        self.warnings = w;
        self
    }
}

fn field_check(t: &Target<'_>, q: &Query, obj: &Value) -> Result<Vec<String>, ApiError> {
    schema::validate_fields(
        t.res.group,
        t.res.version,
        t.res.kind,
        obj,
        q.get("fieldValidation").map(String::as_str),
    )
}

/// What a request addresses.
pub struct Target<'a> {
    /// The resource as addressed (a view for events.k8s.io).
    pub res: &'static ResourceInfo,
    /// Namespace from the URL.
    pub ns: Option<&'a str>,
    /// Name from the URL.
    pub name: Option<&'a str>,
    /// Subresource from the URL.
    pub sub: Option<&'a str>,
    /// Who is asking (None for the server's own controllers).
    pub user: Option<&'a super::authn::UserInfo>,
}

impl Target<'_> {
    fn ns_str(&self) -> &str {
        self.ns.unwrap_or_default()
    }
    fn name_str(&self) -> &str {
        self.name.unwrap_or_default()
    }
    /// Whether this resource is a converted view of another's storage.
    pub fn is_view(&self) -> bool {
        resources::canonical(self.res.storage).is_some_and(|c| c.group != self.res.group)
    }
}

/// The stored object in the representation of `res`.
pub fn present(res: &ResourceInfo, stored: &Stored) -> Result<Bytes, ApiError> {
    if resources::canonical(res.storage).is_some_and(|c| c.group != res.group) {
        let v = events::from_core(&stored.value()?);
        return serde_json::to_vec(&v)
            .map(Bytes::from)
            .map_err(|e| ApiError::internal(e.to_string()));
    }
    Ok(stored.bytes.clone())
}

/// The stored object as a value in the representation of `res`.
pub fn present_value(res: &ResourceInfo, stored: &Stored) -> Result<Value, ApiError> {
    let v = stored.value()?;
    if resources::canonical(res.storage).is_some_and(|c| c.group != res.group) {
        return Ok(events::from_core(&v));
    }
    Ok(v)
}

fn intake(t: &Target<'_>, v: Value) -> Value {
    if t.is_view() { events::to_core(&v) } else { v }
}

/// Parses a request body (JSON, or YAML for `application/yaml`).
pub fn parse_body(content_type: &str, body: &[u8]) -> Result<Value, ApiError> {
    let base = content_type.split(';').next().unwrap_or_default().trim();
    match base {
        "" | "application/json" | "*/*" => serde_json::from_slice(body).map_err(|e| {
            ApiError::bad_request(format!(
                "the body of the request was in an unknown format: couldn't decode JSON: {e}"
            ))
        }),
        "application/yaml" => serde_yaml::from_slice(body)
            .map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}"))),
        other => Err(ApiError::unsupported_media_type(other)),
    }
}

fn meta(obj: &mut Value) -> &mut Map<String, Value> {
    if !obj.get("metadata").is_some_and(Value::is_object)
        && let Some(m) = obj.as_object_mut()
    {
        m.insert("metadata".into(), json!({}));
    }
    // The branch above guarantees an object.
    match obj.get_mut("metadata").and_then(Value::as_object_mut) {
        Some(m) => m,
        None => unreachable_meta(),
    }
}

#[allow(clippy::panic)]
fn unreachable_meta() -> ! {
    panic!("metadata was just inserted as an object")
}

fn meta_str<'a>(obj: &'a Value, key: &str) -> &'a str {
    obj.get("metadata")
        .and_then(|m| m.get(key))
        .and_then(Value::as_str)
        .unwrap_or_default()
}

fn check_type_meta(t: &Target<'_>, obj: &Value) -> Result<(), ApiError> {
    if let Some(k) = obj.get("kind").and_then(Value::as_str)
        && !k.is_empty()
        && k != t.res.kind
    {
        return Err(ApiError::bad_request(format!(
            "the kind in the data ({k}) does not match the expected kind ({})",
            t.res.kind
        )));
    }
    if let Some(av) = obj.get("apiVersion").and_then(Value::as_str)
        && !av.is_empty()
        && av != t.res.api_version()
    {
        return Err(ApiError::bad_request(format!(
            "the API version in the data ({av}) does not match the expected API version ({})",
            t.res.api_version()
        )));
    }
    Ok(())
}

/// Spec-like content: everything but metadata, status and type meta.
fn spec_part(obj: &Value) -> Value {
    match obj.as_object() {
        Some(m) => Value::Object(
            m.iter()
                .filter(|(k, _)| {
                    !matches!(k.as_str(), "metadata" | "status" | "kind" | "apiVersion")
                })
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        ),
        None => Value::Null,
    }
}

fn dry_run(q: &Query) -> bool {
    q.get("dryRun").is_some_and(|v| v == "All")
}

fn invalid(kind: &str, name: &str, causes: Vec<Cause>) -> Result<(), ApiError> {
    if causes.is_empty() {
        Ok(())
    } else {
        Err(ApiError::invalid("", kind, name, causes))
    }
}

/// GET one object.
pub fn get(state: &ApiState, t: &Target<'_>) -> Result<JsonReply, ApiError> {
    let stored = state
        .store
        .get(t.res.storage, t.ns_str(), t.name_str())
        .ok_or_else(|| ApiError::not_found(t.res.group, t.res.plural, t.name_str()))?;
    Ok(JsonReply::ok(present(t.res, &stored)?))
}

/// Parsed list/watch filters.
pub struct Filters {
    /// Label selector.
    pub labels: LabelSelector,
    /// Field selector (labels translated to the stored names).
    pub fields: FieldSelector,
}

impl Filters {
    /// Parses and checks `labelSelector`/`fieldSelector` for `res`.
    pub fn parse(res: &ResourceInfo, q: &Query) -> Result<Filters, ApiError> {
        let ls = q
            .get("labelSelector")
            .map(String::as_str)
            .unwrap_or_default();
        let fs = q
            .get("fieldSelector")
            .map(String::as_str)
            .unwrap_or_default();
        let labels = LabelSelector::parse(ls)
            .map_err(|e| ApiError::bad_request(format!("unable to parse requirement: {e}")))?;
        let mut fields = FieldSelector::parse(fs).map_err(|e| ApiError::bad_request(e.0))?;
        for r in &mut fields.reqs {
            if !res.supports_field(&r.label) {
                return Err(ApiError::bad_request(format!(
                    "Unable to find \"{}/{}, Resource={}\" that match label selector \"{ls}\", field selector \"{fs}\": field label not supported: {}",
                    res.group, res.version, res.plural, r.label
                )));
            }
            if res.group == "events.k8s.io" {
                r.label = resources::events_field_to_core(&r.label);
            }
        }
        Ok(Filters { labels, fields })
    }

    /// Whether a stored object matches.
    pub fn matches(&self, s: &Stored) -> bool {
        self.labels.matches(&s.labels) && self.fields.matches(&|l| s.field(l))
    }

    /// True when nothing is filtered.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty() && self.fields.is_empty()
    }
}

#[derive(serde::Serialize, serde::Deserialize)]
struct ContinueToken {
    v: String,
    rv: u64,
    start: String,
}

fn encode_continue(rv: u64, ns: &str, name: &str) -> String {
    use base64::Engine;
    let t = ContinueToken {
        v: "meta.k8s.io/v1".into(),
        rv,
        start: format!("{ns}/{name}"),
    };
    base64::engine::general_purpose::URL_SAFE.encode(serde_json::to_vec(&t).unwrap_or_default())
}

fn decode_continue(s: &str) -> Result<(u64, (String, String)), ApiError> {
    use base64::Engine;
    let bad = || ApiError::bad_request(format!("continue key is not valid: {s}"));
    let raw = base64::engine::general_purpose::URL_SAFE
        .decode(s)
        .or_else(|_| base64::engine::general_purpose::STANDARD.decode(s))
        .map_err(|_| bad())?;
    let t: ContinueToken = serde_json::from_slice(&raw).map_err(|_| bad())?;
    let (ns, name) = t.start.split_once('/').ok_or_else(bad)?;
    Ok((t.rv, (ns.to_string(), name.to_string())))
}

/// Resolves list `resourceVersion`/`resourceVersionMatch` to a snapshot RV.
fn list_rv(state: &ApiState, q: &Query) -> Result<Option<u64>, ApiError> {
    let rv = q
        .get("resourceVersion")
        .map(String::as_str)
        .unwrap_or_default();
    let m = q
        .get("resourceVersionMatch")
        .map(String::as_str)
        .unwrap_or_default();
    if !m.is_empty() && rv.is_empty() {
        return Err(ApiError::bad_request(
            "resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden unless resourceVersion is provided",
        ));
    }
    if rv.is_empty() || rv == "0" {
        if m == "Exact" && rv == "0" {
            return Err(ApiError::bad_request(
                "resourceVersionMatch: Forbidden: resourceVersionMatch \"exact\" is forbidden for resourceVersion \"0\"",
            ));
        }
        return Ok(None);
    }
    let n: u64 = rv
        .parse()
        .map_err(|_| ApiError::bad_request(format!("invalid resource version: {rv}")))?;
    let current = state.store.rv();
    match m {
        "Exact" => {
            if n > current {
                return Err(ApiError::timeout(format!(
                    "Too large resource version: {n}, current: {current}"
                )));
            }
            Ok(Some(n))
        }
        "" | "NotOlderThan" => {
            if n > current {
                return Err(ApiError::timeout(format!(
                    "Too large resource version: {n}, current: {current}"
                )));
            }
            Ok(None)
        }
        other => Err(ApiError::bad_request(format!(
            "resourceVersionMatch: Unsupported value: \"{other}\": supported values: \"Exact\", \"NotOlderThan\""
        ))),
    }
}

/// LIST: one page, serialized as `<Kind>List`.
pub fn list(
    state: &ApiState,
    t: &Target<'_>,
    q: &Query,
) -> Result<(Vec<Arc<Stored>>, Value), ApiError> {
    let filters = Filters::parse(t.res, q)?;
    let mut limit: usize = match q.get("limit").map(String::as_str) {
        None | Some("") => 0,
        Some(l) => l
            .parse::<i64>()
            .map_err(|_| ApiError::bad_request(format!("invalid limit: {l}")))?
            .max(0) as usize,
    };
    // kube-apiserver serves `resourceVersion=0` from its watch cache as one
    // page whatever the limit (the reflectors' initial list of client-go
    // and kube-rs asks exactly this).
    if q.get("resourceVersion").map(String::as_str) == Some("0")
        && q.get("continue").is_none_or(|c| c.is_empty())
    {
        limit = 0;
    }
    let (at_rv, after) = match q.get("continue").filter(|c| !c.is_empty()) {
        Some(c) => {
            if q.get("resourceVersion")
                .is_some_and(|r| !r.is_empty() && r != "0")
            {
                return Err(ApiError::bad_request(
                    "specifying resource version is not allowed when using continue",
                ));
            }
            let (rv, key) = decode_continue(c)?;
            if rv < state.store.compacted_rv(t.res.storage) {
                return Err(ApiError::expired(
                    "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter, or use the continue token in this response to retrieve the remainder of the results. Continuing with the provided token results in an inconsistent list - objects that were created, modified, or deleted between the time the first chunk was returned and now may show up in the list.",
                ));
            }
            (Some(rv), Some(key))
        }
        None => (list_rv(state, q)?, None),
    };
    let keep = |s: &Stored| filters.matches(s);
    let page = state
        .store
        .list(t.res.storage, t.ns, &keep, after.as_ref(), limit, at_rv)?;
    let mut lm = Map::new();
    lm.insert("resourceVersion".into(), json!(page.rv.to_string()));
    if let Some((ns, name)) = &page.next {
        lm.insert("continue".into(), json!(encode_continue(page.rv, ns, name)));
        if filters.is_empty() {
            lm.insert("remainingItemCount".into(), json!(page.remaining));
        }
    }
    Ok((page.items, Value::Object(lm)))
}

/// Serializes a list body from stored items without re-parsing them.
pub fn list_body(
    res: &ResourceInfo,
    items: &[Arc<Stored>],
    list_meta: &Value,
) -> Result<Bytes, ApiError> {
    let header = format!(
        "{{\"kind\":\"{}List\",\"apiVersion\":\"{}\",\"metadata\":{},\"items\":[",
        res.kind,
        res.api_version(),
        list_meta
    );
    let size: usize = items.iter().map(|i| i.bytes.len() + 1).sum::<usize>() + header.len() + 2;
    let mut out = Vec::with_capacity(size);
    out.extend_from_slice(header.as_bytes());
    for (i, it) in items.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(&present(res, it)?);
    }
    out.extend_from_slice(b"]}");
    Ok(Bytes::from(out))
}

/// Names and prepares a new object, runs defaulting, admission and
/// validation; stores it in `txn` unless dry-run. Shared by POST and by
/// apply-patch creates and by the server's own controllers.
pub fn create_in(
    state: &ApiState,
    txn: &mut Txn<'_>,
    res: &'static ResourceInfo,
    ns: &str,
    mut obj: Value,
    dry: bool,
) -> Result<Arc<Stored>, ApiError> {
    let kind = res.kind;
    {
        let m = meta(&mut obj);
        if res.namespaced {
            m.insert("namespace".into(), json!(ns));
        } else {
            m.remove("namespace");
        }
        let name = m
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        if name.is_empty() {
            let gen_name = m
                .get("generateName")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string();
            if !gen_name.is_empty() {
                let base: String = gen_name.chars().take(58).collect();
                m.insert(
                    "name".into(),
                    json!(format!("{base}{}", util::random_suffix(5))),
                );
            }
        }
        if m.get("resourceVersion")
            .and_then(Value::as_str)
            .is_some_and(|s| !s.is_empty())
        {
            return Err(ApiError::bad_request(
                "resourceVersion should not be set on objects to be created",
            ));
        }
        m.insert("uid".into(), json!(util::new_uid()));
        m.insert("creationTimestamp".into(), json!(util::now_rfc3339()));
        m.remove("deletionTimestamp");
        m.remove("deletionGracePeriodSeconds");
        m.remove("managedFields");
        m.remove("selfLink");
        if res.tracks_generation {
            m.insert("generation".into(), json!(1));
        } else {
            m.remove("generation");
        }
    }
    if let Some(o) = obj.as_object_mut() {
        o.insert("kind".into(), json!(kind));
        o.insert(
            "apiVersion".into(),
            json!(
                resources::canonical(res.storage)
                    .map(|c| c.api_version())
                    .unwrap_or_default()
            ),
        );
    }
    let name = meta_str(&obj, "name").to_string();
    invalid(kind, &name, validation::name(kind, &name))?;
    // Strategy: reset status where upstream does on create.
    match kind {
        "Pod" => pods::prepare_create(&mut obj),
        "Service" => services::prepare_create(&mut obj),
        "Namespace" => namespaces::prepare_create(&mut obj),
        "Secret" => secret_string_data(&mut obj)?,
        _ => {}
    }
    defaults::apply(kind, &mut obj);
    if res.namespaced {
        namespaces::check_can_create(txn, res, ns)?;
    }
    if kind == "Pod" {
        admission::pod(state, txn, &mut obj)?;
        let qos = defaults::qos_class(&obj);
        if let Some(s) = obj.get_mut("status").and_then(Value::as_object_mut) {
            s.insert("qosClass".into(), json!(qos));
        }
    }
    invalid(kind, &name, validation::object(kind, &obj))?;
    if txn.get(res.storage, ns_for(res, ns), &name).is_some() {
        return Err(ApiError::already_exists(res.group, res.plural, &name));
    }
    if kind == "Service" {
        services::allocate(txn, None, &mut obj)?;
    }
    if dry {
        return Ok(Arc::new(Stored {
            rv: txn.rv(),
            namespace: ns_for(res, ns).to_string(),
            name,
            bytes: Bytes::from(serde_json::to_vec(&obj).unwrap_or_default()),
            labels: Default::default(),
            fields: Vec::new(),
        }));
    }
    let stored = txn.create(res.storage, obj)?;
    if kind == "Namespace" && state.config.emulate_controllers {
        namespaces::populate(state, txn, &stored.name)?;
    }
    Ok(stored)
}

fn ns_for<'a>(res: &ResourceInfo, ns: &'a str) -> &'a str {
    if res.namespaced { ns } else { "" }
}

fn secret_string_data(obj: &mut Value) -> Result<(), ApiError> {
    use base64::Engine;
    let Some(m) = obj.as_object_mut() else {
        return Ok(());
    };
    if let Some(Value::Object(sd)) = m.remove("stringData") {
        let data = m.entry("data").or_insert_with(|| json!({}));
        if let Some(d) = data.as_object_mut() {
            for (k, v) in sd {
                let s = v.as_str().unwrap_or_default();
                d.insert(
                    k,
                    json!(base64::engine::general_purpose::STANDARD.encode(s)),
                );
            }
        }
    }
    Ok(())
}

/// POST on a collection.
pub fn create(
    state: &ApiState,
    t: &Target<'_>,
    q: &Query,
    body: Value,
) -> Result<JsonReply, ApiError> {
    check_type_meta(t, &body)?;
    let warnings = field_check(t, q, &body)?;
    let mut obj = intake(t, body);
    if t.res.kind == "CertificateSigningRequest" {
        super::csr::prepare_create(&mut obj, t.user);
    }
    let body_ns = meta_str(&obj, "namespace").to_string();
    let ns = t.ns_str().to_string();
    if t.res.namespaced && !body_ns.is_empty() && body_ns != ns {
        return Err(ApiError::bad_request(
            "the namespace of the provided object does not match the namespace sent on the request",
        ));
    }
    let dry = dry_run(q);
    let stored = state
        .store
        .write(|txn| create_in(state, txn, t.res, &ns, obj, dry))?;
    Ok(JsonReply::created(present(t.res, &stored)?).warn(warnings))
}

/// How an update treats the incoming object.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum UpdateMode {
    /// Main resource: status is kept from the stored object.
    Main,
    /// `status` subresource: only status (and labels/annotations) change.
    Status,
    /// `pods/resize`: only resources and resize policies change.
    Resize,
    /// `pods/ephemeralcontainers`: only `spec.ephemeralContainers` changes.
    EphemeralContainers,
    /// `approval` subresource (CertificateSigningRequests): only the
    /// Approved/Denied conditions change.
    Approval,
}

fn carry_system_meta(old: &Value, new: &mut Value, mode: UpdateMode) {
    let old_meta = old.get("metadata").cloned().unwrap_or_else(|| json!({}));
    let m = meta(new);
    for k in [
        "uid",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "namespace",
        "name",
        "generation",
        "generateName",
    ] {
        match old_meta.get(k) {
            Some(v) => {
                m.insert(k.into(), v.clone());
            }
            None => {
                m.remove(k);
            }
        }
    }
    m.remove("managedFields");
    m.remove("selfLink");
    if mode != UpdateMode::Main
        && let Some(o) = old_meta.get("ownerReferences")
    {
        m.insert("ownerReferences".into(), o.clone());
    }
}

/// Turns an incoming object into the next stored state of `old`, runs the
/// per-kind update rules and stores it. Returns the stored object (or the
/// old one for a no-op update), or `None` if the update finished a
/// deletion (finalizers emptied).
pub fn update_in(
    state: &ApiState,
    txn: &mut Txn<'_>,
    res: &'static ResourceInfo,
    old_stored: &Arc<Stored>,
    mut new: Value,
    mode: UpdateMode,
    dry: bool,
) -> Result<Arc<Stored>, ApiError> {
    let kind = res.kind;
    let old = old_stored.value()?;
    let name = old_stored.name.clone();
    let rv = meta_str(&new, "resourceVersion").to_string();
    if !rv.is_empty() && rv != old_stored.rv.to_string() {
        return Err(ApiError::conflict_stale(res.group, res.plural, &name));
    }
    // A uid in the new object is a precondition (the kubelet's status
    // patches carry one).
    let new_uid = meta_str(&new, "uid");
    let old_uid = meta_str(&old, "uid");
    if !new_uid.is_empty() && new_uid != old_uid {
        return Err(ApiError::conflict(
            res.group,
            res.plural,
            &name,
            &format!(
                "Precondition failed: UID in precondition: {new_uid}, UID in object meta: {old_uid}"
            ),
        ));
    }
    carry_system_meta(&old, &mut new, mode);
    if let Some(o) = new.as_object_mut() {
        o.insert("kind".into(), json!(kind));
        o.insert(
            "apiVersion".into(),
            json!(
                resources::canonical(res.storage)
                    .map(|c| c.api_version())
                    .unwrap_or_default()
            ),
        );
    }
    match mode {
        UpdateMode::Status | UpdateMode::Approval => {
            // Everything but metadata and status comes from the stored object.
            let status = new.get("status").cloned();
            let new_meta = new.get("metadata").cloned();
            let mut next = old.clone();
            if let Some(o) = next.as_object_mut() {
                match status {
                    Some(s) => o.insert("status".into(), s),
                    None => o.remove("status"),
                };
                if let Some(m) = new_meta {
                    o.insert("metadata".into(), m);
                }
            }
            new = next;
        }
        UpdateMode::Resize => {
            let mut next = super::resize::drop_non_resize_updates(&old, &new);
            if let (Some(o), Some(m)) = (next.as_object_mut(), new.get("metadata")) {
                o.insert("metadata".into(), m.clone());
            }
            new = next;
        }
        UpdateMode::EphemeralContainers => {
            let mut next = super::ephemeral::drop_non_ephemeral_updates(&old, &new);
            if let (Some(o), Some(m)) = (next.as_object_mut(), new.get("metadata")) {
                o.insert("metadata".into(), m.clone());
            }
            new = next;
        }
        UpdateMode::Main => {
            if res.has_status()
                && let Some(o) = new.as_object_mut()
            {
                match old.get("status") {
                    Some(s) => o.insert("status".into(), s.clone()),
                    None => o.remove("status"),
                };
            }
            if kind == "Secret" {
                secret_string_data(&mut new)?;
            }
            if kind == "Namespace"
                && let (Some(o), Some(spec)) = (new.as_object_mut(), old.get("spec"))
            {
                // spec.finalizers change only through the finalize subresource.
                o.insert("spec".into(), spec.clone());
            }
        }
    }
    if kind == "CertificateSigningRequest"
        && let Err(causes) = super::csr::prepare_update(&old, &mut new, mode)
    {
        invalid(kind, &name, causes)?;
    }
    defaults::apply(kind, &mut new);
    invalid(kind, &name, validation::object(kind, &new))?;
    if kind == "Pod" && mode == UpdateMode::Resize {
        invalid(kind, &name, super::resize::validate(&old, &new))?;
    } else if kind == "Pod" && mode == UpdateMode::EphemeralContainers {
        invalid(kind, &name, super::ephemeral::validate(&old, &new))?;
    } else if kind == "Pod" {
        invalid(kind, &name, validation::pod_spec_update(&old, &new))?;
        if mode == UpdateMode::Status {
            // An omitted qosClass is backfilled (old kubelets dropped it).
            let missing = new
                .pointer("/status/qosClass")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .is_empty();
            if missing
                && let Some(q) = old.pointer("/status/qosClass").cloned()
                && let Some(o) = new.as_object_mut()
                && let Some(st) = o
                    .entry("status")
                    .or_insert_with(|| json!({}))
                    .as_object_mut()
            {
                st.insert("qosClass".into(), q);
            }
            invalid(kind, &name, validation::pod_status_update(&old, &new))?;
        }
    }
    if kind == "Service" {
        services::allocate(txn, Some(&old), &mut new)?;
    }
    if kind == "EndpointSlice" && old.get("addressType") != new.get("addressType") {
        let v = new
            .get("addressType")
            .and_then(Value::as_str)
            .unwrap_or_default();
        invalid(
            kind,
            &name,
            vec![super::error::invalid_value(
                "addressType",
                v,
                "field is immutable",
            )],
        )?;
    }
    if res.tracks_generation && spec_part(&old) != spec_part(&new) {
        let g = old
            .pointer("/metadata/generation")
            .and_then(Value::as_i64)
            .unwrap_or(0)
            + 1;
        meta(&mut new).insert("generation".into(), json!(g));
    }
    // Finalizers emptied on an object being deleted without pending grace:
    // the update completes the deletion.
    let deleting = new
        .pointer("/metadata/deletionTimestamp")
        .is_some_and(|v| !v.is_null());
    let finalizers_empty = new
        .pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .is_none_or(|a| a.is_empty());
    let grace = new
        .pointer("/metadata/deletionGracePeriodSeconds")
        .and_then(Value::as_i64)
        .unwrap_or(0);
    if deleting && finalizers_empty && grace == 0 {
        if dry {
            return Ok(old_stored.clone());
        }
        let last = txn
            .remove(res.storage, &old_stored.namespace, &name)?
            .ok_or_else(|| ApiError::not_found(res.group, res.plural, &name))?;
        after_remove(state, txn, res, &last)?;
        return Ok(last);
    }
    // No-op update: nothing but the resourceVersion would change.
    let mut cmp_new = new.clone();
    meta(&mut cmp_new).insert("resourceVersion".into(), json!(old_stored.rv.to_string()));
    if cmp_new == old || dry {
        return Ok(if dry {
            Arc::new(Stored {
                rv: old_stored.rv,
                namespace: old_stored.namespace.clone(),
                name,
                bytes: Bytes::from(serde_json::to_vec(&new).unwrap_or_default()),
                labels: Default::default(),
                fields: Vec::new(),
            })
        } else {
            old_stored.clone()
        });
    }
    txn.update(res.storage, new)
}

/// Hooks after an object left storage.
pub fn after_remove(
    state: &ApiState,
    txn: &mut Txn<'_>,
    res: &ResourceInfo,
    last: &Stored,
) -> Result<(), ApiError> {
    if res.namespaced {
        namespaces::maybe_finish(state, txn, &last.namespace)?;
    }
    Ok(())
}

fn status_target(t: &Target<'_>) -> Result<UpdateMode, ApiError> {
    match t.sub {
        None => Ok(UpdateMode::Main),
        Some("status") if t.res.has_status() => Ok(UpdateMode::Status),
        Some("resize") if t.res.plural == "pods" => Ok(UpdateMode::Resize),
        Some("ephemeralcontainers") if t.res.plural == "pods" => {
            Ok(UpdateMode::EphemeralContainers)
        }
        Some("approval") if t.res.subresources.contains(&"approval") => Ok(UpdateMode::Approval),
        Some(_) => Err(ApiError::method_not_allowed("PUT")),
    }
}

/// PUT on an object (or its status).
pub fn update(
    state: &ApiState,
    t: &Target<'_>,
    q: &Query,
    body: Value,
) -> Result<JsonReply, ApiError> {
    check_type_meta(t, &body)?;
    let warnings = field_check(t, q, &body)?;
    let new = intake(t, body);
    let name = t.name_str();
    let body_name = meta_str(&new, "name");
    if body_name != name {
        return Err(ApiError::bad_request(format!(
            "the name of the object ({body_name}) does not match the name on the URL ({name})"
        )));
    }
    let body_ns = meta_str(&new, "namespace");
    if t.res.namespaced && !body_ns.is_empty() && body_ns != t.ns_str() {
        return Err(ApiError::bad_request(
            "the namespace of the provided object does not match the namespace sent on the request",
        ));
    }
    let mode = status_target(t)?;
    let dry = dry_run(q);
    let stored = state.store.write(|txn| {
        match txn.get(t.res.storage, ns_for(t.res, t.ns_str()), name) {
            Some(old) => update_in(state, txn, t.res, &old, new, mode, dry),
            // Endpoints may be created by an update, as upstream allows.
            None if t.res.plural == "endpoints" && mode == UpdateMode::Main => {
                let mut new = new;
                meta(&mut new).remove("resourceVersion");
                create_in(state, txn, t.res, t.ns_str(), new, dry)
            }
            None => Err(ApiError::not_found(t.res.group, t.res.plural, name)),
        }
    })?;
    Ok(JsonReply::ok(present(t.res, &stored)?).warn(warnings))
}

/// PATCH on an object (or its status).
pub fn patch(
    state: &ApiState,
    t: &Target<'_>,
    q: &Query,
    content_type: &str,
    body: &[u8],
) -> Result<JsonReply, ApiError> {
    let ty = PatchType::from_content_type(content_type)
        .ok_or_else(|| ApiError::unsupported_media_type(content_type))?;
    let mode = status_target(t)?;
    let name = t.name_str();
    let dry = dry_run(q);
    if ty == PatchType::Apply {
        if q.get("fieldManager").is_none_or(|f| f.is_empty()) {
            return Err(ApiError::invalid("meta.k8s.io", "PatchOptions", "", vec![super::error::required("fieldManager")])
                .with_message("PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: is required for apply patch"));
        }
    } else if q.get("fieldManager").is_some_and(|f| f.len() > 128) {
        return Err(ApiError::bad_request(
            "fieldManager: Too long: may not be more than 128 bytes",
        ));
    }
    let mut warnings = Vec::new();
    let (code, stored) = state.store.write(|txn| {
        let Some(old) = txn.get(t.res.storage, ns_for(t.res, t.ns_str()), name) else {
            if ty == PatchType::Apply && mode == UpdateMode::Main {
                let applied: Value = serde_yaml::from_slice(body)
                    .map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")))?;
                check_type_meta(t, &applied)?;
                warnings = field_check(t, q, &applied)?;
                if meta_str(&applied, "name") != name {
                    return Err(ApiError::bad_request(format!(
                        "the name of the object ({}) does not match the name on the URL ({name})",
                        meta_str(&applied, "name")
                    )));
                }
                let obj = intake(t, applied);
                return Ok((201, create_in(state, txn, t.res, t.ns_str(), obj, dry)?));
            }
            return Err(ApiError::not_found(t.res.group, t.res.plural, name));
        };
        let current = present_value(t.res, &old)?;
        let mut patched = patch::apply(ty, t.res.kind, &current, body)?;
        if ty == PatchType::Apply {
            check_type_meta(t, &patched)?;
        }
        warnings = field_check(t, q, &patched)?;
        // A patch that does not mention resourceVersion applies to the
        // current object; one that does is a precondition.
        if meta_str(&patched, "resourceVersion").is_empty() {
            meta(&mut patched).insert("resourceVersion".into(), json!(old.rv.to_string()));
        }
        if meta_str(&patched, "name") != name {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({}) does not match the name on the URL ({name})",
                meta_str(&patched, "name")
            )));
        }
        let new = intake(t, patched);
        Ok((200, update_in(state, txn, t.res, &old, new, mode, dry)?))
    })?;
    Ok(JsonReply::new(code, present(t.res, &stored)?).warn(warnings))
}

/// DeleteOptions from the body and the query.
#[derive(Debug, Default, Clone)]
pub struct DeleteOpts {
    /// gracePeriodSeconds.
    pub grace: Option<i64>,
    /// preconditions.uid.
    pub uid: Option<String>,
    /// preconditions.resourceVersion.
    pub rv: Option<String>,
    /// dryRun=All.
    pub dry: bool,
}

impl DeleteOpts {
    /// Reads DeleteOptions from a (possibly empty) body and the query.
    pub fn parse(q: &Query, content_type: &str, body: &[u8]) -> Result<DeleteOpts, ApiError> {
        let mut o = DeleteOpts {
            dry: dry_run(q),
            ..Default::default()
        };
        if !body.iter().all(u8::is_ascii_whitespace) {
            let v = parse_body(content_type, body)?;
            o.grace = v.get("gracePeriodSeconds").and_then(Value::as_i64);
            o.uid = v
                .pointer("/preconditions/uid")
                .and_then(Value::as_str)
                .map(String::from);
            o.rv = v
                .pointer("/preconditions/resourceVersion")
                .and_then(Value::as_str)
                .map(String::from);
            if v.get("dryRun")
                .and_then(Value::as_array)
                .is_some_and(|a| a.iter().any(|x| x == "All"))
            {
                o.dry = true;
            }
        }
        if let Some(g) = q.get("gracePeriodSeconds") {
            o.grace =
                Some(g.parse().map_err(|_| {
                    ApiError::bad_request(format!("invalid gracePeriodSeconds: {g}"))
                })?);
        }
        Ok(o)
    }
}

/// Result of deleting one object.
pub enum Deleted {
    /// Removed from storage; the last state.
    Gone(Arc<Stored>),
    /// Still there (graceful or finalizers); the updated state.
    Pending(Arc<Stored>),
}

/// Deletes one object inside a transaction.
pub fn delete_in(
    state: &ApiState,
    txn: &mut Txn<'_>,
    res: &'static ResourceInfo,
    old: &Arc<Stored>,
    opts: &DeleteOpts,
) -> Result<Deleted, ApiError> {
    let name = old.name.clone();
    let mut obj = old.value()?;
    if let Some(uid) = &opts.uid {
        let have = meta_str(&obj, "uid");
        if uid != have {
            return Err(ApiError::conflict(
                res.group,
                res.plural,
                &name,
                &format!(
                    "Precondition failed: UID in precondition: {uid}, UID in object meta: {have}"
                ),
            ));
        }
    }
    if let Some(rv) = &opts.rv
        && *rv != old.rv.to_string()
    {
        return Err(ApiError::conflict(
            res.group,
            res.plural,
            &name,
            &format!(
                "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {}",
                old.rv
            ),
        ));
    }
    if res.kind == "Namespace" {
        return namespaces::delete(state, txn, old, opts);
    }
    // Graceful period: pods decide theirs; everything else deletes at once.
    let grace = if res.kind == "Pod" {
        pods::grace_period(&obj, opts.grace)
    } else {
        0
    };
    let has_finalizers = obj
        .pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .is_some_and(|a| !a.is_empty());
    let already = obj
        .pointer("/metadata/deletionTimestamp")
        .is_some_and(|v| !v.is_null());
    if grace == 0 && !has_finalizers {
        if opts.dry {
            return Ok(Deleted::Gone(old.clone()));
        }
        let last = txn
            .remove(res.storage, &old.namespace, &name)?
            .ok_or_else(|| ApiError::not_found(res.group, res.plural, &name))?;
        after_remove(state, txn, res, &last)?;
        return Ok(Deleted::Gone(last));
    }
    // Mark the object as being deleted (or shorten a pending grace).
    let now = util::unix_now();
    let current_grace = obj
        .pointer("/metadata/deletionGracePeriodSeconds")
        .and_then(Value::as_i64);
    let current_deadline = obj
        .pointer("/metadata/deletionTimestamp")
        .and_then(Value::as_str)
        .and_then(util::parse_rfc3339);
    let new_deadline = now + grace;
    let shorten = match (already, current_deadline, current_grace) {
        (false, _, _) => true,
        (true, Some(d), Some(g)) => new_deadline < d || grace < g,
        (true, _, _) => true,
    };
    if !shorten {
        return Ok(Deleted::Pending(old.clone()));
    }
    {
        let m = meta(&mut obj);
        let ts = if already && current_deadline.is_some_and(|d| d < new_deadline) {
            m.get("deletionTimestamp")
                .cloned()
                .unwrap_or_else(|| json!(util::rfc3339_in(grace)))
        } else {
            json!(util::rfc3339_in(grace))
        };
        m.insert("deletionTimestamp".into(), ts);
        m.insert("deletionGracePeriodSeconds".into(), json!(grace));
        if res.tracks_generation && !already {
            let g = m.get("generation").and_then(Value::as_i64).unwrap_or(0) + 1;
            m.insert("generation".into(), json!(g));
        }
    }
    if opts.dry {
        return Ok(Deleted::Pending(old.clone()));
    }
    let stored = txn.update(res.storage, obj)?;
    Ok(Deleted::Pending(stored))
}

/// The Success `Status` a DELETE answers with for most resources.
pub fn success_status(res: &ResourceInfo, stored: &Stored) -> Value {
    let uid = stored
        .value()
        .ok()
        .and_then(|v| {
            v.pointer("/metadata/uid")
                .and_then(Value::as_str)
                .map(String::from)
        })
        .unwrap_or_default();
    let mut details = json!({"name": stored.name, "kind": res.plural, "uid": uid});
    if !res.group.is_empty() {
        details["group"] = json!(res.group);
    }
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "details": details})
}

/// DELETE on an object.
pub fn delete(state: &ApiState, t: &Target<'_>, opts: &DeleteOpts) -> Result<JsonReply, ApiError> {
    let name = t.name_str();
    let outcome = state.store.write(|txn| {
        let old = txn
            .get(t.res.storage, ns_for(t.res, t.ns_str()), name)
            .ok_or_else(|| ApiError::not_found(t.res.group, t.res.plural, name))?;
        delete_in(state, txn, t.res, &old, opts)
    })?;
    match outcome {
        Deleted::Pending(s) => Ok(JsonReply::ok(present(t.res, &s)?)),
        Deleted::Gone(s) if t.res.returns_deleted_object => Ok(JsonReply::ok(present(t.res, &s)?)),
        Deleted::Gone(s) => Ok(JsonReply::value(200, &success_status(t.res, &s))),
    }
}

/// DELETE on a collection (deletecollection): deletes each match, answers
/// the list of what was deleted.
pub fn delete_collection(
    state: &ApiState,
    t: &Target<'_>,
    q: &Query,
    opts: &DeleteOpts,
) -> Result<JsonReply, ApiError> {
    let filters = Filters::parse(t.res, q)?;
    let deleted = state.store.write(|txn| {
        let mut out = Vec::new();
        for old in txn.list(t.res.storage, t.ns) {
            if !filters.matches(&old) {
                continue;
            }
            match delete_in(state, txn, t.res, &old, opts)? {
                Deleted::Gone(s) | Deleted::Pending(s) => out.push(s),
            }
        }
        Ok(out)
    })?;
    let body = list_body(
        t.res,
        &deleted,
        &json!({"resourceVersion": state.store.rv().to_string()}),
    )?;
    Ok(JsonReply::ok(body))
}

impl ApiError {
    /// Replaces the message (keeps code, reason and details).
    pub fn with_message(mut self, m: impl Into<String>) -> ApiError {
        self.message = m.into();
        self
    }
}
