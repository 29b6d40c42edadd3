//! The HTTP side: listeners (plain and TLS, HTTP/1.1 and HTTP/2), the
//! request pipeline (outage, authentication, routing, injected failures
//! and latency, content negotiation, request log) and dispatch to verbs.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::SystemTime;

use bytes::Bytes;
use futures::StreamExt;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

use super::authn::{PeerCert, UserInfo, authenticate, peer_cert};
use super::discovery;
use super::error::ApiError;
use super::knobs::{Outage, RequestRecord};
use super::objects::{self, DeleteOpts, JsonReply, Target};
use super::routing::{self, NonResource, ResourcePath, Route};
use super::state::ApiState;
use super::table::{self, IncludeObject};
use super::util::{self, Query};
use super::watch::{self, WatchRequest};
use super::{openapi, pods, tokens};

/// Response body type.
pub type Body = UnsyncBoxBody<Bytes, Infallible>;

fn full(b: impl Into<Bytes>) -> Body {
    Full::new(b.into()).boxed_unsync()
}

/// How the answer is encoded.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Repr {
    Json,
    Yaml,
    Table(IncludeObject),
    /// `PartialObjectMetadata(List)`: metadata only.
    Metadata,
}

const PARTIAL_CT: &str = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1";
const PARTIAL_LIST_CT: &str = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1";

fn partial(obj: &Value) -> Value {
    json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
           "metadata": obj.get("metadata").cloned().unwrap_or(json!({}))})
}

fn as_metadata(reply: JsonReply, single: bool) -> Result<Response<Body>, ApiError> {
    let v: Value =
        serde_json::from_slice(&reply.body).map_err(|e| ApiError::internal(e.to_string()))?;
    if single {
        return Ok(respond(
            reply.code,
            PARTIAL_CT,
            Bytes::from(partial(&v).to_string()),
        ));
    }
    let items: Vec<Value> = v
        .get("items")
        .and_then(Value::as_array)
        .map(|a| a.iter().map(partial).collect())
        .unwrap_or_default();
    let list = json!({"kind": "PartialObjectMetadataList", "apiVersion": "meta.k8s.io/v1",
                      "metadata": v.get("metadata").cloned().unwrap_or(json!({})), "items": items});
    Ok(respond(
        reply.code,
        PARTIAL_LIST_CT,
        Bytes::from(list.to_string()),
    ))
}

/// Picks the representation from `Accept` (first acceptable entry wins).
fn negotiate(accept: &str, q: &Query) -> Result<Repr, ApiError> {
    if accept.trim().is_empty() {
        return Ok(Repr::Json);
    }
    for entry in accept.split(',') {
        let mut parts = entry.split(';').map(str::trim);
        let base = parts.next().unwrap_or_default();
        let params: Vec<(&str, &str)> = parts.filter_map(|p| p.split_once('=')).collect();
        let param = |k: &str| params.iter().find(|(pk, _)| *pk == k).map(|(_, v)| *v);
        match base {
            "application/json" => match param("as") {
                None => return Ok(Repr::Json),
                Some("Table")
                    if param("g") == Some("meta.k8s.io")
                        && matches!(param("v"), Some("v1" | "v1beta1")) =>
                {
                    return Ok(Repr::Table(IncludeObject::parse(
                        q.get("includeObject").map(String::as_str),
                    )));
                }
                Some("PartialObjectMetadata" | "PartialObjectMetadataList")
                    if param("g") == Some("meta.k8s.io")
                        && matches!(param("v"), Some("v1" | "v1beta1")) =>
                {
                    return Ok(Repr::Metadata);
                }
                Some(_) => continue,
            },
            "*/*" | "application/*" => return Ok(Repr::Json),
            "application/yaml" => return Ok(Repr::Yaml),
            _ => continue,
        }
    }
    Err(ApiError::not_acceptable())
}

fn respond(code: u16, content_type: &str, body: Bytes) -> Response<Body> {
    let mut r = Response::new(full(body));
    *r.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let h = r.headers_mut();
    if let Ok(v) = content_type.parse() {
        h.insert(http::header::CONTENT_TYPE, v);
    }
    if let Ok(v) = "no-cache, private".parse() {
        h.insert(http::header::CACHE_CONTROL, v);
    }
    r
}

