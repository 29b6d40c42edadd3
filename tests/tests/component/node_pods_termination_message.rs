//! Component tests of termination messages (test API server + fake CRI
//! runtime + the pod lifecycle): the message file is read from its end, at
//! most 4 KiB; `FallbackToLogsOnError` takes the last 80 lines / 2048
//! bytes of the CRI log even when the log is huge; and the pod's
//! containers share 12 KiB of messages in the status (kubelet's
//! `normalizeStatus`).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use crate::node_pods_support::*;
use serde_json::json;

const T: Duration = Duration::from_secs(20);

fn terminated_message(p: &k8s_openapi::api::core::v1::Pod, name: &str) -> Option<String> {
    container_status(p, name)?
        .state
        .as_ref()?
        .terminated
        .as_ref()?
        .message
        .clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn termination_messages_are_bounded_and_share_12k() {
    let w = World::new().await;
    let names = ["a", "b", "c", "d"];
    let containers: Vec<serde_json::Value> = names
        .iter()
        .map(|n| json!({"name": n, "image": IMAGE, "command": ["sleep", "3600"]}))
        .collect();
    w.create_pod(
        "msgs",
        json!({"restartPolicy": "Never", "terminationGracePeriodSeconds": 5, "containers": containers}),
    )
    .await;
    w.wait_phase("msgs", "Running", T).await;
    for c in w.fake.containers() {
        let name = c.metadata.as_ref().unwrap().name.clone();
        let file = c
            .mounts
            .iter()
            .find(|m| m.container_path == "/dev/termination-log")
            .expect("termination log mounted")
            .host_path
            .clone();
        // 64 KiB of message ending with the container's name.
        let text = format!("{}{name}-END", "x".repeat(64 * 1024));
        std::fs::write(&file, text).unwrap();
        w.fake.exit_container(&c.id, 1, None).unwrap();
    }
    let p = w.wait_phase("msgs", "Failed", T).await;
    for n in names {
        let m = terminated_message(&p, n).unwrap();
        // Read: the last 4 KiB; stored: 12 KiB / 4 containers = 3 KiB,
        // cut from the end of what was read (kubelet keeps the start).
        assert_eq!(m.len(), 3 * 1024, "{n}");
        assert!(
            m.chars().all(|c| c == 'x'),
            "{n}: starts inside the read tail"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fallback_to_logs_reads_only_the_end_of_a_huge_log() {
    let w = World::new().await;
    w.create_pod(
        "logs",
        json!({"restartPolicy": "Never", "terminationGracePeriodSeconds": 5,
               "containers": [{"name": "app", "image": IMAGE, "command": ["sleep", "3600"],
                               "terminationMessagePolicy": "FallbackToLogsOnError"}]}),
    )
    .await;
    w.wait_phase("logs", "Running", T).await;
    let c = w.fake.containers().into_iter().next().unwrap();
    let log = std::path::PathBuf::from(&c.log_path);
    std::fs::create_dir_all(log.parent().unwrap()).unwrap();
    // 32 MiB of log lines, then the last words.
    {
        use std::io::Write;
        let mut f = std::io::BufWriter::new(std::fs::File::create(&log).unwrap());
        let line = format!(
            "2024-01-01T00:00:00.000000000Z stdout F {}\n",
            "y".repeat(1000)
        );
        for _ in 0..(32 * 1024) {
            f.write_all(line.as_bytes()).unwrap();
        }
        f.write_all(b"2024-01-01T00:00:01.000000000Z stderr F fatal: out of cheese\n")
            .unwrap();
    }
    w.fake.exit_container(&c.id, 2, None).unwrap();
    let p = w.wait_phase("logs", "Failed", T).await;
    let m = terminated_message(&p, "app").unwrap();
    assert_eq!(m.len(), 2048);
    assert!(m.ends_with("fatal: out of cheese\n"), "{m:?}");
}
