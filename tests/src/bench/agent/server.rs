//! The agent process's side: join the cgroup and the namespace, then
//! answer requests from stdin on stdout.

use std::path::PathBuf;
use std::time::Duration;

use futures::StreamExt;
use nix::sched::{CloneFlags, setns};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

use super::probe;
use super::protocol::{Envelope, ReachResult, Request, Response};
use crate::bench::error::{BenchError, Result};

/// Sweeps run this many targets at once.
const SWEEP_CONCURRENCY: usize = 32;

/// Where the agent runs.
#[derive(Debug, Clone)]
pub struct AgentArgs {
    /// Network namespace file to join (e.g. `/run/netns/<name>`).
    pub netns: PathBuf,
    /// cgroup v2 directory to join first (eBPF contestants), if any.
    pub cgroup: Option<PathBuf>,
}

/// Entry point of `keelson-bench probe-agent`: joins the cgroup (before any
/// socket exists, so every probe socket belongs to it), then the
/// namespace (before any other thread exists, so every thread is in it),
/// then serves until stdin closes.
pub fn run(args: &AgentArgs) -> Result<()> {
    if let Some(cg) = &args.cgroup {
        std::fs::write(cg.join("cgroup.procs"), std::process::id().to_string())
            .map_err(|e| BenchError::io(format!("joining cgroup {}", cg.display()), e))?;
    }
    let ns = std::fs::File::open(&args.netns)
        .map_err(|e| BenchError::io(format!("opening {}", args.netns.display()), e))?;
    setns(&ns, CloneFlags::CLONE_NEWNET)
        .map_err(|e| BenchError::Agent(format!("setns into {}: {e}", args.netns.display())))?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| BenchError::io("starting the agent's runtime", e))?;
    rt.block_on(serve());
    Ok(())
}

async fn serve() {
    let (out_tx, mut out_rx) = mpsc::unbounded_channel::<String>();
    let writer = tokio::spawn(async move {
        let mut stdout = tokio::io::stdout();
        while let Some(line) = out_rx.recv().await {
            if stdout.write_all(line.as_bytes()).await.is_err() || stdout.flush().await.is_err() {
                return;
            }
        }
    });
    send(
        &out_tx,
        0,
        Response::Ready {
            pid: std::process::id(),
        },
    );
    let mut lines = tokio::io::BufReader::new(tokio::io::stdin()).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        let out = out_tx.clone();
        match serde_json::from_str::<Envelope<Request>>(&line) {
            Ok(req) => {
                tokio::spawn(async move {
                    let body = handle(req.body).await;
                    send(&out, req.id, body);
                });
            }
            Err(e) => send(
                &out,
                0,
                Response::Error {
                    message: format!("bad request {line:?}: {e}"),
                },
            ),
        }
    }
    drop(out_tx);
    let _ = writer.await;
}

fn send(out: &mpsc::UnboundedSender<String>, id: u64, body: Response) {
    match serde_json::to_string(&Envelope { id, body }) {
        Ok(mut s) => {
            s.push('\n');
            let _ = out.send(s);
        }
        Err(e) => eprintln!("probe agent: encoding an answer: {e}"),
    }
}

async fn handle(req: Request) -> Response {
    match req {
        Request::Reach {
            targets,
            timeout_ms,
        } => {
            let timeout = Duration::from_millis(timeout_ms);
            let results =
                futures::future::join_all(targets.iter().map(|t| probe::reach(t, timeout))).await;
            Response::Reach(ReachResult {
                attempts: results.iter().map(|r| r.attempts).sum(),
                reached_ns: results.iter().map(|r| r.at_ns).collect(),
                last_error: results.into_iter().map(|r| r.last_error).collect(),
            })
        }
        Request::Sweep {
            targets,
            all_endpoints,
            max_attempts,
        } => {
            let results = futures::stream::iter(targets)
                .map(|t| async move { probe::sweep(&t, all_endpoints, max_attempts).await })
                .buffered(SWEEP_CONCURRENCY)
                .collect()
                .await;
            Response::Sweep { results }
        }
        Request::Latency { targets, samples } => {
            match tokio::task::spawn_blocking(move || probe::latency(&targets, samples)).await {
                Ok(r) => Response::Latency(r),
                Err(e) => Response::Error {
                    message: format!("latency probe thread: {e}"),
                },
            }
        }
        Request::Scrape { addr, path } => match probe::scrape(addr, &path).await {
            Ok(body) => Response::Scrape { body },
            Err(message) => Response::Error { message },
        },
    }
}
