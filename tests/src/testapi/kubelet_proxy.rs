//! What kube-apiserver does with `pods/log`, `pods/exec`, `pods/attach`,
//! `pods/portforward` and `nodes/proxy`
//! (`pkg/registry/core/pod/strategy.go` `LogLocation`/`ExecLocation`/…,
//! `pkg/registry/core/node/strategy.go` `ResourceLocation`): find the
//! node's address (InternalIP first, as kubeadm's
//! `--kubelet-preferred-address-types`) and `daemonEndpoints` port, and
//! proxy to the kubelet API over TLS with this server's kubelet client
//! certificate (`--kubelet-client-certificate`), checking the node's
//! serving certificate only when a kubelet CA is set
//! (`--kubelet-certificate-authority`; without it kube-apiserver does not
//! verify either). Upgrades (SPDY) are relayed byte for byte.
//!
//! WebSocket exec, attach and port-forward (kubectl v1.36 tries them
//! first) go straight to nodes whose `status.declaredFeatures` has
//! `ExtendWebSocketsToKubelet`, as kube-apiserver does
//! (`pkg/registry/core/pod/rest/subresources.go`,
//! `checkNodeSupportsWebsockets`). Difference: toward other nodes
//! kube-apiserver translates them to SPDY itself; this server refuses
//! them with 400, which makes kubectl fall back to SPDY, what the
//! translation would have sent the node anyway.

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use futures::StreamExt;
use http::{Request, Response, StatusCode, header};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::TokioIo;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use serde_json::Value;
use tokio::net::TcpStream;

use super::error::ApiError;
use super::http::Body;
use super::state::ApiState;

/// Opens a TCP connection to a node's kubelet (tests put nodes in network
/// namespaces).
pub type NodeDialer = Arc<
    dyn Fn(SocketAddr) -> Pin<Box<dyn Future<Output = std::io::Result<TcpStream>> + Send>>
        + Send
        + Sync,
>;

/// The user of this server's kubelet client certificate.
pub const KUBELET_CLIENT_USER: &str = "kube-apiserver-kubelet-client";

/// How this server reaches kubelets.
pub struct KubeletClient {
    cert_chain: Vec<CertificateDer<'static>>,
    key_der: Vec<u8>,
    /// `--kubelet-certificate-authority` (PEM); `None`: not verified.
    pub ca: Mutex<Option<String>>,
    /// Dials nodes (default: plain TCP).
    pub dialer: Mutex<Option<NodeDialer>>,
}

impl std::fmt::Debug for KubeletClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeletClient").finish_non_exhaustive()
    }
}

impl KubeletClient {
    /// From a client certificate and key (PEM).
    pub fn new(cert_pem: &str, key_pem: &str) -> Result<KubeletClient, String> {
        let cert_chain = rustls_pemfile::certs(&mut cert_pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| e.to_string())?;
        let key = rustls_pemfile::private_key(&mut key_pem.as_bytes())
            .map_err(|e| e.to_string())?
            .ok_or("no key")?;
        Ok(KubeletClient {
            cert_chain,
            key_der: key.secret_der().to_vec(),
            ca: Mutex::new(None),
            dialer: Mutex::new(None),
        })
    }

    fn tls_config(&self) -> Result<Arc<rustls::ClientConfig>, String> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?;
        let ca = self.ca.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let builder = match ca {
            Some(pem) => {
                let mut roots = rustls::RootCertStore::empty();
                for c in rustls_pemfile::certs(&mut pem.as_bytes()) {
                    roots
                        .add(c.map_err(|e| e.to_string())?)
                        .map_err(|e| e.to_string())?;
                }
                builder.with_root_certificates(roots)
            }
            None => builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(crate::node_api::AnyServer(provider))),
        };
        let key = PrivateKeyDer::try_from(self.key_der.clone()).map_err(|e| e.to_string())?;
        let mut cfg = builder
            .with_client_auth_cert(self.cert_chain.clone(), key)
            .map_err(|e| e.to_string())?;
        cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Arc::new(cfg))
    }

    async fn connect(
        &self,
        addr: SocketAddr,
    ) -> Result<tokio_rustls::client::TlsStream<TcpStream>, String> {
        let dialer = self
            .dialer
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let tcp = match dialer {
            Some(d) => d(addr).await,
            None => TcpStream::connect(addr).await,
        }
        .map_err(|e| format!("error dialing backend: dial tcp {addr}: {e}"))?;
        let _ = tcp.set_nodelay(true);
        let cfg = self.tls_config()?;
        let name = ServerName::IpAddress(addr.ip().into());
        tokio_rustls::TlsConnector::from(cfg)
            .connect(name, tcp)
            .await
            .map_err(|e| format!("error dialing backend: tls: {e}"))
    }
}

