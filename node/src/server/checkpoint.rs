//! `POST /checkpoint/{namespace}/{pod}[/{uid}]/{container}`: a checkpoint
//! of a running container through CRI `CheckpointContainer`, as kubelet
//! v1.36 answers it (`pkg/kubelet/server/server.go` `checkpoint`,
//! `pkg/kubelet/kubelet.go` `CheckpointContainer`): the pod must exist
//! (`pod does not exist`), name the container (`container c does not
//! exist`), and the container must run (`container c not found`); the
//! checkpoint goes to `<rootDir>/checkpoints/checkpoint-<pod>_<ns>-<container>-<RFC 3339 time>.tar`
//! and the answer is `{"items":["<that path>"]}`. A runtime without
//! checkpointing (containerd before 2.0) fails the call: 500 with its error.

use http::{Response, StatusCode};

use super::NodeApi;
use super::body::{self, Body};
use crate::pod::podutil;

/// Serves one checkpoint request.
pub async fn serve(
    api: &NodeApi,
    ns: &str,
    pod_name: &str,
    uid: Option<&str>,
    container: &str,
    query: Option<&str>,
) -> Response<Body> {
    let Some(pod) = api.pods.get().and_then(|p| p.pod_by_name(ns, pod_name)) else {
        return body::text(StatusCode::NOT_FOUND, "pod does not exist");
    };
    let spec = podutil::spec(&pod);
    let named = spec.containers.iter().any(|c| c.name == container)
        || spec
            .init_containers
            .iter()
            .flatten()
            .any(|c| c.name == container)
        || spec
            .ephemeral_containers
            .iter()
            .flatten()
            .any(|c| c.name == container);
    if !named {
        return body::text(
            StatusCode::NOT_FOUND,
            format!("container {container} does not exist"),
        );
    }
    // The last `timeout` given counts.
    let timeout = match query
        .map(super::basic::url_pairs)
        .unwrap_or_default()
        .into_iter()
        .rfind(|(k, _)| k == "timeout")
    {
        None => 0,
        Some((_, v)) => match v.parse::<i64>() {
            Ok(t) => t,
            Err(_) => {
                return body::text(
                    StatusCode::NOT_FOUND,
                    "cannot parse value of timeout parameter",
                );
            }
        },
    };
    let failed = |why: String| {
        body::text(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("checkpointing of {ns}/{pod_name}/{container} failed ({why})"),
        )
    };
    let uid = uid.unwrap_or(podutil::uid(&pod));
    let id = match super::streaming::find_container(api, ns, pod_name, Some(uid), container).await {
        Ok(Some(id)) => id,
        Ok(None) => return failed(format!("container {container} not found")),
        Err(e) => return failed(e.grpc_text()),
    };
    let dir = api.ctx.config.root_dir.join("checkpoints");
    let location = dir.join(format!(
        "checkpoint-{pod_name}_{ns}-{container}-{}.tar",
        jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ")
    ));
    if let Err(e) = std::fs::create_dir_all(&dir) {
        return failed(format!("creating {}: {e}", dir.display()));
    }
    let location = location.display().to_string();
    match api.cri.checkpoint_container(&id, &location, timeout).await {
        Ok(()) => body::json(&serde_json::json!({ "items": [location] })),
        Err(e) => failed(e.grpc_text()),
    }
}
