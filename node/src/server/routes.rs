//! Every request: metrics, whether kubelet registers a handler for the path
//! at all ([`super::mux`]: if not, `404 page not found` before anything
//! else), authentication, authorization, then the path.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use http::{Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use rustls::pki_types::CertificateDer;

use super::NodeApi;
use super::authn::Authenticated;
use super::authz::{self, Decision};
use super::body::{self, Body};
use super::metrics::{long_running, method_bucket, path_bucket};

/// Serves one request.
pub async fn handle(
    api: Arc<NodeApi>,
    peer_chain: Option<Arc<[CertificateDer<'static>]>>,
    peer: SocketAddr,
    mut req: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let query = req.uri().query().unwrap_or_default().to_string();
    let bucket = path_bucket(&path);
    let server_type = if api.authn.is_some() {
        "readwrite"
    } else {
        "readonly"
    };
    let lr = if long_running(bucket) {
        "true"
    } else {
        "false"
    };
    let labels = [method_bucket(method.as_str()), bucket, server_type, lr];
    api.metrics.requests.with_label_values(&labels).inc();
    let inflight = api.metrics.inflight.with_label_values(&labels);
    inflight.inc();
    let timer = api
        .metrics
        .duration
        .with_label_values(&labels)
        .start_timer();

    let registered = api.authn.is_none()
        || super::mux::is_registered(&path, |name| {
            api.ctx
                .health
                .single(keelson_common::observability::ProbeKind::Liveness, name)
                .is_some()
        });
    let resp = if !registered {
        // No handler: Go's ServeMux answers before the auth filter runs.
        body::not_found()
    } else {
        match authorize(&api, peer_chain.as_deref(), &mut req).await {
            Ok(()) => dispatch(&api, req).await,
            Err(r) => r,
        }
    };
    tracing::debug!(%peer, %method, path = %path, query = %query, status = resp.status().as_u16(), "node API request");
    inflight.dec();
    timer.observe_duration();
    Ok(resp)
}

async fn authorize(
    api: &NodeApi,
    chain: Option<&[CertificateDer<'static>]>,
    req: &mut Request<Incoming>,
) -> Result<(), Response<Body>> {
    let (Some(authn), Some(authz)) = (&api.authn, &api.authz) else {
        return Ok(());
    };
    let user = match authn.authenticate(chain, req.headers()).await {
        Authenticated::User(u) => u,
        Authenticated::Nobody => return Err(body::text(StatusCode::UNAUTHORIZED, "Unauthorized")),
        Authenticated::Failed(e) => {
            tracing::warn!(error = %e, "unable to authenticate the request");
            return Err(body::text(StatusCode::UNAUTHORIZED, "Unauthorized"));
        }
    };
    // The token proved who calls; it is not passed on (e.g. to the
    // runtime's streaming server), as the bearer authenticator removes it.
    req.headers_mut().remove(http::header::AUTHORIZATION);
    let attrs =
        authz::request_attributes(req.method().as_str(), req.uri().path(), &api.ctx.node_name);
    for a in &attrs {
        match authz.authorize(&user, a).await {
            Ok(Decision::Allow) => return Ok(()),
            Ok(Decision::Deny) => {}
            Err(e) => {
                tracing::error!(user = %user.name, verb = a.verb, resource = a.resource, subresource = a.subresource, error = %e, "authorization error");
                return Err(body::text(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    format!(
                        "Authorization error (user={}, verb={}, resource={}, subresource={})",
                        user.name, a.verb, a.resource, a.subresource
                    ),
                ));
            }
        }
    }
    let msg = authz::forbidden_message(&user, &attrs);
    tracing::debug!(user = %user.name, message = %msg.trim_end(), "forbidden");
    Err(body::text(StatusCode::FORBIDDEN, msg))
}

/// The path segments after `prefix`, none empty.
pub fn params<'a>(path: &'a str, prefix: &str) -> Option<Vec<&'a str>> {
    let rest = path.strip_prefix(prefix)?;
    let segs: Vec<&str> = rest.trim_end_matches('/').split('/').collect();
    if segs.iter().any(|s| s.is_empty()) {
        return None;
    }
    Some(segs)
}

fn get_or_post(m: &Method) -> bool {
    *m == Method::GET || *m == Method::POST
}

