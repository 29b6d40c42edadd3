//! Watch semantics of the test API server: event order and types,
//! selector transitions, 410 Gone after compaction, bookmarks, timeouts,
//! streaming lists, kube-runtime's watcher in both initial-list modes, and
//! fan-out to many watchers.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use keelson_tests::support::wait_for;
use keelson_tests::testapi::{TestApiOptions, TestApiServer};
use kube::api::{
    Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use serde_json::json;

const DEADLINE: Duration = Duration::from_secs(10);

async fn server(opts: TestApiOptions) -> TestApiServer {
    TestApiServer::start(opts)
        .await
        .expect("test API server starts")
}

fn cm(name: &str, labels: serde_json::Value) -> ConfigMap {
    serde_json::from_value(
        json!({"metadata": {"name": name, "labels": labels}, "data": {"v": "1"}}),
    )
    .expect("configmap")
}

fn describe(ev: &WatchEvent<ConfigMap>) -> String {
    match ev {
        WatchEvent::Added(o) => format!("ADDED {}", o.metadata.name.as_deref().unwrap_or_default()),
        WatchEvent::Modified(o) => format!(
            "MODIFIED {}",
            o.metadata.name.as_deref().unwrap_or_default()
        ),
        WatchEvent::Deleted(o) => {
            format!("DELETED {}", o.metadata.name.as_deref().unwrap_or_default())
        }
        WatchEvent::Bookmark(b) => format!("BOOKMARK {}", b.metadata.resource_version),
        WatchEvent::Error(e) => format!("ERROR {}", e.code),
    }
}

async fn next_non_bookmark<S>(s: &mut S) -> String
where
    S: futures::Stream<Item = kube::Result<WatchEvent<ConfigMap>>> + Unpin,
{
    loop {
        let ev = tokio::time::timeout(DEADLINE, s.next())
            .await
            .expect("event before deadline")
            .expect("stream open")
            .expect("event decodes");
        if !matches!(ev, WatchEvent::Bookmark(_)) {
            return describe(&ev);
        }
    }
}

#[tokio::test]
async fn events_in_order_and_selector_transitions() {
    let api = server(TestApiOptions::default()).await;
    let cms: Api<ConfigMap> = Api::default_namespaced(api.client().await);
    let rv = cms
        .list(&ListParams::default())
        .await
        .expect("list")
        .metadata
        .resource_version
        .expect("rv");
    let mut all = cms
        .watch(&WatchParams::default(), &rv)
        .await
        .expect("watch")
        .boxed();
    let mut sel = cms
        .watch(&WatchParams::default().labels("app=web"), &rv)
        .await
        .expect("watch")
        .boxed();

    cms.create(&PostParams::default(), &cm("a", json!({"app": "web"})))
        .await
        .expect("create");
    cms.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"app": "db"}}})),
    )
    .await
    .expect("relabel");
    cms.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"app": "web"}}})),
    )
    .await
    .expect("relabel back");
    cms.delete("a", &DeleteParams::default())
        .await
        .expect("delete");

    let mut got = Vec::new();
    for _ in 0..4 {
        got.push(next_non_bookmark(&mut all).await);
    }
    assert_eq!(got, ["ADDED a", "MODIFIED a", "MODIFIED a", "DELETED a"]);
    let mut got = Vec::new();
    for _ in 0..4 {
        got.push(next_non_bookmark(&mut sel).await);
    }
    // Leaving the selector is a DELETED, entering it an ADDED.
    assert_eq!(got, ["ADDED a", "DELETED a", "ADDED a", "DELETED a"]);

    // Watching from an older resourceVersion replays history.
    let mut replay = cms
        .watch(&WatchParams::default(), &rv)
        .await
        .expect("watch")
        .boxed();
    assert_eq!(next_non_bookmark(&mut replay).await, "ADDED a");

    // Watching from "0" starts with the current state as ADDED.
    cms.create(&PostParams::default(), &cm("b", json!({})))
        .await
        .expect("create b");
    let mut current = cms
        .watch(&WatchParams::default(), "0")
        .await
        .expect("watch")
        .boxed();
    assert_eq!(next_non_bookmark(&mut current).await, "ADDED b");
}

