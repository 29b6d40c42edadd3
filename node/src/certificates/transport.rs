//! An API client whose client certificate can change under it, as
//! kubelet's rotating transport (`pkg/kubelet/certificate/transport.go`):
//! the TLS handshake asks the certificate manager for the current
//! certificate (Go's `GetClientCertificate`), and when the manager installs
//! a new one every open connection is closed (client-go's `connrotation`
//! dialer), so that idle pooled connections and long watches reconnect with
//! the new certificate instead of using the old one until it expires. The
//! API client itself — and everything holding a clone of it — stays.

use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, RwLock};
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use http::{HeaderName, HeaderValue};
use hyper::rt::{Read, ReadBufCursor, Write};
use hyper_util::client::legacy::connect::{Connected, Connection, HttpConnector};
use hyper_util::rt::TokioExecutor;
use kube::client::ConfigExt;
use rustls::client::ResolvesClientCert;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};
use tower::{BoxError, ServiceBuilder};

use super::CertError;
use super::pair::CertPair;
use keelson_common::apiclient::{RateLimitLayer, TokenBucket};

/// The certificate in use, shared by the manager (writer) and TLS (reader).
#[derive(Default)]
pub struct CurrentCert {
    pair: RwLock<Option<CertPair>>,
    changed: Mutex<Vec<tokio::sync::mpsc::UnboundedSender<()>>>,
}

impl std::fmt::Debug for CurrentCert {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CurrentCert")
            .field("leaf", &self.get_any().map(|p| p.leaf))
            .finish()
    }
}

impl CurrentCert {
    /// A shared, empty slot.
    pub fn new() -> Arc<CurrentCert> {
        Arc::new(CurrentCert::default())
    }

    /// The current pair if it has not expired (client-go's `Current()`).
    pub fn get(&self) -> Option<CertPair> {
        self.get_any()
            .filter(|p| !p.leaf.expired_at(SystemTime::now()))
    }

    /// The current pair, expired or not.
    pub fn get_any(&self) -> Option<CertPair> {
        self.pair.read().ok().and_then(|p| p.clone())
    }

    /// Installs a new pair and tells every subscriber.
    pub fn set(&self, pair: CertPair) {
        if let Ok(mut p) = self.pair.write() {
            *p = Some(pair);
        }
        if let Ok(mut subs) = self.changed.lock() {
            subs.retain(|s| s.send(()).is_ok());
        }
    }

    /// A channel that receives `()` after each `set`.
    pub fn subscribe(&self) -> tokio::sync::mpsc::UnboundedReceiver<()> {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        if let Ok(mut subs) = self.changed.lock() {
            subs.push(tx);
        }
        rx
    }

    /// Seconds until the current certificate expires (negative once
    /// expired); `None` without one.
    pub fn ttl_seconds(&self) -> Option<f64> {
        let p = self.get_any()?;
        let now = SystemTime::now();
        Some(match p.leaf.not_after.duration_since(now) {
            Ok(d) => d.as_secs() as f64,
            Err(e) => -(e.duration().as_secs() as f64),
        })
    }
}

/// rustls client side: present the current certificate (none while there
/// is none: the handshake goes on without one, as Go's transport does).
#[derive(Debug)]
pub struct ClientCertResolver(pub Arc<CurrentCert>);

impl ResolvesClientCert for ClientCertResolver {
    fn resolve(
        &self,
        _root_hint_subjects: &[&[u8]],
        _sigschemes: &[rustls::SignatureScheme],
    ) -> Option<Arc<CertifiedKey>> {
        self.0.get().map(|p| p.certified)
    }

    fn has_certs(&self) -> bool {
        true
    }
}

/// rustls server side: serve the current certificate (a serving
/// certificate renewed by a manager; the :10250 server uses it).
#[derive(Debug)]
pub struct ServerCertResolver(pub Arc<CurrentCert>);

impl ResolvesServerCert for ServerCertResolver {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.0.get_any().map(|p| p.certified)
    }
}

/// Closes every connection made so far (the `connrotation` dialer).
#[derive(Debug, Clone, Default)]
pub struct ConnectionCloser {
    token: Arc<Mutex<CancellationToken>>,
}

impl ConnectionCloser {
    fn current(&self) -> CancellationToken {
        self.token.lock().map(|t| t.clone()).unwrap_or_default()
    }

    /// Ends every open connection; new ones are unaffected.
    pub fn close_all(&self) {
        if let Ok(mut t) = self.token.lock() {
            t.cancel();
            *t = CancellationToken::new();
        }
    }
}

