//! `GET /containerLogs/{namespace}/{pod}/{container}`: kubelet's
//! `getContainerLogs` (`pkg/kubelet/server/server.go`) and
//! `GetKubeletContainerLogs`/`validateContainerLogStatus`
//! (`pkg/kubelet/kubelet_pods.go`): which container instance (the running
//! one, the last terminated one, or with `previous` the one before), its
//! log path from CRI, then the bytes streamed.

use std::time::SystemTime;

use futures::future::BoxFuture;
use http::{Response, StatusCode};
use k8s_openapi::api::core::v1::{ContainerStatus, Pod, PodStatus};
use keelson_cri::{CriError, RuntimeClient, api};

use super::NodeApi;
use super::body::{self, Body};
use crate::logs::{self, ContainerRunning, LogError, LogOptions, LogRequest, OptionsError};

fn message(text: &str, detail: &str) -> String {
    let m = if detail.is_empty() {
        text.to_string()
    } else {
        format!("{}: {detail}", text.trim_end_matches('.'))
    };
    format!(
        "{{\"message\": {}}}",
        serde_json::to_string(&m).unwrap_or_default()
    )
}

/// Whether `name` is a container, init container or ephemeral container
/// of the pod (`GetContainerSpec`).
fn has_container(pod: &Pod, name: &str) -> bool {
    let Some(s) = &pod.spec else { return false };
    s.containers.iter().any(|c| c.name == name)
        || s.init_containers.iter().flatten().any(|c| c.name == name)
        || s.ephemeral_containers
            .iter()
            .flatten()
            .any(|c| c.name == name)
}

/// Why a container has no log to show (kubelet's
/// `validateContainerLogStatus` texts, the body of the 400 answer).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NoLogs {
    /// The pod has no status for the container.
    #[error("container {container:?} in pod {pod:?} is not available")]
    NotAvailable {
        /// Container.
        container: String,
        /// Pod name.
        pod: String,
    },
    /// `previous=true` and no earlier instance ended.
    #[error("previous terminated container {container:?} in pod {pod:?} not found")]
    NoPrevious {
        /// Container.
        container: String,
        /// Pod name.
        pod: String,
    },
    /// The container has not started yet.
    #[error("container {container:?} in pod {pod:?} is waiting to start - no logs yet")]
    NotStarted {
        /// Container.
        container: String,
        /// Pod name.
        pod: String,
    },
    /// The container ended and its id is gone.
    #[error("container {container:?} in pod {pod:?} is terminated")]
    Terminated {
        /// Container.
        container: String,
        /// Pod name.
        pod: String,
    },
    /// The container waits for its image.
    #[error(
        "container {container:?} in pod {pod:?} is waiting to start: {}",
        waiting_text(reason)
    )]
    Waiting {
        /// Container.
        container: String,
        /// Pod name.
        pod: String,
        /// `state.waiting.reason`.
        reason: String,
    },
}

/// kubelet's words for a waiting reason.
fn waiting_text(reason: &str) -> &str {
    match reason {
        "ErrImagePull" => "image can't be pulled",
        "ImagePullBackOff" => "trying and failing to pull image",
        other => other,
    }
}

/// kubelet's `validateContainerLogStatus`: the container ID whose log is
/// wanted, or why there is none.
pub fn container_for_logs(
    pod_name: &str,
    status: &PodStatus,
    container: &str,
    previous: bool,
) -> Result<String, NoLogs> {
    let names = || (container.to_string(), pod_name.to_string());
    let find = |list: &Option<Vec<ContainerStatus>>| {
        list.iter().flatten().find(|s| s.name == container).cloned()
    };
    let cs = find(&status.container_statuses)
        .or_else(|| find(&status.init_container_statuses))
        .or_else(|| find(&status.ephemeral_container_statuses))
        .ok_or_else(|| {
            let (container, pod) = names();
            NoLogs::NotAvailable { container, pod }
        })?;
    let last = cs.last_state.as_ref().and_then(|s| s.terminated.as_ref());
    let last_id = last
        .and_then(|t| t.container_id.clone())
        .filter(|i| !i.is_empty());
    let state = cs.state.clone().unwrap_or_default();
    if previous {
        return last_id.ok_or_else(|| {
            let (container, pod) = names();
            NoLogs::NoPrevious { container, pod }
        });
    }
    if state.running.is_some() {
        return cs
            .container_id
            .clone()
            .filter(|i| !i.is_empty())
            .ok_or_else(|| {
                let (container, pod) = names();
                NoLogs::NotStarted { container, pod }
            });
    }
    if let Some(t) = &state.terminated {
        return match t.container_id.clone().filter(|i| !i.is_empty()) {
            Some(id) => Ok(id),
            None => last_id.ok_or_else(|| {
                let (container, pod) = names();
                NoLogs::Terminated { container, pod }
            }),
        };
    }
    if last.is_some() {
        return last_id.ok_or_else(|| {
            let (container, pod) = names();
            NoLogs::Terminated { container, pod }
        });
    }
    if let Some(w) = &state.waiting {
        let (container, pod) = names();
        return Err(NoLogs::Waiting {
            container,
            pod,
            reason: w.reason.clone().unwrap_or_default(),
        });
    }
    let (container, pod) = names();
    Err(NoLogs::NotStarted { container, pod })
}

/// Follow's liveness check over CRI.
struct CriRunning(RuntimeClient);

