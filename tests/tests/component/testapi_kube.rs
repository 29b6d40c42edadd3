//! The test API server driven with the `kube` crate: CRUD and conflicts,
//! status subresource, patches, selectors, pagination, defaults,
//! allocation, graceful delete, finalizers, binding, eviction, events,
//! namespaces, token requests and authentication.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ConfigMap, Event, Namespace, Pod, Service, ServiceAccount};
use k8s_openapi::api::events::v1::Event as EventV1;
use keelson_tests::testapi::{StaticToken, TestApiOptions, TestApiServer};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::core::Status;
use serde_json::{Value, json};

async fn server() -> TestApiServer {
    TestApiServer::start(TestApiOptions::default())
        .await
        .expect("test API server starts")
}

fn api_error(e: kube::Error) -> Status {
    match e {
        kube::Error::Api(s) => *s,
        other => panic!("expected an API error, got {other:?}"),
    }
}

fn cm(name: &str, v: &str) -> ConfigMap {
    serde_json::from_value(json!({"metadata": {"name": name}, "data": {"v": v}}))
        .expect("configmap")
}

fn pod(name: &str, labels: Value) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": labels},
        "spec": {"containers": [{"name": "c", "image": "busybox", "readinessProbe": {"httpGet": {"port": 8080}}}]}
    }))
    .expect("pod")
}

fn rv(meta: &kube::core::ObjectMeta) -> u64 {
    meta.resource_version
        .as_deref()
        .unwrap_or("0")
        .parse()
        .expect("numeric resourceVersion")
}

#[tokio::test]
async fn crud_conflict_and_noop_updates() {
    let api = server().await;
    let cms: Api<ConfigMap> = Api::default_namespaced(api.client().await);
    let created = cms
        .create(&PostParams::default(), &cm("a", "1"))
        .await
        .expect("create");
    assert!(created.metadata.uid.is_some());
    assert!(created.metadata.creation_timestamp.is_some());
    let e = api_error(
        cms.create(&PostParams::default(), &cm("a", "1"))
            .await
            .expect_err("duplicate"),
    );
    assert_eq!((e.code, e.reason.as_str()), (409, "AlreadyExists"));

    let mut stale = created.clone();
    let mut fresh = cms.get("a").await.expect("get");
    fresh.data = Some(BTreeMap::from([("v".into(), "2".into())]));
    let updated = cms
        .replace("a", &PostParams::default(), &fresh)
        .await
        .expect("update");
    assert!(rv(&updated.metadata) > rv(&created.metadata));
    assert_eq!(updated.metadata.uid, created.metadata.uid);

    stale.data = Some(BTreeMap::from([("v".into(), "3".into())]));
    let e = api_error(
        cms.replace("a", &PostParams::default(), &stale)
            .await
            .expect_err("stale rv"),
    );
    assert_eq!((e.code, e.reason.as_str()), (409, "Conflict"));
    assert!(
        e.message.contains("the object has been modified"),
        "{}",
        e.message
    );

    // An update that changes nothing does not bump the resourceVersion.
    let same = cms
        .replace("a", &PostParams::default(), &updated)
        .await
        .expect("no-op update");
    assert_eq!(rv(&same.metadata), rv(&updated.metadata));

    // Name mismatch and missing object.
    let e = api_error(
        cms.replace("b", &PostParams::default(), &updated)
            .await
            .expect_err("name mismatch"),
    );
    assert_eq!(e.code, 400);
    let e = api_error(cms.get("nope").await.expect_err("missing"));
    assert_eq!(
        (e.code, e.reason.as_str(), e.message.as_str()),
        (404, "NotFound", "configmaps \"nope\" not found")
    );

    // Plain configmaps answer a Success Status on delete.
    let gone = cms
        .delete("a", &DeleteParams::default())
        .await
        .expect("delete");
    assert!(gone.is_right(), "configmap delete answers a Status");
    assert_eq!(
        api_error(cms.get("a").await.expect_err("deleted")).code,
        404
    );

    // EndpointSlice addressType is immutable.
    let slices: Api<k8s_openapi::api::discovery::v1::EndpointSlice> =
        Api::default_namespaced(cms.clone().into_client());
    let es: k8s_openapi::api::discovery::v1::EndpointSlice = serde_json::from_value(json!({
        "metadata": {"name": "es", "labels": {"kubernetes.io/service-name": "s"}},
        "addressType": "IPv4", "endpoints": [{"addresses": ["10.0.0.1"]}], "ports": [{"port": 80}]}))
    .expect("slice");
    let es = slices
        .create(&PostParams::default(), &es)
        .await
        .expect("create slice");
    assert_eq!(
        es.ports
            .as_ref()
            .and_then(|p| p[0].protocol.clone())
            .as_deref(),
        Some("TCP")
    );
    let mut v6 = es.clone();
    v6.address_type = "IPv6".into();
    let e = api_error(
        slices
            .replace("es", &PostParams::default(), &v6)
            .await
            .expect_err("immutable"),
    );
    assert_eq!(e.code, 422);

    // generateName and validation.
    let generated: ConfigMap =
        serde_json::from_value(json!({"metadata": {"generateName": "gen-"}})).expect("cm");
    let g = cms
        .create(&PostParams::default(), &generated)
        .await
        .expect("generateName");
    let name = g.metadata.name.unwrap_or_default();
    assert!(name.starts_with("gen-") && name.len() == 9, "{name}");
    let e = api_error(
        cms.create(&PostParams::default(), &cm("Bad_Name", "x"))
            .await
            .expect_err("invalid name"),
    );
    assert_eq!((e.code, e.reason.as_str()), (422, "Invalid"));
}

