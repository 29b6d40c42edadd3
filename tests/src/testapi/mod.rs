//! The test API server: a real HTTP server with kube-apiserver semantics
//! for the resources keelson, kube-proxy and kubectl use. It backs the
//! component tests, the benchmarks and the local demo; it is never a
//! control plane for real use. See `tests/README.md` for what it
//! implements and every known difference from kube-apiserver.
//!
//! ```no_run
//! # async fn demo() -> Result<(), keelson_tests::testapi::TestApiError> {
//! use keelson_tests::testapi::{TestApiOptions, TestApiServer};
//! let api = TestApiServer::start(TestApiOptions::default()).await?;
//! let client = api.client().await;          // kube::Client over HTTPS
//! println!("kubectl --kubeconfig {}", api.kubeconfig_path().display());
//! api.knobs().compact();                     // old resourceVersions now 410
//! # drop(client); Ok(()) }
//! ```

mod admission;
mod allocator;
mod authn;
mod csr;
mod defaults;
mod discovery;
mod ephemeral;
mod error;
mod events;
mod fields;
mod http;
mod knobs;
mod kubeconfig;
mod kubelet_proxy;
mod namespaces;
mod objects;
mod openapi;
mod patch;
mod pods;
mod resize;
mod resources;
mod reviews;
mod routing;
mod schema;
mod selectors;
mod services;
mod state;
mod store;
mod table;
mod tls;
mod tokens;
mod util;
mod validation;
mod watch;

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

pub use error::{ApiError, TestApiError};
pub use knobs::{Knobs, Outage, RequestRecord};
pub use kubelet_proxy::{KUBELET_CLIENT_USER, NodeDialer};
pub use resources::{RESOURCES, ResourceInfo};

use state::{ApiState, ServerConfig};

/// The token written into kubeconfigs when no tokens are configured.
pub const UNAUTHENTICATED_TOKEN: &str = "keelson-testapi-unauthenticated";

/// A static bearer token and the user it authenticates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StaticToken {
    /// The token.
    pub token: String,
    /// User name it proves (e.g. `system:node:n1`, `system:kube-proxy`).
    pub user: String,
}

/// Options of [`TestApiServer::start`].
#[derive(Debug, Clone)]
pub struct TestApiOptions {
    /// Plain HTTP listen address (default `127.0.0.1:0`, any free port).
    pub http_listen: SocketAddr,
    /// TLS listen address (default `127.0.0.1:0`).
    pub https_listen: SocketAddr,
    /// Static bearer tokens. Empty (default): no authentication, every
    /// request is `system:anonymous`. Non-empty: requests need one of these
    /// or a service account token issued by this server, else 401.
    pub tokens: Vec<StaticToken>,
    /// Changes kept per resource for watches from an older
    /// resourceVersion (older ones get 410 Gone). Default 10 000.
    pub watch_history: usize,
    /// Per-resource buffer of live changes; a watcher further behind is
    /// closed (it re-watches). Default 4096.
    pub watch_buffer: usize,
    /// Interval of BOOKMARK events on watches that allow them. Default 60 s.
    pub bookmark_interval: Duration,
    /// Emulate what a real control plane adds around the API (default
    /// true): the `kubernetes` Service and its endpoints, per-namespace
    /// `default` ServiceAccount and `kube-root-ca.crt` ConfigMap, and the
    /// ServiceAccount / Priority / DefaultTolerationSeconds admission of pods.
    pub emulate_controllers: bool,
    /// Service ClusterIP range. Default `10.96.0.0/12`.
    pub service_cidr: String,
    /// Where to write the kubeconfig; default a file in a private temp dir.
    pub kubeconfig_path: Option<PathBuf>,
    /// Extra DNS names / IPs for the serving certificate.
    pub extra_sans: Vec<String>,
    /// Requests kept in the request log. Default 10 000.
    pub request_log_size: usize,
    /// Service account token issuer (`iss`) and default audience.
    pub issuer: String,
    /// Lifetime of certificates the CertificateSigningRequest signer issues
    /// (kube-controller-manager's `--cluster-signing-duration`, default one
    /// year); a request's `expirationSeconds` may ask for less.
    pub csr_signing_duration: Duration,
    /// How far back the signer sets notBefore (upstream: 5 minutes; tests
    /// of rotation with lifetimes of seconds set 0).
    pub csr_signing_backdate: Duration,
    /// Approve kubelet client CertificateSigningRequests as
    /// kube-controller-manager's csrapproving controller does (bootstrap
    /// and renewal). Default false: requests wait for an approval through
    /// the `approval` subresource (`kubectl certificate approve`).
    pub approve_node_client_csrs: bool,
}

