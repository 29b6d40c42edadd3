//! Component tests of the node's certificates: TLS bootstrap through a
//! CertificateSigningRequest (approved, denied), and client certificate
//! rotation while pods run. The node role runs in-process with its client
//! built as `keelson run` builds it, against the test API server (which
//! signs approved requests with its CA, rejects expired client
//! certificates on every request) and the fake CRI runtime.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::core::v1::{Node, Pod};
use keelson::certificates::pair::parse_leaf;
use keelson::observability::ProbeKind;
use keelson_tests::node_harness::{InProcessNode, NodeHarnessOptions, condition};
use keelson_tests::support::wait_for;
use keelson_tests::testapi::{StaticToken, TestApiOptions, TestApiServer};
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

const ADMIN_TOKEN: &str = "admin-token";
const BOOTSTRAP_TOKEN: &str = "abcdef.0123456789abcdef";

fn api_options() -> TestApiOptions {
    TestApiOptions {
        // The first token is the admin kubeconfig's; with tokens configured
        // every request needs credentials.
        tokens: vec![
            StaticToken {
                token: ADMIN_TOKEN.into(),
                user: "kubernetes-admin".into(),
            },
            StaticToken {
                token: BOOTSTRAP_TOKEN.into(),
                user: "system:bootstrap:abcdef".into(),
            },
        ],
        ..TestApiOptions::default()
    }
}

/// Node settings for a bootstrap: no node kubeconfig yet, a bootstrap
/// kubeconfig with a bootstrap token.
fn bootstrap_config(dir: PathBuf) -> keelson_tests::node_harness::Configure {
    Arc::new(move |c| {
        c.node.kubeconfig = Some(dir.join("kubelet.conf"));
        c.node.bootstrap_kubeconfig = Some(dir.join("bootstrap-kubelet.conf"));
    })
}

fn write_bootstrap_kubeconfig(api: &TestApiServer, dir: &Path) {
    api.write_kubeconfig(&dir.join("bootstrap-kubelet.conf"), Some(BOOTSTRAP_TOKEN))
        .expect("bootstrap kubeconfig");
}

/// A node with only a bootstrap kubeconfig (a bootstrap token), its
/// kubeconfig to be written in the returned directory.
async fn bootstrapping_node(api: TestApiOptions) -> (InProcessNode, tempfile::TempDir, PathBuf) {
    let kc_dir = tempfile::tempdir().expect("dir");
    let dir = kc_dir.path().to_path_buf();
    let node = InProcessNode::start(NodeHarnessOptions {
        api,
        configure: Some(bootstrap_config(dir.clone())),
        before_start: Some(Arc::new({
            let dir = dir.clone();
            move |api: &TestApiServer| write_bootstrap_kubeconfig(api, &dir)
        })),
        ..NodeHarnessOptions::default()
    })
    .await
    .expect("node");
    (node, kc_dir, dir)
}

async fn csrs(admin: &kube::Client) -> Result<Vec<CertificateSigningRequest>, String> {
    Api::<CertificateSigningRequest>::all(admin.clone())
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .map_err(|e| e.to_string())
}

fn decided(c: &CertificateSigningRequest) -> bool {
    c.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| c.type_ == "Approved" || c.type_ == "Denied")
        })
}

