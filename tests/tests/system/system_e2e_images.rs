//! System test of the e2e suite's images ([`keelson_tests::images::e2e`]):
//! all are built from the shared binaries and `e2e-image-files.tar.xz`,
//! imported into a private containerd under their upstream names
//! (`registry.k8s.io/pause:3.10.2` as its sandbox image), and the main ones
//! run through CRI, each checked for a behaviour the suite relies on.
//!
//! Needs root and `KEELSON_UPSTREAM_BIN` (the unpacked `../shared/k8s`
//! binaries); `e2e-image-files.tar.xz` is taken from
//! `KEELSON_E2E_IMAGE_FILES` or `../shared/k8s/`.

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use keelson_cri::{RuntimeClient, api, image_spec};
use keelson_tests::containerd::{Containerd, ContainerdOptions, wait_container_exited};
use keelson_tests::images::e2e;
use keelson_tests::support::{require_root, skip, wait_for};
use keelson_tests::upstream::bins::BIN_ENV;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const TEST: &str = "e2e_images_build_import_and_run";

fn container(
    name: &str,
    image: &str,
    command: &[&str],
    args: &[&str],
    envs: &[(&str, &str)],
) -> api::ContainerConfig {
    let strings = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    api::ContainerConfig {
        metadata: Some(api::ContainerMetadata {
            name: name.to_string(),
            attempt: 0,
        }),
        image: Some(image_spec(image)),
        command: strings(command),
        args: strings(args),
        envs: envs
            .iter()
            .map(|(k, v)| api::KeyValue {
                key: k.to_string(),
                value: v.to_string(),
            })
            .collect(),
        log_path: format!("{name}/0.log"),
        labels: HashMap::from([("io.kubernetes.container.name".to_string(), name.to_string())]),
        ..Default::default()
    }
}

fn run_as(mut config: api::ContainerConfig, uid: i64, no_new_privs: bool) -> api::ContainerConfig {
    config.linux = Some(api::LinuxContainerConfig {
        security_context: Some(api::LinuxContainerSecurityContext {
            run_as_user: Some(api::Int64Value { value: uid }),
            no_new_privs,
            ..Default::default()
        }),
        ..Default::default()
    });
    config
}

/// A sandbox and its config, for creating containers in it.
struct Pod {
    id: String,
    config: api::PodSandboxConfig,
    ip: Ipv4Addr,
}

async fn pod(ctrd: &Containerd, name: &str) -> Pod {
    let config = ctrd.sandbox_config("e2e-images", name, &format!("uid-{name}"));
    let cri = ctrd.client();
    let id = cri
        .run_pod_sandbox(config.clone(), "")
        .await
        .expect("run sandbox (the pause:3.10.2 image)");
    let ip = cri
        .pod_sandbox_status(&id, false)
        .await
        .expect("sandbox status")
        .status
        .and_then(|s| s.network)
        .map(|n| n.ip)
        .unwrap_or_default()
        .parse()
        .expect("sandbox IPv4");
    Pod { id, config, ip }
}

async fn start(cri: &RuntimeClient, pod: &Pod, config: api::ContainerConfig) -> String {
    let name = config
        .metadata
        .as_ref()
        .map(|m| m.name.clone())
        .unwrap_or_default();
    let id = cri
        .create_container(&pod.id, config, pod.config.clone())
        .await
        .unwrap_or_else(|e| panic!("create {name}: {e}"));
    cri.start_container(&id)
        .await
        .unwrap_or_else(|e| panic!("start {name}: {e}"));
    id
}

