//! Container log rotation, kubelet's container log manager
//! (`pkg/kubelet/logs/container_log_manager.go`): every
//! `containerLogMonitorInterval`, each running container whose log
//! reached `containerLogMaxSize` gets its log renamed to
//! `<log>.<YYYYMMDD-hhmmss>` and the runtime reopens it (CRI
//! ReopenContainerLog); older rotated files are gzipped and the oldest
//! removed so that at most `containerLogMaxFiles` files remain (the live
//! one and the newest rotated one stay plain, for readers still on them).
//! `containerLogMaxWorkers` containers are rotated at once.

use std::path::{Path, PathBuf};
use std::time::Duration;

use futures::StreamExt;
use keelson_cri::{CriError, RuntimeClient, api};
use tokio_util::sync::CancellationToken;

use super::files::{COMPRESS_SUFFIX, TMP_SUFFIX, is_in_use, rotated};

/// kubelet's `timestampFormat` for rotated logs.
pub fn rotated_name(log: &Path, now: &jiff::Zoned) -> PathBuf {
    PathBuf::from(format!(
        "{}.{}",
        log.display(),
        now.strftime("%Y%m%d-%H%M%S")
    ))
}

/// The rotation policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RotationPolicy {
    /// Rotate at this size; negative disables rotation.
    pub max_size: i64,
    /// Files kept per container (> 1).
    pub max_files: usize,
    /// Containers rotated at once.
    pub max_workers: usize,
    /// How often sizes are checked.
    pub interval: Duration,
}

/// Why one rotation failed.
#[derive(Debug, thiserror::Error)]
pub enum RotationError {
    /// A file operation failed.
    #[error("{0}")]
    Io(String),
    /// The runtime failed.
    #[error("failed to reopen container log {id:?}: {source}")]
    Reopen {
        /// The container.
        id: String,
        /// The CRI error.
        #[source]
        source: CriError,
    },
}

fn io(what: String) -> impl FnOnce(std::io::Error) -> RotationError {
    move |e| RotationError::Io(format!("{what}: {e}"))
}

/// Removes temporary and already-compressed leftovers of failed
/// rotations; returns the files in use.
pub fn cleanup_unused(logs: Vec<String>) -> Result<Vec<String>, RotationError> {
    let mut inuse = Vec::new();
    for l in &logs {
        if is_in_use(l, &logs) {
            inuse.push(l.clone());
        } else {
            std::fs::remove_file(l).map_err(io(format!("failed to remove unused log {l:?}")))?;
        }
    }
    Ok(inuse)
}

/// Keeps at most `max_files - 2` rotated files (the live one and the one
/// about to be rotated make up the rest), removing the oldest.
pub fn remove_excess(
    mut logs: Vec<String>,
    max_files: usize,
) -> Result<Vec<String>, RotationError> {
    logs.sort();
    let keep = max_files.saturating_sub(2);
    let cut = logs.len().saturating_sub(keep);
    for l in &logs[..cut] {
        std::fs::remove_file(l).map_err(io(format!("failed to remove old log {l:?}")))?;
    }
    Ok(logs.split_off(cut))
}

/// Gzips `log` to `log.gz` through a temporary file, then removes `log`.
pub fn compress(log: &str) -> Result<(), RotationError> {
    use std::io::Write;
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let mode = std::fs::metadata(log)
        .map_err(io(format!("failed to stat log file {log:?}")))?
        .permissions()
        .mode();
    let mut input = std::fs::File::open(log).map_err(io(format!("failed to open log {log:?}")))?;
    let tmp = format!("{log}{TMP_SUFFIX}");
    let result = (|| {
        let out = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(mode)
            .open(&tmp)
            .map_err(io(format!("failed to create temporary log {tmp:?}")))?;
        let mut enc = flate2::write::GzEncoder::new(out, flate2::Compression::default());
        std::io::copy(&mut input, &mut enc)
            .map_err(io(format!("failed to compress {log:?} to {tmp:?}")))?;
        enc.finish()
            .and_then(|mut f| f.flush())
            .map_err(io(format!("failed to compress {log:?} to {tmp:?}")))?;
        let gz = format!("{log}{COMPRESS_SUFFIX}");
        std::fs::rename(&tmp, &gz).map_err(io(format!("failed to rename {tmp:?} to {gz:?}")))?;
        std::fs::remove_file(log)
            .map_err(io(format!("failed to remove log {log:?} after compress")))
    })();
    let _ = std::fs::remove_file(&tmp);
    result
}

/// The log manager.
#[derive(Debug, Clone)]
pub struct LogRotation {
    cri: RuntimeClient,
    policy: RotationPolicy,
}

impl LogRotation {
    /// A manager over `cri`.
    pub fn new(cri: RuntimeClient, policy: RotationPolicy) -> Self {
        LogRotation { cri, policy }
    }

