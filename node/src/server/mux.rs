//! Which paths kubelet's server answers at all. kubelet serves its API
//! from an `http.ServeMux` on which each handler is registered
//! (`pkg/kubelet/server/server.go`: `InstallAuthFilter`, then
//! `InstallDefaultHandlers`, `InstallDebuggingHandlers`,
//! `InstallAuthRequiredHandlers`); authentication and authorization are a
//! filter of the registered handlers, so a path no handler is registered
//! for is `404 page not found` before any credential is looked at, and an
//! unknown path below a go-restful web service's root (`/stats/x`) is
//! checked first and then go-restful's `404: Page Not Found`.

/// Handlers registered for exactly one path (Go `ServeMux` patterns
/// without a trailing slash), healthz's checks aside.
const EXACT: &[&str] = &[
    "/healthz",
    "/configz",
    "/metrics",
    "/metrics/cadvisor",
    "/metrics/resource",
    "/metrics/probes",
    "/metrics/slis",
    "/statusz",
    "/flagz",
    "/debug/flags/v",
];

/// go-restful web services: their root and everything below it.
const RESTFUL_ROOTS: &[&str] = &[
    "/pods",
    "/stats",
    "/run",
    "/exec",
    "/attach",
    "/portForward",
    "/containerLogs",
    "/runningpods",
    "/checkpoint",
    "/logs",
    "/debug/pprof",
];

/// Whether a handler is registered for `path` on the authenticated
/// server; `is_check` says whether a healthz check of that name exists
/// (each has its own `/healthz/<name>` pattern).
pub(crate) fn is_registered(path: &str, is_check: impl Fn(&str) -> bool) -> bool {
    if EXACT.contains(&path) {
        return true;
    }
    if let Some(name) = path.strip_prefix("/healthz/") {
        return !name.is_empty() && !name.contains('/') && is_check(name);
    }
    RESTFUL_ROOTS.iter().any(|root| {
        path.strip_prefix(root)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registered_paths_as_kubelets_mux() {
        let checks = |n: &str| n == "syncloop";
        for p in [
            "/healthz",
            "/healthz/syncloop",
            "/pods",
            "/pods/x",
            "/stats/summary",
            "/stats/nonexistent",
            "/metrics",
            "/metrics/slis",
            "/containerLogs/ns/p/c",
            "/runningpods/",
            "/debug/pprof/",
            "/configz",
        ] {
            assert!(is_registered(p, checks), "{p}");
        }
        for p in [
            "/",
            "/spec/",
            "/no/such/path",
            "/healthz/nonexistent",
            "/healthz/",
            "/metrics/nonexistent",
            "/metricsx",
            "/podsx",
            "/configz/x",
        ] {
            assert!(!is_registered(p, checks), "{p}");
        }
    }
}
