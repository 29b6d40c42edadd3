//! The `httpGet` handler against scripted servers on loopback.

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use keelson_probes::{HttpGetSpec, HttpProber, HttpRequest, ProbeResult};
use support::{HttpServer, Reply, Seen, closed_port, response};

const UA: &str = "kube-probe/1.36";

fn spec(port: u16, path: &str, headers: &[(&str, &str)]) -> HttpGetSpec {
    HttpGetSpec {
        scheme: "http".into(),
        host: None,
        port: Ok(port),
        path: path.into(),
        headers: headers
            .iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect(),
    }
}

async fn probe(spec: &HttpGetSpec, timeout: Duration) -> ProbeResult {
    let prober = HttpProber::new().unwrap_or_else(|e| panic!("prober: {e}"));
    let request =
        HttpRequest::new(spec, "127.0.0.1", UA).unwrap_or_else(|e| panic!("request: {e}"));
    prober.probe(&request, timeout).await
}

async fn probe_port(port: u16, path: &str) -> ProbeResult {
    probe(&spec(port, path, &[]), Duration::from_secs(5)).await
}

#[tokio::test]
async fn status_codes_decide_the_result() {
    let server = HttpServer::start(|seen: &Seen| {
        let code: u16 = seen.path().trim_start_matches('/').parse().unwrap_or(500);
        if code < 200 {
            // An informational answer and nothing after it.
            return Reply::Raw(format!("HTTP/1.1 {code} Info\r\n\r\n").into_bytes());
        }
        response(code, "", b"body")
    })
    .await;
    let port = server.port();
    for (code, want) in [
        (200, ProbeResult::Success),
        (204, ProbeResult::Success),
        (299, ProbeResult::Success),
        (
            300,
            ProbeResult::Warning("Probe terminated redirects, Response body: body".into()),
        ),
        (
            399,
            ProbeResult::Warning("Probe terminated redirects, Response body: body".into()),
        ),
        (
            400,
            ProbeResult::Failure("HTTP probe failed with statuscode: 400".into()),
        ),
        (
            404,
            ProbeResult::Failure("HTTP probe failed with statuscode: 404".into()),
        ),
        (
            500,
            ProbeResult::Failure("HTTP probe failed with statuscode: 500".into()),
        ),
        (
            503,
            ProbeResult::Failure("HTTP probe failed with statuscode: 503".into()),
        ),
        (
            199,
            ProbeResult::Failure(format!("Get \"http://127.0.0.1:{port}/199\": EOF")),
        ),
    ] {
        assert_eq!(
            probe_port(port, &format!("/{code}")).await,
            want,
            "status {code}"
        );
    }
}

#[tokio::test]
async fn sends_upstream_default_headers() {
    let server = HttpServer::start(|_: &Seen| response(200, "", b"")).await;
    assert_eq!(
        probe_port(server.port(), "/healthz?full=1").await,
        ProbeResult::Success
    );
    let seen = server.seen();
    assert_eq!(seen.len(), 1);
    let req = &seen[0];
    assert_eq!(req.request_line(), "GET /healthz?full=1 HTTP/1.1");
    assert_eq!(req.header("Host"), [format!("127.0.0.1:{}", server.port())]);
    assert_eq!(req.header("User-Agent"), [UA]);
    assert_eq!(req.header("Accept"), ["*/*"]);
    assert_eq!(req.header("Connection"), ["close"]);
    assert!(
        req.header("Accept-Encoding").is_empty(),
        "no compression is asked for"
    );
    for name in req.header_names() {
        let canonical = keelson_probes::handlers::http::canonical_header_key(&name);
        assert_eq!(
            name, canonical,
            "header names are written in canonical case"
        );
    }
}

#[tokio::test]
async fn probe_headers_override_host_user_agent_and_accept() {
    let server = HttpServer::start(|_: &Seen| response(200, "", b"")).await;
    let s = spec(
        server.port(),
        "/",
        &[
            ("Host", "api.example.com"),
            ("User-Agent", "custom/1"),
            ("x-custom", "a"),
            ("X-Custom", "b"),
        ],
    );
    assert_eq!(
        probe(&s, Duration::from_secs(5)).await,
        ProbeResult::Success
    );
    let s = spec(server.port(), "/", &[("User-Agent", ""), ("Accept", "")]);
    assert_eq!(
        probe(&s, Duration::from_secs(5)).await,
        ProbeResult::Success
    );
    let seen = server.seen();
    assert_eq!(seen[0].header("Host"), ["api.example.com"]);
    assert_eq!(seen[0].header("User-Agent"), ["custom/1"]);
    assert_eq!(seen[0].header("X-Custom"), ["a", "b"]);
    assert_eq!(seen[0].header("Accept"), ["*/*"]);
    assert!(
        seen[1].header("User-Agent").is_empty(),
        "an empty User-Agent is not sent"
    );
    assert!(
        seen[1].header("Accept").is_empty(),
        "an empty Accept is not sent"
    );
}

