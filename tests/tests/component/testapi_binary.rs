//! The `keelson-testapi` binary as the demo and manual work use it: it
//! listens on the given addresses, prints and writes a kubeconfig that the
//! real kubectl can use, and exits cleanly on SIGTERM.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use keelson_tests::support::wait_for;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// Reads the server's stdout until the `kubeconfig:` line; returns its path.
async fn kubeconfig_line(child: &mut Child) -> Result<PathBuf, String> {
    let stdout = child.stdout.take().ok_or("stdout is not piped")?;
    let mut lines = BufReader::new(stdout).lines();
    let mut seen = Vec::new();
    while let Some(line) = lines.next_line().await.map_err(|e| e.to_string())? {
        if let Some(path) = line.strip_prefix("kubeconfig:") {
            return Ok(PathBuf::from(path.trim()));
        }
        seen.push(line);
    }
    Err(format!("stdout ended without a kubeconfig line: {seen:?}"))
}

async fn kubectl(kubeconfig: &Path, cache: &Path, args: &[&str]) -> (bool, String, String) {
    let out = tokio::time::timeout(
        Duration::from_secs(30),
        Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .arg("--cache-dir")
            .arg(cache)
            .arg("--request-timeout=10s")
            .args(args)
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .unwrap_or_else(|_| panic!("kubectl {args:?} timed out"))
    .expect("kubectl runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn minor(v: &Value) -> Option<u32> {
    v.get("minor")?.as_str()?.trim_end_matches('+').parse().ok()
}

#[tokio::test]
async fn binary_serves_kubectl_and_stops_cleanly_on_sigterm() {
    let dir = tempfile::tempdir().expect("tempdir");
    let kubeconfig = dir.path().join("kubeconfig");
    let cache = dir.path().join("kubectl-cache");
    let log = std::fs::File::create(dir.path().join("stderr.log")).expect("log file");
    let mut child = Command::new(env!("CARGO_BIN_EXE_keelson-testapi"))
        .args(["--listen", "127.0.0.1:0", "--tls-listen", "127.0.0.1:0"])
        .arg("--kubeconfig-out")
        .arg(&kubeconfig)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(log)
        .kill_on_drop(true) // a failing test still stops it
        .spawn()
        .expect("keelson-testapi starts");
    let pid = nix::unistd::Pid::from_raw(
        i32::try_from(child.id().expect("running child has a pid")).expect("pid fits i32"),
    );

    let printed = tokio::time::timeout(Duration::from_secs(30), kubeconfig_line(&mut child))
        .await
        .expect("kubeconfig line within 30s")
        .expect("kubeconfig line");
    assert_eq!(printed, kubeconfig, "printed kubeconfig path");
    let text = std::fs::read_to_string(&kubeconfig).expect("kubeconfig written");
    assert!(
        text.contains("https://127.0.0.1:") && !text.contains("127.0.0.1:0\n"),
        "kubeconfig names the bound HTTPS port: {text}"
    );

    let (ok, stdout, stderr) = kubectl(&kubeconfig, &cache, &["get", "ns", "-o", "name"]).await;
    assert!(ok, "kubectl get ns failed: {stdout}{stderr}");
    let names: Vec<&str> = stdout.lines().collect();
    for ns in ["default", "kube-system", "kube-public", "kube-node-lease"] {
        let want = format!("namespace/{ns}");
        assert!(names.contains(&want.as_str()), "{want} missing: {names:?}");
    }

    // /version is chosen to be within kubectl's supported skew (see
    // tests/README.md): kubectl prints no skew warning.
    let (ok, stdout, stderr) = kubectl(&kubeconfig, &cache, &["version", "-o", "json"]).await;
    assert!(ok, "kubectl version failed: {stdout}{stderr}");
    assert!(
        !stderr.contains("version difference"),
        "kubectl warns about skew: {stderr}"
    );
    let v: Value = serde_json::from_str(&stdout).expect("kubectl version -o json prints JSON");
    let client = minor(&v["clientVersion"]).expect("client minor");
    let server = minor(&v["serverVersion"]).expect("server minor");
    assert!(client.abs_diff(server) <= 1, "{v}");
    assert!(
        v["serverVersion"]["gitVersion"]
            .as_str()
            .is_some_and(|g| g.ends_with("+keelson-testapi")),
        "{v}"
    );

    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).expect("SIGTERM");
    let status = wait_for(
        "keelson-testapi to exit after SIGTERM",
        Duration::from_secs(15),
        Duration::from_millis(50),
        || {
            let r = child.try_wait();
            async move {
                match r {
                    Ok(Some(status)) => Ok(status),
                    Ok(None) => Err("still running".to_string()),
                    Err(e) => Err(e.to_string()),
                }
            }
        },
    )
    .await
    .expect("exits");
    let log = std::fs::read_to_string(dir.path().join("stderr.log")).unwrap_or_default();
    assert!(status.success(), "exit {status:?}; stderr:\n{log}");
}
