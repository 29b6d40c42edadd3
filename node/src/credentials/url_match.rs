//! kubelet's registry URL matching (`pkg/credentialprovider/keyring.go`:
//! `ParseSchemelessURL`, `SplitURL`, `URLsMatch`, `URLsMatchStr`), used
//! for a credential provider's `matchImages`, the keys of a plugin's
//! `auth` map and the keys of a pull Secret's docker config.
//!
//! A pattern matches an image when
//! - both hosts have the same number of dot-separated parts and each part
//!   of the image matches the pattern's part as a glob (Go's
//!   `filepath.Match`: `*`, `?`, `[a-z]`, `\` escapes; one part each, so
//!   `*.io` does not match `a.b.io`),
//! - the ports are equal (no port matches only no port),
//! - the pattern's path is a prefix of the image's path (a plain string
//!   prefix, as upstream: `reg/team` also matches `reg/teamwork`).
//!
//! Parsing follows Go's `url.Parse` of `"https://" + text` for what an
//! image or a pattern can hold: the fragment (`#`) and query (`?`) are cut
//! off (so a `?` glob never reaches the host), user info before `@` is
//! dropped, the port must be digits, the host may not hold characters URLs
//! escape, and `%` escapes must be valid.

use keelson_common::gofmt;

/// A registry URL without scheme: host (with port) and path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchemelessUrl {
    /// Host and port as written (`reg.example:5000`).
    pub host: String,
    /// The unescaped path (`/team/app`), empty when none.
    pub path: String,
}

/// Go's `url.Parse` error text for `"https://" + text`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("parse {}: {reason}", gofmt::quote(url))]
pub struct UrlError {
    url: String,
    reason: String,
}

/// `ParseSchemelessURL`: parses `text` as the rest of an `https://` URL.
pub fn parse_schemeless(text: &str) -> Result<SchemelessUrl, UrlError> {
    parse_after_scheme(text, &format!("https://{text}"))
}

/// Parses an URL that may start with `http://` or `https://` (a docker
/// config key); without a scheme `https://` is assumed.
pub fn parse_with_scheme(text: &str) -> Result<SchemelessUrl, UrlError> {
    if let Some(rest) = text.strip_prefix("https://") {
        parse_after_scheme(rest, text)
    } else if let Some(rest) = text.strip_prefix("http://") {
        parse_after_scheme(rest, text)
    } else {
        parse_schemeless(text)
    }
}

fn parse_after_scheme(rest: &str, full: &str) -> Result<SchemelessUrl, UrlError> {
    let err = |reason: String| UrlError {
        url: full.to_string(),
        reason,
    };
    if full.bytes().any(|b| b < 0x20 || b == 0x7f) {
        return Err(err("net/url: invalid control character in URL".into()));
    }
    let rest = rest.split('#').next().unwrap_or_default();
    let rest = rest.split('?').next().unwrap_or_default();
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    let host = match authority.rfind('@') {
        Some(i) => &authority[i + 1..],
        None => authority,
    };
    check_host(host).map_err(err)?;
    let path = unescape(path).map_err(err)?;
    Ok(SchemelessUrl {
        host: host.to_string(),
        path,
    })
}

/// Go's `parseHost` checks for a host that is not an IPv6 literal, and the
/// literal's closing bracket otherwise.
fn check_host(host: &str) -> Result<(), String> {
    let plain = if host.starts_with('[') {
        let Some(end) = host.rfind(']') else {
            return Err("missing ']' in host".into());
        };
        let port = &host[end + 1..];
        if !valid_optional_port(port) {
            return Err(format!("invalid port {} after host", gofmt::quote(port)));
        }
        return Ok(());
    } else {
        if let Some(i) = host.rfind(':') {
            let port = &host[i..];
            if !valid_optional_port(port) {
                return Err(format!("invalid port {} after host", gofmt::quote(port)));
            }
        }
        host
    };
    let bytes = plain.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i];
        if c == b'%' {
            let escape = plain.get(i..(i + 3).min(plain.len())).unwrap_or("%");
            if escape.len() < 3 || !escape[1..].bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(format!("invalid URL escape {}", gofmt::quote(escape)));
            }
            i += 3;
            continue;
        }
        if c < 0x80 && host_char_needs_escape(c) {
            return Err(format!(
                "invalid character {} in host name",
                gofmt::quote(&(c as char).to_string())
            ));
        }
        i += 1;
    }
    Ok(())
}

/// Go's `shouldEscape(c, encodeHost)`.
fn host_char_needs_escape(c: u8) -> bool {
    !(c.is_ascii_alphanumeric() || b"!$&'()*+,;=:[]<>\"-_.~".contains(&c))
}

/// `validOptionalPort`: empty, or `:` followed by digits.
fn valid_optional_port(port: &str) -> bool {
    match port.strip_prefix(':') {
        None => port.is_empty(),
        Some(digits) => digits.bytes().all(|b| b.is_ascii_digit()),
    }
}