/// Runs a container to completion; its exit code and output (the CRI
/// log's message parts).
async fn run_to_end(ctrd: &Containerd, pod: &Pod, config: api::ContainerConfig) -> (i32, String) {
    let cri = ctrd.client();
    let id = start(cri, pod, config).await;
    let status = wait_container_exited(cri, &id).await;
    let log = std::fs::read_to_string(
        Path::new(&pod.config.log_directory).join(status.log_path.trim_start_matches('/')),
    )
    .or_else(|_| std::fs::read_to_string(&status.log_path))
    .unwrap_or_default();
    // "<time> <stream> <P|F> <message>"
    let output = log
        .lines()
        .filter_map(|l| l.splitn(4, ' ').nth(3))
        .collect::<Vec<_>>()
        .join("\n");
    (status.exit_code, output)
}

async fn exec(cri: &RuntimeClient, id: &str, argv: &[&str]) -> (i32, String) {
    let r = cri
        .exec_sync(
            id,
            argv.iter().map(|s| s.to_string()).collect(),
            Duration::from_secs(20),
        )
        .await
        .unwrap_or_else(|e| panic!("exec {argv:?}: {e}"));
    (
        r.exit_code,
        format!(
            "{}{}",
            String::from_utf8_lossy(&r.stdout),
            String::from_utf8_lossy(&r.stderr)
        ),
    )
}

