//! Formatting that matches Go's, so messages read exactly like the ones
//! kubelet and kube-proxy write into events and logs (`%q` quoting,
//! `time.Duration` printing and the syscall error texts of Go's `net`
//! package).

use std::fmt::Write as _;
use std::io;
use std::time::Duration;

/// Quotes `s` like Go's `strconv.Quote` / `%q`: printable characters stay,
/// `"` and `\` are escaped, control and other non-printable characters
/// become `\n`, `\t`, `\xNN`, `\uNNNN` or `\UNNNNNNNN`.
pub fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{7}' => out.push_str("\\a"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{b}' => out.push_str("\\v"),
            c if go_printable(c) => out.push(c),
            c if (c as u32) < 0x80 => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c if (c as u32) < 0x10000 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => {
                let _ = write!(out, "\\U{:08x}", c as u32);
            }
        }
    }
    out.push('"');
    out
}

/// A Go string of arbitrary bytes as the API server shows it. kubelet
/// sends the bytes a container wrote (exec probe output in an event,
/// termination messages) as they are, over protobuf; the API server's
/// JSON encoder (`encoding/json`, which decodes with
/// `utf8.DecodeRuneInString`) writes each byte that is not part of valid
/// UTF-8 as one U+FFFD. `String::from_utf8_lossy` differs where a
/// multi-byte character was cut: it writes one U+FFFD for the cut
/// sequence, Go one per byte left of it.
pub fn api_text(mut bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len());
    loop {
        match std::str::from_utf8(bytes) {
            Ok(s) => {
                out.push_str(s);
                return out;
            }
            Err(e) => {
                let (valid, rest) = bytes.split_at(e.valid_up_to());
                out.push_str(std::str::from_utf8(valid).unwrap_or_default());
                out.push(char::REPLACEMENT_CHARACTER);
                bytes = rest.get(1..).unwrap_or_default();
            }
        }
    }
}

/// Cuts `s`, a text made by [`api_text`], as kubelet's `s[:max]` cuts the
/// bytes it stands for (`normalizeStatus` in
/// `pkg/kubelet/status/status_manager.go`): a U+FFFD counts as the one
/// invalid byte it replaced, a character cut in the middle leaves one
/// U+FFFD per byte kept. (A U+FFFD that the container wrote as such, 3
/// bytes, is counted as one: the only case where this keeps more than
/// kubelet.)
pub fn cut_api_text(s: &mut String, max: usize) {
    let mut used = 0;
    let mut cut = None;
    for (i, c) in s.char_indices() {
        let cost = if c == char::REPLACEMENT_CHARACTER {
            1
        } else {
            c.len_utf8()
        };
        if used + cost > max {
            cut = Some((i, max - used));
            break;
        }
        used += cost;
    }
    if let Some((at, partial)) = cut {
        s.truncate(at);
        s.extend(std::iter::repeat_n(char::REPLACEMENT_CHARACTER, partial));
    }
}

/// Go's `unicode.IsPrint` for the characters that matter in labels and
/// annotations: the ASCII space is printable, every other space, control
/// and format character is not.
fn go_printable(c: char) -> bool {
    if c == ' ' {
        return true;
    }
    if c.is_control() || c.is_whitespace() {
        return false;
    }
    let u = c as u32;
    // Format characters (Cf), surrogates/private use/unassigned noncharacters.
    !matches!(u,
        0xad | 0x600..=0x605 | 0x61c | 0x6dd | 0x70f | 0x180e | 0x200b..=0x200f
        | 0x202a..=0x202e | 0x2060..=0x2064 | 0x2066..=0x206f | 0xfeff
        | 0xfff9..=0xfffb | 0xe000..=0xf8ff | 0xfffe | 0xffff
        | 0xf0000..=0x10ffff)
}

/// Prints a duration like Go's `time.Duration.String` (`1s`, `1m30s`,
/// `500ms`, `1h0m0s`).
pub fn duration(d: Duration) -> String {
    let nanos = d.as_nanos();
    if nanos == 0 {
        return "0s".to_string();
    }
    if nanos < 1_000_000_000 {
        let (unit, div) = if nanos < 1_000 {
            ("ns", 1u128)
        } else if nanos < 1_000_000 {
            ("µs", 1_000)
        } else {
            ("ms", 1_000_000)
        };
        return format!("{}{unit}", fraction(nanos, div));
    }
    let total_secs = d.as_secs();
    let hours = total_secs / 3600;
    let minutes = (total_secs % 3600) / 60;
    let secs_nanos = u128::from(total_secs % 60) * 1_000_000_000 + u128::from(d.subsec_nanos());
    let secs = fraction(secs_nanos, 1_000_000_000);
    if hours > 0 {
        format!("{hours}h{minutes}m{secs}s")
    } else if minutes > 0 {
        format!("{minutes}m{secs}s")
    } else {
        format!("{secs}s")
    }
}

/// `value / div` printed with the shortest exact decimal fraction.
fn fraction(value: u128, div: u128) -> String {
    let whole = value / div;
    let mut rem = value % div;
    if rem == 0 {
        return whole.to_string();
    }
    let mut digits = String::new();
    let mut scale = div;
    while rem > 0 && scale > 1 {
        scale /= 10;
        let digit = rem / scale;
        digits.push(char::from(b'0' + u8::try_from(digit).unwrap_or(0)));
        rem %= scale;
    }
    format!("{whole}.{digits}")
}

