//! Read-only access to the API server for diagnose: `get` and `list`
//! only, each bounded by a timeout. A refusal (403) is not an error of the
//! diagnosis: it is recorded with the RBAC rule that would allow the
//! request, and the answer that needed it is left out. Once the API server
//! did not answer, later requests are not tried (each would wait for the
//! same timeout).

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use kube::api::{Api, ListParams};
use kube::core::{NamespaceResourceScope, Resource};
use serde::de::DeserializeOwned;

use super::report::MissingPermission;

/// The answer to one request.
#[derive(Debug, Clone)]
pub enum Lookup<T> {
    /// Found.
    Found(T),
    /// 404.
    NotFound,
    /// 403: the permission is recorded in [`ReadApi::missing`].
    Forbidden(String),
    /// No answer, or another error.
    Failed(String),
}

impl<T> Lookup<T> {
    /// Maps the found value.
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> Lookup<U> {
        match self {
            Lookup::Found(t) => Lookup::Found(f(t)),
            Lookup::NotFound => Lookup::NotFound,
            Lookup::Forbidden(m) => Lookup::Forbidden(m),
            Lookup::Failed(e) => Lookup::Failed(e),
        }
    }

    /// The value, if found.
    pub fn found(self) -> Option<T> {
        match self {
            Lookup::Found(t) => Some(t),
            _ => None,
        }
    }
}

/// The API, read-only.
pub struct ReadApi {
    client: kube::Client,
    timeout: Duration,
    down: AtomicBool,
    down_reason: Mutex<Option<String>>,
    missing: Mutex<Vec<MissingPermission>>,
}

impl std::fmt::Debug for ReadApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadApi").finish_non_exhaustive()
    }
}

/// The user named in a 403 message (`User "system:node:n1" cannot ...`).
pub fn user_of(message: &str) -> Option<String> {
    let rest = message.split("User \"").nth(1)?;
    Some(rest.split('"').next()?.to_string())
}

/// The rule, as a (Cluster)Role writes it, that allows `verb` on
/// `resource` of `group`.
pub fn rule_for(verb: &str, group: &str, resource: &str, namespace: Option<&str>) -> String {
    let rule =
        format!("apiGroups: [\"{group}\"], resources: [\"{resource}\"], verbs: [\"{verb}\"]");
    match namespace {
        Some(ns) => format!("{rule} (in a Role in namespace {ns}, or a ClusterRole)"),
        None => format!("{rule} (in a ClusterRole)"),
    }
}

impl ReadApi {
    /// Wraps a client; every request gives up after `timeout`.
    pub fn new(client: kube::Client, timeout: Duration) -> ReadApi {
        ReadApi {
            client,
            timeout,
            down: AtomicBool::new(false),
            down_reason: Mutex::new(None),
            missing: Mutex::new(Vec::new()),
        }
    }

    /// The client (for the `/version` request of the clock check).
    pub fn client(&self) -> &kube::Client {
        &self.client
    }

