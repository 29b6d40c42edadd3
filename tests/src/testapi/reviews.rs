//! `tokenreviews` (authentication.k8s.io/v1) and `subjectaccessreviews`
//! (authorization.k8s.io/v1): what a kubelet's delegated authentication
//! and authorization ask. Tokens are checked by this server's own
//! authenticator; access is decided by RBAC over the stored ClusterRoles
//! and ClusterRoleBindings (with `system:masters` allowed everything), as
//! kube-apiserver's RBAC authorizer does for cluster-scoped checks. The
//! server does not authorize its own requests (see tests/README.md).

use serde_json::{Value, json};

use super::error::ApiError;
use super::state::ApiState;

/// Groups of an authenticated user: `system:authenticated`, nodes'
/// `system:nodes`, service accounts' `system:serviceaccounts[:<ns>]`,
/// and the certificate's organization when given.
pub fn groups_of(user: &str, extra: Option<&str>) -> Vec<String> {
    let mut g = Vec::new();
    if let Some(e) = extra.filter(|e| !e.is_empty()) {
        g.push(e.to_string());
    }
    if user.starts_with("system:node:") {
        g.push("system:nodes".to_string());
    }
    if let Some(rest) = user.strip_prefix("system:serviceaccount:")
        && let Some((ns, _)) = rest.split_once(':')
    {
        g.push("system:serviceaccounts".to_string());
        g.push(format!("system:serviceaccounts:{ns}"));
    }
    if user == "system:anonymous" {
        g.push("system:unauthenticated".to_string());
    } else {
        g.push("system:authenticated".to_string());
    }
    g
}

/// `POST /apis/authentication.k8s.io/v1/tokenreviews`.
pub fn token_review(state: &ApiState, body: &[u8]) -> Result<Value, ApiError> {
    let review: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("decoding TokenReview: {e}")))?;
    let token = review
        .pointer("/spec/token")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let user = state
        .config
        .tokens
        .iter()
        .find(|(t, _)| t == token)
        .map(|(_, u)| u.clone())
        .or_else(|| state.signer.authenticate(token).map(|i| i.user));
    let status = match user {
        Some(u) if !token.is_empty() => json!({
            "authenticated": true,
            "user": {"username": u, "groups": groups_of(&u, None)},
            "audiences": [state.config.api_audiences.first().cloned().unwrap_or_default()],
        }),
        _ => {
            json!({"authenticated": false, "error": "[invalid bearer token, token lookup failed]"})
        }
    };
    Ok(json!({
        "kind": "TokenReview",
        "apiVersion": "authentication.k8s.io/v1",
        "metadata": {"creationTimestamp": null},
        "spec": review.get("spec").cloned().unwrap_or(json!({})),
        "status": status,
    }))
}

