//! Helpers for tests of the node API (kubelet's :10250): a raw HTTPS
//! client that presents a bearer token or a client certificate (and does
//! not check the node's self-signed certificate, as kube-apiserver without
//! `--kubelet-certificate-authority`), and the real kubectl.

use std::net::SocketAddr;
use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

/// How a request proves who it is.
#[derive(Debug, Clone, Default)]
pub enum Credentials {
    /// Nothing.
    #[default]
    None,
    /// `Authorization: Bearer <token>`.
    Token(String),
    /// A client certificate and key (PEM).
    Cert(String, String),
}

/// A verifier that accepts any server certificate (tests reach keelson's
/// self-signed node API; the client side is what they check).
#[derive(Debug)]
pub(crate) struct AnyServer(pub(crate) Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AnyServer {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        m: &[u8],
        c: &CertificateDer<'_>,
        d: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(m, c, d, &self.0.signature_verification_algorithms)
    }
    fn verify_tls13_signature(
        &self,
        m: &[u8],
        c: &CertificateDer<'_>,
        d: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(m, c, d, &self.0.signature_verification_algorithms)
    }
    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// How [`request_with`] connects.
#[derive(Debug, Clone, Copy, Default)]
pub struct Connect {
    /// Offer TLS 1.2 only (else 1.2 and 1.3).
    pub tls12_only: bool,
    /// Offer only `h2` by ALPN and speak HTTP/2 (else `http/1.1`).
    pub http2: bool,
    /// Offer this TLS 1.2 cipher suite only, by its IANA name (as
    /// `tlsCipherSuites` names them), e.g.
    /// `TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256` (else every one rustls has).
    pub tls12_suite: Option<&'static str>,
}

/// The TLS client config for `creds`; `ca`: verify the server against it.
pub fn tls_config(
    creds: &Credentials,
    ca: Option<&str>,
) -> Result<Arc<rustls::ClientConfig>, String> {
    tls_config_with(creds, ca, Connect::default())
}

/// [`tls_config`] with the TLS versions and ALPN of `connect`.
pub fn tls_config_with(
    creds: &Credentials,
    ca: Option<&str>,
    connect: Connect,
) -> Result<Arc<rustls::ClientConfig>, String> {
    let mut provider = rustls::crypto::ring::default_provider();
    if let Some(name) = connect.tls12_suite {
        provider.cipher_suites.retain(|s| match s {
            rustls::SupportedCipherSuite::Tls13(_) => true,
            rustls::SupportedCipherSuite::Tls12(_) => s.suite().as_str() == Some(name),
        });
        if provider
            .cipher_suites
            .iter()
            .all(|s| s.version() != &rustls::version::TLS12)
        {
            return Err(format!("rustls has no TLS 1.2 suite {name}"));
        }
    }
    let provider = Arc::new(provider);
    let versions: &[&'static rustls::SupportedProtocolVersion] = if connect.tls12_only {
        &[&rustls::version::TLS12]
    } else {
        rustls::DEFAULT_VERSIONS
    };
    let b = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(versions)
        .map_err(|e| e.to_string())?;
    let b = match ca {
        Some(pem) => {
            let mut roots = rustls::RootCertStore::empty();
            for c in rustls_pemfile::certs(&mut pem.as_bytes()) {
                roots
                    .add(c.map_err(|e| e.to_string())?)
                    .map_err(|e| e.to_string())?;
            }
            b.with_root_certificates(roots)
        }
        None => b
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AnyServer(provider))),
    };
    let mut cfg = match creds {
        Credentials::Cert(cert, key) => {
            let chain = rustls_pemfile::certs(&mut cert.as_bytes())
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| e.to_string())?;
            let key: PrivateKeyDer<'static> = rustls_pemfile::private_key(&mut key.as_bytes())
                .map_err(|e| e.to_string())?
                .ok_or("no key")?;
            b.with_client_auth_cert(chain, key)
                .map_err(|e| e.to_string())?
        }
        _ => b.with_no_client_auth(),
    };
    cfg.alpn_protocols = if connect.http2 {
        vec![b"h2".to_vec()]
    } else {
        vec![b"http/1.1".to_vec()]
    };
    Ok(Arc::new(cfg))
}