#[tokio::test]
async fn status_subresource_and_generation() {
    let api = server().await;
    let pods: Api<Pod> = Api::default_namespaced(api.client().await);
    let mut p = pod("p", json!({}));
    p.status = Some(serde_json::from_value(json!({"phase": "Running"})).expect("status"));
    let created = pods
        .create(&PostParams::default(), &p)
        .await
        .expect("create");
    let status = created.status.clone().expect("status set on create");
    assert_eq!(
        status.phase.as_deref(),
        Some("Pending"),
        "create resets status"
    );
    assert_eq!(status.qos_class.as_deref(), Some("BestEffort"));
    assert_eq!(created.metadata.generation, Some(1));

    // Status update ignores spec changes.
    let mut s = created.clone();
    s.status = Some(
        serde_json::from_value(json!({"phase": "Running", "podIP": "10.0.0.5"})).expect("status"),
    );
    if let Some(spec) = s.spec.as_mut() {
        spec.containers[0].image = Some("other".into());
    }
    let after = pods
        .replace_status("p", &PostParams::default(), &s)
        .await
        .expect("status update");
    assert_eq!(
        after.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Running")
    );
    assert_eq!(
        after
            .spec
            .as_ref()
            .and_then(|s| s.containers[0].image.as_deref()),
        Some("busybox")
    );
    assert_eq!(after.metadata.generation, Some(1));

    // Main update ignores status changes; a spec change bumps generation.
    let mut m = after.clone();
    m.status = Some(serde_json::from_value(json!({"phase": "Failed"})).expect("status"));
    if let Some(spec) = m.spec.as_mut() {
        spec.containers[0].image = Some("busybox:2".into());
    }
    let main = pods
        .replace("p", &PostParams::default(), &m)
        .await
        .expect("update");
    assert_eq!(
        main.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Running")
    );
    assert_eq!(main.metadata.generation, Some(2));

    // A status update may not change qosClass.
    let e = api_error(
        pods.patch_status(
            "p",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"qosClass": "Guaranteed"}})),
        )
        .await
        .expect_err("qosClass is immutable"),
    );
    assert_eq!(e.code, 422);

    // Forbidden pod spec change.
    let mut bad = main.clone();
    if let Some(spec) = bad.spec.as_mut() {
        spec.restart_policy = Some("Never".into());
    }
    let e = api_error(
        pods.replace("p", &PostParams::default(), &bad)
            .await
            .expect_err("immutable"),
    );
    assert_eq!(e.code, 422);
    assert!(
        e.message.contains("pod updates may not change fields"),
        "{}",
        e.message
    );
}

