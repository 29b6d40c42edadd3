//! The last lines a container wrote, read from its CRI log file (the format
//! kubelet's log reader reads: `<time> <stream> <P|F> <text>`, `P` lines
//! continued by the next). Only the file's tail is read, so a huge log
//! costs nothing.

use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use crate::node::logs::format::cri_messages;

/// Bytes read from the end of the file.
const TAIL_BYTES: u64 = 64 * 1024;

/// The messages of CRI log lines, partial lines joined, without their
/// newlines (the node API's parser, `node::logs::format`).
pub fn messages(text: &str) -> Vec<String> {
    cri_messages(text.as_bytes())
        .into_iter()
        .map(|m| m.strip_suffix('\n').map(str::to_string).unwrap_or(m))
        .collect()
}

/// The last `n` messages of the log file at `path`.
pub fn tail(path: &Path, n: usize) -> std::io::Result<Vec<String>> {
    let mut f = std::fs::File::open(path)?;
    let len = f.metadata()?.len();
    let start = len.saturating_sub(TAIL_BYTES);
    f.seek(SeekFrom::Start(start))?;
    let mut buf = Vec::new();
    f.take(TAIL_BYTES).read_to_end(&mut buf)?;
    let mut text = String::from_utf8_lossy(&buf).into_owned();
    if start > 0 {
        // Drop the first, cut line.
        text = text
            .split_once('\n')
            .map(|(_, rest)| rest.to_string())
            .unwrap_or_default();
    }
    let all = messages(&text);
    Ok(all[all.len().saturating_sub(n)..].to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn partial_lines_are_joined_and_only_the_tail_is_kept() {
        let text = "2025-01-01T00:00:00.1Z stdout F starting\n\
                    2025-01-01T00:00:00.2Z stderr P fatal: \n\
                    2025-01-01T00:00:00.3Z stderr F config missing\n\
                    garbage\n\
                    2025-01-01T00:00:00.4Z stdout F \n";
        assert_eq!(messages(text), ["starting", "fatal: config missing", ""]);
        let mut f = tempfile::NamedTempFile::new().expect("tmp");
        for i in 0..5000 {
            writeln!(f, "2025-01-01T00:00:00.1Z stdout F line {i}").expect("write");
        }
        let last = tail(f.path(), 3).expect("tail");
        assert_eq!(last, ["line 4997", "line 4998", "line 4999"]);
    }
}
