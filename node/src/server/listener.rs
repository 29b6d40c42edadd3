//! Accepting connections: TLS with kubelet's settings, then HTTP/1.1 (with
//! upgrades, for exec/attach/port-forward) or HTTP/2 by ALPN.

use std::net::SocketAddr;
use std::sync::Arc;

use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::CertificateDer;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

use super::serving_cert::ServingCertificate;
use super::{NodeApi, ServerError};
use crate::config::NodeConfig;
use crate::config::kubelet_api::{self, TlsVersion};

/// rustls' TLS 1.2 suite of a Go suite name (TLS 1.3 names: `None`,
/// those suites are always on).
fn rustls_suite(go_name: &str) -> Option<rustls::SupportedCipherSuite> {
    use rustls::crypto::ring::cipher_suite as cs;
    Some(match go_name {
        "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256" => cs::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
        "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384" => cs::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
        "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305"
        | "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256" => {
            cs::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256
        }
        "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256" => cs::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
        "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384" => cs::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
        "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305" | "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256" => {
            cs::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256
        }
        _ => return None,
    })
}

/// The server TLS configuration: `tlsMinVersion`, `tlsCipherSuites`
/// (TLS 1.3 suites always on), the swappable certificate, client
/// certificates requested when a client CA is configured, ALPN h2 and
/// http/1.1.
pub fn tls_config(
    n: &NodeConfig,
    serving: Arc<ServingCertificate>,
    request_client_cert: bool,
) -> Result<Arc<rustls::ServerConfig>, ServerError> {
    let mut provider = rustls::crypto::ring::default_provider();
    if !n.tls_cipher_suites.is_empty() {
        let mut suites: Vec<rustls::SupportedCipherSuite> = provider
            .cipher_suites
            .iter()
            .filter(|s| matches!(s, rustls::SupportedCipherSuite::Tls13(_)))
            .copied()
            .collect();
        for name in &n.tls_cipher_suites {
            if let Some(s) = rustls_suite(name)
                && !suites.contains(&s)
            {
                suites.push(s);
            }
        }
        provider.cipher_suites = suites;
    }
    let versions: &[&'static rustls::SupportedProtocolVersion] =
        match kubelet_api::parse_tls_min_version(&n.tls_min_version) {
            Ok(TlsVersion::Tls13) => &[&rustls::version::TLS13],
            Ok(TlsVersion::Tls12) => &[&rustls::version::TLS13, &rustls::version::TLS12],
            Err(e) => return Err(ServerError::Tls(e.to_string())),
        };
    let builder = rustls::ServerConfig::builder_with_provider(Arc::new(provider))
        .with_protocol_versions(versions)
        .map_err(|e| ServerError::Tls(e.to_string()))?;
    let builder = if request_client_cert {
        builder.with_client_cert_verifier(super::client_ca::RequestClientCert::new())
    } else {
        builder.with_no_client_auth()
    };
    let mut cfg = builder.with_cert_resolver(serving);
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(cfg))
}

/// Binds `addr`.
pub async fn bind(addr: SocketAddr) -> Result<(TcpListener, SocketAddr), ServerError> {
    let l = TcpListener::bind(addr)
        .await
        .map_err(|error| ServerError::Listen { addr, error })?;
    let local = l
        .local_addr()
        .map_err(|error| ServerError::Listen { addr, error })?;
    Ok((l, local))
}

/// Serves connections until `stop`.
pub async fn serve(
    listener: TcpListener,
    tls: Option<Arc<rustls::ServerConfig>>,
    api: Arc<NodeApi>,
    stop: CancellationToken,
) {
    let acceptor = tls.map(TlsAcceptor::from);
    loop {
        let (stream, peer) = tokio::select! {
            _ = stop.cancelled() => return,
            a = listener.accept() => match a {
                Ok(x) => x,
                Err(e) => {
                    tracing::warn!(error = %e, "node API: accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        let (api, acceptor, stop) = (api.clone(), acceptor.clone(), stop.clone());
        tokio::spawn(async move {
            let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            builder
                .http1()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(std::time::Duration::from_secs(60));
            let served = async {
                match acceptor {
                    Some(acceptor) => {
                        let tls = match acceptor.accept(stream).await {
                            Ok(s) => s,
                            Err(e) => {
                                tracing::debug!(%peer, error = %e, "node API: TLS handshake failed");
                                return;
                            }
                        };
                        let chain: Option<Arc<[CertificateDer<'static>]>> = tls
                            .get_ref()
                            .1
                            .peer_certificates()
                            .map(|c| c.iter().map(|c| c.clone().into_owned()).collect());
                        let svc = hyper::service::service_fn(move |req| {
                            super::routes::handle(api.clone(), chain.clone(), peer, req)
                        });
                        if let Err(e) = builder
                            .serve_connection_with_upgrades(TokioIo::new(tls), svc)
                            .await
                        {
                            tracing::debug!(%peer, error = %e, "node API: connection ended");
                        }
                    }
                    None => {
                        let svc = hyper::service::service_fn(move |req| {
                            super::routes::handle(api.clone(), None, peer, req)
                        });
                        if let Err(e) = builder
                            .serve_connection_with_upgrades(TokioIo::new(stream), svc)
                            .await
                        {
                            tracing::debug!(%peer, error = %e, "node API: connection ended");
                        }
                    }
                }
            };
            tokio::select! {
                _ = served => {}
                _ = stop.cancelled() => {}
            }
        });
    }
}
