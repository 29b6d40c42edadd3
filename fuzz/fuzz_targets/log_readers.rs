//! The readers of what a container writes: its CRI log lines
//! (node/src/logs/format.rs: CRI and Docker JSON lines, timestamps, the
//! format detection and the joined messages), and the termination message
//! and its log fallback (node/src/pods/runtime/log_tail.rs: `read_at_most`,
//! `last_log_text`), read from a real file holding the input.
//! Holds: no panic; a CRI line's content is the end of the line; a parsed
//! timestamp prints in the fixed form that parses to the same instant; the
//! termination message is the file's last 4096 bytes; the log fallback is
//! at most 2048 bytes of text.
#![no_main]

use std::path::PathBuf;
use std::sync::OnceLock;

use keelson_node::logs::format::{self, Format};
use keelson_node::pods::runtime::log_tail::{
    MAX_TERMINATION_MESSAGE_LENGTH, MAX_TERMINATION_MESSAGE_LOG_LENGTH, last_log_text, read_at_most,
};
use libfuzzer_sys::fuzz_target;

fn scratch() -> &'static PathBuf {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| std::env::temp_dir().join(format!("keelson-fuzz-log-{}", std::process::id())))
}

fuzz_target!(|data: &[u8]| {
    for line in data.split_inclusive(|c| *c == b'\n') {
        if let Ok(m) = format::parse(Format::Cri, line) {
            assert!(
                line.ends_with(&m.content) || line.ends_with(&[&m.content[..], b"\n"].concat())
            );
            assert!(format::parse_timestamp(&m.timestamp).is_some());
            if let Some(fixed) = format::fixed_timestamp(&m.timestamp) {
                assert_eq!(
                    format::parse_timestamp(&fixed),
                    format::parse_timestamp(&m.timestamp),
                    "{fixed:?} is not {:?}",
                    m.timestamp
                );
            }
        }
        let _ = format::parse(Format::DockerJson, line);
        let _ = format::detect(line);
    }
    let messages = format::cri_messages(data);
    assert!(messages.iter().all(|m| !m.is_empty()));

    let path = scratch();
    if std::fs::write(path, data).is_err() {
        return;
    }
    let msg = read_at_most(path, MAX_TERMINATION_MESSAGE_LENGTH).unwrap_or_default();
    let keep = data.len().min(MAX_TERMINATION_MESSAGE_LENGTH as usize);
    assert_eq!(msg, &data[data.len() - keep..]);
    let text = last_log_text(path);
    assert!(text.chars().count() <= MAX_TERMINATION_MESSAGE_LOG_LENGTH);
});
