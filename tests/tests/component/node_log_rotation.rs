//! Component test of container log rotation (kubelet's container log
//! manager) against the fake CRI runtime: a running container's log over
//! `containerLogMaxSize` is renamed `<log>.<time>` and reopened through
//! CRI ReopenContainerLog (the runtime creates the path again); older
//! rotated files are gzipped; no more than `containerLogMaxFiles` stay;
//! the reader still returns every line across the files.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::HashMap;
use std::io::Write;
use std::time::Duration;

use keelson::node::logs::rotation::{LogRotation, RotationPolicy};
use keelson::node::logs::{ContainerRunning, DirWatcher, LogOptions, LogRequest, read_logs};
use keelson_cri::fake::FakeRuntime;
use keelson_cri::{ClientConfig, RuntimeClient, api, image_spec};

const IMAGE: &str = "keelson.local/busybox:1";

struct NotRunning;

impl ContainerRunning for NotRunning {
    fn is_running<'a>(
        &'a self,
        _: &'a str,
    ) -> futures::future::BoxFuture<'a, Result<bool, keelson_cri::CriError>> {
        Box::pin(async { Ok(false) })
    }
}

fn line(i: usize) -> String {
    format!(
        "2024-05-01T10:00:00.{i:09}Z stdout F line {i} {}\n",
        "x".repeat(40)
    )
}

#[tokio::test]
async fn rotation_renames_reopens_compresses_and_bounds_files() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeRuntime::start(dir.path().join("cri.sock"))
        .await
        .unwrap();
    fake.add_image(IMAGE);
    let cri = RuntimeClient::connect_with(
        &fake.endpoint(),
        ClientConfig::with_request_timeout(Duration::from_secs(10)),
    )
    .await
    .unwrap();
    let logs = dir.path().join("pods/default_p_uid1");
    std::fs::create_dir_all(logs.join("app")).unwrap();
    let sandbox_config = api::PodSandboxConfig {
        metadata: Some(api::PodSandboxMetadata {
            name: "p".into(),
            uid: "uid1".into(),
            namespace: "default".into(),
            attempt: 0,
        }),
        log_directory: logs.display().to_string(),
        ..Default::default()
    };
    let sb = cri
        .run_pod_sandbox(sandbox_config.clone(), "")
        .await
        .unwrap();
    let id = cri
        .create_container(
            &sb,
            api::ContainerConfig {
                metadata: Some(api::ContainerMetadata {
                    name: "app".into(),
                    attempt: 0,
                }),
                image: Some(image_spec(IMAGE)),
                log_path: "app/0.log".into(),
                labels: HashMap::from([("io.kubernetes.container.name".into(), "app".into())]),
                ..Default::default()
            },
            sandbox_config,
        )
        .await
        .unwrap();
    cri.start_container(&id).await.unwrap();
    let log = logs.join("app/0.log");
    let rotation = LogRotation::new(
        cri.clone(),
        RotationPolicy {
            max_size: 1024,
            max_files: 3,
            max_workers: 1,
            interval: Duration::from_secs(3),
        },
    );
    let mut n = 0;
    for round in 0..4 {
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .unwrap();
        for _ in 0..20 {
            f.write_all(line(n).as_bytes()).unwrap();
            n += 1;
        }
        drop(f);
        rotation.round().await;
        // Reopened: the live file exists again, empty.
        assert_eq!(std::fs::metadata(&log).unwrap().len(), 0, "round {round}");
        // Rotated names have distinct seconds only; wait for the next one.
        tokio::time::sleep(Duration::from_millis(1100)).await;
    }
    let mut names: Vec<String> = std::fs::read_dir(logs.join("app"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    // The live file, one plain rotated file, the rest gzipped, at most 3.
    assert_eq!(names.len(), 3, "{names:?}");
    assert_eq!(names[0], "0.log");
    assert_eq!(names[1].len(), "0.log".len() + 1 + 15 + 3, "{names:?}");
    assert!(names[1].ends_with(".gz"), "{names:?}");
    assert!(
        !names[2].ends_with(".gz") && names[2].starts_with("0.log."),
        "{names:?}"
    );
    assert_eq!(fake.calls_to("ReopenContainerLog").len(), 4);
    // Reading spans the rotated files: the last two rounds' 40 lines.
    let (tx, mut rx) = tokio::sync::mpsc::channel(16);
    let req = LogRequest {
        path: log.clone(),
        container_id: id.clone(),
        opts: LogOptions::default(),
        now_ns: 0,
        live_only: false,
    };
    let reader =
        tokio::spawn(async move { read_logs(&req, &NotRunning, &DirWatcher::start(), &tx).await });
    let mut out = Vec::new();
    while let Some(chunk) = rx.recv().await {
        out.extend_from_slice(&chunk.unwrap());
    }
    reader.await.unwrap().unwrap();
    let text = String::from_utf8(out).unwrap();
    let got: Vec<&str> = text.lines().collect();
    assert_eq!(got.len(), 40, "{text}");
    assert!(got[0].starts_with("line 40 "), "{}", got[0]);
    assert!(got[39].starts_with("line 79 "), "{}", got[39]);
}