    /// Why the API server is considered unreachable, if it is.
    pub fn down(&self) -> Option<String> {
        if !self.down.load(Ordering::SeqCst) {
            return None;
        }
        self.down_reason
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Marks the API server unreachable.
    pub fn mark_down(&self, reason: &str) {
        self.down.store(true, Ordering::SeqCst);
        let mut r = self
            .down_reason
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if r.is_none() {
            *r = Some(reason.to_string());
        }
    }

    /// The refused requests so far.
    pub fn missing(&self) -> Vec<MissingPermission> {
        self.missing
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    fn classify<T>(
        &self,
        res: Result<Result<T, kube::Error>, tokio::time::error::Elapsed>,
        verb: &str,
        group: &str,
        resource: &str,
        namespace: Option<&str>,
        needed_for: &str,
    ) -> Lookup<T> {
        match res {
            Err(_) => {
                let reason = format!("no answer within {:?}", self.timeout);
                self.mark_down(&reason);
                Lookup::Failed(reason)
            }
            Ok(Ok(t)) => Lookup::Found(t),
            Ok(Err(kube::Error::Api(e))) if e.code == 404 => Lookup::NotFound,
            Ok(Err(kube::Error::Api(e))) if e.code == 403 => {
                let mut missing = self
                    .missing
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                let already = missing.iter().any(|m| {
                    m.verb == verb && m.resource == resource && m.namespace.as_deref() == namespace
                });
                if !already {
                    missing.push(MissingPermission {
                        user: user_of(&e.message),
                        verb: verb.to_string(),
                        api_group: group.to_string(),
                        resource: resource.to_string(),
                        namespace: namespace.map(str::to_string),
                        needed_for: needed_for.to_string(),
                        rule: rule_for(verb, group, resource, namespace),
                        message: e.message.clone(),
                    });
                }
                Lookup::Forbidden(e.message)
            }
            Ok(Err(kube::Error::Api(e))) => Lookup::Failed(format!("{} ({})", e.message, e.code)),
            Ok(Err(e)) => {
                let text = crate::error_chain::error_chain(&e);
                self.mark_down(&text);
                Lookup::Failed(text)
            }
        }
    }

    /// GET one namespaced object.
    pub async fn get<K>(&self, namespace: &str, name: &str, needed_for: &str) -> Lookup<K>
    where
        K: Resource<DynamicType = (), Scope = NamespaceResourceScope>
            + Clone
            + DeserializeOwned
            + std::fmt::Debug,
    {
        let api: Api<K> = Api::namespaced(self.client.clone(), namespace);
        self.get_from(api, name, Some(namespace), needed_for).await
    }

    /// GET one cluster-scoped object.
    pub async fn get_cluster<K>(&self, name: &str, needed_for: &str) -> Lookup<K>
    where
        K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug,
        K: Resource<Scope = kube::core::ClusterResourceScope>,
    {
        let api: Api<K> = Api::all(self.client.clone());
        self.get_from(api, name, None, needed_for).await
    }

    /// GET `name` through `api` (namespaced or not).
    async fn get_from<K>(
        &self,
        api: Api<K>,
        name: &str,
        namespace: Option<&str>,
        needed_for: &str,
    ) -> Lookup<K>
    where
        K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug,
    {
        if let Some(r) = self.down() {
            return Lookup::Failed(r);
        }
        let res = tokio::time::timeout(self.timeout, api.get(name)).await;
        self.classify(
            res,
            "get",
            &K::group(&()),
            &K::plural(&()),
            namespace,
            needed_for,
        )
    }

    /// LIST namespaced objects.
    pub async fn list<K>(
        &self,
        namespace: &str,
        lp: &ListParams,
        needed_for: &str,
    ) -> Lookup<Vec<K>>
    where
        K: Resource<DynamicType = (), Scope = NamespaceResourceScope>
            + Clone
            + DeserializeOwned
            + std::fmt::Debug,
    {
        if let Some(r) = self.down() {
            return Lookup::Failed(r);
        }
        let api: Api<K> = Api::namespaced(self.client.clone(), namespace);
        let res = tokio::time::timeout(self.timeout, api.list(lp)).await;
        self.classify(
            res.map(|r| r.map(|l| l.items)),
            "list",
            &K::group(&()),
            &K::plural(&()),
            Some(namespace),
            needed_for,
        )
    }

    /// The API server's `Date` header and the round trip of `GET /version`
    /// (for the clock skew check).
    pub async fn server_date(&self) -> Result<(jiff::Timestamp, Duration), ServerDateError> {
        if let Some(r) = self.down() {
            return Err(ServerDateError::Down(r));
        }
        let req = http::Request::get("/version")
            .body(Vec::new())
            .map_err(ServerDateError::Request)?;
        let start = std::time::Instant::now();
        let res = tokio::time::timeout(self.timeout, self.client.send(req.map(Into::into))).await;
        let rtt = start.elapsed();
        let resp = match res {
            Err(_) => {
                let e = ServerDateError::Timeout(self.timeout);
                self.mark_down(&e.to_string());
                return Err(e);
            }
            Ok(Err(e)) => {
                let text = crate::error_chain::error_chain(&e);
                self.mark_down(&text);
                return Err(ServerDateError::Down(text));
            }
            Ok(Ok(r)) => r,
        };
        let date = resp
            .headers()
            .get(http::header::DATE)
            .and_then(|v| v.to_str().ok())
            .ok_or(ServerDateError::NoDate)?;
        let t = jiff::fmt::rfc2822::parse(date)
            .map(|z| z.timestamp())
            .map_err(|error| ServerDateError::BadDate {
                date: date.to_string(),
                error,
            })?;
        Ok((t, rtt))
    }
}

/// Why the API server's clock could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ServerDateError {
    /// The API server is unreachable (the first failure's text).
    #[error("{0}")]
    Down(String),
    /// The request could not be built.
    #[error("{0}")]
    Request(http::Error),
    /// No answer in time.
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    /// The answer has no `Date`.
    #[error("the answer has no Date header")]
    NoDate,
    /// A `Date` that is not RFC 2822.
    #[error("Date {date:?}: {error}")]
    BadDate {
        /// The header.
        date: String,
        /// Why.
        error: jiff::Error,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_names_the_user_and_the_rule() {
        let msg = "events is forbidden: User \"system:node:n1\" cannot list resource \"events\" in API group \"\" in the namespace \"default\"";
        assert_eq!(user_of(msg).as_deref(), Some("system:node:n1"));
        assert_eq!(user_of("no user here"), None);
        assert_eq!(
            rule_for("list", "", "events", Some("default")),
            "apiGroups: [\"\"], resources: [\"events\"], verbs: [\"list\"] (in a Role in namespace default, or a ClusterRole)"
        );
        assert_eq!(
            rule_for("get", "discovery.k8s.io", "endpointslices", None),
            "apiGroups: [\"discovery.k8s.io\"], resources: [\"endpointslices\"], verbs: [\"get\"] (in a ClusterRole)"
        );
    }
}