fn error_response(e: &ApiError) -> Response<Body> {
    let mut r = respond(
        e.code,
        "application/json",
        Bytes::from(e.to_status().to_string()),
    );
    if let Some(s) = e.details.retry_after
        && let Ok(v) = s.to_string().parse()
    {
        r.headers_mut().insert(http::header::RETRY_AFTER, v);
    }
    r
}

fn encode(repr: Repr, code: u16, body: Bytes) -> Result<Response<Body>, ApiError> {
    match repr {
        Repr::Json | Repr::Table(_) | Repr::Metadata => Ok(respond(code, "application/json", body)),
        Repr::Yaml => {
            let v: Value =
                serde_json::from_slice(&body).map_err(|e| ApiError::internal(e.to_string()))?;
            let y = serde_yaml::to_string(&v).map_err(|e| ApiError::internal(e.to_string()))?;
            Ok(respond(code, "application/yaml", Bytes::from(y)))
        }
    }
}

fn header(h: &HeaderMap, name: http::header::HeaderName) -> String {
    h.get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string()
}

/// `pods/{log,exec,attach,portforward}` and `nodes/proxy`: authenticated,
/// logged, then proxied to the node's kubelet.
async fn proxy_to_kubelet(
    state: &Arc<ApiState>,
    peer: Option<&PeerCert>,
    target: super::kubelet_proxy::Target,
    req: Request<Incoming>,
) -> Response<Body> {
    let path = req.uri().path().to_string();
    let (verb, resource, sub, ns, name) = match &target {
        super::kubelet_proxy::Target::Pod { ns, name, sub } => (
            if req.method() == http::Method::GET {
                "get"
            } else {
                "create"
            },
            "pods",
            sub.clone(),
            ns.clone(),
            name.clone(),
        ),
        super::kubelet_proxy::Target::Node { name, .. } => (
            match req.method().as_str() {
                "GET" | "HEAD" => "get",
                "PUT" => "update",
                "PATCH" => "patch",
                "DELETE" => "delete",
                _ => "create",
            },
            "nodes",
            "proxy".to_string(),
            String::new(),
            name.clone(),
        ),
    };
    let mut rec = RequestRecord {
        at: SystemTime::now(),
        http_version: format!("{:?}", req.version()),
        method: req.method().to_string(),
        path: path.clone(),
        query: req.uri().query().unwrap_or_default().to_string(),
        verb: verb.to_string(),
        resource: resource.to_string(),
        subresource: sub,
        namespace: ns,
        name,
        user: String::new(),
        user_agent: header(req.headers(), http::header::USER_AGENT),
        accept: header(req.headers(), http::header::ACCEPT),
        content_type: header(req.headers(), http::header::CONTENT_TYPE),
        status: 0,
    };
    let resp = match authenticate(state, req.headers(), &path, peer) {
        Ok(user) => {
            rec.user = user.name;
            match super::kubelet_proxy::serve(state, target, req).await {
                Ok(r) => r,
                Err(e) => error_response(&e),
            }
        }
        Err(e) => error_response(&e),
    };
    rec.status = resp.status().as_u16();
    state.knobs.log(rec);
    resp
}

/// Serves one request.
async fn handle(
    state: Arc<ApiState>,
    peer: Option<Arc<PeerCert>>,
    req: Request<Incoming>,
) -> Result<Response<Body>, std::io::Error> {
    // Simulated outage.
    let mut outage = state.knobs.outage_rx();
    if *outage.borrow_and_update() == Outage::Hang {
        let _ = outage.wait_for(|o| *o != Outage::Hang).await;
    }
    if state.knobs.outage() == Outage::Refuse {
        return Err(std::io::Error::new(
            std::io::ErrorKind::ConnectionReset,
            "outage (test knob)",
        ));
    }
    if let Some(target) = super::kubelet_proxy::route(req.uri().path()) {
        return Ok(proxy_to_kubelet(&state, peer.as_deref(), target, req).await);
    }
    let (parts, body) = req.into_parts();
    let method = parts.method.as_str().to_string();
    let path = parts.uri.path().to_string();
    let raw_query = parts.uri.query().unwrap_or_default().to_string();
    let query = util::parse_query(Some(&raw_query));
    let mut rec = RequestRecord {
        at: SystemTime::now(),
        http_version: format!("{:?}", parts.version),
        method: method.clone(),
        path: path.clone(),
        query: raw_query,
        verb: String::new(),
        resource: String::new(),
        subresource: String::new(),
        namespace: String::new(),
        name: String::new(),
        user: String::new(),
        user_agent: header(&parts.headers, http::header::USER_AGENT),
        accept: header(&parts.headers, http::header::ACCEPT),
        content_type: header(&parts.headers, http::header::CONTENT_TYPE),
        status: 0,
    };
    let result = process(
        &state,
        peer.as_deref(),
        &parts.headers,
        &method,
        &path,
        &query,
        body,
        &mut rec,
    )
    .await;
    let latency = state.knobs.latency();
    if !latency.is_zero() {
        tokio::time::sleep(latency).await;
    }
    let resp = match result {
        Ok(r) => r,
        Err(e) => {
            if e.code >= 500 {
                tracing::warn!(method = %method, path = %path, code = e.code, message = %e.message, "request failed");
            } else {
                tracing::debug!(method = %method, path = %path, code = e.code, message = %e.message, "request rejected");
            }
            error_response(&e)
        }
    };
    rec.status = resp.status().as_u16();
    state.knobs.log(rec);
    Ok(resp)
}

