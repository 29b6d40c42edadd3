//! Component tests of the node Lease heartbeat against the test API server:
//! cadence, ownership, conflicts and backoff, read from the server's
//! request log. Lease durations are shortened (2 s, renewed every 0.5 s)
//! so the rules are checked in seconds.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use k8s_openapi::api::coordination::v1::Lease;
use keelson::config::KubeDuration;
use keelson_tests::node_harness::{InProcessNode, NodeHarnessOptions};
use keelson_tests::support::wait_for;
use keelson_tests::testapi::RequestRecord;
use kube::Api;
use kube::api::{Patch, PatchParams};

fn short_lease() -> keelson_tests::node_harness::Configure {
    Arc::new(|c| {
        c.node.node_lease_duration_seconds = 2;
        c.node.node_status_update_frequency = KubeDuration::from_secs(1);
    })
}

fn lease_requests(node: &InProcessNode) -> Vec<RequestRecord> {
    node.api
        .knobs()
        .requests()
        .into_iter()
        .filter(|r| {
            r.resource == "leases"
                && (r.name == node.node_name || (r.verb == "create" && r.name.is_empty()))
                && r.user_agent.starts_with("keelson-node/")
        })
        .collect()
}

fn gap(a: &RequestRecord, b: &RequestRecord) -> Duration {
    b.at.duration_since(a.at).unwrap_or_default()
}

