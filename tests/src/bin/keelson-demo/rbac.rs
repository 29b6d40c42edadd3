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

/// (group, resource with subresource, verb) of a resource request the
/// server did not route (a resource it does not serve answers 404 with no
/// verb recorded, but a real API server would have authorized it first).
fn parse_unrouted(method: &str, path: &str, query: &str) -> Option<(String, String, String)> {
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, rest) = match parts.as_slice() {
        ["api", "v1", rest @ ..] => (String::new(), rest),
        ["apis", g, _v, rest @ ..] => (g.to_string(), rest),
        _ => return None,
    };
    let (watch_path, rest) = match rest {
        ["watch", r @ ..] => (true, r),
        r => (false, r),
    };
    let rest = match rest {
        ["namespaces", _ns, r @ ..] if !r.is_empty() => r,
        r => r,
    };
    let (resource, named) = match rest {
        [res] => (res.to_string(), false),
        [res, _name] => (res.to_string(), true),
        [res, _name, sub] => (format!("{res}/{sub}"), true),
        _ => return None,
    };
    let watch = watch_path
        || query
            .split('&')
            .any(|kv| kv == "watch=true" || kv == "watch=1");
    let verb = match (method, named) {
        ("GET", _) if watch => "watch",
        ("GET", true) => "get",
        ("GET", false) => "list",
        ("POST", _) => "create",
        ("PUT", _) => "update",
        ("PATCH", _) => "patch",
        ("DELETE", true) => "delete",
        ("DELETE", false) => "deletecollection",
        _ => return None,
    };
    Some((group, resource, verb.to_string()))
}

/// What `user` did, as distinct "verb resource.group" strings, and those of
/// them `rules` do not allow. Discovery and other non-resource requests
/// (allowed to every authenticated user upstream) are left out.
pub fn audit(
    requests: &[RequestRecord],
    user: &str,
    rules: &[PolicyRule],
) -> (BTreeSet<String>, BTreeSet<String>) {
    let mut seen = BTreeSet::new();
    let mut denied = BTreeSet::new();
    for r in requests.iter().filter(|r| r.user == user) {
        let (group, resource, verb) = if r.verb.is_empty() {
            match parse_unrouted(&r.method, &r.path, &r.query) {
                Some(x) => x,
                None => continue,
            }
        } else if r.subresource.is_empty() {
            (group_of(&r.path), r.resource.clone(), r.verb.clone())
        } else {
            (
                group_of(&r.path),
                format!("{}/{}", r.resource, r.subresource),
                r.verb.clone(),
            )
        };
        let shown = if group.is_empty() {
            format!("{verb} {resource}")
        } else {
            format!("{verb} {resource}.{group}")
        };
        if !allows(rules, &group, &resource, &verb) {
            denied.insert(shown.clone());
        }
        seen.insert(shown);
    }
    (seen, denied)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unrouted_paths() {
        let p = |m, path, q| parse_unrouted(m, path, q);
        let t = |g: &str, r: &str, v: &str| Some((g.to_string(), r.to_string(), v.to_string()));
        assert_eq!(
            p(
                "GET",
                "/apis/networking.k8s.io/v1/servicecidrs",
                "limit=500"
            ),
            t("networking.k8s.io", "servicecidrs", "list")
        );
        assert_eq!(
            p(
                "GET",
                "/apis/networking.k8s.io/v1/servicecidrs",
                "watch=true&resourceVersion=5"
            ),
            t("networking.k8s.io", "servicecidrs", "watch")
        );
        assert_eq!(
            p("GET", "/api/v1/watch/namespaces/default/pods", ""),
            t("", "pods", "watch")
        );
        assert_eq!(
            p("GET", "/api/v1/namespaces/kube-system", ""),
            t("", "namespaces", "get")
        );
        assert_eq!(
            p("PATCH", "/api/v1/namespaces/d/pods/x/status", ""),
            t("", "pods/status", "patch")
        );
        assert_eq!(
            p("DELETE", "/apis/apps/v1/namespaces/d/deployments", ""),
            t("apps", "deployments", "deletecollection")
        );
        assert_eq!(p("GET", "/apis", ""), None);
        assert_eq!(p("GET", "/version", ""), None);
    }

    #[test]
    fn shipped_role_allows_what_kube_proxy_does() {
        let rules = proxy_rules().expect("shipped role");
        assert!(allows(
            &rules,
            "discovery.k8s.io",
            "endpointslices",
            "watch"
        ));
        assert!(allows(&rules, "events.k8s.io", "events", "patch"));
        assert!(!allows(&rules, "", "endpoints", "list"));
        assert!(!allows(&rules, "", "secrets", "get"));
    }
}
