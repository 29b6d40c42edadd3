//! A container's log files: the live one and those log rotation left
//! (`<log>.<YYYYMMDD-hhmmss>`, older ones gzipped as `….gz`), named and
//! sorted as kubelet's `GetAllLogs` (`pkg/kubelet/logs/container_log_manager.go`),
//! and a reader that yields their bytes, inflating compressed ones.

use std::io::Write;
use std::path::{Path, PathBuf};

use tokio::io::{AsyncReadExt, AsyncSeekExt};

/// Suffix of compressed rotated logs.
pub const COMPRESS_SUFFIX: &str = ".gz";
/// Suffix of a compression in progress.
pub const TMP_SUFFIX: &str = ".tmp";

/// kubelet's `isInUse`: temporary files are not, compressed ones are, an
/// uncompressed one is unless its `.gz` twin exists.
pub fn is_in_use(l: &str, all: &[String]) -> bool {
    if l.ends_with(TMP_SUFFIX) {
        return false;
    }
    if l.ends_with(COMPRESS_SUFFIX) {
        return true;
    }
    !all.iter().any(|a| *a == format!("{l}{COMPRESS_SUFFIX}"))
}

/// The rotated files of `log` (`<log>.*`), all of them, sorted.
pub fn rotated(log: &Path) -> Vec<String> {
    let (Some(dir), Some(base)) = (log.parent(), log.file_name().and_then(|b| b.to_str())) else {
        return Vec::new();
    };
    let prefix = format!("{base}.");
    let mut out: Vec<String> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| {
                    let name = e.file_name().into_string().ok()?;
                    name.starts_with(&prefix)
                        .then(|| dir.join(&name).display().to_string())
                })
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

/// `GetAllLogs`: the rotated files in use, oldest first, then `log`.
pub fn all_logs(log: &Path) -> Vec<PathBuf> {
    let all = rotated(log);
    let mut out: Vec<PathBuf> = all
        .iter()
        .filter(|l| is_in_use(l, &all))
        .map(PathBuf::from)
        .collect();
    out.push(log.to_path_buf());
    out
}

/// Reads a log file's bytes in chunks, inflating `.gz` files.
pub enum Source {
    /// A plain file.
    Plain(tokio::fs::File),
    /// A gzipped file.
    Gz {
        /// The compressed file.
        file: tokio::fs::File,
        /// The inflater, writing into its Vec.
        decoder: Box<flate2::write::GzDecoder<Vec<u8>>>,
        /// The compressed input is spent.
        done: bool,
    },
}

impl std::fmt::Debug for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::Plain(_) => f.write_str("Source::Plain"),
            Source::Gz { .. } => f.write_str("Source::Gz"),
        }
    }
}

/// Chunk size of reads.
pub const CHUNK: usize = 64 * 1024;

impl Source {
    /// Opens `path` (gzip by its suffix).
    pub async fn open(path: &Path) -> std::io::Result<Source> {
        let file = tokio::fs::File::open(path).await?;
        if path.to_string_lossy().ends_with(COMPRESS_SUFFIX) {
            Ok(Source::Gz {
                file,
                decoder: Box::new(flate2::write::GzDecoder::new(Vec::new())),
                done: false,
            })
        } else {
            Ok(Source::Plain(file))
        }
    }

    /// Appends the next bytes to `out`; 0 at the end (a plain file may grow).
    pub async fn read_into(&mut self, out: &mut Vec<u8>) -> std::io::Result<usize> {
        match self {
            Source::Plain(f) => {
                let start = out.len();
                out.resize(start + CHUNK, 0);
                let n = f.read(&mut out[start..]).await;
                out.truncate(start + *n.as_ref().unwrap_or(&0));
                n
            }
            Source::Gz {
                file,
                decoder,
                done,
            } => loop {
                let ready = decoder.get_mut();
                if !ready.is_empty() {
                    let n = ready.len();
                    out.append(ready);
                    return Ok(n);
                }
                if *done {
                    return Ok(0);
                }
                let mut buf = vec![0u8; CHUNK];
                let n = file.read(&mut buf).await?;
                if n == 0 {
                    decoder.try_finish()?;
                    *done = true;
                } else {
                    decoder.write_all(&buf[..n])?;
                }
            },
        }
    }

