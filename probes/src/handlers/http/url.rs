//! The few URL operations an HTTP probe needs: building the probe URL from
//! scheme, host, port and path (upstream `formatURL`), printing it like Go's
//! `url.URL.String`, and resolving a redirect's `Location` against it.

use std::fmt;

use keelson_common::gofmt;

/// An absolute `http`/`https` (or other, rejected later) URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeUrl {
    /// Lower-case scheme.
    pub scheme: String,
    /// Host name or IP literal, without IPv6 brackets.
    pub host: String,
    /// Port (explicit, or the scheme's default).
    pub port: u16,
    /// Whether the port was written in the URL.
    pub explicit_port: bool,
    /// Escaped path, always starting with `/`.
    pub path: String,
    /// Escaped query, without `?`; `None` when the URL has no `?`.
    pub query: Option<String>,
}

impl ProbeUrl {
    /// The URL of a probe: `scheme://host:port` plus `path` (which may carry
    /// a query; a fragment is dropped).
    pub fn for_probe(scheme: &str, host: &str, port: u16, path: &str) -> ProbeUrl {
        let (path, query) = split_reference(path);
        ProbeUrl {
            scheme: scheme.to_string(),
            host: host.to_string(),
            port,
            explicit_port: true,
            path: absolute_path(&escape(path, false)),
            query: query.map(|q| escape(q, true)),
        }
    }

    /// `host:port` as Go writes the URL's `Host` (port only when explicit).
    pub fn authority(&self) -> String {
        if self.explicit_port {
            gofmt::join_host_port(&self.host, self.port)
        } else if self.host.contains(':') {
            format!("[{}]", self.host)
        } else {
            self.host.clone()
        }
    }

    /// The request target: path plus query.
    pub fn request_target(&self) -> String {
        match &self.query {
            Some(q) => format!("{}?{q}", self.path),
            None => self.path.clone(),
        }
    }

    /// Resolves a `Location` header value against this URL (RFC 3986
    /// reference resolution). Returns the new URL and whether the reference
    /// was absolute (had a scheme).
    pub(crate) fn resolve(&self, location: &str) -> Result<(ProbeUrl, bool), super::HttpError> {
        let (reference, _) = location.split_once('#').unwrap_or((location, ""));
        if let Some((scheme, rest)) = split_scheme(reference) {
            let url = parse_network_path(&scheme.to_ascii_lowercase(), rest)
                .ok_or_else(|| super::HttpError::Location(location.to_string()))?;
            return Ok((url, true));
        }
        if reference.starts_with("//") {
            let url = parse_network_path(&self.scheme, reference)
                .ok_or_else(|| super::HttpError::Location(location.to_string()))?;
            return Ok((url, false));
        }
        let (path, query) = split_reference(reference);
        let mut url = self.clone();
        if path.is_empty() {
            if let Some(q) = query {
                url.query = Some(escape(q, true));
            }
            return Ok((url, false));
        }
        let merged = if path.starts_with('/') {
            path.to_string()
        } else {
            let dir = match self.path.rfind('/') {
                Some(at) => &self.path[..=at],
                None => "/",
            };
            format!("{dir}{path}")
        };
        url.path = absolute_path(&remove_dot_segments(&escape(&merged, false)));
        url.query = query.map(|q| escape(q, true));
        Ok((url, false))
    }
}

impl fmt::Display for ProbeUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}://{}{}",
            self.scheme,
            self.authority(),
            self.request_target()
        )
    }
}

/// Splits `scheme:rest` when the text starts with a valid scheme.
fn split_scheme(s: &str) -> Option<(&str, &str)> {
    let colon = s.find(':')?;
    let scheme = &s[..colon];
    let mut chars = scheme.chars();
    let first = chars.next()?;
    if !first.is_ascii_alphabetic()
        || !chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
    {
        return None;
    }
    Some((scheme, &s[colon + 1..]))
}

/// Parses `//authority/path?query` under `scheme`.
fn parse_network_path(scheme: &str, rest: &str) -> Option<ProbeUrl> {
    let rest = rest.strip_prefix("//")?;
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let authority = &rest[..end];
    let (path, query) = split_reference(&rest[end..]);
    let authority = authority
        .rsplit_once('@')
        .map_or(authority, |(_, host)| host);
    let default_port = match scheme {
        "https" => 443,
        _ => 80,
    };
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        let (host, after) = v6.split_once(']')?;
        match after.strip_prefix(':') {
            Some(p) if !p.is_empty() => (host, Some(p.parse::<u16>().ok()?)),
            _ => (host, None),
        }
    } else {
        match authority.rsplit_once(':') {
            Some((host, p)) if !p.is_empty() => (host, Some(p.parse::<u16>().ok()?)),
            Some((host, _)) => (host, None),
            None => (authority, None),
        }
    };
    if host.is_empty() {
        return None;
    }
    Some(ProbeUrl {
        scheme: scheme.to_string(),
        host: host.to_string(),
        port: port.unwrap_or(default_port),
        explicit_port: port.is_some(),
        path: absolute_path(&remove_dot_segments(&escape(path, false))),
        query: query.map(|q| escape(q, true)),
    })
}

