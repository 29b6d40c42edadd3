//! Component tests of the node API (kubelet's :10250) on the in-process
//! node role (test API server, fake CRI runtime): authentication (client
//! certificates, bearer tokens through TokenReview, 401 without
//! credentials), authorization through SubjectAccessReview with kubelet's
//! attributes and 403 text, `kubectl logs` and `kubectl get --raw
//! .../proxy/stats/summary` through the test API server's node proxy,
//! `/configz` and `/runningpods/` (their shape and their `configz`/`pods`
//! subresources), HTTP/2 by ALPN, the read-only port (off unless set, then
//! only kubelet's unauthenticated paths), `tlsMinVersion` and
//! `tlsCipherSuites`, that no answer carries a Secret's value, and that a
//! `kubectl logs -f` whose client goes away frees its stream.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::SocketAddr;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use keelson_tests::node_api::{
    Connect, Credentials, kubectl, own_listening_ports, request, request_connect, request_plain,
    running_pod,
};
use keelson_tests::node_harness::{Configure, InProcessNode, NodeHarnessOptions, free_host_port};
use keelson_tests::support::wait_for;
use keelson_tests::testapi::{StaticToken, TestApiOptions};
use kube::Api;
use kube::api::PostParams;
use serde_json::{Value, json};

const T: Duration = Duration::from_secs(60);
const IMAGE: &str = "keelson.local/busybox:1";

fn token(t: &str, u: &str) -> StaticToken {
    StaticToken {
        token: t.into(),
        user: u.into(),
    }
}

async fn start() -> (InProcessNode, SocketAddr) {
    start_with(None).await
}

fn harness_options(configure: Option<Configure>) -> NodeHarnessOptions {
    NodeHarnessOptions {
        api: TestApiOptions {
            tokens: vec![
                token("admin-token", "admin"),
                token("viewer-token", "viewer"),
                token("nobody-token", "nobody"),
            ],
            ..Default::default()
        },
        configure,
        ..Default::default()
    }
}

async fn start_with(configure: Option<Configure>) -> (InProcessNode, SocketAddr) {
    let node = InProcessNode::start(harness_options(configure))
        .await
        .expect("node starts");
    node.fake.add_image(IMAGE);
    let addr = SocketAddr::new(
        node.config.node.address.parse().unwrap(),
        u16::try_from(node.config.node.port).unwrap(),
    );
    // The API is up once it answers (401 without credentials).
    wait_for(
        "the node API answers",
        T,
        Duration::from_millis(100),
        || async {
            match request(addr, "GET", "/healthz", &Credentials::None).await {
                Ok((401, _)) => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await
    .unwrap();
    (node, addr)
}

/// Grants the user `viewer` `get` on `nodes/<subresource>`.
async fn grant_viewer(node: &InProcessNode, subresource: &str) {
    let apply = |kind: &str, body: Value| {
        let client = node.admin.clone();
        let kind = kind.to_string();
        async move {
            let ar = if kind == "ClusterRole" {
                kube::api::ApiResource::erase::<k8s_openapi::api::rbac::v1::ClusterRole>(&())
            } else {
                kube::api::ApiResource::erase::<k8s_openapi::api::rbac::v1::ClusterRoleBinding>(&())
            };
            let api: Api<kube::api::DynamicObject> = Api::all_with(client, &ar);
            let obj: kube::api::DynamicObject = serde_json::from_value(body).unwrap();
            api.create(&PostParams::default(), &obj).await.unwrap();
        }
    };
    let role = format!("node-{subresource}-reader");
    apply(
        "ClusterRole",
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
               "metadata": {"name": role},
               "rules": [{"apiGroups": [""], "resources": [format!("nodes/{subresource}")], "verbs": ["get"]}]}),
    )
    .await;
    apply(
        "ClusterRoleBinding",
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
               "metadata": {"name": format!("viewer-{subresource}")},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
               "subjects": [{"kind": "User", "name": "viewer", "apiGroup": "rbac.authorization.k8s.io"}]}),
    )
    .await;
}