#[allow(clippy::too_many_arguments)]
async fn process(
    state: &Arc<ApiState>,
    peer: Option<&PeerCert>,
    headers: &HeaderMap,
    method: &str,
    path: &str,
    query: &Query,
    body: Incoming,
    rec: &mut RequestRecord,
) -> Result<Response<Body>, ApiError> {
    let user = authenticate(state, headers, path, peer)?;
    rec.user = user.name.clone();
    let accept = header(headers, http::header::ACCEPT);
    let content_type = header(headers, http::header::CONTENT_TYPE);
    if method == "POST" {
        let review = match path {
            "/apis/authentication.k8s.io/v1/tokenreviews" => Some(true),
            "/apis/authorization.k8s.io/v1/subjectaccessreviews" => Some(false),
            _ => None,
        };
        if let Some(is_token) = review {
            rec.verb = "create".into();
            rec.resource = if is_token {
                "tokenreviews"
            } else {
                "subjectaccessreviews"
            }
            .into();
            let body = body
                .collect()
                .await
                .map_err(|e| ApiError::bad_request(format!("reading body: {e}")))?
                .to_bytes();
            let v = if is_token {
                super::reviews::token_review(state, &body)?
            } else {
                super::reviews::subject_access_review(state, &body)?
            };
            return Ok(respond(201, "application/json", Bytes::from(v.to_string())));
        }
    }
    match routing::route(path)? {
        Route::NonResource(nr) => {
            if method != "GET" && method != "HEAD" {
                return Err(ApiError::method_not_allowed(method));
            }
            let host = header(headers, http::header::HOST);
            non_resource(state, nr, &host)
        }
        Route::Resource(rp) => {
            let verb = routing::verb(method, &rp, util::flag(query, "watch") == Some(true))?;
            rec.verb = verb.to_string();
            rec.resource = rp.res.plural.to_string();
            rec.subresource = rp.sub.clone().unwrap_or_default();
            rec.namespace = rp.ns.clone().unwrap_or_default();
            rec.name = rp.name.clone().unwrap_or_default();
            if let Some(code) = state
                .knobs
                .take_failure(verb, rp.res.plural, &rec.subresource)
            {
                return Err(ApiError::injected(code));
            }
            let body = body
                .collect()
                .await
                .map_err(|e| ApiError::bad_request(format!("reading body: {e}")))?
                .to_bytes();
            resource(
                state,
                &rp,
                &user,
                verb,
                query,
                &accept,
                &content_type,
                &body,
            )
        }
    }
}