async fn decide(admin: &kube::Client, name: &str, type_: &str, reason: &str) {
    let patch = json!({"status": {"conditions": [{
        "type": type_, "status": "True", "reason": reason, "message": format!("{reason} by the test"),
    }]}});
    Api::<CertificateSigningRequest>::all(admin.clone())
        .patch_subresource(
            "approval",
            name,
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
        .expect("approval");
}

async fn pending_csr(admin: &kube::Client) -> CertificateSigningRequest {
    wait_for(
        "a new certificate signing request",
        Duration::from_secs(60),
        Duration::from_millis(100),
        || async {
            csrs(admin)
                .await?
                .into_iter()
                .find(|c| !decided(c))
                .ok_or_else(|| "none pending".to_string())
        },
    )
    .await
    .expect("CSR")
}

fn health_check(node: &InProcessNode) -> Result<(), String> {
    node.health()
        .single(
            ProbeKind::Liveness,
            keelson::certificates::node::HEALTH_CHECK,
        )
        .map_or_else(
            || Err("check not registered".into()),
            |r| r.map_err(|e| e.to_string()),
        )
}

fn ready(n: &Node) -> Result<(), String> {
    match condition(n, "Ready") {
        Some(c) if c.status == "True" => Ok(()),
        Some(c) => Err(format!("Ready={} {:?}", c.status, c.message)),
        None => Err("no Ready condition".into()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_joins_through_a_bootstrap_csr() {
    let (node, _kc_dir, dir) = bootstrapping_node(api_options()).await;

    // The request is kubelet's: signer, subject, usages, requester.
    let csr = pending_csr(&node.admin).await;
    let name = csr.metadata.name.clone().expect("name");
    assert!(name.starts_with("node-csr-"), "{name}");
    let spec = &csr.spec;
    assert_eq!(
        spec.signer_name,
        "kubernetes.io/kube-apiserver-client-kubelet"
    );
    assert_eq!(
        spec.usages.as_deref(),
        Some(&["digital signature".to_string(), "client auth".to_string()][..])
    );
    assert_eq!(spec.username.as_deref(), Some("system:bootstrap:abcdef"));
    let req =
        rcgen::CertificateSigningRequestParams::from_pem(&String::from_utf8_lossy(&spec.request.0))
            .expect("PKCS#10 request");
    let dn = format!("{:?}", req.params.distinguished_name);
    assert!(
        dn.contains(&format!("system:node:{}", node.node_name)) && dn.contains("system:nodes"),
        "{dn}"
    );

    // While nobody approves: no Node, and /healthz says what keelson waits
    // for (from the moment the request is created, which the API shows a
    // moment earlier).
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let waiting = health_check(&node).expect_err("not healthy while waiting");
        if waiting.contains(&name) && waiting.contains("approved and issued") {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{waiting}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(node.node().await.expect("read").is_none());
    assert!(!dir.join("kubelet.conf").exists());

    decide(&node.admin, &name, "Approved", "KubectlApprove").await;
    node.wait_node(
        "Node Ready after the certificate is issued",
        Duration::from_secs(60),
        ready,
    )
    .await
    .expect("Ready");
    health_check(&node).expect("healthy once issued");

    // The certificate is stored as kubelet stores it, and the kubeconfig points at it.
    let pki = node.config.node.root_dir.join("pki");
    let current = pki.join("keelson-client-current.pem");
    let target = std::fs::read_link(&current).expect("current is a symlink");
    let file = target
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default()
        .to_string();
    assert!(
        file.starts_with("keelson-client-20") && file.ends_with(".pem"),
        "{file}"
    );
    let kubeconfig = std::fs::read_to_string(dir.join("kubelet.conf")).expect("kubeconfig written");
    assert!(
        kubeconfig.contains(&current.display().to_string()),
        "{kubeconfig}"
    );
    // The node's requests are made as the node, with that certificate.
    let users: Vec<String> = node
        .api
        .knobs()
        .requests()
        .into_iter()
        .filter(|r| r.resource == "nodes" && r.verb == "create")
        .map(|r| r.user)
        .collect();
    assert_eq!(users, [format!("system:node:{}", node.node_name)]);
}

/// A node kubeconfig whose client certificate has expired (a node back
/// after a long time off): kubelet treats it as missing
/// (`isClientConfigStillValid`, `pkg/kubelet/certificate/bootstrap/bootstrap.go`)
/// and bootstraps again with the bootstrap kubeconfig: a new CSR, then
/// the kubeconfig rewritten to point at the issued certificate, and the
/// node joins as itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_certificate_expired_bootstraps_again() {
    let kc_dir = tempfile::tempdir().expect("dir");
    let dir = kc_dir.path().to_path_buf();
    let opts = NodeHarnessOptions {
        api: api_options(),
        configure: Some(bootstrap_config(dir.clone())),
        ..NodeHarnessOptions::default()
    };
    let user = format!("system:node:{}", opts.node_name);
    let node = InProcessNode::start(NodeHarnessOptions {
        before_start: Some(Arc::new({
            let dir = dir.clone();
            move |api: &TestApiServer| {
                write_bootstrap_kubeconfig(api, &dir);
                api.write_kubeconfig_with_expired_client_cert(
                    &dir.join("kubelet.conf"),
                    &user,
                    Some("system:nodes"),
                    Duration::from_secs(3600),
                )
                .expect("expired kubeconfig");
            }
        })),
        ..opts
    })
    .await
    .expect("node");
    let expired = std::fs::read_to_string(dir.join("kubelet.conf")).expect("kubeconfig");

    // A request with the bootstrap credentials, for the same identity.
    let csr = pending_csr(&node.admin).await;
    let name = csr.metadata.name.clone().expect("name");
    assert!(name.starts_with("node-csr-"), "{name}");
    assert_eq!(
        csr.spec.signer_name,
        "kubernetes.io/kube-apiserver-client-kubelet"
    );
    assert_eq!(
        csr.spec.username.as_deref(),
        Some("system:bootstrap:abcdef")
    );
    assert!(node.node().await.expect("read").is_none());

    decide(&node.admin, &name, "Approved", "KubectlApprove").await;
    node.wait_node(
        "Node Ready after the new certificate is issued",
        Duration::from_secs(60),
        ready,
    )
    .await
    .expect("Ready");
    health_check(&node).expect("healthy once issued");

    // The kubeconfig now names the stored certificate, which is valid.
    let current = node
        .config
        .node
        .root_dir
        .join("pki")
        .join("keelson-client-current.pem");
    let kubeconfig = std::fs::read_to_string(dir.join("kubelet.conf")).expect("kubeconfig");
    assert_ne!(kubeconfig, expired);
    assert!(
        kubeconfig.contains(&current.display().to_string()),
        "{kubeconfig}"
    );
    assert!(leaf_not_after(&current) > SystemTime::now());
    // Nothing was sent with the expired certificate that the server took:
    // the Node was created as the node, with the new one.
    let users: Vec<String> = node
        .api
        .knobs()
        .requests()
        .into_iter()
        .filter(|r| r.resource == "nodes" && r.verb == "create")
        .map(|r| r.user)
        .collect();
    assert_eq!(users, [format!("system:node:{}", node.node_name)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denied_csr_is_retried_with_backoff_and_reported() {
    let (node, _kc_dir, _) = bootstrapping_node(api_options()).await;
    let first = pending_csr(&node.admin).await.metadata.name.expect("name");
    let denied_at = std::time::Instant::now();
    decide(&node.admin, &first, "Denied", "NotThisNode").await;

    // /healthz names the denial and the retry; the role did not crash.
    wait_for(
        "healthz to report the denial",
        Duration::from_secs(30),
        Duration::from_millis(50),
        || async {
            match health_check(&node) {
                Err(e)
                    if e.contains("denied")
                        && e.contains("NotThisNode")
                        && e.contains("retrying in") =>
                {
                    Ok(())
                }
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await
    .expect("reported");
    // A new request follows after the first backoff step (2 s), not at once.
    let second = pending_csr(&node.admin).await;
    let second_name = second.metadata.name.clone().expect("name");
    assert_ne!(second_name, first);
    assert!(
        denied_at.elapsed() >= Duration::from_millis(1900),
        "retried after {:?}",
        denied_at.elapsed()
    );
    decide(&node.admin, &second_name, "Approved", "KubectlApprove").await;
    node.wait_node(
        "Node Ready after the second request",
        Duration::from_secs(60),
        ready,
    )
    .await
    .expect("Ready");
}

fn leaf_not_after(pem_file: &Path) -> SystemTime {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let text = std::fs::read(pem_file).expect("pair file");
    let der = CertificateDer::pem_slice_iter(&text)
        .next()
        .expect("a certificate")
        .expect("PEM");
    parse_leaf(der.as_ref()).expect("leaf").not_after
}

async fn running_pod(admin: &kube::Client, node: &str) -> Pod {
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "steady", "namespace": "default"},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "keelson.local/busybox:1", "command": ["sleep", "3600"]}]}
    }))
    .expect("pod");
    pods.create(&PostParams::default(), &pod)
        .await
        .expect("create pod");
    wait_for(
        "the pod to run",
        Duration::from_secs(60),
        Duration::from_millis(100),
        || async {
            let p = pods.get("steady").await.map_err(|e| e.to_string())?;
            let running = p
                .status
                .as_ref()
                .and_then(|s| s.container_statuses.as_ref())
                .and_then(|cs| cs.first())
                .and_then(|c| c.state.as_ref())
                .is_some_and(|s| s.running.is_some());
            if running {
                Ok(p)
            } else {
                Err("not running".into())
            }
        },
    )
    .await
    .expect("running")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_certificate_rotates_while_pods_run() {
    // Certificates live 20 s (no backdating): rotation is due at 14–18 s.
    let api = TestApiOptions {
        approve_node_client_csrs: true,
        csr_signing_duration: Duration::from_secs(20),
        csr_signing_backdate: Duration::ZERO,
        ..api_options()
    };
    let (node, _kc_dir, _) = bootstrapping_node(api).await;
    node.wait_node("Node Ready", Duration::from_secs(60), ready)
        .await
        .expect("Ready");
    let ready_node = node.node().await.expect("read").expect("node");
    let ready_since = condition(&ready_node, "Ready").and_then(|c| c.last_transition_time.clone());
    node.fake.add_image("keelson.local/busybox:1");
    let pod = running_pod(&node.admin, &node.node_name).await;
    let container_id = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|c| c.first())
        .and_then(|c| c.container_id.clone());

    let current = node
        .config
        .node
        .root_dir
        .join("pki/keelson-client-current.pem");
    let first_expiry = leaf_not_after(&current);
    // Two rotations; the first certificate expires in between, and the
    // test API server refuses it from then on.
    let seen = std::sync::Mutex::new(vec![std::fs::read_link(&current).expect("link")]);
    let not_ready = std::sync::Mutex::new(Vec::new());
    wait_for(
        "two certificate rotations",
        Duration::from_secs(90),
        Duration::from_millis(200),
        || async {
            let now = std::fs::read_link(&current).map_err(|e| e.to_string())?;
            let count = {
                let mut seen = seen.lock().map_err(|e| e.to_string())?;
                if seen.last() != Some(&now) {
                    seen.push(now);
                }
                seen.len()
            };
            // The Node must stay Ready throughout.
            let n = node.node().await?.ok_or("no node")?;
            if let Err(e) = ready(&n) {
                not_ready.lock().map_err(|e| e.to_string())?.push(e);
            }
            if count >= 3 && SystemTime::now() > first_expiry + Duration::from_secs(2) {
                Ok(())
            } else {
                Err(format!("{count} certificates so far"))
            }
        },
    )
    .await
    .expect("rotated");
    assert_eq!(
        *not_ready.lock().expect("lock"),
        Vec::<String>::new(),
        "the Node was seen NotReady"
    );

    // The node kept talking to the API server after its first certificate
    // expired: a Lease renewal made later than that, and never a 401.
    wait_for(
        "a Lease renewal after the first certificate expired",
        Duration::from_secs(30),
        Duration::from_millis(200),
        || async {
            let lease = node.lease().await?.ok_or("no Lease")?;
            let renew = lease
                .spec
                .and_then(|s| s.renew_time)
                .ok_or("no renewTime")?;
            if SystemTime::from(renew.0) > first_expiry {
                Ok(())
            } else {
                Err(format!("last renewed {:?}", renew.0))
            }
        },
    )
    .await
    .expect("renewed with a newer certificate");
    let node_user = format!("system:node:{}", node.node_name);
    let refused: Vec<_> = node
        .api
        .knobs()
        .requests()
        .into_iter()
        .filter(|r| r.status == 401)
        .map(|r| format!("{} {} {}", r.method, r.path, r.user))
        .collect();
    assert!(refused.is_empty(), "requests refused: {refused:?}");
    assert!(
        node.api
            .knobs()
            .requests()
            .iter()
            .any(|r| r.user == node_user && r.at > first_expiry)
    );
    // No restart, no NotReady.
    let n = node.node().await.expect("read").expect("node");
    assert_eq!(
        condition(&n, "Ready").and_then(|c| c.last_transition_time.clone()),
        ready_since
    );
    let pod: Pod = Api::namespaced(node.admin.clone(), "default")
        .get("steady")
        .await
        .expect("pod");
    let cs = pod
        .status
        .and_then(|s| s.container_statuses)
        .and_then(|c| c.into_iter().next())
        .expect("status");
    assert_eq!(cs.restart_count, 0);
    assert_eq!(cs.container_id, container_id);
    // kubelet's metric: the TTL of the current certificate.
    let metrics = node.metrics_text();
    assert!(
        metrics.contains("kubelet_certificate_manager_client_ttl_seconds"),
        "{metrics}"
    );
}

/// The same manager serves the :10250 serving certificate
/// (`serverTLSBootstrap`): a `kubernetes.io/kubelet-serving` request with
/// the node's names and addresses, approved by someone else, installed for
/// a rustls server, and requested again when the addresses change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serving_certificates_are_a_second_use_of_the_manager() {
    use keelson::certificates::csr::{KUBELET_SERVING_SIGNER, Template};
    use keelson::certificates::manager::{ManagerConfig, SingleClient, WAIT_TIMEOUT};
    use keelson::certificates::{CertificateManager, FileStore, ServerCertResolver};

    let api = TestApiServer::start(api_options()).await.expect("api");
    let admin = api.client().await;
    let dir = tempfile::tempdir().expect("dir");
    let store = FileStore::new(dir.path(), "keelson-server", None, None).expect("store");
    let ip = std::sync::Arc::new(std::sync::Mutex::new(
        "10.0.0.5".parse::<std::net::IpAddr>().expect("ip"),
    ));
    let template_ip = ip.clone();
    let manager = CertificateManager::new(
        ManagerConfig {
            name: "serving",
            signer: KUBELET_SERVING_SIGNER.into(),
            template: Box::new(move || {
                let ip = *template_ip.lock().expect("lock");
                Some(Template::node_serving(
                    "node-s",
                    vec!["node-s".into()],
                    vec![ip],
                ))
            }),
            store: store.clone(),
            rotate: true,
            requested_lifetime: None,
            digested_names: false,
            wait_timeout: WAIT_TIMEOUT,
        },
        None,
    )
    .expect("manager");
    let current = manager.current();
    let resolver = ServerCertResolver(current.clone());
    let stop = tokio_util::sync::CancellationToken::new();
    let task = tokio::spawn(manager.run(Arc::new(SingleClient(admin.clone())), stop.clone()));

    let approve_next = || async {
        let csr = pending_csr(&admin).await;
        assert_eq!(csr.spec.signer_name, "kubernetes.io/kubelet-serving");
        assert_eq!(
            csr.spec.usages.as_deref(),
            Some(&["digital signature".to_string(), "server auth".to_string()][..])
        );
        decide(
            &admin,
            &csr.metadata.name.clone().expect("name"),
            "Approved",
            "KubectlApprove",
        )
        .await;
    };
    approve_next().await;
    let first = wait_for(
        "the serving certificate",
        Duration::from_secs(30),
        Duration::from_millis(100),
        || async { current.get().ok_or_else(|| "none yet".to_string()) },
    )
    .await
    .expect("issued");
    assert_eq!(first.leaf.common_name, "system:node:node-s");
    assert_eq!(first.leaf.dns_names, ["node-s"]);
    assert_eq!(
        first.leaf.ip_addresses,
        ["10.0.0.5".parse::<std::net::IpAddr>().expect("ip")]
    );
    assert!(std::fs::read_link(store.current_path()).is_ok());

    // A TLS server resolving through the manager presents exactly that certificate.
    let served = serve_once(resolver, api.ca_pem()).await;
    assert_eq!(served, first.leaf);

    // The node's address changes: the certificate no longer matches and is requested again.
    *ip.lock().expect("lock") = "10.0.0.6".parse().expect("ip");
    approve_next().await;
    wait_for(
        "a certificate for the new address",
        Duration::from_secs(60),
        Duration::from_millis(100),
        || async {
            let c = current.get().ok_or("none")?;
            if c.leaf.ip_addresses == ["10.0.0.6".parse::<std::net::IpAddr>().expect("ip")] {
                Ok(())
            } else {
                Err(format!("{:?}", c.leaf.ip_addresses))
            }
        },
    )
    .await
    .expect("re-issued");
    stop.cancel();
    let _ = task.await;
}

/// Serves one TLS handshake on loopback with `resolver` and returns the
/// leaf certificate a client (trusting `ca_pem`, for the name `node-s`) saw.
async fn serve_once(
    resolver: keelson::certificates::ServerCertResolver,
    ca_pem: &str,
) -> keelson::certificates::pair::Leaf {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, ServerName};
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let server = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(resolver));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(server));
    let srv = tokio::spawn(async move {
        let (s, _) = listener.accept().await.expect("accept");
        let _ = acceptor.accept(s).await;
    });
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(c.expect("CA PEM")).expect("root");
    }
    let client = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let tls = tokio_rustls::TlsConnector::from(Arc::new(client))
        .connect(ServerName::try_from("node-s").expect("name"), tcp)
        .await
        .expect("handshake verified against the cluster CA");
    let leaf = tls
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|c| c.first())
        .expect("server certificate")
        .clone();
    let _ = srv.await;
    parse_leaf(leaf.as_ref()).expect("leaf")
}