impl Default for TestApiOptions {
    fn default() -> Self {
        let lo = SocketAddr::from(([127, 0, 0, 1], 0));
        TestApiOptions {
            http_listen: lo,
            https_listen: lo,
            tokens: Vec::new(),
            watch_history: 10_000,
            watch_buffer: 4096,
            bookmark_interval: Duration::from_secs(60),
            emulate_controllers: true,
            service_cidr: allocator::DEFAULT_SERVICE_CIDR.to_string(),
            kubeconfig_path: None,
            extra_sans: Vec::new(),
            request_log_size: 10_000,
            issuer: "https://kubernetes.default.svc.cluster.local".to_string(),
            csr_signing_duration: Duration::from_secs(365 * 24 * 3600),
            csr_signing_backdate: Duration::from_secs(300),
            approve_node_client_csrs: false,
        }
    }
}

/// A running test API server. Dropping it stops it.
pub struct TestApiServer {
    state: Arc<ApiState>,
    issuer: Arc<rcgen::Issuer<'static, rcgen::KeyPair>>,
    http_addr: SocketAddr,
    https_addr: SocketAddr,
    kubeconfig: PathBuf,
    _dir: Option<tempfile::TempDir>,
    shutdown: CancellationToken,
    tasks: Mutex<Vec<tokio::task::JoinHandle<()>>>,
}

impl std::fmt::Debug for TestApiServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestApiServer")
            .field("http", &self.http_addr)
            .field("https", &self.https_addr)
            .field("kubeconfig", &self.kubeconfig)
            .finish()
    }
}

fn url_host(ip: IpAddr) -> String {
    match ip {
        IpAddr::V6(v6) => format!("[{v6}]"),
        IpAddr::V4(v4) => v4.to_string(),
    }
}

async fn bind(addr: SocketAddr) -> Result<TcpListener, TestApiError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| TestApiError::Listen {
            addr: addr.to_string(),
            source,
        })
}

impl TestApiServer {
    /// Starts the server: binds both listeners, generates TLS material and
    /// the token signing key, seeds the initial namespaces (and emulated
    /// controller objects) and writes the kubeconfig.
    pub async fn start(opts: TestApiOptions) -> Result<TestApiServer, TestApiError> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let cidr: ipnet::IpNet = opts
            .service_cidr
            .parse()
            .map_err(|e| TestApiError::Option {
                option: "service_cidr",
                message: format!("{}: {e}", opts.service_cidr),
            })?;
        let http_l = bind(opts.http_listen).await?;
        let https_l = bind(opts.https_listen).await?;
        let local = |l: &TcpListener, a| {
            l.local_addr().map_err(|source| TestApiError::Listen {
                addr: format!("{a}"),
                source,
            })
        };
        let http_addr = local(&http_l, opts.http_listen)?;
        let https_addr = local(&https_l, opts.https_listen)?;

