//! What a caller may do, as kubelet decides
//! (`pkg/kubelet/server/auth.go`, `cmd/kubelet/app/auth.go` `BuildAuthz`):
//! every request maps to attributes on the resource `nodes/<node>` with a
//! verb from the HTTP method and a subresource from the path; with the
//! fine-grained checks of v1.36 (`KubeletFineGrainedAuthz`, GA) `/pods`,
//! `/runningpods`, `/healthz` and `/configz` are first checked as
//! `pods`/`healthz`/`configz` and then, if denied, as `proxy`. In `Webhook`
//! mode each check is a SubjectAccessReview, allowed answers cached for
//! `cacheAuthorizedTTL`, denied ones for `cacheUnauthorizedTTL`.

use std::time::Duration;

use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::{Api, PostParams};

use super::retry::{WebhookError, with_webhook_backoff};
use super::ttl_cache::{DEFAULT_CAPACITY, TtlCache};
use super::user::User;

/// One authorization check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attributes {
    /// `get`, `create`, `update`, `patch`, `delete` (empty for others).
    pub verb: &'static str,
    /// Always `nodes`.
    pub resource: &'static str,
    /// `proxy`, `log`, `stats`, `metrics`, `pods`, `healthz`, `configz`, …
    pub subresource: &'static str,
    /// The node's name.
    pub name: String,
}

fn is_subpath(sub: &str, path: &str) -> bool {
    let path = path.trim_end_matches('/');
    sub == path || (sub.starts_with(path) && sub.as_bytes().get(path.len()) == Some(&b'/'))
}

/// kubelet's `GetRequestAttributes`: the checks a request needs, in order;
/// any one allowing it is enough.
pub fn request_attributes(method: &str, path: &str, node: &str) -> Vec<Attributes> {
    let verb = match method {
        "POST" => "create",
        "GET" => "get",
        "PUT" => "update",
        "PATCH" => "patch",
        "DELETE" => "delete",
        _ => "",
    };
    let mut subs = Vec::new();
    if is_subpath(path, "/pods") || is_subpath(path, "/runningpods/") {
        subs.push("pods");
    } else if is_subpath(path, "/healthz") {
        subs.push("healthz");
    } else if is_subpath(path, "/configz") {
        subs.push("configz");
    }
    subs.push(if is_subpath(path, "/stats/") {
        "stats"
    } else if is_subpath(path, "/metrics") {
        "metrics"
    } else if is_subpath(path, "/logs/") {
        "log"
    } else if is_subpath(path, "/checkpoint/") {
        "checkpoint"
    } else if is_subpath(path, "/statusz") {
        "statusz"
    } else if is_subpath(path, "/flagz") {
        "configz"
    } else {
        "proxy"
    });
    subs.into_iter()
        .map(|subresource| Attributes {
            verb,
            resource: "nodes",
            subresource,
            name: node.to_string(),
        })
        .collect()
}

/// A decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Allowed.
    Allow,
    /// Denied, or no opinion (not allowed either way).
    Deny,
}

/// The authorizer of `authorization.mode`.
pub enum Authorizer {
    /// Everything authenticated is allowed.
    AlwaysAllow,
    /// SubjectAccessReviews through the node's client.
    Webhook(SarWebhook),
}

impl std::fmt::Debug for Authorizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Authorizer::AlwaysAllow => f.write_str("AlwaysAllow"),
            Authorizer::Webhook(_) => f.write_str("Webhook"),
        }
    }
}

impl Authorizer {
    /// Decides one check.
    pub async fn authorize(&self, user: &User, a: &Attributes) -> Result<Decision, WebhookError> {
        match self {
            Authorizer::AlwaysAllow => Ok(Decision::Allow),
            Authorizer::Webhook(w) => w.authorize(user, a).await,
        }
    }
}

/// SubjectAccessReview webhook with kubelet's caches.
pub struct SarWebhook {
    client: kube::Client,
    allow_ttl: Duration,
    deny_ttl: Duration,
    cache: TtlCache<String, Decision>,
}

impl SarWebhook {
    /// Through `client` (the node's identity).
    pub fn new(client: kube::Client, allow_ttl: Duration, deny_ttl: Duration) -> Self {
        SarWebhook {
            client,
            allow_ttl,
            deny_ttl,
            cache: TtlCache::new(DEFAULT_CAPACITY),
        }
    }

