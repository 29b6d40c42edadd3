//! kubelet's `execPlugin` (`pkg/credentialprovider/plugin/plugin.go`):
//! runs `<bin dir>/<name> <args...>` with the agent's environment plus the
//! provider's `env` (the provider's win), writes the
//! `CredentialProviderRequest` on its stdin and reads the
//! `CredentialProviderResponse` from its stdout, within one minute (the
//! plugin is killed then). The response's `apiVersion` must be the one
//! the provider is configured with; it is decoded strictly, and a
//! decoding error does not quote the response (it may hold credentials).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::io::AsyncWriteExt;

use super::config::{ExecEnvVar, SignedDuration};
use super::metrics::CredentialProviderMetrics;

/// kubelet's catch-all plugin timeout.
pub const PLUGIN_TIMEOUT: Duration = Duration::from_secs(60);

/// `CredentialProviderRequest`.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
struct Request<'a> {
    kind: &'static str,
    api_version: &'a str,
    image: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    service_account_token: &'a str,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    service_account_annotations: &'a BTreeMap<String, String>,
}

/// `CredentialProviderResponse`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Response {
    #[serde(default)]
    kind: String,
    #[serde(default)]
    api_version: String,
    /// `Image`, `Registry` or `Global`.
    #[serde(default)]
    pub cache_key_type: String,
    /// How long to cache (`None`: the provider's default).
    #[serde(default)]
    pub cache_duration: Option<SignedDuration>,
    /// Match pattern → credentials.
    #[serde(default)]
    pub auth: Option<BTreeMap<String, ResponseAuth>>,
}

/// `AuthConfig` of a response.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResponseAuth {
    /// User name.
    #[serde(default)]
    pub username: String,
    /// Password.
    #[serde(default)]
    pub password: String,
}

/// How a plugin run failed; the texts are kubelet's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExecError {
    /// The plugin could not run, failed or timed out; stderr follows.
    #[error(
        "error execing credential provider plugin {name} for image {image}: {reason}: {stderr}"
    )]
    Run {
        /// Plugin.
        name: String,
        /// Image.
        image: String,
        /// `exit status 1`, `context deadline exceeded`, ...
        reason: String,
        /// What the plugin wrote on stderr.
        stderr: String,
    },
    /// The request could not be encoded.
    #[error("failed to encode auth request: {0}")]
    Encode(String),
    /// stdout is not a JSON object.
    #[error("error reading GVK from response: {0}")]
    Gvk(String),
    /// The response speaks another version.
    #[error(
        "apiVersion from credential plugin response did not match expected apiVersion:{expected}, actual apiVersion:{actual}"
    )]
    ApiVersion {
        /// Configured.
        expected: String,
        /// Answered.
        actual: String,
    },
    /// The response does not decode.
    #[error("error decoding credential provider plugin response from stdout")]
    Decode,
}

/// One provider's executable and how to call it.
#[derive(Debug, Clone)]
pub struct ExecPlugin {
    /// The provider's name.
    pub name: String,
    /// `apiVersion` of requests and responses.
    pub api_version: String,
    /// The executable.
    pub path: PathBuf,
    /// Arguments.
    pub args: Vec<String>,
    /// Environment added to the agent's.
    pub env: Vec<ExecEnvVar>,
    /// Run time limit.
    pub timeout: Duration,
}

impl ExecPlugin {
    /// `ExecPlugin`: one request, one response.
    pub async fn exec(
        &self,
        image: &str,
        token: &str,
        annotations: &BTreeMap<String, String>,
        metrics: &CredentialProviderMetrics,
    ) -> Result<Response, ExecError> {
        tracing::debug!(plugin = %self.name, image, "getting image credentials from external exec plugin");
        let request = Request {
            kind: "CredentialProviderRequest",
            api_version: &self.api_version,
            image,
            service_account_token: token,
            service_account_annotations: annotations,
        };
        let mut data =
            serde_json::to_vec(&request).map_err(|e| ExecError::Encode(e.to_string()))?;
        data.push(b'\n');
        let start = tokio::time::Instant::now();
        let outcome = self.run(&data).await;
        metrics.observe(&self.name, start.elapsed(), outcome.is_err());
        let stdout = outcome.map_err(|(reason, stderr)| ExecError::Run {
            name: self.name.clone(),
            image: image.to_string(),
            reason,
            stderr,
        })?;
        self.decode(&stdout)
    }

