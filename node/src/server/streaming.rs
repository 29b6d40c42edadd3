//! `/exec`, `/attach`, `/portForward` and `/run` (kubelet's `getExec`,
//! `getAttach`, `getPortForward`, `getRun` in `pkg/kubelet/server/server.go`
//! and `GetExec`/`GetAttach`/`GetPortForward`/`RunInContainer` in
//! `pkg/kubelet/kubelet_pods.go`): find the running container (or the
//! ready sandbox) through CRI, ask the runtime for a streaming URL, proxy
//! the upgraded connection to it ([`super::upgrade_proxy`]).
//!
//! `ExtendWebSocketsToKubelet` (beta, on in v1.36): a WebSocket exec or
//! attach asking for `v5.channel.k8s.io` is translated to SPDY toward the
//! runtime ([`super::ws_translator`]), a WebSocket port-forward asking for
//! a `SPDY/3.1+…k8s.io` protocol is tunneled ([`super::ws_tunnel`], with
//! no `port` query check); each counts in
//! `kubelet_websocket_streaming_requests_total`. SPDY and the older
//! WebSocket protocols keep the plain proxy.

use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use keelson_cri::{CriError, api};

use super::NodeApi;
use super::body::{self, Body};
use super::remotecommand::{StreamOptions, stream_options};
use crate::pod::labels;

/// Which streaming endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `/exec/`.
    Exec,
    /// `/attach/`.
    Attach,
    /// `/run/` (ExecSync, output in the answer).
    Run,
}

impl Kind {
    /// The path prefix.
    pub fn prefix(self) -> &'static str {
        match self {
            Kind::Exec => "/exec/",
            Kind::Attach => "/attach/",
            Kind::Run => "/run/",
        }
    }
}

/// `streaming.WriteError`: NotFound → 404, ResourceExhausted → 429 (with
/// `Retry-After`), else 500; the body is the gRPC error text.
fn write_cri_error(e: &CriError) -> Response<Body> {
    let (code, retry) = match e.code() {
        Some(keelson_cri::Code::NotFound) => (StatusCode::NOT_FOUND, false),
        Some(keelson_cri::Code::ResourceExhausted) => (StatusCode::TOO_MANY_REQUESTS, true),
        _ => (StatusCode::INTERNAL_SERVER_ERROR, false),
    };
    let mut r = body::text(code, e.grpc_text());
    if retry {
        r.headers_mut().insert(
            http::header::RETRY_AFTER,
            http::HeaderValue::from_static("60"),
        );
    }
    r
}

fn pod_label_filter(
    ns: &str,
    pod: &str,
    uid: Option<&str>,
) -> std::collections::HashMap<String, String> {
    let mut m = std::collections::HashMap::new();
    m.insert(labels::POD_NAME.to_string(), pod.to_string());
    m.insert(labels::POD_NAMESPACE.to_string(), ns.to_string());
    if let Some(u) = uid {
        m.insert(labels::POD_UID.to_string(), u.to_string());
    }
    m
}

/// kubelet's `findContainer`: the running container `name` of the pod.
pub(crate) async fn find_container(
    api: &NodeApi,
    ns: &str,
    pod: &str,
    uid: Option<&str>,
    name: &str,
) -> Result<Option<String>, CriError> {
    let filter = api::ContainerFilter {
        state: Some(api::ContainerStateValue {
            state: api::ContainerState::ContainerRunning as i32,
        }),
        label_selector: pod_label_filter(ns, pod, uid),
        ..Default::default()
    };
    let list = api.cri.list_containers(Some(filter)).await?;
    Ok(list
        .into_iter()
        .filter(|c| {
            c.labels.get(labels::CONTAINER_NAME).map(String::as_str) == Some(name)
                || c.metadata.as_ref().is_some_and(|m| m.name == name)
        })
        .max_by_key(|c| c.created_at)
        .map(|c| c.id))
}