/// GET `path` on `ip:port` from the containerd's namespace.
async fn http_get(
    ctrd: &Containerd,
    ip: Ipv4Addr,
    port: u16,
    path: &str,
) -> Result<String, String> {
    let mut conn = ctrd
        .netns()
        .tcp_connect(SocketAddr::from((ip, port)), Duration::from_secs(2))
        .map_err(|e| e.to_string())?;
    conn.write_all(format!("GET {path} HTTP/1.0\r\nHost: pod\r\n\r\n").as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let mut body = String::new();
    tokio::time::timeout(Duration::from_secs(5), conn.read_to_string(&mut body))
        .await
        .map_err(|_| "read timed out".to_string())?
        .map_err(|e| e.to_string())?;
    Ok(body)
}

#[tokio::test]
async fn e2e_images_build_import_and_run() {
    if !require_root(TEST) {
        return;
    }
    let Some(bin) = std::env::var_os(BIN_ENV).filter(|v| !v.is_empty()) else {
        skip(
            TEST,
            &format!("{BIN_ENV} is not set (no shared Kubernetes binaries)"),
        );
        return;
    };
    let files = e2e::image_files_tarball();
    if !files.is_file() {
        skip(TEST, &format!("{} is absent", files.display()));
        return;
    }

    let began = Instant::now();
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().to_path_buf();
    let built =
        tokio::task::spawn_blocking(move || e2e::build_e2e_images(Path::new(&bin), &files, &out))
            .await
            .expect("build task")
            .expect("build the e2e images");
    eprintln!("built {} archives in {:?}", built.len(), began.elapsed());
    assert_eq!(built[0].name, e2e::PAUSE);

    // Built again with the same inputs: the archives of the first build,
    // not rewritten.
    let mtimes = |b: &[keelson_tests::images::BuiltImage]| {
        b.iter()
            .map(|i| {
                let m = std::fs::metadata(&i.archive).expect("archive");
                (
                    i.name.clone(),
                    i.manifest_digest.clone(),
                    m.modified().expect("mtime"),
                )
            })
            .collect::<Vec<_>>()
    };
    let bin = PathBuf::from(std::env::var_os(BIN_ENV).unwrap_or_default());
    let again =
        e2e::build_e2e_images(&bin, &e2e::image_files_tarball(), dir.path()).expect("cached build");
    assert_eq!(mtimes(&again), mtimes(&built));

    let ctrd = Containerd::start_with(ContainerdOptions {
        sandbox_image: Some(e2e::PAUSE.to_string()),
        extra_images: built,
        ..ContainerdOptions::default()
    })
    .await
    .expect("containerd with the e2e images");
    eprintln!("imported by {:?}", began.elapsed());
    let cri = ctrd.client().clone();

    // Every name, second tags included, is there through CRI.
    for name in [
        e2e::PAUSE,
        e2e::AGNHOST,
        e2e::AGNHOST_PREV,
        e2e::KITTEN,
        e2e::NAUTILUS,
        e2e::BUSYBOX,
        e2e::BUSYBOX_PREV,
        e2e::NGINX,
        e2e::NGINX_NEW,
        e2e::NONEWPRIVS,
        e2e::NONROOT,
        e2e::GLIBC_DNS_TESTING,
    ] {
        let status = cri
            .image_status(image_spec(name))
            .await
            .expect("image status")
            .unwrap_or_else(|| panic!("{name} is not in containerd"));
        if name == e2e::NONROOT {
            assert_eq!(status.username, "", "{status:?}");
            assert_eq!(status.uid.map(|u| u.value), Some(1234), "{status:?}");
        }
    }

    let web = pod(&ctrd, "web").await;

    // agnhost: the image's entrypoint with netexec as its arguments; its
    // HTTP and UDP servers answer curl and OpenBSD nc inside the pod.
    let agnhost = start(
        &cri,
        &web,
        container(
            "agnhost",
            e2e::AGNHOST,
            &[],
            &["netexec", "--http-port=8080", "--udp-port=8081"],
            &[],
        ),
    )
    .await;
    let (code, text) = exec(&cri, &agnhost, &["curl", "--version"]).await;
    assert!(code == 0 && text.starts_with("curl "), "{code} {text}");
    let (code, text) = exec(&cri, &agnhost, &["sh", "-c", "nc -h 2>&1"]).await;
    assert!(text.contains("OpenBSD netcat"), "{code} {text}");
    let (code, text) = exec(&cri, &agnhost, &["dig", "-v"]).await;
    assert!(code == 0 && text.contains("DiG 9"), "{code} {text}");
    let (code, text) = exec(&cri, &agnhost, &["ip", "-V"]).await;
    assert!(code == 0 && text.contains("iproute2"), "{code} {text}");
    let (code, text) = exec(&cri, &agnhost, &["/agnhost-2", "--help"]).await;
    assert!(code == 0 && text.contains("netexec"), "{code} {text}");
    let (code, text) = exec(&cri, &agnhost, &["id", "user-defined-in-image"]).await;
    assert!(
        code == 0
            && text.contains("uid=1000(user-defined-in-image)")
            && text.contains("50000(group-defined-in-image)"),
        "{code} {text}"
    );
    let (code, text) = exec(
        &cri,
        &agnhost,
        &["ls", "/localhost.crt", "/localhost.key", "/uploads"],
    )
    .await;
    assert_eq!(code, 0, "{text}");
    let hostname = wait_for(
        "netexec to answer curl",
        Duration::from_secs(20),
        Duration::from_millis(100),
        || async {
            let (code, text) = exec(
                &cri,
                &agnhost,
                &[
                    "curl",
                    "-sS",
                    "--max-time",
                    "2",
                    "http://127.0.0.1:8080/hostname",
                ],
            )
            .await;
            if code == 0 && !text.is_empty() {
                Ok(text)
            } else {
                Err(format!("{code} {text}"))
            }
        },
    )
    .await
    .expect("netexec over HTTP");
    assert_eq!(hostname.trim(), "web");
    let (code, text) = exec(
        &cri,
        &agnhost,
        &["sh", "-c", "echo hostName | nc -v -u -w 2 127.0.0.1 8081"],
    )
    .await;
    assert!(code == 0 && text.contains("web"), "{code} {text}");

    // busybox 1.37's sh keeps variables whose names are not identifiers
    // (Debian's 1.35 drops them).
    let (code, text) = run_to_end(
        &ctrd,
        &web,
        container(
            "busybox",
            e2e::BUSYBOX,
            &["sh", "-c", "env; /bin/env true && busybox | head -1"],
            &[],
            &[("a.b", "dotted"), ("PLAIN", "x")],
        ),
    )
    .await;
    assert_eq!(code, 0, "{text}");
    assert!(
        text.contains("a.b=dotted") && text.contains("PLAIN=x"),
        "{text}"
    );
    assert!(text.contains("BusyBox v1.37"), "{text}");

    // nginx 1.15-4 serves its page on :80 of the pod.
    let nginx = start(&cri, &web, container("nginx", e2e::NGINX, &[], &[], &[])).await;
    let body = wait_for(
        "nginx to answer",
        Duration::from_secs(20),
        Duration::from_millis(100),
        || http_get(&ctrd, web.ip, 80, "/"),
    )
    .await
    .expect("nginx over HTTP");
    assert!(
        body.starts_with("HTTP/1.1 200") && body.contains("Welcome to nginx!"),
        "{body}"
    );
    // Its stop signal (SIGTERM) ends it cleanly within the grace period.
    cri.stop_container(&nginx, Duration::from_secs(10))
        .await
        .expect("stop nginx");
    let stopped = wait_container_exited(&cri, &nginx).await;
    assert_eq!(stopped.exit_code, 0, "{stopped:?}");

    // nonroot runs as 1234 unless told otherwise.
    let (code, text) = run_to_end(
        &ctrd,
        &web,
        container("nonroot", e2e::NONROOT, &["id", "-u"], &[], &[]),
    )
    .await;
    assert_eq!((code, text.trim()), (0, "1234"));

    // nonewprivs: nnp is setuid root, effective only while privilege
    // escalation is allowed.
    let (code, text) = run_to_end(
        &ctrd,
        &web,
        run_as(
            container("nnp-allowed", e2e::NONEWPRIVS, &[], &[], &[]),
            1000,
            false,
        ),
    )
    .await;
    assert!(
        code == 0 && text.contains("Effective uid: 0"),
        "{code} {text}"
    );
    let (code, text) = run_to_end(
        &ctrd,
        &web,
        run_as(
            container("nnp-denied", e2e::NONEWPRIVS, &[], &[], &[]),
            1000,
            true,
        ),
    )
    .await;
    assert!(
        code == 0 && text.contains("Effective uid: 1000"),
        "{code} {text}"
    );

    // glibc-dns-testing: Debian's dig and getent over glibc.
    let (code, text) = run_to_end(
        &ctrd,
        &web,
        container(
            "jessie",
            e2e::GLIBC_DNS_TESTING,
            &[
                "sh",
                "-c",
                "dig -v 2>&1 && getent passwd root && test -n \"$(seq 1 3)\"",
            ],
            &[],
            &[],
        ),
    )
    .await;
    assert!(
        code == 0 && text.contains("DiG 9") && text.contains("root:x:0:0"),
        "{code} {text}"
    );

    // nginx 1.27-0 through its entrypoint script, in a second pod (port
    // 80 again); SIGQUIT is a graceful stop.
    let other = pod(&ctrd, "other").await;
    let nginx_new = start(
        &cri,
        &other,
        container("nginx", e2e::NGINX_NEW, &[], &[], &[]),
    )
    .await;
    let body = wait_for(
        "nginx 1.27 to answer",
        Duration::from_secs(20),
        Duration::from_millis(100),
        || http_get(&ctrd, other.ip, 80, "/"),
    )
    .await
    .expect("nginx 1.27 over HTTP");
    assert!(body.contains("Welcome to nginx!"), "{body}");
    cri.stop_container(&nginx_new, Duration::from_secs(10))
        .await
        .expect("stop nginx 1.27");
    let stopped = wait_container_exited(&cri, &nginx_new).await;
    assert_eq!(stopped.exit_code, 0, "{stopped:?}");

    for p in [&web, &other] {
        cri.stop_pod_sandbox(&p.id).await.expect("stop sandbox");
        cri.remove_pod_sandbox(&p.id).await.expect("remove sandbox");
    }
    let instance = ctrd.instance().clone();
    drop(ctrd);
    assert_eq!(instance.leftovers(), Vec::<String>::new());
    eprintln!("{TEST} took {:?}", began.elapsed());
}