/// A TLS client of the node API that trusts only the test cluster's CA and
/// checks the certificate against the node's IP.
fn node_api_tls(ca_pem: &str) -> tokio_rustls::TlsConnector {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(c.expect("CA PEM")).expect("root");
    }
    let client = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("versions")
    .with_root_certificates(roots)
    .with_no_client_auth();
    tokio_rustls::TlsConnector::from(Arc::new(client))
}

type NodeApiConn = tokio_rustls::client::TlsStream<tokio::net::TcpStream>;

/// Connects to the node API at `addr`, verifying its certificate for the
/// IP; returns the connection and the DER of the certificate it presented.
async fn node_api_connect(
    tls: &tokio_rustls::TlsConnector,
    addr: std::net::SocketAddr,
) -> Result<(NodeApiConn, Vec<u8>), String> {
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let name = rustls::pki_types::ServerName::IpAddress(addr.ip().into());
    let conn = tls
        .connect(name, tcp)
        .await
        .map_err(|e| format!("TLS handshake: {e}"))?;
    let der = conn
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|c| c.first())
        .map(|c| c.as_ref().to_vec())
        .ok_or("no server certificate")?;
    Ok((conn, der))
}

/// One HTTP/1.1 request on an open connection; returns the status line.
async fn status_line(conn: &mut NodeApiConn, path: &str, host: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    conn.write_all(format!("GET {path} HTTP/1.1\r\nHost: {host}\r\n\r\n").as_bytes())
        .await
        .expect("write on the open connection");
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(30), conn.read(&mut buf))
        .await
        .expect("an answer in time")
        .expect("read on the open connection");
    String::from_utf8_lossy(&buf[..n])
        .lines()
        .next()
        .unwrap_or_default()
        .to_string()
}

