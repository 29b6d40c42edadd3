//! The `exec` probe (upstream `pkg/probe/exec`): run the command in the
//! container through the [`Exec`] trait (the agent implements it with CRI
//! `ExecSync`). Exit code 0 is success; any other exit code is a failure
//! whose message is the command's output (stdout then stderr, at most
//! 10 KiB); a timeout is a failure (`command "<cmd>" timed out`, as since
//! Kubernetes 1.20); any other error means the probe errored.

use std::future::Future;
use std::time::Duration;

use futures::future::BoxFuture;

use crate::result::ProbeResult;
use keelson_common::gofmt;

/// Bytes of output kept (upstream `maxReadLength`).
pub const MAX_OUTPUT_BYTES: usize = 10 * 1024;

/// Extra time given to the runtime beyond the probe's timeout before the call
/// is abandoned as timed out; kubelet allows its runtime request timeout
/// (2 minutes by default) on top of the probe timeout for `ExecSync`.
pub const EXEC_RUNTIME_GRACE: Duration = Duration::from_secs(120);

/// What a finished command produced.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExecOutput {
    /// The command's exit code.
    pub exit_code: i32,
    /// Its standard output.
    pub stdout: Vec<u8>,
    /// Its standard error.
    pub stderr: Vec<u8>,
}

/// Why a command could not produce an [`ExecOutput`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExecError {
    /// The command did not finish within the timeout (CRI `ExecSync`
    /// answered `DeadlineExceeded`). The probe fails.
    #[error("timed out")]
    Timeout,
    /// Anything else (container gone, runtime unreachable). The probe
    /// errored; the text goes into the `Unhealthy` event.
    #[error("{0}")]
    Failed(String),
}

/// Runs a command inside a container: the one thing probes need from the
/// container runtime. The agent implements it with CRI `ExecSync`, passing
/// `timeout` as the request's timeout; implementations may be written with
/// `async fn`.
pub trait Exec: Send + Sync + 'static {
    /// Runs `cmd` in container `container_id`, waiting at most `timeout`.
    fn exec(
        &self,
        container_id: &str,
        cmd: Vec<String>,
        timeout: Duration,
    ) -> impl Future<Output = Result<ExecOutput, ExecError>> + Send;
}

/// Object-safe form of [`Exec`], so the manager is not generic.
pub(crate) trait DynExec: Send + Sync {
    fn exec_boxed<'a>(
        &'a self,
        container_id: &'a str,
        cmd: Vec<String>,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<ExecOutput, ExecError>>;
}

impl<E: Exec> DynExec for E {
    fn exec_boxed<'a>(
        &'a self,
        container_id: &'a str,
        cmd: Vec<String>,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<ExecOutput, ExecError>> {
        Box::pin(self.exec(container_id, cmd, timeout))
    }
}

/// Runs an exec probe.
pub(crate) async fn probe_exec(
    exec: &dyn DynExec,
    container_id: &str,
    command: &[String],
    timeout: Duration,
) -> ProbeResult {
    let call = exec.exec_boxed(container_id, command.to_vec(), timeout);
    let outcome = match tokio::time::timeout(timeout + EXEC_RUNTIME_GRACE, call).await {
        Ok(outcome) => outcome,
        Err(_) => Err(ExecError::Timeout),
    };
    match outcome {
        Ok(output) if output.exit_code == 0 => ProbeResult::Success,
        Ok(output) => ProbeResult::Failure(combined_output(&output)),
        Err(ExecError::Timeout) => ProbeResult::Failure(format!(
            "command {} timed out",
            gofmt::quote(&command.join(" "))
        )),
        Err(ExecError::Failed(message)) => ProbeResult::Unknown(message),
    }
}

