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

/// The TLS client config for `creds`; `ca`: verify the server against it.
pub fn tls_config(
    creds: &Credentials,
    ca: Option<&str>,
) -> Result<Arc<rustls::ClientConfig>, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let b = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
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
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
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
    let tls = tokio_rustls::TlsConnector::from(tls_config(creds, None)?)
        .connect(ServerName::IpAddress(addr.ip().into()), tcp)
        .await
        .map_err(|e| format!("TLS: {e}"))?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    let mut req = http::Request::builder()
        .method(method)
        .uri(path)
        .header(http::header::HOST, addr.to_string());
    if let Credentials::Token(t) = creds {
        req = req.header(http::header::AUTHORIZATION, format!("Bearer {t}"));
    }
    let req = req.body(Empty::<Bytes>::new()).map_err(|e| e.to_string())?;
    let resp = tokio::time::timeout(Duration::from_secs(30), sender.send_request(req))
        .await
        .map_err(|_| "no answer within 30s".to_string())?
        .map_err(|e| e.to_string())?;
    let status = resp.status().as_u16();
    let body = tokio::time::timeout(Duration::from_secs(30), resp.into_body().collect())
        .await
        .map_err(|_| "body not done within 30s".to_string())?
        .map_err(|e| e.to_string())?
        .to_bytes();
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
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
