//! The certificate manager, as client-go's
//! (`staging/src/k8s.io/client-go/util/certificate/certificate_manager.go`):
//! it holds the current certificate, requests a new one through a
//! CertificateSigningRequest when there is none, when the current one no
//! longer matches its template, and at a random 70–90 % of the current
//! one's lifetime (`jitteryDuration`), retries failures with backoff (2 s
//! doubling, 5 steps, then every 32 s), stores each new certificate and
//! installs it without a restart. One manager serves one use: the node's
//! client certificate, or its serving certificate.
//!
//! Where keelson differs on purpose: kubelet exits when it has had no valid
//! client certificate for 5 minutes while the API server answers
//! (`transport.go`'s `exitAfter`); keelson keeps trying, says what it waits
//! for in its log (repeated with back-off) and in `/healthz`, and never
//! enters a crash loop.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use prometheus::{IntCounter, Registry};
use tokio_util::sync::CancellationToken;

use super::CertError;
use super::csr::{self, Outcome, Template};
use super::pair::CertPair;
use super::store::FileStore;
use super::transport::CurrentCert;
use keelson_common::observability::HealthFlag;

/// How long one request waits for approval and issuance
/// (`certificateWaitTimeout`).
pub const WAIT_TIMEOUT: Duration = Duration::from_secs(15 * 60);
/// How long a bootstrap request waits (`requestNodeCertificate`'s hour).
pub const BOOTSTRAP_WAIT_TIMEOUT: Duration = Duration::from_secs(3600);

/// The rotation deadline for a certificate valid from `not_before` for
/// `lifetime`: `not_before + lifetime × (0.7 + 0.2 × jitter)`, `jitter` in
/// [0, 1) (`wait.Jitter(total, 0.2) − 0.3 × total`).
pub fn rotation_deadline(not_before: SystemTime, lifetime: Duration, jitter: f64) -> SystemTime {
    let jitter = jitter.clamp(0.0, 1.0);
    not_before + lifetime.mul_f64(0.7 + 0.2 * jitter)
}

/// True when `pair` still satisfies `template` (CN, and no DNS name, IP or
/// organization missing), as `certSatisfiesTemplate`.
pub fn satisfies(pair: &CertPair, template: &Template) -> bool {
    let l = &pair.leaf;
    l.common_name == template.common_name
        && template.dns_names.iter().all(|d| l.dns_names.contains(d))
        && template
            .ip_addresses
            .iter()
            .all(|i| l.ip_addresses.contains(i))
        && template
            .organizations
            .iter()
            .all(|o| l.organizations.contains(o))
}

/// The backoff between failed attempts: 2 s × 2ⁿ (±10 %) for the first 5,
/// then 32 s.
pub fn retry_delay(failures: u32) -> Duration {
    if failures == 0 || failures > 5 {
        return Duration::from_secs(32);
    }
    let base = 2f64 * 2f64.powi(failures as i32 - 1);
    Duration::from_secs_f64(base * (1.0 + 0.1 * rand::random::<f64>()))
}

/// Which API clients a manager requests certificates with.
pub trait RequestClients: Send + Sync {
    /// The client for the next request, given whether a valid certificate
    /// is installed: kubelet uses the node's own credentials while they
    /// are valid and the bootstrap credentials otherwise.
    fn client(&self, have_valid_certificate: bool) -> Option<kube::Client>;
}

/// One client for everything.
pub struct SingleClient(pub kube::Client);

impl RequestClients for SingleClient {
    fn client(&self, _: bool) -> Option<kube::Client> {
        Some(self.0.clone())
    }
}

/// Metrics of one manager (kubelet's names).
#[derive(Clone)]
pub struct ManagerMetrics {
    renew_errors: IntCounter,
    rotation_seconds: Option<prometheus::Histogram>,
}

impl ManagerMetrics {
    /// The client certificate's: `kubelet_certificate_manager_client_ttl_seconds`,
    /// `kubelet_certificate_manager_client_expiration_renew_errors`.
    pub fn client(registry: &Registry, current: &Arc<CurrentCert>) -> ManagerMetrics {
        let renew_errors = IntCounter::new(
            "kubelet_certificate_manager_client_expiration_renew_errors",
            "Counter of certificate renewal errors.",
        )
        .expect("valid metric");
        let _ = registry.register(Box::new(renew_errors.clone()));
        let _ = registry.register(Box::new(super::metrics::TtlGauge::new(
            "kubelet_certificate_manager_client_ttl_seconds",
            "Gauge of the TTL (time-to-live) of the Kubelet's client certificate. The value is in seconds until certificate expiry (negative if already expired). If client certificate is invalid or unused, the value will be +INF.",
            current.clone(),
        )));
        ManagerMetrics {
            renew_errors,
            rotation_seconds: None,
        }
    }