/// Serves exec, attach or run.
pub async fn serve(
    api: &NodeApi,
    kind: Kind,
    req: Request<Incoming>,
    ns: &str,
    pod_name: &str,
    uid: Option<&str>,
    container: &str,
) -> Response<Body> {
    let pairs = req
        .uri()
        .query()
        .map(super::basic::url_pairs)
        .unwrap_or_default();
    let opts = if kind == Kind::Run {
        StreamOptions::default()
    } else {
        match stream_options(&pairs) {
            Ok(o) => o,
            Err(e) => return body::text(StatusCode::BAD_REQUEST, e.to_string()),
        }
    };
    let Some(pod) = api.pods.get().and_then(|p| p.pod_by_name(ns, pod_name)) else {
        return body::text(StatusCode::NOT_FOUND, "pod does not exist");
    };
    let full_name = format!("{pod_name}_{ns}");
    let id = match find_container(api, ns, pod_name, uid, container).await {
        Ok(Some(id)) => id,
        Ok(None) => {
            let msg = match kind {
                Kind::Attach => format!("container {container} not found in pod {full_name}"),
                _ => format!("container not found ({container:?})"),
            };
            return body::text(StatusCode::INTERNAL_SERVER_ERROR, msg);
        }
        Err(e) => return write_cri_error(&e),
    };
    let url = match kind {
        Kind::Run => {
            // Legacy: `cmd` split on spaces, output as the answer.
            let cmd: Vec<String> = pairs
                .iter()
                .find(|(k, _)| k == "cmd")
                .map(|(_, v)| v.split(' ').map(str::to_string).collect())
                .unwrap_or_else(|| vec![String::new()]);
            return match api.cri.exec_sync(&id, cmd, std::time::Duration::ZERO).await {
                Ok(r) => {
                    let mut out = r.stdout;
                    out.extend_from_slice(&r.stderr);
                    let mut resp = body::text(StatusCode::OK, String::new());
                    *resp.body_mut() = body::full(out);
                    resp.headers_mut().insert(
                        http::header::CONTENT_TYPE,
                        http::HeaderValue::from_static("application/json"),
                    );
                    resp
                }
                Err(e) => body::text(StatusCode::INTERNAL_SERVER_ERROR, e.grpc_text()),
            };
        }
        Kind::Exec => {
            let cmd: Vec<String> = pairs
                .iter()
                .filter(|(k, _)| k == "command")
                .map(|(_, v)| v.clone())
                .collect();
            api.cri
                .exec(api::ExecRequest {
                    container_id: id,
                    cmd,
                    tty: opts.tty,
                    stdin: opts.stdin,
                    stdout: opts.stdout,
                    stderr: opts.stderr,
                })
                .await
        }
        Kind::Attach => {
            // A tty cannot be added to a running process: the spec decides
            // (`GetAttach` takes it from `GetContainerSpec`, which visits
            // ephemeral containers too: `kubectl debug -it` attaches to one).
            let tty = pod
                .spec
                .as_ref()
                .and_then(|s| {
                    s.containers
                        .iter()
                        .chain(s.init_containers.iter().flatten())
                        .find(|c| c.name == container)
                        .map(|c| c.tty)
                        .or_else(|| {
                            s.ephemeral_containers
                                .iter()
                                .flatten()
                                .find(|c| c.name == container)
                                .map(|c| c.tty)
                        })
                })
                .flatten()
                .unwrap_or(false);
            api.cri
                .attach(api::AttachRequest {
                    container_id: id,
                    stdin: opts.stdin,
                    tty,
                    stdout: opts.stdout,
                    stderr: opts.stderr,
                })
                .await
        }
    };
    let u = match url {
        Ok(u) => u,
        Err(e) => return write_cri_error(&e),
    };
    if super::wsstream::with_stream_close_protocol(req.headers()) {
        let sub = if kind == Kind::Attach {
            "attach"
        } else {
            "exec"
        };
        api.metrics
            .websocket_streaming
            .with_label_values(&[sub])
            .inc();
        return super::ws_translator::serve(req, u, opts);
    }
    super::upgrade_proxy::proxy(
        req,
        &u,
        api.ctx.config.streaming_connection_idle_timeout.get(),
    )
    .await
}