        let mut names: Vec<String> = [
            "localhost",
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let mut ips: Vec<IpAddr> = vec![
            IpAddr::from([127, 0, 0, 1]),
            IpAddr::from(std::net::Ipv6Addr::LOCALHOST),
        ];
        for a in [http_addr.ip(), https_addr.ip()] {
            if !a.is_unspecified() && !ips.contains(&a) {
                ips.push(a);
            }
        }
        if let Some(first) = cidr.hosts().next() {
            ips.push(first);
        }
        for s in &opts.extra_sans {
            match s.parse::<IpAddr>() {
                Ok(ip) => ips.push(ip),
                Err(_) => names.push(s.clone()),
            }
        }
        let tls = tls::generate(&names, &ips)?;
        let signer =
            tokens::TokenSigner::generate(&opts.issuer).map_err(TestApiError::SigningKey)?;
        let store = Arc::new(store::Store::new(opts.watch_history, opts.watch_buffer));
        store.set_service_cidr(cidr);
        let knobs = Knobs::new(store.clone(), opts.request_log_size);
        let https_host = if https_addr.ip().is_unspecified() {
            IpAddr::from([127, 0, 0, 1])
        } else {
            https_addr.ip()
        };
        let https_url = format!("https://{}:{}", url_host(https_host), https_addr.port());
        // kube-apiserver's --kubelet-client-certificate: a client
        // certificate of this CA (kubeadm's CN, in system:masters so the
        // kubelets' SubjectAccessReviews allow it).
        let kubelet_cert = tls::issue_client(
            &tls.issuer,
            kubelet_proxy::KUBELET_CLIENT_USER,
            Some("system:masters"),
        )?;
        let kubelet =
            kubelet_proxy::KubeletClient::new(&kubelet_cert.cert_pem, &kubelet_cert.key_pem)
                .map_err(TestApiError::Tls)?;
        let state = Arc::new(ApiState {
            store,
            knobs,
            signer,
            config: ServerConfig {
                ca_pem: tls.ca_pem.clone(),
                api_audiences: vec![opts.issuer.clone()],
                emulate_controllers: opts.emulate_controllers,
                tokens: opts
                    .tokens
                    .iter()
                    .map(|t| (t.token.clone(), t.user.clone()))
                    .collect(),
                bookmark_interval: opts.bookmark_interval,
            },
            https_url: https_url.clone(),
            kubelet,
        });
        seed(&state, https_host, https_addr.port()).map_err(|e| TestApiError::Option {
            option: "seed",
            message: e.message,
        })?;

        let (kubeconfig, dir) = match &opts.kubeconfig_path {
            Some(p) => (p.clone(), None),
            None => {
                let d = tempfile::Builder::new()
                    .prefix("keelson-testapi-")
                    .tempdir()
                    .map_err(|source| TestApiError::Write {
                        path: std::env::temp_dir().display().to_string(),
                        source,
                    })?;
                (d.path().join("kubeconfig"), Some(d))
            }
        };
        // kubectl prompts for a password when a user has no credentials at
        // all, so without configured tokens the kubeconfig still carries one
        // (which the server, authenticating nobody, ignores).
        let first_token = opts
            .tokens
            .first()
            .map(|t| t.token.as_str())
            .unwrap_or(UNAUTHENTICATED_TOKEN);
        kubeconfig::write(&kubeconfig, &https_url, &tls.ca_pem, Some(first_token))?;

        let shutdown = CancellationToken::new();
        let acceptor = tokio_rustls::TlsAcceptor::from(tls.server_config.clone());
        let issuer = Arc::new(tls.issuer);
        let tasks = vec![
            http::spawn_listener(state.clone(), http_l, None, shutdown.clone()),
            http::spawn_listener(state.clone(), https_l, Some(acceptor), shutdown.clone()),
            csr::spawn(
                state.clone(),
                issuer.clone(),
                csr::SignerConfig {
                    duration: opts.csr_signing_duration,
                    backdate: opts.csr_signing_backdate,
                    approve_node_clients: opts.approve_node_client_csrs,
                },
                shutdown.clone(),
            ),
        ];
        tracing::info!(http = %http_addr, https = %https_addr, "test API server started");
        Ok(TestApiServer {
            state,
            issuer,
            http_addr,
            https_addr,
            kubeconfig,
            _dir: dir,
            shutdown,
            tasks: Mutex::new(tasks),
        })
    }

    /// `http://127.0.0.1:<port>` (plain HTTP).
    pub fn http_url(&self) -> String {
        let ip = if self.http_addr.ip().is_unspecified() {
            IpAddr::from([127, 0, 0, 1])
        } else {
            self.http_addr.ip()
        };
        format!("http://{}:{}", url_host(ip), self.http_addr.port())
    }

    /// `https://127.0.0.1:<port>` (TLS with the generated CA; HTTP/1.1 and h2).
    pub fn https_url(&self) -> String {
        self.state.https_url.clone()
    }

    /// The plain HTTP listen address.
    pub fn http_addr(&self) -> SocketAddr {
        self.http_addr
    }

    /// The TLS listen address.
    pub fn https_addr(&self) -> SocketAddr {
        self.https_addr
    }