/// A request this module serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// `pods/<sub>` of `ns/name`.
    Pod {
        /// Namespace.
        ns: String,
        /// Pod.
        name: String,
        /// `log`, `exec`, `attach`, `portforward`.
        sub: String,
    },
    /// `nodes/<name>/proxy/<rest>`.
    Node {
        /// Node.
        name: String,
        /// The path on the kubelet (starting with `/`).
        rest: String,
    },
}

/// Recognizes the paths.
pub fn route(path: &str) -> Option<Target> {
    let segs: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    match segs.as_slice() {
        ["api", "v1", "namespaces", ns, "pods", name, sub]
            if matches!(*sub, "log" | "exec" | "attach" | "portforward") =>
        {
            Some(Target::Pod {
                ns: ns.to_string(),
                name: name.to_string(),
                sub: sub.to_string(),
            })
        }
        ["api", "v1", "nodes", name, "proxy", rest @ ..] if !name.is_empty() => {
            Some(Target::Node {
                name: name.to_string(),
                rest: format!("/{}", rest.join("/")),
            })
        }
        _ => None,
    }
}

fn node_location(state: &ApiState, node: &str) -> Result<SocketAddr, ApiError> {
    let obj = state
        .store
        .get("nodes", "", node)
        .ok_or_else(|| ApiError::not_found("", "nodes", node))?
        .value()?;
    let addrs = obj
        .pointer("/status/addresses")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let ip = ["InternalIP", "ExternalIP"]
        .iter()
        .find_map(|t| {
            addrs.iter().find_map(|a| {
                (a.get("type").and_then(Value::as_str) == Some(t))
                    .then(|| a.get("address").and_then(Value::as_str))
                    .flatten()
                    .and_then(|s| s.parse::<IpAddr>().ok())
            })
        })
        .ok_or_else(|| {
            ApiError::bad_request(format!(
                "node {node:?} has no InternalIP or ExternalIP address"
            ))
        })?;
    let port = obj
        .pointer("/status/daemonEndpoints/kubeletEndpoint/Port")
        .and_then(Value::as_u64)
        .filter(|p| *p > 0)
        .unwrap_or(10250);
    Ok(SocketAddr::new(ip, u16::try_from(port).unwrap_or(10250)))
}

fn query_pairs(q: Option<&str>) -> Vec<(String, String)> {
    url_decode_pairs(q.unwrap_or_default())
}

fn url_decode_pairs(q: &str) -> Vec<(String, String)> {
    q.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (decode(k), decode(v))
        })
        .collect()
}

fn decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            let h = (b[i + 1] as char).to_digit(16);
            let l = (b[i + 2] as char).to_digit(16);
            if let (Some(h), Some(l)) = (h, l) {
                out.push(u8::try_from(h * 16 + l).unwrap_or(b'?'));
                i += 3;
                continue;
            }
        }
        out.push(if b[i] == b'+' { b' ' } else { b[i] });
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn is_true(v: &str) -> bool {
    matches!(v, "1" | "t" | "T" | "true" | "TRUE" | "True")
}