/// Stdout then stderr, cut at [`MAX_OUTPUT_BYTES`] (a character may be
/// cut), as the API server shows the bytes kubelet sends
/// ([`gofmt::api_text`]).
fn combined_output(output: &ExecOutput) -> String {
    let mut data =
        Vec::with_capacity((output.stdout.len() + output.stderr.len()).min(MAX_OUTPUT_BYTES));
    for part in [&output.stdout, &output.stderr] {
        let room = MAX_OUTPUT_BYTES - data.len();
        data.extend_from_slice(&part[..part.len().min(room)]);
    }
    gofmt::api_text(&data)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    struct Canned {
        answer: Result<ExecOutput, ExecError>,
        seen: Mutex<Vec<(String, Vec<String>, Duration)>>,
    }

    impl Exec for Canned {
        async fn exec(
            &self,
            container_id: &str,
            cmd: Vec<String>,
            timeout: Duration,
        ) -> Result<ExecOutput, ExecError> {
            if let Ok(mut seen) = self.seen.lock() {
                seen.push((container_id.to_string(), cmd, timeout));
            }
            self.answer.clone()
        }
    }

    fn canned(answer: Result<ExecOutput, ExecError>) -> Canned {
        Canned {
            answer,
            seen: Mutex::new(Vec::new()),
        }
    }

    fn cmd() -> Vec<String> {
        vec!["sh".into(), "-c".into(), "test -f /tmp/ready".into()]
    }

    #[tokio::test]
    async fn exit_code_zero_is_success_and_arguments_pass_through() {
        let exec = canned(Ok(ExecOutput {
            exit_code: 0,
            stdout: b"ok".to_vec(),
            stderr: vec![],
        }));
        let result = probe_exec(&exec, "cid", &cmd(), Duration::from_secs(3)).await;
        assert_eq!(result, ProbeResult::Success);
        let seen = exec.seen.lock().map(|s| s.clone()).unwrap_or_default();
        assert_eq!(seen, [("cid".to_string(), cmd(), Duration::from_secs(3))]);
    }

    #[tokio::test]
    async fn nonzero_exit_fails_with_output() {
        let exec = canned(Ok(ExecOutput {
            exit_code: 1,
            stdout: b"out\n".to_vec(),
            stderr: b"err\n".to_vec(),
        }));
        assert_eq!(
            probe_exec(&exec, "cid", &cmd(), Duration::from_secs(1)).await,
            ProbeResult::Failure("out\nerr\n".into())
        );
    }

    #[tokio::test]
    async fn output_is_capped() {
        let exec = canned(Ok(ExecOutput {
            exit_code: 2,
            stdout: vec![b'a'; 8000],
            stderr: vec![b'b'; 8000],
        }));
        match probe_exec(&exec, "cid", &cmd(), Duration::from_secs(1)).await {
            ProbeResult::Failure(out) => {
                assert_eq!(out.len(), MAX_OUTPUT_BYTES);
                assert_eq!(out.matches('b').count(), MAX_OUTPUT_BYTES - 8000);
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    /// kubelet keeps the first 10 KiB of bytes (`LimitWriter`), cutting a
    /// character, and the API server shows each byte left of it as U+FFFD
    /// (the upstream hostile_objects case: "xx" then 4 MiB of `€`).
    #[tokio::test]
    async fn a_cut_character_shows_as_kubelets_does() {
        let stdout = format!("xx{}", "€".repeat(MAX_OUTPUT_BYTES)).into_bytes();
        let exec = canned(Ok(ExecOutput {
            exit_code: 1,
            stdout,
            stderr: Vec::new(),
        }));
        match probe_exec(&exec, "cid", &cmd(), Duration::from_secs(1)).await {
            ProbeResult::Failure(out) => {
                let euros = (MAX_OUTPUT_BYTES - 2) / 3;
                assert_eq!(out, format!("xx{}\u{fffd}\u{fffd}", "€".repeat(euros)));
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[tokio::test]
    async fn timeout_is_a_failure_with_upstream_message() {
        let exec = canned(Err(ExecError::Timeout));
        assert_eq!(
            probe_exec(&exec, "cid", &cmd(), Duration::from_secs(1)).await,
            ProbeResult::Failure("command \"sh -c test -f /tmp/ready\" timed out".into())
        );
    }

    #[tokio::test]
    async fn runtime_errors_are_probe_errors() {
        let exec = canned(Err(ExecError::Failed(
            "rpc error: code = NotFound desc = container not found".into(),
        )));
        assert_eq!(
            probe_exec(&exec, "cid", &cmd(), Duration::from_secs(1)).await,
            ProbeResult::Unknown("rpc error: code = NotFound desc = container not found".into())
        );
    }

    struct Hangs;
    impl Exec for Hangs {
        async fn exec(
            &self,
            _: &str,
            _: Vec<String>,
            _: Duration,
        ) -> Result<ExecOutput, ExecError> {
            std::future::pending().await
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_hung_runtime_call_times_out_after_the_grace() {
        let started = tokio::time::Instant::now();
        let result = probe_exec(&Hangs, "cid", &["true".to_string()], Duration::from_secs(1)).await;
        assert_eq!(
            result,
            ProbeResult::Failure("command \"true\" timed out".into())
        );
        assert_eq!(
            started.elapsed(),
            Duration::from_secs(1) + EXEC_RUNTIME_GRACE
        );
    }
}