/// Why a WebSocket port-forward's `port` parameters are refused
/// (kubelet's `portforward.NewV4Options` texts, the 400 body).
#[derive(Debug, thiserror::Error)]
enum PortQueryError {
    /// No `port` parameter.
    #[error("query parameter \"port\" is required")]
    Missing,
    /// `port=`.
    #[error("query parameter \"port\" cannot be empty")]
    Empty,
    /// Not a port number.
    #[error("unable to parse {value:?} as a port: {error}")]
    Invalid {
        /// The parameter as given.
        value: String,
        /// Why.
        error: std::num::ParseIntError,
    },
    /// Port 0.
    #[error("port {0:?} must be > 0")]
    Zero(String),
}

/// The `port` query parameters of a WebSocket port-forward
/// (`portforward.NewV4Options`); SPDY clients name ports per stream.
fn websocket_ports(
    req: &Request<Incoming>,
    pairs: &[(String, String)],
) -> Result<Vec<i32>, PortQueryError> {
    let ws = req
        .headers()
        .get(http::header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("websocket"));
    if !ws {
        return Ok(Vec::new());
    }
    let values: Vec<&String> = pairs
        .iter()
        .filter(|(k, _)| k == "port")
        .map(|(_, v)| v)
        .collect();
    if values.is_empty() {
        return Err(PortQueryError::Missing);
    }
    let mut ports = Vec::new();
    for v in values {
        if v.is_empty() {
            return Err(PortQueryError::Empty);
        }
        for p in v.split(',') {
            let port: u16 = p.parse().map_err(|error| PortQueryError::Invalid {
                value: v.clone(),
                error,
            })?;
            if port < 1 {
                return Err(PortQueryError::Zero(v.clone()));
            }
            ports.push(i32::from(port));
        }
    }
    Ok(ports)
}

/// Serves port-forward.
pub async fn port_forward(
    api: &NodeApi,
    req: Request<Incoming>,
    ns: &str,
    pod_name: &str,
    uid: Option<&str>,
) -> Response<Body> {
    let pairs = req
        .uri()
        .query()
        .map(super::basic::url_pairs)
        .unwrap_or_default();
    // A tunneling WebSocket skips the port query check (its ports travel
    // in SPDY streams, as with SPDY).
    let tunnel = super::wsstream::with_tunneling_protocol(req.headers());
    let ports = if tunnel {
        Vec::new()
    } else {
        match websocket_ports(&req, &pairs) {
            Ok(p) => p,
            Err(e) => return body::text(StatusCode::BAD_REQUEST, e.to_string()),
        }
    };
    let Some(pod) = api.pods.get().and_then(|p| p.pod_by_name(ns, pod_name)) else {
        return body::text(StatusCode::NOT_FOUND, "pod does not exist");
    };
    let pod_uid = pod.metadata.uid.clone().unwrap_or_default();
    if uid.is_some_and(|u| u != pod_uid) {
        return body::text(StatusCode::NOT_FOUND, "pod not found");
    }
    let filter = api::PodSandboxFilter {
        state: Some(api::PodSandboxStateValue {
            state: api::PodSandboxState::SandboxReady as i32,
        }),
        label_selector: pod_label_filter(ns, pod_name, Some(&pod_uid)),
        ..Default::default()
    };
    let sandbox = match api.cri.list_pod_sandbox(Some(filter)).await {
        Ok(list) => list.into_iter().max_by_key(|s| s.created_at).map(|s| s.id),
        Err(e) => return write_cri_error(&e),
    };
    let Some(sandbox) = sandbox else {
        return body::text(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("pod not found ({:?})", format!("{pod_name}_{ns}")),
        );
    };
    let idle = api.ctx.config.streaming_connection_idle_timeout.get();
    match api.cri.port_forward(&sandbox, ports).await {
        Ok(u) if tunnel => {
            api.metrics
                .websocket_streaming
                .with_label_values(&["portforward"])
                .inc();
            super::ws_tunnel::serve(req, &u, idle).await
        }
        Ok(u) => super::upgrade_proxy::proxy(req, &u, idle).await,
        Err(e) => write_cri_error(&e),
    }
}