#[tokio::test]
async fn patch_types() {
    let api = server().await;
    let client = api.client().await;
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    pods.create(&PostParams::default(), &pod("p", json!({"a": "1"})))
        .await
        .expect("create");

    // Strategic merge on status: conditions merge by type.
    let pp = PatchParams::default();
    pods.patch_status(
        "p",
        &pp,
        &Patch::Strategic(json!({"status": {"conditions": [
        {"type": "Ready", "status": "False"}, {"type": "Initialized", "status": "True"}]}})),
    )
    .await
    .expect("smp 1");
    let p = pods
        .patch_status(
            "p",
            &pp,
            &Patch::Strategic(
                json!({"status": {"conditions": [{"type": "Ready", "status": "True"}]}}),
            ),
        )
        .await
        .expect("smp 2");
    let conds = p.status.and_then(|s| s.conditions).unwrap_or_default();
    assert_eq!(conds.len(), 2, "merged by type: {conds:?}");
    assert!(
        conds
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True")
    );

    // Strategic merge on spec containers by name (image is mutable).
    let p = pods
        .patch(
            "p",
            &pp,
            &Patch::Strategic(
                json!({"spec": {"containers": [{"name": "c", "image": "busybox:3"}]}}),
            ),
        )
        .await
        .expect("smp spec");
    let c = &p.spec.expect("spec").containers;
    assert_eq!((c.len(), c[0].image.as_deref()), (1, Some("busybox:3")));
    assert!(
        c[0].readiness_probe.is_some(),
        "other container fields kept"
    );

    // JSON merge patch and JSON patch.
    let p = pods
        .patch(
            "p",
            &pp,
            &Patch::Merge(json!({"metadata": {"labels": {"a": null, "b": "2"}}})),
        )
        .await
        .expect("merge");
    assert_eq!(
        p.metadata.labels,
        Some(BTreeMap::from([("b".to_string(), "2".to_string())]))
    );
    let jp: json_patch::Patch =
        serde_json::from_value(json!([{"op": "add", "path": "/metadata/labels/c", "value": "3"}]))
            .expect("patch");
    let p = pods
        .patch("p", &pp, &Patch::Json::<()>(jp))
        .await
        .expect("json patch");
    assert_eq!(
        p.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("c"))
            .map(String::as_str),
        Some("3")
    );
    let failing: json_patch::Patch =
        serde_json::from_value(json!([{"op": "test", "path": "/metadata/name", "value": "x"}]))
            .expect("patch");
    let e = api_error(
        pods.patch("p", &pp, &Patch::Json::<()>(failing))
            .await
            .expect_err("test op fails"),
    );
    assert_eq!(e.code, 422);

    // A uid in a patch is a precondition, as the kubelet's status patches use it.
    let e = api_error(
        pods.patch_status(
            "p",
            &pp,
            &Patch::Strategic(
                json!({"metadata": {"uid": "other"}, "status": {"phase": "Running"}}),
            ),
        )
        .await
        .expect_err("uid precondition"),
    );
    assert_eq!(e.code, 409);
    assert!(
        e.message.contains("Precondition failed: UID"),
        "{}",
        e.message
    );

    // Patch with a stale resourceVersion is a conflict.
    let e = api_error(
        pods.patch(
            "p",
            &pp,
            &Patch::Merge(json!({"metadata": {"resourceVersion": "1", "labels": {"d": "4"}}})),
        )
        .await
        .expect_err("stale patch"),
    );
    assert_eq!(e.code, 409);

    // Server-side apply creates, then updates; it needs a field manager.
    let cms: Api<ConfigMap> = Api::default_namespaced(client);
    let applied = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "ssa"}, "data": {"k": "1"}});
    let c = cms
        .patch("ssa", &PatchParams::apply("test"), &Patch::Apply(&applied))
        .await
        .expect("apply create");
    assert_eq!(
        c.data.and_then(|d| d.get("k").cloned()).as_deref(),
        Some("1")
    );
    let applied2 = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "ssa"}, "data": {"k": "2"}});
    let c = cms
        .patch("ssa", &PatchParams::apply("test"), &Patch::Apply(&applied2))
        .await
        .expect("apply update");
    assert_eq!(
        c.data.and_then(|d| d.get("k").cloned()).as_deref(),
        Some("2")
    );
    let e = api_error(
        cms.patch("ssa", &PatchParams::default(), &Patch::Apply(&applied2))
            .await
            .expect_err("no manager"),
    );
    assert_eq!(e.code, 422);
}

#[tokio::test]
async fn selectors_and_pagination() {
    let api = server().await;
    let client = api.client().await;
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    for (i, tier) in ["web", "web", "db"].iter().enumerate() {
        pods.create(
            &PostParams::default(),
            &pod(&format!("p{i}"), json!({"tier": tier, "i": i.to_string()})),
        )
        .await
        .expect("create");
    }
    pods.patch_status(
        "p2",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"phase": "Running"}})),
    )
    .await
    .expect("status");
    let names = |l: kube::core::ObjectList<Pod>| {
        l.items
            .into_iter()
            .filter_map(|p| p.metadata.name)
            .collect::<Vec<_>>()
    };
    let l = pods
        .list(&ListParams::default().labels("tier=web"))
        .await
        .expect("labels");
    assert_eq!(names(l), vec!["p0", "p1"]);
    let l = pods
        .list(&ListParams::default().labels("tier in (db),i!=0"))
        .await
        .expect("set labels");
    assert_eq!(names(l), vec!["p2"]);
    let l = pods
        .list(&ListParams::default().fields("status.phase=Running"))
        .await
        .expect("phase");
    assert_eq!(names(l), vec!["p2"]);
    let l = pods
        .list(&ListParams::default().fields("spec.nodeName=,metadata.name!=p0"))
        .await
        .expect("node");
    assert_eq!(names(l), vec!["p1", "p2"]);
    let e = api_error(
        pods.list(&ListParams::default().fields("spec.bogus=1"))
            .await
            .expect_err("unsupported"),
    );
    assert_eq!(e.code, 400);
    assert!(
        e.message.contains("field label not supported: spec.bogus"),
        "{}",
        e.message
    );

    // Pagination over 25 configmaps, 10 per page.
    let cms: Api<ConfigMap> = Api::namespaced(client, "kube-system");
    for i in 0..25 {
        cms.create(&PostParams::default(), &cm(&format!("c{i:02}"), "x"))
            .await
            .expect("create");
    }
    let first = cms
        .list(&ListParams::default().limit(10))
        .await
        .expect("page 1");
    assert_eq!(first.items.len(), 10);
    // 25 plus the namespace's kube-root-ca.crt.
    assert_eq!(first.metadata.remaining_item_count, Some(16));
    let mut all = first.items.len();
    let mut token = first.metadata.continue_;
    let mut pages = 1;
    while let Some(t) = token.filter(|t| !t.is_empty()) {
        let page = cms
            .list(&ListParams::default().limit(10).continue_token(&t))
            .await
            .expect("next page");
        all += page.items.len();
        token = page.metadata.continue_;
        pages += 1;
    }
    assert_eq!((all, pages), (26, 3));
    // deletecollection with a selector.
    let deleted = cms
        .delete_collection(
            &DeleteParams::default(),
            &ListParams::default().fields("metadata.name=c00"),
        )
        .await
        .expect("deletecollection");
    assert_eq!(deleted.left().map(|l| l.items.len()), Some(1));
    assert_eq!(
        cms.list(&ListParams::default())
            .await
            .expect("list")
            .items
            .len(),
        25
    );

    // A continue token from before a compaction is gone.
    let p = cms
        .list(&ListParams::default().limit(5))
        .await
        .expect("page");
    cms.create(&PostParams::default(), &cm("later", "x"))
        .await
        .expect("create");
    api.knobs().compact();
    let e = api_error(
        cms.list(
            &ListParams::default()
                .limit(5)
                .continue_token(p.metadata.continue_.as_deref().unwrap_or_default()),
        )
        .await
        .expect_err("expired continue"),
    );
    assert_eq!((e.code, e.reason.as_str()), (410, "Expired"));
}

