//! `keelson diagnose` against real parts: the keelson binary in both roles
//! on a private containerd (real runc, CNI, nftables in the containerd's
//! namespace), the test API server. One node serves every scenario (they
//! do not interfere: each breaks its own pod or Service), then the node
//! itself is broken: the API server refuses connections (the Lease is not
//! renewed), then containerd is stopped.
//!
//! Each scenario checks that diagnose names the broken link and shows the
//! evidence; every request diagnose sends to the API server is a GET (it is
//! read-only), and the tampered nftables table is still tampered after it
//! ran. A second test does the same for the eBPF data plane (the socket
//! LB's maps read back, one deleted behind keelson's back) and UDP probes,
//! on the proxy lab with `keelson run --proxy-only`. With
//! `KEELSON_DIAGNOSE_DOCS=DIR` the text output of each scenario is written
//! to `DIR/<scenario>.txt` (docs/diagnose.md shows them).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::system_pods_support::{IMAGE, SysWorld, condition, container_status};
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use keelson::config::KubeDuration;
use keelson::diagnose::report::{Link, Mark, Report};
use keelson_netplane::fixtures::{EndpointSpec, SliceBuilder};
use keelson_netplane::model::{Protocol, ServicePortName};
use keelson_netplane::nftables::names::{PortChains, endpoint_names};
use keelson_tests::node_harness::keelson_bin;
use keelson_tests::support::{require_root, wait_for};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;

const T: Duration = Duration::from_secs(120);
const SERVICE_CIDR: &str = "10.96.0.0/12";

/// Runs `keelson diagnose` in the node's namespace.
struct Diagnose {
    netns: PathBuf,
    knobs: keelson_tests::testapi::Knobs,
    bin: PathBuf,
    config: PathBuf,
    docs: Option<PathBuf>,
    /// A cgroup v2 directory diagnose runs in (where the socket LB
    /// translates its sockets, as on a node whose root cgroup it serves).
    cgroup: Option<PathBuf>,
}

impl Diagnose {
    async fn raw(&self, args: &[&str]) -> (i32, String, String) {
        let mut cmd = match &self.cgroup {
            // The shell moves itself into the cgroup, then becomes nsenter.
            Some(cg) => {
                let mut c = std::process::Command::new("sh");
                c.arg("-c")
                    .arg("echo $$ > \"$0\" && exec \"$@\"")
                    .arg(cg.join("cgroup.procs"))
                    .arg("nsenter");
                c
            }
            None => std::process::Command::new("nsenter"),
        };
        cmd.arg(format!("--net={}", self.netns.display()))
            .arg("--")
            .arg(&self.bin)
            .arg("diagnose")
            .arg("--config")
            .arg(&self.config)
            .args(args)
            .stdin(std::process::Stdio::null());
        let started = SystemTime::now();
        let out = tokio::task::spawn_blocking(move || cmd.output())
            .await
            .unwrap()
            .expect("keelson diagnose runs");
        // Read-only: every request diagnose sent is a GET (get or list).
        let sent: Vec<_> = self
            .knobs
            .requests()
            .into_iter()
            .filter(|r| r.at >= started && r.user_agent.starts_with("keelson-diagnose/"))
            .collect();
        for r in &sent {
            assert!(
                r.method == "GET" && (r.verb == "get" || r.verb == "list" || r.verb.is_empty()),
                "diagnose sent a write: {} {} ({})",
                r.method,
                r.path,
                r.verb
            );
        }
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// The JSON report and the exit code; the text form goes to the docs
    /// directory when asked.
    async fn report(&self, scenario: &str, args: &[&str]) -> (i32, Report) {
        let mut json_args = args.to_vec();
        json_args.extend(["-o", "json"]);
        let (code, out, err) = self.raw(&json_args).await;
        let report: Report = serde_json::from_str(&out).unwrap_or_else(|e| {
            panic!("{scenario}: diagnose output is not a report ({e}): exit {code}\n{out}\n{err}")
        });
        if let Some(dir) = &self.docs {
            let (_, text, _) = self.raw(args).await;
            std::fs::create_dir_all(dir).unwrap();
            std::fs::write(
                dir.join(format!("{scenario}.txt")),
                format!("$ keelson diagnose {}\n{text}", args.join(" ")),
            )
            .unwrap();
            std::fs::write(dir.join(format!("{scenario}.json")), &out).unwrap();
        }
        (code, report)
    }

    /// The report once diagnose names `id` as the first failure with every
    /// one of `needles` in that link, or the last one after 30 s. A pod
    /// between two states (a crash-looping container runs, then is
    /// terminated, for a moment between its back-offs) is reported as it is
    /// at that instant; asking again shows the steady state.
    async fn report_broken_at(
        &self,
        scenario: &str,
        args: &[&str],
        id: &str,
        needles: &[&str],
    ) -> (i32, Report) {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            let (code, r) = self.report(scenario, args).await;
            let settled = r.first_failure.as_deref() == Some(id)
                && r.link(id).is_some_and(|l| {
                    let text = text_of(l);
                    needles.iter().all(|n| text.contains(n))
                });
            if settled || std::time::Instant::now() > deadline {
                return (code, r);
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}

/// Waits until the crasher has crashed at least `restarts + 1` times and
/// sits in a restart back-off. As kubelet, keelson writes `terminated`
/// through a back-off and `waiting: CrashLoopBackOff` only at the sync that
/// ends it, a moment before the restart: either shows the loop.
async fn wait_crash_loop_back_off(w: &SysWorld, what: &str, restarts: i32) {
    w.wait_pod("crasher", what, T, |p| {
        let Some(s) = container_status(p, "app") else {
            return Err("no status".to_string());
        };
        let state = s.state.clone().unwrap_or_default();
        let backing_off = state
            .waiting
            .as_ref()
            .is_some_and(|w| w.reason.as_deref() == Some("CrashLoopBackOff"))
            || state.terminated.as_ref().is_some_and(|t| t.exit_code == 3);
        if backing_off && s.restart_count >= restarts {
            Ok(())
        } else {
            Err(format!("restartCount {}, state {state:?}", s.restart_count))
        }
    })
    .await;
}

fn link<'a>(r: &'a Report, id: &str) -> &'a Link {
    r.link(id).unwrap_or_else(|| {
        panic!(
            "no link {id} in {}",
            serde_json::to_string_pretty(r).unwrap()
        )
    })
}

/// Every text of a link: summary, evidence, parts, next.
fn text_of(l: &Link) -> String {
    let mut s = format!(
        "{}\n{}\n{}\n",
        l.summary,
        l.evidence.join("\n"),
        l.next.as_deref().unwrap_or_default()
    );
    for p in &l.parts {
        s.push_str(&format!(
            "{}: {}\n{}\n",
            p.name,
            p.summary,
            p.evidence.join("\n")
        ));
    }
    s
}

fn assert_broken_at(scenario: &str, code: i32, r: &Report, id: &str, needles: &[&str]) {
    let dump = serde_json::to_string_pretty(r).unwrap();
    assert_eq!(code, 1, "{scenario}: exit code\n{dump}");
    assert_eq!(r.status, Mark::Failed, "{scenario}\n{dump}");
    assert_eq!(r.first_failure.as_deref(), Some(id), "{scenario}\n{dump}");
    let text = text_of(link(r, id));
    for n in needles {
        assert!(
            text.contains(n),
            "{scenario}: {n:?} not in link {id}:\n{text}\n{dump}"
        );
    }
}

fn pod_ip(p: &k8s_openapi::api::core::v1::Pod) -> Option<IpAddr> {
    p.status.as_ref()?.pod_ip.as_ref()?.parse().ok()
}

async fn create_service(w: &SysWorld, name: &str, selector: &str) -> Service {
    let svc: Service = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"selector": {"app": selector},
                 "ports": [{"name": "http", "port": 80, "targetPort": 80, "protocol": "TCP"}]}
    }))
    .unwrap();
    Api::<Service>::namespaced(w.admin.clone(), "default")
        .create(&PostParams::default(), &svc)
        .await
        .unwrap()
}

