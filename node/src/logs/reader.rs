//! Streams a container's log as kubelet's `ReadLogs` does
//! (`staging/src/k8s.io/cri-client/pkg/logs/logs.go`): parse each line,
//! skip lines before `since`, prefix timestamps at the start of each
//! logical line (partial `P` lines join), stop at `limitBytes`, start at
//! `tailLines` from the end; with `follow`, wait for more until the
//! container stops, reopening the file when rotation replaced it.
//!
//! Beyond kubelet (which reads only the live file): the rotated files of
//! the container (`<log>.<time>`, `….gz`) are read first, oldest first,
//! so a rotation does not hide recent lines from `kubectl logs`, and
//! `tailLines` counts across them.
//!
//! Memory stays bounded: bytes go out in chunks of at most 64 KiB through
//! a bounded channel, so a slow client slows the reading, never buffers
//! the log.

use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures::future::BoxFuture;
use tokio::sync::mpsc;

use super::files::{self, Source};
use super::format::{self, Format, Stream};
use super::options::LogOptions;
use super::watch::DirWatcher;

/// kubelet's `logForceCheckPeriod`.
const FORCE_CHECK: Duration = Duration::from_secs(1);
/// Output is sent once this much is buffered (and at every wait).
const FLUSH_AT: usize = 64 * 1024;

/// Why reading stopped early.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    /// The log could not be opened or read (kubelet's messages).
    #[error("{0}")]
    Io(String),
    /// The first line is in neither format.
    #[error("failed to get parse function: {0}")]
    Format(super::format::FormatError),
    /// The runtime's status of the container could not be read.
    #[error("{0}")]
    Runtime(keelson_cri::CriError),
    /// The client went away.
    #[error("client disconnected")]
    Closed,
}

/// Tells whether a container still runs (CRI ContainerStatus; a runtime
/// that is unavailable counts as running, as in kubelet).
pub trait ContainerRunning: Send + Sync {
    /// `Ok(true)` while running.
    fn is_running<'a>(
        &'a self,
        container_id: &'a str,
    ) -> BoxFuture<'a, Result<bool, keelson_cri::CriError>>;
}

/// What to read.
#[derive(Debug, Clone)]
pub struct LogRequest {
    /// The live log file (CRI `ContainerStatus.log_path`).
    pub path: PathBuf,
    /// The container (for `follow`).
    pub container_id: String,
    /// The options.
    pub opts: LogOptions,
    /// Now, ns since the epoch (for `sinceSeconds`).
    pub now_ns: i128,
    /// Read only the live file, as kubelet (`false`: rotated files first).
    pub live_only: bool,
}

/// Turns file lines into response bytes.
struct LineWriter {
    format: Option<Format>,
    since: Option<i128>,
    timestamps: bool,
    remaining: i64,
    limited: Option<i64>,
    new_line: bool,
    want_stdout: bool,
    want_stderr: bool,
    out: BytesMut,
    done: bool,
}

impl LineWriter {
    fn new(opts: &LogOptions, since: Option<i128>) -> Self {
        let (want_stdout, want_stderr) = match opts.stream.as_deref() {
            Some("Stdout") => (true, false),
            Some("Stderr") => (false, true),
            _ => (true, true),
        };
        LineWriter {
            format: None,
            since,
            timestamps: opts.timestamps,
            remaining: opts.limit_bytes.unwrap_or(i64::MAX),
            limited: if opts.follow { None } else { opts.tail_lines },
            new_line: true,
            want_stdout,
            want_stderr,
            out: BytesMut::with_capacity(FLUSH_AT + 4096),
            done: false,
        }
    }

    /// One physical line (with its newline, unless the file ends there).
    fn line(&mut self, line: &[u8]) -> Result<(), LogError> {
        if self.done || self.limited == Some(0) {
            self.done = true;
            return Ok(());
        }
        let fmt = match self.format {
            Some(f) => f,
            None => {
                let f = format::detect(line).map_err(LogError::Format)?;
                self.format = Some(f);
                f
            }
        };
        let msg = match format::parse(fmt, line) {
            Ok(m) => m,
            Err(e) => {
                tracing::warn!(error = %e, "failed when parsing line in log file");
                return Ok(());
            }
        };
        let before_since = self
            .since
            .is_some_and(|s| format::parse_timestamp(&msg.timestamp).is_some_and(|t| t < s));
        let wanted = match msg.stream {
            Stream::Stdout => self.want_stdout,
            Stream::Stderr => self.want_stderr,
        };
        if !before_since && wanted {
            let start = self.out.len();
            if self.timestamps && self.new_line {
                let ts = format::fixed_timestamp(&msg.timestamp)
                    .unwrap_or_else(|| msg.timestamp.to_string());
                self.out.extend_from_slice(ts.as_bytes());
                self.out.extend_from_slice(b" ");
            }
            self.out.extend_from_slice(&msg.content);
            let written = (self.out.len() - start) as i64;
            if written >= self.remaining {
                self.out.truncate(start + self.remaining.max(0) as usize);
                self.remaining = 0;
                self.done = true;
            } else {
                self.remaining -= written;
            }
        }
        if let Some(n) = &mut self.limited {
            *n -= 1;
            if *n == 0 {
                self.done = true;
            }
        }
        self.new_line = msg.content.last().is_none_or(|b| *b == b'\n');
        Ok(())
    }