#[tokio::test]
async fn defaults_and_service_allocation() {
    let api = server().await;
    let client = api.client().await;
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    let p = pods
        .create(&PostParams::default(), &pod("d", json!({})))
        .await
        .expect("pod");
    let spec = p.spec.expect("spec");
    assert_eq!(spec.restart_policy.as_deref(), Some("Always"));
    assert_eq!(spec.dns_policy.as_deref(), Some("ClusterFirst"));
    assert_eq!(spec.termination_grace_period_seconds, Some(30));
    assert_eq!(spec.scheduler_name.as_deref(), Some("default-scheduler"));
    assert_eq!(spec.service_account_name.as_deref(), Some("default"));
    assert_eq!(spec.priority, Some(0));
    let c = &spec.containers[0];
    assert_eq!(c.image_pull_policy.as_deref(), Some("Always"));
    assert_eq!(
        c.termination_message_path.as_deref(),
        Some("/dev/termination-log")
    );
    assert_eq!(c.termination_message_policy.as_deref(), Some("File"));
    let probe = c.readiness_probe.as_ref().expect("probe");
    assert_eq!(
        (
            probe.period_seconds,
            probe.timeout_seconds,
            probe.success_threshold,
            probe.failure_threshold
        ),
        (Some(10), Some(1), Some(1), Some(3))
    );
    assert!(c.volume_mounts.as_ref().is_some_and(|m| {
        m.iter()
            .any(|m| m.mount_path == "/var/run/secrets/kubernetes.io/serviceaccount")
    }));

    let svcs: Api<Service> = Api::default_namespaced(client);
    let mk = |name: &str, spec: Value| -> Service {
        serde_json::from_value(json!({"metadata": {"name": name}, "spec": spec})).expect("service")
    };
    let s = svcs
        .create(
            &PostParams::default(),
            &mk("np", json!({"type": "NodePort", "ports": [{"port": 80}]})),
        )
        .await
        .expect("np");
    let spec = s.spec.expect("spec");
    let ip: std::net::Ipv4Addr = spec
        .cluster_ip
        .as_deref()
        .unwrap_or_default()
        .parse()
        .expect("cluster IP");
    assert_eq!(
        u32::from(ip) >> 20,
        u32::from(std::net::Ipv4Addr::new(10, 96, 0, 0)) >> 20,
        "in 10.96.0.0/12: {ip}"
    );
    assert_eq!(spec.cluster_ips, Some(vec![ip.to_string()]));
    assert_eq!(spec.session_affinity.as_deref(), Some("None"));
    assert_eq!(spec.ip_families, Some(vec!["IPv4".to_string()]));
    assert_eq!(spec.internal_traffic_policy.as_deref(), Some("Cluster"));
    assert_eq!(spec.external_traffic_policy.as_deref(), Some("Cluster"));
    let port = &spec.ports.expect("ports")[0];
    let np = port.node_port.expect("node port");
    assert!((30000..=32767).contains(&np));
    assert_eq!(
        port.target_port,
        Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(80))
    );
    assert_eq!(port.protocol.as_deref(), Some("TCP"));

    let e = api_error(
        svcs.create(
            &PostParams::default(),
            &mk(
                "dup",
                json!({"type": "NodePort", "ports": [{"port": 80, "nodePort": np}]}),
            ),
        )
        .await
        .expect_err("duplicate node port"),
    );
    assert_eq!(e.code, 422);
    let e = api_error(
        svcs.create(
            &PostParams::default(),
            &mk(
                "dupip",
                json!({"clusterIP": ip.to_string(), "ports": [{"port": 80}]}),
            ),
        )
        .await
        .expect_err("duplicate IP"),
    );
    assert_eq!(e.code, 422);
    let lb = svcs
        .create(&PostParams::default(), &mk("lb", json!({"type": "LoadBalancer", "externalTrafficPolicy": "Local", "ports": [{"port": 80}]})))
        .await
        .expect("lb");
    let lbs = lb.spec.expect("spec");
    assert!(
        lbs.health_check_node_port
            .is_some_and(|p| (30000..=32767).contains(&p))
    );
    assert_eq!(lbs.allocate_load_balancer_node_ports, Some(true));
    let h = svcs
        .create(
            &PostParams::default(),
            &mk(
                "headless",
                json!({"clusterIP": "None", "ports": [{"port": 80}]}),
            ),
        )
        .await
        .expect("headless");
    assert_eq!(h.spec.and_then(|s| s.cluster_ip).as_deref(), Some("None"));

    // Updating without clusterIP keeps the allocation; changing it is refused.
    let mut again = mk("np", json!({"type": "NodePort", "ports": [{"port": 80}]}));
    again.metadata.resource_version = None;
    let kept = svcs
        .replace("np", &PostParams::default(), &again)
        .await
        .expect("re-put");
    assert_eq!(
        kept.spec.as_ref().and_then(|s| s.cluster_ip.clone()),
        Some(ip.to_string())
    );
    assert_eq!(
        kept.spec.and_then(|s| s.ports).map(|p| p[0].node_port),
        Some(Some(np))
    );
    let moved = mk(
        "np",
        json!({"type": "NodePort", "clusterIP": "10.96.0.77", "ports": [{"port": 80}]}),
    );
    assert_eq!(
        api_error(
            svcs.replace("np", &PostParams::default(), &moved)
                .await
                .expect_err("immutable ip")
        )
        .code,
        422
    );
    // Deleting releases the node port.
    svcs.delete("np", &DeleteParams::default())
        .await
        .expect("delete");
    svcs.create(
        &PostParams::default(),
        &mk(
            "dup",
            json!({"type": "NodePort", "ports": [{"port": 80, "nodePort": np}]}),
        ),
    )
    .await
    .expect("node port free again");
}