/// A client certificate in `system:masters`.
fn admin_cert(node: &InProcessNode) -> Credentials {
    let (cert, key) = node
        .api
        .issue_client_certificate("cluster-admin", Some("system:masters"))
        .unwrap();
    Credentials::Cert(cert, key)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn authentication_and_authorization_read_as_kubelet() {
    let (node, addr) = start().await;
    grant_viewer(&node, "stats").await;
    let tok = |t: &str| Credentials::Token(t.to_string());

    // No credentials, and a token the API server does not know: 401.
    assert_eq!(
        request(addr, "GET", "/pods", &Credentials::None)
            .await
            .unwrap(),
        (401, "Unauthorized".to_string())
    );
    assert_eq!(
        request(addr, "GET", "/pods", &tok("made-up"))
            .await
            .unwrap(),
        (401, "Unauthorized".to_string())
    );
    // A user without rights: kubelet's 403 text, with the fine-grained
    // subresource first and its fallback.
    assert_eq!(
        request(addr, "GET", "/stats/summary", &tok("nobody-token"))
            .await
            .unwrap(),
        (
            403,
            "Forbidden (user=nobody, verb=get, resource=nodes, subresource(s)=[stats])\n"
                .to_string()
        )
    );
    assert_eq!(
        request(addr, "GET", "/pods", &tok("viewer-token"))
            .await
            .unwrap(),
        (
            403,
            "Forbidden (user=viewer, verb=get, resource=nodes, subresource(s)=[pods proxy])\n"
                .to_string()
        )
    );
    // nodes/stats granted: the summary.
    let (code, body) = request(addr, "GET", "/stats/summary", &tok("viewer-token"))
        .await
        .unwrap();
    assert_eq!(code, 200, "{body}");
    let summary: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(summary["node"]["nodeName"], json!(node.node_name));
    // A client certificate of the CA in clientCAFile, in system:masters.
    let (cert, key) = node
        .api
        .issue_client_certificate("cluster-admin", Some("system:masters"))
        .unwrap();
    let (code, body) = request(addr, "GET", "/pods", &Credentials::Cert(cert, key))
        .await
        .unwrap();
    assert_eq!(code, 200, "{body}");
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["kind"],
        "PodList"
    );
    // The reviews the node asked: one TokenReview per token (cached), SARs.
    let reqs = node.api.knobs().requests();
    let reviews = reqs.iter().filter(|r| r.resource == "tokenreviews").count();
    assert!(reviews >= 3, "{reviews} TokenReviews");
    let again = request(addr, "GET", "/stats/summary", &tok("viewer-token"))
        .await
        .unwrap();
    assert_eq!(again.0, 200);
    let reqs2 = node.api.knobs().requests();
    assert_eq!(
        reqs2
            .iter()
            .filter(|r| r.resource == "tokenreviews")
            .count(),
        reviews,
        "cached TokenReview answers are reused"
    );
    assert_eq!(
        reqs2
            .iter()
            .filter(|r| r.resource == "subjectaccessreviews")
            .count(),
        reqs.iter()
            .filter(|r| r.resource == "subjectaccessreviews")
            .count(),
        "cached SubjectAccessReview answers are reused"
    );
}

/// Whether the pod's first container is running.
fn first_container_running(p: Pod) -> bool {
    p.status
        .and_then(|s| s.container_statuses)
        .and_then(|c| c.into_iter().next())
        .and_then(|c| c.state)
        .is_some_and(|s| s.running.is_some())
}

