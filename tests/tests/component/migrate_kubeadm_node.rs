//! `keelson migrate` against a fake kubeadm node: kubeadm v1.36's kubelet
//! files below a temporary root (`--root`), a systemctl double that keeps
//! unit state in the test's directory (`--systemctl`), and the test API
//! server as the cluster, reached with kubelet.conf's own client
//! certificate. The test plays the parts the double cannot: it reports the
//! Node Ready once keelson.service "starts" (as keelson would) and deletes
//! kube-proxy's pod once the node is labelled (as the DaemonSet
//! controller would). Nothing outside the temporary directory changes.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use base64::Engine;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod};
use keelson_tests::node_harness::keelson_bin;
use keelson_tests::support::repo_root as repo;
use keelson_tests::support::wait_for;
use keelson_tests::testapi::{TestApiOptions, TestApiServer};
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;

const NODE: &str = "node-1";
const T: Duration = Duration::from_secs(60);

fn testdata(name: &str) -> String {
    std::fs::read_to_string(repo().join("agent/src/config/upstream/testdata").join(name))
        .expect("testdata")
}

/// A fake kubeadm node: its root, and a systemctl keeping unit state in
/// files (`<unit>.known`, `.enabled`, `.active`) and logging its calls.
struct FakeNode {
    dir: tempfile::TempDir,
    systemctl: PathBuf,
}

impl FakeNode {
    fn new(api: &TestApiServer) -> FakeNode {
        let dir = tempfile::tempdir().expect("tempdir");
        let state = dir.path().join("units");
        std::fs::create_dir_all(&state).expect("mkdir");
        let systemctl = dir.path().join("systemctl");
        std::fs::write(
            &systemctl,
            format!(
                r#"#!/bin/sh
S='{state}'
echo "$*" >> '{calls}'
cmd="$1"; shift
q=0; now=0
while [ $# -gt 0 ]; do
  case "$1" in --quiet) q=1; shift ;; --now) now=1; shift ;; *) break ;; esac
done
u="$1"
case "$cmd" in
  is-enabled)
    if [ ! -e "$S/$u.known" ]; then [ $q = 1 ] || echo not-found; exit 1; fi
    if [ -e "$S/$u.enabled" ]; then [ $q = 1 ] || echo enabled; exit 0; fi
    [ $q = 1 ] || echo disabled; exit 1 ;;
  is-active)
    if [ -e "$S/$u.active" ]; then [ $q = 1 ] || echo active; exit 0; fi
    [ $q = 1 ] || echo inactive; exit 3 ;;
  enable) touch "$S/$u.known" "$S/$u.enabled"; [ $now = 0 ] || touch "$S/$u.active" ;;
  disable) rm -f "$S/$u.enabled"; [ $now = 0 ] || rm -f "$S/$u.active" ;;
  start|restart) touch "$S/$u.known" "$S/$u.active" ;;
  stop) rm -f "$S/$u.active" ;;
  daemon-reload) ;;
  *) echo "systemctl double: unknown command $cmd" >&2; exit 1 ;;