impl ContainerRunning for CriRunning {
    fn is_running<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<bool, CriError>> {
        Box::pin(async move {
            match self.0.container_status(id, false).await {
                Ok(r) => Ok(r
                    .status
                    .is_some_and(|s| s.state == api::ContainerState::ContainerRunning as i32)),
                // A runtime that is down keeps its containers running.
                Err(CriError::Unavailable { .. }) => Ok(true),
                Err(e) => Err(e),
            }
        })
    }
}

fn now_ns() -> i128 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i128)
        .unwrap_or(0)
}

/// Serves the request.
pub async fn serve(
    api: &NodeApi,
    ns: &str,
    pod_name: &str,
    container: &str,
    query: Option<&str>,
) -> Response<Body> {
    let pairs = query.map(super::basic::url_pairs).unwrap_or_default();
    let opts = match LogOptions::from_query(&pairs) {
        Ok(o) => o,
        Err(OptionsError::Decode(d)) => {
            return body::text(
                StatusCode::BAD_REQUEST,
                message("Unable to decode query.", &d),
            );
        }
        Err(OptionsError::Invalid(d)) => {
            return body::text(
                StatusCode::UNPROCESSABLE_ENTITY,
                message("Invalid request.", &d),
            );
        }
    };
    // PodLogsQuerySplitStreams is alpha and off in v1.36.
    if let Some(s) = opts.stream.as_deref().filter(|s| *s != "All") {
        return body::text(
            StatusCode::BAD_REQUEST,
            format!(
                "unable to return the given log stream: {s:?}. Please enable PodLogsQuerySplitStreams feature gate in kubelet"
            ),
        );
    }
    let Some(pods) = api.pods.get() else {
        return body::text(
            StatusCode::NOT_FOUND,
            format!("pod {pod_name:?} does not exist"),
        );
    };
    let Some(pod) = pods.pod_by_name(ns, pod_name) else {
        return body::text(
            StatusCode::NOT_FOUND,
            format!("pod {pod_name:?} does not exist"),
        );
    };
    if !has_container(&pod, container) {
        return body::text(
            StatusCode::NOT_FOUND,
            format!("container {container:?} not found in pod {pod_name:?}"),
        );
    }
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let status = pods
        .pod_status(&uid)
        .or_else(|| pod.status.clone())
        .unwrap_or_default();
    let full_id = match container_for_logs(pod_name, &status, container, opts.previous) {
        Ok(id) => id,
        Err(e) => return body::text(StatusCode::BAD_REQUEST, e.to_string()),
    };
    let id = full_id
        .split_once("://")
        .map(|(_, id)| id.to_string())
        .unwrap_or_else(|| full_id.clone());
    let log_path = match api.cri.container_status(&id, false).await {
        Ok(r) => r.status.map(|s| s.log_path).unwrap_or_default(),
        Err(e) => {
            tracing::debug!(container = %full_id, error = %e, "failed to get container status");
            return body::text(
                StatusCode::BAD_REQUEST,
                format!("unable to retrieve container logs for {full_id}"),
            );
        }
    };
    let req = LogRequest {
        path: log_path.into(),
        container_id: id,
        opts,
        now_ns: now_ns(),
        live_only: false,
    };
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let (cri, watcher) = (api.cri.clone(), api.log_watcher.clone());
    tokio::spawn(async move {
        let running = CriRunning(cri);
        match logs::read_logs(&req, &running, &watcher, &tx).await {
            Ok(()) | Err(LogError::Closed) => {}
            Err(e) => {
                // kubelet writes the error after the (already sent) 200.
                tracing::debug!(error = %e, "reading container logs");
                let _ = tx.send(Ok(bytes::Bytes::from(e.to_string()))).await;
            }
        }
    });
    let mut r = Response::new(body::channel(rx));
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::panic)]
mod tests {
    use super::*;

    fn status(json: serde_json::Value) -> PodStatus {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn picks_the_instance_as_kubelet() {
        let s = status(serde_json::json!({"containerStatuses": [{
            "name": "c", "image": "i", "imageID": "", "ready": true, "restartCount": 1,
            "containerID": "containerd://new",
            "state": {"running": {}},
            "lastState": {"terminated": {"exitCode": 1, "containerID": "containerd://old"}}
        }]}));
        assert_eq!(
            container_for_logs("p", &s, "c", false).unwrap(),
            "containerd://new"
        );
        assert_eq!(
            container_for_logs("p", &s, "c", true).unwrap(),
            "containerd://old"
        );
        assert_eq!(
            container_for_logs("p", &s, "x", false)
                .unwrap_err()
                .to_string(),
            "container \"x\" in pod \"p\" is not available"
        );
        let fresh = status(serde_json::json!({"containerStatuses": [{
            "name": "c", "image": "i", "imageID": "", "ready": false, "restartCount": 0,
            "state": {"waiting": {"reason": "ContainerCreating"}}
        }]}));
        assert_eq!(
            container_for_logs("p", &fresh, "c", true)
                .unwrap_err()
                .to_string(),
            "previous terminated container \"c\" in pod \"p\" not found"
        );
        assert_eq!(
            container_for_logs("p", &fresh, "c", false)
                .unwrap_err()
                .to_string(),
            "container \"c\" in pod \"p\" is waiting to start: ContainerCreating"
        );
    }

    #[test]
    fn messages_keep_kubelets_shape() {
        assert_eq!(
            message("Unable to decode query.", "tailLines: bad"),
            "{\"message\": \"Unable to decode query: tailLines: bad\"}"
        );
    }
}