/// A connection that fails every read and write once its generation is
/// closed (waking an idle connection so its owner drops it).
pub struct Tracked<T> {
    inner: T,
    closed: Pin<Box<WaitForCancellationFutureOwned>>,
}

impl<T> Tracked<T> {
    fn check(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        match self.closed.as_mut().poll(cx) {
            Poll::Ready(()) => Err(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "connection closed: the client certificate changed",
            )),
            Poll::Pending => Ok(()),
        }
    }
}

impl<T: Read + Unpin> Read for Tracked<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        this.check(cx)?;
        Pin::new(&mut this.inner).poll_read(cx, buf)
    }
}

impl<T: Write + Unpin> Write for Tracked<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        this.check(cx)?;
        Pin::new(&mut this.inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        this.check(cx)?;
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

impl<T: Connection> Connection for Tracked<T> {
    fn connected(&self) -> Connected {
        self.inner.connected()
    }
}

/// An HTTP connector whose connections a [`ConnectionCloser`] can end.
#[derive(Clone)]
pub struct TrackingConnector {
    inner: HttpConnector,
    closer: ConnectionCloser,
}

impl tower::Service<http::Uri> for TrackingConnector {
    type Response = Tracked<<HttpConnector as tower::Service<http::Uri>>::Response>;
    type Error = <HttpConnector as tower::Service<http::Uri>>::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, uri: http::Uri) -> Self::Future {
        let token = self.closer.current();
        let fut = self.inner.call(uri);
        Box::pin(async move {
            let io = fut.await?;
            Ok(Tracked {
                inner: io,
                closed: Box::pin(token.cancelled_owned()),
            })
        })
    }
}

/// Settings of the rotating client.
#[derive(Debug, Clone)]
pub struct RotatingClientSettings {
    /// Requests per second (0: unlimited).
    pub qps: f32,
    /// Burst.
    pub burst: u32,
    /// User agent.
    pub user_agent: String,
    /// Connect timeout.
    pub connect_timeout: Duration,
    /// The daemon's request log (for `keelson diagnose`), if kept.
    pub api_log: Option<keelson_common::introspection::ApiLog>,
}

/// Builds an API client for `config`'s server and CA whose client
/// certificate is whatever `current` holds at each handshake; `config`'s
/// own credentials are dropped (client-go's `AnonymousClientConfig`).
/// Returns the client and the closer to call when the certificate changes.
pub fn rotating_client(
    mut config: kube::Config,
    current: Arc<CurrentCert>,
    s: &RotatingClientSettings,
) -> Result<(kube::Client, ConnectionCloser), CertError> {
    config.auth_info = kube::config::AuthInfo::default();
    let mut tls = config
        .rustls_client_config()
        .map_err(|e| CertError::Client(format!("TLS configuration: {e}")))?;
    tls.client_auth_cert_resolver = Arc::new(ClientCertResolver(current));
    // No TLS session resumption: a resumed session carries the identity of
    // the handshake that created it, so a new connection after a rotation
    // would still be the old certificate to the server (and be refused
    // once it expires). Go's client, which kubelet uses, resumes nothing
    // unless given a session cache.
    tls.resumption = rustls::client::Resumption::disabled();
    let closer = ConnectionCloser::default();
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_connect_timeout(Some(s.connect_timeout));
    let tracking = TrackingConnector {
        inner: http,
        closer: closer.clone(),
    };
    let https = hyper_rustls::HttpsConnector::from((tracking, Arc::new(tls)));
    let hyper_client: hyper_util::client::legacy::Client<_, kube::client::Body> =
        hyper_util::client::legacy::Client::builder(TokioExecutor::new()).build(https);
    if let Ok(v) = HeaderValue::from_str(&s.user_agent) {
        config
            .headers
            .push((HeaderName::from_static("user-agent"), v));
    }
    let extra = config
        .extra_headers_layer()
        .map_err(|e| CertError::Client(e.to_string()))?;
    let service = ServiceBuilder::new()
        .layer(RateLimitLayer::new(TokenBucket::new(s.qps, s.burst)))
        .option_layer(s.api_log.as_ref().map(|l| l.layer("node")))
        .layer(config.base_uri_layer())
        .layer(extra)
        .map_err(BoxError::from)
        .service(hyper_client);
    Ok((
        kube::Client::new(service, config.default_namespace.clone()),
        closer,
    ))
}