    /// The kubeconfig written at start (HTTPS, CA embedded, the first
    /// static token if any, namespace `default`).
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig
    }

    /// PEM of the CA that signed the serving certificate.
    pub fn ca_pem(&self) -> &str {
        &self.state.config.ca_pem
    }

    /// The CA of this server's kubelet client certificate: what a node's
    /// `authentication.x509.clientCAFile` must hold (it is [`Self::ca_pem`]).
    pub fn kubelet_client_ca_pem(&self) -> &str {
        &self.state.config.ca_pem
    }

    /// Verifies kubelets' serving certificates against `pem` from now on
    /// (kube-apiserver's `--kubelet-certificate-authority`); `None`: no
    /// verification (its default).
    pub fn set_kubelet_certificate_authority(&self, pem: Option<String>) {
        *self
            .state
            .kubelet
            .ca
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = pem;
    }

    /// Dials kubelets with `dialer` (e.g. into a node's network namespace).
    pub fn set_node_dialer(&self, dialer: NodeDialer) {
        *self
            .state
            .kubelet
            .dialer
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(dialer);
    }

    /// Writes another kubeconfig for this server with `user_token` as the
    /// bearer token (e.g. a node's or kube-proxy's identity).
    pub fn write_kubeconfig(
        &self,
        path: &Path,
        user_token: Option<&str>,
    ) -> Result<(), TestApiError> {
        let token = user_token.or(Some(UNAUTHENTICATED_TOKEN));
        kubeconfig::write(path, &self.https_url(), &self.state.config.ca_pem, token)
    }

    /// Writes a kubeconfig for this server reached at `server` (e.g. the
    /// `http://127.0.0.1:<port>` of a listener given to
    /// [`TestApiServer::serve_listener`] inside a network namespace).
    pub fn write_kubeconfig_with_server(
        &self,
        path: &Path,
        server: &str,
        user_token: Option<&str>,
    ) -> Result<(), TestApiError> {
        let token = user_token.or(Some(UNAUTHENTICATED_TOKEN));
        kubeconfig::write(path, server, &self.state.config.ca_pem, token)
    }

    /// Issues a client certificate signed by the server's CA with CN =
    /// `user` and O = `group` (e.g. `system:node:n1` in `system:nodes`);
    /// the server authenticates TLS connections presenting it as `user`.
    /// Returns (certificate PEM, private key PEM).
    pub fn issue_client_certificate(
        &self,
        user: &str,
        group: Option<&str>,
    ) -> Result<(String, String), TestApiError> {
        let c = tls::issue_client(&self.issuer, user, group)?;
        Ok((c.cert_pem, c.key_pem))
    }

    /// Writes a kubeconfig authenticating with a fresh client certificate
    /// for `user` (and `group`), as a kubelet's or kube-proxy's kubeconfig.
    pub fn write_kubeconfig_with_client_cert(
        &self,
        path: &Path,
        user: &str,
        group: Option<&str>,
    ) -> Result<(), TestApiError> {
        let (cert, key) = self.issue_client_certificate(user, group)?;
        self.write_kubeconfig_with_cert_pair(path, &cert, &key)
    }

    /// Writes a kubeconfig authenticating with a client certificate for
    /// `user` (and `group`) that expired `ago` ago (valid for an hour
    /// before that), as a node's `kubelet.conf` left from long ago.
    pub fn write_kubeconfig_with_expired_client_cert(
        &self,
        path: &Path,
        user: &str,
        group: Option<&str>,
        ago: Duration,
    ) -> Result<(), TestApiError> {
        let ago = time::Duration::try_from(ago).map_err(|e| TestApiError::Tls(e.to_string()))?;
        let not_after = time::OffsetDateTime::now_utc() - ago;
        let c = tls::issue_client_valid(
            &self.issuer,
            user,
            group,
            Some((not_after - time::Duration::hours(1), not_after)),
        )?;
        self.write_kubeconfig_with_cert_pair(path, &c.cert_pem, &c.key_pem)
    }

    fn write_kubeconfig_with_cert_pair(
        &self,
        path: &Path,
        cert: &str,
        key: &str,
    ) -> Result<(), TestApiError> {
        kubeconfig::write_text(
            path,
            &kubeconfig::render_with_cert(&self.https_url(), &self.state.config.ca_pem, cert, key),
        )
    }

    /// A kube client using the written kubeconfig.
    pub async fn try_client(&self) -> Result<kube::Client, TestApiError> {
        let kc = kube::config::Kubeconfig::read_from(&self.kubeconfig)
            .map_err(|e| TestApiError::Client(e.to_string()))?;
        let cfg =
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await
                .map_err(|e| TestApiError::Client(e.to_string()))?;
        kube::Client::try_from(cfg).map_err(|e| TestApiError::Client(e.to_string()))
    }

    /// A kube client using the written kubeconfig.
    ///
    /// # Panics
    /// If the client cannot be built from the server's own kubeconfig
    /// (a bug in this crate, not an input error); use
    /// [`TestApiServer::try_client`] to handle it.
    #[allow(clippy::panic)]
    pub async fn client(&self) -> kube::Client {
        match self.try_client().await {
            Ok(c) => c,
            Err(e) => panic!("building a kube client for the test API server: {e}"),
        }
    }

    /// The test knobs.
    pub fn knobs(&self) -> &Knobs {
        &self.state.knobs
    }

    /// Number of objects stored.
    pub fn object_count(&self) -> usize {
        self.state.store.object_count()
    }

    /// Also serves plain HTTP on `listener` (e.g. one created inside a
    /// test network namespace with `NetNs::tcp_listener`).
    pub fn serve_listener(&self, listener: TcpListener) {
        let task = http::spawn_listener(self.state.clone(), listener, None, self.shutdown.clone());
        self.tasks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(task);
    }

    /// Stops serving (also done on drop).
    pub fn stop(&self) {
        self.shutdown.cancel();
        for t in self.tasks.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            t.abort();
        }
    }
}

