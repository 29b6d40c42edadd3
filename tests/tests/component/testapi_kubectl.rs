//! The test API server driven by the real kubectl (`/usr/bin/kubectl`,
//! through the kubeconfig the server writes): apply (client- and
//! server-side), get -o json/yaml, describe, patch, delete, graceful pod
//! deletion and get -w. Also checks what kubectl asked for in the request
//! log: HTTP/2 over TLS, and no request the server could not serve.

use std::path::Path;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use keelson_tests::support::wait_for;
use keelson_tests::testapi::{TestApiOptions, TestApiServer};
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::{Value, json};
use tokio::io::AsyncReadExt;

struct Kubectl {
    api: TestApiServer,
    cache: tempfile::TempDir,
}

struct Out {
    ok: bool,
    stdout: String,
    stderr: String,
}

impl Kubectl {
    async fn new() -> Kubectl {
        Kubectl {
            api: TestApiServer::start(TestApiOptions::default())
                .await
                .expect("test API server starts"),
            cache: tempfile::tempdir().expect("cache dir"),
        }
    }

    fn command(&self, args: &[&str]) -> tokio::process::Command {
        let mut c = tokio::process::Command::new("kubectl");
        c.env("KUBECONFIG", self.api.kubeconfig_path())
            .arg("--cache-dir")
            .arg(self.cache.path())
            .arg("--request-timeout=10s")
            .args(args)
            .stdin(Stdio::null())
            .kill_on_drop(true);
        c
    }