fn strs(v: Option<&Value>) -> Vec<String> {
    v.and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

fn any_matches(list: &[String], want: &str) -> bool {
    list.iter().any(|x| x == "*" || x == want)
}

/// Whether a PolicyRule grants the attributes.
fn rule_allows(rule: &Value, ra: &Value, nra: Option<&Value>) -> bool {
    let verbs = strs(rule.get("verbs"));
    if let Some(nra) = nra {
        let path = nra.get("path").and_then(Value::as_str).unwrap_or_default();
        let verb = nra.get("verb").and_then(Value::as_str).unwrap_or_default();
        return any_matches(&verbs, verb)
            && strs(rule.get("nonResourceURLs")).iter().any(|u| {
                u == "*"
                    || u == path
                    || (u.ends_with('*') && path.starts_with(u.trim_end_matches('*')))
            });
    }
    let s = |k: &str| ra.get(k).and_then(Value::as_str).unwrap_or_default();
    let resource = if s("subresource").is_empty() {
        s("resource").to_string()
    } else {
        format!("{}/{}", s("resource"), s("subresource"))
    };
    let resources = strs(rule.get("resources"));
    let names = strs(rule.get("resourceNames"));
    any_matches(&verbs, s("verb"))
        && any_matches(&strs(rule.get("apiGroups")), s("group"))
        && (any_matches(&resources, &resource)
            || resources
                .iter()
                .any(|r| *r == format!("{}/*", s("resource")))
            || (s("subresource").is_empty() && resources.iter().any(|r| r == "*/*")))
        && (names.is_empty() || names.iter().any(|n| n == s("name")))
}

fn subject_matches(subject: &Value, user: &str, groups: &[String]) -> bool {
    let s = |k: &str| subject.get(k).and_then(Value::as_str).unwrap_or_default();
    match s("kind") {
        "User" => s("name") == user,
        "Group" => groups.iter().any(|g| g == s("name")),
        "ServiceAccount" => {
            user == format!("system:serviceaccount:{}:{}", s("namespace"), s("name"))
        }
        _ => false,
    }
}

/// `POST /apis/authorization.k8s.io/v1/subjectaccessreviews`.
pub fn subject_access_review(state: &ApiState, body: &[u8]) -> Result<Value, ApiError> {
    let review: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("decoding SubjectAccessReview: {e}")))?;
    let spec = review.get("spec").cloned().unwrap_or(json!({}));
    let user = spec.get("user").and_then(Value::as_str).unwrap_or_default();
    let groups = strs(spec.get("groups"));
    let ra = spec.get("resourceAttributes");
    let nra = spec.get("nonResourceAttributes");
    if ra.is_none() && nra.is_none() {
        return Err(ApiError::new(
            422,
            "Invalid",
            "SubjectAccessReview.authorization.k8s.io \"\" is invalid: spec.resourceAttributes: Invalid value: \"null\": exactly one of nonResourceAttributes or resourceAttributes must be specified",
        ));
    }
    let mut allowed = false;
    let mut reason = String::new();
    if groups.iter().any(|g| g == "system:masters") {
        allowed = true;
    } else {
        let roles = state.store.get_all("clusterroles");
        'bindings: for b in state.store.get_all("clusterrolebindings") {
            let subjects = b
                .get("subjects")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            if !subjects.iter().any(|s| subject_matches(s, user, &groups)) {
                continue;
            }
            let role_name = b
                .pointer("/roleRef/name")
                .and_then(Value::as_str)
                .unwrap_or_default();
            let Some(role) = roles
                .iter()
                .find(|r| r.pointer("/metadata/name").and_then(Value::as_str) == Some(role_name))
            else {
                continue;
            };
            for rule in role
                .get("rules")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                if rule_allows(rule, ra.unwrap_or(&Value::Null), nra) {
                    allowed = true;
                    reason = format!(
                        "RBAC: allowed by ClusterRoleBinding {:?} of ClusterRole {role_name:?} to User {user:?}",
                        b.pointer("/metadata/name")
                            .and_then(Value::as_str)
                            .unwrap_or_default()
                    );
                    break 'bindings;
                }
            }
        }
    }
    let mut status = json!({"allowed": allowed});
    if !reason.is_empty() {
        status["reason"] = json!(reason);
    }
    Ok(json!({
        "kind": "SubjectAccessReview",
        "apiVersion": "authorization.k8s.io/v1",
        "metadata": {"creationTimestamp": null},
        "spec": spec,
        "status": status,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_match_as_rbac() {
        let ra = json!({"verb": "get", "group": "", "resource": "nodes", "subresource": "proxy", "name": "n1"});
        assert!(rule_allows(
            &json!({"verbs": ["get"], "apiGroups": [""], "resources": ["nodes/proxy"]}),
            &ra,
            None
        ));
        assert!(rule_allows(
            &json!({"verbs": ["*"], "apiGroups": ["*"], "resources": ["nodes/*"]}),
            &ra,
            None
        ));
        assert!(!rule_allows(
            &json!({"verbs": ["get"], "apiGroups": [""], "resources": ["nodes"]}),
            &ra,
            None
        ));
        assert!(!rule_allows(
            &json!({"verbs": ["get"], "apiGroups": [""], "resources": ["nodes/proxy"], "resourceNames": ["n2"]}),
            &ra,
            None
        ));
        assert_eq!(
            groups_of("system:node:n1", None),
            vec!["system:nodes", "system:authenticated"]
        );
    }
}