/// One HTTPS request to the node API: (status, body).
pub async fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    creds: &Credentials,
) -> Result<(u16, String), String> {
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connect {addr}: {e}"))?;
    request_on(tcp, addr, method, path, creds).await
}

/// [`request`] over a connection already open (e.g. in a namespace).
pub async fn request_on(
    tcp: tokio::net::TcpStream,
    addr: SocketAddr,
    method: &str,
    path: &str,
    creds: &Credentials,
) -> Result<(u16, String), String> {
    let resp = request_with(tcp, addr, method, path, creds, Connect::default()).await?;
    Ok((resp.status().as_u16(), resp.into_body()))
}

/// One HTTPS request over `tcp`, connecting as `connect` says: the whole
/// answer (status, headers, HTTP version, body as text). A refused TLS
/// handshake is an error starting with `TLS: `.
pub async fn request_with(
    tcp: tokio::net::TcpStream,
    addr: SocketAddr,
    method: &str,
    path: &str,
    creds: &Credentials,
    connect: Connect,
) -> Result<http::Response<String>, String> {
    let tls = tokio_rustls::TlsConnector::from(tls_config_with(creds, None, connect)?)
        .connect(ServerName::IpAddress(addr.ip().into()), tcp)
        .await
        .map_err(|e| format!("TLS: {e}"))?;
    let io = TokioIo::new(tls);
    let mut req = http::Request::builder().method(method);
    let resp = if connect.http2 {
        let (mut sender, conn) =
            hyper::client::conn::http2::handshake(hyper_util::rt::TokioExecutor::new(), io)
                .await
                .map_err(|e| e.to_string())?;
        tokio::spawn(conn);
        req = req.uri(format!("https://{addr}{path}"));
        if let Credentials::Token(t) = creds {
            req = req.header(http::header::AUTHORIZATION, format!("Bearer {t}"));
        }
        let req = req.body(Empty::<Bytes>::new()).map_err(|e| e.to_string())?;
        tokio::time::timeout(Duration::from_secs(30), sender.send_request(req)).await
    } else {
        let (mut sender, conn) = hyper::client::conn::http1::handshake(io)
            .await
            .map_err(|e| e.to_string())?;
        tokio::spawn(conn);
        req = req.uri(path).header(http::header::HOST, addr.to_string());
        if let Credentials::Token(t) = creds {
            req = req.header(http::header::AUTHORIZATION, format!("Bearer {t}"));
        }
        let req = req.body(Empty::<Bytes>::new()).map_err(|e| e.to_string())?;
        tokio::time::timeout(Duration::from_secs(30), sender.send_request(req)).await
    };
    let resp = resp
        .map_err(|_| "no answer within 30s".to_string())?
        .map_err(|e| e.to_string())?;
    collect_text(resp).await
}

/// [`request_with`] over a new connection to `addr`.
pub async fn request_connect(
    addr: SocketAddr,
    method: &str,
    path: &str,
    creds: &Credentials,
    connect: Connect,
) -> Result<http::Response<String>, String> {
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connect {addr}: {e}"))?;
    request_with(tcp, addr, method, path, creds, connect).await
}

/// The pod `namespace/name` of a `/runningpods/` answer once it has
/// containers: an error (to wait on) while the answer is not a v1 PodList
/// or the pod is not in it with containers yet.
pub fn running_pod(
    list: &serde_json::Value,
    namespace: &str,
    name: &str,
) -> Result<serde_json::Value, String> {
    if list["kind"] != "PodList" || list["apiVersion"] != "v1" {
        return Err(format!("not a v1 PodList: {list}"));
    }
    list["items"]
        .as_array()
        .and_then(|i| {
            i.iter()
                .find(|p| p["metadata"]["name"] == name && p["metadata"]["namespace"] == namespace)
        })
        .filter(|p| {
            p["spec"]["containers"]
                .as_array()
                .is_some_and(|c| !c.is_empty())
        })
        .cloned()
        .ok_or_else(|| format!("{namespace}/{name} and its containers not yet in {list}"))
}

