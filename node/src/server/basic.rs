//! `/healthz`, `/pods`, `/runningpods/` and `/configz`, as kubelet answers
//! them (`pkg/kubelet/server/server.go`).

use http::{Response, StatusCode};
use keelson_cri::api;
use serde_json::{Value, json};

use super::NodeApi;
use super::body::{self, Body};
use crate::pod::labels;
use keelson_common::observability::{CheckFailed, ProbeKind};

/// The node's health checks (`syncloop` and the rest the roles registered):
/// `/healthz`, `?verbose`, `?exclude=`, `/healthz/<check>`.
pub fn healthz(api: &NodeApi, path: &str, query: Option<&str>) -> Response<Body> {
    let health = &api.ctx.health;
    if let Some(name) = path.strip_prefix("/healthz/").filter(|n| !n.is_empty()) {
        return match health.single(ProbeKind::Liveness, name) {
            Some(Ok(())) => body::text(StatusCode::OK, "ok"),
            Some(Err(e)) => body::http_error(
                StatusCode::INTERNAL_SERVER_ERROR,
                &format!("internal server error: {e}"),
            ),
            None => body::not_found(),
        };
    }
    let pairs: Vec<(String, String)> = query.map(url_pairs).unwrap_or_default();
    let verbose = pairs.iter().any(|(k, _)| k == "verbose");
    let exclude: Vec<String> = pairs
        .iter()
        .filter(|(k, _)| k == "exclude")
        .flat_map(|(_, v)| v.split(',').map(str::to_string).collect::<Vec<_>>())
        .collect();
    let (ok, text) = health.render(ProbeKind::Liveness, verbose, &exclude);
    let ran: Vec<(String, Result<(), CheckFailed>)> = health
        .evaluate(ProbeKind::Liveness)
        .into_iter()
        .filter(|(name, _)| !exclude.contains(name))
        .collect();
    api.slis.observe(&ran);
    let code = if ok {
        StatusCode::OK
    } else {
        StatusCode::INTERNAL_SERVER_ERROR
    };
    body::text(code, text)
}

/// Percent-decoded query pairs.
pub fn url_pairs(query: &str) -> Vec<(String, String)> {
    query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (percent_decode(k), percent_decode(v))
        })
        .collect()
}

fn hex(c: u8) -> Option<u8> {
    (c as char).to_digit(16).and_then(|d| u8::try_from(d).ok())
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < b.len() => match (hex(b[i + 1]), hex(b[i + 2])) {
                (Some(h), Some(l)) => {
                    out.push(h * 16 + l);
                    i += 2;
                }
                _ => out.push(b'%'),
            },
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `/pods`: the pods this node should run, as a v1 PodList.
pub fn pods(api: &NodeApi) -> Response<Body> {
    let items: Vec<Value> = api
        .pods
        .get()
        .map(|p| p.pods())
        .unwrap_or_default()
        .iter()
        .filter_map(|p| serde_json::to_value(&**p).ok())
        .collect();
    body::json(&json!({
        "kind": "PodList",
        "apiVersion": "v1",
        "metadata": {},
        "items": items,
    }))
}

/// `/runningpods/`: the pods the runtime runs (ready sandboxes and their
/// running containers), as a v1 PodList of name, namespace, UID and
/// containers (name, image), as kubelet's `GetRunningPods` (no
/// `creationTimestamp`: v1.36's ObjectMeta leaves a zero one out).
pub async fn running_pods(api: &NodeApi) -> Response<Body> {
    let ready = api::PodSandboxFilter {
        state: Some(api::PodSandboxStateValue {
            state: api::PodSandboxState::SandboxReady as i32,
        }),
        ..Default::default()
    };
    let running = api::ContainerFilter {
        state: Some(api::ContainerStateValue {
            state: api::ContainerState::ContainerRunning as i32,
        }),
        ..Default::default()
    };
    let (sandboxes, containers) = match (
        api.cri.list_pod_sandbox(Some(ready)).await,
        api.cri.list_containers(Some(running)).await,
    ) {
        (Ok(s), Ok(c)) => (s, c),
        (Err(e), _) | (_, Err(e)) => {
            return body::text(StatusCode::INTERNAL_SERVER_ERROR, e.to_string());
        }
    };
    let mut items = Vec::new();
    for s in sandboxes {
        let Some(m) = &s.metadata else { continue };
        let cs: Vec<Value> = containers
            .iter()
            .filter(|c| c.pod_sandbox_id == s.id)
            .map(|c| {
                json!({
                    "name": c.labels.get(labels::CONTAINER_NAME).cloned()
                        .or_else(|| c.metadata.as_ref().map(|m| m.name.clone()))
                        .unwrap_or_default(),
                    "image": c.image.as_ref().map(|i| i.image.clone()).unwrap_or_default(),
                    "resources": {},
                })
            })
            .collect();
        items.push(json!({
            "metadata": {"name": m.name, "namespace": m.namespace, "uid": m.uid},
            "spec": {"containers": cs},
            "status": {},
        }));
    }
    body::json(&json!({
        "kind": "PodList",
        "apiVersion": "v1",
        "metadata": {},
        "items": items,
    }))
}

/// Settings of `node:` that are kubelet flags, not KubeletConfiguration
/// fields (`staging/src/k8s.io/kubelet/config/v1beta1/types.go`): left out
/// of `/configz`, whose `kubeletconfig` is a v1beta1 KubeletConfiguration
/// a strict decoder (`kubelet --config`) takes as it is.
const NOT_KUBELET_CONFIGURATION: &[&str] = &[
    "enabled",
    "kubeconfig",
    "bootstrapKubeconfig",
    "rootDir",
    "nodeIP",
    "nodeLabels",
    "cloudProvider",
    "housekeepingInterval",
];

/// `/configz`: `{"kubeletconfig": {...}}`, the node role's effective
/// settings (KubeletConfiguration field names; nothing secret is in them).
pub fn configz(api: &NodeApi) -> Response<Body> {
    let mut cfg = serde_json::to_value(&*api.ctx.config).unwrap_or(Value::Null);
    if let Value::Object(m) = &mut cfg {
        for k in NOT_KUBELET_CONFIGURATION {
            m.remove(*k);
        }
        m.insert("kind".into(), json!("KubeletConfiguration"));
        m.insert("apiVersion".into(), json!("kubelet.config.k8s.io/v1beta1"));
    }
    // component-base's configz handler: JSON and `nosniff`
    // (`staging/src/k8s.io/component-base/configz/configz.go`).
    let mut r = body::json(&json!({ "kubeletconfig": cfg }));
    r.headers_mut().insert(
        http::header::HeaderName::from_static("x-content-type-options"),
        http::header::HeaderValue::from_static("nosniff"),
    );
    r
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn decodes_queries() {
        assert_eq!(
            url_pairs("a=1&b=x%20y&c&d=%2"),
            vec![
                ("a".into(), "1".into()),
                ("b".into(), "x y".into()),
                ("c".into(), "".into()),
                ("d".into(), "%2".into())
            ]
        );
    }
}
