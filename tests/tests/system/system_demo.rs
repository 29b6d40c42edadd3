//! The README's first command, `./scripts/demo`, in its non-interactive
//! form (`--check`): it must bring up the test API server, a private
//! containerd and keelson in both roles, get the example Pod Running and
//! its Service answering through the ClusterIP, audit the proxy identity's
//! requests against the shipped RBAC, then remove everything it created.
//! The script's build step is skipped (`KEELSON_DEMO_BIN_DIR`): this test
//! runs inside `cargo test`, which holds cargo's build lock, and
//! `scripts/test` has built every binary already.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use keelson_tests::support::repo_root as repo;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// The directory holding the built `keelson` and `keelson-demo` (the
/// target profile directory this test was built into).
fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    exe.ancestors()
        .skip(1)
        .take(3)
        .find(|d| d.join("keelson").is_file() && d.join("keelson-demo").is_file())
        .map(Path::to_path_buf)
        .unwrap_or_else(|| {
            panic!(
                "keelson and keelson-demo not built next to {}: run `cargo build --workspace`",
                exe.display()
            )
        })
}

/// Runs `scripts/demo --check`; SIGTERM (the demo's own cleanup) after
/// `limit`, SIGKILL a minute later.
fn run_demo(limit: Duration) -> (Option<i32>, String, String) {
    let mut child = Command::new(repo().join("scripts/demo"))
        .arg("--check")
        .env("KEELSON_DEMO_BIN_DIR", bin_dir())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("scripts/demo starts");
    let mut stdout = child.stdout.take().expect("stdout");
    let mut stderr = child.stderr.take().expect("stderr");
    let out = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stdout.read_to_string(&mut s);
        s
    });
    let err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let start = Instant::now();
    let mut termed = false;
    let status = loop {
        if let Ok(Some(status)) = child.try_wait() {
            break status;
        }
        let pid = Pid::from_raw(i32::try_from(child.id()).unwrap_or(i32::MAX));
        if !termed && start.elapsed() > limit {
            let _ = kill(pid, Signal::SIGTERM);
            termed = true;
        }
        if start.elapsed() > limit + Duration::from_secs(60) {
            let _ = child.kill();
            break child.wait().expect("wait");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    (
        status.code(),
        out.join().unwrap_or_default(),
        err.join().unwrap_or_default(),
    )
}

/// The word after `prefix` on the first line containing it.
fn word_after<'a>(text: &'a str, prefix: &str) -> Option<&'a str> {
    text.lines()
        .find_map(|l| l.split_once(prefix).map(|(_, rest)| rest))
        .and_then(|rest| rest.split([' ', ',']).find(|w| !w.is_empty()))
}

#[test]
fn demo_check_mode_serves_the_example_and_cleans_up() {
    if !keelson_tests::support::require_root("demo_check_mode_serves_the_example_and_cleans_up") {
        return;
    }
    let (code, out, err) = run_demo(Duration::from_secs(420));
    let show = || format!("--- stdout ---\n{out}\n--- stderr ---\n{err}");
    assert_eq!(code, Some(0), "scripts/demo --check failed\n{}", show());

    // Every step, in order, with what it shows.
    let mut at = 0;
    for marker in [
        "[1/8] test API server",
        "[2/8] private containerd",
        "[3/8] keelson run",
        "demo-node",
        "[4/8] kubectl apply",
        "pod/hello created",
        "service/hello created",
        "[5/8] the Pod runs",
        "Running",
        "[6/8] the Service answers",
        "hello from pod hello, served by keelson",
        "the proxy role (system:kube-proxy) asked the API server only for what packaging/kubernetes/proxy/rbac.yaml grants",
        "[7/8] kubectl logs and exec",
        "[8/8] keelson diagnose",
        "Service default/hello on node demo-node",
        "keelson daemon: running",
        "✔ Endpoints",
        "✔ Data plane",
        "✔ Connections",
        "Verdict: ✔ healthy",
        "Everything works",
        "workload deleted; keelson stopped the Pod and removed it from the API",
        "keelson stopped (exit status: 0",
        "containerd stopped",
        "test API server stopped",
    ] {
        match out[at..].find(marker) {
            Some(i) => at += i + marker.len(),
            None => panic!("{marker:?} missing (or out of order)\n{}", show()),
        }
    }
    // The proxy role watched what kube-proxy watches.
    for request in [
        "list services",
        "watch services",
        "list endpointslices.discovery.k8s.io",
        "watch endpointslices.discovery.k8s.io",
    ] {
        assert!(
            out.contains(request),
            "proxy requests lack {request:?}\n{}",
            show()
        );
    }

    // Nothing left behind: the namespace, containerd's dir, the demo dir.
    let netns = word_after(&out, "network namespace ").expect("namespace name printed");
    let namespaces = Command::new("ip")
        .args(["netns", "list"])
        .output()
        .expect("ip netns list");
    assert!(
        !String::from_utf8_lossy(&namespaces.stdout)
            .lines()
            .any(|l| l.split_whitespace().next() == Some(netns)),
        "namespace {netns} left behind"
    );
    let state = word_after(&out, "containerd state in ").expect("containerd dir printed");
    assert!(!Path::new(state).exists(), "{state} left behind");
    let kubeconfig = word_after(&out, "(kubeconfig ").expect("kubeconfig printed");
    let kubeconfig = kubeconfig.trim_end_matches(')');
    let demo_dir = Path::new(kubeconfig).parent().expect("demo dir");
    assert!(!demo_dir.exists(), "{} left behind", demo_dir.display());
    let suffix = state.rsplit('/').next().expect("instance suffix");
    let cgroups = keelson_tests::containerd::CGROUP_PREFIX.to_string() + suffix;
    for hierarchy in ["cpu", "memory", "pids", "unified"] {
        let p = Path::new("/sys/fs/cgroup").join(hierarchy).join(&cgroups);
        assert!(!p.exists(), "{} left behind", p.display());
    }
}