#[tokio::test]
async fn gone_after_compaction_bookmarks_timeouts_and_streaming_lists() {
    let api = server(TestApiOptions {
        bookmark_interval: Duration::from_millis(100),
        ..TestApiOptions::default()
    })
    .await;
    let cms: Api<ConfigMap> = Api::default_namespaced(api.client().await);
    cms.create(&PostParams::default(), &cm("x", json!({})))
        .await
        .expect("create");
    let old = cms
        .list(&ListParams::default())
        .await
        .expect("list")
        .metadata
        .resource_version
        .expect("rv");
    cms.create(&PostParams::default(), &cm("y", json!({})))
        .await
        .expect("create");
    api.knobs().compact();
    let mut s = cms
        .watch(&WatchParams::default(), &old)
        .await
        .expect("watch starts")
        .boxed();
    let ev = tokio::time::timeout(DEADLINE, s.next())
        .await
        .expect("event")
        .expect("open")
        .expect("decodes");
    match ev {
        WatchEvent::Error(e) => assert_eq!((e.code, e.reason.as_str()), (410, "Expired")),
        other => panic!("expected 410, got {}", describe(&other)),
    }
    // A consistent list at the compacted version is gone too.
    let e = cms
        .list(
            &ListParams::default()
                .at(&old)
                .matching(kube::api::VersionMatch::Exact),
        )
        .await
        .expect_err("too old");
    assert!(matches!(&e, kube::Error::Api(s) if s.code == 410), "{e}");

    // Bookmarks arrive on their interval; timeoutSeconds ends the watch.
    let now = cms
        .list(&ListParams::default())
        .await
        .expect("list")
        .metadata
        .resource_version
        .expect("rv");
    let mut s = cms
        .watch(
            &WatchParams {
                bookmarks: true,
                ..WatchParams::default()
            }
            .timeout(1),
            &now,
        )
        .await
        .expect("watch")
        .boxed();
    let ev = tokio::time::timeout(DEADLINE, s.next())
        .await
        .expect("bookmark")
        .expect("open")
        .expect("decodes");
    assert!(matches!(ev, WatchEvent::Bookmark(_)), "{}", describe(&ev));
    let ended = tokio::time::timeout(DEADLINE, async { while s.next().await.is_some() {} }).await;
    assert!(ended.is_ok(), "watch ends after timeoutSeconds");

    // Streaming list: current objects, then the initial-events-end bookmark.
    let mut s = cms
        .watch(&WatchParams::default().initial_events(), "0")
        .await
        .expect("watch")
        .boxed();
    let mut names = BTreeSet::new();
    loop {
        let ev = tokio::time::timeout(DEADLINE, s.next())
            .await
            .expect("event")
            .expect("open")
            .expect("decodes");
        match ev {
            WatchEvent::Added(o) => {
                names.insert(o.metadata.name.unwrap_or_default());
            }
            WatchEvent::Bookmark(b) => {
                assert!(
                    b.metadata
                        .annotations
                        .contains_key("k8s.io/initial-events-end")
                );
                break;
            }
            other => panic!("unexpected {}", describe(&other)),
        }
    }
    assert!(
        names.contains("x") && names.contains("y") && names.contains("kube-root-ca.crt"),
        "{names:?}"
    );
}