esac
"#,
                state = state.display(),
                calls = dir.path().join("calls").display()
            ),
        )
        .expect("write systemctl");
        std::fs::set_permissions(&systemctl, std::fs::Permissions::from_mode(0o755))
            .expect("chmod");
        let n = FakeNode { dir, systemctl };
        for f in [
            "kubelet.service.known",
            "kubelet.service.enabled",
            "kubelet.service.active",
        ] {
            std::fs::write(state.join(f), "").expect("unit state");
        }

        // kubeadm's files, as `kubeadm join` leaves them.
        n.put(
            "/var/lib/kubelet/config.yaml",
            &testdata("kubeadm-kubelet-config.yaml"),
            0o644,
        );
        n.put(
            "/var/lib/kubelet/kubeadm-flags.env",
            &testdata("kubeadm-flags.env").replace(
                "--node-ip",
                &format!("--hostname-override={NODE} --node-ip"),
            ),
            0o644,
        );
        n.put("/etc/default/kubelet", "KUBELET_EXTRA_ARGS=\n", 0o644);
        let (cert, key) = api
            .issue_client_certificate(&format!("system:node:{NODE}"), Some("system:nodes"))
            .expect("client certificate");
        let dated = "kubelet-client-2026-12-01-10-00-00.pem";
        n.put(
            &format!("/var/lib/kubelet/pki/{dated}"),
            &format!("{cert}{key}"),
            0o600,
        );
        // kubelet's link is absolute; relative here so that it resolves
        // below the test's root.
        std::os::unix::fs::symlink(
            dated,
            n.path("/var/lib/kubelet/pki/kubelet-client-current.pem"),
        )
        .expect("link");
        let ca = base64::engine::general_purpose::STANDARD.encode(api.ca_pem());
        n.put(
            "/etc/kubernetes/kubelet.conf",
            &format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: kubernetes\n  cluster:\n    server: {}\n    certificate-authority-data: {ca}\ncontexts:\n- name: system:node:{NODE}@kubernetes\n  context:\n    cluster: kubernetes\n    user: system:node:{NODE}\ncurrent-context: system:node:{NODE}@kubernetes\nusers:\n- name: system:node:{NODE}\n  user:\n    client-certificate: /var/lib/kubelet/pki/kubelet-client-current.pem\n    client-key: /var/lib/kubelet/pki/kubelet-client-current.pem\n",
                api.https_url()
            ),
            0o600,
        );
        n
    }

    fn root(&self) -> PathBuf {
        self.dir.path().join("root")
    }

    fn path(&self, p: &str) -> PathBuf {
        self.root().join(p.trim_start_matches('/'))
    }

    fn put(&self, p: &str, text: &str, mode: u32) {
        let path = self.path(p);
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        std::fs::write(&path, text).expect("write");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).expect("chmod");
    }

    fn unit(&self, unit: &str) -> (bool, bool) {
        let s = self.dir.path().join("units");
        (
            s.join(format!("{unit}.enabled")).exists(),
            s.join(format!("{unit}.active")).exists(),
        )
    }

    fn calls(&self) -> Vec<String> {
        std::fs::read_to_string(self.dir.path().join("calls"))
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }

    fn migrate_command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(keelson_bin().expect("keelson binary"));
        c.arg("migrate")
            .args(args)
            .arg("--root")
            .arg(self.root())
            .arg("--systemctl")
            .arg(&self.systemctl)
            .env("TMPDIR", self.dir.path())
            .stdin(Stdio::null());
        c
    }

    fn migrate(&self, args: &[&str]) -> Output {
        self.migrate_command(args)
            .output()
            .expect("keelson migrate runs")
    }

    /// Regular files and links below the root with mode and content (or
    /// link target), leaving out `skip` prefixes.
    fn files(&self, skip: &[&str]) -> BTreeMap<String, (u32, Vec<u8>)> {
        let mut out = BTreeMap::new();
        let mut stack = vec![self.root()];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).expect("read_dir").flatten() {
                let p = e.path();
                let rel = format!("/{}", p.strip_prefix(self.root()).expect("below").display());
                if skip.iter().any(|s| rel.starts_with(s)) {
                    continue;
                }
                let md = std::fs::symlink_metadata(&p).expect("metadata");
                if md.is_dir() {
                    stack.push(p);
                } else if md.file_type().is_symlink() {
                    let t = std::fs::read_link(&p).expect("link");
                    out.insert(rel, (0, t.display().to_string().into_bytes()));
                } else {
                    out.insert(rel, (md.mode() & 0o7777, std::fs::read(&p).expect("read")));
                }
            }
        }
        out
    }
}