    /// Runs the executable; stdout, or the reason and stderr.
    async fn run(&self, stdin: &[u8]) -> Result<Vec<u8>, (String, String)> {
        let mut cmd = tokio::process::Command::new(&self.path);
        cmd.args(&self.args)
            .envs(self.env.iter().map(|e| (&e.name, &e.value)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = cmd.spawn().map_err(|e| {
            (
                format!(
                    "fork/exec {}: {}",
                    self.path.display(),
                    keelson_common::gofmt::os_error_text(&e)
                ),
                String::new(),
            )
        })?;
        if let Some(mut input) = child.stdin.take() {
            // A plugin that does not read its input is not an error here.
            let _ = input.write_all(stdin).await;
        }
        match tokio::time::timeout(self.timeout, child.wait_with_output()).await {
            Err(_) => Err(("context deadline exceeded".into(), String::new())),
            Ok(Err(e)) => Err((e.to_string(), String::new())),
            Ok(Ok(out)) => {
                let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
                if out.status.success() {
                    Ok(out.stdout)
                } else {
                    Err((exit_text(out.status), stderr))
                }
            }
        }
    }

    fn decode(&self, stdout: &[u8]) -> Result<Response, ExecError> {
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct TypeMeta {
            #[serde(default)]
            api_version: String,
        }
        let meta: TypeMeta =
            serde_json::from_slice(stdout).map_err(|e| ExecError::Gvk(e.to_string()))?;
        if meta.api_version != self.api_version {
            return Err(ExecError::ApiVersion {
                expected: self.api_version.clone(),
                actual: meta.api_version,
            });
        }
        let r: Response = serde_json::from_slice(stdout).map_err(|_| ExecError::Decode)?;
        if r.kind != "CredentialProviderResponse" || r.api_version != self.api_version {
            return Err(ExecError::Decode);
        }
        Ok(r)
    }
}

/// Go's `ExitError` text.
fn exit_text(status: std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(c), _) => format!("exit status {c}"),
        (None, Some(s)) => format!(
            "signal: {}",
            nix::sys::signal::Signal::try_from(s)
                .map(|s| signal_name(s).to_string())
                .unwrap_or_else(|_| s.to_string())
        ),
        _ => status.to_string(),
    }
}

/// Go's names of the signals that usually end a plugin.
fn signal_name(s: nix::sys::signal::Signal) -> &'static str {
    use nix::sys::signal::Signal::*;
    match s {
        SIGKILL => "killed",
        SIGTERM => "terminated",
        SIGSEGV => "segmentation fault",
        SIGABRT => "aborted",
        SIGINT => "interrupt",
        other => other.as_str(),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn plugin(dir: &std::path::Path, script: &str) -> ExecPlugin {
        let path = dir.join("p");
        std::fs::write(&path, format!("#!/bin/sh\n{script}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        ExecPlugin {
            name: "p".into(),
            api_version: "credentialprovider.kubelet.k8s.io/v1".into(),
            path,
            args: vec!["get".into()],
            env: vec![ExecEnvVar {
                name: "REGION".into(),
                value: "eu".into(),
            }],
            timeout: Duration::from_secs(10),
        }
    }

    #[tokio::test]
    async fn request_on_stdin_response_on_stdout() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("req");
        let p = plugin(
            dir.path(),
            &format!(
                "cat > {}; echo \"$1 $REGION\" >> {}\n\
                 echo '{{\"kind\":\"CredentialProviderResponse\",\"apiVersion\":\"credentialprovider.kubelet.k8s.io/v1\",\"cacheKeyType\":\"Registry\",\"cacheDuration\":\"5m\",\"auth\":{{\"reg.io\":{{\"username\":\"u\",\"password\":\"p\"}}}}}}'",
                log.display(),
                log.display()
            ),
        );
        let m = CredentialProviderMetrics::unregistered();
        let r = p
            .exec("reg.io/app", "", &BTreeMap::new(), &m)
            .await
            .unwrap();
        assert_eq!(r.cache_key_type, "Registry");
        assert_eq!(r.cache_duration.unwrap().length, Duration::from_secs(300));
        assert_eq!(r.auth.unwrap()["reg.io"].password, "p");
        let sent = std::fs::read_to_string(&log).unwrap();
        assert_eq!(
            sent,
            "{\"kind\":\"CredentialProviderRequest\",\"apiVersion\":\"credentialprovider.kubelet.k8s.io/v1\",\"image\":\"reg.io/app\"}\nget eu\n"
        );
    }

    #[tokio::test]
    async fn failures_read_as_kubelet_says_them() {
        let dir = tempfile::tempdir().unwrap();
        let m = CredentialProviderMetrics::unregistered();
        let p = plugin(dir.path(), "echo no creds >&2; exit 3");
        assert_eq!(
            p.exec("reg.io/app", "", &BTreeMap::new(), &m)
                .await
                .unwrap_err()
                .to_string(),
            "error execing credential provider plugin p for image reg.io/app: exit status 3: no creds\n"
        );
        let p = plugin(
            dir.path(),
            "echo '{\"kind\":\"CredentialProviderResponse\",\"apiVersion\":\"credentialprovider.kubelet.k8s.io/v1beta1\"}'",
        );
        assert_eq!(
            p.exec("reg.io/app", "", &BTreeMap::new(), &m)
                .await
                .unwrap_err()
                .to_string(),
            "apiVersion from credential plugin response did not match expected apiVersion:credentialprovider.kubelet.k8s.io/v1, actual apiVersion:credentialprovider.kubelet.k8s.io/v1beta1"
        );
        let p = plugin(
            dir.path(),
            "echo '{\"kind\":\"CredentialProviderResponse\",\"apiVersion\":\"credentialprovider.kubelet.k8s.io/v1\",\"secret\":\"x\"}'",
        );
        assert_eq!(
            p.exec("reg.io/app", "", &BTreeMap::new(), &m)
                .await
                .unwrap_err(),
            ExecError::Decode
        );
        let mut p = plugin(dir.path(), "exec sleep 30");
        p.timeout = Duration::from_millis(200);
        assert!(
            p.exec("reg.io/app", "", &BTreeMap::new(), &m)
                .await
                .unwrap_err()
                .to_string()
                .contains(": context deadline exceeded: ")
        );
    }
}
