//! A long-running process the harness started: its output goes to a log
//! file, it is stopped by PID (SIGTERM, then SIGKILL after a grace) when
//! dropped, and the tail of its log explains a failure.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use super::UpstreamError;

/// A started process and its log.
#[derive(Debug)]
pub struct Daemon {
    name: String,
    child: Option<Child>,
    log: PathBuf,
    grace: Duration,
}

impl Daemon {
    /// Starts `cmd` with stdout and stderr appended to `log`.
    pub fn spawn(name: &str, mut cmd: Command, log: &Path) -> Result<Daemon, UpstreamError> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .map_err(UpstreamError::io(format!("creating {}", log.display())))?;
        let err = file
            .try_clone()
            .map_err(UpstreamError::io("cloning the log file"))?;
        let child = cmd
            .stdin(Stdio::null())
            .stdout(file)
            .stderr(err)
            .spawn()
            .map_err(UpstreamError::io(format!("starting {name}")))?;
        Ok(Daemon {
            name: name.to_string(),
            child: Some(child),
            log: log.to_path_buf(),
            grace: Duration::from_secs(10),
        })
    }

    /// The process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The log file.
    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// `Err` with the exit status and the log's tail when it exited.
    pub fn check_running(&mut self) -> Result<(), UpstreamError> {
        let exited = match self.child.as_mut().map(Child::try_wait) {
            Some(Ok(None)) => return Ok(()),
            Some(Ok(Some(status))) => status.to_string(),
            Some(Err(e)) => e.to_string(),
            None => "stopped".to_string(),
        };
        Err(UpstreamError::Exited {
            name: self.name.clone(),
            status: exited,
            log: self.log_tail(40),
        })
    }

    /// The last `lines` lines of its log.
    pub fn log_tail(&self, lines: usize) -> String {
        log_tail(&self.log, lines)
    }

    /// SIGTERM, up to the grace period, then SIGKILL; returns how it ended.
    pub fn stop(&mut self) -> String {
        let Some(mut child) = self.child.take() else {
            return "not running".to_string();
        };
        if let Ok(raw) = i32::try_from(child.id()) {
            let _ = kill(Pid::from_raw(raw), Signal::SIGTERM);
        }
        let deadline = Instant::now() + self.grace;
        loop {
            match child.try_wait() {
                Ok(Some(status)) => return status.to_string(),
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(25))
                }
                _ => {
                    let _ = child.kill();
                    return child
                        .wait()
                        .map(|s| format!("killed after {:?}: {s}", self.grace))
                        .unwrap_or_else(|e| e.to_string());
                }
            }
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let how = self.stop();
        tracing::debug!(daemon = %self.name, %how, "stopped");
    }
}

/// The last `lines` lines of a file (empty when unreadable).
pub fn log_tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