/// Decodes `%XX` escapes of a path.
fn unescape(path: &str) -> Result<String, String> {
    if !path.contains('%') {
        return Ok(path.to_string());
    }
    let bytes = path.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let escape = path.get(i..(i + 3).min(path.len())).unwrap_or("%");
            match (escape.len() == 3)
                .then(|| u8::from_str_radix(&escape[1..], 16).ok())
                .flatten()
            {
                Some(b) => out.push(b),
                None => return Err(format!("invalid URL escape {}", gofmt::quote(escape))),
            }
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    Ok(String::from_utf8_lossy(&out).into_owned())
}

/// `SplitURL`: the host's dot-separated parts and the port (`""` when the
/// host has none or `net.SplitHostPort` refuses it).
pub fn split_url(url: &SchemelessUrl) -> (Vec<&str>, &str) {
    let (host, port) = split_host_port(&url.host).unwrap_or((url.host.as_str(), ""));
    (host.split('.').collect(), port)
}

/// Go's `net.SplitHostPort`, `None` where it returns an error.
fn split_host_port(hostport: &str) -> Option<(&str, &str)> {
    if let Some(rest) = hostport.strip_prefix('[') {
        let end = rest.find(']')?;
        let port = rest[end + 1..].strip_prefix(':')?;
        if port.contains(':') {
            return None;
        }
        return Some((&rest[..end], port));
    }
    let i = hostport.rfind(':')?;
    let host = &hostport[..i];
    if host.contains(':') || host.contains('[') || host.contains(']') {
        return None;
    }
    Some((host, &hostport[i + 1..]))
}

/// A glob that Go's `filepath.Match` refuses (`ErrBadPattern`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("syntax error in pattern")]
pub struct BadPattern;

/// `URLsMatch`: does `target` match the pattern `glob`?
pub fn urls_match(glob: &SchemelessUrl, target: &SchemelessUrl) -> Result<bool, BadPattern> {
    let (glob_parts, glob_port) = split_url(glob);
    let (target_parts, target_port) = split_url(target);
    if glob_port != target_port || glob_parts.len() != target_parts.len() {
        return Ok(false);
    }
    if !target.path.starts_with(&glob.path) {
        return Ok(false);
    }
    for (g, t) in glob_parts.iter().zip(&target_parts) {
        if !glob_match(g, t)? {
            return Ok(false);
        }
    }
    Ok(true)
}

/// `URLsMatchStr`: [`urls_match`] on texts; a text that does not parse
/// or a bad glob is an error (callers treat it as no match).
pub fn urls_match_str(glob: &str, target: &str) -> Result<bool, MatchError> {
    let g = parse_schemeless(glob).map_err(MatchError::Url)?;
    let t = parse_schemeless(target).map_err(MatchError::Url)?;
    urls_match(&g, &t).map_err(MatchError::Pattern)
}

/// Why [`urls_match_str`] could not compare.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MatchError {
    /// A text is not an URL.
    #[error(transparent)]
    Url(UrlError),
    /// The glob is malformed.
    #[error(transparent)]
    Pattern(BadPattern),
}

/// Go's `filepath.Match` on one host part (which holds no `/`).
pub fn glob_match(pattern: &str, name: &str) -> Result<bool, BadPattern> {
    let p: Vec<char> = pattern.chars().collect();
    let n: Vec<char> = name.chars().collect();
    let matched = match_from(&p, &n)?;
    if !matched {
        // Go reports a malformed pattern even when an earlier part did
        // not match; check the whole pattern's syntax.
        check_syntax(&p)?;
    }
    Ok(matched)
}

fn match_from(p: &[char], n: &[char]) -> Result<bool, BadPattern> {
    let Some((&c, rest)) = p.split_first() else {
        return Ok(n.is_empty());
    };
    match c {
        '*' => {
            // Collapse runs of stars, then try every split.
            let rest_start = p.iter().take_while(|&&c| c == '*').count();
            let rest = &p[rest_start..];
            for i in 0..=n.len() {
                if match_from(rest, &n[i..])? {
                    return Ok(true);
                }
            }
            Ok(false)
        }
        '?' => match n.split_first() {
            Some((_, n_rest)) => match_from(rest, n_rest),
            None => Ok(false),
        },
        '[' => {
            let (matched_class, after) = match_class(rest, n.first().copied())?;
            match (matched_class, n.split_first()) {
                (true, Some((_, n_rest))) => match_from(after, n_rest),
                _ => Ok(false),
            }
        }
        '\\' => {
            let Some((&lit, after)) = rest.split_first() else {
                return Err(BadPattern);
            };
            match n.split_first() {
                Some((&h, n_rest)) if h == lit => match_from(after, n_rest),
                _ => Ok(false),
            }
        }
        lit => match n.split_first() {
            Some((&h, n_rest)) if h == lit => match_from(rest, n_rest),
            _ => Ok(false),
        },
    }
}

