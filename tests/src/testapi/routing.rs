//! Maps a request path and method to what it addresses and the
//! Kubernetes verb.

use super::error::ApiError;
use super::resources::{self, ResourceInfo};

/// Paths that are not resources.
#[derive(Debug, Clone, PartialEq)]
pub enum NonResource {
    /// `/`
    Root,
    /// `/api`
    Api,
    /// `/apis`
    Apis,
    /// `/apis/<group>`
    Group(String),
    /// `/api/v1`, `/apis/<group>/<version>`
    GroupVersion(String, String),
    /// `/version`
    Version,
    /// `/healthz`, `/livez`, `/readyz` (and their sub-checks)
    Health,
    /// `/openapi/<rest>` (v3 is served, v2 is not)
    OpenApi(String),
    /// `/.well-known/openid-configuration`
    OidcConfig,
    /// `/openid/v1/jwks`
    Jwks,
}

/// A resource request.
#[derive(Debug, Clone)]
pub struct ResourcePath {
    /// The resource.
    pub res: &'static ResourceInfo,
    /// Namespace.
    pub ns: Option<String>,
    /// Object name.
    pub name: Option<String>,
    /// Subresource.
    pub sub: Option<String>,
    /// Path had the legacy `/watch/` prefix.
    pub legacy_watch: bool,
}

/// What a path addresses.
#[derive(Debug, Clone)]
pub enum Route {
    /// A non-resource path.
    NonResource(NonResource),
    /// A resource path.
    Resource(ResourcePath),
}

fn resource(group: &str, version: &str, rest: &[&str]) -> Result<ResourcePath, ApiError> {
    let mut rest = rest;
    let mut legacy_watch = false;
    if rest.first() == Some(&"watch") {
        legacy_watch = true;
        rest = &rest[1..];
    }
    let (ns, plural, name, sub, extra) = match rest {
        ["namespaces", ns, sub @ ("status" | "finalize")] => {
            (None, "namespaces", Some(*ns), Some(*sub), false)
        }
        ["namespaces", ns, plural, tail @ ..] => (
            Some(*ns),
            *plural,
            tail.first().copied(),
            tail.get(1).copied(),
            tail.len() > 2,
        ),
        [plural, tail @ ..] => (
            None,
            *plural,
            tail.first().copied(),
            tail.get(1).copied(),
            tail.len() > 2,
        ),
        [] => return Err(ApiError::no_route()),
    };
    if extra {
        return Err(ApiError::no_route());
    }
    let res = resources::find(group, version, plural).ok_or_else(ApiError::no_route)?;
    if ns.is_some() && !res.namespaced {
        return Err(ApiError::no_route());
    }
    if ns.is_none() && res.namespaced && name.is_some() {
        return Err(ApiError::no_route());
    }
    if let Some(s) = sub
        && !res.subresources.contains(&s)
    {
        return Err(ApiError::no_route());
    }
    Ok(ResourcePath {
        res,
        ns: ns.map(String::from),
        name: name.map(String::from),
        sub: sub.map(String::from),
        legacy_watch,
    })
}

/// Parses a request path.
pub fn route(path: &str) -> Result<Route, ApiError> {
    let segs: Vec<&str> = path
        .trim_matches('/')
        .split('/')
        .filter(|s| !s.is_empty())
        .collect();
    use NonResource::*;
    let nr = |n| Ok(Route::NonResource(n));
    match segs.as_slice() {
        [] => nr(Root),
        ["api"] => nr(Api),
        ["api", v] => nr(GroupVersion(String::new(), v.to_string())),
        ["api", v, rest @ ..] => resource("", v, rest).map(Route::Resource),
        ["apis"] => nr(Apis),
        ["apis", g] => nr(Group(g.to_string())),
        ["apis", g, v] => nr(GroupVersion(g.to_string(), v.to_string())),
        ["apis", g, v, rest @ ..] => resource(g, v, rest).map(Route::Resource),
        ["version"] => nr(Version),
        ["healthz" | "livez" | "readyz", ..] => nr(Health),
        ["openapi", rest @ ..] => nr(OpenApi(rest.join("/"))),
        [".well-known", "openid-configuration"] => nr(OidcConfig),
        ["openid", "v1", "jwks"] => nr(Jwks),
        _ => Err(ApiError::no_route()),
    }
}

/// The Kubernetes verb of a resource request.
pub fn verb(method: &str, p: &ResourcePath, watch_param: bool) -> Result<&'static str, ApiError> {
    let named = p.name.is_some();
    Ok(match (method, named, p.sub.is_some()) {
        ("GET" | "HEAD", false, _) if watch_param || p.legacy_watch => "watch",
        ("GET" | "HEAD", false, _) => "list",
        ("GET" | "HEAD", true, _) if p.legacy_watch => "watch",
        ("GET" | "HEAD", true, _) => "get",
        ("POST", false, _) => "create",
        ("POST", true, true) => "create",
        ("PUT", true, _) => "update",
        ("PATCH", true, _) => "patch",
        ("DELETE", true, false) => "delete",
        ("DELETE", false, _) => "deletecollection",
        (m, _, _) => return Err(ApiError::method_not_allowed(m)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn res(path: &str) -> ResourcePath {
        match route(path) {
            Ok(Route::Resource(r)) => r,
            other => panic!("{path}: {other:?}"),
        }
    }

    #[test]
    fn paths() {
        let p = res("/api/v1/namespaces/default/pods/web/status");
        assert_eq!(
            (
                p.res.plural,
                p.ns.as_deref(),
                p.name.as_deref(),
                p.sub.as_deref()
            ),
            ("pods", Some("default"), Some("web"), Some("status"))
        );
        let n = res("/api/v1/namespaces/foo/status");
        assert_eq!(
            (n.res.plural, n.name.as_deref(), n.sub.as_deref()),
            ("namespaces", Some("foo"), Some("status"))
        );
        let n = res("/api/v1/namespaces/foo");
        assert_eq!(
            (n.res.plural, n.name.as_deref()),
            ("namespaces", Some("foo"))
        );
        let all = res("/apis/discovery.k8s.io/v1/endpointslices");
        assert!(all.ns.is_none());
        let w = res("/api/v1/watch/namespaces/default/pods");
        assert!(w.legacy_watch);
        assert!(route("/api/v1/pods/x").is_err());
        assert!(route("/api/v1/namespaces/default/nodes").is_err());
        assert!(route("/api/v1/namespaces/default/pods/x/log").is_err());
        assert!(route("/apis/batch/v1/jobs").is_err());
        assert!(matches!(
            route("/apis"),
            Ok(Route::NonResource(NonResource::Apis))
        ));
        assert_eq!(
            verb("DELETE", &res("/api/v1/namespaces/d/pods"), false).ok(),
            Some("deletecollection")
        );
        assert_eq!(
            verb("POST", &res("/api/v1/namespaces/d/pods/x/binding"), false).ok(),
            Some("create")
        );
        assert!(verb("POST", &res("/api/v1/namespaces/d/pods/x"), false).is_err());
    }
}