/// The pod's container for a request: given, else the only one.
fn container_of(pod: &Value, name: &str, given: Option<&str>) -> Result<String, ApiError> {
    let names = |key: &str| -> Vec<String> {
        pod.pointer(&format!("/spec/{key}"))
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(|c| c.get("name").and_then(Value::as_str).map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    };
    let containers = names("containers");
    let all: Vec<String> = containers
        .iter()
        .chain(names("initContainers").iter())
        .chain(names("ephemeralContainers").iter())
        .cloned()
        .collect();
    match given.filter(|g| !g.is_empty()) {
        Some(c) if all.iter().any(|x| x == c) => Ok(c.to_string()),
        Some(c) => Err(ApiError::bad_request(format!(
            "container {c} is not valid for pod {name}"
        ))),
        None if containers.len() == 1 => Ok(containers[0].clone()),
        None => Err(ApiError::bad_request(format!(
            "a container name must be specified for pod {name}, choose one of: [{}]",
            containers.join(" ")
        ))),
    }
}

/// The kubelet URL path and query of a pod subresource request.
fn pod_location(
    state: &ApiState,
    ns: &str,
    name: &str,
    sub: &str,
    query: Option<&str>,
) -> Result<(SocketAddr, String), ApiError> {
    let pod = state
        .store
        .get("pods", ns, name)
        .ok_or_else(|| ApiError::not_found("", "pods", name))?
        .value()?;
    let node = pod
        .pointer("/spec/nodeName")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let pairs = query_pairs(query);
    let get = |k: &str| pairs.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
    let mut out: Vec<(String, String)> = Vec::new();
    let path = match sub {
        "log" => {
            let c = container_of(&pod, name, get("container"))?;
            for k in [
                "follow",
                "previous",
                "timestamps",
                "insecureSkipTLSVerifyBackend",
            ] {
                if get(k).is_some_and(is_true) {
                    out.push((k.into(), "true".into()));
                }
            }
            for k in [
                "sinceSeconds",
                "sinceTime",
                "tailLines",
                "limitBytes",
                "stream",
            ] {
                if let Some(v) = get(k) {
                    out.push((k.into(), v.into()));
                }
            }
            format!("/containerLogs/{ns}/{name}/{c}")
        }
        "exec" | "attach" => {
            let c = container_of(&pod, name, get("container"))?;
            // kubectl's PodExecOptions names, the kubelet's stream
            // parameters (`input`, `output`, `error`, `tty`).
            for (k, param) in [
                ("stdin", "input"),
                ("stdout", "output"),
                ("stderr", "error"),
                ("tty", "tty"),
            ] {
                if get(k).is_some_and(is_true) {
                    out.push((param.into(), "1".into()));
                }
            }
            if sub == "exec" {
                let cmds: Vec<&(String, String)> =
                    pairs.iter().filter(|(k, _)| k == "command").collect();
                if cmds.is_empty() {
                    return Err(ApiError::bad_request(
                        "you must specify at least one command for the container",
                    ));
                }
                for (_, v) in cmds {
                    out.push(("command".into(), v.clone()));
                }
            }
            format!("/{sub}/{ns}/{name}/{c}")
        }
        _ => {
            for (k, v) in pairs.iter().filter(|(k, _)| k == "ports" || k == "port") {
                out.push((k.clone(), v.clone()));
            }
            format!("/portForward/{ns}/{name}")
        }
    };
    if node.is_empty() {
        return Err(ApiError::bad_request(format!(
            "pod {name} does not have a host assigned"
        )));
    }
    let addr = node_location(state, &node)?;
    let q: Vec<String> = out
        .iter()
        .map(|(k, v)| format!("{}={}", encode(k), encode(v)))
        .collect();
    let pq = if q.is_empty() {
        path
    } else {
        format!("{path}?{}", q.join("&"))
    };
    Ok((addr, pq))
}

/// The node-declared feature that makes kube-apiserver proxy WebSocket
/// streaming to the node unchanged.
pub const EXTEND_WEBSOCKETS_TO_KUBELET: &str = "ExtendWebSocketsToKubelet";

/// Whether the node of pod `ns/name` declares `feature`
/// (`status.declaredFeatures`).
fn node_declares(state: &ApiState, ns: &str, name: &str, feature: &str) -> bool {
    let node = state
        .store
        .get("pods", ns, name)
        .and_then(|p| p.value().ok())
        .and_then(|p| {
            p.pointer("/spec/nodeName")
                .and_then(Value::as_str)
                .map(str::to_string)
        });
    let Some(node) = node.filter(|n| !n.is_empty()) else {
        return false;
    };
    state
        .store
        .get("nodes", "", &node)
        .and_then(|n| n.value().ok())
        .and_then(|n| n.pointer("/status/declaredFeatures").cloned())
        .and_then(|f| f.as_array().cloned())
        .is_some_and(|f| f.iter().any(|x| x.as_str() == Some(feature)))
}

fn is_websocket(req: &Request<Incoming>) -> bool {
    req.headers()
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("websocket"))
}

fn full(b: impl Into<Bytes>) -> Body {
    http_body_util::Full::new(b.into()).boxed_unsync()
}