impl Drop for TestApiServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Objects every cluster has from the start.
fn seed(state: &ApiState, host: IpAddr, https_port: u16) -> Result<(), ApiError> {
    let ns_res =
        resources::find("", "v1", "namespaces").ok_or_else(|| ApiError::internal("namespaces"))?;
    state.store.write(|txn| {
        for ns in namespaces::INITIAL {
            objects::create_in(state, txn, ns_res, "", json!({"metadata": {"name": ns}}), false)?;
        }
        // kube-apiserver's default ServiceCIDR controller
        // (pkg/controlplane/controller/defaultservicecidr): the
        // `kubernetes` ServiceCIDR holding --service-cluster-ip-range,
        // Ready once created.
        let cidrs = resources::find("networking.k8s.io", "v1", "servicecidrs")
            .ok_or_else(|| ApiError::internal("servicecidrs"))?;
        let range = txn.alloc().cidr().to_string();
        objects::create_in(state, txn, cidrs, "", json!({
            "metadata": {"name": "kubernetes"},
            "spec": {"cidrs": [range]},
            "status": {"conditions": [{"type": "Ready", "status": "True",
                                       "message": "Kubernetes default Service CIDR is ready",
                                       "lastTransitionTime": crate::testapi::util::now_rfc3339()}]}
        }), false)?;
        if !state.config.emulate_controllers {
            return Ok(());
        }
        let svc = resources::find("", "v1", "services").ok_or_else(|| ApiError::internal("services"))?;
        let eps = resources::find("", "v1", "endpoints").ok_or_else(|| ApiError::internal("endpoints"))?;
        let slices = resources::find("discovery.k8s.io", "v1", "endpointslices").ok_or_else(|| ApiError::internal("endpointslices"))?;
        let first_ip = txn.alloc().first_ip().map(|i| i.to_string()).unwrap_or_default();
        let family = if host.is_ipv4() { "IPv4" } else { "IPv6" };
        objects::create_in(state, txn, svc, "default", json!({
            "metadata": {"name": "kubernetes", "labels": {"component": "apiserver", "provider": "kubernetes"}},
            "spec": {"clusterIP": first_ip, "ports": [{"name": "https", "port": 443, "protocol": "TCP", "targetPort": https_port}]}
        }), false)?;
        objects::create_in(state, txn, eps, "default", json!({
            "metadata": {"name": "kubernetes", "labels": {"endpointslice.kubernetes.io/skip-mirror": "true"}},
            "subsets": [{"addresses": [{"ip": host.to_string()}], "ports": [{"name": "https", "port": https_port, "protocol": "TCP"}]}]
        }), false)?;
        objects::create_in(state, txn, slices, "default", json!({
            "metadata": {"name": "kubernetes", "labels": {"kubernetes.io/service-name": "kubernetes"}},
            "addressType": family,
            "endpoints": [{"addresses": [host.to_string()], "conditions": {"ready": true}}],
            "ports": [{"name": "https", "port": https_port, "protocol": "TCP"}]
        }), false)?;
        Ok(())
    })
}
