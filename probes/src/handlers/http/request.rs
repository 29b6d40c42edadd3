//! The request an `httpGet` probe sends, prepared once per probe worker
//! (upstream `NewRequestForHTTPGetAction`): URL from scheme, host (the pod IP
//! by default), port and path; `httpHeaders` with `Host` and `User-Agent`
//! overrides; `User-Agent: kube-probe/<major.minor>` and `Accept: */*`
//! unless the probe sets them.

use http::header::{CONNECTION, HOST, REFERER, USER_AGENT};
use http::{HeaderName, HeaderValue, Request, Uri};
use http_body_util::Empty;

use super::HttpError;
use super::url::ProbeUrl;
use crate::port::PortError;
use crate::spec::HttpGetSpec;

/// A prepared `httpGet` probe request.
#[derive(Debug, Clone)]
pub struct HttpRequest {
    /// The URL probed first.
    pub(crate) url: ProbeUrl,
    /// The `Host` header override, when the probe sets a non-empty one.
    pub(crate) host_override: Option<String>,
    /// Headers to send besides `Host` and `Connection`, in Go's order
    /// (`User-Agent` first, then sorted by name), or the error Go's transport
    /// reports for an invalid header.
    pub(crate) headers: Result<Vec<(HeaderName, HeaderValue)>, HttpError>,
    /// Whether the probe sets its own `Referer`.
    pub(crate) explicit_referer: Option<HeaderValue>,
}

impl HttpRequest {
    /// Prepares the request of `spec` for a pod whose IP is `pod_ip`. Fails
    /// (a probe error, as upstream) only when the port could not be resolved.
    pub fn new(
        spec: &HttpGetSpec,
        pod_ip: &str,
        user_agent: &str,
    ) -> Result<HttpRequest, PortError> {
        let port = spec.port.clone()?;
        let host = spec.host.as_deref().unwrap_or(pod_ip);
        let url = ProbeUrl::for_probe(&spec.scheme, host, port, &spec.path);

        // Go's http.Header: names canonicalised, values kept per name in order.
        let mut names: Vec<String> = Vec::new();
        let mut values: Vec<Vec<String>> = Vec::new();
        for (name, value) in &spec.headers {
            let canonical = canonical_header_key(name);
            match names.iter().position(|n| *n == canonical) {
                Some(at) => values[at].push(value.clone()),
                None => {
                    names.push(canonical);
                    values.push(vec![value.clone()]);
                }
            }
        }
        let first = |key: &str| {
            names
                .iter()
                .position(|n| n == key)
                .map(|at| values[at][0].clone())
        };
        let host_override = first("Host").filter(|h| !h.is_empty());
        let user_agent = match first("User-Agent") {
            Some(ua) => ua,
            None => user_agent.to_string(),
        };
        if !names.iter().any(|n| n == "Accept") {
            names.push("Accept".to_string());
            values.push(vec!["*/*".to_string()]);
        } else if first("Accept").as_deref() == Some("") {
            let at = names.iter().position(|n| n == "Accept").unwrap_or(0);
            names.remove(at);
            values.remove(at);
        }

        let headers = (|| {
            let mut out = Vec::new();
            if !user_agent.is_empty() {
                out.push((USER_AGENT, header_value("User-Agent", &user_agent)?));
            }
            let mut order: Vec<usize> = (0..names.len()).collect();
            order.sort_by(|a, b| names[*a].cmp(&names[*b]));
            for at in order {
                let name = &names[at];
                if matches!(
                    name.as_str(),
                    "Host" | "User-Agent" | "Content-Length" | "Transfer-Encoding" | "Trailer"
                ) {
                    continue;
                }
                let header = HeaderName::from_bytes(name.as_bytes())
                    .map_err(|_| HttpError::HeaderName(name.clone()))?;
                for value in &values[at] {
                    out.push((header.clone(), header_value(name, value)?));
                }
            }
            Ok::<_, HttpError>(out)
        })();
        let explicit_referer = match &headers {
            Ok(list) => list
                .iter()
                .find(|(n, _)| *n == REFERER)
                .map(|(_, v)| v.clone()),
            Err(_) => None,
        };
        Ok(HttpRequest {
            url,
            host_override,
            headers,
            explicit_referer,
        })
    }

    /// The URL the probe starts at.
    pub fn url(&self) -> String {
        self.url.to_string()
    }

    /// Builds the wire request for `url` (the first URL or a redirect
    /// target), with `host` as the `Host` header and an optional `Referer`.
    pub(crate) fn build(
        &self,
        url: &ProbeUrl,
        host: &str,
        referer: Option<HeaderValue>,
    ) -> Result<Request<Empty<bytes::Bytes>>, HttpError> {
        let headers = self.headers.as_ref().map_err(Clone::clone)?;
        let uri: Uri = url
            .request_target()
            .parse()
            .map_err(|e: http::uri::InvalidUri| HttpError::Target {
                url: url.to_string(),
                reason: e.to_string(),
            })?;
        let host = HeaderValue::from_str(host).map_err(|_| HttpError::Host)?;
        let mut request = Request::get(uri)
            .body(Empty::new())
            .map_err(|e| HttpError::Request(e.to_string()))?;
        let map = request.headers_mut();
        map.insert(HOST, host);
        for (name, value) in headers {
            if *name == REFERER && referer.is_some() {
                continue;
            }
            map.append(name.clone(), value.clone());
        }
        if let Some(referer) = referer {
            map.insert(REFERER, referer);
        }
        map.insert(CONNECTION, HeaderValue::from_static("close"));
        Ok(request)
    }