/// Matches a character class (the text after `[`) against `c`; returns
/// whether it matched and the pattern after the closing `]`.
fn match_class(p: &[char], c: Option<char>) -> Result<(bool, &[char]), BadPattern> {
    let mut i = 0;
    let negated = p.first() == Some(&'^');
    if negated {
        i += 1;
    }
    let mut matched = false;
    let mut first = true;
    loop {
        let Some(&ch) = p.get(i) else {
            return Err(BadPattern);
        };
        if ch == ']' && !first {
            i += 1;
            break;
        }
        first = false;
        let (lo, next) = class_char(p, i)?;
        let (hi, next) = if p.get(next) == Some(&'-') {
            let (hi, after) = class_char(p, next + 1)?;
            (hi, after)
        } else {
            (lo, next)
        };
        if hi < lo {
            return Err(BadPattern);
        }
        if let Some(c) = c
            && lo <= c
            && c <= hi
        {
            matched = true;
        }
        i = next;
    }
    Ok((matched != negated, &p[i..]))
}

fn class_char(p: &[char], i: usize) -> Result<(char, usize), BadPattern> {
    match p.get(i) {
        None | Some('-') | Some(']') => Err(BadPattern),
        Some('\\') => p.get(i + 1).map(|&c| (c, i + 2)).ok_or(BadPattern),
        Some(&c) => Ok((c, i + 1)),
    }
}

fn check_syntax(p: &[char]) -> Result<(), BadPattern> {
    let mut i = 0;
    while i < p.len() {
        match p[i] {
            '\\' => {
                if i + 1 >= p.len() {
                    return Err(BadPattern);
                }
                i += 2;
            }
            '[' => {
                let (_, after) = match_class(&p[i + 1..], None)?;
                i = p.len() - after.len();
            }
            _ => i += 1,
        }
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    fn m(glob: &str, target: &str) -> bool {
        urls_match_str(glob, target).unwrap_or(false)
    }

    // The cases of upstream's keyring_test.go `TestURLsMatch`.
    #[test]
    fn globs_ports_and_paths_as_kubelet() {
        assert!(m("*.kubernetes.io", "prefix.kubernetes.io"));
        assert!(m("prefix.*.io", "prefix.kubernetes.io"));
        assert!(m("prefix.kubernetes.*", "prefix.kubernetes.io"));
        assert!(m("*-good.kubernetes.io", "prefix-good.kubernetes.io"));
        assert!(!m("*.kubernetes.io", "kubernetes.io"));
        assert!(!m("*.io", "a.b.io"), "one glob is one part");
        assert!(m("*.*.io", "a.b.io"));
        assert!(m("registry.io:8080/path", "registry.io:8080/path/app"));
        assert!(!m("registry.io:8080/path", "registry.io/path/app"));
        assert!(
            !m("registry.io", "registry.io:8080/app"),
            "ports must be equal"
        );
        assert!(!m("registry.io/path", "registry.io/other"));
        assert!(
            m("registry.io/team", "registry.io/teamwork"),
            "a string prefix"
        );
        assert!(m(
            "123456789.dkr.ecr.us-east-1.amazonaws.com",
            "123456789.dkr.ecr.us-east-1.amazonaws.com/app"
        ));
        assert!(m(
            "*.dkr.ecr.*.amazonaws.com",
            "123456789.dkr.ecr.us-east-1.amazonaws.com/app"
        ));
        assert!(m("gcr.io", "gcr.io/project/app"));
        assert!(m("k8s.*", "k8s.io"));
        assert!(m("x[a-c].example", "xb.example"));
        assert!(!m("x[^a-c].example", "xb.example"));
        // A host starting with '[' is an IPv6 literal to Go: "[a-c].example"
        // does not parse (".example" is no port).
        assert!(parse_schemeless("[a-c].example").is_err());
        assert!(m("localhost:5000", "localhost:5000/app"));
    }

    #[test]
    fn a_question_mark_starts_the_query_as_in_go() {
        // "reg?.io" is host "reg" and query ".io".
        let u = parse_schemeless("reg?.io").unwrap();
        assert_eq!(u.host, "reg");
        assert!(!m("reg?.io", "reg1.io"));
    }

    #[test]
    fn go_parse_errors() {
        assert_eq!(
            parse_schemeless("foo bar").unwrap_err().to_string(),
            r#"parse "https://foo bar": invalid character " " in host name"#
        );
        assert_eq!(
            parse_schemeless("reg.io:abc/x").unwrap_err().to_string(),
            r#"parse "https://reg.io:abc/x": invalid port ":abc" after host"#
        );
        assert_eq!(
            parse_schemeless("reg.io/%zz").unwrap_err().to_string(),
            r#"parse "https://reg.io/%zz": invalid URL escape "%zz""#
        );
        assert!(parse_schemeless("bad\u{1}host").is_err());
        assert!(parse_schemeless("*.azurecr.io").is_ok());
        assert!(parse_schemeless("[::1]:5000/x").is_ok());
    }

    #[test]
    fn malformed_globs_are_errors() {
        assert_eq!(glob_match("[", "a"), Err(BadPattern));
        assert_eq!(glob_match("a\\", "b"), Err(BadPattern));
        assert_eq!(glob_match("[z-a]", "b"), Err(BadPattern));
        assert_eq!(glob_match("a*", "abc"), Ok(true));
        assert_eq!(glob_match("a?c", "abc"), Ok(true));
        assert_eq!(glob_match("a\\*", "a*"), Ok(true));
    }
}