#[tokio::test]
async fn graceful_delete_binding_eviction_finalizers() {
    let api = server().await;
    let client = api.client().await;
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    // Unbound: removed at once.
    pods.create(&PostParams::default(), &pod("unbound", json!({})))
        .await
        .expect("create");
    let r = pods
        .delete("unbound", &DeleteParams::default())
        .await
        .expect("delete");
    assert!(r.is_left(), "pods answer the deleted object");
    assert_eq!(
        api_error(pods.get("unbound").await.expect_err("gone")).code,
        404
    );

    // Bound via the binding subresource: graceful.
    pods.create(&PostParams::default(), &pod("bound", json!({})))
        .await
        .expect("create");
    let binding = json!({"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "bound"}, "target": {"kind": "Node", "name": "n1"}});
    let req = http::Request::post("/api/v1/namespaces/default/pods/bound/binding")
        .header("Content-Type", "application/json")
        .body(serde_json::to_vec(&binding).expect("json"))
        .expect("request");
    let status: Value = client.request(req).await.expect("bind");
    assert_eq!(status["status"], "Success");
    let p = pods.get("bound").await.expect("get");
    assert_eq!(
        p.spec.as_ref().and_then(|s| s.node_name.as_deref()),
        Some("n1")
    );
    assert!(
        p.status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "PodScheduled" && c.status == "True")
    );
    let req = http::Request::post("/api/v1/namespaces/default/pods/bound/binding")
        .header("Content-Type", "application/json")
        .body(serde_json::to_vec(&binding).expect("json"))
        .expect("request");
    assert_eq!(
        api_error(client.request::<Value>(req).await.expect_err("rebind")).code,
        409
    );

    let r = pods
        .delete("bound", &DeleteParams::default())
        .await
        .expect("graceful delete");
    let terminating = r.left().expect("object returned");
    assert!(terminating.metadata.deletion_timestamp.is_some());
    assert_eq!(terminating.metadata.deletion_grace_period_seconds, Some(30));
    // A shorter grace shortens it; the node agent's grace 0 removes it.
    let r = pods
        .delete(
            "bound",
            &DeleteParams {
                grace_period_seconds: Some(5),
                ..Default::default()
            },
        )
        .await
        .expect("shorter");
    assert_eq!(
        r.left()
            .and_then(|p| p.metadata.deletion_grace_period_seconds),
        Some(5)
    );
    assert!(
        pods.get("bound").await.is_ok(),
        "still there while terminating"
    );
    pods.delete(
        "bound",
        &DeleteParams {
            grace_period_seconds: Some(0),
            ..Default::default()
        },
    )
    .await
    .expect("final");
    assert_eq!(
        api_error(pods.get("bound").await.expect_err("gone")).code,
        404
    );

    // restartPolicy Never: a terminated container may not run again.
    let mut never = pod("never", json!({}));
    if let Some(s) = never.spec.as_mut() {
        s.restart_policy = Some("Never".into());
        s.node_name = Some("n1".into());
    }
    pods.create(&PostParams::default(), &never)
        .await
        .expect("create");
    let pp = PatchParams::default();
    pods.patch_status("never", &pp, &Patch::Merge(json!({"status": {"containerStatuses": [
        {"name": "c", "ready": false, "restartCount": 0, "image": "busybox", "imageID": "", "state": {"terminated": {"exitCode": 1}}}]}})))
        .await
        .expect("terminated");
    let e = api_error(
        pods.patch_status("never", &pp, &Patch::Merge(json!({"status": {"containerStatuses": [
            {"name": "c", "ready": true, "restartCount": 1, "image": "busybox", "imageID": "", "state": {"running": {}}}]}})))
            .await
            .expect_err("may not run again"),
    );
    assert_eq!(e.code, 422);
    assert!(
        e.message
            .contains("may not be transitioned to non-terminated state"),
        "{}",
        e.message
    );

    // Eviction of a bound pod is a graceful delete with its options.
    let mut p = pod("ev", json!({}));
    if let Some(s) = p.spec.as_mut() {
        s.node_name = Some("n1".into());
        s.termination_grace_period_seconds = Some(7);
    }
    pods.create(&PostParams::default(), &p)
        .await
        .expect("create");
    pods.evict("ev", &Default::default()).await.expect("evict");
    let ev = pods.get("ev").await.expect("terminating");
    assert_eq!(ev.metadata.deletion_grace_period_seconds, Some(7));

    // Finalizers hold an object until removed.
    let cms: Api<ConfigMap> = Api::default_namespaced(client);
    let mut f = cm("fin", "x");
    f.metadata.finalizers = Some(vec!["example.com/hold".into()]);
    cms.create(&PostParams::default(), &f)
        .await
        .expect("create");
    cms.delete("fin", &DeleteParams::default())
        .await
        .expect("delete");
    let held = cms.get("fin").await.expect("held by finalizer");
    assert!(held.metadata.deletion_timestamp.is_some());
    cms.patch(
        "fin",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .expect("remove finalizer");
    assert_eq!(api_error(cms.get("fin").await.expect_err("gone")).code, 404);
}

#[tokio::test]
async fn events_in_both_groups_and_namespaces() {
    let api = server().await;
    let client = api.client().await;
    let v1: Api<EventV1> = Api::default_namespaced(client.clone());
    let e: EventV1 = serde_json::from_value(json!({
        "metadata": {"name": "e1"}, "eventTime": "2025-01-01T00:00:00.000000Z",
        "regarding": {"kind": "Pod", "name": "web", "namespace": "default"},
        "reason": "Started", "note": "Started container", "type": "Normal", "action": "Start",
        "reportingController": "keelson", "reportingInstance": "n1"
    }))
    .expect("event");
    v1.create(&PostParams::default(), &e)
        .await
        .expect("create v1 event");
    let core: Api<Event> = Api::default_namespaced(client.clone());
    let got = core.get("e1").await.expect("core view");
    assert_eq!(got.involved_object.name.as_deref(), Some("web"));
    assert_eq!(got.message.as_deref(), Some("Started container"));
    assert_eq!(got.reporting_component.as_deref(), Some("keelson"));
    let l = core
        .list(&ListParams::default().fields("involvedObject.name=web,reason=Started"))
        .await
        .expect("select");
    assert_eq!(l.items.len(), 1);
    let l = v1
        .list(&ListParams::default().fields("regarding.name=other"))
        .await
        .expect("select v1");
    assert!(l.items.is_empty());

    // Namespaces: controllers populate; content needs an active namespace.
    let nss: Api<Namespace> = Api::all(client.clone());
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": "team"}})).expect("ns");
    nss.create(&PostParams::default(), &ns)
        .await
        .expect("create ns");
    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), "team");
    sas.get("default").await.expect("default service account");
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "team");
    let ca = cms
        .get("kube-root-ca.crt")
        .await
        .expect("root CA configmap");
    assert_eq!(
        ca.data.and_then(|d| d.get("ca.crt").cloned()).as_deref(),
        Some(api.ca_pem())
    );
    cms.create(&PostParams::default(), &cm("x", "1"))
        .await
        .expect("content");
    let missing: Api<ConfigMap> = Api::namespaced(client.clone(), "nowhere");
    assert_eq!(
        api_error(
            missing
                .create(&PostParams::default(), &cm("x", "1"))
                .await
                .expect_err("no ns")
        )
        .code,
        404
    );
    nss.delete("team", &DeleteParams::default())
        .await
        .expect("delete ns");
    assert_eq!(
        api_error(
            nss.get("team")
                .await
                .expect_err("namespace removed once empty")
        )
        .code,
        404
    );
    assert_eq!(
        api_error(
            nss.delete("default", &DeleteParams::default())
                .await
                .expect_err("immortal")
        )
        .code,
        403
    );
}