/// Splits a reference into path and query, dropping any fragment.
fn split_reference(s: &str) -> (&str, Option<&str>) {
    let s = s.split_once('#').map_or(s, |(before, _)| before);
    match s.split_once('?') {
        Some((path, query)) => (path, Some(query)),
        None => (s, None),
    }
}

fn absolute_path(path: &str) -> String {
    if path.starts_with('/') {
        path.to_string()
    } else {
        format!("/{path}")
    }
}

/// Percent-encodes what may not appear in a request target, keeping valid
/// escapes and everything Go would leave as written.
fn escape(s: &str, query: bool) -> String {
    let bytes = s.as_bytes();
    let mut out = String::with_capacity(s.len());
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        let keep = b.is_ascii_alphanumeric()
            || matches!(
                b,
                b'-' | b'.' | b'_' | b'~' | b'!' | b'$' | b'&' | b'\'' | b'(' | b')' | b'*' | b'+'
            )
            || matches!(b, b',' | b';' | b'=' | b':' | b'@' | b'/')
            || (query && b == b'?')
            || (b == b'%'
                && i + 2 < bytes.len()
                && bytes[i + 1].is_ascii_hexdigit()
                && bytes[i + 2].is_ascii_hexdigit());
        if keep {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
        i += 1;
    }
    out
}

/// RFC 3986 section 5.2.4.
fn remove_dot_segments(path: &str) -> String {
    let mut out: Vec<&str> = Vec::new();
    let trailing = path.ends_with("/.") || path.ends_with("/..") || path == "." || path == "..";
    for segment in path.split('/') {
        match segment {
            "." => {}
            ".." => {
                if out.len() > 1 {
                    out.pop();
                }
            }
            s => out.push(s),
        }
    }
    let mut joined = out.join("/");
    if trailing && !joined.ends_with('/') {
        joined.push('/');
    }
    if path.starts_with('/') && !joined.starts_with('/') {
        joined.insert(0, '/');
    }
    joined
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builds_probe_urls_like_format_url() {
        let u = ProbeUrl::for_probe("http", "10.0.0.5", 8080, "/healthz?full=1#frag");
        assert_eq!(u.to_string(), "http://10.0.0.5:8080/healthz?full=1");
        assert_eq!(u.request_target(), "/healthz?full=1");
        assert_eq!(
            ProbeUrl::for_probe("http", "10.0.0.5", 80, "").to_string(),
            "http://10.0.0.5:80/"
        );
        assert_eq!(
            ProbeUrl::for_probe("http", "10.0.0.5", 80, "ready").request_target(),
            "/ready"
        );
        assert_eq!(
            ProbeUrl::for_probe("https", "fd00::1", 443, "/").to_string(),
            "https://[fd00::1]:443/"
        );
        assert_eq!(
            ProbeUrl::for_probe("http", "h", 1, "/a b%20c").request_target(),
            "/a%20b%20c"
        );
    }

    #[test]
    fn resolves_redirect_locations() {
        let base = ProbeUrl::for_probe("http", "10.0.0.5", 8080, "/a/b?x=1");
        let (u, abs) = base.resolve("/new").expect("should succeed");
        assert_eq!(
            (u.to_string(), abs),
            ("http://10.0.0.5:8080/new".to_string(), false)
        );
        let (u, _) = base.resolve("c?y=2").expect("should succeed");
        assert_eq!(u.to_string(), "http://10.0.0.5:8080/a/c?y=2");
        let (u, _) = base.resolve("../up").expect("should succeed");
        assert_eq!(u.to_string(), "http://10.0.0.5:8080/up");
        let (u, _) = base.resolve("?z").expect("should succeed");
        assert_eq!(u.to_string(), "http://10.0.0.5:8080/a/b?z");
        let (u, abs) = base
            .resolve("https://example.com/x")
            .expect("should succeed");
        assert_eq!(
            (u.to_string(), abs),
            ("https://example.com/x".to_string(), true)
        );
        assert_eq!((u.host.as_str(), u.port), ("example.com", 443));
        let (u, abs) = base.resolve("//10.0.0.5:9090/y").expect("should succeed");
        assert_eq!(
            (u.to_string(), abs),
            ("http://10.0.0.5:9090/y".to_string(), false)
        );
        let (u, _) = base
            .resolve("http://[fd00::2]:81/")
            .expect("should succeed");
        assert_eq!((u.host.as_str(), u.port), ("fd00::2", 81));
        assert!(base.resolve("http://host:notaport/").is_err());
    }
}