    async fn flush(
        &mut self,
        tx: &mpsc::Sender<Result<Bytes, std::io::Error>>,
    ) -> Result<(), LogError> {
        if self.out.is_empty() {
            return Ok(());
        }
        let chunk = self.out.split().freeze();
        tx.send(Ok(chunk)).await.map_err(|_| LogError::Closed)
    }
}

/// Where reading starts: which file, and a byte offset (plain) or a
/// number of lines to skip (compressed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Start {
    Offset(u64),
    SkipLines(u64),
}

async fn find_start(files: &[PathBuf], tail: Option<i64>) -> Result<(usize, Start), LogError> {
    let Some(tail) = tail else {
        return Ok((0, Start::Offset(0)));
    };
    let mut need = u64::try_from(tail).unwrap_or(0);
    let last = files.len().saturating_sub(1);
    for i in (0..files.len()).rev() {
        let f = &files[i];
        if f.to_string_lossy().ends_with(files::COMPRESS_SUFFIX) {
            let lines = files::count_lines(f).await.unwrap_or(0);
            if lines >= need {
                return Ok((i, Start::SkipLines(lines - need)));
            }
            need -= lines;
        } else {
            match files::tail_offset(f, need).await {
                Ok(Ok(off)) => return Ok((i, Start::Offset(off))),
                Ok(Err(lines)) => need -= lines.min(need),
                Err(e) if i == last => {
                    return Err(LogError::Io(format!(
                        "failed to tail {tail} lines of log file {:?}: {e}",
                        f.display().to_string()
                    )));
                }
                Err(_) => {}
            }
        }
        if need == 0 {
            return Ok((i, Start::Offset(0)));
        }
    }
    Ok((0, Start::Offset(0)))
}

/// Feeds complete lines of `pending` to the writer, keeping a trailing
/// partial line; flushes when enough is buffered.
async fn drain_lines(
    pending: &mut Vec<u8>,
    skip: &mut u64,
    w: &mut LineWriter,
    tx: &mpsc::Sender<Result<Bytes, std::io::Error>>,
) -> Result<(), LogError> {
    let mut start = 0;
    while let Some(i) = pending[start..].iter().position(|b| *b == b'\n') {
        let end = start + i + 1;
        if *skip > 0 {
            *skip -= 1;
        } else {
            w.line(&pending[start..end])?;
            if w.done {
                break;
            }
            if w.out.len() >= FLUSH_AT {
                w.flush(tx).await?;
            }
        }
        start = end;
    }
    pending.drain(..start);
    Ok(())
}

/// Reads `req` into `tx` until done, the client leaves or, when
/// following, the container stops.
pub async fn read_logs(
    req: &LogRequest,
    running: &dyn ContainerRunning,
    watcher: &DirWatcher,
    tx: &mpsc::Sender<Result<Bytes, std::io::Error>>,
) -> Result<(), LogError> {
    let path = tokio::fs::canonicalize(&req.path).await.map_err(|e| {
        LogError::Io(format!(
            "failed to try resolving symlinks in path {:?}: {e}",
            req.path.display().to_string()
        ))
    })?;
    let files = if req.live_only {
        vec![path.clone()]
    } else {
        files::all_logs(&path)
    };
    let (first, start) = find_start(&files, req.opts.tail_lines).await?;
    let mut w = LineWriter::new(&req.opts, req.opts.since(req.now_ns));
    let last = files.len() - 1;
    for (i, f) in files.iter().enumerate().skip(first) {
        let start = if i == first { start } else { Start::Offset(0) };
        if i == last {
            read_live(req, &path, start, &mut w, running, watcher, tx).await?;
        } else {
            // A rotated file that vanished meanwhile (removed as excess) is skipped.
            let Ok(mut src) = Source::open(f).await else {
                continue;
            };
            let mut skip = match start {
                Start::Offset(o) => {
                    if o > 0 {
                        src.seek(o).await.map_err(|e| LogError::Io(e.to_string()))?;
                    }
                    0
                }
                Start::SkipLines(n) => n,
            };
            let mut pending = Vec::with_capacity(files::CHUNK);
            loop {
                let n = src.read_into(&mut pending).await.map_err(|e| {
                    LogError::Io(format!(
                        "failed to read log file {:?}: {e}",
                        f.display().to_string()
                    ))
                })?;
                if n == 0 {
                    break;
                }
                drain_lines(&mut pending, &mut skip, &mut w, tx).await?;
                if w.done {
                    break;
                }
            }
            if !pending.is_empty() && !w.done {
                w.line(&pending)?;
            }
        }
        if w.done {
            break;
        }
    }
    w.flush(tx).await
}

