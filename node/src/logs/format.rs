//! One line of a container log file, as the runtime writes it: the CRI
//! format (`2016-10-06T00:17:09.669794202Z stdout F content`, partial
//! lines tagged `P`) or Docker's JSON lines, read as kubelet reads them
//! (`staging/src/k8s.io/cri-client/pkg/logs/logs.go`).

/// Which output stream a line came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    /// stdout.
    Stdout,
    /// stderr.
    Stderr,
}

/// A parsed line; borrows from the file's bytes except for JSON lines.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message<'a> {
    /// The timestamp as written (RFC 3339, any precision).
    pub timestamp: std::borrow::Cow<'a, str>,
    /// The stream.
    pub stream: Stream,
    /// The content: with its newline for a full line, without for a
    /// partial one (`P`), so consecutive partials join.
    pub content: std::borrow::Cow<'a, [u8]>,
}

/// The two formats kubelet reads; the first line decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// CRI's.
    Cri,
    /// Docker's `json-file`.
    DockerJson,
}

fn split_space(b: &[u8]) -> Option<(&[u8], &[u8])> {
    let i = b.iter().position(|c| *c == b' ')?;
    Some((&b[..i], &b[i + 1..]))
}

/// Why a log line is in neither format (kubelet's `logs.go` texts).
#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    /// A part of a CRI line is missing (`timestamp`, `stream type`, `log tag`).
    #[error("{0} is not found")]
    Missing(&'static str),
    /// The timestamp is not UTF-8.
    #[error("timestamp is not text")]
    TimestampNotText,
    /// The timestamp is not RFC 3339.
    #[error("unexpected timestamp format {0:?}")]
    Timestamp(String),
    /// Neither `stdout` nor `stderr`.
    #[error("unexpected stream type {0:?}")]
    Stream(String),
    /// A docker line that is not its JSON.
    #[error("failed with {0} to unmarshal log")]
    Json(serde_json::Error),
    /// The first line of a log is in no known format.
    #[error("unsupported log format: {0:?}")]
    Unsupported(String),
}

/// Parses a CRI line (`line` includes its trailing newline when it has one).
pub fn parse_cri(line: &[u8]) -> Result<Message<'_>, FormatError> {
    let (ts, rest) = split_space(line).ok_or(FormatError::Missing("timestamp"))?;
    let ts = std::str::from_utf8(ts).map_err(|_| FormatError::TimestampNotText)?;
    if parse_timestamp(ts).is_none() {
        return Err(FormatError::Timestamp(ts.to_string()));
    }
    let (stream, rest) = split_space(rest).ok_or(FormatError::Missing("stream type"))?;
    let stream = match stream {
        b"stdout" => Stream::Stdout,
        b"stderr" => Stream::Stderr,
        other => {
            return Err(FormatError::Stream(
                String::from_utf8_lossy(other).into_owned(),
            ));
        }
    };
    let (tags, mut content) = split_space(rest).ok_or(FormatError::Missing("log tag"))?;
    // Tags are `:`-separated; only the first (P or F) means anything today.
    let partial = tags.split(|c| *c == b':').next() == Some(b"P");
    if partial && content.last() == Some(&b'\n') {
        content = &content[..content.len() - 1];
    }
    Ok(Message {
        timestamp: std::borrow::Cow::Borrowed(ts),
        stream,
        content: std::borrow::Cow::Borrowed(content),
    })
}

/// The messages of CRI log `data`, in order: partial lines (`P`) joined
/// with the line that completes them, each message with its newline as
/// written (a last line cut short has none). Lines that do not parse are
/// skipped, as kubelet's reader skips them.
pub fn cri_messages(data: &[u8]) -> Vec<String> {
    let mut out = Vec::new();
    let mut message: Vec<u8> = Vec::new();
    for line in data.split_inclusive(|c| *c == b'\n') {
        let Ok(m) = parse_cri(line) else {
            continue;
        };
        message.extend_from_slice(&m.content);
        if message.last() == Some(&b'\n') {
            out.push(String::from_utf8_lossy(&std::mem::take(&mut message)).into_owned());
        }
    }
    if !message.is_empty() {
        out.push(String::from_utf8_lossy(&message).into_owned());
    }
    out
}

#[derive(serde::Deserialize)]
struct JsonLine {
    #[serde(default)]
    log: String,
    #[serde(default)]
    stream: String,
    #[serde(default)]
    time: String,
}

/// Parses a Docker JSON line.
pub fn parse_docker_json(line: &[u8]) -> Result<Message<'static>, FormatError> {
    let l: JsonLine = serde_json::from_slice(line).map_err(FormatError::Json)?;
    let stream = match l.stream.as_str() {
        "stdout" => Stream::Stdout,
        "stderr" => Stream::Stderr,
        other => return Err(FormatError::Stream(other.to_string())),
    };
    Ok(Message {
        timestamp: std::borrow::Cow::Owned(l.time),
        stream,
        content: std::borrow::Cow::Owned(l.log.into_bytes()),
    })
}

