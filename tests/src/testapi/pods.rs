//! Pod-specific behaviour: status on create, the graceful deletion period,
//! the `binding` and `eviction` subresources.

use serde_json::{Value, json};

use super::error::ApiError;
use super::objects::{self, DeleteOpts, Deleted, JsonReply, Target};
use super::resources;
use super::state::ApiState;
use super::util;

/// On create a pod's status is reset to Pending (qosClass is added after
/// defaulting).
pub fn prepare_create(obj: &mut Value) {
    if let Some(o) = obj.as_object_mut() {
        o.insert("status".into(), json!({"phase": "Pending"}));
    }
}

/// The grace period a DELETE gets: the request's, else the pod's
/// `terminationGracePeriodSeconds` (default 30); 0 for a pod never bound
/// to a node or already finished; a negative request becomes 1.
pub fn grace_period(pod: &Value, requested: Option<i64>) -> i64 {
    let spec_grace = pod
        .pointer("/spec/terminationGracePeriodSeconds")
        .and_then(Value::as_i64)
        .unwrap_or(30);
    let mut g = requested.unwrap_or(spec_grace);
    if g < 0 {
        g = 1;
    }
    let unbound = pod
        .pointer("/spec/nodeName")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .is_empty();
    let phase = pod
        .pointer("/status/phase")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if unbound || phase == "Succeeded" || phase == "Failed" {
        0
    } else {
        g
    }
}

fn success(code: u16) -> JsonReply {
    JsonReply::value(
        code,
        &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": code}),
    )
}

/// POST pods/<name>/binding: sets spec.nodeName once, marks PodScheduled.
pub fn bind(state: &ApiState, t: &Target<'_>, body: &Value) -> Result<JsonReply, ApiError> {
    let ns = t.ns.unwrap_or_default();
    let name = t.name.unwrap_or_default();
    let node = body
        .pointer("/target/name")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    if node.is_empty() {
        return Err(ApiError::invalid(
            "",
            "Binding",
            name,
            vec![super::error::required("target.name")],
        ));
    }
    let res = t.res;
    state.store.write(|txn| {
        let old = txn
            .get("pods", ns, name)
            .ok_or_else(|| ApiError::not_found("", "pods", name))?;
        let mut pod = old.value()?;
        if let Some(uid) = body.pointer("/metadata/uid").and_then(Value::as_str)
            && !uid.is_empty()
            && pod.pointer("/metadata/uid").and_then(Value::as_str) != Some(uid)
        {
            return Err(ApiError::conflict(
                "",
                "pods",
                name,
                "Precondition failed: UID in precondition does not match",
            ));
        }
        if pod
            .pointer("/metadata/deletionTimestamp")
            .is_some_and(|v| !v.is_null())
        {
            return Err(ApiError::conflict(
                "",
                "pods",
                name,
                "pod is being deleted, cannot be assigned to a host",
            ));
        }
        let current = pod
            .pointer("/spec/nodeName")
            .and_then(Value::as_str)
            .unwrap_or_default();
        if !current.is_empty() {
            return Err(ApiError::conflict(
                "",
                "pods",
                name,
                &format!("pod {name} is already assigned to node \"{current}\""),
            ));
        }
        pod["spec"]["nodeName"] = json!(node);
        if let Some(ann) = body
            .pointer("/metadata/annotations")
            .and_then(Value::as_object)
        {
            let m = pod["metadata"]
                .as_object_mut()
                .ok_or_else(|| ApiError::internal("pod without metadata"))?;
            let a = m.entry("annotations").or_insert_with(|| json!({}));
            if let Some(a) = a.as_object_mut() {
                for (k, v) in ann {
                    a.insert(k.clone(), v.clone());
                }
            }
        }
        set_condition(&mut pod, "PodScheduled", "True");
        let _ = res;
        txn.update("pods", pod)?;
        Ok(())
    })?;
    Ok(success(201))
}

/// Sets (or adds) a pod condition, stamping lastTransitionTime on change.
pub fn set_condition(pod: &mut Value, ty: &str, status: &str) {
    let now = util::now_rfc3339();
    let Some(st) = pod.get_mut("status").and_then(Value::as_object_mut) else {
        return;
    };
    let conds = st.entry("conditions").or_insert_with(|| json!([]));
    let Some(list) = conds.as_array_mut() else {
        return;
    };
    if let Some(c) = list
        .iter_mut()
        .find(|c| c.get("type").and_then(Value::as_str) == Some(ty))
    {
        if c.get("status").and_then(Value::as_str) != Some(status) {
            c["status"] = json!(status);
            c["lastTransitionTime"] = json!(now);
        }
    } else {
        list.push(
            json!({"type": ty, "status": status, "lastProbeTime": null, "lastTransitionTime": now}),
        );
    }
}

/// POST pods/<name>/eviction: a graceful delete with the eviction's
/// DeleteOptions (PodDisruptionBudgets are not served, so never 429).
pub fn evict(state: &ApiState, t: &Target<'_>, body: &Value) -> Result<JsonReply, ApiError> {
    let ns = t.ns.unwrap_or_default();
    let name = t.name.unwrap_or_default();
    let opts = DeleteOpts {
        grace: body
            .pointer("/deleteOptions/gracePeriodSeconds")
            .and_then(Value::as_i64),
        uid: body
            .pointer("/deleteOptions/preconditions/uid")
            .and_then(Value::as_str)
            .map(String::from),
        rv: body
            .pointer("/deleteOptions/preconditions/resourceVersion")
            .and_then(Value::as_str)
            .map(String::from),
        dry: body
            .pointer("/deleteOptions/dryRun")
            .and_then(Value::as_array)
            .is_some_and(|a| a.iter().any(|x| x == "All")),
    };
    let pods = resources::find("", "v1", "pods")
        .ok_or_else(|| ApiError::internal("pods not registered"))?;
    state.store.write(|txn| {
        let old = txn
            .get("pods", ns, name)
            .ok_or_else(|| ApiError::not_found("", "pods", name))?;
        match objects::delete_in(state, txn, pods, &old, &opts)? {
            Deleted::Gone(_) | Deleted::Pending(_) => Ok(()),
        }
    })?;
    Ok(success(201))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grace_rules() {
        let bound = json!({"spec": {"nodeName": "n", "terminationGracePeriodSeconds": 12}, "status": {"phase": "Running"}});
        assert_eq!(grace_period(&bound, None), 12);
        assert_eq!(grace_period(&bound, Some(0)), 0);
        assert_eq!(grace_period(&bound, Some(-5)), 1);
        let unbound = json!({"spec": {"terminationGracePeriodSeconds": 12}});
        assert_eq!(grace_period(&unbound, None), 0);
        let done = json!({"spec": {"nodeName": "n"}, "status": {"phase": "Succeeded"}});
        assert_eq!(grace_period(&done, Some(30)), 0);
        let mut p = json!({"status": {"phase": "Pending"}});
        set_condition(&mut p, "PodScheduled", "True");
        assert_eq!(p["status"]["conditions"][0]["status"], "True");
    }
}