    /// The serving certificate's: `kubelet_certificate_manager_server_ttl_seconds`,
    /// `kubelet_server_expiration_renew_errors`,
    /// `kubelet_certificate_manager_server_rotation_seconds`.
    pub fn server(registry: &Registry, current: &Arc<CurrentCert>) -> ManagerMetrics {
        let renew_errors = IntCounter::new(
            "kubelet_server_expiration_renew_errors",
            "Counter of certificate renewal errors.",
        )
        .expect("valid metric");
        let _ = registry.register(Box::new(renew_errors.clone()));
        let rotation = prometheus::Histogram::with_opts(
            prometheus::HistogramOpts::new(
                "kubelet_certificate_manager_server_rotation_seconds",
                "Histogram of the number of seconds the previous certificate lived before being rotated.",
            )
            .buckets(vec![
                60.0, 3600.0, 14400.0, 86400.0, 604800.0, 2592000.0, 7776000.0, 15552000.0, 31104000.0,
                124416000.0,
            ]),
        )
        .expect("valid metric");
        let _ = registry.register(Box::new(rotation.clone()));
        let _ = registry.register(Box::new(super::metrics::TtlGauge::new(
            "kubelet_certificate_manager_server_ttl_seconds",
            "Gauge of the shortest TTL (time-to-live) of the Kubelet's serving certificate. The value is in seconds until certificate expiry (negative if already expired). If serving certificate is invalid or unused, the value will be +INF.",
            current.clone(),
        )));
        ManagerMetrics {
            renew_errors,
            rotation_seconds: Some(rotation),
        }
    }
}

/// What a manager needs.
pub struct ManagerConfig {
    /// For logs: `client` or `serving`.
    pub name: &'static str,
    /// The signer asked for.
    pub signer: String,
    /// The current template (may change, e.g. the node's addresses);
    /// `None` while there is nothing to request for (a serving certificate
    /// before the node has an address): requests fail, with back-off, as
    /// client-go's "no template available".
    pub template: Box<dyn Fn() -> Option<Template> + Send + Sync>,
    /// Where certificates are stored.
    pub store: FileStore,
    /// Renew before expiry (`rotateCertificates` / `serverTLSBootstrap`);
    /// without it, a certificate is only requested when there is none.
    pub rotate: bool,
    /// Requested lifetime (`spec.expirationSeconds`), none by default.
    pub requested_lifetime: Option<Duration>,
    /// Name requests after their key (kubelet does for bootstrap requests,
    /// so a restart finds its pending request again).
    pub digested_names: bool,
    /// How long one request may wait for approval and issuance.
    pub wait_timeout: Duration,
}

/// Holds and renews one certificate.
pub struct CertificateManager {
    cfg: ManagerConfig,
    current: Arc<CurrentCert>,
    health: Option<HealthFlag>,
    metrics: Option<ManagerMetrics>,
}

impl CertificateManager {
    /// A manager starting from the store's certificate (or `initial`, e.g.
    /// a kubeconfig's embedded certificate, written into the store when the
    /// store has none), as `getCurrentCertificateOrBootstrap`.
    pub fn new(
        cfg: ManagerConfig,
        initial: Option<CertPair>,
    ) -> Result<CertificateManager, CertError> {
        let current = CurrentCert::new();
        match cfg.store.current()? {
            Some(p) if !p.leaf.expired_at(SystemTime::now()) => current.set(p),
            stored => {
                if let Some(p) = initial {
                    if let Err(e) = cfg.store.update(&p) {
                        tracing::warn!(certificate = cfg.name, error = %e, "unable to store the initial certificate");
                    }
                    current.set(p);
                } else if let Some(p) = stored {
                    // Expired: kept so metrics show it; a request follows at once.
                    current.set(p);
                }
            }
        }
        Ok(CertificateManager {
            cfg,
            current,
            health: None,
            metrics: None,
        })
    }

    /// Reports the state in a health check (failing while there is no
    /// valid certificate, with what keelson waits for).
    pub fn with_health(mut self, flag: HealthFlag) -> Self {
        self.health = Some(flag);
        self
    }

    /// Counts renewal errors and rotations.
    pub fn with_metrics(mut self, m: ManagerMetrics) -> Self {
        self.metrics = Some(m);
        self
    }

    /// The shared slot TLS reads.
    pub fn current(&self) -> Arc<CurrentCert> {
        self.current.clone()
    }