    /// Checks every running container every interval until `stop`.
    pub async fn run(self, stop: CancellationToken) {
        if self.policy.max_size < 0 {
            tracing::info!("container log rotation disabled (containerLogMaxSize is negative)");
            return;
        }
        tracing::info!(
            workers = self.policy.max_workers,
            interval = ?self.policy.interval,
            "initializing container log rotate workers"
        );
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(self.policy.interval) => {}
            }
            self.round().await;
        }
    }

    /// One check of every running container.
    pub async fn round(&self) {
        let filter = api::ContainerFilter {
            state: Some(api::ContainerStateValue {
                state: api::ContainerState::ContainerRunning as i32,
            }),
            ..Default::default()
        };
        let containers = match self.cri.list_containers(Some(filter)).await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "failed to rotate container logs: failed to list containers");
                return;
            }
        };
        futures::stream::iter(containers)
            .filter(|c| std::future::ready(c.state == api::ContainerState::ContainerRunning as i32))
            .for_each_concurrent(self.policy.max_workers.max(1), |c| async move {
                self.process(&c.id).await;
            })
            .await;
    }

    async fn process(&self, id: &str) {
        let status = match self.cri.container_status(id, false).await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(container = id, error = %e, "failed to get container status");
                return;
            }
        };
        let Some(status) = status.status else {
            return;
        };
        let path = PathBuf::from(&status.log_path);
        if status.log_path.is_empty() {
            return;
        }
        let size = match tokio::fs::metadata(&path).await {
            Ok(m) => m.len(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                if let Err(e) = self.cri.reopen_container_log(id).await {
                    tracing::warn!(container = id, path = %path.display(), error = %e, "container log doesn't exist, reopen container log failed");
                    return;
                }
                match tokio::fs::metadata(&path).await {
                    Ok(m) => m.len(),
                    Err(e) => {
                        tracing::warn!(container = id, path = %path.display(), error = %e, "failed to stat container log after reopen");
                        return;
                    }
                }
            }
            Err(e) => {
                tracing::warn!(container = id, path = %path.display(), error = %e, "failed to stat container log");
                return;
            }
        };
        if i64::try_from(size).unwrap_or(i64::MAX) < self.policy.max_size {
            return;
        }
        if let Err(e) = self.rotate(id, &path).await {
            tracing::warn!(container = id, path = %path.display(), size, error = %e, "failed to rotate log for container");
        }
    }

    /// Rotates one container's log now.
    pub async fn rotate(&self, id: &str, log: &Path) -> Result<(), RotationError> {
        let log_owned = log.to_path_buf();
        let max_files = self.policy.max_files;
        tokio::task::spawn_blocking(move || -> Result<(), RotationError> {
            let logs = cleanup_unused(rotated(&log_owned))?;
            let logs = remove_excess(logs, max_files)?;
            for l in logs.iter().filter(|l| !l.ends_with(COMPRESS_SUFFIX)) {
                compress(l)?;
            }
            Ok(())
        })
        .await
        .map_err(|e| RotationError::Io(e.to_string()))??;
        let target = rotated_name(log, &jiff::Zoned::now());
        tokio::fs::rename(log, &target).await.map_err(io(format!(
            "failed to rotate log {:?} to {:?}",
            log.display().to_string(),
            target.display().to_string()
        )))?;
        if let Err(source) = self.cri.reopen_container_log(id).await {
            // Put it back so the next round tries again.
            if let Err(e) = tokio::fs::rename(&target, log).await {
                tracing::error!(rotated = %target.display(), log = %log.display(), container = id, error = %e, "failed to rename rotated log");
            }
            return Err(RotationError::Reopen {
                id: id.to_string(),
                source,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn excess_and_unused_files_go() {
        let d = tempfile::tempdir().unwrap();
        let p = |n: &str| d.path().join(n).display().to_string();
        for n in [
            "0.log.1.gz",
            "0.log.2.gz",
            "0.log.3",
            "0.log.3.gz",
            "0.log.4.tmp",
            "0.log.5",
        ] {
            std::fs::write(p(n), n).unwrap();
        }
        let logs = rotated(&d.path().join("0.log"));
        let inuse = cleanup_unused(logs).unwrap();
        assert_eq!(
            inuse,
            vec![
                p("0.log.1.gz"),
                p("0.log.2.gz"),
                p("0.log.3.gz"),
                p("0.log.5")
            ]
        );
        assert!(!Path::new(&p("0.log.3")).exists());
        assert!(!Path::new(&p("0.log.4.tmp")).exists());
        let kept = remove_excess(inuse, 4).unwrap();
        assert_eq!(kept, vec![p("0.log.3.gz"), p("0.log.5")]);
        assert!(!Path::new(&p("0.log.1.gz")).exists());
        compress(&p("0.log.5")).unwrap();
        assert!(Path::new(&p("0.log.5.gz")).exists());
        assert!(!Path::new(&p("0.log.5")).exists());
        let name = rotated_name(Path::new("/x/0.log"), &jiff::Zoned::now());
        assert!(
            name.display().to_string().starts_with("/x/0.log.2"),
            "{name:?}"
        );
    }
}
