//! Checks what an identity actually asked the API server for against the
//! rules of a ClusterRole: the demo proves that the proxy role needs no
//! more than `packaging/kubernetes/proxy/rbac.yaml` grants.

use std::collections::BTreeSet;

use k8s_openapi::api::rbac::v1::{ClusterRole, PolicyRule};
use keelson_tests::testapi::RequestRecord;

/// The proxy DaemonSet's RBAC manifest, as shipped.
const PROXY_RBAC: &str = include_str!("../../../../packaging/kubernetes/proxy/rbac.yaml");

/// The rules of the `ClusterRole` in the shipped proxy RBAC manifest.
pub fn proxy_rules() -> Result<Vec<PolicyRule>, String> {
    for doc in serde_yaml::Deserializer::from_str(PROXY_RBAC) {
        let v: serde_yaml::Value =
            serde::Deserialize::deserialize(doc).map_err(|e| e.to_string())?;
        if v.get("kind").and_then(|k| k.as_str()) == Some("ClusterRole") {
            let role: ClusterRole = serde_yaml::from_value(v).map_err(|e| e.to_string())?;
            return Ok(role.rules.unwrap_or_default());
        }
    }
    Err("no ClusterRole in packaging/kubernetes/proxy/rbac.yaml".into())
}

/// The API group of a resource request path (`/api/v1/...` → core).
fn group_of(path: &str) -> String {
    match path.strip_prefix("/apis/") {
        Some(rest) => rest.split('/').next().unwrap_or_default().to_string(),
        None => String::new(),
    }
}

fn allows(rules: &[PolicyRule], group: &str, resource: &str, verb: &str) -> bool {
    rules.iter().any(|r| {
        let has = |list: Option<&Vec<String>>, v: &str| {
            list.is_some_and(|l| l.iter().any(|x| x == v || x == "*"))
        };
        has(r.api_groups.as_ref(), group)
            && has(r.resources.as_ref(), resource)
            && (r.verbs.iter().any(|v| v == verb || v == "*"))
    })
}

/// What `user` did, as distinct "verb group/resource" strings, and those of
/// them `rules` do not allow. Discovery and other non-resource requests
/// (allowed to every authenticated user upstream) are left out.
pub fn audit(
    requests: &[RequestRecord],
    user: &str,
    rules: &[PolicyRule],
) -> (BTreeSet<String>, BTreeSet<String>) {
    let mut seen = BTreeSet::new();
    let mut denied = BTreeSet::new();
    for r in requests
        .iter()
        .filter(|r| r.user == user && !r.verb.is_empty())
    {
        let group = group_of(&r.path);
        let resource = if r.subresource.is_empty() {
            r.resource.clone()
        } else {
            format!("{}/{}", r.resource, r.subresource)
        };
        let shown = if group.is_empty() {
            format!("{} {resource}", r.verb)
        } else {
            format!("{} {resource}.{group}", r.verb)
        };
        if !allows(rules, &group, &resource, &r.verb) {
            denied.insert(shown.clone());
        }
        seen.insert(shown);
    }
    (seen, denied)
}
