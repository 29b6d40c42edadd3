//! Test knobs and the HTTP surface: injected failures and latency, outage
//! (hang and refuse), dropped watches, request log, content negotiation,
//! extra listeners, discovery and health endpoints.

use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::StreamExt;
use http_body_util::{BodyExt, Empty};
use k8s_openapi::api::core::v1::ConfigMap;
use keelson_tests::testapi::{TestApiOptions, TestApiServer};
use kube::api::{Api, ListParams, PostParams, WatchParams};
use serde_json::{Value, json};

async fn server() -> TestApiServer {
    TestApiServer::start(TestApiOptions::default())
        .await
        .expect("test API server starts")
}

/// A plain-HTTP GET with an Accept header; returns status, content type, body.
async fn raw_get(url: &str, accept: &str) -> (u16, String, Bytes) {
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<Empty<Bytes>>();
    let mut req = http::Request::get(url).body(Empty::new()).expect("request");
    if !accept.is_empty() {
        req.headers_mut()
            .insert(http::header::ACCEPT, accept.parse().expect("header"));
    }
    let resp = tokio::time::timeout(Duration::from_secs(10), client.request(req))
        .await
        .expect("answer before deadline")
        .expect("response");
    let status = resp.status().as_u16();
    let ct = resp
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    (status, ct, body)
}

fn cm(name: &str) -> ConfigMap {
    serde_json::from_value(json!({"metadata": {"name": name}})).expect("configmap")
}

#[tokio::test]
async fn injected_failures_latency_and_request_log() {
    let api = server().await;
    let cms: Api<ConfigMap> = Api::default_namespaced(api.client().await);
    api.knobs()
        .fail_next(2, Some("create"), Some("configmaps"), 500);
    for _ in 0..2 {
        match cms.create(&PostParams::default(), &cm("a")).await {
            Err(kube::Error::Api(s)) => {
                assert_eq!((s.code, s.reason.as_str()), (500, "InternalError"))
            }
            other => panic!("expected injected 500, got {other:?}"),
        }
    }
    cms.create(&PostParams::default(), &cm("a"))
        .await
        .expect("third create succeeds");
    // Rules match verb and resource only.
    api.knobs()
        .fail_next(1, Some("get"), Some("configmaps"), 500);
    cms.list(&ListParams::default())
        .await
        .expect("list is not a get");
    assert!(matches!(cms.get("a").await, Err(kube::Error::Api(s)) if s.code == 500));

    api.knobs().set_latency(Duration::from_millis(300));
    let t = Instant::now();
    cms.get("a").await.expect("slow get");
    assert!(
        t.elapsed() >= Duration::from_millis(300),
        "latency injected: {:?}",
        t.elapsed()
    );
    api.knobs().set_latency(Duration::ZERO);

    let log = api.knobs().requests();
    let creates: Vec<_> = log
        .iter()
        .filter(|r| r.verb == "create" && r.resource == "configmaps")
        .collect();
    assert_eq!(
        creates.iter().map(|r| r.status).collect::<Vec<_>>(),
        vec![500, 500, 201]
    );
    assert!(
        creates
            .iter()
            .all(|r| r.namespace == "default" && r.method == "POST")
    );
    assert!(
        log.iter()
            .any(|r| r.verb == "get" && r.name == "a" && r.status == 500)
    );
}