/// One plain-HTTP GET (the read-only port): (status, body).
pub async fn request_plain(addr: SocketAddr, path: &str) -> Result<(u16, String), String> {
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connect {addr}: {e}"))?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    let req = http::Request::builder()
        .uri(path)
        .header(http::header::HOST, addr.to_string())
        .body(Empty::<Bytes>::new())
        .map_err(|e| e.to_string())?;
    let resp = tokio::time::timeout(Duration::from_secs(30), sender.send_request(req))
        .await
        .map_err(|_| "no answer within 30s".to_string())?
        .map_err(|e| e.to_string())?;
    let resp = collect_text(resp).await?;
    Ok((resp.status().as_u16(), resp.into_body()))
}

async fn collect_text(
    resp: http::Response<hyper::body::Incoming>,
) -> Result<http::Response<String>, String> {
    let (parts, body) = resp.into_parts();
    let body = tokio::time::timeout(Duration::from_secs(30), body.collect())
        .await
        .map_err(|_| "body not done within 30s".to_string())?
        .map_err(|e| e.to_string())?
        .to_bytes();
    Ok(http::Response::from_parts(
        parts,
        String::from_utf8_lossy(&body).into_owned(),
    ))
}

/// The TCP ports this process listens on (its sockets in LISTEN state,
/// from `/proc/self/fd` and `/proc/self/net/tcp{,6}`): what an in-process
/// node bound, whatever else the host runs.
pub fn own_listening_ports() -> Result<std::collections::BTreeSet<u16>, String> {
    let mut inodes = std::collections::BTreeSet::new();
    for e in std::fs::read_dir("/proc/self/fd").map_err(|e| e.to_string())? {
        let Ok(e) = e else { continue };
        if let Ok(t) = std::fs::read_link(e.path())
            && let Some(i) = t
                .to_string_lossy()
                .strip_prefix("socket:[")
                .and_then(|r| r.strip_suffix(']'))
        {
            inodes.insert(i.to_string());
        }
    }
    let mut ports = std::collections::BTreeSet::new();
    for table in ["/proc/self/net/tcp", "/proc/self/net/tcp6"] {
        let text = std::fs::read_to_string(table).unwrap_or_default();
        for row in text.lines().skip(1) {
            let f: Vec<&str> = row.split_whitespace().collect();
            // sl local_address rem_address st ... uid timeout inode
            let (Some(local), Some(state), Some(inode)) = (f.get(1), f.get(3), f.get(9)) else {
                continue;
            };
            if *state != "0A" || !inodes.contains(*inode) {
                continue;
            }
            if let Some(p) = local
                .rsplit(':')
                .next()
                .and_then(|p| u16::from_str_radix(p, 16).ok())
            {
                ports.insert(p);
            }
        }
    }
    Ok(ports)
}

/// What kubectl printed.
#[derive(Debug, Clone)]
pub struct KubectlOutput {
    /// Exit status 0.
    pub ok: bool,
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
}

