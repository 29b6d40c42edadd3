//! The mutating admission plugins kube-apiserver enables by default that
//! change what a node agent sees in a pod: ServiceAccount (default account,
//! the `kube-api-access-*` projected token volume), Priority and
//! DefaultTolerationSeconds, applied when controller emulation is on; and
//! RuntimeClass (`plugin/pkg/admission/runtimeclass`: overhead and
//! scheduling from the pod's RuntimeClass, a missing class or a stray
//! overhead refused), always applied.

use serde_json::{Value, json};

use super::error::ApiError;
use super::state::ApiState;
use super::store::Txn;
use super::util;

/// Where the service account token volume is mounted.
pub const SA_MOUNT_PATH: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// Built-in priority classes.
const PRIORITY_CLASSES: &[(&str, i64)] = &[
    ("system-node-critical", 2_000_001_000),
    ("system-cluster-critical", 2_000_000_000),
];

/// Admits a pod being created.
pub fn pod(state: &ApiState, txn: &Txn<'_>, pod: &mut Value) -> Result<(), ApiError> {
    let ns = pod
        .pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let name = pod
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    runtime_class(txn, pod, &name)?;
    let Some(spec) = pod.get_mut("spec").and_then(Value::as_object_mut) else {
        return Ok(());
    };
    // The deprecated field mirrors serviceAccountName in v1.
    let sa_given = spec
        .get("serviceAccountName")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .or_else(|| {
            spec.get("serviceAccount")
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
        })
        .map(String::from);
    if !state.config.emulate_controllers {
        if let Some(sa) = sa_given {
            spec.insert("serviceAccountName".into(), json!(sa));
            spec.insert("serviceAccount".into(), json!(sa));
        }
        return Ok(());
    }
    // Priority.
    match spec
        .get("priorityClassName")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
    {
        Some(pc) => {
            let Some((_, p)) = PRIORITY_CLASSES.iter().find(|(n, _)| *n == pc) else {
                return Err(ApiError::forbidden(
                    "",
                    "pods",
                    &name,
                    &format!("no PriorityClass with name {pc} was found"),
                ));
            };
            spec.insert("priority".into(), json!(p));
        }
        None => {
            spec.entry("priority").or_insert(json!(0));
        }
    }
    spec.entry("preemptionPolicy")
        .or_insert(json!("PreemptLowerPriority"));
    // DefaultTolerationSeconds.
    let tols = spec.entry("tolerations").or_insert_with(|| json!([]));
    if let Some(list) = tols.as_array_mut() {
        for key in [
            "node.kubernetes.io/not-ready",
            "node.kubernetes.io/unreachable",
        ] {
            let has = list.iter().any(|t| {
                let effect = t.get("effect").and_then(Value::as_str).unwrap_or_default();
                let k = t.get("key").and_then(Value::as_str).unwrap_or_default();
                (k == key || k.is_empty()) && (effect == "NoExecute" || effect.is_empty())
            });
            if !has {
                list.push(json!({"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}));
            }
        }
    }
    // ServiceAccount. Mirror pods (static pods) are exempt.
    let mirror = pod
        .pointer("/metadata/annotations/kubernetes.io~1config.mirror")
        .is_some();
    let Some(spec) = pod.get_mut("spec").and_then(Value::as_object_mut) else {
        return Ok(());
    };
    if mirror {
        return Ok(());
    }
    let sa_name = sa_given.unwrap_or_else(|| "default".into());
    spec.insert("serviceAccountName".into(), json!(sa_name));
    spec.insert("serviceAccount".into(), json!(sa_name));
    let Some(sa) = txn.get("serviceaccounts", &ns, &sa_name) else {
        return Err(ApiError::forbidden(
            "",
            "pods",
            &name,
            &format!(
                "error looking up service account {ns}/{sa_name}: serviceaccount \"{sa_name}\" not found"
            ),
        ));
    };
    let sa = sa.value()?;
    let automount = spec
        .get("automountServiceAccountToken")
        .and_then(Value::as_bool)
        .or_else(|| {
            sa.get("automountServiceAccountToken")
                .and_then(Value::as_bool)
        })
        .unwrap_or(true);
    if !automount {
        return Ok(());
    }
    let already_mounted = ["containers", "initContainers"].iter().any(|l| {
        spec.get(*l).and_then(Value::as_array).is_some_and(|cs| {
            cs.iter().any(|c| {
                c.get("volumeMounts")
                    .and_then(Value::as_array)
                    .is_some_and(|ms| {
                        ms.iter().any(|m| {
                            m.get("mountPath").and_then(Value::as_str) == Some(SA_MOUNT_PATH)
                        })
                    })
            })
        })
    });
    if already_mounted {
        return Ok(());
    }
    let vol_name = format!("kube-api-access-{}", util::random_suffix(5));
    let volumes = spec.entry("volumes").or_insert_with(|| json!([]));
    if let Some(vs) = volumes.as_array_mut() {
        vs.push(json!({
            "name": vol_name,
            "projected": {
                "defaultMode": 420,
                "sources": [
                    {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                    {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                    {"downwardAPI": {"items": [{"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}, "path": "namespace"}]}}
                ]
            }
        }));
    }
    for l in ["containers", "initContainers"] {
        if let Some(cs) = spec.get_mut(l).and_then(Value::as_array_mut) {
            for c in cs {
                if let Some(cm) = c.as_object_mut() {
                    let mounts = cm.entry("volumeMounts").or_insert_with(|| json!([]));
                    if let Some(ms) = mounts.as_array_mut() {
                        ms.push(
                            json!({"name": vol_name, "readOnly": true, "mountPath": SA_MOUNT_PATH}),
                        );
                    }
                }
            }
        }
    }
    Ok(())
}

/// The RuntimeClass admission plugin (mutating and validating on create):
/// `spec.overhead` from the class (a different one given is refused),
/// its node selector merged (a conflicting key refused) and tolerations
/// added; a class that does not exist, or an overhead without a class
/// defining one, is refused.
fn runtime_class(txn: &Txn<'_>, pod: &mut Value, name: &str) -> Result<(), ApiError> {
    let forbid = |why: String| ApiError::forbidden("", "pods", name, &why);
    let class = pod
        .pointer("/spec/runtimeClassName")
        .and_then(Value::as_str)
        .map(str::to_string);
    let rc = match &class {
        None => None,
        Some(c) => match txn.get("runtimeclasses", "", c) {
            Some(stored) => Some(stored.value()?),
            None => {
                return Err(forbid(format!(
                    "pod rejected: RuntimeClass {c:?} not found"
                )));
            }
        },
    };
    let Some(spec) = pod.get_mut("spec").and_then(Value::as_object_mut) else {
        return Ok(());
    };
    let class_overhead = rc
        .as_ref()
        .and_then(|r| r.pointer("/overhead/podFixed"))
        .filter(|v| !v.is_null())
        .cloned();
    let pod_overhead = spec.get("overhead").filter(|v| !v.is_null()).cloned();
    match (class_overhead, pod_overhead) {
        (Some(c), Some(p)) if !same_quantities(&c, &p) => {
            return Err(forbid(
                "pod rejected: Pod's Overhead doesn't match RuntimeClass's defined Overhead".into(),
            ));
        }
        (Some(c), _) => {
            spec.insert("overhead".into(), c);
        }
        (None, Some(_)) => {
            return Err(forbid(
                "pod rejected: Pod Overhead set without corresponding RuntimeClass defined Overhead"
                    .into(),
            ));
        }
        (None, None) => {}
    }
    let Some(scheduling) = rc.as_ref().and_then(|r| r.get("scheduling")) else {
        return Ok(());
    };
    if let Some(sel) = scheduling.get("nodeSelector").and_then(Value::as_object) {
        let pod_sel = spec.entry("nodeSelector").or_insert_with(|| json!({}));
        if let Some(ps) = pod_sel.as_object_mut() {
            for (k, v) in sel {
                if let Some(existing) = ps.get(k)
                    && existing != v
                {
                    return Err(forbid(format!(
                        "conflict: runtimeClass.scheduling.nodeSelector[{k}] = {}; pod.spec.nodeSelector[{k}] = {}",
                        v.as_str().unwrap_or_default(),
                        existing.as_str().unwrap_or_default()
                    )));
                }
                ps.insert(k.clone(), v.clone());
            }
        }
    }
    if let Some(tols) = scheduling.get("tolerations").and_then(Value::as_array) {
        let list = spec.entry("tolerations").or_insert_with(|| json!([]));
        if let Some(l) = list.as_array_mut() {
            for t in tols {
                if !l.contains(t) {
                    l.push(t.clone());
                }
            }
        }
    }
    Ok(())
}

/// Two resource lists equal by quantity value (`1` == `1000m`).
fn same_quantities(a: &Value, b: &Value) -> bool {
    let parse = |v: &Value| -> Option<std::collections::BTreeMap<String, String>> {
        v.as_object().map(|m| {
            m.iter()
                .map(|(k, q)| {
                    let text = q.as_str().unwrap_or_default();
                    let canon = keelson::quantity::Quantity::parse(text)
                        .map(|q| q.milli_value().to_string())
                        .unwrap_or_else(|_| text.to_string());
                    (k.clone(), canon)
                })
                .collect()
        })
    };
    parse(a) == parse(b)
}
