//! Namespace lifecycle, as kube-apiserver's NamespaceLifecycle admission
//! plus the namespace controller behave: content can be created only in an
//! existing, active namespace; deleting a namespace marks it Terminating,
//! deletes its content (pods gracefully) and removes it once empty. New
//! namespaces get their `default` ServiceAccount and `kube-root-ca.crt`
//! ConfigMap (the service-account and root-CA publisher controllers).

use std::sync::Arc;

use serde_json::{Value, json};

use super::error::ApiError;
use super::objects::{self, DeleteOpts, Deleted};
use super::resources::{self, RESOURCES, ResourceInfo};
use super::state::ApiState;
use super::store::{Stored, Txn};
use super::util;

/// Namespaces that can never be deleted.
pub const IMMORTAL: &[&str] = &["default", "kube-system", "kube-public"];

/// The namespaces that exist at start.
pub const INITIAL: &[&str] = &["default", "kube-system", "kube-public", "kube-node-lease"];

/// On create: `spec.finalizers: [kubernetes]`, phase Active.
pub fn prepare_create(obj: &mut Value) {
    if let Some(o) = obj.as_object_mut() {
        o.insert("spec".into(), json!({"finalizers": ["kubernetes"]}));
        o.insert("status".into(), json!({"phase": "Active"}));
    }
}

fn terminating(ns: &Stored) -> Result<bool, ApiError> {
    let v = ns.value()?;
    Ok(v.pointer("/status/phase").and_then(Value::as_str) == Some("Terminating"))
}

/// Content may be created only in an existing, non-terminating namespace.
pub fn check_can_create(txn: &Txn<'_>, res: &ResourceInfo, ns: &str) -> Result<(), ApiError> {
    let Some(nso) = txn.get("namespaces", "", ns) else {
        return Err(ApiError::not_found("", "namespaces", ns));
    };
    if terminating(&nso)? {
        return Err(ApiError::forbidden(
            res.group,
            res.plural,
            "",
            &format!(
                "unable to create new content in namespace {ns} because it is being terminated"
            ),
        ));
    }
    Ok(())
}

/// The per-namespace objects controllers create in a new namespace.
pub fn populate(state: &ApiState, txn: &mut Txn<'_>, ns: &str) -> Result<(), ApiError> {
    let sa = resources::find("", "v1", "serviceaccounts")
        .ok_or_else(|| ApiError::internal("serviceaccounts"))?;
    let cm =
        resources::find("", "v1", "configmaps").ok_or_else(|| ApiError::internal("configmaps"))?;
    if txn.get("serviceaccounts", ns, "default").is_none() {
        objects::create_in(
            state,
            txn,
            sa,
            ns,
            json!({"metadata": {"name": "default"}}),
            false,
        )?;
    }
    if txn.get("configmaps", ns, "kube-root-ca.crt").is_none() {
        objects::create_in(
            state,
            txn,
            cm,
            ns,
            json!({
                "metadata": {"name": "kube-root-ca.crt", "annotations": {"kubernetes.io/description": "Contains a CA bundle that can be used to verify the kube-apiserver when using internal endpoints such as the internal service IP or kubernetes.default.svc. No other usage is guaranteed across distributions of Kubernetes clusters."}},
                "data": {"ca.crt": state.config.ca_pem}
            }),
            false,
        )?;
    }
    Ok(())
}

fn namespaced_storages() -> Vec<&'static ResourceInfo> {
    let mut out: Vec<&'static ResourceInfo> = Vec::new();
    for r in RESOURCES {
        if r.namespaced && !out.iter().any(|o| o.storage == r.storage) {
            out.push(r);
        }
    }
    out
}

/// DELETE of a namespace.
pub fn delete(
    state: &ApiState,
    txn: &mut Txn<'_>,
    old: &Arc<Stored>,
    opts: &DeleteOpts,
) -> Result<Deleted, ApiError> {
    let name = old.name.clone();
    if IMMORTAL.contains(&name.as_str()) {
        return Err(ApiError::forbidden(
            "",
            "namespaces",
            &name,
            "this namespace may not be deleted",
        ));
    }
    if terminating(old)? {
        return Ok(Deleted::Pending(old.clone()));
    }
    if opts.dry {
        return Ok(Deleted::Pending(old.clone()));
    }
    let mut v = old.value()?;
    v["metadata"]["deletionTimestamp"] = json!(util::now_rfc3339());
    v["metadata"]["deletionGracePeriodSeconds"] = json!(0);
    v["status"] = json!({"phase": "Terminating"});
    let marked = txn.update("namespaces", v)?;
    let content_opts = DeleteOpts::default();
    for res in namespaced_storages() {
        for obj in txn.list(res.storage, Some(&name)) {
            let already = obj
                .value()?
                .pointer("/metadata/deletionTimestamp")
                .is_some_and(|d| !d.is_null());
            if !already {
                objects::delete_in(state, txn, res, &obj, &content_opts)?;
            }
        }
    }
    maybe_finish(state, txn, &name)?;
    match txn.get("namespaces", "", &name) {
        Some(s) => Ok(Deleted::Pending(s)),
        None => Ok(Deleted::Pending(marked)),
    }
}

/// Removes a terminating namespace once nothing is left in it.
pub fn maybe_finish(_state: &ApiState, txn: &mut Txn<'_>, ns: &str) -> Result<(), ApiError> {
    let Some(nso) = txn.get("namespaces", "", ns) else {
        return Ok(());
    };
    if !terminating(&nso)? {
        return Ok(());
    }
    let empty = namespaced_storages()
        .iter()
        .all(|r| txn.list(r.storage, Some(ns)).is_empty());
    if !empty {
        return Ok(());
    }
    let v = nso.value()?;
    let has_meta_finalizers = v
        .pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .is_some_and(|a| !a.is_empty());
    if has_meta_finalizers {
        // The namespace controller empties spec.finalizers; metadata
        // finalizers belong to someone else.
        let mut v = v;
        v["spec"]["finalizers"] = json!([]);
        txn.update("namespaces", v)?;
        return Ok(());
    }
    txn.remove("namespaces", "", ns)?;
    Ok(())
}

/// PUT namespaces/<name>/finalize: replaces `spec.finalizers`; an emptied
/// list on a terminating namespace lets it go.
pub fn finalize(
    state: &ApiState,
    t: &objects::Target<'_>,
    body: Value,
) -> Result<objects::JsonReply, ApiError> {
    let name = t.name.unwrap_or_default().to_string();
    let finalizers = body
        .pointer("/spec/finalizers")
        .cloned()
        .unwrap_or(json!([]));
    let stored = state.store.write(|txn| {
        let old = txn
            .get("namespaces", "", &name)
            .ok_or_else(|| ApiError::not_found("", "namespaces", &name))?;
        let mut v = old.value()?;
        v["spec"]["finalizers"] = finalizers;
        let s = txn.update("namespaces", v)?;
        maybe_finish(state, txn, &name)?;
        Ok(s)
    })?;
    Ok(objects::JsonReply::new(200, stored.bytes.clone()))
}