async fn run_watcher(api: &TestApiServer, config: watcher::Config) {
    let cms: Api<ConfigMap> = Api::namespaced(api.client().await, "kube-system");
    let (reader, writer) = reflector::store::<ConfigMap>();
    let inits = Arc::new(Mutex::new(0usize));
    let inits2 = inits.clone();
    let task = tokio::spawn(async move {
        // Errors (the 410 after compaction) are items; the watcher recovers.
        let mut s = reflector(writer, watcher(cms, config).default_backoff()).boxed();
        while let Some(ev) = s.next().await {
            if matches!(ev, Ok(watcher::Event::Init)) {
                *inits2.lock().expect("lock") += 1;
            }
        }
    });
    let cms: Api<ConfigMap> = Api::namespaced(api.client().await, "kube-system");
    let has = |name: &'static str, want: bool| {
        let reader = reader.clone();
        move || {
            let reader = reader.clone();
            async move {
                let names: BTreeSet<String> = reader
                    .state()
                    .iter()
                    .filter_map(|o| o.metadata.name.clone())
                    .collect();
                if names.contains(name) == want {
                    Ok(())
                } else {
                    Err(format!("{names:?}"))
                }
            }
        }
    };
    cms.create(&PostParams::default(), &cm("one", json!({})))
        .await
        .expect("create");
    wait_for(
        "watcher sees one",
        DEADLINE,
        Duration::from_millis(20),
        has("one", true),
    )
    .await
    .expect("one");
    // Dropped watches resume.
    api.knobs().drop_watches();
    cms.create(&PostParams::default(), &cm("two", json!({})))
        .await
        .expect("create");
    wait_for(
        "watcher sees two",
        DEADLINE,
        Duration::from_millis(20),
        has("two", true),
    )
    .await
    .expect("two");
    // Compaction + drop: the re-watch gets 410 and the watcher relists.
    let before = *inits.lock().expect("lock");
    api.knobs().compact();
    api.knobs().drop_watches();
    cms.delete("one", &DeleteParams::default())
        .await
        .expect("delete");
    wait_for(
        "watcher sees delete of one",
        DEADLINE,
        Duration::from_millis(20),
        has("one", false),
    )
    .await
    .expect("gone");
    let init_count = inits.clone();
    wait_for(
        "watcher relisted",
        DEADLINE,
        Duration::from_millis(20),
        move || {
            let n = *init_count.lock().expect("lock");
            async move {
                if n > before {
                    Ok(())
                } else {
                    Err(format!("{n} inits"))
                }
            }
        },
    )
    .await
    .expect("relist");
    task.abort();
}

#[tokio::test]
async fn kube_runtime_watcher_list_watch() {
    let api = server(TestApiOptions::default()).await;
    run_watcher(&api, watcher::Config::default().page_size(2)).await;
}

#[tokio::test]
async fn kube_runtime_watcher_streaming_list() {
    let api = server(TestApiOptions::default()).await;
    run_watcher(&api, watcher::Config::default().streaming_lists()).await;
    assert!(
        api.knobs()
            .requests()
            .iter()
            .any(|r| r.verb == "watch" && r.query.contains("sendInitialEvents=true")),
        "streaming list used"
    );
}

#[tokio::test]
async fn fan_out_to_many_watchers() {
    let api = server(TestApiOptions::default()).await;
    let client = api.client().await;
    let cms: Api<ConfigMap> = Api::default_namespaced(client.clone());
    let rv = cms
        .list(&ListParams::default())
        .await
        .expect("list")
        .metadata
        .resource_version
        .expect("rv");
    let watchers = 200;
    let changes = 20;
    let mut tasks = Vec::new();
    for _ in 0..watchers {
        let mut s = cms
            .watch(&WatchParams::default(), &rv)
            .await
            .expect("watch")
            .boxed();
        tasks.push(tokio::spawn(async move {
            let mut n = 0;
            while n < changes {
                match tokio::time::timeout(DEADLINE, s.next()).await {
                    Ok(Some(Ok(WatchEvent::Added(_)))) => n += 1,
                    Ok(Some(Ok(_))) => {}
                    _ => break,
                }
            }
            n
        }));
    }
    assert_eq!(api.knobs().active_watches(), watchers);
    for i in 0..changes {
        cms.create(&PostParams::default(), &cm(&format!("f{i}"), json!({})))
            .await
            .expect("create");
    }
    for t in tasks {
        assert_eq!(t.await.expect("task"), changes);
    }
}