/// The format of a log, from its first line.
pub fn detect(line: &[u8]) -> Result<Format, FormatError> {
    if parse_cri(line).is_ok() {
        return Ok(Format::Cri);
    }
    if parse_docker_json(line).is_ok() {
        return Ok(Format::DockerJson);
    }
    Err(FormatError::Unsupported(
        String::from_utf8_lossy(line).into_owned(),
    ))
}

/// Parses a line of a known format.
pub fn parse(format: Format, line: &[u8]) -> Result<Message<'_>, FormatError> {
    match format {
        Format::Cri => parse_cri(line),
        Format::DockerJson => parse_docker_json(line),
    }
}

/// A parsed RFC 3339 timestamp: nanoseconds since the epoch, and the
/// fixed-width form kubelet prints (`RFC3339NanoFixed`: nine fraction
/// digits, `Z` for a zero offset).
pub fn parse_timestamp(ts: &str) -> Option<i128> {
    let t: jiff::Timestamp = ts.parse().ok()?;
    Some(t.as_nanosecond())
}

/// `2006-01-02T15:04:05.000000000Z07:00` of a timestamp as written.
pub fn fixed_timestamp(ts: &str) -> Option<String> {
    let (date, rest) = ts.split_once('T')?;
    let hms = rest.get(..8)?;
    let rest = &rest[8..];
    let (frac, offset) = match rest.strip_prefix('.') {
        Some(r) => {
            let n = r.bytes().take_while(u8::is_ascii_digit).count();
            (&r[..n], &r[n..])
        }
        None => ("", rest),
    };
    if frac.len() > 9 {
        return None;
    }
    let offset = match offset {
        "Z" | "z" | "+00:00" | "-00:00" => "Z",
        o if o.len() == 6 && (o.starts_with('+') || o.starts_with('-')) => o,
        _ => return None,
    };
    Some(format!("{date}T{hms}.{frac:0<9}{offset}"))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn cri_messages_join_partials_and_skip_what_does_not_parse() {
        let data = b"2024-01-01T00:00:00.1Z stdout F one\n\
                     not a log line\n\
                     2024-01-01T00:00:00.2Z stderr P tw\n\
                     2024-01-01T00:00:00.3Z stderr F o\n\
                     2024-01-01T00:00:00.4Z stdout P cut sh";
        assert_eq!(cri_messages(data), ["one\n", "two\n", "cut sh"]);
    }

    #[test]
    fn cri_lines() {
        let m = parse_cri(b"2016-10-06T00:17:09.669794202Z stdout F log content 1\n").unwrap();
        assert_eq!(m.stream, Stream::Stdout);
        assert_eq!(&*m.content, b"log content 1\n");
        let p = parse_cri(b"2016-10-06T00:17:09.669794203Z stderr P part\n").unwrap();
        assert_eq!(p.stream, Stream::Stderr);
        assert_eq!(&*p.content, b"part");
        let tagged = parse_cri(b"2016-10-06T00:17:09Z stdout P:x part\n").unwrap();
        assert_eq!(&*tagged.content, b"part");
        assert!(parse_cri(b"nonsense").is_err());
        assert!(parse_cri(b"2016-10-06T00:17:09Z stdin F x\n").is_err());
        assert!(parse_cri(b"2016-10-06T00:17:09Z stdout\n").is_err());
    }

    #[test]
    fn docker_lines_and_detection() {
        let line =
            br#"{"log":"content 1\n","stream":"stdout","time":"2016-10-20T18:39:20.57606443Z"}"#;
        assert_eq!(detect(line).ok(), Some(Format::DockerJson));
        let m = parse_docker_json(line).unwrap();
        assert_eq!(&*m.content, b"content 1\n");
        assert_eq!(
            detect(b"2016-10-06T00:17:09.669794202Z stdout F x\n").ok(),
            Some(Format::Cri)
        );
        assert!(
            detect(b"plain text\n")
                .unwrap_err()
                .to_string()
                .contains("unsupported log format")
        );
    }

    #[test]
    fn timestamps_print_fixed_width() {
        assert_eq!(
            fixed_timestamp("2016-10-06T00:17:09.6697942Z").as_deref(),
            Some("2016-10-06T00:17:09.669794200Z")
        );
        assert_eq!(
            fixed_timestamp("2016-10-06T00:17:09Z").as_deref(),
            Some("2016-10-06T00:17:09.000000000Z")
        );
        assert_eq!(
            fixed_timestamp("2016-10-06T02:17:09.5+02:00").as_deref(),
            Some("2016-10-06T02:17:09.500000000+02:00")
        );
        assert_eq!(
            parse_timestamp("2016-10-06T02:17:09+02:00"),
            parse_timestamp("2016-10-06T00:17:09Z")
        );
    }
}
