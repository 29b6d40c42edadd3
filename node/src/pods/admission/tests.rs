use std::collections::BTreeMap;
use std::sync::Mutex;

use futures::future::BoxFuture;

use super::*;

/// A Node that changes between the cached copy and a fresh read.
struct FakeNode {
    cached: Option<Node>,
    fresh: Option<Node>,
    fetches: Mutex<u32>,
}

impl NodeSource for FakeNode {
    fn cached(&self) -> Option<Node> {
        self.cached.clone()
    }
    fn fetch(&self) -> BoxFuture<'_, Option<Node>> {
        *self
            .fetches
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) += 1;
        Box::pin(async move { self.fresh.clone() })
    }
}

fn node(labels: serde_json::Value, alloc: serde_json::Value, taints: serde_json::Value) -> Node {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": "n1", "labels": labels},
        "spec": {"taints": taints},
        "status": {"allocatable": alloc}
    }))
    .expect("node")
}

fn pod(name: &str, spec: serde_json::Value) -> Arc<Pod> {
    let mut spec = spec;
    if spec.get("containers").is_none() {
        spec["containers"] = serde_json::json!([{"name": "c"}]);
    }
    Arc::new(
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "ns", "uid": name},
            "spec": spec,
            "status": {"phase": "Pending"}
        }))
        .expect("pod"),
    )
}

fn admitter(src: Arc<FakeNode>, eviction: Option<AdmitFn>) -> Admitter {
    Admitter::new(AdmitterParts {
        node_name: "n1".into(),
        node: src,
        allocatable: Arc::new(BTreeMap::new),
        max_pods: 110,
        eviction,
        sysctls: SysctlAllowlist::new(Some((6, 1)), &[]),
        apparmor: AppArmorAdmission::new(Err(apparmor::AppArmorError::HostDisabled)),
        rejections: prometheus::IntCounterVec::new(
            prometheus::Opts::new("kubelet_admission_rejections_total", "h"),
            &["reason"],
        )
        .expect("metric"),
        devices: None,
        shutdown: None,
    })
}

fn alloc() -> serde_json::Value {
    serde_json::json!({"cpu": "2", "memory": "1Gi", "pods": "3"})
}

#[tokio::test]
async fn handlers_run_in_kubelets_order() {
    let src = Arc::new(FakeNode {
        cached: Some(node(serde_json::json!({}), alloc(), serde_json::json!([]))),
        fresh: None,
        fetches: Mutex::new(0),
    });
    let evict: AdmitFn = Arc::new(|_| {
        Err(rejection(
            "Evicted",
            "The node had condition: [DiskPressure]. ".into(),
        ))
    });
    // Eviction comes before sysctls and fit.
    let a = admitter(src.clone(), Some(evict));
    let p = pod(
        "p",
        serde_json::json!({"securityContext": {"sysctls": [{"name": "kernel.panic", "value": "1"}]},
                           "containers": [{"name": "c", "resources": {"requests": {"cpu": "9"}}}]}),
    );
    let e = a.admit(&p, &[], Operation::Add).await.expect_err("refused");
    assert_eq!(e.reason, "Evicted");
    // Sysctls before fit.
    let a = admitter(src, None);
    let e = a.admit(&p, &[], Operation::Add).await.expect_err("refused");
    assert_eq!(e.reason, "SysctlForbidden");
    assert_eq!(
        a.p.rejections.with_label_values(&["SysctlForbidden"]).get(),
        1
    );
}

#[tokio::test]
async fn fit_counts_admitted_pods_and_the_pod_itself_is_skipped() {
    let src = Arc::new(FakeNode {
        cached: Some(node(serde_json::json!({}), alloc(), serde_json::json!([]))),
        fresh: None,
        fetches: Mutex::new(0),
    });
    let a = admitter(src, None);
    let big = |n: &str| {
        pod(
            n,
            serde_json::json!({"containers": [{"name": "c", "resources": {"requests": {"memory": "600Mi"}}}]}),
        )
    };
    let first = big("a");
    assert!(
        a.admit(&first, std::slice::from_ref(&first), Operation::Add)
            .await
            .is_ok()
    );
    let e = a
        .admit(&big("b"), std::slice::from_ref(&first), Operation::Add)
        .await
        .expect_err("no room");
    assert_eq!(e.reason, "OutOfmemory");
    assert_eq!(
        e.message,
        format!(
            "Node didn't have enough resource: memory, requested: {}, used: {}, capacity: {}",
            600u64 << 20,
            600u64 << 20,
            1u64 << 30
        )
    );
    let others = vec![
        pod("x", serde_json::json!({})),
        pod("y", serde_json::json!({})),
        pod("z", serde_json::json!({})),
    ];
    let e = a
        .admit(&pod("w", serde_json::json!({})), &others, Operation::Add)
        .await
        .expect_err("full");
    assert_eq!(e.reason, "OutOfpods");
}

