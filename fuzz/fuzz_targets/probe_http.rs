//! The httpGet probe's handling of what the probed container answers
//! (probes/src/handlers/http): the real prober, over a real loopback TCP
//! connection, against a server that writes the fuzz input as its response
//! (status line, headers, body, redirects to itself, truncation). The first
//! input line is the probe's `path` (pod spec), the rest the response.
//! Holds: no panic, no hang past the probe's timeout; a success only for a
//! 2xx status line and a redirect warning only for a 3xx one.
#![no_main]

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use keelson_probes::{HttpGetSpec, HttpProber, HttpRequest, ProbeResult};
use libfuzzer_sys::fuzz_target;

static RESPONSE: Mutex<Vec<u8>> = Mutex::new(Vec::new());

struct Harness {
    rt: tokio::runtime::Runtime,
    prober: HttpProber,
    port: u16,
}

fn harness() -> &'static Harness {
    static H: OnceLock<Harness> = OnceLock::new();
    H.get_or_init(|| {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind loopback");
        let port = listener.local_addr().expect("local addr").port();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(mut conn) = conn else { continue };
                // The request (until its blank line), then the answer.
                let mut req = Vec::new();
                let mut buf = [0u8; 4096];
                while !req.windows(4).any(|w| w == b"\r\n\r\n") && req.len() < 65536 {
                    match conn.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => req.extend_from_slice(&buf[..n]),
                    }
                }
                let answer = RESPONSE.lock().map(|r| r.clone()).unwrap_or_default();
                let _ = conn.write_all(&answer);
                let _ = conn.shutdown(Shutdown::Both);
            }
        });
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let prober = HttpProber::new().expect("prober");
        Harness { rt, prober, port }
    })
}

/// The status code of the response's first status line (HTTP/1 parsers
/// skip empty lines before it); `None` for an informational (1xx) one,
/// which another response follows.
fn status_code(response: &[u8]) -> Option<u16> {
    let start = response.iter().position(|b| !matches!(b, b'\r' | b'\n'))?;
    let line = response[start..].strip_prefix(b"HTTP/1.")?;
    let code = line.get(2..5)?;
    let code: u16 = std::str::from_utf8(code).ok()?.parse().ok()?;
    (code >= 200).then_some(code)
}

fuzz_target!(|data: &[u8]| {
    let h = harness();
    let (path, response) = match data.iter().position(|b| *b == b'\n') {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (&b"/healthz"[..], data),
    };
    if let Ok(mut r) = RESPONSE.lock() {
        r.clear();
        r.extend_from_slice(response);
    }
    let spec = HttpGetSpec {
        scheme: "http".into(),
        host: None,
        port: Ok(h.port),
        path: String::from_utf8_lossy(path).into_owned(),
        headers: Vec::new(),
    };
    let Ok(request) = HttpRequest::new(&spec, "127.0.0.1", "kube-probe/1.36") else {
        return;
    };
    let result =
        h.rt.block_on(h.prober.probe(&request, Duration::from_secs(2)));
    let code = status_code(response);
    let informational = response
        .windows(10)
        .any(|w| w.starts_with(b"HTTP/1.") && w.ends_with(b" 1"));
    match &result {
        _ if informational => {}
        ProbeResult::Success => {
            assert!(
                code.is_some_and(|c| (200..300).contains(&c)),
                "success for {code:?}"
            )
        }
        ProbeResult::Warning(_) => {
            assert!(
                code.is_some_and(|c| (300..400).contains(&c)),
                "warning for {code:?}"
            )
        }
        _ => {}
    }
});