#[tokio::test]
async fn invalid_header_fails_without_sending() {
    let server = HttpServer::start(|_: &Seen| response(200, "", b"")).await;
    let s = spec(server.port(), "/", &[("X-Bad", "a\u{1}b")]);
    assert_eq!(
        probe(&s, Duration::from_secs(5)).await,
        ProbeResult::Failure(format!(
            "Get \"http://127.0.0.1:{}/\": net/http: invalid header field value for \"X-Bad\"",
            server.port()
        ))
    );
    assert!(server.seen().is_empty());
}

#[tokio::test]
async fn redirects_to_the_same_host_are_followed() {
    let other = HttpServer::start(|seen: &Seen| match seen.path().as_str() {
        "/ok" => response(200, "", b""),
        _ => response(500, "", b""),
    })
    .await;
    let other_port = other.port();
    let server = HttpServer::start(move |seen: &Seen| match seen.path().as_str() {
        "/start" => response(302, "Location: /next\r\n", b""),
        "/next" => response(301, "Location: step?x=1\r\n", b""),
        "/step?x=1" => response(
            307,
            &format!("Location: http://127.0.0.1:{other_port}/ok\r\n"),
            b"",
        ),
        "/to-fail" => response(308, "Location: /fail\r\n", b""),
        "/fail" => response(500, "", b""),
        _ => response(404, "", b""),
    })
    .await;
    assert_eq!(
        probe_port(server.port(), "/start").await,
        ProbeResult::Success,
        "relative, then another port"
    );
    let paths: Vec<String> = server.seen().iter().map(Seen::path).collect();
    assert_eq!(paths, ["/start", "/next", "/step?x=1"]);
    let seen = server.seen();
    assert_eq!(
        seen[1].header("Referer"),
        [format!("http://127.0.0.1:{}/start", server.port())]
    );
    assert_eq!(
        seen[1].header("User-Agent"),
        [UA],
        "headers carry over to redirected requests"
    );
    assert_eq!(other.seen().len(), 1);
    assert_eq!(
        probe_port(server.port(), "/to-fail").await,
        ProbeResult::Failure("HTTP probe failed with statuscode: 500".into())
    );
}

#[tokio::test]
async fn host_header_is_kept_through_a_relative_redirect() {
    let server = HttpServer::start(|seen: &Seen| match seen.path().as_str() {
        "/redirect" => response(302, "Location: /success\r\n", b""),
        "/success" if seen.header("Host") == ["www.success.com"] => response(200, "", b""),
        _ => response(400, "", b""),
    })
    .await;
    let s = spec(server.port(), "/redirect", &[("Host", "www.success.com")]);
    assert_eq!(
        probe(&s, Duration::from_secs(5)).await,
        ProbeResult::Success
    );
}

#[tokio::test]
async fn redirect_to_another_host_is_a_warning() {
    let server = HttpServer::start(|_: &Seen| {
        response(
            302,
            "Location: http://example.invalid/elsewhere\r\n",
            b"gone",
        )
    })
    .await;
    assert_eq!(
        probe_port(server.port(), "/").await,
        ProbeResult::Warning("Probe terminated redirects, Response body: gone".into())
    );
    assert_eq!(server.seen().len(), 1, "the other host is not contacted");
}

#[tokio::test]
async fn redirect_loop_stops_after_ten() {
    let server = HttpServer::start(|_: &Seen| response(302, "Location: /loop\r\n", b"")).await;
    assert_eq!(
        probe_port(server.port(), "/loop").await,
        ProbeResult::Failure("Get \"/loop\": stopped after 10 redirects".into())
    );
    assert_eq!(
        server.seen().len(),
        11,
        "the first request and ten redirects"
    );
}

#[tokio::test]
async fn a_server_that_does_not_answer_times_out() {
    let server = HttpServer::start(|_: &Seen| Reply::Hang).await;
    let started = Instant::now();
    let result = probe(&spec(server.port(), "/slow", &[]), Duration::from_secs(1)).await;
    let took = started.elapsed();
    assert_eq!(
        result,
        ProbeResult::Failure(format!(
            "Get \"http://127.0.0.1:{}/slow\": context deadline exceeded (Client.Timeout exceeded while awaiting headers)",
            server.port()
        ))
    );
    assert!(
        took >= Duration::from_secs(1) && took < Duration::from_secs(3),
        "took {took:?}"
    );
}

