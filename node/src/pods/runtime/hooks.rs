//! Container lifecycle hooks (kubelet's `HandlerRunner`): `exec` through
//! CRI ExecSync, `httpGet` to the pod IP (any HTTP answer counts as done,
//! as upstream), `sleep`. Failure messages are kubelet's.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, LifecycleHandler, Pod};
use keelson_cri::RuntimeClient;
use keelson_probes::{HttpGetSpec, HttpProber, HttpRequest, ProbeResult, resolve_container_port};

use super::errors::grpc_text;
use crate::pod::podutil;

/// Why a lifecycle hook failed, in kubelet's words (`HandlerRunner.Run`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HookError {
    /// The exec hook could not run or exited non-zero.
    #[error(
        "Exec lifecycle hook ({}) for Container {container:?} in Pod {pod:?} failed - error: {error}, message: {output:?}",
        go_slice(command)
    )]
    Exec {
        /// The hook's command.
        command: Vec<String>,
        /// The container.
        container: String,
        /// The pod as kubelet formats it.
        pod: String,
        /// What went wrong.
        error: String,
        /// stdout and stderr of the command.
        output: String,
    },
    /// The HTTP hook got no answer.
    #[error(
        "HTTP lifecycle hook ({path}) for Container {container:?} in Pod {pod:?} failed - error: {error}"
    )]
    Http {
        /// `httpGet.path`.
        path: String,
        /// The container.
        container: String,
        /// The pod as kubelet formats it.
        pod: String,
        /// What went wrong.
        error: String,
    },
    /// A handler with no action keelson knows.
    #[error("cannot run handler: invalid handler: {0}")]
    InvalidHandler(String),
}

/// Runs lifecycle hooks.
#[derive(Clone)]
pub struct HookRunner {
    cri: RuntimeClient,
    http: Option<HttpProber>,
    user_agent: String,
}

impl std::fmt::Debug for HookRunner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HookRunner").finish_non_exhaustive()
    }
}

impl HookRunner {
    /// Hooks through `cri`; HTTP hooks send `User-Agent: kube-lifecycle/<version>`.
    pub fn new(cri: RuntimeClient, kube_version: &str) -> Self {
        let http = match HttpProber::new() {
            Ok(p) => Some(p),
            Err(e) => {
                tracing::error!(error = %e, "cannot build the HTTP client for lifecycle hooks; httpGet hooks will fail");
                None
            }
        };
        HookRunner {
            cri,
            http,
            user_agent: format!("kube-lifecycle/{kube_version}"),
        }
    }

    /// Runs `handler` for `container` (id `container_id`) of `pod`.
    pub async fn run(
        &self,
        pod: &Pod,
        container: &Container,
        container_id: &str,
        handler: &LifecycleHandler,
        pod_ip: &str,
    ) -> Result<(), HookError> {
        let pod_name = podutil::format_pod(pod);
        if let Some(exec) = &handler.exec {
            let cmd = exec.command.clone().unwrap_or_default();
            let fail = |error: String, output: String| HookError::Exec {
                command: cmd.clone(),
                container: container.name.clone(),
                pod: pod_name.clone(),
                error,
                output,
            };
            return match self
                .cri
                .exec_sync(container_id, cmd.clone(), Duration::ZERO)
                .await
            {
                Ok(r) if r.exit_code == 0 => Ok(()),
                Ok(r) => {
                    let output = String::from_utf8_lossy(&[r.stdout, r.stderr.clone()].concat())
                        .into_owned();
                    let err = format!(
                        "command '{}' exited with {}: {}",
                        cmd.join(" "),
                        r.exit_code,
                        String::from_utf8_lossy(&r.stderr)
                    );
                    Err(fail(err, output))
                }
                Err(e) => Err(fail(grpc_text(&e), String::new())),
            };
        }
        if let Some(get) = &handler.http_get {
            let spec = HttpGetSpec {
                scheme: {
                    let s = get.scheme.as_deref().unwrap_or("").to_ascii_lowercase();
                    if s.is_empty() { "http".into() } else { s }
                },
                host: get.host.clone().filter(|h| !h.is_empty()),
                port: resolve_container_port(&get.port, container),
                path: get.path.clone().unwrap_or_default(),
                headers: get
                    .http_headers
                    .iter()
                    .flatten()
                    .map(|h| (h.name.clone(), h.value.clone()))
                    .collect(),
            };
            let fail = |e: &dyn std::fmt::Display| HookError::Http {
                path: get.path.clone().unwrap_or_default(),
                container: container.name.clone(),
                pod: pod_name.clone(),
                error: e.to_string(),
            };
            let Some(prober) = &self.http else {
                return Err(fail(&"no HTTP client"));
            };
            let request =
                HttpRequest::new(&spec, pod_ip, &self.user_agent).map_err(|e| fail(&e))?;
            // Lifecycle hooks have no timeout of their own: the caller bounds
            // them (preStop by the grace period).
            return match prober.probe(&request, Duration::from_secs(3600)).await {
                ProbeResult::Success | ProbeResult::Warning(_) => Ok(()),
                // Any HTTP answer completes a hook; only transport errors fail it.
                ProbeResult::Failure(m) if m.starts_with("HTTP probe failed with statuscode") => {
                    Ok(())
                }
                ProbeResult::Failure(m) | ProbeResult::Unknown(m) => Err(fail(&m)),
            };
        }
        if let Some(sleep) = &handler.sleep {
            tokio::time::sleep(Duration::from_secs(
                u64::try_from(sleep.seconds).unwrap_or(0),
            ))
            .await;
            return Ok(());
        }
        if handler.tcp_socket.is_some() {
            // Deprecated and ignored by kubelet for hooks.
            return Ok(());
        }
        Err(HookError::InvalidHandler(
            serde_json::to_string(handler).unwrap_or_default(),
        ))
    }
}

/// Go's `%v` of a `[]string`: `[a b c]`.
fn go_slice(v: &[String]) -> String {
    format!("[{}]", v.join(" "))
}