fn text(out: &Output) -> String {
    format!(
        "exit {}\n--- stdout\n{}--- stderr\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

async fn set_ready(client: &kube::Client, heartbeat: jiff::Timestamp) {
    let hb = jiff::Timestamp::from_second(heartbeat.as_second())
        .expect("ts")
        .to_string();
    Api::<Node>::all(client.clone())
        .patch_status(
            NODE,
            &PatchParams::default(),
            &Patch::Merge(&json!({"status": {"conditions": [{
                "type": "Ready", "status": "True", "reason": "KubeletReady",
                "message": "ready", "lastHeartbeatTime": hb, "lastTransitionTime": hb
            }]}})),
        )
        .await
        .expect("node status");
}

/// The Node and a running pod, as kubelet left them.
async fn cluster(client: &kube::Client) {
    Api::<Node>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": NODE}})).expect("node"),
        )
        .await
        .expect("create node");
    set_ready(
        client,
        jiff::Timestamp::now() - jiff::SignedDuration::from_secs(20),
    )
    .await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    pods.create(
        &PostParams::default(),
        &serde_json::from_value(json!({
            "metadata": {"name": "web"},
            "spec": {"nodeName": NODE, "containers": [{"name": "app", "image": "busybox"}]}
        }))
        .expect("pod"),
    )
    .await
    .expect("create pod");
    pods.patch_status(
        "web",
        &PatchParams::default(),
        &Patch::Merge(
            &json!({"status": {"phase": "Running", "containerStatuses": [{
                "name": "app", "image": "busybox", "imageID": "busybox@sha256:1", "ready": true,
                "restartCount": 2, "containerID": "containerd://aaaa",
                "state": {"running": {"startedAt": "2026-12-01T10:00:00Z"}}
            }]}}),
        ),
    )
    .await
    .expect("pod status");
}

async fn wait_for_call(node: &FakeNode, call: &str) {
    wait_for(
        &format!("systemctl {call}"),
        T,
        Duration::from_millis(50),
        || async {
            if node.calls().iter().any(|c| c == call) {
                Ok(())
            } else {
                Err(format!("calls so far: {:?}", node.calls()))
            }
        },
    )
    .await
    .expect("call");
}

/// Waits until the clock is in a later second than `t` (heartbeats have
/// one-second resolution).
async fn next_second(t: jiff::Timestamp) {
    wait_for(
        "the next second",
        Duration::from_secs(3),
        Duration::from_millis(20),
        || async {
            if jiff::Timestamp::now().as_second() > t.as_second() {
                Ok(())
            } else {
                Err("same second".to_string())
            }
        },
    )
    .await
    .expect("clock");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plan_apply_and_rollback_on_a_kubeadm_node() {
    let api = TestApiServer::start(TestApiOptions::default())
        .await
        .expect("api");
    let client = api.client().await;
    cluster(&client).await;
    let node = FakeNode::new(&api);
    let before = node.files(&[]);

    // --from-kubelet: the plan, and nothing changes.
    let out = node.migrate(&["--from-kubelet"]);
    let report = text(&out);
    assert!(out.status.success(), "{report}");
    for want in [
        "kind: KeelsonConfiguration",
        "nodeName: node-1",
        "kubeconfig: /etc/kubernetes/kubelet.conf",
        "rootDir: /var/lib/kubelet",
        "cgroupDriver: systemd",
        "# Differences from kubelet and kube-proxy:",
        "# Steps of --apply:",
    ] {
        assert!(report.contains(want), "missing {want:?}:\n{report}");
    }
    assert_eq!(node.files(&[]), before, "the plan changes nothing");
    assert!(
        node.calls().iter().all(|c| c.starts_with("is-")),
        "{:?}",
        node.calls()
    );

    // --apply: the test reports the Node Ready once keelson "starts".
    let child = node
        .migrate_command(&["--from-kubelet", "--apply", "--timeout", "60s"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    wait_for_call(&node, "start keelson.service").await;
    next_second(jiff::Timestamp::now()).await;
    set_ready(&client, jiff::Timestamp::now()).await;
    let out = tokio::task::spawn_blocking(move || child.wait_with_output())
        .await
        .expect("join")
        .expect("wait");
    let report = text(&out);
    assert!(out.status.success(), "{report}");
    assert!(
        report.contains("backup written to /var/lib/keelson/migrate/backup"),
        "{report}"
    );
    assert!(report.contains("Node node-1 is Ready"), "{report}");
    assert!(
        report.contains("1 running container(s) of 1 pod(s) adopted, none restarted"),
        "{report}"
    );

    // The backup came first and holds kubelet's files byte for byte.
    let calls = node.calls();
    let pos = |c: &str| {
        calls
            .iter()
            .position(|x| x == c)
            .unwrap_or_else(|| panic!("no {c:?} in {calls:?}"))
    };
    assert!(pos("stop kubelet.service") < pos("disable kubelet.service"));
    assert!(pos("disable kubelet.service") < pos("enable keelson.service"));
    assert!(pos("enable keelson.service") < pos("start keelson.service"));
    let backup = node.path("/var/lib/keelson/migrate/backup");
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(backup.join("manifest.json")).expect("manifest"))
            .expect("json");
    assert_eq!(manifest["units"]["kubelet.service"]["enabled"], "enabled");
    assert_eq!(manifest["units"]["kubelet.service"]["active"], "active");
    for f in [
        "/var/lib/kubelet/config.yaml",
        "/etc/kubernetes/kubelet.conf",
        "/var/lib/kubelet/kubeadm-flags.env",
    ] {
        assert_eq!(
            std::fs::read(backup.join("files").join(f.trim_start_matches('/'))).expect("copy"),
            std::fs::read(node.path(f)).expect("original"),
            "{f}"
        );
    }
    assert_eq!(node.unit("kubelet.service"), (false, false));
    assert_eq!(node.unit("keelson.service"), (true, true));
    let unit =
        std::fs::read_to_string(node.path("/etc/systemd/system/keelson.service")).expect("unit");
    assert!(
        unit.lines()
            .any(|l| l == "Conflicts=kubelet.service kube-proxy.service"),
        "{unit}"
    );
    assert_eq!(
        std::fs::read(node.path("/usr/local/bin/keelson")).expect("installed binary"),
        std::fs::read(keelson_bin().expect("bin")).expect("binary")
    );
    // The configuration written is the one printed, and keelson accepts it.
    let config = node.path("/etc/keelson/config.yaml");
    let check = Command::new(keelson_bin().expect("bin"))
        .arg("check-config")
        .arg(&config)
        .output()
        .expect("check-config");
    assert!(check.status.success(), "{}", text(&check));
    let yaml = String::from_utf8_lossy(&check.stdout).into_owned();
    assert!(
        yaml.contains("rootDir: /var/lib/kubelet") && yaml.contains("nodeName: node-1"),
        "{yaml}"
    );
    // kubelet's own files are untouched.
    let now = node.files(&[]);
    for f in [
        "/var/lib/kubelet/config.yaml",
        "/etc/kubernetes/kubelet.conf",
        "/var/lib/kubelet/pki/kubelet-client-current.pem",
    ] {
        assert_eq!(now.get(f), before.get(f), "{f}");
    }

    // A second --apply is refused until a rollback.
    let out = node.migrate(&["--from-kubelet", "--apply", "--no-wait"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains("run keelson migrate --rollback first"),
        "{}",
        text(&out)
    );

    // --rollback: kubelet as it was, keelson gone, every file as before.
    let out = node.migrate(&["--rollback"]);
    let report = text(&out);
    assert!(out.status.success(), "{report}");
    assert_eq!(node.unit("kubelet.service"), (true, true));
    assert_eq!(node.unit("keelson.service"), (false, false));
    let calls = node.calls();
    assert!(
        calls.iter().any(|c| c == "disable --now keelson.service"),
        "{calls:?}"
    );
    assert!(
        calls.iter().any(|c| c == "enable kubelet.service"),
        "{calls:?}"
    );
    assert!(
        calls.iter().any(|c| c == "start kubelet.service"),
        "{calls:?}"
    );
    assert_eq!(
        node.files(&["/var/lib/keelson/migrate/rolled-back-"]),
        before,
        "every file byte for byte as before the migration, keelson's removed"
    );
    // And the node may be migrated again.
    let out = node.migrate(&["--from-kubelet"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(!text(&out).contains("# Refused"), "{}", text(&out));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replacing_kube_proxy_moves_its_pod_away_by_label_and_rollback_brings_it_back() {
    let api = TestApiServer::start(TestApiOptions::default())
        .await
        .expect("api");
    let client = api.client().await;
    cluster(&client).await;
    Api::<ConfigMap>::namespaced(client.clone(), "kube-system")
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": "kube-proxy"},
                "data": {"config.conf": testdata("kubeadm-kube-proxy-config.yaml")}
            }))
            .expect("cm"),
        )
        .await
        .expect("create cm");
    let kube_system: Api<Pod> = Api::namespaced(client.clone(), "kube-system");
    kube_system
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": "kube-proxy-x1", "labels": {"k8s-app": "kube-proxy"}},
                "spec": {"nodeName": NODE, "containers": [{"name": "kube-proxy", "image": "kube-proxy"}]}
            }))
            .expect("pod"),
        )
        .await
        .expect("create kube-proxy pod");
    let node = FakeNode::new(&api);
    let proxy_kc = node.dir.path().join("proxy.kubeconfig");
    api.write_kubeconfig(&proxy_kc, None)
        .expect("proxy kubeconfig");
    let before = node.files(&[]);
    let kc = proxy_kc.display().to_string();

    // The plan reads kube-proxy's ConfigMap with the node's credentials.
    let out = node.migrate(&[
        "--from-kubelet",
        "--replace-kube-proxy",
        "--proxy-kubeconfig",
        &kc,
    ]);
    let report = text(&out);
    assert!(out.status.success(), "{report}");
    assert!(report.contains("clusterCIDR: 10.244.0.0/16"), "{report}");
    assert!(
        report.contains("ConfigMap kube-system/kube-proxy"),
        "{report}"
    );

    let child = node
        .migrate_command(&[
            "--from-kubelet",
            "--apply",
            "--replace-kube-proxy",
            "--proxy-kubeconfig",
            &kc,
            "--timeout",
            "60s",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    // The DaemonSet controller's part: the labelled node loses kube-proxy's pod.
    let nodes: Api<Node> = Api::all(client.clone());
    wait_for("the label", T, Duration::from_millis(50), || async {
        let n = nodes.get(NODE).await.map_err(|e| e.to_string())?;
        match n
            .metadata
            .labels
            .unwrap_or_default()
            .get("keelson.dev/proxy")
        {
            Some(v) if v == "node-agent" => Ok(()),
            other => Err(format!("label {other:?}")),
        }
    })
    .await
    .expect("labelled");
    assert!(
        !node.calls().iter().any(|c| c == "stop kubelet.service"),
        "kubelet stops only after kube-proxy's pod has left"
    );
    kube_system
        .delete("kube-proxy-x1", &DeleteParams::default().grace_period(0))
        .await
        .expect("delete kube-proxy pod");
    wait_for_call(&node, "start keelson.service").await;
    next_second(jiff::Timestamp::now()).await;
    set_ready(&client, jiff::Timestamp::now()).await;
    let out = tokio::task::spawn_blocking(move || child.wait_with_output())
        .await
        .expect("join")
        .expect("wait");
    let report = text(&out);
    assert!(out.status.success(), "{report}");
    assert!(
        report.contains("kube-proxy's pod has left the node"),
        "{report}"
    );
    assert_eq!(
        std::fs::read(node.path("/etc/keelson/proxy.kubeconfig")).expect("installed"),
        std::fs::read(&proxy_kc).expect("given")
    );
    let config = std::fs::read_to_string(node.path("/etc/keelson/config.yaml")).expect("config");
    assert!(
        config.contains("kubeconfig: /etc/keelson/proxy.kubeconfig"),
        "{config}"
    );

    let out = node.migrate(&["--rollback"]);
    assert!(out.status.success(), "{}", text(&out));
    let n = nodes.get(NODE).await.expect("node");
    assert!(
        !n.metadata
            .labels
            .unwrap_or_default()
            .contains_key("keelson.dev/proxy"),
        "the label is gone: kube-proxy's DaemonSet returns"
    );
    assert_eq!(
        node.files(&["/var/lib/keelson/migrate/rolled-back-"]),
        before
    );
    assert_eq!(node.unit("kubelet.service"), (true, true));
}

/// A container that keelson started anew instead of adopting fails the
/// migration, which then names the pod and points at `--rollback`; the
/// rollback still restores kubelet.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_container_fails_the_apply_and_rollback_still_restores_kubelet() {
    let api = TestApiServer::start(TestApiOptions::default())
        .await
        .expect("api");
    let client = api.client().await;
    cluster(&client).await;
    let node = FakeNode::new(&api);
    let before = node.files(&[]);
    let child = node
        .migrate_command(&["--from-kubelet", "--apply", "--timeout", "60s"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    wait_for_call(&node, "start keelson.service").await;
    Api::<Pod>::namespaced(client.clone(), "default")
        .patch_status(
            "web",
            &PatchParams::default(),
            &Patch::Merge(&json!({"status": {"containerStatuses": [{
                "name": "app", "image": "busybox", "imageID": "busybox@sha256:1", "ready": true,
                "restartCount": 3, "containerID": "containerd://bbbb",
                "state": {"running": {"startedAt": "2026-12-01T11:00:00Z"}}
            }]}})),
        )
        .await
        .expect("pod status");
    next_second(jiff::Timestamp::now()).await;
    set_ready(&client, jiff::Timestamp::now()).await;
    let out = tokio::task::spawn_blocking(move || child.wait_with_output())
        .await
        .expect("join")
        .expect("wait");
    let report = text(&out);
    assert_eq!(out.status.code(), Some(1), "{report}");
    assert!(
        report.contains("default/web container app: was containerd://aaaa (restarts 2), now containerd://bbbb (restarts 3)"),
        "{report}"
    );
    assert!(
        report.contains("`keelson migrate --rollback` restores kubelet from the backup"),
        "{report}"
    );
    let out = node.migrate(&["--rollback"]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(node.unit("kubelet.service"), (true, true));
    assert_eq!(
        node.files(&["/var/lib/keelson/migrate/rolled-back-"]),
        before
    );
}