fn jwt_claims(token: &str) -> Value {
    use base64::Engine;
    let payload = token.split('.').nth(1).expect("JWT has a payload");
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload)
        .expect("base64url");
    serde_json::from_slice(&bytes).expect("claims JSON")
}

#[tokio::test]
async fn token_request_and_authentication() {
    let api = TestApiServer::start(TestApiOptions {
        tokens: vec![
            StaticToken {
                token: "admin-token".into(),
                user: "admin".into(),
            },
            StaticToken {
                token: "node-token".into(),
                user: "system:node:n1".into(),
            },
        ],
        ..TestApiOptions::default()
    })
    .await
    .expect("start");
    let client = api.client().await;
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    let mut p = pod("tok", json!({}));
    if let Some(s) = p.spec.as_mut() {
        s.node_name = Some("n1".into());
    }
    let p = pods.create(&PostParams::default(), &p).await.expect("pod");
    let uid = p.metadata.uid.clone().unwrap_or_default();
    let req = json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
        "spec": {"audiences": ["vault"], "expirationSeconds": 900,
                 "boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": "tok", "uid": uid}}});
    let http_req = http::Request::post("/api/v1/namespaces/default/serviceaccounts/default/token")
        .header("Content-Type", "application/json")
        .body(serde_json::to_vec(&req).expect("json"))
        .expect("request");
    let tr: Value = client.request(http_req).await.expect("token request");
    let token = tr["status"]["token"].as_str().expect("token").to_string();
    assert!(tr["status"]["expirationTimestamp"].is_string());
    let claims = jwt_claims(&token);
    assert_eq!(claims["sub"], "system:serviceaccount:default:default");
    assert_eq!(claims["aud"], json!(["vault"]));
    assert_eq!(
        claims["iss"],
        "https://kubernetes.default.svc.cluster.local"
    );
    assert_eq!(
        claims["exp"].as_i64().unwrap_or(0) - claims["iat"].as_i64().unwrap_or(0),
        900
    );
    assert_eq!(claims["kubernetes.io"]["pod"]["name"], "tok");
    assert_eq!(claims["kubernetes.io"]["pod"]["uid"], json!(uid));
    assert_eq!(claims["kubernetes.io"]["namespace"], "default");
    assert_eq!(claims["kubernetes.io"]["node"]["name"], "n1");

    // Too short, and a wrong bound UID.
    let short = json!({"spec": {"expirationSeconds": 599}});
    let r = http::Request::post("/api/v1/namespaces/default/serviceaccounts/default/token")
        .header("Content-Type", "application/json")
        .body(serde_json::to_vec(&short).expect("json"))
        .expect("request");
    assert_eq!(
        api_error(client.request::<Value>(r).await.expect_err("too short")).code,
        422
    );
    let wrong = json!({"spec": {"boundObjectRef": {"kind": "Pod", "name": "tok", "uid": "nope"}}});
    let r = http::Request::post("/api/v1/namespaces/default/serviceaccounts/default/token")
        .header("Content-Type", "application/json")
        .body(serde_json::to_vec(&wrong).expect("json"))
        .expect("request");
    assert_eq!(
        api_error(client.request::<Value>(r).await.expect_err("uid mismatch")).code,
        409
    );

    // The issued token authenticates; unknown tokens do not.
    let dir = tempfile::tempdir().expect("tempdir");
    for (tok, ok, user) in [
        (
            token.as_str(),
            true,
            "system:serviceaccount:default:default",
        ),
        ("node-token", true, "system:node:n1"),
        ("bogus", false, ""),
    ] {
        let path = dir.path().join(format!("kc-{ok}-{}", tok.len()));
        api.write_kubeconfig(&path, Some(tok)).expect("kubeconfig");
        let kc = kube::config::Kubeconfig::read_from(&path).expect("read");
        let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
            .await
            .expect("config");
        let c = kube::Client::try_from(cfg).expect("client");
        let cms: Api<ConfigMap> = Api::namespaced(c, "kube-system");
        api.knobs().clear_requests();
        match cms.list(&ListParams::default()).await {
            Ok(_) => {
                assert!(ok, "{tok} must be refused");
                let log = api.knobs().requests();
                assert!(log.iter().any(|r| r.user == user), "user {user} in {log:?}");
            }
            Err(e) => {
                assert!(!ok, "{tok} must be accepted: {e}");
                assert_eq!(api_error(e).code, 401);
            }
        }
    }
    // A client certificate issued by the server's CA authenticates as its CN.
    let cert_kc = dir.path().join("kc-cert");
    api.write_kubeconfig_with_client_cert(&cert_kc, "system:node:n2", Some("system:nodes"))
        .expect("client certificate kubeconfig");
    let kc = kube::config::Kubeconfig::read_from(&cert_kc).expect("read");
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .expect("config");
    let cms: Api<ConfigMap> =
        Api::namespaced(kube::Client::try_from(cfg).expect("client"), "kube-system");
    api.knobs().clear_requests();
    cms.list(&ListParams::default())
        .await
        .expect("client certificate accepted");
    assert!(
        api.knobs()
            .requests()
            .iter()
            .any(|r| r.user == "system:node:n2")
    );

    // OIDC discovery publishes the signing key.
    let jwks: Value = client
        .request(
            http::Request::get("/openid/v1/jwks")
                .body(Vec::new())
                .expect("req"),
        )
        .await
        .expect("jwks");
    assert_eq!(jwks["keys"][0]["alg"], "ES256");
}