    async fn run(&self, args: &[&str]) -> Out {
        let out = tokio::time::timeout(Duration::from_secs(30), self.command(args).output())
            .await
            .unwrap_or_else(|_| panic!("kubectl {args:?} timed out"))
            .expect("kubectl runs");
        Out {
            ok: out.status.success(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    async fn ok(&self, args: &[&str]) -> String {
        let o = self.run(args).await;
        assert!(o.ok, "kubectl {args:?} failed: {}{}", o.stdout, o.stderr);
        o.stdout
    }

    async fn json(&self, args: &[&str]) -> Value {
        let mut a = args.to_vec();
        a.extend(["-o", "json"]);
        serde_json::from_str(&self.ok(&a).await).expect("kubectl -o json prints JSON")
    }
}

fn write(dir: &Path, name: &str, text: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, text).expect("write manifest");
    p.display().to_string()
}

const MANIFEST: &str = r#"
apiVersion: v1
kind: Pod
metadata: {name: web, labels: {app: web}}
spec:
  containers:
  - name: c
    image: busybox:1.36
    ports: [{containerPort: 80}]
    livenessProbe: {tcpSocket: {port: 80}}
---
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  type: NodePort
  selector: {app: web}
  ports: [{port: 80, name: http}]
---
apiVersion: v1
kind: ConfigMap
metadata: {name: cfg}
data: {a: "1"}
---
apiVersion: v1
kind: Secret
metadata: {name: sec}
stringData: {password: hunter2}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
endpoints: [{addresses: ["10.1.0.1"], conditions: {ready: true}}]
ports: [{name: http, port: 80}]
---
apiVersion: coordination.k8s.io/v1
kind: Lease
metadata: {name: n1, namespace: kube-node-lease}
spec: {holderIdentity: n1, leaseDurationSeconds: 40}
---
apiVersion: v1
kind: Node
metadata: {name: n1}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: robot}
---
apiVersion: v1
kind: Endpoints
metadata: {name: web}
subsets: [{addresses: [{ip: 10.1.0.1}], ports: [{port: 80, name: http}]}]
"#;

#[tokio::test]
async fn apply_get_describe_patch_delete() {
    let k = Kubectl::new().await;
    let dir = tempfile::tempdir().expect("dir");
    let file = write(dir.path(), "m.yaml", MANIFEST);
    let out = k.ok(&["apply", "-f", &file]).await;
    for what in [
        "pod/web",
        "service/web",
        "configmap/cfg",
        "secret/sec",
        "endpointslice.discovery.k8s.io/web-1",
        "lease.coordination.k8s.io/n1",
        "node/n1",
        "serviceaccount/robot",
        "endpoints/web",
    ] {
        assert!(out.contains(&format!("{what} created")), "{what} in {out}");
    }
    // Defaults visible to kubectl.
    let pod = k.json(&["get", "pod", "web"]).await;
    assert_eq!(pod["spec"]["restartPolicy"], "Always");
    assert_eq!(
        pod["spec"]["containers"][0]["imagePullPolicy"],
        "IfNotPresent"
    );
    assert_eq!(
        pod["spec"]["containers"][0]["livenessProbe"]["periodSeconds"],
        10
    );
    assert_eq!(pod["status"]["phase"], "Pending");
    let sec = k.json(&["get", "secret", "sec"]).await;
    assert_eq!(sec["data"]["password"], "aHVudGVyMg==");
    assert_eq!(sec["type"], "Opaque");

    // Re-apply with changes: client-side apply patches (strategic merge).
    let changed = MANIFEST
        .replace("busybox:1.36", "busybox:1.37")
        .replace("{a: \"1\"}", "{a: \"2\"}");
    let file2 = write(dir.path(), "m2.yaml", &changed);
    let out = k.ok(&["apply", "-f", &file2]).await;
    assert!(
        out.contains("pod/web configured") && out.contains("configmap/cfg configured"),
        "{out}"
    );
    assert!(out.contains("service/web unchanged"), "{out}");
    let pod = k.json(&["get", "pod", "web"]).await;
    assert_eq!(pod["spec"]["containers"][0]["image"], "busybox:1.37");
    assert_eq!(
        pod["spec"]["containers"][0]["ports"][0]["containerPort"],
        80
    );
    assert_eq!(pod["metadata"]["generation"], 2);
    assert_eq!(k.json(&["get", "cm", "cfg"]).await["data"]["a"], "2");

    // Server-side apply.
    let ssa = write(
        dir.path(),
        "ssa.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: ssa}\ndata: {k: v}\n",
    );
    let out = k.ok(&["apply", "--server-side", "-f", &ssa]).await;
    assert!(out.contains("configmap/ssa serverside-applied"), "{out}");

    // Unknown fields are rejected (kubectl's default --validate=strict lets the server validate).
    let bad = write(
        dir.path(),
        "bad.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: bad}\nbogus: 1\n",
    );
    let o = k.run(&["apply", "-f", &bad]).await;
    assert!(
        !o.ok && o.stderr.contains("unknown field \"bogus\""),
        "{}",
        o.stderr
    );

    // get variants.
    let table = k.ok(&["get", "svc", "web"]).await;
    assert!(
        table.contains("NodePort") && table.contains("80:3"),
        "{table}"
    );
    let yaml = k.ok(&["get", "cm", "cfg", "-o", "yaml"]).await;
    assert!(
        yaml.contains("kind: ConfigMap") && yaml.contains("a: \"2\""),
        "{yaml}"
    );
    let names = k
        .ok(&[
            "get",
            "pods",
            "-l",
            "app=web",
            "--field-selector",
            "status.phase=Pending",
            "-o",
            "name",
        ])
        .await;
    assert_eq!(names.trim(), "pod/web");
    let o = k
        .run(&["get", "pods", "--field-selector", "spec.bogus=x"])
        .await;
    assert!(
        !o.ok && o.stderr.contains("field label not supported"),
        "{}",
        o.stderr
    );
    let d = k.ok(&["describe", "pod", "web"]).await;
    assert!(
        d.contains("Service Account:  default") && d.contains("busybox:1.37"),
        "{d}"
    );
    let d = k.ok(&["describe", "svc", "web"]).await;
    assert!(d.contains("NodePort:") && d.contains("Endpoints:"), "{d}");

    // patch: strategic (default), merge, json; status subresource.
    k.ok(&[
        "patch",
        "svc",
        "web",
        "-p",
        r#"{"metadata":{"labels":{"x":"1"}}}"#,
    ])
    .await;
    k.ok(&[
        "patch",
        "cm",
        "cfg",
        "--type=merge",
        "-p",
        r#"{"data":{"b":"3"}}"#,
    ])
    .await;
    k.ok(&[
        "patch",
        "cm",
        "cfg",
        "--type=json",
        "-p",
        r#"[{"op":"remove","path":"/data/a"}]"#,
    ])
    .await;
    assert_eq!(
        k.json(&["get", "cm", "cfg"]).await["data"],
        json!({"b": "3"})
    );
    k.ok(&[
        "patch",
        "pod",
        "web",
        "--subresource=status",
        "--type=merge",
        "-p",
        r#"{"status":{"phase":"Running"}}"#,
    ])
    .await;
    assert_eq!(
        k.json(&["get", "pod", "web"]).await["status"]["phase"],
        "Running"
    );
    assert_eq!(
        k.json(&["get", "svc", "web"]).await["metadata"]["labels"]["x"],
        "1"
    );

    // delete.
    let out = k.ok(&["delete", "cm", "cfg"]).await;
    assert!(out.contains("configmap \"cfg\" deleted"), "{out}");
    let o = k.run(&["get", "cm", "cfg"]).await;
    assert!(!o.ok && o.stderr.contains("NotFound"), "{}", o.stderr);
    k.ok(&["delete", "-f", &file2, "--wait=false", "--ignore-not-found"])
        .await;

    // What kubectl asked for: all over HTTP/2, nothing unserved except the
    // OpenAPI v2 document (not published; kubectl then computes apply
    // patches from its built-in types, as documented in tests/README.md).
    let log = k.api.knobs().requests();
    assert!(
        log.iter().all(|r| r.http_version == "HTTP/2.0"),
        "kubectl uses h2 over TLS"
    );
    let unexpected: Vec<String> = log
        .iter()
        .filter(|r| {
            r.status >= 500
                || r.status == 406
                || r.status == 415
                || (r.status == 404 && r.verb.is_empty() && r.path != "/openapi/v2")
        })
        .map(|r| {
            format!(
                "{} {} {}?{} -> {}",
                r.http_version, r.method, r.path, r.query, r.status
            )
        })
        .collect();
    assert!(
        unexpected.is_empty(),
        "requests the server could not serve: {unexpected:#?}"
    );
}

#[tokio::test]
async fn graceful_pod_delete_and_get_watch() {
    let k = Kubectl::new().await;
    let client = k.api.client().await;
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    let p: Pod = serde_json::from_value(json!({"metadata": {"name": "g"},
        "spec": {"nodeName": "n1", "terminationGracePeriodSeconds": 20, "containers": [{"name": "c", "image": "busybox"}]}}))
    .expect("pod");
    pods.create(&PostParams::default(), &p)
        .await
        .expect("create");
    k.ok(&["delete", "pod", "g", "--wait=false"]).await;
    let pod = k.json(&["get", "pod", "g"]).await;
    assert!(pod["metadata"]["deletionTimestamp"].is_string());
    assert_eq!(pod["metadata"]["deletionGracePeriodSeconds"], 20);
    assert!(k.ok(&["get", "pod", "g"]).await.contains("Terminating"));
    k.ok(&["delete", "pod", "g", "--grace-period=0", "--force"])
        .await;
    assert!(!k.run(&["get", "pod", "g"]).await.ok);

    // get -w prints the initial rows, then changes as they happen.
    let mut child = k
        .command(&["get", "configmaps", "-w", "--output-watch-events"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kubectl get -w");
    let mut stdout = child.stdout.take().expect("stdout");
    let seen = Arc::new(Mutex::new(String::new()));
    let sink = seen.clone();
    let reader = tokio::spawn(async move {
        let mut buf = [0u8; 4096];
        while let Ok(n) = stdout.read(&mut buf).await {
            if n == 0 {
                break;
            }
            sink.lock()
                .expect("lock")
                .push_str(&String::from_utf8_lossy(&buf[..n]));
        }
    });
    let shows = |needle: &'static str| {
        let seen = seen.clone();
        move || {
            let text = seen.lock().map(|s| s.clone()).unwrap_or_default();
            async move {
                if text.lines().any(|l| l.contains(needle)) {
                    Ok(())
                } else {
                    Err(text)
                }
            }
        }
    };
    wait_for(
        "initial rows",
        Duration::from_secs(15),
        Duration::from_millis(50),
        shows("kube-root-ca.crt"),
    )
    .await
    .expect("initial");
    let cms: Api<ConfigMap> = Api::default_namespaced(client);
    let c: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "watched"}})).expect("cm");
    cms.create(&PostParams::default(), &c)
        .await
        .expect("create");
    wait_for(
        "ADDED row",
        Duration::from_secs(15),
        Duration::from_millis(50),
        shows("ADDED"),
    )
    .await
    .expect("added");
    cms.delete("watched", &DeleteParams::default())
        .await
        .expect("delete");
    wait_for(
        "DELETED row",
        Duration::from_secs(15),
        Duration::from_millis(50),
        shows("DELETED"),
    )
    .await
    .expect("deleted");
    let text = seen.lock().map(|s| s.clone()).unwrap_or_default();
    assert!(
        text.lines()
            .any(|l| l.contains("ADDED") && l.contains("watched")),
        "{text}"
    );
    child.kill().await.expect("stop kubectl");
    reader.abort();
}
