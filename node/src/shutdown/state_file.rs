//! When the last graceful shutdown started and ended, kept across restarts
//! in `<rootDir>/graceful_node_shutdown_state` (kubelet's `localStorage`,
//! pkg/kubelet/nodeshutdown/storage.go: JSON `{"startTime":...,"endTime":...}`
//! with Go's time encoding, written atomically) and served as the gauges
//! `kubelet_graceful_shutdown_start_time_seconds` and
//! `kubelet_graceful_shutdown_end_time_seconds`.

use std::path::{Path, PathBuf};

use keelson_common::observability::metrics::register;
use prometheus::{Gauge, Registry};
use serde::{Deserialize, Serialize};

/// The file's name under the root dir (`localStorageStateFile`).
pub const FILE_NAME: &str = "graceful_node_shutdown_state";

/// Go's zero `time.Time` as JSON.
const GO_ZERO_TIME: &str = "0001-01-01T00:00:00Z";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Record {
    start_time: String,
    end_time: String,
}

fn seconds(text: &str) -> Option<i64> {
    let t: jiff::Timestamp = text.parse().ok()?;
    (text != GO_ZERO_TIME).then(|| t.as_second())
}

/// The record and the two gauges.
#[derive(Debug, Clone)]
pub struct ShutdownRecord {
    path: PathBuf,
    start: Gauge,
    end: Gauge,
}

impl ShutdownRecord {
    /// The record under `root_dir`, its gauges registered in `registry`
    /// and set from the file an earlier run left.
    pub fn open(root_dir: &Path, registry: &Registry) -> ShutdownRecord {
        let gauge = |name: &str, help: &str| {
            let g = Gauge::new(name, help).expect("constant metric name is valid");
            register(registry, g.clone());
            g
        };
        let r = ShutdownRecord {
            path: root_dir.join(FILE_NAME),
            start: gauge(
                "kubelet_graceful_shutdown_start_time_seconds",
                "Last graceful shutdown start time since unix epoch in seconds",
            ),
            end: gauge(
                "kubelet_graceful_shutdown_end_time_seconds",
                "Last graceful shutdown end time since unix epoch in seconds",
            ),
        };
        match std::fs::read(&r.path) {
            Ok(bytes) => match serde_json::from_slice::<Record>(&bytes) {
                Ok(rec) => {
                    if let Some(s) = seconds(&rec.start_time) {
                        r.start.set(s as f64);
                    }
                    if let Some(s) = seconds(&rec.end_time) {
                        r.end.set(s as f64);
                    }
                }
                Err(e) => {
                    tracing::error!(path = %r.path.display(), error = %e, "Failed to load graceful shutdown state")
                }
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                tracing::error!(path = %r.path.display(), error = %e, "Failed to load graceful shutdown state")
            }
        }
        r
    }

    /// A shutdown starts now: the end is cleared.
    pub fn started(&self, at: jiff::Timestamp) {
        self.store(at, None);
        self.start.set(at.as_second() as f64);
        self.end.set(0.0);
    }

    /// The shutdown that started at `start` ended now.
    pub fn ended(&self, start: jiff::Timestamp, at: jiff::Timestamp) {
        self.store(start, Some(at));
        self.end.set(at.as_second() as f64);
    }

    fn store(&self, start: jiff::Timestamp, end: Option<jiff::Timestamp>) {
        let rec = Record {
            start_time: start.to_string(),
            end_time: end.map_or_else(|| GO_ZERO_TIME.to_string(), |t| t.to_string()),
        };
        let write = || -> std::io::Result<()> {
            let bytes = serde_json::to_vec(&rec).map_err(std::io::Error::other)?;
            let tmp = self.path.with_file_name(format!(".tmp-{FILE_NAME}"));
            std::fs::write(&tmp, bytes)?;
            std::fs::File::open(&tmp)?.sync_all()?;
            std::fs::rename(&tmp, &self.path)
        };
        if let Err(e) = write() {
            tracing::error!(path = %self.path.display(), error = %e, "Failed to store graceful shutdown state");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shutdown_is_recorded_and_read_back_by_the_next_run() {
        let dir = tempfile::tempdir().expect("dir");
        let r = ShutdownRecord::open(dir.path(), &Registry::new());
        assert_eq!((r.start.get(), r.end.get()), (0.0, 0.0));
        let start: jiff::Timestamp = "2026-12-07T05:00:00.5Z".parse().expect("t");
        r.started(start);
        let text = std::fs::read_to_string(dir.path().join(FILE_NAME)).expect("file");
        assert_eq!(
            text,
            r#"{"startTime":"2026-12-07T05:00:00.5Z","endTime":"0001-01-01T00:00:00Z"}"#
        );
        let end: jiff::Timestamp = "2026-12-07T05:00:30Z".parse().expect("t");
        r.ended(start, end);
        let next = ShutdownRecord::open(dir.path(), &Registry::new());
        assert_eq!(next.start.get(), start.as_second() as f64);
        assert_eq!(next.end.get(), end.as_second() as f64);
    }
}