/// Proxies one request (already authenticated as `user`).
pub async fn serve(
    state: &Arc<ApiState>,
    target: Target,
    mut req: Request<Incoming>,
) -> Result<Response<Body>, ApiError> {
    let query = req.uri().query().map(str::to_string);
    let (addr, path_query, status_errors) = match &target {
        Target::Pod { ns, name, sub } => {
            if sub != "log"
                && is_websocket(&req)
                && !node_declares(state, ns, name, EXTEND_WEBSOCKETS_TO_KUBELET)
            {
                return Err(ApiError::bad_request(
                    "WebSocket streaming is not translated by the test API server; use SPDY (kubectl falls back to it)",
                ));
            }
            let (a, pq) = pod_location(state, ns, name, sub, query.as_deref())?;
            (a, pq, sub == "log")
        }
        Target::Node { name, rest } => {
            let a = node_location(state, name)?;
            let pq = match &query {
                Some(q) => format!("{rest}?{q}"),
                None => rest.clone(),
            };
            (a, pq, false)
        }
    };
    let tls = state
        .kubelet
        .connect(addr)
        .await
        .map_err(|e| ApiError::new(503, "ServiceUnavailable", e))?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .map_err(|e| ApiError::internal(format!("error dialing backend: {e}")))?;
    tokio::spawn(async move {
        let _ = conn.with_upgrades().await;
    });
    let upgrade = req.headers().contains_key(header::UPGRADE);
    let client_upgrade = upgrade.then(|| hyper::upgrade::on(&mut req));
    let method = req.method().clone();
    let mut out = Request::builder()
        .method(method)
        .uri(path_query)
        .header(header::HOST, addr.to_string());
    for (k, v) in req.headers() {
        if k == header::HOST || k == header::AUTHORIZATION || k == header::CONTENT_LENGTH {
            continue;
        }
        out = out.header(k, v);
    }
    let body_bytes = if upgrade {
        Bytes::new()
    } else {
        req.into_body()
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default()
    };
    let out = out
        .body(http_body_util::Full::new(body_bytes))
        .map_err(|e| ApiError::internal(e.to_string()))?;
    let mut resp = sender
        .send_request(out)
        .await
        .map_err(|e| ApiError::internal(format!("error proxying to the node: {e}")))?;
    if resp.status() == StatusCode::SWITCHING_PROTOCOLS {
        let Some(client_upgrade) = client_upgrade else {
            return Err(ApiError::internal(
                "the node upgraded a request that asked for none",
            ));
        };
        let backend = hyper::upgrade::on(&mut resp);
        let mut answer = Response::new(full(Bytes::new()));
        *answer.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
        *answer.headers_mut() = resp.headers().clone();
        tokio::spawn(async move {
            if let (Ok(c), Ok(b)) = tokio::join!(client_upgrade, backend) {
                let mut c = TokioIo::new(c);
                let mut b = TokioIo::new(b);
                let _ = tokio::io::copy_bidirectional(&mut c, &mut b).await;
            }
        });
        return Ok(answer);
    }
    if status_errors && !resp.status().is_success() {
        // kube-apiserver's response checker: the node's body becomes the
        // Status message.
        let code = resp.status().as_u16();
        let text = resp
            .into_body()
            .collect()
            .await
            .map(|b| String::from_utf8_lossy(&b.to_bytes()).trim().to_string())
            .unwrap_or_default();
        let reason = match code {
            400 => "BadRequest",
            401 => "Unauthorized",
            403 => "Forbidden",
            404 => "NotFound",
            _ => "InternalError",
        };
        return Err(ApiError::new(code, reason, text));
    }
    let (parts, body) = resp.into_parts();
    let stream = body
        .into_data_stream()
        .take_while(|r| std::future::ready(r.is_ok()))
        .filter_map(|r| {
            std::future::ready(
                r.ok()
                    .map(|b| Ok::<_, std::convert::Infallible>(Frame::data(b))),
            )
        });
    Ok(Response::from_parts(
        parts,
        BodyExt::boxed_unsync(StreamBody::new(stream)),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes() {
        assert_eq!(
            route("/api/v1/namespaces/ns/pods/p/log"),
            Some(Target::Pod {
                ns: "ns".into(),
                name: "p".into(),
                sub: "log".into()
            })
        );
        assert_eq!(
            route("/api/v1/nodes/n1/proxy/stats/summary"),
            Some(Target::Node {
                name: "n1".into(),
                rest: "/stats/summary".into()
            })
        );
        assert_eq!(
            route("/api/v1/nodes/n1/proxy"),
            Some(Target::Node {
                name: "n1".into(),
                rest: "/".into()
            })
        );
        assert_eq!(route("/api/v1/namespaces/ns/pods/p/status"), None);
        assert_eq!(encode("a b/c"), "a%20b%2Fc");
        assert_eq!(decode("a%20b+c"), "a b c");
    }
}
