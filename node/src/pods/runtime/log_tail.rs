//! Bounded reads of what a container left behind, as kubelet reads them
//! for a termination message: the end of the termination-message file
//! (`tail.ReadAtMost`, at most 4 KiB) and the end of its CRI log
//! (`readLastStringFromContainerLogs`: the last 80 lines found by reading
//! backwards in 1 KiB blocks, then at most the last 2048 bytes of their
//! text). Neither ever reads a whole file, so a container writing a huge
//! file cannot make keelson allocate it; callers run these off the async
//! threads (they are plain blocking file I/O).

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use keelson_common::gofmt;

/// `MaxContainerTerminationMessageLength`.
pub const MAX_TERMINATION_MESSAGE_LENGTH: u64 = 4 * 1024;
/// `MaxContainerTerminationMessageLogLength`.
pub const MAX_TERMINATION_MESSAGE_LOG_LENGTH: usize = 2048;
/// `MaxContainerTerminationMessageLogLines`.
pub const MAX_TERMINATION_MESSAGE_LOG_LINES: usize = 80;
/// The block size of the backwards line search (cri-client's `blockSize`).
const BLOCK: u64 = 1024;
/// Longest tail read for the last lines (containerd splits log lines at
/// 16 KiB, so 80 lines stay well below this).
const MAX_TAIL_BYTES: u64 = 4 << 20;

/// `tail.ReadAtMost`: the last `max` bytes of a file.
pub fn read_at_most(path: &Path, max: u64) -> std::io::Result<Vec<u8>> {
    let mut f = File::open(path)?;
    let size = f.metadata()?.len();
    let n = size.min(max);
    f.seek(SeekFrom::Start(size - n))?;
    let mut out = Vec::with_capacity(usize::try_from(n).unwrap_or(0));
    f.take(n).read_to_end(&mut out)?;
    Ok(out)
}

/// cri-client's `findTailLineStartIndex`: the offset where the last `n`
/// complete lines start (an unterminated last line does not count).
fn tail_line_start(f: &mut File, n: usize) -> std::io::Result<u64> {
    let size = f.seek(SeekFrom::End(0))?;
    let mut count = 0usize;
    let mut left = size;
    let mut block = Vec::new();
    let mut right = size;
    // Bounded: past MAX_TAIL_BYTES the lines start where the search stopped
    // (the cut line is malformed and skipped like any malformed line).
    while right > 0 && count <= n && size - right < MAX_TAIL_BYTES {
        left = right.saturating_sub(BLOCK);
        block.resize(usize::try_from(right - left).unwrap_or(0), 0);
        f.seek(SeekFrom::Start(left))?;
        f.read_exact(&mut block)?;
        count += block.iter().filter(|&&b| b == b'\n').count();
        right = left;
    }
    let mut skip = 0usize;
    while count > n {
        match block[skip..].iter().position(|&b| b == b'\n') {
            Some(i) => skip += i + 1,
            None => break,
        }
        count -= 1;
    }
    Ok(left + skip as u64)
}

/// The content of one CRI log line (`<time> <stream> <tag> <text>`): the
/// text with its newline, or without it for a partial (`P`) line; `None`
/// for a malformed line (kubelet skips those).
fn cri_line_content(line: &[u8]) -> Option<&[u8]> {
    let mut fields = line.splitn(4, |&b| b == b' ');
    let _time = fields.next()?;
    let stream = fields.next()?;
    if stream != b"stdout" && stream != b"stderr" {
        return None;
    }
    let tag = fields.next()?;
    let text = fields.next()?;
    let partial = tag.split(|&b| b == b':').next() == Some(b"P");
    Some(if partial {
        text.strip_suffix(b"\n").unwrap_or(text)
    } else {
        text
    })
}

