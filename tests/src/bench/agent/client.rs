//! The benchmark's side: start an agent in a namespace (and cgroup), send
//! requests, await answers.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::oneshot;

use super::protocol::{
    Envelope, LatencyResult, ReachResult, Request, Response, SweepResult, Target,
};
use crate::bench::error::{BenchError, Result};

type Pending = Arc<Mutex<HashMap<u64, oneshot::Sender<Response>>>>;

/// A running probe agent. Dropping it kills the process.
#[derive(Debug)]
pub struct Agent {
    child: Child,
    stdin: tokio::sync::Mutex<ChildStdin>,
    pending: Pending,
    next_id: AtomicU64,
    reader: tokio::task::JoinHandle<()>,
    pid: u32,
}

/// The name of the hidden subcommand that runs an agent.
pub const AGENT_SUBCOMMAND: &str = "probe-agent";

impl Agent {
    /// Starts `exe probe-agent` in `netns` (joining `cgroup` first) and
    /// waits until it reports ready.
    pub async fn spawn(exe: &Path, netns: &Path, cgroup: Option<&Path>) -> Result<Agent> {
        let mut cmd = Command::new(exe);
        cmd.arg(AGENT_SUBCOMMAND).arg("--netns").arg(netns);
        if let Some(cg) = cgroup {
            cmd.arg("--cgroup").arg(cg);
        }
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true);
        let mut child = cmd.spawn().map_err(|e| {
            BenchError::io(format!("starting {} {AGENT_SUBCOMMAND}", exe.display()), e)
        })?;
        let stdin = child
            .stdin
            .take()
            .ok_or_else(|| BenchError::Agent("no stdin".into()))?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| BenchError::Agent("no stdout".into()))?;
        let pending: Pending = Arc::new(Mutex::new(HashMap::new()));
        let (ready_tx, ready_rx) = oneshot::channel();
        let reader = {
            let pending = pending.clone();
            tokio::spawn(async move {
                let mut ready_tx = Some(ready_tx);
                let mut lines = tokio::io::BufReader::new(stdout).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    let msg: Envelope<Response> = match serde_json::from_str(&line) {
                        Ok(m) => m,
                        Err(e) => {
                            tracing::warn!(line, error = %e, "unreadable probe agent answer");
                            continue;
                        }
                    };
                    if let Response::Ready { pid } = msg.body {
                        if let Some(tx) = ready_tx.take() {
                            let _ = tx.send(pid);
                        }
                        continue;
                    }
                    let waiter = pending
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .remove(&msg.id);
                    match waiter {
                        Some(tx) => {
                            let _ = tx.send(msg.body);
                        }
                        None => tracing::warn!(?msg.body, "probe agent answer nobody waits for"),
                    }
                }
                // EOF: fail everything still waiting.
                pending.lock().unwrap_or_else(|p| p.into_inner()).clear();
            })
        };
        let pid = match tokio::time::timeout(Duration::from_secs(30), ready_rx).await {
            Ok(Ok(pid)) => pid,
            Ok(Err(_)) => {
                let status = child.wait().await.ok();
                return Err(BenchError::Agent(format!(
                    "exited before it was ready ({status:?}); see its stderr above"
                )));
            }
            Err(_) => return Err(BenchError::Agent("not ready after 30 s".into())),
        };
        Ok(Agent {
            child,
            stdin: tokio::sync::Mutex::new(stdin),
            pending,
            next_id: AtomicU64::new(1),
            reader,
            pid,
        })
    }

    /// The agent's process id.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Sends a request and waits for its answer.
    pub async fn call(&self, body: Request) -> Result<Response> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id, tx);
        let mut line = serde_json::to_string(&Envelope { id, body })
            .map_err(|e| BenchError::Agent(format!("encoding a request: {e}")))?;
        line.push('\n');
        {
            let mut stdin = self.stdin.lock().await;
            stdin
                .write_all(line.as_bytes())
                .await
                .map_err(|e| BenchError::Agent(format!("sending a request: {e}")))?;
            stdin
                .flush()
                .await
                .map_err(|e| BenchError::Agent(format!("sending a request: {e}")))?;
        }
        match rx.await {
            Ok(Response::Error { message }) => Err(BenchError::Agent(message)),
            Ok(r) => Ok(r),
            Err(_) => Err(BenchError::Agent(
                "exited while a request was pending".into(),
            )),
        }
    }

    /// [`Request::Reach`].
    pub async fn reach(&self, targets: Vec<Target>, timeout: Duration) -> Result<ReachResult> {
        let n = targets.len();
        match self
            .call(Request::Reach {
                targets,
                timeout_ms: timeout.as_millis() as u64,
            })
            .await?
        {
            Response::Reach(r) if r.reached_ns.len() == n => Ok(r),
            other => Err(unexpected(&other)),
        }
    }

    /// [`Request::Sweep`].
    pub async fn sweep(
        &self,
        targets: Vec<Target>,
        all_endpoints: bool,
        max_attempts: u32,
    ) -> Result<Vec<SweepResult>> {
        let n = targets.len();
        match self
            .call(Request::Sweep {
                targets,
                all_endpoints,
                max_attempts,
            })
            .await?
        {
            Response::Sweep { results } if results.len() == n => Ok(results),
            other => Err(unexpected(&other)),
        }
    }

    /// [`Request::Latency`].
    pub async fn latency(&self, targets: Vec<Target>, samples: u32) -> Result<LatencyResult> {
        match self.call(Request::Latency { targets, samples }).await? {
            Response::Latency(r) => Ok(r),
            other => Err(unexpected(&other)),
        }
    }

    /// [`Request::Scrape`].
    pub async fn scrape(&self, addr: SocketAddr, path: &str) -> Result<String> {
        match self
            .call(Request::Scrape {
                addr,
                path: path.to_string(),
            })
            .await?
        {
            Response::Scrape { body } => Ok(body),
            other => Err(unexpected(&other)),
        }
    }

    /// Stops the agent (closing stdin ends it; killed if it lingers).
    pub async fn stop(mut self) {
        drop(self.stdin);
        if tokio::time::timeout(Duration::from_secs(5), self.child.wait())
            .await
            .is_err()
        {
            let _ = self.child.kill().await;
        }
        self.reader.abort();
    }
}

fn unexpected(r: &Response) -> BenchError {
    BenchError::Agent(format!("unexpected answer {r:?}"))
}
