//! The real `keelson` binary, started inside the demo node's network
//! namespace (`nsenter --net`, which keeps the host's cgroup mounts) and
//! stopped by PID: SIGTERM, then SIGKILL after a grace period. Dropping the
//! handle stops it too, so an interrupted demo leaves no keelson behind.

use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use keelson_tests::netns::NetNs;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// A running keelson.
pub struct Keelson {
    child: Option<Child>,
    log: PathBuf,
}

impl Keelson {
    /// Starts `bin run --config config` in `netns`, logging to `log`.
    pub fn start(netns: &NetNs, bin: &Path, config: &Path, log: &Path) -> std::io::Result<Keelson> {
        let out = std::fs::File::create(log)?;
        let err = out.try_clone()?;
        let child = netns
            .command(&bin.display().to_string())
            .arg("run")
            .arg("--config")
            .arg(config)
            // Plain text in the log file.
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()?;
        Ok(Keelson {
            child: Some(child),
            log: log.to_path_buf(),
        })
    }

    /// The process id.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Its exit status, if it has exited.
    pub fn exited(&mut self) -> Option<String> {
        match self.child.as_mut().map(Child::try_wait) {
            Some(Ok(Some(status))) => Some(status.to_string()),
            Some(Err(e)) => Some(e.to_string()),
            Some(Ok(None)) => None,
            None => Some("stopped".into()),
        }
    }

    /// The last `lines` lines of its log.
    pub fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// SIGTERM, up to `grace` for it to exit, then SIGKILL. Returns how it
    /// ended and how long it took.
    pub fn stop(&mut self, grace: Duration) -> (String, Duration) {
        let start = Instant::now();
        let Some(mut child) = self.child.take() else {
            return ("not running".into(), Duration::ZERO);
        };
        if let Ok(pid) = i32::try_from(child.id()) {
            let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
        }
        loop {
            match child.try_wait() {
                Ok(Some(status)) => return (status.to_string(), start.elapsed()),
                Ok(None) if start.elapsed() < grace => {
                    std::thread::sleep(Duration::from_millis(50))
                }
                _ => {
                    let _ = child.kill();
                    let status = child.wait().map(|s| format!("killed after {grace:?}: {s}"));
                    return (status.unwrap_or_else(|e| e.to_string()), start.elapsed());
                }
            }
        }
    }
}

impl Drop for Keelson {
    fn drop(&mut self) {
        self.stop(Duration::from_secs(10));
    }
}