#[tokio::test]
async fn outage_hang_refuse_and_dropped_watches() {
    let api = server().await;
    let cms: Api<ConfigMap> = Api::default_namespaced(api.client().await);
    let rv = cms
        .list(&ListParams::default())
        .await
        .expect("list")
        .metadata
        .resource_version
        .expect("rv");
    let mut w = cms
        .watch(&WatchParams::default(), &rv)
        .await
        .expect("watch")
        .boxed();

    api.knobs().stop_answering();
    // Open watches end.
    let ended = tokio::time::timeout(Duration::from_secs(10), async {
        while w.next().await.is_some() {}
    })
    .await;
    assert!(ended.is_ok(), "watch closed by the outage");
    // New requests hang until resumed.
    let pending = tokio::spawn({
        let cms = cms.clone();
        async move { cms.get("kube-root-ca.crt").await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !pending.is_finished(),
        "request must hang during the outage"
    );
    api.knobs().resume();
    let got = tokio::time::timeout(Duration::from_secs(10), pending)
        .await
        .expect("answered after resume");
    got.expect("task").expect("get after resume");

    // Refusing: the client sees a connection failure, not an API status.
    api.knobs().refuse_connections();
    match tokio::time::timeout(Duration::from_secs(10), cms.get("kube-root-ca.crt"))
        .await
        .expect("fails fast")
    {
        Err(kube::Error::Api(s)) => panic!("expected a transport error, got status {}", s.code),
        Err(_) => {}
        Ok(_) => panic!("request must fail while refusing"),
    }
    api.knobs().resume();
    cms.get("kube-root-ca.crt").await.expect("serving again");

    // drop_watches ends streams without an outage.
    let mut w = cms
        .watch(&WatchParams::default(), "0")
        .await
        .expect("watch")
        .boxed();
    assert!(w.next().await.is_some(), "initial ADDED");
    api.knobs().drop_watches();
    let ended = tokio::time::timeout(Duration::from_secs(10), async {
        while w.next().await.is_some() {}
    })
    .await;
    assert!(ended.is_ok(), "watch dropped");
}

#[tokio::test]
async fn negotiation_discovery_and_extra_listener() {
    let api = server().await;
    let base = api.http_url();
    let pods = format!("{base}/api/v1/namespaces/default/configmaps");
    let (code, _, body) = raw_get(&pods, "application/vnd.kubernetes.protobuf").await;
    assert_eq!(code, 406);
    let status: Value = serde_json::from_slice(&body).expect("status");
    assert_eq!(status["reason"], "NotAcceptable");
    // kube-proxy's Accept: protobuf preferred, JSON accepted → JSON.
    let (code, ct, body) = raw_get(
        &pods,
        "application/vnd.kubernetes.protobuf,application/json",
    )
    .await;
    assert_eq!((code, ct.as_str()), (200, "application/json"));
    let list: Value = serde_json::from_slice(&body).expect("json list");
    assert_eq!(list["kind"], "ConfigMapList");
    // Server-side printing.
    let (code, ct, body) = raw_get(
        &pods,
        "application/json;as=Table;v=v1;g=meta.k8s.io,application/json",
    )
    .await;
    assert_eq!(code, 200);
    assert!(ct.contains("as=Table"), "{ct}");
    let table: Value = serde_json::from_slice(&body).expect("table");
    assert_eq!(table["columnDefinitions"][0]["name"], "Name");
    assert_eq!(table["rows"][0]["cells"][0], "kube-root-ca.crt");

    // Metadata-only views (kube's list_metadata / metadata_watcher).
    let (code, ct, body) = raw_get(
        &pods,
        "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json",
    )
    .await;
    assert_eq!(code, 200);
    assert!(ct.contains("PartialObjectMetadataList"), "{ct}");
    let meta: Value = serde_json::from_slice(&body).expect("json");
    assert_eq!(meta["items"][0]["kind"], "PartialObjectMetadata");
    assert!(meta["items"][0].get("data").is_none());
    let cms: kube::Api<ConfigMap> = kube::Api::default_namespaced(api.client().await);
    let m = cms
        .get_metadata("kube-root-ca.crt")
        .await
        .expect("get_metadata");
    assert_eq!(m.metadata.name.as_deref(), Some("kube-root-ca.crt"));

    for (path, kind) in [
        ("/api", "APIVersions"),
        ("/apis", "APIGroupList"),
        ("/api/v1", "APIResourceList"),
        ("/apis/discovery.k8s.io/v1", "APIResourceList"),
    ] {
        let (code, _, body) = raw_get(&format!("{base}{path}"), "").await;
        let v: Value = serde_json::from_slice(&body).expect("json");
        assert_eq!((code, v["kind"].as_str()), (200, Some(kind)), "{path}");
    }
    let (code, _, body) = raw_get(&format!("{base}/version"), "").await;
    assert_eq!(code, 200);
    assert_eq!(
        serde_json::from_slice::<Value>(&body).expect("json")["major"],
        "1"
    );
    for h in ["/healthz", "/livez", "/readyz"] {
        let (code, _, body) = raw_get(&format!("{base}{h}"), "").await;
        assert_eq!((code, &body[..]), (200, &b"ok"[..]), "{h}");
    }
    let (code, _, _) = raw_get(
        &format!("{base}/apis/apps/v1/namespaces/default/deployments"),
        "",
    )
    .await;
    assert_eq!(code, 404);

    // h2c (HTTP/2 with prior knowledge on the plain listener).
    let h2 = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .http2_only(true)
        .build_http::<Empty<Bytes>>();
    let resp = h2
        .request(
            http::Request::get(format!("{base}/version"))
                .body(Empty::new())
                .expect("request"),
        )
        .await
        .expect("h2c response");
    assert_eq!(
        (resp.status().as_u16(), resp.version()),
        (200, http::Version::HTTP_2)
    );

    // A protobuf body is refused with 415.
    let http1 = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<http_body_util::Full<Bytes>>();
    let req = http::Request::post(&pods)
        .header(
            http::header::CONTENT_TYPE,
            "application/vnd.kubernetes.protobuf",
        )
        .body(http_body_util::Full::new(Bytes::from_static(b"k8s\0")))
        .expect("request");
    let resp = http1.request(req).await.expect("response");
    assert_eq!(resp.status().as_u16(), 415);

    // An extra plain-HTTP listener serves the same API.
    let extra = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = extra.local_addr().expect("addr");
    api.serve_listener(extra);
    let (code, _, body) = raw_get(
        &format!("http://{addr}/api/v1/namespaces/default/configmaps/kube-root-ca.crt"),
        "",
    )
    .await;
    assert_eq!(code, 200);
    assert_eq!(
        serde_json::from_slice::<Value>(&body).expect("json")["metadata"]["name"],
        "kube-root-ca.crt"
    );
}

/// A WebSocket exec/port-forward request (kubectl v1.36's first try) goes
/// to a node that declares `ExtendWebSocketsToKubelet`, as kube-apiserver
/// proxies it there; toward any other node it is refused with 400, which
/// makes kubectl fall back to SPDY (kube-apiserver would translate it).
#[tokio::test]
async fn websocket_streaming_goes_only_to_nodes_that_declare_it() {
    use k8s_openapi::api::core::v1::{Node, Pod};
    use kube::api::{Patch, PatchParams};
    let api = server().await;
    let client = api.client().await;
    // A port nobody listens on: dialing the "node" fails (503).
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port();
    let nodes: Api<Node> = Api::all(client.clone());
    let pods: Api<Pod> = Api::namespaced(client, "default");
    for (node, declared) in [("ws-yes", true), ("ws-no", false)] {
        let n: Node = serde_json::from_value(json!({"metadata": {"name": node}})).expect("node");
        nodes
            .create(&PostParams::default(), &n)
            .await
            .expect("node");
        let mut status = json!({
            "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": closed}},
        });
        if declared {
            status["declaredFeatures"] = json!(["ExtendWebSocketsToKubelet"]);
        }
        nodes
            .patch_status(
                node,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": status})),
            )
            .await
            .expect("node status");
        let p: Pod = serde_json::from_value(json!({
            "metadata": {"name": format!("on-{node}")},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox"}]},
        }))
        .expect("pod");
        pods.create(&PostParams::default(), &p).await.expect("pod");
    }
    let base = api.http_url();
    let ws = |path: String, protocol: &'static str| {
        let url = format!("{base}{path}");
        async move {
            let client =
                hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                    .build_http::<Empty<Bytes>>();
            let req = http::Request::get(url)
                .header("connection", "Upgrade")
                .header("upgrade", "websocket")
                .header("sec-websocket-version", "13")
                .header("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ==")
                .header("sec-websocket-protocol", protocol)
                .body(Empty::new())
                .expect("request");
            let resp = tokio::time::timeout(Duration::from_secs(10), client.request(req))
                .await
                .expect("answer before deadline")
                .expect("response");
            let code = resp.status().as_u16();
            let body = resp.into_body().collect().await.expect("body").to_bytes();
            (code, String::from_utf8_lossy(&body).into_owned())
        }
    };
    let exec =
        |pod: &str| format!("/api/v1/namespaces/default/pods/{pod}/exec?command=ls&stdout=true");
    let pf = |pod: &str| format!("/api/v1/namespaces/default/pods/{pod}/portforward?ports=80");
    for (path, protocol) in [
        (exec("on-ws-no"), "v5.channel.k8s.io"),
        (pf("on-ws-no"), "SPDY/3.1+portforward.k8s.io"),
    ] {
        let (code, body) = ws(path, protocol).await;
        assert_eq!(code, 400, "{body}");
        assert!(body.contains("use SPDY"), "{body}");
    }
    for (path, protocol) in [
        (exec("on-ws-yes"), "v5.channel.k8s.io"),
        (pf("on-ws-yes"), "SPDY/3.1+portforward.k8s.io"),
    ] {
        // Proxied: the dial of the node fails.
        let (code, body) = ws(path, protocol).await;
        assert_eq!(code, 503, "{body}");
    }
}