    fn update_health(&self, waiting_for: Option<&str>) {
        let Some(h) = &self.health else { return };
        if self.current.get().is_some() {
            h.set_ok();
        } else {
            h.set_failed(waiting_for.unwrap_or("no valid certificate yet"));
        }
    }

    /// Runs until `shutdown`: waits for the rotation deadline (computed once
    /// per certificate), or requests at once when there is no valid
    /// certificate or it no longer matches the template (checked every
    /// 10 s, as often as it matters), then requests until one is issued.
    pub async fn run(self, clients: Arc<dyn RequestClients>, shutdown: CancellationToken) {
        self.update_health(None);
        // (the certificate's notAfter, its deadline) — drawn once per certificate.
        let mut planned: Option<(SystemTime, Option<SystemTime>)> = None;
        loop {
            let now = SystemTime::now();
            let wait = match self.current.get() {
                None => None,
                Some(p) if (self.cfg.template)().is_some_and(|t| !satisfies(&p, &t)) => {
                    tracing::info!(
                        certificate = self.cfg.name,
                        "certificate does not match the requested names, requesting a new one"
                    );
                    None
                }
                Some(p) => {
                    let deadline = match planned {
                        Some((key, d)) if key == p.leaf.not_after => d,
                        _ => {
                            let d = self.cfg.rotate.then(|| {
                                rotation_deadline(
                                    p.leaf.not_before,
                                    p.leaf.lifetime(),
                                    rand::random::<f64>(),
                                )
                            });
                            tracing::info!(
                                certificate = self.cfg.name,
                                expiration = %fmt_time(p.leaf.not_after),
                                deadline = %d.map(fmt_time).unwrap_or_else(|| "none (rotation off)".to_string()),
                                "certificate rotation deadline determined"
                            );
                            planned = Some((p.leaf.not_after, d));
                            d
                        }
                    };
                    match deadline {
                        None => Some(Duration::from_secs(10)),
                        Some(d) => d.duration_since(now).ok().filter(|w| !w.is_zero()),
                    }
                }
            };
            if let Some(w) = wait {
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(w.min(Duration::from_secs(10))) => {}
                }
                continue;
            }
            let mut failures = 0u32;
            loop {
                match self.rotate_once(clients.as_ref(), &shutdown).await {
                    Ok(()) => break,
                    Err(CertError::ShuttingDown) => return,
                    Err(e) => {
                        failures += 1;
                        if let Some(m) = &self.metrics {
                            m.renew_errors.inc();
                        }
                        let delay = retry_delay(failures);
                        let msg = format!("{e}; retrying in {}s", delay.as_secs());
                        tracing::warn!(certificate = self.cfg.name, error = %e, retry_in_seconds = delay.as_secs(), "unable to get a certificate");
                        self.update_health(Some(&msg));
                        tokio::select! {
                            _ = shutdown.cancelled() => return,
                            _ = tokio::time::sleep(delay) => {}
                        }
                    }
                }
            }
        }
    }

    /// One request: key, CSR, submit, wait, store, install.
    pub async fn rotate_once(
        &self,
        clients: &dyn RequestClients,
        shutdown: &CancellationToken,
    ) -> Result<(), CertError> {
        let template = (self.cfg.template)().ok_or_else(|| {
            CertError::Csr("unable to create a csr, no template available".to_string())
        })?;
        let request = csr::generate(&template)?;
        let usages = csr::usages(&self.cfg.signer);
        let have_valid = self.current.get().is_some();
        let client = clients.client(have_valid).ok_or_else(|| {
            CertError::Client("no credentials to request a certificate with".into())
        })?;
        let name = self
            .cfg
            .digested_names
            .then(|| csr::digested_name(&request.public_key_der, &template, &usages));
        let submitted = csr::submit(
            &client,
            &request,
            name.as_deref(),
            &self.cfg.signer,
            &usages,
            self.cfg.requested_lifetime,
        )
        .await?;
        let waiting = format!(
            "waiting for certificate signing request {} (signer {}) to be approved and issued",
            submitted.name, self.cfg.signer
        );
        tracing::info!(certificate = self.cfg.name, csr = %submitted.name, signer = %self.cfg.signer, "certificate signing request created, waiting for approval and issuance");
        self.update_health(Some(&waiting));
        let name = self.cfg.name;
        let wait = csr::wait_for_certificate(&client, &submitted, self.cfg.wait_timeout, |o| {
            if *o == Outcome::Approved {
                tracing::info!(certificate = name, csr = %submitted.name, "certificate signing request approved, waiting to be issued");
            }
        });
        tokio::pin!(wait);
        // While nobody approves, say so again, less and less often.
        let mut every = Duration::from_secs(30);
        let mut next = tokio::time::Instant::now() + every;
        let cert_pem = loop {
            tokio::select! {
                _ = shutdown.cancelled() => return Err(CertError::ShuttingDown),
                r = &mut wait => break r?,
                _ = tokio::time::sleep_until(next) => {
                    tracing::warn!(certificate = name, csr = %submitted.name, signer = %self.cfg.signer, "still waiting for the certificate signing request to be approved and issued");
                    every = (every * 2).min(Duration::from_secs(300));
                    next = tokio::time::Instant::now() + every;
                }
            }
        };
        let pair = CertPair::from_pem(&cert_pem, &request.key_pem)?;
        let path = self.cfg.store.update(&pair)?;
        if let Some(m) = &self.metrics
            && let (Some(h), Some(old)) = (&m.rotation_seconds, self.current.get_any())
            && let Ok(age) = SystemTime::now().duration_since(old.leaf.not_before)
        {
            h.observe(age.as_secs_f64());
        }
        tracing::info!(
            certificate = self.cfg.name,
            csr = %submitted.name,
            path = %path.display(),
            expiration = %fmt_time(pair.leaf.not_after),
            "certificate issued and installed"
        );
        self.current.set(pair);
        self.update_health(None);
        Ok(())
    }
}