/// Runs the real kubectl with `kubeconfig` (stdin from `input`), killed
/// after `timeout`.
pub async fn kubectl(
    kubeconfig: &Path,
    args: &[&str],
    input: Option<&[u8]>,
    timeout: Duration,
) -> Result<KubectlOutput, String> {
    use tokio::io::AsyncWriteExt;
    let mut cmd = tokio::process::Command::new("kubectl");
    cmd.arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .stdin(if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = cmd.spawn().map_err(|e| format!("starting kubectl: {e}"))?;
    if let (Some(data), Some(mut stdin)) = (input, child.stdin.take()) {
        let data = data.to_vec();
        tokio::spawn(async move {
            let _ = stdin.write_all(&data).await;
            let _ = stdin.shutdown().await;
        });
    }
    let out = tokio::time::timeout(timeout, child.wait_with_output())
        .await
        .map_err(|_| format!("kubectl {args:?} did not finish within {timeout:?}"))?
        .map_err(|e| e.to_string())?;
    Ok(KubectlOutput {
        ok: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    })
}

/// The terminal sizes a command run with `kubectl exec -it` sees, and the
/// whole terminal output. kubectl runs in a pseudo-terminal (`script`)
/// sized 40 rows by 100 columns; once the command has printed the size it
/// started with, the outer terminal is resized to 50x120, which sends
/// kubectl SIGWINCH. The command (a busybox shell) prints `tty`, then
/// `size R C` once its terminal has a size (kubectl sends the first size
/// on the resize stream right after the stream opens, so the process may
/// start at 0x0 for a moment, with kubelet too), then `size R C` again
/// once the size changed. Each wait in the container is bounded (5 s,
/// 15 s); the output is read by the caller.
pub async fn kubectl_exec_tty_resize(
    kubeconfig: &Path,
    namespace: Option<&str>,
    pod: &str,
    timeout: Duration,
) -> Result<String, String> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    // `script -f` flushes the typescript after each write: the outer shell
    // polls it for the first size before it resizes the terminal (the
    // typescript's header line holds the command, hence the `^`).
    let typescript = dir.path().join("typescript");
    // busybox's `stty size` fails while the terminal has no size (0x0).
    let inner = "tty; i=0; \
        until s=$(stty size 2>/dev/null) && [ -n \"$s\" ] || [ $i -ge 50 ]; do sleep 0.1; i=$((i+1)); done; \
        echo \"size $s\"; i=0; \
        while [ \"$(stty size 2>/dev/null)\" = \"$s\" ] && [ $i -lt 150 ]; do sleep 0.1; i=$((i+1)); done; \
        echo \"size $(stty size 2>/dev/null)\"";
    let ns = namespace.map(|n| format!("-n {n} ")).unwrap_or_default();
    // A background list in a non-interactive shell has /dev/null as its
    // stdin: the resize names the terminal.
    let outer = format!(
        "stty rows 40 cols 100; \
         (i=0; until grep -aq '^size [0-9]' {ts} || [ $i -ge 600 ]; do sleep 0.1; i=$((i+1)); done; \
          stty rows 50 cols 120 </dev/tty) & \
         kubectl --kubeconfig {kc} {ns}exec -it {pod} -- sh -c '{inner}'; wait",
        ts = typescript.display(),
        kc = kubeconfig.display(),
    );
    // script's stdin stays open (and silent) until the end: at its end,
    // script would type the terminal's EOF character into the session.
    let mut child = tokio::process::Command::new("script")
        .arg("-qfec")
        .arg(outer)
        .arg(&typescript)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("running script: {e}"))?;
    let stdin = child.stdin.take();
    let out = tokio::time::timeout(timeout, child.wait_with_output())
        .await
        .map_err(|_| format!("kubectl exec -it did not finish within {timeout:?}"))?
        .map_err(|e| format!("running script: {e}"))?;
    drop(stdin);
    let text = std::fs::read_to_string(&typescript).unwrap_or_default();
    if !out.status.success() {
        return Err(format!(
            "script exited {}: {}\n{text}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(text)
}

/// `kubelet_websocket_streaming_requests_total` by subresource (`exec`,
/// `attach`, `portforward`), read from the node's `/metrics` through the
/// API server's `nodes/proxy`: how many WebSocket streaming requests the
/// node translated or tunneled itself.
pub async fn websocket_streaming_requests(
    kubeconfig: &Path,
    node: &str,
    timeout: Duration,
) -> Result<std::collections::BTreeMap<String, f64>, String> {
    let path = format!("/api/v1/nodes/{node}/proxy/metrics");
    let out = kubectl(kubeconfig, &["get", "--raw", &path], None, timeout).await?;
    if !out.ok {
        return Err(format!("kubectl get --raw {path}: {}", out.stderr));
    }
    let prefix = "kubelet_websocket_streaming_requests_total{subresource=\"";
    Ok(out
        .stdout
        .lines()
        .filter_map(|l| {
            let rest = l.strip_prefix(prefix)?;
            let (sub, value) = rest.split_once("\"}")?;
            Some((sub.to_string(), value.trim().parse().ok()?))
        })
        .collect())
}