/// Creates pod `name` with one container `app` on the node, waits until it
/// runs, and returns its log file's path (its directory made: the fake
/// runtime writes no logs, the test does).
async fn running_app_log(node: &InProcessNode, pods: &Api<Pod>, name: &str) -> std::path::PathBuf {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"nodeName": node.node_name, "containers": [{"name": "app", "image": IMAGE}]}
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let log_path = wait_for(
        "the container runs",
        T,
        Duration::from_millis(100),
        || async {
            let p = pods.get(name).await.map_err(|e| e.to_string())?;
            if !first_container_running(p) {
                return Err("not running".into());
            }
            node.fake
                .containers()
                .into_iter()
                .find(|c| c.metadata.as_ref().is_some_and(|m| m.name == "app"))
                .map(|c| c.log_path)
                .ok_or_else(|| "no container".to_string())
        },
    )
    .await
    .unwrap();
    let log = std::path::PathBuf::from(&log_path);
    std::fs::create_dir_all(log.parent().unwrap()).unwrap();
    log
}

fn log_line(ts: &str, stream: &str, tag: &str, text: &str) -> String {
    format!("{ts} {stream} {tag} {text}\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_logs_and_stats_through_the_api_server() {
    let (node, addr) = start().await;
    let pods: Api<Pod> = Api::namespaced(node.admin.clone(), "default");
    let log = running_app_log(&node, &pods, "talker").await;
    std::fs::write(
        &log,
        [
            log_line("2024-05-01T10:00:00.1Z", "stdout", "F", "hello"),
            log_line("2024-05-01T10:00:01Z", "stderr", "P", "wor"),
            log_line("2024-05-01T10:00:02Z", "stderr", "F", "ld"),
            log_line("2024-05-01T10:00:03Z", "stdout", "F", "bye"),
        ]
        .concat(),
    )
    .unwrap();
    let kc = node.api.kubeconfig_path().to_path_buf();
    let k = |args: Vec<&'static str>| {
        let kc = kc.clone();
        async move { kubectl(&kc, &args, None, T).await.unwrap() }
    };
    let out = k(vec!["logs", "talker"]).await;
    assert!(out.ok, "{out:?}");
    assert_eq!(out.stdout, "hello\nworld\nbye\n");
    // kubelet counts file lines: the last two are the second half of the
    // partial line and "bye".
    let out = k(vec!["logs", "talker", "--tail=2"]).await;
    assert_eq!(out.stdout, "ld\nbye\n", "{out:?}");
    let out = k(vec!["logs", "talker", "--tail=3"]).await;
    assert_eq!(out.stdout, "world\nbye\n", "{out:?}");
    let out = k(vec!["logs", "talker", "--timestamps", "--tail=1"]).await;
    assert_eq!(
        out.stdout, "2024-05-01T10:00:03.000000000Z bye\n",
        "{out:?}"
    );
    let out = k(vec!["logs", "talker", "--limit-bytes=8"]).await;
    assert_eq!(out.stdout, "hello\nwo", "{out:?}");
    let out = k(vec!["logs", "talker", "--since-time=2024-05-01T10:00:03Z"]).await;
    assert_eq!(out.stdout, "bye\n", "{out:?}");
    // No previous instance: kubelet's 400 text.
    let out = k(vec!["logs", "talker", "--previous"]).await;
    assert!(!out.ok);
    assert!(
        out.stderr
            .contains("previous terminated container \"app\" in pod \"talker\" not found"),
        "{out:?}"
    );

    // Stats and resource metrics through nodes/proxy. The summary is the
    // last housekeeping round's: the pod is in it once a round has run
    // after it started.
    let path = format!("/api/v1/nodes/{}/proxy/stats/summary", node.node_name);
    wait_for(
        "talker in the stats summary",
        T,
        Duration::from_millis(500),
        || async {
            let out = kubectl(&kc, &["get", "--raw", &path], None, T)
                .await
                .map_err(|e| e.to_string())?;
            if !out.ok {
                return Err(format!(
                    "{out:?} {:?}",
                    node.api
                        .knobs()
                        .requests()
                        .iter()
                        .filter(|r| r.path.contains("proxy"))
                        .map(|r| (r.path.clone(), r.status))
                        .collect::<Vec<_>>()
                ));
            }
            let s: Value = serde_json::from_str(&out.stdout).map_err(|e| e.to_string())?;
            let found = s["pods"]
                .as_array()
                .is_some_and(|p| p.iter().any(|p| p["podRef"]["name"] == "talker"));
            if found { Ok(()) } else { Err(s.to_string()) }
        },
    )
    .await
    .unwrap();
    let path = format!("/api/v1/nodes/{}/proxy/metrics/resource", node.node_name);
    let out = kubectl(&kc, &["get", "--raw", &path], None, T)
        .await
        .unwrap();
    assert!(out.ok, "{out:?}");
    assert!(
        out.stdout.contains("resource_scrape_error 0"),
        "{}",
        out.stdout
    );
    // Unknown pod and container: kubelet's 404 texts (kube-apiserver
    // checks the container name of pods/log itself, so ask the node).
    let (cert, key) = node
        .api
        .issue_client_certificate("cluster-admin", Some("system:masters"))
        .unwrap();
    let admin = Credentials::Cert(cert, key);
    assert_eq!(
        request(addr, "GET", "/containerLogs/default/talker/nope", &admin)
            .await
            .unwrap(),
        (
            404,
            "container \"nope\" not found in pod \"talker\"".to_string()
        )
    );
    assert_eq!(
        request(addr, "GET", "/containerLogs/default/ghost/app", &admin)
            .await
            .unwrap(),
        (404, "pod \"ghost\" does not exist".to_string())
    );
    let (code, body) = request(
        addr,
        "GET",
        "/containerLogs/default/talker/app?tailLines=x",
        &admin,
    )
    .await
    .unwrap();
    assert_eq!(code, 400);
    assert!(body.contains("tailLines"), "{body}");
    // A runtime that cannot stream (this fake answers Exec with
    // Unimplemented): 500 with the runtime's error.
    let (code, body) = request(
        addr,
        "POST",
        "/exec/default/talker/app?command=ls&output=1",
        &admin,
    )
    .await
    .unwrap();
    assert_eq!(code, 500, "{body}");
    assert!(
        body.starts_with("rpc error: code = Unimplemented"),
        "{body}"
    );
    // No stream asked for: kubelet's 400.
    let (code, body) = request(
        addr,
        "POST",
        "/exec/default/talker/app?command=ls&stdout=1",
        &admin,
    )
    .await
    .unwrap();
    assert_eq!(
        (code, body.as_str()),
        (400, "you must specify at least 1 of stdin, stdout, stderr")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn configz_runningpods_and_http2_read_as_kubelet() {
    let (node, addr) = start().await;
    let admin = admin_cert(&node);
    // /configz: component-base's configz answer, `{"kubeletconfig": ...}`
    // with the effective KubeletConfiguration (v1beta1 field names).
    let resp = request_connect(addr, "GET", "/configz", &admin, Connect::default())
        .await
        .unwrap();
    assert_eq!(resp.status(), 200, "{}", resp.body());
    assert_eq!(resp.headers()["content-type"], "application/json");
    assert_eq!(resp.headers()["x-content-type-options"], "nosniff");
    let z: Value = serde_json::from_str(resp.body()).unwrap();
    let top: Vec<&String> = z.as_object().unwrap().keys().collect();
    assert_eq!(top, ["kubeletconfig"], "{z}");
    let c = &z["kubeletconfig"];
    assert_eq!(c["kind"], "KubeletConfiguration", "{c}");
    assert_eq!(c["apiVersion"], "kubelet.config.k8s.io/v1beta1", "{c}");
    assert_eq!(c["port"], json!(addr.port()), "{c}");
    assert_eq!(c["address"], json!(addr.ip().to_string()), "{c}");
    assert_eq!(c["authentication"]["webhook"]["enabled"], true, "{c}");
    assert_eq!(c["authentication"]["anonymous"]["enabled"], false, "{c}");
    assert_eq!(
        c["authentication"]["x509"]["clientCAFile"],
        json!(node.config.node.authentication.x509.client_ca_file),
        "{c}"
    );
    assert_eq!(c["authorization"]["mode"], "Webhook", "{c}");
    assert!(
        c["readOnlyPort"].is_null() || c["readOnlyPort"] == 0,
        "readOnlyPort is off by default: {c}"
    );
    assert_eq!(c["enableDebuggingHandlers"], true, "{c}");
    // Only KubeletConfiguration fields: kubelet's flags are not in it.
    for flag in ["kubeconfig", "rootDir", "nodeIP", "nodeLabels", "enabled"] {
        assert!(c.get(flag).is_none(), "{flag} in {c}");
    }
    // Its authorization: nodes/configz, then nodes/proxy. (A denial is
    // cached for cacheUnauthorizedTTL, so the user granted is another.)
    let nobody = Credentials::Token("nobody-token".into());
    assert_eq!(
        request(addr, "GET", "/configz", &nobody).await.unwrap(),
        (
            403,
            "Forbidden (user=nobody, verb=get, resource=nodes, subresource(s)=[configz proxy])\n"
                .to_string()
        )
    );
    let viewer = Credentials::Token("viewer-token".into());
    grant_viewer(&node, "configz").await;
    let (code, body) = request(addr, "GET", "/configz", &viewer).await.unwrap();
    assert_eq!(code, 200, "{body}");
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["kubeletconfig"]["port"],
        json!(addr.port())
    );
    // nodes/configz does not open /runningpods/ (nodes/pods or proxy).
    assert_eq!(
        request(addr, "GET", "/runningpods/", &viewer)
            .await
            .unwrap(),
        (
            403,
            "Forbidden (user=viewer, verb=get, resource=nodes, subresource(s)=[pods proxy])\n"
                .to_string()
        )
    );

    // /runningpods/: what the runtime runs, as a PodList of name,
    // namespace, UID and containers (name, image as the runtime has it).
    let pods: Api<Pod> = Api::namespaced(node.admin.clone(), "default");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "runner"},
        "spec": {"nodeName": node.node_name, "containers": [{"name": "app", "image": IMAGE}]}
    }))
    .unwrap();
    let uid = pods
        .create(&PostParams::default(), &pod)
        .await
        .unwrap()
        .metadata
        .uid
        .unwrap();
    let item = wait_for(
        "runner in /runningpods/",
        T,
        Duration::from_millis(200),
        || async {
            let (code, body) = request(addr, "GET", "/runningpods/", &admin).await?;
            if code != 200 {
                return Err(format!("{code} {body}"));
            }
            let l: Value = serde_json::from_str(&body).map_err(|e| e.to_string())?;
            running_pod(&l, "default", "runner")
        },
    )
    .await
    .unwrap();
    let runtime_image = node
        .fake
        .containers()
        .into_iter()
        .find(|c| c.metadata.as_ref().is_some_and(|m| m.name == "app"))
        .and_then(|c| c.image)
        .map(|i| i.image)
        .unwrap();
    assert!(!runtime_image.is_empty());
    // Exactly kubelet's fields (tests/tests/upstream/node_api_cases.rs
    // holds the real kubelet to the same).
    assert_eq!(
        item,
        json!({
            "metadata": {"name": "runner", "namespace": "default", "uid": uid},
            "spec": {"containers": [{"name": "app", "image": runtime_image, "resources": {}}]},
            "status": {},
        })
    );

    // HTTP/2 by ALPN: a GET answered over h2.
    let resp = request_connect(
        addr,
        "GET",
        "/pods",
        &admin,
        Connect {
            http2: true,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    assert_eq!(resp.version(), http::Version::HTTP_2);
    assert_eq!(resp.status(), 200, "{}", resp.body());
    let l: Value = serde_json::from_str(resp.body()).unwrap();
    assert!(
        l["items"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["metadata"]["name"] == "runner"),
        "{l}"
    );

    // No read-only port unless configured: this process listens on the
    // node API's port and on no 10255.
    let ports = own_listening_ports().unwrap();
    assert!(ports.contains(&addr.port()), "{ports:?}");
    assert!(!ports.contains(&10255), "{ports:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_only_port_serves_only_the_unauthenticated_paths() {
    let ro = free_host_port().unwrap();
    let (node, addr) = start_with(Some(std::sync::Arc::new(move |c| {
        c.node.read_only_port = i32::from(ro);
    })))
    .await;
    let ro_addr = SocketAddr::new(addr.ip(), ro);
    assert!(own_listening_ports().unwrap().contains(&ro));
    // Plain HTTP, no credentials: kubelet's InstallAuthNotRequiredHandlers.
    let (code, body) = request_plain(ro_addr, "/healthz").await.unwrap();
    assert_eq!((code, body.as_str()), (200, "ok"));
    let (code, body) = request_plain(ro_addr, "/pods").await.unwrap();
    assert_eq!(code, 200, "{body}");
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["kind"],
        "PodList"
    );
    let (code, body) = request_plain(ro_addr, "/stats/summary").await.unwrap();
    assert_eq!(code, 200, "{body}");
    // Nothing of the authenticated server's own paths.
    for path in [
        "/configz",
        "/runningpods/",
        "/containerLogs/default/p/c",
        "/exec/default/p/c",
    ] {
        assert_eq!(
            request_plain(ro_addr, path).await.unwrap(),
            (404, "404 page not found".to_string()),
            "{path}"
        );
    }
    // The secure port's /configz reports it.
    let (code, body) = request(addr, "GET", "/configz", &admin_cert(&node))
        .await
        .unwrap();
    assert_eq!(code, 200, "{body}");
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["kubeletconfig"]["readOnlyPort"],
        json!(ro)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls13_minimum_refuses_tls12_clients_and_debugging_handlers_off() {
    let (node, addr) = start_with(Some(std::sync::Arc::new(|c| {
        c.node.tls_min_version = "VersionTLS13".into();
        c.node.enable_debugging_handlers = false;
    })))
    .await;
    let admin = admin_cert(&node);
    // A client offering only TLS 1.2: the handshake fails.
    let e = request_connect(
        addr,
        "GET",
        "/pods",
        &admin,
        Connect {
            tls12_only: true,
            ..Default::default()
        },
    )
    .await
    .unwrap_err();
    assert!(e.starts_with("TLS: "), "{e}");
    // TLS 1.3 (and HTTP/2 over it): answered.
    let resp = request_connect(
        addr,
        "GET",
        "/pods",
        &admin,
        Connect {
            http2: true,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    assert_eq!(resp.status(), 200, "{}", resp.body());
    // enableDebuggingHandlers: false. kubelet installs /configz with the
    // debugging handlers: an unknown path; /runningpods/ gets the
    // "disabled" answer.
    assert_eq!(
        request(addr, "GET", "/configz", &admin).await.unwrap(),
        (404, "404 page not found".to_string())
    );
    assert_eq!(
        request(addr, "GET", "/runningpods/", &admin).await.unwrap(),
        (405, "Debug endpoints are disabled.\n".to_string())
    );
}

/// `tlsCipherSuites` limits TLS 1.2 as kubelet's `tls.Config.CipherSuites`
/// does: a client offering only a suite outside the list fails the
/// handshake, one offering a listed suite is served, and TLS 1.3 (whose
/// suites Go does not let one configure) is unaffected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_cipher_suites_limit_tls12_clients() {
    let (node, addr) = start_with(Some(std::sync::Arc::new(|c| {
        c.node.tls_cipher_suites = vec!["TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384".into()];
    })))
    .await;
    let admin = admin_cert(&node);
    let tls12 = |suite| Connect {
        tls12_only: true,
        tls12_suite: Some(suite),
        ..Default::default()
    };
    let get = |connect| request_connect(addr, "GET", "/pods", &admin, connect);
    let e = get(tls12("TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256"))
        .await
        .unwrap_err();
    assert!(e.starts_with("TLS: "), "{e}");
    for connect in [
        tls12("TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384"),
        Connect::default(),
    ] {
        let resp = get(connect).await.unwrap();
        assert_eq!(resp.status(), 200, "{connect:?}: {}", resp.body());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_settings_kubelet_does_not_know_fail_the_start() {
    for (configure, want) in [
        (
            std::sync::Arc::new(|c: &mut keelson::config::Config| {
                c.node.tls_cipher_suites = vec!["TLS_MADE_UP_SUITE".into()];
            }) as Configure,
            "TLS_MADE_UP_SUITE (unknown cipher suite)",
        ),
        (
            std::sync::Arc::new(|c: &mut keelson::config::Config| {
                c.node.tls_min_version = "TLS13".into();
            }) as Configure,
            "unknown tls version",
        ),
    ] {
        let e = InProcessNode::start(harness_options(Some(configure)))
            .await
            .map(|_| ())
            .unwrap_err()
            .to_string();
        assert!(e.contains(want), "{e}");
        let field = if want.contains("suite") {
            "node.tlsCipherSuites"
        } else {
            "node.tlsMinVersion"
        };
        assert!(e.contains(field), "{e}");
    }
}

/// Issue 17: nothing the node API returns contains secret data keelson
/// holds. A pod takes a Secret's value through `env` `valueFrom` and
/// `envFrom`; once keelson has handed the value to the runtime (the fake
/// CRI's recorded container config has it), every data endpoint and an
/// error body are read and none has the value, raw or base64.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_node_api_answer_contains_secret_data() {
    use base64::Engine as _;
    let (node, addr) = start().await;
    let admin = admin_cert(&node);
    let value = format!(
        "s3cr3t-{:016x}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
            ^ u128::from(std::process::id())
    );
    let b64 = base64::engine::general_purpose::STANDARD.encode(&value);
    let secrets: Api<k8s_openapi::api::core::v1::Secret> =
        Api::namespaced(node.admin.clone(), "default");
    let secret: k8s_openapi::api::core::v1::Secret = serde_json::from_value(json!({
        "metadata": {"name": "hush"},
        "stringData": {"token": value}
    }))
    .unwrap();
    secrets
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(node.admin.clone(), "default");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "keeper"},
        "spec": {"nodeName": node.node_name, "containers": [{
            "name": "app", "image": IMAGE,
            "env": [{"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "hush", "key": "token"}}}],
            "envFrom": [{"secretRef": {"name": "hush"}}],
            "volumeMounts": [{"name": "hushed", "mountPath": "/etc/hush"}]
        }],
        "volumes": [{"name": "hushed", "secret": {"secretName": "hush"}}]}
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    wait_for("keeper runs", T, Duration::from_millis(100), || async {
        let p = pods.get("keeper").await.map_err(|e| e.to_string())?;
        if first_container_running(p) {
            Ok(())
        } else {
            Err("not running".to_string())
        }
    })
    .await
    .unwrap();
    // keelson held the value: it gave it to the runtime both ways.
    let envs: Vec<(String, String)> = node
        .fake
        .container_configs()
        .into_iter()
        .filter(|(c, _)| c.metadata.as_ref().is_some_and(|m| m.name == "app"))
        .flat_map(|(c, _)| c.envs.into_iter().map(|e| (e.key, e.value)))
        .collect();
    assert!(
        envs.contains(&("TOKEN".to_string(), value.clone()))
            && envs.contains(&("token".to_string(), value.clone())),
        "{envs:?}"
    );
    // ... and wrote it into the secret volume the container mounts.
    let mounted: Vec<String> = node
        .fake
        .container_configs()
        .into_iter()
        .filter(|(c, _)| c.metadata.as_ref().is_some_and(|m| m.name == "app"))
        .flat_map(|(c, _)| c.mounts)
        .filter(|m| m.container_path == "/etc/hush")
        .filter_map(|m| {
            std::fs::read_to_string(std::path::Path::new(&m.host_path).join("token")).ok()
        })
        .collect();
    assert_eq!(mounted, vec![value.clone()], "the secret volume's file");
    // The summary has the pod once a housekeeping round ran after it
    // started: read everything after that.
    wait_for(
        "keeper in the summary",
        T,
        Duration::from_millis(200),
        || async {
            let (code, body) = request(addr, "GET", "/stats/summary", &admin).await?;
            if code == 200 && body.contains("\"keeper\"") {
                Ok(())
            } else {
                Err(format!("{code} {body}"))
            }
        },
    )
    .await
    .unwrap();
    let paths = [
        "/pods",
        "/runningpods/",
        "/configz",
        "/healthz",
        "/stats/summary",
        "/metrics",
        "/metrics/resource",
        "/metrics/probes",
        "/metrics/cadvisor",
        "/containerLogs/default/keeper/nope",
        "/containerLogs/default/keeper/app",
    ];
    for path in paths {
        let (code, body) = request(addr, "GET", path, &admin).await.unwrap();
        assert!(code < 500, "{path}: {code} {body}");
        assert!(
            !body.is_empty() || path.starts_with("/containerLogs/default/keeper/app"),
            "{path}: empty"
        );
        assert!(
            !body.contains(&value) && !body.contains(&b64),
            "{path} answers with the secret's value: {body}"
        );
    }
    // /pods has the pod as the API server gave it: the Secret by name.
    let (_, body) = request(addr, "GET", "/pods", &admin).await.unwrap();
    assert!(body.contains("\"hush\""), "{body}");
}

/// The files under `path` this process holds open (keelson runs in it).
fn open_fds_on(path: &std::path::Path) -> usize {
    std::fs::read_dir("/proc/self/fd")
        .map(|d| {
            d.flatten()
                .filter(|e| std::fs::read_link(e.path()).is_ok_and(|t| t == path))
                .count()
        })
        .unwrap_or(0)
}

/// A `kubectl logs -f` whose client goes away frees its stream at once:
/// the follower stops and closes the log file while the container still
/// runs (kubelet ends the follow when the request's context is cancelled).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_that_disconnects_frees_its_stream() {
    use tokio::io::AsyncBufReadExt;
    let (node, _addr) = start().await;
    let pods: Api<Pod> = Api::namespaced(node.admin.clone(), "default");
    let log = running_app_log(&node, &pods, "follower").await;
    std::fs::write(
        &log,
        log_line("2024-05-01T10:00:00Z", "stdout", "F", "first"),
    )
    .unwrap();
    assert_eq!(open_fds_on(&log), 0, "nobody reads the log yet");

    let mut child = tokio::process::Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(node.api.kubeconfig_path())
        .args(["logs", "-f", "follower"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let first = tokio::time::timeout(T, lines.next_line()).await;
    assert_eq!(first.unwrap().unwrap().as_deref(), Some("first"));
    // Following: a line written now reaches kubectl.
    use std::io::Write;
    std::fs::OpenOptions::new()
        .append(true)
        .open(&log)
        .unwrap()
        .write_all(log_line("2024-05-01T10:00:01Z", "stdout", "F", "second").as_bytes())
        .unwrap();
    let second = tokio::time::timeout(T, lines.next_line()).await;
    assert_eq!(second.unwrap().unwrap().as_deref(), Some("second"));
    assert_eq!(open_fds_on(&log), 1, "the follower holds the log open");

    child.kill().await.unwrap();
    drop(lines);
    wait_for(
        "the follower closes the log once its client is gone",
        Duration::from_secs(5),
        Duration::from_millis(50),
        || async {
            match open_fds_on(&log) {
                0 => Ok(()),
                n => Err(format!("{n} open")),
            }
        },
    )
    .await
    .unwrap();
    let p = pods.get("follower").await.unwrap();
    assert!(first_container_running(p), "the container still runs");
}