    /// Seeks a plain file.
    pub async fn seek(&mut self, offset: u64) -> std::io::Result<()> {
        match self {
            Source::Plain(f) => f.seek(std::io::SeekFrom::Start(offset)).await.map(drop),
            Source::Gz { .. } => Err(std::io::Error::other("cannot seek a compressed log")),
        }
    }

    /// The inode of a plain file (to notice a rotation).
    pub async fn inode(&self) -> Option<u64> {
        use std::os::unix::fs::MetadataExt;
        match self {
            Source::Plain(f) => f.metadata().await.ok().map(|m| m.ino()),
            Source::Gz { .. } => None,
        }
    }
}

/// Where the last `n` lines of a plain file start (kubelet's
/// `findTailLineStartIndex`), or `Err(lines)` when it has fewer (then all
/// of them count). A last line without newline is a line.
pub async fn tail_offset(path: &Path, n: u64) -> std::io::Result<Result<u64, u64>> {
    let mut f = tokio::fs::File::open(path).await?;
    let len = f.metadata().await?.len();
    if n == 0 {
        return Ok(Ok(len));
    }
    let mut pos = len;
    let mut found: u64 = 0;
    let mut first = true;
    let mut buf = vec![0u8; CHUNK];
    while pos > 0 {
        let size = (pos as usize).min(CHUNK);
        pos -= size as u64;
        f.seek(std::io::SeekFrom::Start(pos)).await?;
        f.read_exact(&mut buf[..size]).await?;
        let mut end = size;
        if first {
            first = false;
            // The newline ending the last line does not start a new one.
            if buf[size - 1] == b'\n' {
                end -= 1;
            }
        }
        for i in (0..end).rev() {
            if buf[i] == b'\n' {
                found += 1;
                if found == n {
                    return Ok(Ok(pos + i as u64 + 1));
                }
            }
        }
    }
    // No more newlines: the first line counts too.
    let lines = if len == 0 { 0 } else { found + 1 };
    Ok(if lines >= n { Ok(0) } else { Err(lines) })
}

/// Lines in a (possibly compressed) file.
pub async fn count_lines(path: &Path) -> std::io::Result<u64> {
    let mut src = Source::open(path).await?;
    let mut buf = Vec::with_capacity(CHUNK);
    let (mut lines, mut last) = (0u64, b'\n');
    loop {
        buf.clear();
        if src.read_into(&mut buf).await? == 0 {
            break;
        }
        lines += buf.iter().filter(|b| **b == b'\n').count() as u64;
        if let Some(b) = buf.last() {
            last = *b;
        }
    }
    Ok(lines + u64::from(last != b'\n'))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn in_use_follows_kubelet() {
        let all: Vec<String> = ["a.log.1", "a.log.1.gz", "a.log.2", "a.log.3.gz.tmp"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert!(!is_in_use("a.log.1", &all));
        assert!(is_in_use("a.log.1.gz", &all));
        assert!(is_in_use("a.log.2", &all));
        assert!(!is_in_use("a.log.3.gz.tmp", &all));
    }

    #[tokio::test]
    async fn tails_and_counts() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("0.log");
        std::fs::write(&p, "a\nb\nc\n").unwrap();
        assert_eq!(tail_offset(&p, 1).await.unwrap(), Ok(4));
        assert_eq!(tail_offset(&p, 2).await.unwrap(), Ok(2));
        assert_eq!(tail_offset(&p, 3).await.unwrap(), Ok(0));
        assert_eq!(tail_offset(&p, 5).await.unwrap(), Err(3));
        assert_eq!(tail_offset(&p, 0).await.unwrap(), Ok(6));
        std::fs::write(&p, "a\nb").unwrap();
        assert_eq!(tail_offset(&p, 1).await.unwrap(), Ok(2));
        assert_eq!(count_lines(&p).await.unwrap(), 2);
        let gz = d.path().join("0.log.20240101-000000.gz");
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        e.write_all(b"x\ny\nz\n").unwrap();
        std::fs::write(&gz, e.finish().unwrap()).unwrap();
        assert_eq!(count_lines(&gz).await.unwrap(), 3);
        let mut src = Source::open(&gz).await.unwrap();
        let mut out = Vec::new();
        while src.read_into(&mut out).await.unwrap() > 0 {}
        assert_eq!(out, b"x\ny\nz\n");
        assert_eq!(all_logs(&p), vec![gz.clone(), p.clone()]);
    }
}