async fn dispatch(api: &Arc<NodeApi>, req: Request<Incoming>) -> Response<Body> {
    let path = req.uri().path().to_string();
    let m = req.method().clone();
    let secure = api.authn.is_some();
    let get = m == Method::GET || m == Method::HEAD;
    // Handlers kubelet installs on both servers.
    if path == "/healthz" || path.starts_with("/healthz/") {
        return if get {
            super::basic::healthz(api, &path, req.uri().query())
        } else {
            body::method_not_allowed()
        };
    }
    if path == "/pods" || path == "/pods/" {
        return if get {
            super::basic::pods(api)
        } else {
            body::method_not_allowed()
        };
    }
    if path == "/stats/summary" || path == "/stats/summary/" {
        return if get_or_post(&m) {
            super::stats_routes::summary(api, req).await
        } else {
            body::method_not_allowed()
        };
    }
    if path == "/metrics/slis" {
        return body::prometheus(api.slis.text());
    }
    if matches!(
        path.as_str(),
        "/metrics" | "/metrics/cadvisor" | "/metrics/resource" | "/metrics/probes"
    ) {
        return super::stats_routes::metrics(api, &path).await;
    }
    if !secure {
        return body::not_found();
    }
    // kubelet installs `/configz` with the debugging handlers
    // (`InstallAuthRequiredHandlers`, `pkg/kubelet/server/server.go`
    // `NewServer`): with them disabled it is an unknown path.
    if path == "/configz" {
        // component-base's configz handler answers every method.
        return if !api.ctx.config.enable_debugging_handlers {
            body::not_found()
        } else {
            super::basic::configz(api)
        };
    }
    let debug_paths = [
        "/run/",
        "/exec/",
        "/attach/",
        "/portForward/",
        "/containerLogs/",
        "/runningpods/",
    ];
    if !api.ctx.config.enable_debugging_handlers
        && (debug_paths.iter().any(|p| path.starts_with(p)) || path == "/runningpods")
    {
        return body::http_error(
            StatusCode::METHOD_NOT_ALLOWED,
            "Debug endpoints are disabled.",
        );
    }
    if path == "/runningpods/" || path == "/runningpods" {
        return if get {
            super::basic::running_pods(api).await
        } else {
            body::method_not_allowed()
        };
    }
    if let Some(p) = params(&path, "/containerLogs/") {
        return match p.as_slice() {
            [ns, pod, c] if get => {
                super::container_logs::serve(api, ns, pod, c, req.uri().query()).await
            }
            [_, _, _] => body::method_not_allowed(),
            _ => body::restful_not_found(),
        };
    }
    for kind in [
        super::streaming::Kind::Exec,
        super::streaming::Kind::Attach,
        super::streaming::Kind::Run,
    ] {
        if let Some(p) = params(&path, kind.prefix()) {
            let ok_method = match kind {
                super::streaming::Kind::Run => m == Method::POST,
                _ => get_or_post(&m),
            };
            let (ns, pod, uid, c) = match p.as_slice() {
                [ns, pod, c] => (*ns, *pod, None, *c),
                [ns, pod, uid, c] => (*ns, *pod, Some(*uid), *c),
                _ => return body::restful_not_found(),
            };
            if !ok_method {
                return body::method_not_allowed();
            }
            let (ns, pod, uid, c) = (
                ns.to_string(),
                pod.to_string(),
                uid.map(str::to_string),
                c.to_string(),
            );
            return super::streaming::serve(api, kind, req, &ns, &pod, uid.as_deref(), &c).await;
        }
    }
    if let Some(p) = params(&path, "/checkpoint/") {
        let (ns, pod, uid, c) = match p.as_slice() {
            [ns, pod, c] => (*ns, *pod, None, *c),
            [ns, pod, uid, c] => (*ns, *pod, Some(*uid), *c),
            _ => return body::restful_not_found(),
        };
        if m != Method::POST {
            return body::method_not_allowed();
        }
        return super::checkpoint::serve(api, ns, pod, uid, c, req.uri().query()).await;
    }
    // `/debug/flags/v` sets klog's verbosity on PUT; keelson's log filter
    // is `RUST_LOG`/`logging` at start, so a PUT is refused saying so.
    if path == "/debug/flags/v" {
        return if m == Method::PUT {
            body::text(
                StatusCode::BAD_REQUEST,
                "keelson does not change its log verbosity at run time: set logging.level (or RUST_LOG) and restart keelson",
            )
        } else {
            body::text(StatusCode::NOT_ACCEPTABLE, "unsupported http method")
        };
    }
    if let Some(p) = params(&path, "/portForward/") {
        let (ns, pod, uid) = match p.as_slice() {
            [ns, pod] => (*ns, *pod, None),
            [ns, pod, uid] => (*ns, *pod, Some(*uid)),
            _ => return body::restful_not_found(),
        };
        if !get_or_post(&m) {
            return body::method_not_allowed();
        }
        let (ns, pod, uid) = (ns.to_string(), pod.to_string(), uid.map(str::to_string));
        return super::streaming::port_forward(api, req, &ns, &pod, uid.as_deref()).await;
    }
    // A registered path no route of keelson's serves: go-restful's answer
    // below a web service's root, Go's for the mux's own patterns.
    if path.starts_with("/healthz") || path.starts_with("/metrics") {
        body::not_found()
    } else {
        body::restful_not_found()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn path_params() {
        assert_eq!(params("/exec/ns/p/c", "/exec/"), Some(vec!["ns", "p", "c"]));
        assert_eq!(params("/exec/ns//c", "/exec/"), None);
        assert_eq!(
            params("/portForward/ns/p/", "/portForward/"),
            Some(vec!["ns", "p"])
        );
    }
}