fn non_resource(state: &ApiState, nr: NonResource, host: &str) -> Result<Response<Body>, ApiError> {
    let j = |v: Value| Ok(respond(200, "application/json", Bytes::from(v.to_string())));
    match nr {
        NonResource::Root => j(
            json!({"paths": ["/api", "/api/v1", "/apis", "/apis/coordination.k8s.io", "/apis/coordination.k8s.io/v1", "/apis/discovery.k8s.io", "/apis/discovery.k8s.io/v1", "/apis/events.k8s.io", "/apis/events.k8s.io/v1", "/apis/node.k8s.io", "/apis/node.k8s.io/v1", "/healthz", "/livez", "/openid/v1/jwks", "/readyz", "/version", "/.well-known/openid-configuration"]}),
        ),
        NonResource::Api => j(discovery::core_versions(host)),
        NonResource::Apis => j(discovery::group_list()),
        NonResource::Group(g) => discovery::group(&g).map_or_else(|| Err(ApiError::no_route()), j),
        NonResource::GroupVersion(g, v) => {
            discovery::resource_list(&g, &v).map_or_else(|| Err(ApiError::no_route()), j)
        }
        NonResource::Version => j(discovery::version()),
        NonResource::Health => Ok(respond(
            200,
            "text/plain; charset=utf-8",
            Bytes::from_static(b"ok"),
        )),
        NonResource::OpenApi(rest) => match rest.as_str() {
            "v3" => j(openapi::root()),
            r => match r.strip_prefix("v3/").and_then(openapi::group_version) {
                Some(doc) => j(doc),
                None => Err(ApiError::no_route()),
            },
        },
        NonResource::OidcConfig => j(state
            .signer
            .openid_configuration(&format!("{}/openid/v1/jwks", state.https_url))),
        NonResource::Jwks => Ok(respond(
            200,
            "application/jwk-set+json",
            Bytes::from(state.signer.jwks().to_string()),
        )),
    }
}

fn parse_json_body(content_type: &str, body: &[u8]) -> Result<Value, ApiError> {
    if body.is_empty() {
        return Err(ApiError::bad_request("the request body is empty"));
    }
    objects::parse_body(content_type, body)
}

fn as_table(
    state: &ApiState,
    t: &Target<'_>,
    reply: JsonReply,
    include: IncludeObject,
    single: bool,
) -> Result<Response<Body>, ApiError> {
    let v: Value =
        serde_json::from_slice(&reply.body).map_err(|e| ApiError::internal(e.to_string()))?;
    let (items, meta) = if single {
        (
            vec![v.clone()],
            json!({"resourceVersion": v.pointer("/metadata/resourceVersion").cloned().unwrap_or(json!(""))}),
        )
    } else {
        (
            v.get("items")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default(),
            v.get("metadata").cloned().unwrap_or(json!({})),
        )
    };
    let _ = state;
    let tbl = table::table(t.res, &items, meta, include);
    Ok(respond(
        reply.code,
        "application/json;as=Table;v=v1;g=meta.k8s.io",
        Bytes::from(tbl.to_string()),
    ))
}

#[allow(clippy::too_many_arguments)]
fn resource(
    state: &Arc<ApiState>,
    rp: &ResourcePath,
    user: &UserInfo,
    verb: &str,
    q: &Query,
    accept: &str,
    content_type: &str,
    body: &[u8],
) -> Result<Response<Body>, ApiError> {
    let t = Target {
        res: rp.res,
        ns: rp.ns.as_deref(),
        name: rp.name.as_deref(),
        sub: rp.sub.as_deref(),
        user: Some(user),
    };
    let repr = negotiate(accept, q)?;
    let reply = match verb {
        "get" => {
            let r = objects::get(state, &t)?;
            match repr {
                Repr::Table(inc) => return as_table(state, &t, r, inc, true),
                Repr::Metadata => return as_metadata(r, true),
                _ => r,
            }
        }
        "list" => {
            let (items, meta) = objects::list(state, &t, q)?;
            let r = JsonReply::new(200, objects::list_body(t.res, &items, &meta)?);
            match repr {
                Repr::Table(inc) => return as_table(state, &t, r, inc, false),
                Repr::Metadata => return as_metadata(r, false),
                _ => r,
            }
        }
        "watch" => {
            let name = if rp.legacy_watch {
                rp.name.as_deref()
            } else {
                None
            };
            let mut wr = WatchRequest::parse(rp.res, rp.ns.clone(), name, q)?;
            match repr {
                Repr::Table(inc) => wr.table = Some(inc),
                Repr::Metadata => wr.metadata_only = true,
                _ => {}
            }
            let s = watch::stream(state.clone(), wr).map(|b| Ok::<_, Infallible>(Frame::data(b)));
            let mut r = Response::new(StreamBody::new(s).boxed_unsync());
            let ct = match repr {
                Repr::Table(_) => "application/json;as=Table;v=v1;g=meta.k8s.io",
                Repr::Metadata => PARTIAL_CT,
                _ => "application/json",
            };
            if let Ok(v) = ct.parse() {
                r.headers_mut().insert(http::header::CONTENT_TYPE, v);
            }
            return Ok(r);
        }
        "create" => {
            let v = parse_json_body(content_type, body)?;
            match t.sub {
                Some("binding") => pods::bind(state, &t, &v)?,
                Some("eviction") => pods::evict(state, &t, &v)?,
                Some("token") => tokens::token_request(state, &t, &v)?,
                Some(_) => return Err(ApiError::method_not_allowed("POST")),
                None => objects::create(state, &t, q, v)?,
            }
        }
        "update" => {
            let v = parse_json_body(content_type, body)?;
            if t.sub == Some("finalize") {
                super::namespaces::finalize(state, &t, v)?
            } else {
                objects::update(state, &t, q, v)?
            }
        }
        "patch" => objects::patch(state, &t, q, content_type, body)?,
        "delete" => objects::delete(state, &t, &DeleteOpts::parse(q, content_type, body)?)?,
        "deletecollection" => {
            objects::delete_collection(state, &t, q, &DeleteOpts::parse(q, content_type, body)?)?
        }
        other => return Err(ApiError::method_not_allowed(other)),
    };
    let warnings = reply.warnings.clone();
    let mut resp = if let Repr::Table(_) | Repr::Metadata = repr {
        // Tables and metadata views are for reads; writes answer the object.
        respond(reply.code, "application/json", reply.body)
    } else {
        encode(repr, reply.code, reply.body)?
    };
    for w in warnings {
        let v = format!("299 - \"{}\"", w.replace('"', "\\\""));
        if let Ok(h) = v.parse() {
            resp.headers_mut().append(http::header::WARNING, h);
        }
    }
    Ok(resp)
}