/// `readLastStringFromContainerLogs`: the text of the last 80 log lines,
/// at most the last 2048 bytes of it (a character may be cut: shown as
/// the API server shows kubelet's bytes, [`gofmt::api_text`]).
pub fn last_log_text(path: &Path) -> String {
    let read = || -> std::io::Result<Vec<u8>> {
        let mut f = File::open(path)?;
        let start = tail_line_start(&mut f, MAX_TERMINATION_MESSAGE_LOG_LINES)?;
        let size = f.seek(SeekFrom::End(0))?;
        let start = start.max(size.saturating_sub(MAX_TAIL_BYTES));
        f.seek(SeekFrom::Start(start))?;
        let mut data = Vec::new();
        f.take(size - start).read_to_end(&mut data)?;
        Ok(data)
    };
    let data = match read() {
        Ok(d) => d,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return format!(
                "Error on reading termination message from logs: failed to try resolving symlinks in path {:?}: lstat {}: no such file or directory",
                path.display().to_string(),
                path.display()
            );
        }
        Err(e) => return format!("Error on reading termination message from logs: {e}"),
    };
    let mut text: Vec<u8> = Vec::new();
    for line in data.split_inclusive(|&b| b == b'\n') {
        if let Some(c) = cri_line_content(line) {
            text.extend_from_slice(c);
        }
    }
    let cut = text
        .len()
        .saturating_sub(MAX_TERMINATION_MESSAGE_LOG_LENGTH);
    gofmt::api_text(&text[cut..])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_at_most_takes_the_end() {
        let dir = tempfile::tempdir().expect("tmp");
        let p = dir.path().join("msg");
        std::fs::write(&p, vec![b'a'; 10_000]).expect("w");
        std::fs::write(&p, [vec![b'a'; 10_000], b"END".to_vec()].concat()).expect("w");
        let d = read_at_most(&p, MAX_TERMINATION_MESSAGE_LENGTH).expect("read");
        assert_eq!(d.len(), 4096);
        assert!(d.ends_with(b"END"));
        std::fs::write(&p, "short").expect("w");
        assert_eq!(read_at_most(&p, 4096).expect("read"), b"short");
    }

    #[test]
    fn last_lines_of_a_cri_log() {
        let dir = tempfile::tempdir().expect("tmp");
        let p = dir.path().join("0.log");
        std::fs::write(
            &p,
            "2024-01-01T00:00:00.000000001Z stdout F first\n\
             garbage\n\
             2024-01-01T00:00:00.000000002Z stderr P part\n\
             2024-01-01T00:00:00.000000003Z stderr F ial\n",
        )
        .expect("w");
        assert_eq!(last_log_text(&p), "first\npartial\n");
    }

    #[test]
    fn only_the_last_80_lines_and_2048_bytes() {
        let dir = tempfile::tempdir().expect("tmp");
        let p = dir.path().join("0.log");
        let mut text = String::new();
        for i in 0..5000 {
            text.push_str(&format!("2024-01-01T00:00:00Z stdout F line {i}\n"));
        }
        std::fs::write(&p, &text).expect("w");
        let got = last_log_text(&p);
        let want: String = (4920..5000).map(|i| format!("line {i}\n")).collect();
        assert_eq!(got, want);
        // Long lines: the last 2048 bytes only.
        let long = format!("2024-01-01T00:00:00Z stdout F {}END\n", "x".repeat(5000));
        std::fs::write(&p, long).expect("w");
        let got = last_log_text(&p);
        assert_eq!(got.len(), 2048);
        assert!(got.ends_with("END\n"));
    }

    #[test]
    fn a_huge_log_is_not_read_whole() {
        let dir = tempfile::tempdir().expect("tmp");
        let p = dir.path().join("0.log");
        // One 64 MiB line without a newline, then a last line.
        let f = File::create(&p).expect("create");
        f.set_len(64 << 20).expect("len");
        drop(f);
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&p)
            .expect("open");
        std::io::Write::write_all(&mut f, b"\n2024-01-01T00:00:00Z stdout F bye\n").expect("w");
        assert_eq!(last_log_text(&p), "bye\n");
    }
}