/// `serverTLSBootstrap` end to end in the node role: no certificate and no
/// TLS until someone approves the `kubernetes.io/kubelet-serving` request
/// (whose fields are kubelet's), then the issued certificate on :10250
/// (verified against the cluster CA for the node IP), stored as
/// `kubelet-server-current.pem`; renewed before it expires (20 s lifetime)
/// and served from the next connection on, while a connection opened
/// before the rotation keeps working.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_node_api_serves_a_bootstrapped_serving_certificate_and_rotates_it() {
    let Some(node_ip) = keelson_tests::node_harness::host_ipv4() else {
        keelson_tests::support::skip(
            "the_node_api_serves_a_bootstrapped_serving_certificate_and_rotates_it",
            "this host has no non-loopback IPv4 address for the node IP",
        );
        return;
    };
    let api = TestApiOptions {
        csr_signing_duration: Duration::from_secs(20),
        csr_signing_backdate: Duration::ZERO,
        ..api_options()
    };
    let node = InProcessNode::start(NodeHarnessOptions {
        api,
        configure: Some(Arc::new(|c| c.node.server_tls_bootstrap = true)),
        ..NodeHarnessOptions::default()
    })
    .await
    .expect("node");
    let port = u16::try_from(node.config.node.port).expect("port");
    let addr = std::net::SocketAddr::new(node_ip, port);
    let tls = node_api_tls(node.api.ca_pem());
    let pki = node.config.node.root_dir.join("pki");

    // The request, with kubelet's fields; nobody approves it on its own.
    let csr = pending_csr(&node.admin).await;
    let spec = &csr.spec;
    assert_eq!(spec.signer_name, "kubernetes.io/kubelet-serving");
    assert_eq!(
        spec.usages.as_deref(),
        Some(&["digital signature".to_string(), "server auth".to_string()][..])
    );
    assert_eq!(spec.expiration_seconds, None);
    let request = String::from_utf8(spec.request.0.clone()).expect("PEM");
    let params =
        rcgen::CertificateSigningRequestParams::from_pem(&request).expect("a PKCS#10 request");
    let dn: Vec<(rcgen::DnType, String)> = params
        .params
        .distinguished_name
        .iter()
        .map(|(t, v)| {
            let v = match v {
                rcgen::DnValue::Utf8String(s) => s.clone(),
                rcgen::DnValue::PrintableString(s) => s.as_str().to_string(),
                other => format!("{other:?}"),
            };
            (t.clone(), v)
        })
        .collect();
    assert!(
        dn.contains(&(
            rcgen::DnType::CommonName,
            format!("system:node:{}", node.node_name)
        )),
        "{dn:?}"
    );
    assert!(
        dn.contains(&(rcgen::DnType::OrganizationName, "system:nodes".to_string())),
        "{dn:?}"
    );
    let sans = &params.params.subject_alt_names;
    assert!(
        sans.contains(&rcgen::SanType::IpAddress(node_ip)),
        "{sans:?}"
    );
    assert!(
        sans.iter()
            .any(|s| matches!(s, rcgen::SanType::DnsName(n) if n.as_str() == node.node_name)),
        "{sans:?}"
    );

    // Until it is approved, :10250 completes no handshake and the TTL is +Inf.
    assert!(node_api_connect(&tls, addr).await.is_err());
    let ttl = node
        .metrics_text()
        .lines()
        .find_map(|l| l.strip_prefix("kubelet_certificate_manager_server_ttl_seconds "))
        .map(|v| v.parse::<f64>().expect("a number"));
    assert!(ttl.is_some_and(|v| v.is_infinite() && v > 0.0), "{ttl:?}");
    assert!(!pki.join("kubelet-server-current.pem").exists());
    decide(
        &node.admin,
        &csr.metadata.name.clone().expect("name"),
        "Approved",
        "KubectlApprove",
    )
    .await;
    let (mut old_conn, first) = wait_for(
        "the node API serving the issued certificate",
        Duration::from_secs(60),
        Duration::from_millis(200),
        || node_api_connect(&tls, addr),
    )
    .await
    .expect("served");
    let first_leaf = parse_leaf(&first).expect("leaf");
    assert_eq!(
        first_leaf.common_name,
        format!("system:node:{}", node.node_name)
    );
    assert!(first_leaf.ip_addresses.contains(&node_ip));
    let current = pki.join("kubelet-server-current.pem");
    let target = std::fs::read_link(&current).expect("kubelet-server-current.pem is a link");
    assert!(
        target
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("kubelet-server-") && n != "kubelet-server-current.pem"),
        "{target:?}"
    );
    assert_eq!(leaf_not_after(&current), first_leaf.not_after);
    let host = addr.to_string();
    let before = status_line(&mut old_conn, "/healthz", &host).await;
    assert!(before.starts_with("HTTP/1.1 "), "{before}");

    // Renewal at 70–90 % of 20 s: a new request, approved by the test again.
    let renewal = pending_csr(&node.admin).await;
    assert_eq!(renewal.spec.signer_name, "kubernetes.io/kubelet-serving");
    decide(
        &node.admin,
        &renewal.metadata.name.clone().expect("name"),
        "Approved",
        "KubectlApprove",
    )
    .await;
    let (_new_conn, second) = wait_for(
        "the node API serving the renewed certificate",
        Duration::from_secs(60),
        Duration::from_millis(200),
        || async {
            let (c, der) = node_api_connect(&tls, addr).await?;
            if der == first {
                Err("still the first certificate".to_string())
            } else {
                Ok((c, der))
            }
        },
    )
    .await
    .expect("rotated");
    let second_leaf = parse_leaf(&second).expect("leaf");
    assert!(second_leaf.not_after > first_leaf.not_after);
    assert_ne!(
        std::fs::read_link(&current).expect("link"),
        target,
        "a new dated file"
    );
    // The connection opened with the first certificate still answers.
    let after = status_line(&mut old_conn, "/healthz", &host).await;
    assert!(after.starts_with("HTTP/1.1 "), "{after}");
    assert!(
        node.metrics_text()
            .contains("kubelet_certificate_manager_server_rotation_seconds_count 1"),
        "{}",
        node.metrics_text()
    );
}