#[tokio::test]
async fn a_body_that_stalls_is_a_probe_error() {
    let server = HttpServer::start(|_: &Seen| {
        Reply::PartialThenHang(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nabc".to_vec())
    })
    .await;
    assert_eq!(
        probe(&spec(server.port(), "/", &[]), Duration::from_secs(1)).await,
        ProbeResult::Unknown(
            "context deadline exceeded (Client.Timeout or context cancellation while reading body)"
                .into()
        )
    );
}

#[tokio::test]
async fn body_read_is_capped() {
    // An endless body: the probe reads 10 KiB and stops.
    let server =
        HttpServer::start(|_: &Seen| Reply::Endless(b"HTTP/1.1 200 OK\r\n\r\n".to_vec())).await;
    let started = Instant::now();
    assert_eq!(
        probe(&spec(server.port(), "/", &[]), Duration::from_secs(5)).await,
        ProbeResult::Success
    );
    assert!(started.elapsed() < Duration::from_secs(2));

    // The body in a warning is cut at 10 KiB.
    let big = vec![b'z'; 20 * 1024];
    let server = HttpServer::start(move |_: &Seen| {
        response(302, "Location: http://example.invalid/\r\n", &big)
    })
    .await;
    match probe_port(server.port(), "/").await {
        ProbeResult::Warning(message) => {
            let body = message.trim_start_matches("Probe terminated redirects, Response body: ");
            assert_eq!(body.len(), 10 * 1024);
            assert!(body.bytes().all(|b| b == b'z'));
        }
        other => panic!("unexpected {other:?}"),
    }
}

#[tokio::test]
async fn refused_connection_fails_with_dial_error() {
    let port = closed_port().await;
    assert_eq!(
        probe_port(port, "/healthz").await,
        ProbeResult::Failure(format!(
            "Get \"http://127.0.0.1:{port}/healthz\": dial tcp 127.0.0.1:{port}: connect: connection refused"
        ))
    );
}

#[tokio::test]
async fn closed_without_answer_is_eof() {
    let server = HttpServer::start(|_: &Seen| Reply::Raw(Vec::new())).await;
    assert_eq!(
        probe_port(server.port(), "/").await,
        ProbeResult::Failure(format!("Get \"http://127.0.0.1:{}/\": EOF", server.port()))
    );
}

#[tokio::test]
async fn https_works_without_certificate_verification() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let cert = rcgen::generate_simple_self_signed(vec!["not-the-pod-ip.example".to_string()])
        .unwrap_or_else(|e| panic!("cert: {e}"));
    let der = rustls::pki_types::CertificateDer::from(cert.cert.der().to_vec());
    let key = rustls::pki_types::PrivateKeyDer::try_from(cert.signing_key.serialize_der())
        .unwrap_or_else(|e| panic!("key: {e}"));
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .and_then(|b| b.with_no_client_auth().with_single_cert(vec![der], key))
    .unwrap_or_else(|e| panic!("server config: {e}"));
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap_or_else(|e| panic!("bind: {e}"));
    let port = listener.local_addr().map(|a| a.port()).unwrap_or(0);
    let (seen_tx, mut seen_rx) = tokio::sync::mpsc::unbounded_channel();
    let server = tokio::spawn(async move {
        while let Ok((sock, _)) = listener.accept().await {
            let Ok(mut tls) = acceptor.accept(sock).await else {
                continue;
            };
            let mut buf = vec![0u8; 4096];
            let n = tls.read(&mut buf).await.unwrap_or(0);
            let _ = seen_tx.send(String::from_utf8_lossy(&buf[..n]).to_string());
            let _ = tls
                .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                .await;
            let _ = tls.shutdown().await;
        }
    });
    let mut s = spec(port, "/secure", &[]);
    s.scheme = "https".into();
    assert_eq!(
        probe(&s, Duration::from_secs(5)).await,
        ProbeResult::Success
    );
    let head = seen_rx.recv().await.unwrap_or_default();
    assert!(head.starts_with("GET /secure HTTP/1.1\r\n"), "{head}");
    server.abort();
}

#[tokio::test]
async fn https_to_a_plain_http_server_fails() {
    use tokio::io::AsyncWriteExt;
    // A plain HTTP server answers the TLS hello with a 400, as Go's does.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap_or_else(|e| panic!("bind: {e}"));
    let port = listener.local_addr().map(|a| a.port()).unwrap_or(0);
    let server = tokio::spawn(async move {
        while let Ok((mut sock, _)) = listener.accept().await {
            let _ = sock.write_all(b"HTTP/1.0 400 Bad Request\r\n\r\nClient sent an HTTP request to an HTTPS server.\n").await;
            let _ = sock.shutdown().await;
        }
    });
    let mut s = spec(port, "/", &[]);
    s.scheme = "https".into();
    let started = Instant::now();
    match probe(&s, Duration::from_secs(5)).await {
        ProbeResult::Failure(message) => {
            assert!(
                message.starts_with(&format!("Get \"https://127.0.0.1:{port}/\": tls: ")),
                "{message}"
            )
        }
        other => panic!("unexpected {other:?}"),
    }
    assert!(started.elapsed() < Duration::from_secs(2));
    server.abort();
}

#[tokio::test]
async fn unsupported_scheme_fails_like_go() {
    let mut s = spec(80, "/", &[]);
    s.scheme = "ftp".into();
    assert_eq!(
        probe(&s, Duration::from_secs(1)).await,
        ProbeResult::Failure(
            "Get \"ftp://127.0.0.1:80/\": unsupported protocol scheme \"ftp\"".into()
        )
    );
}