/// The text Go's `syscall.Errno.Error()` gives for an OS error, e.g.
/// `connection refused` (Rust prints `Connection refused (os error 111)`).
pub fn os_error_text(err: &io::Error) -> String {
    if err.raw_os_error().is_some() {
        let text = err.to_string();
        let text = match text.rfind(" (os error ") {
            Some(at) => text[..at].to_string(),
            None => text,
        };
        lower_first(&text)
    } else {
        err.to_string()
    }
}

/// The text of Go's `*fs.PathError` for an OS error: `<op> <path>: <errno
/// text>`, e.g. `mkdir /var/log/pods/x: file name too long` (what
/// `os.MkdirAll` returns when the last directory cannot be made).
pub fn path_error_text(op: &str, path: &std::path::Path, err: &io::Error) -> String {
    format!("{op} {}: {}", path.display(), os_error_text(err))
}

fn lower_first(s: &str) -> String {
    let mut chars = s.chars();
    match chars.next() {
        Some(first) => first.to_lowercase().collect::<String>() + chars.as_str(),
        None => String::new(),
    }
}

/// Joins host and port like Go's `net.JoinHostPort` (brackets for IPv6).
pub fn join_host_port(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The cut characters that kubelet's byte cuts leave show as Go's JSON
    /// encoder shows them: one U+FFFD per byte (seen from kubelet v1.36.2
    /// in the upstream hostile_objects case: a termination message of
    /// `€`s cut to 4096 and then 2457 bytes ends in two).
    #[test]
    fn api_text_replaces_each_invalid_byte() {
        assert_eq!(api_text("a€".as_bytes()), "a€");
        // `€` is E2 82 AC: two bytes of it left at the end, one at the start.
        assert_eq!(api_text(&"€€".as_bytes()[..5]), "€\u{fffd}\u{fffd}");
        assert_eq!(api_text(&"€€".as_bytes()[2..]), "\u{fffd}€");
        assert_eq!(
            api_text(&[0xe2, 0x82, b'x', 0xff]),
            "\u{fffd}\u{fffd}x\u{fffd}"
        );
        // A surrogate's encoding is invalid in Go as in Rust.
        assert_eq!(api_text(&[0xed, 0xa0, 0x80]), "\u{fffd}\u{fffd}\u{fffd}");
    }

    #[test]
    fn path_errors_read_like_go() {
        let e = io::Error::from_raw_os_error(36);
        assert_eq!(
            path_error_text("mkdir", std::path::Path::new("/l/ns_p_u"), &e),
            "mkdir /l/ns_p_u: file name too long"
        );
    }

    #[test]
    fn cut_api_text_cuts_bytes_as_kubelet() {
        let raw = "x€€€".as_bytes();
        for max in 0..=raw.len() + 1 {
            let mut s = api_text(raw);
            cut_api_text(&mut s, max);
            assert_eq!(s, api_text(&raw[..max.min(raw.len())]), "cut at {max}");
        }
        // An already cut text is cut again at its byte count: unchanged.
        let mut s = api_text(&raw[..6]);
        let before = s.clone();
        cut_api_text(&mut s, 6);
        assert_eq!(s, before);
    }

    #[test]
    fn quotes_like_go() {
        assert_eq!(quote("sh -c exit 1"), "\"sh -c exit 1\"");
        assert_eq!(quote("a\"b\\c\n"), "\"a\\\"b\\\\c\\n\"");
        assert_eq!(quote("\u{1}"), "\"\\x01\"");
        assert_eq!(quote("héllo ✓"), "\"héllo ✓\"");
        assert_eq!(quote("a\tb"), "\"a\\tb\"");
        assert_eq!(quote("\u{a0}"), "\"\\u00a0\"");
        assert_eq!(quote("\u{7f}"), "\"\\x7f\"");
    }

    #[test]
    fn durations_like_go() {
        assert_eq!(duration(Duration::from_secs(1)), "1s");
        assert_eq!(duration(Duration::from_secs(90)), "1m30s");
        assert_eq!(duration(Duration::from_secs(3600)), "1h0m0s");
        assert_eq!(duration(Duration::from_millis(500)), "500ms");
        assert_eq!(duration(Duration::from_millis(1500)), "1.5s");
        assert_eq!(duration(Duration::from_micros(1500)), "1.5ms");
        assert_eq!(duration(Duration::ZERO), "0s");
    }

    #[test]
    fn os_errors_read_like_go() {
        let refused = io::Error::from_raw_os_error(111);
        assert_eq!(os_error_text(&refused), "connection refused");
        let unreachable = io::Error::from_raw_os_error(113);
        assert_eq!(os_error_text(&unreachable), "no route to host");
    }

    #[test]
    fn joins_ipv6_in_brackets() {
        assert_eq!(join_host_port("10.0.0.1", 80), "10.0.0.1:80");
        assert_eq!(join_host_port("fd00::1", 8080), "[fd00::1]:8080");
    }
}