#[tokio::test]
async fn a_resource_version_0_list_comes_whole_whatever_the_limit() {
    let api = TestApiServer::start(TestApiOptions::default())
        .await
        .expect("server");
    let client = api.client().await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    for i in 0..7 {
        cms.create(
            &PostParams::default(),
            &serde_json::from_value(serde_json::json!({
                "metadata": {"name": format!("rv0-{i}"), "labels": {"set": "rv0"}}
            }))
            .expect("configmap"),
        )
        .await
        .expect("create");
    }
    // What a client-go reflector's first list asks: served whole from the
    // "watch cache".
    let raw = |query: &str| {
        http::Request::get(format!("/api/v1/namespaces/default/configmaps?{query}"))
            .body(Vec::new())
            .expect("request")
    };
    let all: kube::core::ObjectList<ConfigMap> = client
        .request(raw("labelSelector=set%3Drv0&resourceVersion=0&limit=3"))
        .await
        .expect("list");
    assert_eq!(all.items.len(), 7);
    assert!(all.metadata.continue_.is_none());
    // Without resourceVersion the limit holds (served "from etcd").
    let page: kube::core::ObjectList<ConfigMap> = client
        .request(raw("labelSelector=set%3Drv0&limit=3"))
        .await
        .expect("list");
    assert_eq!(page.items.len(), 3);
    assert!(page.metadata.continue_.is_some());
}