fn fmt_time(t: SystemTime) -> String {
    jiff::Timestamp::try_from(t)
        .map(|ts| ts.to_string())
        .unwrap_or_else(|_| format!("{t:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::certificates::pair::tests::self_signed;

    #[test]
    fn deadline_is_between_70_and_90_percent() {
        let start = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let life = Duration::from_secs(1000);
        assert_eq!(
            rotation_deadline(start, life, 0.0),
            start + Duration::from_secs(700)
        );
        assert_eq!(
            rotation_deadline(start, life, 0.5),
            start + Duration::from_secs(800)
        );
        assert_eq!(
            rotation_deadline(start, life, 1.0),
            start + Duration::from_secs(900)
        );
        for _ in 0..100 {
            let d = rotation_deadline(start, life, rand::random::<f64>());
            let off = d.duration_since(start).expect("after start").as_secs_f64();
            assert!((700.0..=900.0).contains(&off), "{off}");
        }
    }

    #[test]
    fn retries_back_off_then_poll() {
        for (n, base) in [(1, 2.0), (2, 4.0), (3, 8.0), (4, 16.0), (5, 32.0)] {
            let d = retry_delay(n).as_secs_f64();
            assert!((base..=base * 1.1).contains(&d), "{n}: {d}");
        }
        assert_eq!(retry_delay(6), Duration::from_secs(32));
        assert_eq!(retry_delay(60), Duration::from_secs(32));
    }

    #[test]
    fn template_match() {
        let (c, k) = self_signed("system:node:n1", "system:nodes", 1);
        let pair = CertPair::from_pem(&c, &k).expect("pair");
        assert!(satisfies(&pair, &Template::node_client("n1")));
        assert!(!satisfies(&pair, &Template::node_client("n2")));
        let serving = Template::node_serving(
            "n1",
            vec!["node-1".into()],
            vec!["10.0.0.5".parse().expect("ip")],
        );
        assert!(satisfies(&pair, &serving));
        let moved = Template::node_serving(
            "n1",
            vec!["node-1".into()],
            vec!["10.0.0.6".parse().expect("ip")],
        );
        assert!(!satisfies(&pair, &moved));
    }

    #[test]
    fn initial_certificate_goes_to_the_store() {
        let dir = tempfile::tempdir().expect("dir");
        let store = FileStore::new(dir.path(), "keelson-client", None, None).expect("store");
        let (c, k) = self_signed("system:node:n1", "system:nodes", 1);
        let m = CertificateManager::new(
            ManagerConfig {
                name: "client",
                signer: csr::KUBELET_CLIENT_SIGNER.into(),
                template: Box::new(|| Some(Template::node_client("n1"))),
                store: store.clone(),
                rotate: true,
                requested_lifetime: None,
                digested_names: false,
                wait_timeout: WAIT_TIMEOUT,
            },
            Some(CertPair::from_pem(&c, &k).expect("pair")),
        )
        .expect("manager");
        assert!(m.current().get().is_some());
        assert!(store.current().expect("read").is_some());
        let p = m.current().get().expect("current");
        assert!(satisfies(&p, &Template::node_client("n1")));
    }
}