async fn wait_lease(node: &InProcessNode) -> Lease {
    wait_for(
        "the node Lease",
        Duration::from_secs(20),
        Duration::from_millis(50),
        || async {
            node.lease()
                .await?
                .ok_or_else(|| "no Lease yet".to_string())
        },
    )
    .await
    .expect("lease created")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_is_owned_by_the_node_and_renewed_every_quarter_of_its_duration() {
    let node = InProcessNode::start(NodeHarnessOptions {
        configure: Some(short_lease()),
        ..NodeHarnessOptions::default()
    })
    .await
    .expect("node");
    let lease = wait_lease(&node).await;
    let n = node.node().await.expect("read").expect("node exists");
    let spec = lease.spec.clone().expect("spec");
    assert_eq!(
        spec.holder_identity.as_deref(),
        Some(node.node_name.as_str())
    );
    assert_eq!(spec.lease_duration_seconds, Some(2));
    let owners = lease.metadata.owner_references.clone().unwrap_or_default();
    assert_eq!(owners.len(), 1, "{owners:?}");
    assert_eq!(owners[0].kind, "Node");
    assert_eq!(owners[0].api_version, "v1");
    assert_eq!(owners[0].name, node.node_name);
    assert_eq!(Some(owners[0].uid.clone()), n.metadata.uid);
    let first_renew = spec.renew_time.clone().expect("renewTime");

    // Watch a few renewals: one PUT each, no read in between, ~0.5 s apart.
    let updates = wait_for(
        "five renewals",
        Duration::from_secs(10),
        Duration::from_millis(100),
        || async {
            let ups: Vec<RequestRecord> = lease_requests(&node)
                .into_iter()
                .filter(|r| r.verb == "update" && r.status == 200)
                .collect();
            if ups.len() >= 5 {
                Ok(ups)
            } else {
                Err(format!("{} renewals", ups.len()))
            }
        },
    )
    .await
    .expect("renewals");
    for pair in updates.windows(2) {
        let g = gap(&pair[0], &pair[1]);
        assert!(
            g >= Duration::from_millis(480) && g <= Duration::from_millis(800),
            "renewals {g:?} apart, want 0.5 s (+4 % jitter)"
        );
    }
    let reqs = lease_requests(&node);
    let first_update = reqs
        .iter()
        .position(|r| r.verb == "update")
        .expect("an update");
    assert!(
        reqs[first_update..].iter().all(|r| r.verb == "update"),
        "renewals must not re-read the Lease: {:?}",
        reqs.iter().map(|r| r.verb.as_str()).collect::<Vec<_>>()
    );
    let later = node.lease().await.expect("read").expect("lease");
    assert!(later.spec.and_then(|s| s.renew_time).expect("renewTime").0 > first_renew.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conflicting_write_is_reread_and_kept() {
    let node = InProcessNode::start(NodeHarnessOptions {
        configure: Some(short_lease()),
        ..NodeHarnessOptions::default()
    })
    .await
    .expect("node");
    wait_lease(&node).await;
    // Someone else writes the Lease: keelson's next optimistic update is stale.
    let leases = Api::<Lease>::namespaced(node.admin.clone(), "kube-node-lease");
    let mark = SystemTime::now();
    leases
        .patch(
            &node.node_name,
            &PatchParams::default(),
            &Patch::Merge(
                serde_json::json!({"metadata": {"annotations": {"other-writer": "was-here"}}}),
            ),
        )
        .await
        .expect("other writer");
    let seq = wait_for(
        "conflict, re-read, renewal",
        Duration::from_secs(10),
        Duration::from_millis(100),
        || async {
            let after: Vec<(String, u16)> = lease_requests(&node)
                .into_iter()
                .filter(|r| r.at >= mark)
                .map(|r| (r.verb, r.status))
                .collect();
            let conflict = after.iter().position(|(v, s)| v == "update" && *s == 409);
            match conflict {
                Some(i)
                    if after[i + 1..]
                        .iter()
                        .any(|(v, s)| v == "update" && *s == 200) =>
                {
                    Ok(after[i..].to_vec())
                }
                _ => Err(format!("{after:?}")),
            }
        },
    )
    .await
    .expect("conflict handled");
    assert_eq!(
        seq[1],
        ("get".to_string(), 200),
        "a conflict re-reads the Lease: {seq:?}"
    );
    assert_eq!(
        seq[2],
        ("update".to_string(), 200),
        "then renews it: {seq:?}"
    );
    let lease = node.lease().await.expect("read").expect("lease");
    assert_eq!(
        lease
            .metadata
            .annotations
            .unwrap_or_default()
            .get("other-writer")
            .map(String::as_str),
        Some("was-here"),
        "the other writer's change survives"
    );
    assert!(lease.spec.and_then(|s| s.renew_time).is_some());

    // An injected 409 is handled the same way.
    node.api
        .knobs()
        .fail_next(1, Some("update"), Some("leases"), 409);
    let mark = SystemTime::now();
    wait_for(
        "injected conflict handled",
        Duration::from_secs(10),
        Duration::from_millis(100),
        || async {
            let after: Vec<(String, u16)> = lease_requests(&node)
                .into_iter()
                .filter(|r| r.at >= mark)
                .map(|r| (r.verb, r.status))
                .collect();
            let i = after
                .iter()
                .position(|(v, s)| v == "update" && *s == 409)
                .ok_or(format!("{after:?}"))?;
            if after.get(i + 1).map(|(v, _)| v.as_str()) == Some("get")
                && after[i + 1..]
                    .iter()
                    .any(|(v, s)| v == "update" && *s == 200)
            {
                Ok(())
            } else {
                Err(format!("{after:?}"))
            }
        },
    )
    .await
    .expect("injected conflict");
    let m = node.metrics_text();
    assert!(
        m.contains("keelson_node_lease_renewals_total{result=\"conflict\"} 2"),
        "{m}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_reads_back_off_from_200ms_and_the_lease_waits_for_the_node() {
    let node = InProcessNode::start(NodeHarnessOptions {
        configure: Some(short_lease()),
        before_start: Some(Arc::new(|api| {
            api.knobs().fail_next(4, Some("get"), Some("leases"), 500);
        })),
        ..NodeHarnessOptions::default()
    })
    .await
    .expect("node");
    // Watch only the request log: the test's own reads would take the injected failures.
    let reqs = wait_for(
        "the Lease created",
        Duration::from_secs(20),
        Duration::from_millis(50),
        || async {
            let reqs = lease_requests(&node);
            if reqs.iter().any(|r| r.verb == "create" && r.status == 201) {
                Ok(reqs)
            } else {
                Err(format!("{} lease requests", reqs.len()))
            }
        },
    )
    .await
    .expect("lease created");
    let gets: Vec<&RequestRecord> = reqs.iter().filter(|r| r.verb == "get").take(5).collect();
    assert_eq!(
        gets.iter().map(|r| r.status).collect::<Vec<_>>(),
        [500, 500, 500, 500, 404],
        "{reqs:?}"
    );
    for (i, want_ms) in [200u64, 400, 800, 1600].into_iter().enumerate() {
        let g = gap(gets[i], gets[i + 1]);
        assert!(
            g >= Duration::from_millis(want_ms) && g <= Duration::from_millis(want_ms + 300),
            "wait {i} was {g:?}, want {want_ms} ms"
        );
    }
    // The Lease is created only once the Node exists (it needs the Node's UID).
    let all = node.api.knobs().requests();
    let node_created = all
        .iter()
        .position(|r| r.resource == "nodes" && r.verb == "create" && r.status == 201)
        .expect("node created");
    let lease_created = all
        .iter()
        .position(|r| r.resource == "leases" && r.verb == "create" && r.status == 201)
        .expect("lease created");
    assert!(node_created < lease_created);
}