    fn spec(user: &User, a: &Attributes) -> SubjectAccessReviewSpec {
        SubjectAccessReviewSpec {
            user: Some(user.name.clone()),
            uid: (!user.uid.is_empty()).then(|| user.uid.clone()),
            groups: Some(user.groups.clone()),
            extra: (!user.extra.is_empty()).then(|| user.extra.clone()),
            resource_attributes: Some(ResourceAttributes {
                namespace: None,
                verb: Some(a.verb.to_string()),
                group: None,
                version: Some("v1".to_string()),
                resource: Some(a.resource.to_string()),
                subresource: Some(a.subresource.to_string()),
                name: Some(a.name.clone()),
                ..Default::default()
            }),
            non_resource_attributes: None,
        }
    }

    async fn authorize(&self, user: &User, a: &Attributes) -> Result<Decision, WebhookError> {
        let spec = Self::spec(user, a);
        let key = serde_json::to_string(&spec).unwrap_or_default();
        if let Some(d) = self.cache.get(&key) {
            return Ok(d);
        }
        let api: Api<SubjectAccessReview> = Api::all(self.client.clone());
        let review = SubjectAccessReview {
            spec,
            ..Default::default()
        };
        let answer = with_webhook_backoff("SubjectAccessReview", || {
            let api = api.clone();
            let review = review.clone();
            async move {
                tokio::time::timeout(
                    Duration::from_secs(30),
                    api.create(&PostParams::default(), &review),
                )
                .await
                .map_err(|_| WebhookError::Timeout)?
                .map_err(WebhookError::Api)
            }
        })
        .await?;
        let status = answer.status.unwrap_or_default();
        let d = if status.allowed && status.denied != Some(true) {
            self.cache.put(key, Decision::Allow, self.allow_ttl);
            Decision::Allow
        } else {
            self.cache.put(key, Decision::Deny, self.deny_ttl);
            Decision::Deny
        };
        Ok(d)
    }
}

/// kubelet's 403 body: `Forbidden (user=…, verb=…, resource=nodes,
/// subresource(s)=[stats])` and a newline.
pub fn forbidden_message(user: &User, attrs: &[Attributes]) -> String {
    let subs: Vec<&str> = attrs.iter().map(|a| a.subresource).collect();
    let (verb, resource) = attrs
        .first()
        .map(|a| (a.verb, a.resource))
        .unwrap_or(("", "nodes"));
    format!(
        "Forbidden (user={}, verb={verb}, resource={resource}, subresource(s)=[{}])\n",
        user.name,
        subs.join(" ")
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::panic)]
mod tests {
    use super::*;

    fn subs(method: &str, path: &str) -> Vec<(&'static str, &'static str)> {
        request_attributes(method, path, "n1")
            .into_iter()
            .map(|a| (a.verb, a.subresource))
            .collect()
    }

    #[test]
    fn attributes_follow_kubelet() {
        assert_eq!(subs("GET", "/stats/summary"), [("get", "stats")]);
        assert_eq!(subs("POST", "/stats/summary"), [("create", "stats")]);
        assert_eq!(subs("GET", "/metrics"), [("get", "metrics")]);
        assert_eq!(subs("GET", "/metrics/resource"), [("get", "metrics")]);
        assert_eq!(subs("GET", "/metricsx"), [("get", "proxy")]);
        assert_eq!(subs("GET", "/logs/"), [("get", "log")]);
        assert_eq!(subs("GET", "/containerLogs/ns/p/c"), [("get", "proxy")]);
        assert_eq!(subs("POST", "/exec/ns/p/c"), [("create", "proxy")]);
        assert_eq!(subs("GET", "/pods"), [("get", "pods"), ("get", "proxy")]);
        assert_eq!(subs("GET", "/pods/"), [("get", "pods"), ("get", "proxy")]);
        assert_eq!(
            subs("GET", "/runningpods/"),
            [("get", "pods"), ("get", "proxy")]
        );
        assert_eq!(
            subs("GET", "/healthz/syncloop"),
            [("get", "healthz"), ("get", "proxy")]
        );
        assert_eq!(
            subs("GET", "/configz"),
            [("get", "configz"), ("get", "proxy")]
        );
        assert_eq!(subs("OPTIONS", "/pods"), [("", "pods"), ("", "proxy")]);
        assert_eq!(request_attributes("GET", "/pods", "n1")[0].name, "n1");
    }

    #[test]
    fn forbidden_reads_as_kubelet() {
        let u = User {
            name: "jane".into(),
            ..Default::default()
        };
        assert_eq!(
            forbidden_message(&u, &request_attributes("GET", "/pods", "n1")),
            "Forbidden (user=jane, verb=get, resource=nodes, subresource(s)=[pods proxy])\n"
        );
    }
}