    /// Whether the request sends `Accept` (for tests of the defaults).
    #[cfg(test)]
    fn sends(&self, name: &HeaderName) -> Vec<String> {
        self.headers
            .as_ref()
            .map(|h| {
                h.iter()
                    .filter(|(n, _)| n == name)
                    .map(|(_, v)| v.to_str().unwrap_or("").to_string())
                    .collect()
            })
            .unwrap_or_default()
    }
}

fn header_value(name: &str, value: &str) -> Result<HeaderValue, HttpError> {
    HeaderValue::from_str(value).map_err(|_| HttpError::HeaderValue(name.to_string()))
}

/// Go's `textproto.CanonicalMIMEHeaderKey`: `x-forwarded-for` becomes
/// `X-Forwarded-For`; a key with characters outside a token is left alone.
pub fn canonical_header_key(key: &str) -> String {
    let valid = !key.is_empty()
        && key.bytes().all(|b| {
            b.is_ascii_alphanumeric()
                || matches!(
                    b,
                    b'!' | b'#'
                        | b'$'
                        | b'%'
                        | b'&'
                        | b'\''
                        | b'*'
                        | b'+'
                        | b'-'
                        | b'.'
                        | b'^'
                        | b'_'
                        | b'`'
                        | b'|'
                        | b'~'
                )
        });
    if !valid {
        return key.to_string();
    }
    let mut upper = true;
    key.chars()
        .map(|c| {
            let out = if upper {
                c.to_ascii_uppercase()
            } else {
                c.to_ascii_lowercase()
            };
            upper = c == '-';
            out
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::header::ACCEPT;

    fn spec(headers: &[(&str, &str)]) -> HttpGetSpec {
        HttpGetSpec {
            scheme: "http".into(),
            host: None,
            port: Ok(8080),
            path: "/healthz".into(),
            headers: headers
                .iter()
                .map(|(n, v)| (n.to_string(), v.to_string()))
                .collect(),
        }
    }

    #[test]
    fn defaults_user_agent_and_accept() {
        let r =
            HttpRequest::new(&spec(&[]), "10.1.2.3", "kube-probe/1.36").expect("should succeed");
        assert_eq!(r.url(), "http://10.1.2.3:8080/healthz");
        assert_eq!(r.sends(&USER_AGENT), ["kube-probe/1.36"]);
        assert_eq!(r.sends(&ACCEPT), ["*/*"]);
        assert_eq!(r.host_override, None);
    }

    #[test]
    fn probe_headers_override_defaults() {
        let r = HttpRequest::new(
            &spec(&[
                ("user-agent", "mine/2"),
                ("accept", "application/json"),
                ("host", "svc.example"),
                ("x-a", "1"),
                ("X-A", "2"),
            ]),
            "10.1.2.3",
            "kube-probe/1.36",
        )
        .expect("should succeed");
        assert_eq!(r.sends(&USER_AGENT), ["mine/2"]);
        assert_eq!(r.sends(&ACCEPT), ["application/json"]);
        assert_eq!(r.host_override.as_deref(), Some("svc.example"));
        assert_eq!(r.sends(&HeaderName::from_static("x-a")), ["1", "2"]);
        assert!(r.sends(&HOST).is_empty());
    }

    #[test]
    fn empty_user_agent_and_accept_are_not_sent() {
        let r = HttpRequest::new(
            &spec(&[("User-Agent", ""), ("Accept", "")]),
            "10.1.2.3",
            "kube-probe/1.36",
        )
        .expect("should succeed");
        assert!(r.sends(&USER_AGENT).is_empty());
        assert!(r.sends(&ACCEPT).is_empty());
    }

    #[test]
    fn invalid_headers_fail_like_go_transport() {
        let r = HttpRequest::new(&spec(&[("bad name", "x")]), "10.1.2.3", "ua")
            .expect("should succeed");
        assert_eq!(
            r.headers.expect_err("should fail").to_string(),
            "net/http: invalid header field name \"bad name\""
        );
        let r =
            HttpRequest::new(&spec(&[("X-Ok", "a\nb")]), "10.1.2.3", "ua").expect("should succeed");
        assert_eq!(
            r.headers.expect_err("should fail").to_string(),
            "net/http: invalid header field value for \"X-Ok\""
        );
    }

    #[test]
    fn unresolved_port_is_a_probe_error() {
        let mut s = spec(&[]);
        s.port = Err(PortError::InvalidNumber(0));
        assert_eq!(
            HttpRequest::new(&s, "10.1.2.3", "ua")
                .expect_err("should fail")
                .to_string(),
            "invalid port number: 0"
        );
    }

    #[test]
    fn explicit_host_wins_over_pod_ip() {
        let mut s = spec(&[]);
        s.host = Some("127.0.0.1".into());
        assert_eq!(
            HttpRequest::new(&s, "10.1.2.3", "ua")
                .expect("should succeed")
                .url(),
            "http://127.0.0.1:8080/healthz"
        );
    }

    #[test]
    fn canonicalises_like_go() {
        assert_eq!(canonical_header_key("x-forwarded-for"), "X-Forwarded-For");
        assert_eq!(canonical_header_key("USER-AGENT"), "User-Agent");
        assert_eq!(canonical_header_key("bad key"), "bad key");
    }
}