async fn inode_of(path: &Path) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    tokio::fs::metadata(path).await.ok().map(|m| m.ino())
}

async fn read_live(
    req: &LogRequest,
    path: &Path,
    start: Start,
    w: &mut LineWriter,
    running: &dyn ContainerRunning,
    watcher: &DirWatcher,
    tx: &mpsc::Sender<Result<Bytes, std::io::Error>>,
) -> Result<(), LogError> {
    let open_err = |e: std::io::Error| {
        LogError::Io(format!(
            "failed to open log file {:?}: {e}",
            path.display().to_string()
        ))
    };
    let mut src = Source::open(path).await.map_err(open_err)?;
    if let Start::Offset(o) = start
        && o > 0
    {
        src.seek(o).await.map_err(|e| {
            LogError::Io(format!(
                "failed to seek {o} in log file {:?}: {e}",
                path.display().to_string()
            ))
        })?;
    }
    let mut skip = 0;
    let mut pending = Vec::with_capacity(files::CHUNK);
    let mut sub = None;
    let mut found = true;
    loop {
        if w.done {
            return Ok(());
        }
        let n = src.read_into(&mut pending).await.map_err(|e| {
            LogError::Io(format!(
                "failed to read log file {:?}: {e}",
                path.display().to_string()
            ))
        })?;
        if n > 0 {
            drain_lines(&mut pending, &mut skip, w, tx).await?;
            continue;
        }
        if !req.opts.follow {
            if !pending.is_empty() {
                tracing::info!(path = %path.display(), "incomplete line in log file");
                w.line(&pending)?;
                pending.clear();
            }
            return Ok(());
        }
        w.flush(tx).await?;
        if !found {
            return Ok(());
        }
        // Rotated: the path names a new file; this one is read to its
        // end (the runtime writes to it until it reopens), then the new
        // one is followed.
        let ours = src.inode().await;
        let now = inode_of(path).await;
        if now.is_some() && now != ours {
            match Source::open(path).await {
                Ok(s) => {
                    // Lines of the old file are complete by now.
                    if !pending.is_empty() {
                        w.line(&pending)?;
                        pending.clear();
                    }
                    src = s;
                    continue;
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(open_err(e)),
            }
        }
        match running.is_running(&req.container_id).await {
            Ok(true) => {}
            Ok(false) => {
                // Read what is left once more, then stop.
                found = false;
                continue;
            }
            Err(e) => return Err(LogError::Runtime(e)),
        }
        let sub = sub.get_or_insert_with(|| {
            watcher.subscribe(path.parent().unwrap_or_else(|| Path::new("/")))
        });
        tokio::select! {
            _ = sub.wait(FORCE_CHECK) => {}
            _ = tx.closed() => return Err(LogError::Closed),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::panic)]
mod tests {
    use super::*;

    fn opts() -> LogOptions {
        LogOptions::default()
    }

    fn run(o: &LogOptions, lines: &[&str]) -> String {
        let mut w = LineWriter::new(o, o.since(0));
        for l in lines {
            w.line(l.as_bytes()).unwrap();
        }
        String::from_utf8(w.out.to_vec()).unwrap()
    }

    const L: &[&str] = &[
        "2024-01-01T00:00:01.5Z stdout F one\n",
        "2024-01-01T00:00:02Z stderr P tw\n",
        "2024-01-01T00:00:03Z stderr F o\n",
        "2024-01-01T00:00:04Z stdout F three\n",
    ];

    #[test]
    fn joins_partials_and_prefixes_timestamps() {
        assert_eq!(run(&opts(), L), "one\ntwo\nthree\n");
        let o = LogOptions {
            timestamps: true,
            ..opts()
        };
        assert_eq!(
            run(&o, L),
            "2024-01-01T00:00:01.500000000Z one\n2024-01-01T00:00:02.000000000Z two\n2024-01-01T00:00:04.000000000Z three\n"
        );
    }

    #[test]
    fn since_limit_and_streams() {
        let since = format::parse_timestamp("2024-01-01T00:00:03Z").unwrap();
        let o = LogOptions {
            since_time: Some(since),
            ..opts()
        };
        assert_eq!(run(&o, L), "o\nthree\n");
        let o = LogOptions {
            limit_bytes: Some(6),
            ..opts()
        };
        assert_eq!(run(&o, L), "one\ntw");
        let o = LogOptions {
            stream: Some("Stdout".into()),
            ..opts()
        };
        assert_eq!(run(&o, L), "one\nthree\n");
    }
}