/// Serves `listener` (TLS when `tls` is set) until `shutdown`.
pub fn spawn_listener(
    state: Arc<ApiState>,
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    shutdown: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                _ = shutdown.cancelled() => break,
                a = listener.accept() => a,
            };
            let (stream, peer): (tokio::net::TcpStream, SocketAddr) = match accepted {
                Ok(x) => x,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            };
            if state.knobs.outage() == Outage::Refuse {
                drop(stream);
                continue;
            }
            let _ = stream.set_nodelay(true);
            let state = state.clone();
            let tls = tls.clone();
            let shutdown = shutdown.clone();
            tokio::spawn(async move {
                let mut builder =
                    hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
                // kube-apiserver's --http2-max-streams-per-connection default.
                builder.http2().max_concurrent_streams(1000);
                let served = async {
                    match tls {
                        Some(acceptor) => match acceptor.accept(stream).await {
                            Ok(s) => {
                                let peer: Option<Arc<PeerCert>> = s
                                    .get_ref()
                                    .1
                                    .peer_certificates()
                                    .and_then(|c| c.first())
                                    .and_then(|c| peer_cert(c.as_ref()))
                                    .map(Arc::new);
                                let svc = hyper::service::service_fn(move |req| {
                                    handle(state.clone(), peer.clone(), req)
                                });
                                builder
                                    .serve_connection_with_upgrades(TokioIo::new(s), svc)
                                    .await
                            }
                            Err(e) => {
                                tracing::debug!(peer = %peer, error = %e, "TLS handshake failed");
                                Ok(())
                            }
                        },
                        None => {
                            let svc = hyper::service::service_fn(move |req| {
                                handle(state.clone(), None, req)
                            });
                            builder
                                .serve_connection_with_upgrades(TokioIo::new(stream), svc)
                                .await
                        }
                    }
                };
                tokio::select! {
                    r = served => {
                        if let Err(e) = r {
                            tracing::debug!(peer = %peer, error = %e, "connection ended with error");
                        }
                    }
                    _ = shutdown.cancelled() => {}
                }
            });
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn negotiation() {
        let q = Query::new();
        assert_eq!(negotiate("", &q).ok(), Some(Repr::Json));
        assert_eq!(
            negotiate("application/vnd.kubernetes.protobuf,application/json", &q).ok(),
            Some(Repr::Json)
        );
        assert!(negotiate("application/vnd.kubernetes.protobuf", &q).is_err());
        assert_eq!(
            negotiate("application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json", &q).ok(),
            Some(Repr::Table(IncludeObject::Metadata))
        );
        assert_eq!(
            negotiate("application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json", &q).ok(),
            Some(Repr::Json)
        );
    }
}