#[tokio::test]
async fn runtime_class_admission_sets_overhead_and_scheduling() {
    use k8s_openapi::api::node::v1::RuntimeClass;
    let api = server().await;
    let client = api.client().await;
    let classes: Api<RuntimeClass> = Api::all(client.clone());
    let rc: RuntimeClass = serde_json::from_value(json!({
        "metadata": {"name": "vm"}, "handler": "kata",
        "overhead": {"podFixed": {"cpu": "250m", "memory": "120Mi"}},
        "scheduling": {"nodeSelector": {"runtime": "kata"},
                       "tolerations": [{"key": "kata", "operator": "Exists", "effect": "NoSchedule"}]}
    }))
    .expect("runtimeclass");
    classes
        .create(&PostParams::default(), &rc)
        .await
        .expect("create class");
    let pods: Api<Pod> = Api::default_namespaced(client);
    let with = |name: &str, extra: Value| -> Pod {
        let mut spec =
            json!({"runtimeClassName": "vm", "containers": [{"name": "c", "image": "busybox"}]});
        if let Some(o) = extra.as_object() {
            for (k, v) in o {
                spec[k] = v.clone();
            }
        }
        serde_json::from_value(json!({"metadata": {"name": name}, "spec": spec})).expect("pod")
    };
    let p = pods
        .create(
            &PostParams::default(),
            &with("a", json!({"nodeSelector": {"zone": "x"}})),
        )
        .await
        .expect("admitted");
    let spec = p.spec.expect("spec");
    let overhead = spec.overhead.expect("overhead copied from the class");
    assert_eq!(overhead["cpu"].0, "250m");
    assert_eq!(overhead["memory"].0, "120Mi");
    let sel = spec.node_selector.expect("selector");
    assert_eq!(
        (sel["zone"].as_str(), sel["runtime"].as_str()),
        ("x", "kata")
    );
    assert!(
        spec.tolerations
            .expect("tolerations")
            .iter()
            .any(|t| t.key.as_deref() == Some("kata"))
    );
    // The same overhead written by the client is accepted, another refused.
    pods.create(
        &PostParams::default(),
        &with("b", json!({"overhead": {"cpu": "0.25", "memory": "120Mi"}})),
    )
    .await
    .expect("same overhead");
    let e = api_error(
        pods.create(
            &PostParams::default(),
            &with("c", json!({"overhead": {"cpu": "1"}})),
        )
        .await
        .expect_err("other overhead"),
    );
    assert_eq!(e.code, 403);
    assert!(
        e.message.ends_with(
            "pod rejected: Pod's Overhead doesn't match RuntimeClass's defined Overhead"
        ),
        "{}",
        e.message
    );
    let e = api_error(
        pods.create(
            &PostParams::default(),
            &with("d", json!({"nodeSelector": {"runtime": "runc"}})),
        )
        .await
        .expect_err("conflict"),
    );
    assert!(e.message.ends_with("conflict: runtimeClass.scheduling.nodeSelector[runtime] = kata; pod.spec.nodeSelector[runtime] = runc"), "{}", e.message);
    let e = api_error(
        pods.create(
            &PostParams::default(),
            &with("e", json!({"runtimeClassName": "missing"})),
        )
        .await
        .expect_err("missing class"),
    );
    assert_eq!(
        e.message,
        "pods \"e\" is forbidden: pod rejected: RuntimeClass \"missing\" not found"
    );
}

/// kube-apiserver's default ServiceCIDR controller
/// (pkg/controlplane/controller/defaultservicecidr): a `kubernetes`
/// ServiceCIDR with the Service range, Ready, which kube-proxy v1.36 and
/// keelson's proxy role watch to drop traffic to unallocated ClusterIPs.
#[tokio::test]
async fn the_default_service_cidr_is_served_ready() {
    use k8s_openapi::api::networking::v1::ServiceCIDR;
    let api = server().await;
    let cidrs: Api<ServiceCIDR> = Api::all(api.client().await);
    let list = cidrs.list(&ListParams::default()).await.expect("list");
    assert_eq!(list.items.len(), 1);
    let c = &list.items[0];
    assert_eq!(c.metadata.name.as_deref(), Some("kubernetes"));
    let range = c
        .spec
        .as_ref()
        .and_then(|s| s.cidrs.clone())
        .unwrap_or_default();
    let services: Api<Service> = Api::default_namespaced(api.client().await);
    let kubernetes = services
        .get("kubernetes")
        .await
        .expect("kubernetes Service");
    let ip: std::net::IpAddr = kubernetes
        .spec
        .and_then(|s| s.cluster_ip)
        .expect("clusterIP")
        .parse()
        .expect("an IP");
    let net: ipnet::IpNet = range.first().expect("one CIDR").parse().expect("a CIDR");
    assert!(
        net.contains(&ip),
        "{net} holds the kubernetes Service's {ip}"
    );
    let ready = c
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"))
        .expect("Ready condition");
    assert_eq!(ready.status, "True");
}