/// A Service with ClientIP session affinity: unlike a plain ClusterIP
/// port (an element of `service-ips` sending it to a chain shared by
/// Services with as many endpoints), its port gets chains of its own, one
/// for the Service and one per endpoint, as kube-proxy writes them.
async fn create_sticky_service(w: &SysWorld, name: &str, selector: &str) -> Service {
    let svc: Service = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"selector": {"app": selector}, "sessionAffinity": "ClientIP",
                 "ports": [{"name": "http", "port": 80, "targetPort": 80, "protocol": "TCP"}]}
    }))
    .unwrap();
    Api::<Service>::namespaced(w.admin.clone(), "default")
        .create(&PostParams::default(), &svc)
        .await
        .unwrap()
}

async fn create_slice(w: &SysWorld, service: &str, pod: &str, ip: IpAddr, ready: bool) {
    let ep = if ready {
        EndpointSpec::ready(&ip.to_string())
    } else {
        EndpointSpec::not_ready(&ip.to_string())
    };
    let mut slice = SliceBuilder::new("default", service, &format!("{service}-1"), "IPv4")
        .port("http", Protocol::Tcp, 80)
        .endpoint(ep.node(&w.node_name))
        .build();
    // The EndpointSlice controller points each endpoint at its pod.
    if let Some(e) = slice.endpoints.iter_mut().flatten().next() {
        e.target_ref = Some(k8s_openapi::api::core::v1::ObjectReference {
            kind: Some("Pod".into()),
            namespace: Some("default".into()),
            name: Some(pod.into()),
            ..Default::default()
        });
    }
    Api::<EndpointSlice>::namespaced(w.admin.clone(), "default")
        .create(&PostParams::default(), &slice)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn diagnose_names_each_broken_link_with_its_evidence() {
    if !require_root("diagnose_names_each_broken_link_with_its_evidence") {
        return;
    }
    let mut w = SysWorld::start_with(Some(Arc::new(|c: &mut keelson::config::Config| {
        c.proxy.enabled = true;
        c.proxy.client_connection.kubeconfig = c.node.kubeconfig.clone();
        c.proxy.cluster_cidr = "10.244.0.0/16".into();
        c.proxy.min_sync_period = KubeDuration::from_secs(0);
        // No periodic verification within the test: the tampered table
        // stays tampered until diagnose has looked at it.
        c.proxy.sync_period = KubeDuration::from_secs(3600);
        c.proxy.healthz_bind_address = "127.0.0.1:10256".into();
    })))
    .await;
    let node = w.node.as_ref().unwrap();
    let d = Diagnose {
        netns: w.ctrd.netns().path().to_path_buf(),
        knobs: w.api.knobs().clone(),
        bin: keelson_bin().unwrap(),
        config: node.dir().join("config.yaml"),
        docs: std::env::var_os("KEELSON_DIAGNOSE_DOCS").map(PathBuf::from),
        cgroup: None,
    };
    let nodes: Api<Node> = Api::all(w.admin.clone());
    wait_for(
        "the Node to be Ready",
        T,
        Duration::from_millis(200),
        || async {
            let n = nodes
                .get_opt(&w.node_name)
                .await
                .map_err(|e| e.to_string())?;
            let ready = n
                .as_ref()
                .and_then(|n| n.status.as_ref()?.conditions.as_ref())
                .and_then(|c| c.iter().find(|c| c.type_ == "Ready").cloned());
            match ready {
                Some(c) if c.status == "True" => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await
    .unwrap();

    // Every broken pod at once, plus a healthy one.
    let httpd = json!({"name": "httpd", "image": IMAGE,
        "command": ["httpd", "-f", "-p", "80", "-h", "/www"],
        "ports": [{"containerPort": 80}],
        "readinessProbe": {"httpGet": {"path": "/", "port": 80}, "periodSeconds": 1}});
    w.create_pod("web", json!({"containers": [httpd.clone()]}))
        .await;
    // A merge patch, not get-and-replace: the agent writes the pod's status
    // meanwhile, and a replace of the read copy would meet a 409 Conflict.
    w.pods()
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"app": "hello"}}})),
        )
        .await
        .unwrap();
    w.create_pod(
        "no-image",
        json!({"containers": [{"name": "app", "image": "keelson.local/missing:1"}]}),
    )
    .await;
    w.create_pod(
        "no-config",
        json!({"containers": [{"name": "app", "image": IMAGE, "command": ["sleep", "3600"],
                               "volumeMounts": [{"name": "config", "mountPath": "/etc/app"}]}],
               "volumes": [{"name": "config", "configMap": {"name": "app-config"}}]}),
    )
    .await;
    w.create_pod(
        "crasher",
        json!({"containers": [{"name": "app", "image": IMAGE,
            "command": ["sh", "-c", "echo starting; echo 'fatal: /etc/app/config.yaml not found' >&2; exit 3"]}]}),
    )
    .await;
    w.create_pod(
        "oom",
        // OnFailure: containerd 1.6 names an OOM kill `OOMKilled` only when
        // its OOM event beats the exit event; a restarted instance gives it
        // another chance, where a terminal pod's status is never re-read.
        json!({"restartPolicy": "OnFailure",
               "containers": [{"name": "app", "image": IMAGE, "command": ["tail", "/dev/zero"],
                               "resources": {"limits": {"memory": "16Mi"}}}]}),
    )
    .await;
    let mut unready = httpd.clone();
    unready["readinessProbe"]["httpGet"]["path"] = json!("/healthz");
    w.create_pod("unready", json!({"containers": [unready]}))
        .await;

    // Services: one healthy, one whose selector matches nothing, one whose
    // only endpoint is not ready, one with chains of its own (ClientIP
    // affinity) for the tampered-chain scenario.
    let hello = create_service(&w, "hello", "hello").await;
    create_sticky_service(&w, "sticky", "hello").await;
    create_service(&w, "nomatch", "nothing").await;
    create_service(&w, "unready", "unready").await;
    let web = w
        .wait_pod("web", "web Running and Ready", T, |p| {
            let ready = condition(p, "Ready").map(|c| c.status.as_str()) == Some("True");
            match pod_ip(p) {
                Some(ip) if ready => Ok(ip),
                _ => Err(format!("{:?}", p.status)),
            }
        })
        .await;
    create_slice(&w, "hello", "web", web, true).await;
    create_slice(&w, "sticky", "web", web, true).await;
    // The node has no uplink: Service traffic goes to the pod bridge (made
    // by CNI with the first pod).
    w.ctrd
        .netns()
        .ip(&["route", "replace", SERVICE_CIDR, "dev", "kbr0"])
        .unwrap();
    let unready_ip = w
        .wait_pod("unready", "unready Running", T, |p| {
            pod_ip(p).ok_or("no IP".into())
        })
        .await;
    create_slice(&w, "unready", "unready", unready_ip, false).await;

    // --- The healthy chains.
    let (code, r) = d.report("pod-healthy", &["pod", "default/web"]).await;
    assert_eq!(code, 0, "{}", serde_json::to_string_pretty(&r).unwrap());
    assert!(r.daemon.running, "{:?}", r.daemon);
    for id in [
        "bound",
        "admitted",
        "volumes",
        "sandbox",
        "images",
        "containers",
        "probes",
    ] {
        assert_eq!(link(&r, id).status, Mark::Ok, "{id}: {:?}", link(&r, id));
    }
    assert!(text_of(link(&r, "sandbox")).contains(&format!("pod IP {web}")));
    let hello_ok = wait_for(
        "hello programmed",
        T,
        Duration::from_millis(500),
        || async {
            let (code, r) = d
                .report("service-healthy", &["service", "default/hello", "--probe"])
                .await;
            if code == 0 && link(&r, "probe").status == Mark::Ok {
                Ok(r)
            } else {
                Err(serde_json::to_string(&r).unwrap())
            }
        },
    )
    .await
    .unwrap();
    assert_eq!(link(&hello_ok, "dataPlane").status, Mark::Ok);
    assert!(text_of(link(&hello_ok, "selection")).contains(&format!("{web}:80")));
    assert!(
        text_of(link(&hello_ok, "selection"))
            .contains("the running proxy programmed the same endpoints"),
        "{:?}",
        link(&hello_ok, "selection")
    );
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(w.admin.clone(), "kube-node-lease");
    wait_for(
        "the node's Lease",
        T,
        Duration::from_millis(200),
        || async {
            match leases.get_opt(&w.node_name).await {
                Ok(Some(_)) => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await
    .unwrap();
    let (code, r) = d.report("node-healthy", &["node"]).await;
    assert_eq!(code, 0, "{}", serde_json::to_string_pretty(&r).unwrap());
    for id in ["runtime", "cni", "api", "lease", "nodeReady"] {
        assert_eq!(link(&r, id).status, Mark::Ok, "{id}: {:?}", link(&r, id));
    }

    // --- A missing image.
    w.wait_pod(
        "no-image",
        "no-image ErrImagePull/ImagePullBackOff",
        T,
        |p| {
            let reason = container_status(p, "app")
                .and_then(|s| s.state.as_ref()?.waiting.as_ref()?.reason.clone())
                .unwrap_or_default();
            if reason == "ErrImagePull" || reason == "ImagePullBackOff" {
                Ok(())
            } else {
                Err(reason)
            }
        },
    )
    .await;
    let (code, r) = d
        .report("missing-image", &["pod", "default/no-image"])
        .await;
    assert_broken_at(
        "missing image",
        code,
        &r,
        "images",
        &[
            "keelson.local/missing:1",
            "Failed to pull image",
            "credentials: none",
        ],
    );
    assert_eq!(link(&r, "containers").status, Mark::NotReached);

    // --- A missing ConfigMap.
    let (code, r) = d
        .report("missing-configmap", &["pod", "default/no-config"])
        .await;
    assert_broken_at(
        "missing ConfigMap",
        code,
        &r,
        "volumes",
        &[
            "configmap \"app-config\" not found",
            "config (configmap \"app-config\")",
        ],
    );

    // --- A crash loop.
    wait_crash_loop_back_off(&w, "crasher CrashLoopBackOff", 1).await;
    let needles = [
        "CrashLoopBackOff",
        "Exit Code: 3",
        "| fatal: /etc/app/config.yaml not found",
        "| starting",
        "next start",
        "back-off",
    ];
    let (code, r) = d
        .report_broken_at(
            "crash-loop",
            &["pod", "default/crasher", "--since", "10m"],
            "containers",
            &needles,
        )
        .await;
    assert_broken_at("crash loop", code, &r, "containers", &needles);
    let next = link(&r, "containers").next.clone().unwrap_or_default();
    // `--previous` once the API shows the waiting container; while it
    // shows the crashed instance as terminated, that instance is read as is.
    let waiting = link(&r, "containers")
        .summary
        .contains("Waiting: CrashLoopBackOff");
    assert_eq!(
        next,
        format!(
            "kubectl logs -n default crasher -c app{}",
            if waiting { " --previous" } else { "" }
        ),
        "{}",
        text_of(link(&r, "containers"))
    );
    let timeline = r.timeline.clone().expect("timeline with --since");
    assert!(
        timeline.iter().any(|t| t.reason == "BackOff"
            && t.source == keelson::introspection::types::RecordSource::Event),
        "{timeline:?}"
    );
    assert!(
        timeline.iter().any(
            |t| t.source == keelson::introspection::types::RecordSource::ApiWrite
                && t.message.contains("pods/status")
        ),
        "{timeline:?}"
    );

    // --- An OOM kill.
    w.wait_pod("oom", "oom OOMKilled", T, |p| {
        let oom = |s: Option<&k8s_openapi::api::core::v1::ContainerState>| {
            s.and_then(|s| s.terminated.as_ref())
                .is_some_and(|t| t.reason.as_deref() == Some("OOMKilled"))
        };
        match container_status(p, "app") {
            Some(s) if oom(s.state.as_ref()) || oom(s.last_state.as_ref()) => Ok(()),
            _ => Err(format!("{:?}", p.status)),
        }
    })
    .await;
    let needles = ["OOMKilled", "Exit Code: 137", "memory limit (16Mi)"];
    let (code, r) = d
        .report_broken_at("oom-kill", &["pod", "default/oom"], "containers", &needles)
        .await;
    assert_broken_at("OOM kill", code, &r, "containers", &needles);

    // --- A failing readiness probe.
    w.wait_pod(
        "unready",
        "an Unhealthy event for unready",
        T,
        |p| match container_status(p, "httpd") {
            Some(s) if s.state.as_ref().is_some_and(|s| s.running.is_some()) && !s.ready => Ok(()),
            other => Err(format!("{other:?}")),
        },
    )
    .await;
    let r = wait_for(
        "diagnose to show the readiness failure",
        T,
        Duration::from_secs(1),
        || async {
            let (code, r) = d
                .report("failing-readiness", &["pod", "default/unready"])
                .await;
            if code == 1 && text_of(link(&r, "probes")).contains("Readiness probe failed") {
                Ok((code, r))
            } else {
                Err(serde_json::to_string(&r).unwrap())
            }
        },
    )
    .await
    .unwrap();
    assert_broken_at(
        "failing readiness probe",
        r.0,
        &r.1,
        "probes",
        &[
            "httpd readiness",
            "Failure",
            "http-get http://:80/healthz",
            "HTTP probe failed with statuscode: 404",
        ],
    );

    // --- A Service whose selector matches nothing.
    let (code, r) = d
        .report("selector-matches-nothing", &["service", "default/nomatch"])
        .await;
    assert_broken_at(
        "selector matching nothing",
        code,
        &r,
        "endpoints",
        &["app=nothing", "no pod in namespace default matches"],
    );

    // --- A Service whose endpoints are not ready.
    let (code, r) = d
        .report("endpoints-not-ready", &["service", "default/unready:http"])
        .await;
    assert_broken_at(
        "endpoints not ready",
        code,
        &r,
        "endpoints",
        &[
            "0 of 1 endpoints ready",
            &format!("{unready_ip}:80"),
            "not ready",
            "keelson diagnose pod default/unready",
        ],
    );

    // --- A tampered data plane: someone deleted hello's ClusterIP element
    // from the service-ips map (plain ClusterIP Services have no chain of
    // their own: the element sends them to the chain shared by Services
    // with as many endpoints).
    let cluster_ip = hello.spec.unwrap().cluster_ip.unwrap();
    let element = format!("{cluster_ip} . tcp . 80");
    let list_map = |w: &SysWorld| {
        w.ctrd
            .netns()
            .exec("nft", &["list", "map", "ip", "keelson", "service-ips"])
            .unwrap()
    };
    let before = list_map(&w);
    assert!(
        before.contains(&element),
        "no service-ips element for hello in:\n{before}"
    );
    w.ctrd
        .netns()
        .exec(
            "nft",
            &[
                "delete",
                "element",
                "ip",
                "keelson",
                "service-ips",
                &format!("{{ {element} }}"),
            ],
        )
        .unwrap();
    let tampered = list_map(&w);
    assert!(
        !tampered.contains(&element),
        "the element was not deleted:\n{tampered}"
    );
    let (code, r) = d
        .report("tampered-table", &["service", "default/hello"])
        .await;
    assert_broken_at(
        "tampered table",
        code,
        &r,
        "dataPlane",
        &[&format!("element {element} in service-ips missing")],
    );
    // Diagnose changed nothing: the element is still gone.
    let after = list_map(&w);
    assert!(
        !after.contains(&element),
        "diagnose must not repair the table:\n{after}"
    );

    // --- A tampered data plane: a deleted chain. sticky's port (ClientIP
    // affinity) has a chain of its own, `service-...`, whose rules go to
    // one chain per endpoint, `endpoint-...` (update the affinity set,
    // DNAT). Someone flushed the Service chain and deleted the endpoint
    // chain: the kernel refuses to delete a chain something still jumps
    // to, so the `endpoint-chains` element that picks it went first.
    let sticky_port = ServicePortName::new("default", "sticky", "http", Protocol::Tcp);
    let service_chain = PortChains::new(&sticky_port).service;
    let (endpoint_chain, _) = endpoint_names(&sticky_port, std::net::SocketAddr::new(web, 80));
    let list_chains = |w: &SysWorld| {
        w.ctrd
            .netns()
            .exec("nft", &["list", "chains", "ip"])
            .unwrap()
    };
    // Programmed, and healthy, before the tamper.
    let sticky_ok = wait_for(
        "sticky programmed",
        T,
        Duration::from_millis(500),
        || async {
            let (code, r) = d
                .report("sticky-healthy", &["service", "default/sticky"])
                .await;
            if code == 0 && link(&r, "dataPlane").status == Mark::Ok {
                Ok(r)
            } else {
                Err(serde_json::to_string(&r).unwrap())
            }
        },
    )
    .await
    .unwrap();
    assert!(
        text_of(link(&sticky_ok, "dataPlane"))
            .contains("object(s) in the kernel, as the model renders them"),
        "{:?}",
        link(&sticky_ok, "dataPlane")
    );
    let before = list_chains(&w);
    for c in [&service_chain, &endpoint_chain] {
        assert!(before.contains(c.as_str()), "no chain {c} in:\n{before}");
    }
    let slots = w
        .ctrd
        .netns()
        .exec("nft", &["list", "map", "ip", "keelson", "endpoint-chains"])
        .unwrap();
    // `elements = { 0x00000000 : goto "endpoint-...", ... }`
    let slot = slots
        .split(['{', ',', '}'])
        .find(|e| e.contains(endpoint_chain.as_str()))
        .and_then(|e| e.split(':').next())
        .map(|k| k.trim().to_string())
        .unwrap_or_else(|| panic!("no endpoint-chains element for {endpoint_chain} in:\n{slots}"));
    let nft = |cmd: String| w.ctrd.netns().exec("nft", &[cmd.as_str()]).unwrap();
    nft(format!("flush chain ip keelson {service_chain}"));
    nft(format!(
        "delete element ip keelson endpoint-chains {{ {slot} }}"
    ));
    nft(format!("flush chain ip keelson {endpoint_chain}"));
    nft(format!("delete chain ip keelson {endpoint_chain}"));
    let tampered = list_chains(&w);
    assert!(
        !tampered.contains(endpoint_chain.as_str()),
        "the chain was not deleted:\n{tampered}"
    );
    let (code, r) = d
        .report("tampered-chain", &["service", "default/sticky"])
        .await;
    assert_broken_at(
        "tampered chain",
        code,
        &r,
        "dataPlane",
        &[
            &format!(
                "chain {endpoint_chain} missing from table ip keelson (the model wants 2 rules)"
            ),
            &format!("chain {service_chain} in table ip keelson: 0 rules, the model wants 2 rules"),
        ],
    );
    // Diagnose changed nothing: the chain is still gone.
    let after = list_chains(&w);
    assert!(
        !after.contains(endpoint_chain.as_str()),
        "diagnose must not repair the table:\n{after}"
    );

    // --- The API server unreachable: the Lease is not renewed.
    w.api.knobs().refuse_connections();
    let r = wait_for(
        "lease renewals to fail",
        T,
        Duration::from_secs(2),
        || async {
            let (code, r) = d.report("api-unreachable", &["node"]).await;
            if code == 1 && link(&r, "lease").status == Mark::Failed {
                Ok(r)
            } else {
                Err(serde_json::to_string(&r).unwrap())
            }
        },
    )
    .await;
    w.api.knobs().resume();
    let r = r.unwrap();
    let api = text_of(link(&r, "api"));
    assert_eq!(link(&r, "api").status, Mark::Failed, "{api}");
    assert!(api.contains("unreachable"), "{api}");
    assert!(api.contains("NodeStatusUnknown"), "{api}");
    let lease = text_of(link(&r, "lease"));
    assert!(
        lease.contains("renewals fail") || lease.contains("not renewed"),
        "{lease}"
    );
    assert!(lease.contains("failed in a row"), "{lease}");

    // --- containerd stopped.
    w.ctrd.stop();
    let (code, r) = d.report("containerd-stopped", &["node"]).await;
    let restarted = w.ctrd.restart().await;
    assert_eq!(code, 1, "{}", serde_json::to_string_pretty(&r).unwrap());
    let runtime = link(&r, "runtime");
    assert_eq!(runtime.status, Mark::Failed, "{runtime:?}");
    assert!(runtime.summary.contains("does not answer"), "{runtime:?}");
    assert_eq!(link(&r, "cni").status, Mark::NotReached);
    restarted.unwrap();

    // --- Bad input: an unknown pod or Service is a one-line error.
    for (args, message) in [
        (
            ["pod", "default/nope"],
            "error: pod default/nope not found\n",
        ),
        (
            ["service", "default/nope"],
            "error: service default/nope not found\n",
        ),
    ] {
        let (code, out, err) = d.raw(&args).await;
        assert_eq!((code, out.as_str(), err.as_str()), (2, "", message));
    }
    let (code, _, err) = d.raw(&["service", "default/hello:9999"]).await;
    assert_eq!(code, 2);
    assert_eq!(
        err,
        "error: service default/hello has no port 9999 (ports: http 80/TCP)\n"
    );

    // --- keelson stopped: CRI, the kernel and the API are read directly.
    // Stopped while the crasher waits in its back-off (not in the few
    // milliseconds it runs), so the status keelson last wrote says so.
    // Killed, not dropped: its config and kubeconfig stay for diagnose.
    // Two restarts or more: the back-off in force lasts 20 s at least.
    wait_crash_loop_back_off(&w, "crasher back in CrashLoopBackOff", 2).await;
    let stopped = w.node.as_mut().unwrap().stop(Duration::ZERO);
    let (code, r) = d.report("daemon-down", &["pod", "default/crasher"]).await;
    assert!(!r.daemon.running, "{stopped}\n{:?}", r.daemon);
    assert!(
        r.daemon
            .error
            .as_deref()
            .unwrap_or_default()
            .contains("diagnose.sock"),
        "{:?}",
        r.daemon
    );
    assert_broken_at(
        "daemon down",
        code,
        &r,
        "containers",
        &[
            "Exit Code: 3",
            "| fatal: /etc/app/config.yaml not found",
            "the status the API server has is the last one keelson wrote",
        ],
    );
    let (code, r) = d
        .report("daemon-down-service", &["service", "default/hello"])
        .await;
    assert!(!r.daemon.running);
    // The table keelson left behind is still compared with the model.
    assert_broken_at(
        "daemon down, tampered table",
        code,
        &r,
        "dataPlane",
        &[
            "missing from table ip keelson",
            "no running keelson proxy keeps this table",
        ],
    );
}

/// A daemon given its kubeconfig on the command line, as a kubeadm node's
/// unit does (no file says where it is): `keelson diagnose` with neither
/// `--config` nor `--kubeconfig` takes the daemon's configuration and
/// credentials from its socket and reads the API with them (it said "no
/// API client" before). The child's environment has no `$KUBECONFIG`,
/// `~/.kube/config` or pod to fall back on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn diagnose_takes_the_daemons_configuration_from_its_socket() {
    if !require_root("diagnose_takes_the_daemons_configuration_from_its_socket") {
        return;
    }
    let ctrd = keelson_tests::containerd::Containerd::start()
        .await
        .expect("containerd");
    let api = keelson_tests::testapi::TestApiServer::start(
        keelson_tests::testapi::TestApiOptions::default(),
    )
    .await
    .expect("test API server");
    let mut node = keelson_tests::node_harness::BinaryNode::start(
        &ctrd,
        &api,
        keelson_tests::node_harness::BinaryNodeOptions {
            kubeconfig_flag: true,
            ..Default::default()
        },
    )
    .expect("keelson started");
    node.wait_healthy(&ctrd, T).await.expect("keelson healthy");
    let config = std::fs::read_to_string(node.dir().join("config.yaml")).unwrap();
    let file = keelson::config::Config::from_yaml_str(&config).unwrap();
    assert_eq!(file.node.kubeconfig, None, "{config}");
    let socket = node.config.effective_diagnose_socket().expect("a socket");
    let home = tempfile::tempdir().unwrap();
    let netns = ctrd.netns().path();
    let bin = keelson_bin().unwrap();
    let diagnose = || {
        let mut cmd = std::process::Command::new("nsenter");
        cmd.arg(format!("--net={}", netns.display()))
            .arg("--")
            .arg(&bin)
            .arg("diagnose")
            .arg("--socket")
            .arg(&socket)
            .args(["node", "-o", "json"])
            .env_remove("KUBECONFIG")
            .env_remove("KUBERNETES_SERVICE_HOST")
            .env("HOME", home.path())
            .stdin(std::process::Stdio::null());
        async move {
            let out = tokio::task::spawn_blocking(move || cmd.output())
                .await
                .unwrap()
                .expect("keelson diagnose runs");
            let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
            serde_json::from_str::<Report>(&stdout).map_err(|e| {
                format!(
                    "not a report ({e}): {stdout}\n{}",
                    String::from_utf8_lossy(&out.stderr)
                )
            })
        }
    };
    // The Lease exists once the node registered and renewed it.
    let report = wait_for(
        "diagnose to read the node's Lease",
        T,
        Duration::from_millis(500),
        || async {
            let r = diagnose().await?;
            match r.link("lease") {
                Some(l) if l.status == Mark::Ok => Ok(r),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", node.log_tail(30)));
    assert!(report.daemon.running, "{:?}", report.daemon);
    let api_link = link(&report, "api");
    assert_eq!(api_link.status, Mark::Ok, "{}", text_of(api_link));
    assert!(
        text_of(api_link).contains("answers"),
        "{}",
        text_of(api_link)
    );
    // The kubeconfig itself is read: the harness's has a bearer token.
    let cert = link(&report, "certificate");
    assert!(
        text_of(cert).contains("a bearer token"),
        "{}",
        text_of(cert)
    );
}

/// Kills the keelson process (by PID) when the test ends, also on failure.
struct Process(std::process::Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `bpftool map ... key hex` words of a `kl_services` key (the layout of
/// `ebpf/src/sock_lb.h`: address in 16 bytes, port in network order,
/// protocol, family).
fn svc_key_hex(vip: std::net::Ipv4Addr, port: u16, proto: u8) -> Vec<String> {
    let mut key = [0u8; 20];
    key[..4].copy_from_slice(&vip.octets());
    key[16..18].copy_from_slice(&port.to_be_bytes());
    key[18] = proto;
    key[19] = 2;
    key.iter().map(|b| format!("{b:02x}")).collect()
}

/// The eBPF data plane (`proxy.mode: ebpf`): the real `keelson run
/// --proxy-only` in the proxy lab's node namespace, socket LB attached to a
/// cgroup the test creates (diagnose runs in it, as every process of a node
/// does in the default root cgroup), pins on a private bpffs. Diagnose reads
/// the maps back: healthy, then with an entry deleted behind keelson's back.
/// `--probe` sends UDP datagrams to a Service whose endpoints answer (the
/// lab's pods) and to one whose endpoint reads nothing (no reply: a warning,
/// not a failure).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn diagnose_reads_the_socket_lb_maps_back_and_probes_udp() {
    use keelson_netplane::fixtures::ServiceBuilder;
    use keelson_tests::ebpf_env::{TestBpffs, TestCgroup};
    use keelson_tests::proxy_cases::{
        CLUSTER_CIDR, Lab, NODE_IP, NODE_NAME, OTHER_NODE, TCP_PORT, UDP_PORT, pod_ip,
    };
    use keelson_tests::testapi::{TestApiOptions, TestApiServer};

    if !require_root("diagnose_reads_the_socket_lb_maps_back_and_probes_udp") {
        return;
    }
    let cgroup = TestCgroup::new("diag-ebpf");
    let bpffs = TestBpffs::new(&cgroup.path);
    let lab = Lab::new(2).await.expect("lab");
    // Pod 0 also has a UDP socket that reads nothing.
    let quiet_port = 5454;
    let _quiet = lab.pods[0]
        .ns
        .udp_socket(format!("0.0.0.0:{quiet_port}").parse().unwrap())
        .expect("quiet socket");
    let api = TestApiServer::start(TestApiOptions {
        service_cidr: "10.96.0.0/16".into(),
        ..TestApiOptions::default()
    })
    .await
    .expect("test API server");
    let listener = lab
        .node
        .tcp_listener("127.0.0.1:6443".parse().unwrap())
        .expect("listener in node netns");
    api.serve_listener(listener);
    let dir = tempfile::tempdir().expect("tempdir");
    let kubeconfig = dir.path().join("kubeconfig");
    api.write_kubeconfig_with_server(&kubeconfig, "http://127.0.0.1:6443", None)
        .expect("kubeconfig");
    let config = dir.path().join("keelson.yaml");
    std::fs::write(
        &config,
        format!(
            "apiVersion: keelson.dev/v1alpha1\nkind: KeelsonConfiguration\nnodeName: {NODE_NAME}\n\
             healthzBindAddress: 127.0.0.1:10248\nmetricsBindAddress: 127.0.0.1:10249\n\
             diagnoseSocket: {}\n\
             proxy:\n  mode: ebpf\n  clusterCIDR: {CLUSTER_CIDR}\n  minSyncPeriod: 0s\n\
             \x20 syncPeriod: 1h\n  healthzBindAddress: 0.0.0.0:10256\n\
             \x20 clientConnection:\n    kubeconfig: {}\n\
             \x20 ebpf:\n    cgroupPath: {}\n    bpffsPath: {}\n",
            dir.path().join("diagnose.sock").display(),
            kubeconfig.display(),
            cgroup.path.display(),
            bpffs.config.bpffs_path.display(),
        ),
    )
    .expect("config");

    let client = api.client().await;
    let nodes: Api<Node> = Api::all(client.clone());
    let node = nodes
        .create(
            &PostParams::default(),
            &Node {
                metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                    name: Some(NODE_NAME.into()),
                    ..Default::default()
                },
                ..Default::default()
            },
        )
        .await
        .expect("node");
    let mut with_status = node.clone();
    with_status.status = Some(k8s_openapi::api::core::v1::NodeStatus {
        addresses: Some(vec![k8s_openapi::api::core::v1::NodeAddress {
            type_: "InternalIP".into(),
            address: NODE_IP.into(),
        }]),
        ..Default::default()
    });
    nodes
        .replace_status(NODE_NAME, &PostParams::default(), &with_status)
        .await
        .expect("node status");
    let vip = std::net::Ipv4Addr::new(10, 96, 0, 53);
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), "default");
    services
        .create(
            &PostParams::default(),
            &ServiceBuilder::new("default", "echo")
                .cluster_ip(&vip.to_string())
                .port("http", Protocol::Tcp, 80)
                .port("dns", Protocol::Udp, 53)
                .port("quiet", Protocol::Udp, 54)
                .build(),
        )
        .await
        .expect("service");
    let mut answering = SliceBuilder::new("default", "echo", "echo-1", "IPv4")
        .port("http", Protocol::Tcp, TCP_PORT)
        .port("dns", Protocol::Udp, UDP_PORT);
    for i in 0..2 {
        answering =
            answering.endpoint(EndpointSpec::ready(&pod_ip(i).to_string()).node(OTHER_NODE));
    }
    let quiet = SliceBuilder::new("default", "echo", "echo-2", "IPv4")
        .port("quiet", Protocol::Udp, quiet_port)
        .endpoint(EndpointSpec::ready(&pod_ip(0).to_string()).node(OTHER_NODE));
    for s in [answering.build(), quiet.build()] {
        slices
            .create(&PostParams::default(), &s)
            .await
            .expect("slice");
    }

    let bin = keelson_bin().expect("keelson binary");
    let child = lab
        .node
        .command(&bin.to_string_lossy())
        .args(["run", "--proxy-only", "--config"])
        .arg(&config)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::inherit())
        .spawn()
        .expect("keelson runs");
    let keelson = Process(child);

    let d = Diagnose {
        netns: lab.node_path(),
        knobs: api.knobs().clone(),
        bin,
        config,
        docs: std::env::var_os("KEELSON_DIAGNOSE_DOCS").map(PathBuf::from),
        cgroup: Some(cgroup.path.clone()),
    };
    // --- Healthy: every map entry as the model renders it; the ClusterIP
    // and the endpoints answer TCP and UDP; the quiet port gets no reply.
    let part = |r: &Report, id: &str, name: &str| {
        link(r, id)
            .parts
            .iter()
            .find(|p| p.name == name)
            .cloned()
            .unwrap_or_else(|| panic!("no part {name} in {id}: {:?}", link(r, id)))
    };
    let healthy = wait_for(
        "echo programmed in the socket LB",
        T,
        Duration::from_millis(500),
        || async {
            let (code, r) = d
                .report(
                    "service-ebpf-probe",
                    &["service", "default/echo", "--probe"],
                )
                .await;
            if code == 0
                && link(&r, "dataPlane").status == Mark::Ok
                && link(&r, "probe").parts.iter().any(|p| p.status == Mark::Ok)
            {
                Ok(r)
            } else {
                Err(serde_json::to_string(&r).unwrap())
            }
        },
    )
    .await
    .unwrap();
    let dump = serde_json::to_string_pretty(&healthy).unwrap();
    let plane = link(&healthy, "dataPlane");
    assert!(
        plane.evidence.iter().any(|e| e == "proxy mode: ebpf"),
        "{dump}"
    );
    for (name, entries) in [
        ("http 80/TCP (IPv4) socket LB", "5 map entries"),
        ("dns 53/UDP (IPv4) socket LB", "5 map entries"),
        ("quiet 54/UDP (IPv4) socket LB", "3 map entries"),
    ] {
        let p = part(&healthy, "dataPlane", name);
        assert_eq!(p.status, Mark::Ok, "{dump}");
        assert!(p.summary.contains(entries), "{name}: {}\n{dump}", p.summary);
    }
    assert_eq!(
        part(&healthy, "dataPlane", "ClusterIP socket LB").summary,
        format!("kl_services holds no other port of {vip}")
    );
    let dns = part(&healthy, "probe", "dns 53/UDP (IPv4)");
    assert_eq!(dns.status, Mark::Ok, "{dump}");
    assert!(
        dns.summary
            .starts_with(&format!("ClusterIP {vip}:53: replied in")),
        "{dump}"
    );
    for i in 0..2 {
        let line = format!("endpoint {}:{UDP_PORT}: replied in", pod_ip(i));
        assert!(dns.evidence.iter().any(|e| e.starts_with(&line)), "{dump}");
    }
    let http = part(&healthy, "probe", "http 80/TCP (IPv4)");
    assert_eq!(http.status, Mark::Ok, "{dump}");
    assert!(http.summary.contains("connected in"), "{dump}");
    let quiet = part(&healthy, "probe", "quiet 54/UDP (IPv4)");
    assert_eq!(quiet.status, Mark::Warning, "{dump}");
    assert!(
        quiet.summary.contains("no reply within 3s")
            && quiet.summary.contains("not a verdict on the data plane"),
        "{dump}"
    );
    assert_eq!(link(&healthy, "probe").status, Mark::Warning, "{dump}");
    // The ClusterIP probes were translated by socket LB (diagnose runs in
    // the attached cgroup), not by nftables.
    let revnat = keelson_netplane::ebpf::pinned_revnat_entries(&bpffs.config).expect("kl_revnat");
    for port in [80, 53] {
        let service = std::net::SocketAddr::from((vip, port));
        assert!(
            revnat.iter().any(|e| e.service == service),
            "{service} not translated by socket LB: {revnat:?}"
        );
    }

    // --- A tampered map: the dns port's service entry is deleted behind
    // keelson's back (its periodic verification is an hour away).
    let pin = bpffs.config.bpffs_path.join("maps/kl_services");
    let key = svc_key_hex(vip, 53, 17);
    let bpftool = |verb: &str| {
        let mut args = vec!["map", verb, "pinned"];
        let pin = pin.to_string_lossy().into_owned();
        args.push(&pin);
        args.push("key");
        args.push("hex");
        args.extend(key.iter().map(String::as_str));
        std::process::Command::new("bpftool")
            .args(&args)
            .output()
            .expect("bpftool runs")
    };
    assert!(bpftool("lookup").status.success(), "the entry is there");
    let deleted = bpftool("delete");
    assert!(
        deleted.status.success(),
        "bpftool delete: {}",
        String::from_utf8_lossy(&deleted.stderr)
    );
    let (code, r) = d
        .report("tampered-maps", &["service", "default/echo"])
        .await;
    assert_broken_at(
        "tampered maps",
        code,
        &r,
        "dataPlane",
        &[
            &format!(
                "{vip}:53/UDP missing from map kl_services (the model wants 2 backend(s), no affinity)"
            ),
            "the kernel's rules or socket-LB maps differ from the model",
            "something changed keelson's tables or maps",
        ],
    );
    let dns = part(&r, "dataPlane", "dns 53/UDP (IPv4) socket LB");
    assert_eq!(dns.status, Mark::Failed);
    assert_eq!(
        part(&r, "dataPlane", "http 80/TCP (IPv4) socket LB").status,
        Mark::Ok
    );
    // The nftables part of the data plane is untouched.
    assert_eq!(part(&r, "dataPlane", "dns 53/UDP (IPv4)").status, Mark::Ok);
    // Diagnose changed nothing: the entry is still gone.
    assert!(
        !bpftool("lookup").status.success(),
        "diagnose must not repair the maps"
    );

    // --- keelson stopped: the pinned links keep the programs on the
    // pinned maps, and diagnose still reads them.
    drop(keelson);
    let (code, r) = d
        .report("daemon-down-maps", &["service", "default/echo"])
        .await;
    assert!(!r.daemon.running, "{:?}", r.daemon);
    assert_broken_at(
        "daemon down, tampered maps",
        code,
        &r,
        "dataPlane",
        &[
            &format!("{vip}:53/UDP missing from map kl_services"),
            "no running keelson proxy keeps these tables and maps",
        ],
    );
    assert_eq!(
        part(&r, "dataPlane", "http 80/TCP (IPv4) socket LB").status,
        Mark::Ok
    );
}