#[tokio::test]
async fn affinity_alone_failing_reads_the_node_again() {
    let stale = node(serde_json::json!({}), alloc(), serde_json::json!([]));
    let fresh = node(
        serde_json::json!({"disk": "ssd"}),
        alloc(),
        serde_json::json!([]),
    );
    let src = Arc::new(FakeNode {
        cached: Some(stale.clone()),
        fresh: Some(fresh),
        fetches: Mutex::new(0),
    });
    let a = admitter(src.clone(), None);
    let p = pod("p", serde_json::json!({"nodeSelector": {"disk": "ssd"}}));
    assert!(a.admit(&p, &[], Operation::Add).await.is_ok());
    assert_eq!(*src.fetches.lock().expect("lock"), 1);

    let src = Arc::new(FakeNode {
        cached: Some(stale.clone()),
        fresh: Some(stale),
        fetches: Mutex::new(0),
    });
    let a = admitter(src, None);
    let e = a.admit(&p, &[], Operation::Add).await.expect_err("refused");
    assert_eq!(e.reason, "NodeAffinity");
    assert_eq!(
        e.message,
        "Predicate NodeAffinity failed: node(s) didn't match Pod's node affinity/selector"
    );
    assert_eq!(metric_reason(&e.reason), "Other");
}

#[tokio::test]
async fn taints_ports_node_name_and_apparmor() {
    let n = node(
        serde_json::json!({}),
        alloc(),
        serde_json::json!([{"key": "dedicated", "value": "db", "effect": "NoExecute"}]),
    );
    let src = Arc::new(FakeNode {
        cached: Some(n),
        fresh: None,
        fetches: Mutex::new(0),
    });
    let a = admitter(src, None);
    let e = a
        .admit(&pod("p", serde_json::json!({})), &[], Operation::Add)
        .await
        .expect_err("taint");
    assert_eq!(
        (e.reason.as_str(), e.message.as_str()),
        (
            "TaintToleration",
            "Predicate TaintToleration failed: node(s) had taints that the pod didn't tolerate"
        )
    );
    let tol =
        serde_json::json!([{"key": "dedicated", "operator": "Exists", "effect": "NoExecute"}]);
    let web = |n: &str| {
        pod(
            n,
            serde_json::json!({"tolerations": tol, "containers": [{"name": "c", "ports": [{"containerPort": 80, "hostPort": 8080}]}]}),
        )
    };
    let first = web("a");
    assert!(a.admit(&first, &[], Operation::Add).await.is_ok());
    let e = a
        .admit(&web("b"), std::slice::from_ref(&first), Operation::Add)
        .await
        .expect_err("port");
    assert_eq!(e.reason, "NodePorts");
    let e = a
        .admit(
            &pod(
                "c",
                serde_json::json!({"tolerations": tol, "nodeName": "other"}),
            ),
            &[],
            Operation::Add,
        )
        .await
        .expect_err("name");
    assert_eq!(e.reason, "NodeName");
    let e = a
        .admit(
            &pod(
                "d",
                serde_json::json!({"tolerations": tol,
                "securityContext": {"appArmorProfile": {"type": "RuntimeDefault"}}}),
            ),
            &[],
            Operation::Add,
        )
        .await
        .expect_err("apparmor");
    assert_eq!(e.reason, "AppArmor");
}

#[tokio::test]
async fn a_stand_in_node_before_registration() {
    let src = Arc::new(FakeNode {
        cached: None,
        fresh: None,
        fetches: Mutex::new(0),
    });
    let mut a = admitter(src, None);
    a.p.allocatable = Arc::new(|| {
        BTreeMap::from([(
            "cpu".to_string(),
            k8s_openapi::apimachinery::pkg::api::resource::Quantity("1".into()),
        )])
    });
    assert!(
        a.admit(&pod("p", serde_json::json!({})), &[], Operation::Add)
            .await
            .is_ok()
    );
    let e = a
        .admit(
            &pod("q", serde_json::json!({"containers": [{"name": "c", "resources": {"requests": {"cpu": "2"}}}]})),
            &[],
            Operation::Add,
        )
        .await
        .expect_err("cpu");
    assert_eq!(e.reason, "OutOfcpu");
}
